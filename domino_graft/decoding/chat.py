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
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{where}: expected a non-empty list of integer token ids, got {ids!r}")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"{where}: ids {bad[:5]} are outside the target vocabulary; valid: 0..{vocab_size - 1}")
    return list(ids)


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
    where: str = "prompt",
) -> list[int]:
    """Exactly one of prompt / messages / prompt_ids. `chat=False` (recipe target.chat) or
    `raw=True` tokenizes a text prompt as is; `reserved` ids (stop ids, the drafter's placeholder
    tokens) are avoided by the byte fallback."""
    given = [k for k, v in (("prompt", prompt), ("messages", messages), ("prompt_ids", prompt_ids)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"{where}: give exactly one of prompt, messages, prompt_ids (got {', '.join(given) or 'none'})")
    v = target.shape.vocab_size
    if prompt_ids is not None:
        return _check_ids(prompt_ids, v, f"{where}.prompt_ids")
    tok = target.tokenizer
    if tok is None:
        if messages is not None:
            raise ValueError(
                f"{where}.messages: this target has no tokenizer (a random test model), so it has no chat "
                f"template; give token ids instead, e.g. {{\"prompt_ids\": [5, 17, 42]}}"
            )
        return byte_fallback_ids(prompt, v, reserved)
    if messages is not None:
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ValueError(f"{where}.messages: expected a list of {{\"role\", \"content\"}} objects, got {messages!r}")
        return _apply_template(tok, messages, where)
    if not isinstance(prompt, str):
        raise ValueError(f"{where}.prompt: expected a string, got {type(prompt).__name__}")
    if raw or not chat or not getattr(tok, "chat_template", None):
        return _check_ids(tok(prompt).input_ids, v, where)
    return _apply_template(tok, [{"role": "user", "content": prompt}], where)


def _apply_template(tok, messages: list, where: str) -> list[int]:
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{where}.messages: the target's tokenizer has no chat template; give a raw \"prompt\" instead")
    # Render to text, then tokenize without extra specials: apply_chat_template's tokenized
    # return type changed across transformers versions (list vs BatchEncoding).
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
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
