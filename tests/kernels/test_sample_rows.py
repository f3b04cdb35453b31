"""kernels/head/sample_rows.py: one inverse-CDF draw per row, against `reference.inverse_cdf`.

CPU (default): Triton's interpreter, fp32. The same index as the reference's flat search for the
same uniforms (at a rounding boundary another index, with only rounding-sized mass between the two),
never an entry of probability 0 (whole zero chunks, zeros at the top, u at both ends), the distribution
by a chi-square test that a wrong distribution fails, and bad inputs refused in one line. GPU
(`-m gpu`): the same at the SmolLM2 vocabulary and B = 16.
"""

from __future__ import annotations

import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from domino_graft.kernels.head.reference import inverse_cdf  # noqa: E402
from domino_graft.kernels.head.sample_rows import BLOCK, sample_rows  # noqa: E402

DEV = torch.device("cuda" if _CUDA else "cpu")
BETWEEN_MASS = 1e-5  # fp32 running sums of up to 49,152 entries differ by far less


def _rows(n, m, seed, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(n, m, generator=gen), -1).to(DEV), torch.rand(n, generator=gen).to(DEV)


def _check_against_reference(n, m, seed, block=BLOCK):
    probs, u = _rows(n, m, seed)
    got, ref = sample_rows(probs, u, block=block), inverse_cdf(probs, u)
    assert got.dtype == torch.int64 and got.shape == (n,)
    # at a rounding boundary the two sums' orders can pick different indices; then only entries of
    # rounding-sized mass lie strictly between them (at M = 49,152 a few near-zero entries can: the H100)
    lo, hi = torch.minimum(got, ref), torch.maximum(got, ref)
    cols = torch.arange(m, device=DEV)[None, :]
    between = (probs * ((cols > lo[:, None]) & (cols < hi[:, None]))).sum(1)
    assert between.max() <= BETWEEN_MASS, f"mass between the kernel's and the reference's index: {between.max():.3g}"
    assert (got == ref).float().mean() >= 0.9
    # zero chunks, zeros at the top and in between, u at both ends: never an entry of probability 0
    sparse = probs.clone()
    sparse[:, m // 4: m // 2 + 7] = 0  # (a whole chunk where m > 2 BLOCK)
    sparse[:, -(m // 5):] = 0
    sparse[:, ::3] = 0
    ends = torch.tensor([0.0, 1 - 2 ** -24], device=DEV).repeat(n // 2)
    for uu in (u, ends):
        pick = sample_rows(sparse, uu, block=block)
        assert (sparse.gather(1, pick[:, None]) > 0).all()


@pytest.mark.parametrize("n,m,block", [(4, 100, BLOCK), (2, 3 * BLOCK + 5, BLOCK), (8, 1000, 64)])
def test_matches_the_reference_and_never_draws_probability_zero(n, m, block):
    _check_against_reference(n, m, seed=n + m, block=block)


def test_draws_the_distribution_and_a_wrong_one_fails():
    gen = torch.Generator().manual_seed(1)
    block = 32  # three chunks a row, small enough for the interpreter (4 programs a row)
    p = torch.zeros(2 * block + 40)
    p[[3, block - 1, block + 7, 2 * block + 39]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    n = 300
    idx = sample_rows(p.to(DEV).expand(n, -1).contiguous(), torch.rand(n, generator=gen).to(DEV), block=block).cpu()
    counts = torch.bincount(idx, minlength=p.numel()).float()
    assert counts[p == 0].sum() == 0
    chi2 = lambda want: ((counts[p > 0] - n * want) ** 2 / (n * want)).sum()  # noqa: E731
    assert chi2(p[p > 0]) < 16.3  # 3 degrees of freedom, p = 0.001
    assert chi2(torch.full((4,), 0.25)) > 16.3


def test_unnormalised_rows_and_empty_batches():
    probs, u = _rows(3, 300, seed=5)
    assert torch.equal(sample_rows(7.5 * probs, u), sample_rows(probs, u))
    assert sample_rows(probs[:0], u[:0]).shape == (0,)


def test_bad_inputs_are_refused_in_one_line():
    probs, u = _rows(3, 300, seed=6)
    with pytest.raises(ValueError, match="valid: fp32"):
        sample_rows(probs.double(), u)
    with pytest.raises(ValueError, match="valid: fp32"):
        sample_rows(probs.t(), u)
    with pytest.raises(ValueError, match=r"M >= 1"):
        sample_rows(probs[:, :0], u)
    with pytest.raises(ValueError, match=r"u shape \(2,\)"):
        sample_rows(probs, u[:2])


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_smollm2_vocabulary_at_batch_16():
    _check_against_reference(16, 49152, seed=0)
