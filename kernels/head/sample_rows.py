"""One inverse-CDF draw per row in two Triton launches: the sampled rollout's draw of a slot.

``sample_rows(probs [N, M], u [N])`` returns, per row, the first index whose running sum of probs
exceeds ``u · total`` among the entries of positive probability (the last such entry where rounding
puts ``u · total`` at the very top): the rule of `reference.inverse_cdf`, whose torch form is a
cumsum, a searchsorted and four elementwise kernels. On CUDA torch's scan walks a long row one row
at a time: a [16, 49,152] cumsum took 60 us on an H100, and a sampled rollout step draws 15 slots
(bench/results/batched_overhead_h100/: 0.9 ms of a 4.1 ms step at B = 16).

Kernels: two launches, each one load wave a program (a program walking a whole row chunk by chunk
waits on one memory round trip a chunk). `_chunk_sums`: program (row, chunk) sums its BLOCK entries
and notes its last entry of positive probability. `_draw`: program row reads the row's chunk sums,
finds the first chunk whose running total passes ``u · total`` among chunks of positive mass, then
scans that chunk (``tl.cumsum`` from the chunks before it) for the first entry that passes it among
entries of positive probability; where rounding leaves none, the chunk's (or, at the very top, the
row's) last positive entry. Entries of probability 0 are never drawn, whatever the scans' rounding.
The sums' order differs from torch's cumsum, so at a boundary the two can pick neighbouring indices
for the same u: a rounding-sized difference in the distribution drawn from (the verifier divides by
the q recorded, and q is these probs).

Fallback: `supported(probs)` is False (CPU outside the interpreter, a non-fp32 or non-contiguous
row) -> callers use `reference.inverse_cdf`. The rollout uses this kernel on CUDA where
``DOMINO_GRAFT_SAMPLE_ROWS=1`` (off until the GPU measures it against the torch draw:
`bench/kernels.py sample_rows`, `bench/batched_overhead.py --temperature 1`).
tests/kernels/test_sample_rows.py checks it against the reference in the interpreter.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK = 2048  # entries a chunk: 8 KB of fp32, one load wave of a program's 8 warps
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _chunk_sums(P, S, L, M, C, s_p, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    idx = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(P + row.to(tl.int64) * s_p + idx, mask=idx < M, other=0.0)
    tl.store(S + row * C + chunk, tl.sum(x, axis=0))
    tl.store(L + row * C + chunk, tl.max(tl.where(x > 0, idx, -1), axis=0))


@triton.jit
def _draw(P, U, S, L, OUT, M, C, s_p, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS)
    sums = tl.load(S + row * C + c, mask=c < C, other=0.0)
    lasts = tl.load(L + row * C + c, mask=c < C, other=-1)
    target = tl.load(U + row) * tl.sum(sums, axis=0)
    through = tl.cumsum(sums, axis=0)  # the row's mass up to and including each chunk
    hit = (through > target) & (sums > 0)
    pick = tl.min(tl.where(hit, c, CHUNKS), axis=0)
    top = tl.max(lasts, axis=0)  # the row's last entry of positive probability
    found = pick < CHUNKS
    pick = tl.where(found, pick, 0)
    before = tl.sum(tl.where(c == pick, through - sums, 0.0), axis=0)  # the mass of the chunks before
    idx = pick * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(P + row.to(tl.int64) * s_p + idx, mask=idx < M, other=0.0)  # (not found: chunk 0, unused)
    inside = ((before + tl.cumsum(x, axis=0)) > target) & (x > 0)
    first = tl.min(tl.where(inside, idx, M), axis=0)
    chunk_last = tl.max(tl.where(x > 0, idx, -1), axis=0)
    out = tl.where(first < M, first, chunk_last)
    tl.store(OUT + row, tl.where(found, out, top).to(tl.int64))


def supported(probs: torch.Tensor) -> bool:
    """Whether `sample_rows` runs here: fp32 rows [N, M] with unit stride, on CUDA (anywhere under
    TRITON_INTERPRET=1)."""
    return (probs.dim() == 2 and probs.dtype == torch.float32 and probs.stride(-1) == 1
            and (probs.is_cuda or INTERPRETED))


def sample_rows(probs: torch.Tensor, u: torch.Tensor, *, block: int = BLOCK) -> torch.Tensor:
    """probs [N, M] fp32 (rows need not be normalised), u [N] in [0, 1) -> [N] int64 indices.
    block: entries a chunk (a power of two; the interpreter's tests use small ones)."""
    if not supported(probs) or probs.shape[1] == 0:
        raise ValueError(f"sample_rows: probs {tuple(probs.shape)} {probs.dtype} on {probs.device} (stride "
                         f"{tuple(probs.stride())}) is not valid; valid: fp32 [N, M >= 1] with unit stride, on CUDA")
    n, m = probs.shape
    if u.shape != (n,):
        raise ValueError(f"sample_rows: u shape {tuple(u.shape)} is not valid; valid: ({n},)")
    out = torch.empty(n, dtype=torch.int64, device=probs.device)
    if n == 0:
        return out
    c = triton.cdiv(m, block)
    sums = torch.empty((n, c), dtype=torch.float32, device=probs.device)
    lasts = torch.empty((n, c), dtype=torch.int32, device=probs.device)
    _chunk_sums[(n, c)](probs, sums, lasts, m, c, probs.stride(0), BLOCK=block, num_warps=8)
    _draw[(n,)](probs, u.to(torch.float32).contiguous(), sums, lasts, out, m, c, probs.stride(0), BLOCK=block,
                CHUNKS=max(16, triton.next_power_of_2(c)), num_warps=8)
    return out
