"""The drafter's vocabulary onto the target's (model.py and the static drafter, fast.py, both map
their logits through it)."""

from __future__ import annotations

import torch


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Drafter logits [..., Vd] -> the target's [..., V]: padding rows past the target's
    vocabulary are dropped, rows the drafter lacks get the lowest logit (never proposed)."""
    have = logits.shape[-1]
    if have > vocab:
        return logits[..., :vocab]
    if have < vocab:
        pad = logits.new_full((*logits.shape[:-1], vocab - have), torch.finfo(logits.dtype).min)
        return torch.cat([logits, pad], dim=-1)
    return logits
