"""Sampling settings and the one logit warper every decoding path and every kernel shares.

Speculative sampling is lossless only if the target's distribution p is warped exactly
as the target-only sampler warps it, and if q is the distribution the draft was really
drawn from. Both therefore go through `warp()` below, never a private copy.

A leaf module (torch and the standard-library `inputs` only): `domino_graft.decoding` and `domino_graft.kernels`
both import it, and neither needs the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .inputs import MAX_SEED, MIN_SEED


@dataclass(frozen=True)
class Sampling:
    """temperature 0 = greedy (top_k / top_p are then ignored)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: Optional[int] = None  # None = fresh entropy for each decode

    def __post_init__(self):
        problems = []
        if not (self.temperature >= 0.0) or self.temperature == float("inf"):
            problems.append(f"--temperature: {self.temperature!r} is invalid; valid: a finite number >= 0 (0 = greedy)")
        if self.top_k < 0:
            problems.append(f"--top-k: {self.top_k!r} is invalid; valid: an integer >= 0 (0 = off)")
        if self.seed is not None and not (MIN_SEED <= self.seed <= MAX_SEED):
            problems.append(f"--seed: {self.seed!r} is invalid; valid: an integer in {MIN_SEED}..{MAX_SEED}")
        if not (0.0 < self.top_p <= 1.0):
            problems.append(f"--top-p: {self.top_p!r} is invalid; valid: 0 < top_p <= 1 (1 = off)")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, device, offset: int = 0) -> Optional[torch.Generator]:
        """A generator on `device`, seeded with seed + offset (one stream per decode)."""
        if self.greedy:
            return None
        g = torch.Generator(device=device)
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(int(self.seed) + offset)
        return g


def warp(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] (fp32) after temperature, top-k, top-p."""
    if temperature <= 0:
        raise ValueError(f"warp: temperature {temperature!r} must be > 0 (greedy decoding does not warp)")
    x = logits.float() / temperature
    v = x.shape[-1]
    if 0 < top_k < v:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = sorted_x.softmax(-1)
        # drop a token once the mass strictly before it already reaches top_p (the first always stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x.softmax(-1)


def sample(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """probs [..., V] -> ids [...] (one draw per row)."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def pick(logits: torch.Tensor, sampling: Sampling, generator: Optional[torch.Generator]) -> torch.Tensor:
    """The target-only choice of the next token: argmax, or a draw from the warped distribution."""
    if sampling.greedy:
        return logits.argmax(-1)
    return sample(warp(logits, sampling.temperature, sampling.top_k, sampling.top_p), generator)
