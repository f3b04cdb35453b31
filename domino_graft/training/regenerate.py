"""`domino-graft regenerate`: the target answers the prompts itself (greedy), so the drafter
learns what the target actually says, in the target's chat template.

Prompts (jsonl, one per line; `id` optional, default the line number):
    {"id": ..., "messages": [...]}   the conversation so far (a trailing assistant turn is dropped)
    {"id": ..., "prompt": "..."}
    {"id": ..., "prompt_ids": [...]} token ids (targets without a tokenizer)
Output lines keep the input's shape and add the answer: `messages` + an assistant turn,
`prompt` + `response`, or `prompt_ids` + `response_ids` — all formats `train.data.path`
reads. Batched with left padding; resumable: ids already in OUT are skipped, and a line cut
short by a kill is dropped before appending. OUT is only ever such a file: anything else
there is refused, never appended to or truncated; `force=True` (`--force`) regenerates
every prompt into a temp sibling that replaces OUT once complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

import torch

from ..artifacts.files import with_path
from ..progress import Progress


def read_prompts(path: str) -> list[dict]:
    """The prompt file `bench` reads, plus a unique id per line (ids make regeneration resumable)."""
    from ..benchmark import read_prompts as read_prompt_file

    out = []
    first: dict[str, str] = {}
    for n, rec in enumerate(read_prompt_file(path)):
        line = rec["source"].rsplit(":", 1)[-1]
        where = f"--prompts: {Path(path)}:{line}"
        rec = {k: v for k, v in rec.items() if k != "source"}
        rec["id"] = str(rec.get("id", n))
        if rec["id"] in first:
            raise ValueError(f"{where}: id {rec['id']!r} appears twice (first at line {first[rec['id']]}); valid: "
                             "unique ids (they make regeneration resumable)")
        first[rec["id"]] = line
        rec["_where"] = where  # for errors only; never written out
        out.append(rec)
    return out


OUTPUT_KINDS = ("response", "response_ids", "messages")


def _is_record(line: bytes) -> bool:
    try:
        rec = json.loads(line)
    except ValueError:
        return False
    return isinstance(rec, dict) and "id" in rec and any(k in rec for k in OUTPUT_KINDS)


def is_regenerate_output(path: Path) -> bool:
    """A file this command wrote: every complete line a response record; a last line cut
    short by a kill (no newline yet) is allowed if it starts like one."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return False
    *complete, fragment = raw.split(b"\n")
    lines = [x for x in complete if x.strip()]
    if not lines and not fragment.startswith(b'{"id"'):
        return False
    return all(_is_record(x) for x in lines) and (not fragment.strip() or fragment.startswith(b'{"id"'))


def check_output(out_path: Path, *, force: bool) -> bool:
    """-o may be written: new, empty, or an earlier regenerate output (resumed, or with force
    replaced). Returns whether an existing output is resumed/replaced."""
    from ..artifacts.destination import check_destination

    if out_path.exists() and out_path.is_file() and is_regenerate_output(out_path) and not force:
        return True  # resumed: appended to, never replaced
    return check_destination(out_path, kind="regenerate output (JSON lines with id and response)", option="-o",
                             force=force, is_kind=is_regenerate_output)


def done_ids(out_path: Path) -> set[str]:
    """Ids already answered; drops a trailing partial line (a killed run) so appends stay valid."""
    if not out_path.is_file():
        return set()
    raw = out_path.read_bytes()
    lines = raw.split(b"\n")
    ids, good = set(), 0
    for line in lines:
        if not line.strip():
            good += len(line) + 1
            continue
        try:
            ids.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError):
            break
        good += len(line) + 1
    if good < len(raw):
        with open(out_path, "r+b") as f:
            f.truncate(min(good, len(raw)))
    return ids


def _prompt_ids(rec: dict, target, chat: bool, max_new_tokens: Optional[int] = None) -> list[int]:
    """A prompt record's ids (types were checked when the file was read): within the target's
    vocabulary, and, after the chat template, short enough to answer in `max_new_tokens`."""
    from ..inputs import check_ids_in_vocab, check_length, check_text_size, render_chat

    where = rec.get("_where") or f"--prompts: prompt {rec['id']!r}"
    v, positions = target.shape.vocab_size, target.shape.max_position_embeddings
    tokenizer = target.tokenizer
    if "prompt_ids" in rec:
        ids = [int(t) for t in rec["prompt_ids"]]
        check_ids_in_vocab(ids, v, f"{where}: prompt_ids")
    else:
        if tokenizer is None:
            why = getattr(target, "tokenizer_note", None) or "the target has no tokenizer"
            raise ValueError(f"{where}: {why}; give prompt_ids")
        messages = _messages(rec)
        if not messages:
            raise ValueError(f"{where}: messages: only assistant turns, nothing to answer; valid: at least one "
                             "user (or system) turn")
        check_text_size(sum(len(m["content"]) for m in messages), positions, where)
        if chat and getattr(tokenizer, "chat_template", None):
            text = render_chat(tokenizer, messages, where, add_generation_prompt=True)
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            ids = list(tokenizer("\n".join(m["content"] for m in messages))["input_ids"])
        if not ids:
            raise ValueError(f"{where}: the prompt encodes to no tokens; give some text")
    check_length(len(ids), max_new_tokens, positions, where)
    return ids


