"""`domino-graft regenerate`: the target answers the prompts itself (greedy), so the drafter
learns what the target actually says, in the target's chat template.

Prompts (jsonl, one per line; `id` optional, default the line number):
    {"id": ..., "messages": [...]}   the conversation so far (a trailing assistant turn is dropped)
    {"id": ..., "prompt": "..."}
    {"id": ..., "prompt_ids": [...]} token ids (targets without a tokenizer)
Output lines keep the input's shape and add the answer: `messages` + an assistant turn,
`prompt` + `response`, or `prompt_ids` + `response_ids` — all formats `train.data.path`
reads. Batched with left padding; resumable: ids already in OUT are skipped, and a line cut
short by a kill is dropped before appending.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Optional

import torch


def read_prompts(path: str) -> list[dict]:
    """The prompt file `bench` reads, plus a unique id per line (ids make regeneration resumable)."""
    from ..benchmark import read_prompts as read_prompt_file

    out = []
    for n, rec in enumerate(read_prompt_file(path)):
        rec = {k: v for k, v in rec.items() if k != "source"}
        rec["id"] = str(rec.get("id", n))
        out.append(rec)
    ids = [r["id"] for r in out]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"--prompts: id {dup!r} appears more than once; ids make regeneration resumable")
    return out


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


def _prompt_ids(rec: dict, tokenizer, chat: bool) -> list[int]:
    if "prompt_ids" in rec:
        return [int(t) for t in rec["prompt_ids"]]
    if tokenizer is None:
        raise ValueError(f"prompt {rec['id']!r}: the target has no tokenizer; give prompt_ids")
    messages = _messages(rec)
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer("\n".join(m["content"] for m in messages))["input_ids"])


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
               overrides: list[str] | None = None, echo: Callable = print, progress: bool = True) -> dict:
    from ..device import pick_device
    from ..recipe import load_recipe
    from ..rundir import resolve_run, run_recipe
    from ..target import load_target

    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens: {max_new_tokens}; valid: >= 1")
    if batch_size < 1:
        raise ValueError(f"--batch-size: {batch_size}; valid: >= 1")
    if source is not None and Path(source).is_file():
        recipe = load_recipe(source, overrides)
    else:
        recipe = run_recipe(resolve_run(source), overrides)
    records = read_prompts(prompts)
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    skip = done_ids(out_path)
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
    encoded = [(r, _prompt_ids(r, tok, recipe.target.chat)) for r in todo]
    # Longest first: similar lengths share a batch (less padding), and an OOM shows up at once.
    encoded.sort(key=lambda x: -len(x[1]))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(encoded), desc="regenerate", unit="prompt", dynamic_ncols=True)
    written = 0
    with open(out_path, "a") as f:
        for s in range(0, len(encoded), batch_size):
            chunk = encoded[s : s + batch_size]
            answers = greedy(target.model, [p for _, p in chunk], max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                             pad_id=pad_id, device=target.device)
            for (rec, _), (new, reason) in zip(chunk, answers):
                f.write(json.dumps(_output(rec, new, reason, tok)) + "\n")
            f.flush()
            os.fsync(f.fileno())
            written += len(chunk)
            if bar:
                bar.update(len(chunk))
    if bar:
        bar.close()
    echo(f"wrote {written} responses to {out_path}")
    return {"written": written, "skipped": len(records) - len(todo)}


def _output(rec: dict, new: list[int], reason: str, tok) -> dict:
    base = {"id": rec["id"], "finish": reason}
    if "prompt_ids" in rec:
        return {**base, "prompt_ids": list(rec["prompt_ids"]), "response_ids": new}
    text = tok.decode(new, skip_special_tokens=True)
    if "messages" in rec:
        return {**base, "messages": _messages(rec) + [{"role": "assistant", "content": text}]}
    return {**base, "prompt": rec["prompt"], "response": text}
