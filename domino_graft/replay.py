"""Greedy speculative decoding replayed offline, from teacher-forced training blocks.

Greedy chain verification accepts the leading block slots whose proposal equals the target's
greedy token. On a response the target itself generated greedily, the context at each anchor is
the one decoding would have had, and the Domino head's GRU, fed the true tokens, reads what it
would read along an accepted prefix. One batched forward per response therefore gives, for
every anchor, how many drafts decoding would accept there; walking the anchors as decoding
does (next block after the accepted drafts + the target's token) gives the decoded τ itself,
without decoding: the same numbers as `bench`, for held-out responses and for training ones
alike (tests/decoding/test_replay.py checks it block for block against `Engine`).

The training log's τ estimate (1 + Σ_k Π_i acc_i) assumes independent slots and a uniform
anchor; neither holds, so use this on held-out responses to see what decoding will get.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

import torch

from .training.data import Example, encode_record
from .training.features import target_features
from .training.objective import IGNORE


@torch.no_grad()
def leading_matches(target, adapter, head, example: Example, *, max_anchors: int = 128
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts accepted at every anchor of one response (the position of each response token,
    in order, up to `max_anchors`): for the base proposals and for the Domino-corrected ones."""
    ids = torch.tensor([example.input_ids], device=target.device)
    mask = torch.tensor([example.loss_mask], device=target.device)
    anchors = mask[0].nonzero().flatten()[:max_anchors][None]  # [1, n]
    if anchors.numel() == 0:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty
    capture = tuple(adapter.capture_layers())
    feats = target_features(target, ids, capture) if capture else None
    blocks = adapter.training_blocks(feats, ids, mask, anchors)
    k = adapter.num_slots  # decoding proposes num_slots per block (training may label one more)
    hidden, labels = blocks.hidden[:, :k], blocks.labels[:, :k]
    n = labels.shape[0]
    slot = torch.arange(k, device=ids.device).expand(n, k).reshape(-1)
    base = adapter.slot_base_logits(hidden.reshape(n * k, -1), slot).float().view(n, k, -1)
    final = head.block(hidden, base, blocks.prev_emb[:, :k])  # the head's teacher-forced block
    known = labels != IGNORE
    ok_b = (base.argmax(-1) == labels) & known
    ok_f = (final.argmax(-1) == labels) & known
    return ok_b.long().cumprod(-1).sum(-1).cpu(), ok_f.long().cumprod(-1).sum(-1).cpu()


def walk(lead: torch.Tensor) -> list[int]:
    """Greedy decoding over the response: the block at anchor i accepts lead[i] drafts plus the
    target's own token, and the next block starts after them. Returns the drafts each block
    accepts, in order (what `Engine.speculative` reports as `accepted`)."""
    i, accepted = 0, []
    while i < lead.numel():
        accepted.append(int(lead[i]))
        i += accepted[-1] + 1
    return accepted


def replay(target, adapter, head, examples: Iterable[Example], *, max_anchors: int = 128) -> dict:
    """τ of greedy decoding replayed on the responses (tokens / target forwards, as `bench`
    counts it), with the head (`final`) and without (`base`); plus the mean over every anchor,
    which overweights the stretches a drafter finds easy (decoding skips through them)."""
    tokens = {"base": 0, "final": 0}
    forwards = {"base": 0, "final": 0}
    leads: dict[str, list[torch.Tensor]] = {"base": [], "final": []}
    sequences = 0
    for ex in examples:
        sequences += 1
        for name, lead in zip(("base", "final"), leading_matches(target, adapter, head, ex, max_anchors=max_anchors)):
            accepted = walk(lead)
            tokens[name] += sum(a + 1 for a in accepted)
            forwards[name] += len(accepted)
            leads[name].append(lead)
    out: dict = {"sequences": sequences}
    for name in ("base", "final"):
        every = torch.cat(leads[name]).double() if leads[name] else torch.zeros(0, dtype=torch.float64)
        out[f"tau_{name}"] = round(tokens[name] / forwards[name], 4) if forwards[name] else None
        out[f"tau_{name}_every_anchor"] = round(1 + every.mean().item(), 4) if every.numel() else None
    return out


def responses_file(path: str | Path, flag: str = "--responses") -> Path:
    """The path, checked before anything slow (a model load) happens."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag}: {str(path)!r} does not exist; write one with `domino-graft regenerate`")
    return path


def read_responses(path: str | Path, target, *, chat: bool, limit: Optional[int] = None,
                   flag: str = "--responses", reserved: Iterable[int] = ()) -> list[Example]:
    """The target's own responses (`regenerate` output), encoded as training examples; every
    record must carry a response (the tokens replay walks over), fit the target's vocabulary
    and positions, and hold none of the drafter's `reserved` placeholder ids."""
    from .inputs import iter_jsonl

    path = responses_file(path, flag)
    eos = (target.shape.eos_token_ids or (None,))[0]
    v, positions = target.shape.vocab_size, target.shape.max_position_embeddings
    note = getattr(target, "tokenizer_note", None) or "the target has no tokenizer (random target?)"
    held_out = {int(i) for i in reserved}
    examples = []
    for n, rec in iter_jsonl(path, flag):
        where = f"{flag}: {path}:{n}"
        ex = encode_record(rec, target.tokenizer, chat=chat, eos_id=eos, where=where, no_tokenizer=note)
        if not any(ex.loss_mask):
            raise ValueError(f"{where}: has no response tokens; each record needs the target's "
                             "answer (messages ending with the assistant turn, or prompt+response)")
        bad = [t for t in ex.input_ids if not 0 <= t < v]
        if bad:
            raise ValueError(f"{where}: token id {bad[0]} is outside the target vocabulary; valid: 0..{v - 1}")
        held = sorted(set(ex.input_ids) & held_out)
        if held:
            raise ValueError(f"{where}: holds token id {held[0]}, the drafter's reserved placeholder; valid: "
                             "records without it")
        if len(ex.input_ids) > positions:
            raise ValueError(f"{where}: {len(ex.input_ids):,} tokens (prompt + response); the target has "
                             f"{positions:,} positions (max_position_embeddings); valid: shorter records")
        examples.append(ex)
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise ValueError(f"{flag}: {path} holds no records")
    return examples


def check_responses(path: str | Path, *, limit: Optional[int] = None, flag: str = "--responses") -> int:
    """Every record's format and types (UTF-8, JSON, fields), before a model is loaded: -> records."""
    from .inputs import iter_jsonl
    from .training.data import check_record

    path = responses_file(path, flag)
    count = 0
    for n, rec in iter_jsonl(path, flag):
        check_record(rec, f"{flag}: {path}:{n}")
        count += 1
        if limit is not None and count >= limit:
            break
    if not count:
        raise ValueError(f"{flag}: {path} holds no records")
    return count
