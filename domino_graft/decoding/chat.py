"""Prompts -> token ids, and the stop tokens target-only decoding would honour.

Real targets: chat prompts go through the tokenizer's chat template with
add_generation_prompt (the drafter was trained on the target's own chat-formatted
responses), raw text through the plain tokenizer. Tokenizer-less targets (the random
test models) take token ids: `{"prompt_ids": [...]}` / `--prompt-ids`, or, for a text
prompt, a deterministic byte fallback (UTF-8 bytes folded into the vocabulary) so that
`generate --prompt` still runs end to end on them.
"""

from __future__ import annotations

from typing import Iterable, Optional


def _check_ids(ids, vocab_size: int, where: str) -> list[int]:
    from ..inputs import check_ids, check_ids_in_vocab

    ids = check_ids(list(ids) if isinstance(ids, tuple) else ids, where)
    check_ids_in_vocab(ids, vocab_size, where)
    return ids


def byte_fallback_ids(text: str, vocab_size: int, reserved: Iterable[int] = ()) -> list[int]:
    """Deterministic ids for a text prompt when the target has no tokenizer."""
    avoid = set(reserved)
    usable = [i for i in range(vocab_size) if i not in avoid] or list(range(vocab_size))
    return [usable[b % len(usable)] for b in text.encode("utf-8")] or [usable[0]]


def encode_prompt(
    target,
    *,
    prompt: Optional[str] = None,
    messages: Optional[list] = None,
    prompt_ids: Optional[list] = None,
    raw: bool = False,
    chat: bool = True,
    reserved: Iterable[int] = (),
    placeholders: Iterable[int] = (),
    max_new_tokens: Optional[int] = None,
    where: str = "prompt",
) -> list[int]:
    """Exactly one of prompt / messages / prompt_ids. `chat=False` (recipe target.chat) or
    `raw=True` tokenizes a text prompt as is; `reserved` ids (stop ids, the drafter's placeholder
    tokens) are avoided by the byte fallback; `placeholders` (the drafter's mask / parallel-draft
    ids) may not appear in the prompt. The prompt, after the chat template, plus `max_new_tokens`
    must fit the target's positions; text is size-checked before it is tokenised. Every error
    is one line naming `where`, the bad value and what is valid."""
    from ..inputs import check_length, check_messages, check_text, check_text_size, describe

    given = [k for k, v in (("prompt", prompt), ("messages", messages), ("prompt_ids", prompt_ids)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"{where}: give exactly one of prompt, messages, prompt_ids (got {', '.join(given) or 'none'})")
    v = target.shape.vocab_size
    positions = target.shape.max_position_embeddings
    if prompt_ids is not None:
        ids = _check_ids(prompt_ids, v, f"{where}: prompt_ids")
    else:
        if messages is not None:
            check_messages(messages, f"{where}: messages", limit=1 << 62)
            text_len = sum(len(m["content"]) for m in messages)
        else:
            check_text(prompt, f"{where}: prompt", limit=1 << 62)
            text_len = len(prompt)
        check_text_size(text_len, positions, where)
        tok = target.tokenizer
        note = getattr(target, "tokenizer_note", None)
        if tok is None and note:
            raise ValueError(f"{where}: {note}; give token ids instead (--prompt-ids, or {{\"prompt_ids\": [...]}} lines)")
        if tok is None:
            if messages is not None:
                raise ValueError(
                    f"{where}: messages: this target has no tokenizer (a random test model), so it has no chat "
                    f"template; give token ids instead, e.g. {{\"prompt_ids\": [5, 17, 42]}}"
                )
            ids = byte_fallback_ids(prompt, v, reserved)
        elif messages is not None:
            ids = _apply_template(tok, messages, where)
        elif raw or not chat or not getattr(tok, "chat_template", None):
            ids = list(tok(prompt).input_ids)
        else:
            ids = _apply_template(tok, [{"role": "user", "content": prompt}], where)
        if not ids:
            raise ValueError(f"{where}: the prompt {describe(prompt)} encodes to no tokens; give some text")
        _check_ids(ids, v, f"{where}: its token ids")
    held = sorted(set(ids) & {int(i) for i in placeholders})
    if held:
        raise ValueError(f"{where}: holds token id {held[0]}, the drafter's reserved placeholder (mask / draft token); "
                         f"valid: prompts without it")
    check_length(len(ids), max_new_tokens, positions, where)
    return ids


def _apply_template(tok, messages: list, where: str) -> list[int]:
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{where}: messages: the target's tokenizer has no chat template; give a raw \"prompt\" instead")
    # Render to text, then tokenize without extra specials: apply_chat_template's tokenized
    # return type changed across transformers versions (list vs BatchEncoding).
    from ..inputs import render_chat

    text = render_chat(tok, messages, where, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False).input_ids)


def stop_token_ids(target, extra: Iterable[int] = ()) -> set[int]:
    """eos ids of the target's config, generation config and tokenizer, plus `extra`."""
    ids = set(int(i) for i in target.shape.eos_token_ids)
    gen = getattr(target.model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is not None:
        ids.update(int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos]))
    tok = target.tokenizer
    if tok is not None and getattr(tok, "eos_token_id", None) is not None:
        ids.add(int(tok.eos_token_id))
    ids.update(int(i) for i in extra)
    return ids


def decode_text(target, ids: list[int]) -> str:
    """Readable output: detokenized text, or the ids for a tokenizer-less target."""
    if target.tokenizer is None:
        return " ".join(str(i) for i in ids)
    return target.tokenizer.decode(ids, skip_special_tokens=True)
