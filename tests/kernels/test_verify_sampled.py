"""kernels/head/verify_sampled.py: speculative sampling's accept rule, fused, against decoding/verify.py's
torch rule and `reference.inverse_cdf`.

CPU (default): Triton's interpreter. On the same uniforms n_acc is the torch rule's exactly and the draw is
the inverse-CDF index of the reference's distribution (the residual at the first rejection, p_K where every
draft was accepted); an entry of zero mass is never drawn; the first emitted token of many one-slot verifies
is distributed as the target's p (chi-square), and a q other than the one the drafts were drawn from (p
itself) fails that test; bad inputs are refused in one line; decoding takes it unless
DOMINO_GRAFT_VERIFY_SAMPLED=0. GPU (`-m gpu`): the SmolLM2 vocabulary at B = 16, K = 3.
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
from domino_graft.kernels.head.verify_sampled import fits, verify_sampled  # noqa: E402
from domino_graft.sampling import warp  # noqa: E402

DEV = torch.device("cuda" if _CUDA else "cpu")


def _reference(logits, q, drafts, temperature, u, w):
    """decoding/verify.py's rule with the draw by inverse CDF at w (the reference's multinomial is
    the same distribution; inverse CDF makes it comparable index for index)."""
    p = warp(logits, temperature)
    b, k = drafts.shape
    pd = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    qd = q.gather(-1, drafts[..., None]).squeeze(-1)
    n_acc = (u * qd < pd).long().cumprod(-1).sum(-1)
    at = n_acc.clamp(max=k - 1)
    rows = torch.arange(b)
    p_rej, q_rej = p[rows, at], q[rows, at]
    residual = (p_rej - q_rej).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_rej)
    dist = torch.where((n_acc == k)[:, None], p[:, k], residual)
    return n_acc, inverse_cdf(dist, w), dist


def _case(b, k, v, seed, dtype=torch.float32, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(b, k + 1, v, generator=gen)).to(dtype)
    q = torch.softmax(scale * torch.randn(b, k, v, generator=gen), -1)
    # drafts drawn from q, and a target close to the drafter on some rows so that drafts get accepted
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=gen).view(b, k)
    near = torch.rand(b, generator=gen) < 0.5
    logits[near, :k] = torch.log(q[near]).to(dtype) + 0.1 * torch.randn(int(near.sum()), k, v, generator=gen).to(dtype)
    u = torch.rand(b, k, generator=gen)
    w = torch.rand(b, generator=gen)
    return logits, q, drafts, u, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_accepts_and_draws_as_the_torch_rule(dtype):
    b, k, v, block = 24, 3, 50, 16  # 4 chunks a row, the last one partial
    logits, q, drafts, u, w = _case(b, k, v, 0, dtype)
    ref_n, ref_next, _ = _reference(logits.float(), q, drafts, 0.8, u, w)
    n_acc, nxt = verify_sampled(logits.to(DEV), q.to(DEV), drafts.to(DEV), 0.8, u.to(DEV), w.to(DEV), block=block)
    assert torch.equal(n_acc.cpu(), ref_n)
    assert 0 < int(ref_n.sum()) and int((ref_n < k).sum()) > 0  # both rejections and acceptances were exercised
    assert torch.equal(nxt.cpu(), ref_next)


def test_all_accepted_draws_the_bonus_from_the_last_position():
    b, k, v = 8, 2, 40
    logits, q, drafts, _, w = _case(b, k, v, 1)
    u = torch.zeros(b, k)  # u · q < p for every draft p > 0: all accepted
    n_acc, nxt = verify_sampled(logits.to(DEV), q.to(DEV), drafts.to(DEV), 1.0, u.to(DEV), w.to(DEV), block=16)
    assert n_acc.tolist() == [k] * b
    assert torch.equal(nxt.cpu(), inverse_cdf(warp(logits[:, k], 1.0), w))


def test_never_draws_an_entry_of_zero_mass():
    b, k, v = 16, 1, 64
    logits, q, drafts, u, _ = _case(b, k, v, 2)
    logits[:, :, 16:48] = float("-inf")  # two whole chunks of p = 0
    w = torch.full((b,), 0.999999)  # at the top of the CDF, where rounding could run past the last entry
    n_acc, nxt = verify_sampled(logits.to(DEV), q.to(DEV), drafts.to(DEV), 1.0, u.to(DEV), w.to(DEV), block=16)
    _, _, dist = _reference(logits, q, drafts, 1.0, u, w)
    assert all(dist[r, t] > 0 for r, t in enumerate(nxt.cpu().tolist()))


def _first_tokens(p_logits, q_drawn, q_told, n, seed):
    """The first emitted token of n one-slot verifies whose drafts are drawn from q_drawn and whose
    verifier is told q_told."""
    gen = torch.Generator().manual_seed(seed)
    v = p_logits.shape[-1]
    drafts = torch.multinomial(q_drawn.expand(n, v), 1, replacement=True, generator=gen)
    logits = p_logits.expand(n, 2, v).contiguous()
    q = q_told.expand(n, 1, v).contiguous()
    u, w = torch.rand(n, 1, generator=gen), torch.rand(n, generator=gen)
    n_acc, nxt = verify_sampled(logits.to(DEV), q.to(DEV), drafts.to(DEV), 1.0, u.to(DEV), w.to(DEV), block=8)
    return torch.where(n_acc.cpu() > 0, drafts[:, 0], nxt.cpu())


def _chi2(tokens, p):
    counts = torch.bincount(tokens, minlength=p.numel()).double()
    expected = p.double() * tokens.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def test_first_token_is_distributed_as_the_target_and_a_wrong_q_fails():
    p_logits = torch.log(torch.tensor([[0.25, 0.20, 0.20, 0.15, 0.10, 0.10], [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]]))
    p = torch.softmax(p_logits[0], -1)
    q = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
    n = 120  # the interpreter runs a program at a time: ~0.1 s a row
    right = _chi2(_first_tokens(p_logits, q, q, n, 3), p)
    wrong = _chi2(_first_tokens(p_logits, q, p, n, 3), p)  # told the drafts came from p: q's distribution comes out
    critical = 20.5  # chi-square, 5 degrees of freedom, p = 0.001
    assert right < critical
    assert wrong > critical


def test_bad_inputs_are_refused_in_one_line():
    logits, q, drafts, u, w = _case(2, 2, 32, 4)
    args = [t.to(DEV) for t in (logits, q, drafts)]
    with pytest.raises(ValueError, match=r"q \(2, 1, 32\).*valid"):
        verify_sampled(args[0], args[1][:, :1], args[2], 1.0, u.to(DEV), w.to(DEV))
    with pytest.raises(ValueError, match="temperature 0.*valid"):
        verify_sampled(args[0], args[1], args[2], 0.0, u.to(DEV), w.to(DEV))
    with pytest.raises(ValueError, match=r"w \(3,\).*valid"):
        verify_sampled(args[0], args[1], args[2], 1.0, u.to(DEV), torch.rand(3).to(DEV))


def test_decoding_takes_it_unless_switched_off(monkeypatch):
    """On by default (timed on an H100: module docstring); DOMINO_GRAFT_VERIFY_SAMPLED=0 keeps the torch rule;
    only the warp it can do."""
    logits = torch.zeros(2, 4, 32, device=DEV)
    monkeypatch.setenv("DOMINO_GRAFT_VERIFY_SAMPLED", "0")
    assert not fits(1.0, 0, 1.0, logits)
    monkeypatch.delenv("DOMINO_GRAFT_VERIFY_SAMPLED")
    assert fits(1.0, 0, 1.0, logits) and fits(0.7, 32, None, logits)
    assert not fits(1.0, 5, 1.0, logits) and not fits(1.0, 0, 0.9, logits) and not fits(1.0, 0, 1.0, logits[:, :1])


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_smollm2_vocabulary_on_the_gpu():
    b, k, v = 16, 3, 49152
    logits, q, drafts, u, w = _case(b, k, v, 5, torch.bfloat16, scale=6.0)
    ref_n, ref_next, _ = _reference(logits.float(), q, drafts, 1.0, u, w)
    n_acc, nxt = verify_sampled(logits.cuda(), q.cuda(), drafts.cuda(), 1.0, u.cuda(), w.cuda())
    assert torch.equal(n_acc.cpu(), ref_n)
    assert (nxt.cpu() == ref_next).float().mean() >= 0.9  # a neighbouring index at a rounding boundary at most
