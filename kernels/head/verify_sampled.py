"""Speculative sampling's accept rule for a temperature-only warp in four Triton launches.

`decoding/verify.py`'s `verify_sampling` (the reference) takes the target's logits over [x_0, d_1..d_K]
and the rollout's q, accepts d_j with probability min(1, p_j(d_j) / q_j(d_j)) slot after slot, and at the
first rejection draws from norm(max(0, p_j - q_j)), or from p_K when every draft was accepted. In torch
that is a softmax over all K + 1 positions and ~20 small kernels a step: on an H100 at 2db8afa the step's
accept rule took 0.16 ms at B = 1 and 0.38 ms at B = 64 with K' = 3 (0.03-0.04 greedy),
bench/results/batched_overhead_h100/2db8afa_phases_t1.json.gz. Here (x = logits / T, p = softmax(x)):

* `sample_logits._chunk_stats` (row · position, chunk): the chunk's max of x and its sum of exp(x - max);
* `_accept` (row): each position's max M and total S from its chunks (every program that needs them
  combines the same chunks in the same order, so they agree to the bit), then slot after slot
  p_j(d_j) = exp(x_j[d_j] - M_j) / S_j against u_j · q_j(d_j); writes n_acc;
* `_residual` (row, chunk): at the row's position a = n_acc, the chunk's mass of r = max(0, p_a - q_a)
  (of p_K where a = K) and of p_a, and its last entry of positive r and of positive p;
* `_draw` (row): the draw from r by the inverse CDF at w · total (first chunk, then first entry, whose
  running sum passes it among entries of positive mass), from p_a where r has no mass (p_a = q_a: the
  reference's fallback; rejection then has probability 0).

The draw is `reference.inverse_cdf`'s rule (up to the sums' order: at a rounding boundary a neighbouring
index), never an entry of zero mass. Uniforms: u [B, K] for the accepts, then w [B] for the draw, both from
the decode's generator (torch.rand), where the reference draws u and then calls torch.multinomial.

`applies(temperature, top_k, top_p, logits)` says whether it can run (CUDA, or anywhere under
TRITON_INTERPRET=1; top_k off and top_p 1); `fits` is what decoding/verify.py's `verify_chain` asks: `applies`,
unless ``DOMINO_GRAFT_VERIFY_SAMPLED=0``. On by default since an H100 timed it (experiments/verify_sampled_check.sh
at 2ae368d, bench/results/verify_sampled_h100/): the accept phase 0.158 -> 0.023 ms at B = 1, K' = 3, and
0.297 -> 0.044 at B = 16, K' = 15; its tests passed on CUDA.
tests/kernels/test_verify_sampled.py checks it against the reference in the interpreter (n_acc exactly on
the same uniforms, the draw's distribution by chi-square with a wrong-distribution control);
bench/kernels.py verify_sampled times it against the torch rule.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .sample_logits import _chunk_stats

BLOCK = 2048  # entries a chunk: one load wave of a program's 8 warps
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _row_scale(MX, SX, rp, C, CHUNKS: tl.constexpr):
    """(max M, total S) of position rp's x from its chunks' stats (the same order in every caller)."""
    c = tl.arange(0, CHUNKS)
    ms = tl.load(MX + rp * C + c, mask=c < C, other=float("-inf"))
    ss = tl.load(SX + rp * C + c, mask=c < C, other=0.0)
    top = tl.max(ms, axis=0)
    total = tl.sum(tl.where(ss > 0, ss * tl.exp(ms - top), 0.0), axis=0)
    return top, total


@triton.jit
def _accept(X, Q, D, U, MX, SX, NACC, K, C, s_xb, s_xt, s_qb, s_qk, s_db, s_ub, inv_t,
            T1: tl.constexpr, CHUNKS: tl.constexpr):
    """Program row: n_acc = the first slot j whose u_j · q_j(d_j) >= p_j(d_j) (K where none is)."""
    row = tl.program_id(0)
    n_acc = K
    for j in range(0, K):
        top, total = _row_scale(MX, SX, row * T1 + j, C, CHUNKS)
        d = tl.load(D + row * s_db + j)
        x = tl.load(X + row.to(tl.int64) * s_xb + j * s_xt + d).to(tl.float32) * inv_t
        p = tl.exp(x - top) / total
        q = tl.load(Q + row.to(tl.int64) * s_qb + j * s_qk + d)
        u = tl.load(U + row * s_ub + j)
        rejected = (u * q >= p) & (n_acc == K)
        n_acc = tl.where(rejected, j, n_acc)
    tl.store(NACC + row, n_acc.to(tl.int64))


@triton.jit
def _dist_chunk(X, Q, MX, SX, row, a, K, C, idx, V, s_xb, s_xt, s_qb, s_qk, inv_t,
                T1: tl.constexpr, CHUNKS: tl.constexpr):
    """(r, p) over the entries idx of the row's position a: p = softmax(x_a), r = max(0, p - q_a), or p
    where a = K (the bonus: no q there)."""
    top, total = _row_scale(MX, SX, row * T1 + a, C, CHUNKS)
    ok = idx < V
    x = tl.load(X + row.to(tl.int64) * s_xb + a * s_xt + idx, mask=ok, other=float("-inf")).to(tl.float32)
    p = tl.where(ok, tl.exp(x * inv_t - top) / total, 0.0)
    q = tl.load(Q + row.to(tl.int64) * s_qb + tl.minimum(a, K - 1) * s_qk + idx, mask=ok, other=0.0)  # unused at a = K
    r = tl.where(a < K, tl.maximum(p - q, 0.0), p)
    return r, p


@triton.jit
def _residual(X, Q, MX, SX, NACC, RS, RL, PS, PL, V, K, C, s_xb, s_xt, s_qb, s_qk, inv_t,
              T1: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    """Program (row, chunk): the chunk's mass of r and of p at the row's position n_acc, and its last
    entry of positive r and of positive p."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    a = tl.load(NACC + row).to(tl.int32)
    idx = chunk * BLOCK + tl.arange(0, BLOCK)
    r, p = _dist_chunk(X, Q, MX, SX, row, a, K, C, idx, V, s_xb, s_xt, s_qb, s_qk, inv_t, T1, CHUNKS)
    tl.store(RS + row * C + chunk, tl.sum(r, axis=0))
    tl.store(RL + row * C + chunk, tl.max(tl.where(r > 0, idx, -1), axis=0))
    tl.store(PS + row * C + chunk, tl.sum(p, axis=0))
    tl.store(PL + row * C + chunk, tl.max(tl.where(p > 0, idx, -1), axis=0))


