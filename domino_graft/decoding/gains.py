"""What a step that verifies K' drafts gains: a row's expected tokens and their variance from the running
per-slot acceptance, and a static batch's rate, set by its slowest row (docs/design.md §5, "Verify budget"; the
policy that weighs them against costs: decoding/budget.py). Plain Python, no torch."""

from __future__ import annotations

import functools
import math
from typing import Iterable, Optional

__all__ = ["batch_tokens", "expected_max_normal", "expected_tokens", "gain_moments", "tokens_variance"]


def expected_tokens(alphas: Iterable[float], k: int) -> float:
    """Tokens a row gains from a step verifying k drafts: 1 + sum_j prod_{i<=j} alpha_i."""
    return gain_moments(alphas, (k,))[k][0]


def tokens_variance(alphas: Iterable[float], k: int) -> float:
    """The variance of the tokens a row gains from a step verifying k drafts: with P(X >= j) the
    chance of gaining at least j tokens (1, then the products of the alphas),
    E[X^2] = sum_j (2j - 1) P(X >= j)."""
    return gain_moments(alphas, (k,))[k][1]


# E[max of n independent standard normals], n = 2^i (i = 0..7): how far the slowest of n rows lags
_MAX_NORMAL = (0.0, 0.5642, 1.0294, 1.4236, 1.7660, 2.0697, 2.3352, 2.5724)


@functools.lru_cache(maxsize=256)  # a pure function of the batch size, asked once per candidate per step
def expected_max_normal(n: int) -> float:
    """E[max of n standard normals], interpolated in log2 n (held past 128)."""
    if n <= 1:
        return 0.0
    x = min(math.log2(n), len(_MAX_NORMAL) - 1)
    i = min(int(x), len(_MAX_NORMAL) - 2)
    return _MAX_NORMAL[i] + (_MAX_NORMAL[i + 1] - _MAX_NORMAL[i]) * (x - i)


def gain_moments(alphas: Iterable[float], ks: Iterable[int]) -> dict[int, tuple[float, float]]:
    """{k: (expected_tokens, tokens_variance) at k} for each k in `ks`, in one pass over the alphas (the
    budget costs every candidate K' each step: one loop per candidate and per moment was host time between
    a step's sync and the next launch)."""
    want = sorted(set(ks))
    out, mean, second, reach = {}, 1.0, 1.0, 1.0
    if want and want[0] <= 0:
        out.update({k: (1.0, 0.0) for k in want if k <= 0})
    top = want[-1] if want else 0
    for j, a in enumerate(list(alphas)[:top], start=2):
        reach *= a
        mean += reach
        second += (2 * j - 1) * reach
        if j - 1 in want:
            out[j - 1] = (mean, max(second - mean * mean, 0.0))
    for k in want:  # past the alphas: the sums stop where they do
        out.setdefault(k, (mean, max(second - mean * mean, 0.0)))
    return out


def batch_tokens(alphas: list[float], k: int, rows: int, remaining: int,
                 moments: Optional[tuple[float, float]] = None) -> float:
    """Tokens per step of a batch that runs until its last row ends (a static batch), per row: the
    `remaining` tokens of its longest row over the steps its slowest row is expected to need. A row
    needs remaining / mean steps, give or take sigma * sqrt(remaining) / mean^1.5 (the renewal count of
    steps that gain X tokens each); the slowest of `rows` lags by E[max of rows normals] of those.
    One row, or k = 0 (one token a step, no spread): the plain expected tokens. moments: k's
    (mean, variance) from `gain_moments`, where the caller has them."""
    mean, variance = moments or gain_moments(alphas, (k,))[k]
    if rows <= 1 or k == 0 or remaining <= 0:
        return mean
    spread = math.sqrt(variance * remaining) / mean ** 1.5
    # every step gains a row at least one token: no row needs more steps than plain decoding would
    return remaining / min(remaining / mean + expected_max_normal(rows) * spread, remaining)
