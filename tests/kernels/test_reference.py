"""kernels/head/reference.py, the eager reference every rollout kernel is tested against: its
candidate pools by their definitions.

Tolerances and shapes: tests/kernels/head_kit.py (CPU: Triton's interpreter; GPU: -m gpu)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.head_kit import (  # noqa: I001  (sets TRITON_INTERPRET before triton loads)
    K,
    _bucket_brute_force,
)


@pytest.mark.parametrize("v,pool", [(1013, 7), (97, 97), (97, 40), (300, 3)])
def test_bucket_candidates_definition(v, pool):
    """bucket_candidates: non-empty buckets differing by <= 1 in size (ragged), every bucket's max,
    ties to the lowest id, the global argmax always in the pool."""
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(2, 3, v, generator=gen).round(decimals=1)  # rounded: many exact ties
    base[0, 0, v // 2: v // 2 + 5] = 9.0  # a tie at the global max, straddling a bucket edge for some pools
    vals, ids = K.reference.bucket_candidates(base, pool)
    starts, ends = K.reference.bucket_bounds(v, pool)
    sizes = ends - starts
    assert sizes.min() >= 1 and sizes.max() - sizes.min() <= 1 and int(sizes.sum()) == v
    want_vals, want_ids = _bucket_brute_force(base, pool)
    assert torch.equal(ids, want_ids) and torch.equal(vals.double(), want_vals)
    assert torch.equal(vals, base.gather(-1, ids))
    top = base.argmax(-1, keepdim=True)  # torch.argmax: lowest id among the global maxima
    assert (ids == top).any(-1).all(), "the global argmax must always be a candidate"
    if pool == v:
        assert torch.equal(ids, torch.arange(v).expand_as(ids))


def test_radix_candidates_recall_fp32():
    """fp32: every element strictly above the boundary key bin is in the pool (recall 1 for them);
    with random (tie-free) logits the pool is the exact top-k."""
    gen = torch.Generator().manual_seed(9)
    base = torch.randn(4, 5000, generator=gen) * 2
    pool = 700
    vals, ids = K.reference.radix_candidates(base, pool)
    key = K.reference.radix_key24(base)
    thr = key.gather(-1, ids).amin(-1, keepdim=True)
    member = torch.zeros_like(base, dtype=torch.bool).scatter_(-1, ids, True)
    assert member[key > thr].all(), "an element above the boundary bin was dropped"
    assert ((key > thr).sum(-1) < pool).all() and ((key >= thr).sum(-1) >= pool).all()
    top = torch.topk(base, pool, dim=-1).indices
    recall = float(member.gather(-1, top).float().mean())
    assert recall >= 0.998, recall  # misses only within one 2^-15-wide bin at the boundary
    with pytest.raises(ValueError):
        K.reference.radix_candidates(base, 5001)


def test_inverse_cdf_matches_a_flat_search_and_skips_zero_entries():
    from domino_graft.kernels.head.reference import inverse_cdf

    width = 256

    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(32, 3 * width + 17, generator=gen), -1)
    u = torch.rand(32, generator=gen)
    cdf = probs.double().cumsum(-1)
    flat = torch.searchsorted(cdf, u.double()[:, None] * cdf[:, -1:], right=True).squeeze(-1)
    got = inverse_cdf(probs, u)
    # the same index up to a rounding step at a boundary (fp32 against fp64 sums)
    assert (got - flat).abs().max() <= 1
    assert (got == flat).float().mean() > 0.9
    # whole zero chunks, zero entries at the top, u at both ends: never an entry of probability 0
    sparse = probs.clone()
    sparse[:, width: 2 * width] = 0
    sparse[:, -40:] = 0
    sparse[:, ::3] = 0
    ends = torch.tensor([0.0, 1 - 2 ** -24] * 16)
    for uu in (u, ends):
        pick = inverse_cdf(sparse, uu)
        assert (sparse.gather(1, pick[:, None]) > 0).all()


def test_inverse_cdf_draws_the_distribution():
    from domino_graft.kernels.head.reference import inverse_cdf

    width = 256

    gen = torch.Generator().manual_seed(1)
    p = torch.zeros(2 * width + 5)
    p[[3, width - 1, width + 7, 2 * width + 4]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    n = 200_000
    idx = inverse_cdf(p.expand(n, -1).contiguous(), torch.rand(n, generator=gen))
    counts = torch.bincount(idx, minlength=p.numel()).float()
    assert counts[p == 0].sum() == 0
    expected = n * p[p > 0]
    chi2 = ((counts[p > 0] - expected) ** 2 / expected).sum()
    assert chi2 < 16.3  # chi-square, 3 degrees of freedom, p = 0.001
    # a wrong distribution fails the same statistic
    wrong = n * torch.tensor([0.25, 0.25, 0.25, 0.25])
    assert ((counts[p > 0] - wrong) ** 2 / wrong).sum() > 16.3