def _messages(rec: dict) -> list[dict]:
    if "messages" in rec:
        msgs = list(rec["messages"])
        while msgs and msgs[-1].get("role") == "assistant":
            msgs.pop()
        return msgs
    return [{"role": "user", "content": rec["prompt"]}]


@torch.no_grad()
def greedy(model, prompts: list[list[int]], *, max_new_tokens: int, eos_ids: set[int], pad_id: int,
           device) -> list[tuple[list[int], str]]:
    """Left-padded batched greedy decoding -> (new tokens up to and including EOS, finish reason)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    out = model.generate(
        input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=sorted(eos_ids) or None, pad_token_id=pad_id, temperature=None, top_p=None, top_k=None,
    )
    results = []
    for row in out[:, width:].tolist():
        new = []
        reason = "length"
        for t in row:
            new.append(t)
            if t in eos_ids:
                reason = "eos"
                break
        results.append((new, reason))
    return results


def regenerate(source: Optional[str], prompts: str, out: str, *, max_new_tokens: int = 256, batch_size: int = 8,
               overrides: list[str] | None = None, echo: Callable = print, progress: bool = True,
               force: bool = False) -> dict:
    from ..artifacts.rundir import resolve_run, run_recipe
    from ..device import pick_device
    from ..recipe import load_recipe
    from ..target import load_target

    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens: {max_new_tokens}; valid: >= 1")
    if batch_size < 1:
        raise ValueError(f"--batch-size: {batch_size}; valid: >= 1")
    out_path = Path(out)
    existing = check_output(out_path, force=force)
    if source is not None and Path(source).is_file():
        recipe = load_recipe(source, overrides)
    else:
        recipe = run_recipe(resolve_run(source), overrides)
    records = read_prompts(prompts)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    replace = force and existing
    skip = set() if force else done_ids(out_path)
    todo = [r for r in records if r["id"] not in skip]
    echo(f"regenerate: {len(records)} prompts, {len(records) - len(todo)} already in {out_path}, {len(todo)} to go")
    if not todo:
        return {"written": 0, "skipped": len(records)}

    target = load_target(recipe.target, device=pick_device(recipe.device))
    tok = target.tokenizer
    eos_ids = set(target.shape.eos_token_ids)
    if tok is not None and tok.eos_token_id is not None:
        eos_ids.add(tok.eos_token_id)
    pad_id = target.model.config.pad_token_id
    if pad_id is None:
        pad_id = (tok.pad_token_id if tok is not None and tok.pad_token_id is not None else min(eos_ids or {0}))
    encoded = [(r, _prompt_ids(r, target, recipe.target.chat, max_new_tokens)) for r in todo]
    # Longest first: similar lengths share a batch (less padding), and an OOM shows up at once.
    encoded.sort(key=lambda x: -len(x[1]))
    bar = Progress(total=len(encoded), desc="regenerate", unit="prompt", enabled=progress, dynamic_ncols=True)
    write_to = out_path
    try:
        if replace:  # --force: a temp sibling, renamed over OUT only once complete
            fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.tmp-", dir=out_path.parent)
            os.close(fd)
            write_to = Path(tmp)
        _write_answers(write_to, encoded, target, tok, batch_size, max_new_tokens, eos_ids, pad_id, bar)
        if replace:
            os.replace(write_to, out_path)
    except OSError as e:
        raise with_path(e, out_path) from None
    finally:
        bar.close()
        if write_to != out_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(write_to)
    written = len(encoded)
    echo(f"wrote {written} responses to {out_path}")
    return {"written": written, "skipped": len(records) - len(todo)}


def _write_answers(path: Path, encoded, target, tok, batch_size, max_new_tokens, eos_ids, pad_id, bar) -> None:
    with open(path, "a") as f:
        for s in range(0, len(encoded), batch_size):
            chunk = encoded[s : s + batch_size]
            answers = greedy(target.model, [p for _, p in chunk], max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                             pad_id=pad_id, device=target.device)
            for (rec, _), (new, reason) in zip(chunk, answers):
                f.write(json.dumps(_output(rec, new, reason, tok)) + "\n")
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(chunk))


def _output(rec: dict, new: list[int], reason: str, tok) -> dict:
    base = {"id": rec["id"], "finish": reason}
    if "prompt_ids" in rec:
        return {**base, "prompt_ids": list(rec["prompt_ids"]), "response_ids": new}
    text = tok.decode(new, skip_special_tokens=True)
    if "messages" in rec:
        return {**base, "messages": _messages(rec) + [{"role": "assistant", "content": text}]}
    return {**base, "prompt": rec["prompt"], "response": text}
