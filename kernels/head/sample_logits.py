"""A sampled slot in two Triton launches: softmax(logits / T) written as q, and one draw from it.

The sampled rollout (kernels/head/domino_rollout.py) draws each of its K slots from
``softmax(logits / T)`` and records that distribution as the slot's q (the verifier divides by it).
In torch that is a cast, a division, a softmax, a cumsum, a search and a handful of elementwise
kernels a slot inside the rollout's graph: on an H100 a batched step of SmolLM2's shape and its block-16
drafter ran 4.08 ms sampled against 2.19 greedy at B = 16 (bench/results/batched_overhead_h100/673ef95_*). Where the warp is a temperature alone (top_k off, top_p 1: the RL rollout's setting),
``sample_logits`` does the slot in two launches over (row, chunk) programs:

* `_chunk_stats`: each chunk's max of x = logits / T and its sum of exp(x - max);
* `_write_and_draw`: every program combines its row's chunk stats into the row's max M and total S
  (all programs of a row load the same stats and reduce them in the same order, so they agree to
  the bit), writes q = exp(x - M) / S for its chunk, and the one chunk whose share of S holds
  ``u · S`` (the running sum of the chunks' shares, first passing it among chunks of positive mass)
  scans itself for the first entry whose running sum passes it among entries of positive mass.
  Where rounding leaves no such entry, the chunk's last positive entry (its share is > 0, so it
  has one unless every entry of it underflows, which needs its whole mass under ~1e-38 of S).

The draw is `reference.inverse_cdf`'s rule on the q written (up to the sums' order: at a rounding
boundary a neighbouring index), and an entry of q = 0 is never drawn. Logits of any float dtype and
any strides (the full-vocabulary rollout keeps them [V, B]); q is any fp32 [N, V] view (a slot of
[B, K, V]); tok an int64 [N] view.

`fits(temperature, top_k, top_p, logits)` says whether it applies (else the torch warp and draw).
The rollout uses it on CUDA unless ``DOMINO_GRAFT_SAMPLE_LOGITS=0`` (docs/kernels.md: timed inside the real
decode on an H100, ~9 us a slot over a greedy one against ~41 for the torch slot).
tests/kernels/test_sample_logits.py checks it against `sampling.warp` and `reference.inverse_cdf`
in the interpreter; bench/kernels.py sample_logits times it against the torch slot.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK = 2048  # entries a chunk: one load wave of a program's 8 warps
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _chunk_stats(X, MX, SX, V, C, s_xn, s_xv, inv_t, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    idx = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row.to(tl.int64) * s_xn + idx.to(tl.int64) * s_xv, mask=idx < V, other=float("-inf"))
    x = x.to(tl.float32) * inv_t
    m = tl.max(x, axis=0)
    s = tl.sum(tl.where(x > float("-inf"), tl.exp(x - m), 0.0), axis=0)
    tl.store(MX + row * C + chunk, m)
    tl.store(SX + row * C + chunk, s)


@triton.jit
def _write_and_draw(X, U, MX, SX, Q, TOK, V, C, s_xn, s_xv, s_qn, s_qv, s_u, inv_t,
                    BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    c = tl.arange(0, CHUNKS)
    ms = tl.load(MX + row * C + c, mask=c < C, other=float("-inf"))
    ss = tl.load(SX + row * C + c, mask=c < C, other=0.0)
    top = tl.max(ms, axis=0)
    shares = tl.where(ss > 0, ss * tl.exp(ms - top), 0.0)  # each chunk's mass, on the row's scale
    total = tl.sum(shares, axis=0)
    through = tl.cumsum(shares, axis=0)  # the mass up to and including each chunk
    target = tl.load(U + row * s_u) * total
    hit = (through > target) & (shares > 0)
    first_chunk = tl.min(tl.where(hit, c, CHUNKS), axis=0)
    last_chunk = tl.max(tl.where(shares > 0, c, -1), axis=0)
    owner = tl.where(first_chunk < CHUNKS, first_chunk, last_chunk)

    idx = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row.to(tl.int64) * s_xn + idx.to(tl.int64) * s_xv, mask=idx < V, other=float("-inf"))
    e = tl.where(idx < V, tl.exp(x.to(tl.float32) * inv_t - top), 0.0)
    tl.store(Q + row.to(tl.int64) * s_qn + idx.to(tl.int64) * s_qv, e / total, mask=idx < V)
    if chunk == owner:
        before = tl.sum(tl.where(c == chunk, through - shares, 0.0), axis=0)
        inside = ((before + tl.cumsum(e, axis=0)) > target) & (e > 0)
        first = tl.min(tl.where(inside, idx, V), axis=0)
        last = tl.max(tl.where(e > 0, idx, -1), axis=0)
        pick = tl.where(first < V, first, last)
        # (no positive entry: the whole chunk underflowed; its largest logit, see the module docstring)
        pick = tl.where(pick >= 0, pick, chunk * BLOCK + tl.argmax(x.to(tl.float32), axis=0))
        tl.store(TOK + row, pick.to(tl.int64))


def fits(temperature: float, top_k, top_p, logits: torch.Tensor) -> bool:
    """Whether `sample_logits` does this slot: a temperature-only warp (top_k off or >= V, top_p 1) of
    float logits [N, V] on CUDA (anywhere under TRITON_INTERPRET=1)."""
    vocab = logits.shape[-1]
    return (temperature > 0 and (not top_k or top_k >= vocab) and (top_p is None or top_p >= 1.0)
            and logits.dim() == 2 and logits.is_floating_point() and vocab > 0
            and (logits.is_cuda or INTERPRETED))


def sample_logits(logits: torch.Tensor, temperature: float, u: torch.Tensor, q: torch.Tensor, tok: torch.Tensor, *,
                  block: int = BLOCK) -> None:
    """q[n] = softmax(logits[n] / temperature) and tok[n] = a draw from it at uniform u[n], for each row.
    logits [N, V] float, any strides; u [N] in [0, 1), any stride; q [N, V] fp32, any strides; tok [N]
    int64, unit stride. block: entries a chunk (a power of two; the interpreter's tests use small ones)."""
    if not fits(temperature, 0, 1.0, logits):
        raise ValueError(f"sample_logits: logits {tuple(logits.shape)} {logits.dtype} on {logits.device} at "
                         f"temperature {temperature!r} is not valid; valid: float [N, V >= 1] on CUDA, temperature > 0")
    n, vocab = logits.shape
    if q.shape != (n, vocab) or q.dtype != torch.float32:
        raise ValueError(f"sample_logits: q {tuple(q.shape)} {q.dtype} is not valid; valid: fp32 ({n}, {vocab})")
    if tok.shape != (n,) or tok.dtype != torch.int64 or (n > 1 and tok.stride(0) != 1):
        raise ValueError(f"sample_logits: tok {tuple(tok.shape)} {tok.dtype} is not valid; valid: int64 ({n},), "
                         "unit stride")
    if u.shape != (n,) or u.dtype != torch.float32:
        raise ValueError(f"sample_logits: u {tuple(u.shape)} {u.dtype} is not valid; valid: fp32 ({n},)")
    if n == 0:
        return
    chunks = triton.cdiv(vocab, block)
    stats = torch.empty((2, n, chunks), dtype=torch.float32, device=logits.device)
    inv_t = 1.0 / float(temperature)
    _chunk_stats[(n, chunks)](logits, stats[0], stats[1], vocab, chunks, logits.stride(0), logits.stride(1), inv_t,
                              BLOCK=block, num_warps=8)
    _write_and_draw[(n, chunks)](logits, u, stats[0], stats[1], q, tok, vocab, chunks, logits.stride(0),
                                 logits.stride(1), q.stride(0), q.stride(1), u.stride(0), inv_t, BLOCK=block,
                                 CHUNKS=max(16, triton.next_power_of_2(chunks)), num_warps=8)
