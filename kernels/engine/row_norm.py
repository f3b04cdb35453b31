"""RMSNorm with each row reduced alone (one row, or a few one after another, a Triton program), for the
fast engine's batch-invariant forward (FastLM.use_linears("triton")).

Why a kernel of our own: torch.compile's fused RMSNorm picks its launch layout (rows per
program, threads per row) from the number of rows, and the reduction's summation order follows
the layout, so a row's bits could depend on how many other rows share the call. Here every row
is reduced by the same code with the same block and warp count whatever M is: a row normalised
alone, in a batch of 32 or as one row of a 16-token verify is the same bits. A program walks
ROWS rows in turn (`rows_per_program(M)`): the same per-row code, so the same bits at any ROWS.

Rounding follows domino_graft.fast.llama_math.rms_norm (the reference, and Hugging Face's
LlamaRMSNorm): the mean of squares and the scaling in fp32, the result rounded to x's dtype,
then multiplied by the weight in that dtype (computed in fp32, rounded once).
tests/kernels/test_small_linear.py checks it against the reference in the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, pdl_enter, use_pdl


@triton.jit
def _rms_norm_kernel(X, W, Y, s_x, s_y, M, H, eps, BLOCK: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)  # kernels/engine/pdl.py
    c = tl.arange(0, BLOCK)
    ok = c < H
    w = tl.load(W + c, mask=ok, other=0.0)
    # ROWS rows one after another, each by the same code as a program of one row: the same bits whatever
    # ROWS is, so the rows per program may follow M (module docstring)
    for i in tl.static_range(ROWS):
        row = tl.program_id(0) * ROWS + i
        live = c < tl.where(row < M, H, 0)  # the row's columns; none past the last row
        x = tl.load(X + row * s_x + c, mask=live, other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
        h = (x * r).to(Y.dtype.element_ty)
        y = (w.to(tl.float32) * h.to(tl.float32)).to(Y.dtype.element_ty)
        tl.store(Y + row * s_y + c, y, mask=live)


# rows per program by the call's rows (the first entry whose bound M does not exceed): one program per
# row schedules M programs of a few hundred bytes each (at 1,024 rows of 576 on the H100 a call took
# ~13 us in the batched chain's verify, ~1 us of traffic); several rows a program may amortise that
# (bench/row_norm_rows.py measures each ROWS; one row a program until it has)
ROWS_BY_M = ((1 << 62, 1),)


def rows_per_program(m: int) -> int:
    return next(rows for bound, rows in ROWS_BY_M if m <= bound)


def rms_norm_rows(x: torch.Tensor, w: torch.Tensor, eps: float, rows: int | None = None) -> torch.Tensor:
    """x ``[..., H]``, w ``[H]`` (x's dtype) -> ``w * (x * rsqrt(mean(x²) + eps))`` in x.dtype,
    each row reduced alone (bits independent of the other rows). rows: rows per program (default
    `rows_per_program(M)`; any value gives the same bits)."""
    if x.shape[-1] != w.shape[0] or w.dim() != 1:
        raise ValueError(f"rms_norm_rows: weight shape {tuple(w.shape)} does not match x's last dim "
                         f"{x.shape[-1]}; valid: ({x.shape[-1]},)")
    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, h), dtype=x.dtype, device=x.device)
    if m:
        block = triton.next_power_of_2(h)
        per = rows or rows_per_program(m)
        pdl = use_pdl(x2)
        _rms_norm_kernel[(triton.cdiv(m, per),)](x2, w, y, x2.stride(0), y.stride(0), m, h, float(eps), BLOCK=block,
                                                ROWS=per, PDL=pdl, num_warps=4 if block <= 4096 else 8,
                                                **launch_options(pdl))
    return y.reshape(x.shape)