@triton.jit
def _draw(X, Q, MX, SX, NACC, RS, RL, PS, PL, W, NXT, V, K, C, s_xb, s_xt, s_qb, s_qk, s_w, inv_t,
          T1: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    """Program row: the inverse-CDF draw at w from r, or from p where r has no mass."""
    row = tl.program_id(0)
    a = tl.load(NACC + row).to(tl.int32)
    c = tl.arange(0, CHUNKS)
    rs = tl.load(RS + row * C + c, mask=c < C, other=0.0)
    use_r = tl.sum(rs, axis=0) > 0
    sums = tl.where(use_r, rs, tl.load(PS + row * C + c, mask=c < C, other=0.0))
    lasts = tl.where(use_r, tl.load(RL + row * C + c, mask=c < C, other=-1),
                     tl.load(PL + row * C + c, mask=c < C, other=-1))
    target = tl.load(W + row * s_w) * tl.sum(sums, axis=0)
    through = tl.cumsum(sums, axis=0)  # the mass up to and including each chunk
    hit = (through > target) & (sums > 0)
    pick = tl.min(tl.where(hit, c, CHUNKS), axis=0)
    found = pick < CHUNKS
    pick = tl.where(found, pick, tl.max(tl.where(sums > 0, c, 0), axis=0))  # rounding at the top: the last chunk
    before = tl.sum(tl.where(c == pick, through - sums, 0.0), axis=0)
    idx = pick * BLOCK + tl.arange(0, BLOCK)
    r, p = _dist_chunk(X, Q, MX, SX, row, a, K, C, idx, V, s_xb, s_xt, s_qb, s_qk, inv_t, T1, CHUNKS)
    e = tl.where(use_r, r, p)
    inside = ((before + tl.cumsum(e, axis=0)) > target) & (e > 0)
    first = tl.min(tl.where(inside, idx, V), axis=0)
    chunk_last = tl.max(tl.where(e > 0, idx, -1), axis=0)
    out = tl.where(first < V, first, chunk_last)
    tl.store(NXT + row, tl.where(found, out, tl.max(lasts, axis=0)).to(tl.int64))


def applies(temperature: float, top_k, top_p, logits: torch.Tensor) -> bool:
    """Whether the kernels can do this verify: a temperature-only warp (top_k off or >= V, top_p 1) of float
    logits [B, K + 1, V] (K >= 1) on CUDA (anywhere under TRITON_INTERPRET=1)."""
    vocab = logits.shape[-1]
    return (temperature > 0 and (not top_k or top_k >= vocab) and (top_p is None or top_p >= 1.0)
            and logits.dim() == 3 and logits.shape[1] >= 2 and logits.is_floating_point() and vocab > 0
            and (logits.is_cuda or INTERPRETED))


def fits(temperature: float, top_k, top_p, logits: torch.Tensor) -> bool:
    """Whether decoding takes this path: `applies`, unless DOMINO_GRAFT_VERIFY_SAMPLED=0 (the torch rule)."""
    return os.environ.get("DOMINO_GRAFT_VERIFY_SAMPLED") != "0" and applies(temperature, top_k, top_p, logits)


def verify_sampled(logits: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, temperature: float,
                   u: torch.Tensor, w: torch.Tensor, *, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, K + 1, V] (any float dtype, unit stride along V), q [B, K, V] fp32 (unit stride along
    V), drafts [B, K] int64, u [B, K] and w [B] fp32 uniforms in [0, 1) -> (n_acc [B], next [B]) int64.
    block: entries a chunk (a power of two; the interpreter's tests use small ones)."""
    if not applies(temperature, 0, 1.0, logits):
        raise ValueError(f"verify_sampled: logits {tuple(logits.shape)} {logits.dtype} on {logits.device} at "
                         f"temperature {temperature!r} is not valid; valid: float [B, K + 1 >= 2, V] on CUDA, "
                         "temperature > 0")
    b, t1, vocab = logits.shape
    k = t1 - 1
    for name, t, shape, dtype in (("q", q, (b, k, vocab), torch.float32), ("drafts", drafts, (b, k), torch.int64),
                                  ("u", u, (b, k), torch.float32), ("w", w, (b,), torch.float32)):
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"verify_sampled: {name} {tuple(t.shape)} {t.dtype} is not valid; valid: {dtype} {shape}")
    if logits.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError(f"verify_sampled: strides {tuple(logits.stride())} / {tuple(q.stride())} are not valid; "
                         "valid: unit stride along the vocabulary")
    n_acc = torch.empty(b, dtype=torch.int64, device=logits.device)
    nxt = torch.empty(b, dtype=torch.int64, device=logits.device)
    if b == 0:
        return n_acc, nxt
    c = triton.cdiv(vocab, block)
    chunks = max(16, triton.next_power_of_2(c))
    stats = torch.empty((2, b * t1, c), dtype=torch.float32, device=logits.device)
    sums = torch.empty((2, b, c), dtype=torch.float32, device=logits.device)
    lasts = torch.empty((2, b, c), dtype=torch.int32, device=logits.device)
    inv_t = 1.0 / float(temperature)
    if logits.stride(0) != t1 * logits.stride(1):  # positions of a row one after another: [B * (K + 1), V] rows
        logits = logits.contiguous()
    s_xb, s_xt = logits.stride(0), logits.stride(1)
    s_qb, s_qk = q.stride(0), q.stride(1)
    _chunk_stats[(b * t1, c)](logits, stats[0], stats[1], vocab, c, s_xt, 1, inv_t, BLOCK=block, num_warps=8)
    _accept[(b,)](logits, q, drafts, u, stats[0], stats[1], n_acc, k, c, s_xb, s_xt, s_qb, s_qk, drafts.stride(0),
                  u.stride(0), inv_t, T1=t1, CHUNKS=chunks, num_warps=1)
    _residual[(b, c)](logits, q, stats[0], stats[1], n_acc, sums[0], lasts[0], sums[1], lasts[1], vocab, k, c,
                      s_xb, s_xt, s_qb, s_qk, inv_t, T1=t1, BLOCK=block, CHUNKS=chunks, num_warps=8)
    _draw[(b,)](logits, q, stats[0], stats[1], n_acc, sums[0], lasts[0], sums[1], lasts[1], w, nxt, vocab, k, c,
                s_xb, s_xt, s_qb, s_qk, w.stride(0), inv_t, T1=t1, BLOCK=block, CHUNKS=chunks, num_warps=8)
    return n_acc, nxt
