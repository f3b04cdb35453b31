"""kernels/head/sample_logits.py: a sampled slot (softmax(logits / T) as q, one draw from it) against
`sampling.warp` and `reference.inverse_cdf`.

CPU (default): Triton's interpreter, fp32 and bf16 logits, strided logits ([V, B] transposed, as the
rollout keeps them) and a strided q (a slot of [B, K, V]): q equal to warp's up to rounding, the draw
the reference's index on that q (up to a neighbouring index at a rounding boundary), never an entry of
probability 0 (logits of -inf, whole chunks of them), the distribution by a chi-square test that a
wrong one fails, and bad inputs refused in one line. GPU (`-m gpu`): the same at the SmolLM2
vocabulary and B = 16.
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
from domino_graft.kernels.head.sample_logits import BLOCK, fits, sample_logits  # noqa: E402
from domino_graft.sampling import warp  # noqa: E402

DEV = torch.device("cuda" if _CUDA else "cpu")


def _slot(n, v, seed, temperature=1.0, dtype=torch.float32, block=BLOCK, transposed=False, k=3):
    gen = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(n, v, generator=gen)).to(dtype)
    u = torch.rand(n, k, generator=gen)[:, 1]  # a strided column, as the rollout's uniforms[:, j - 1]
    if transposed:  # [V, B] storage, read as [B, V]
        logits = logits.t().contiguous().t()
    logits, u = logits.to(DEV), u.to(DEV)
    q = torch.full((n, k, v), -1.0, device=DEV)  # slot 1 of a [B, K, V] q
    tok = torch.full((k, n), -1, dtype=torch.int64, device=DEV)
    sample_logits(logits, temperature, u, q[:, 1], tok[1], block=block)
    return logits, u, q, tok


@pytest.mark.parametrize("n,v,block,dtype,transposed", [(4, 100, BLOCK, torch.float32, False),
                                                       (3, 2 * 64 + 5, 64, torch.bfloat16, True),
                                                       (8, 1000, 128, torch.float32, True)])
def test_q_is_warps_and_the_draw_is_the_references(n, v, block, dtype, transposed):
    for temperature in (1.0, 0.7):
        logits, u, q, tok = _slot(n, v, seed=n + v, temperature=temperature, dtype=dtype, block=block,
                                  transposed=transposed)
        want = warp(logits, temperature)
        torch.testing.assert_close(q[:, 1], want, rtol=1e-5, atol=1e-7)
        assert (q[:, 0] == -1).all() and (q[:, 2] == -1).all()  # only its own slot written
        ref = inverse_cdf(q[:, 1], u)
        assert (tok[1] - ref).abs().max() <= 1 and (tok[1] == ref).float().mean() >= 0.75
        assert (tok[0] == -1).all() and (tok[2] == -1).all()


def test_never_draws_probability_zero():
    n, v, block = 6, 3 * 64 + 9, 64
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(n, v, generator=gen)
    logits[:, 64:128] = float("-inf")  # a whole chunk
    logits[:, -20:] = float("-inf")  # the top
    logits[:, ::3] = float("-inf")
    logits = logits.to(DEV)
    for u in (torch.rand(n, generator=gen), torch.tensor([0.0, 1 - 2 ** -24] * (n // 2))):
        q = torch.empty(n, v, device=DEV)
        tok = torch.empty(n, dtype=torch.int64, device=DEV)
        sample_logits(logits, 1.0, u.to(DEV), q, tok, block=block)
        assert (q.gather(1, tok[:, None]) > 0).all()
        assert (q[logits == float("-inf")] == 0).all()


def test_draws_the_distribution_and_a_wrong_one_fails():
    block = 32  # three chunks a row, small enough for the interpreter
    p = torch.zeros(2 * block + 40)
    p[[3, block - 1, block + 7, 2 * block + 39]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    n = 300
    logits = p.log().to(DEV).expand(n, -1)  # stride 0 along the rows: any strides
    gen = torch.Generator().manual_seed(1)
    q = torch.empty(n, p.numel(), device=DEV)
    tok = torch.empty(n, dtype=torch.int64, device=DEV)
    sample_logits(logits, 1.0, torch.rand(n, generator=gen).to(DEV), q, tok, block=block)
    counts = torch.bincount(tok.cpu(), minlength=p.numel()).float()
    assert counts[p == 0].sum() == 0
    chi2 = lambda want: ((counts[p > 0] - n * want) ** 2 / (n * want)).sum()  # noqa: E731
    assert chi2(p[p > 0]) < 16.3  # 3 degrees of freedom, p = 0.001
    assert chi2(torch.full((4,), 0.25)) > 16.3


def test_fits_only_a_temperature_alone_and_bad_inputs_are_refused_in_one_line():
    logits = torch.randn(2, 50, device=DEV)
    assert fits(1.0, 0, 1.0, logits) and fits(0.5, 50, None, logits)
    assert not fits(1.0, 10, 1.0, logits) and not fits(1.0, 0, 0.9, logits) and not fits(0.0, 0, 1.0, logits)
    q, tok, u = torch.empty(2, 50, device=DEV), torch.empty(2, dtype=torch.int64, device=DEV), torch.rand(2, device=DEV)
    with pytest.raises(ValueError, match="temperature 0.0 is not valid"):
        sample_logits(logits, 0.0, u, q, tok)
    with pytest.raises(ValueError, match=r"q \(2, 49\)"):
        sample_logits(logits, 1.0, u, q[:, :49], tok)
    with pytest.raises(ValueError, match=r"tok \(2,\) torch.int32"):
        sample_logits(logits, 1.0, u, q, tok.int())
    with pytest.raises(ValueError, match=r"u \(1,\)"):
        sample_logits(logits, 1.0, u[:1], q, tok)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_smollm2_vocabulary_at_batch_16():
    for dtype, transposed in ((torch.float32, True), (torch.bfloat16, False)):
        logits, u, q, tok = _slot(16, 49152, seed=0, dtype=dtype, transposed=transposed)
        torch.testing.assert_close(q[:, 1], warp(logits, 1.0), rtol=1e-5, atol=1e-7)
        ref = inverse_cdf(q[:, 1], u)
        assert (tok[1] - ref).abs().max() <= 1
