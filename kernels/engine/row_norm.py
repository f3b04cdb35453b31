"""RMSNorm as one Triton program per row, for the fast engine's batch-invariant forward
(FastLM.use_linears("triton")).

Why a kernel of our own: torch.compile's fused RMSNorm picks its launch layout (rows per
program, threads per row) from the number of rows, and the reduction's summation order follows
the layout, so a row's bits could depend on how many other rows share the call. Here every row
is reduced by one program with the same block and warp count whatever M is: a row normalised
alone, in a batch of 32 or as one row of a 16-token verify is the same bits.

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
def _rms_norm_kernel(X, W, Y, s_x, s_y, H, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)  # kernels/engine/pdl.py
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    ok = c < H
    x = tl.load(X + row * s_x + c, mask=ok, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    h = (x * r).to(Y.dtype.element_ty)
    w = tl.load(W + c, mask=ok, other=0.0)
    y = (w.to(tl.float32) * h.to(tl.float32)).to(Y.dtype.element_ty)
    tl.store(Y + row * s_y + c, y, mask=ok)


def rms_norm_rows(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x ``[..., H]``, w ``[H]`` (x's dtype) -> ``w * (x * rsqrt(mean(x²) + eps))`` in x.dtype,
    each row by its own program (bits independent of the other rows)."""
    if x.shape[-1] != w.shape[0] or w.dim() != 1:
        raise ValueError(f"rms_norm_rows: weight shape {tuple(w.shape)} does not match x's last dim "
                         f"{x.shape[-1]}; valid: ({x.shape[-1]},)")
    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((x2.shape[0], h), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(h)
        pdl = use_pdl(x2)
        _rms_norm_kernel[(x2.shape[0],)](x2, w, y, x2.stride(0), y.stride(0), h, float(eps), BLOCK=block, PDL=pdl,
                                         num_warps=4 if block <= 4096 else 8, **launch_options(pdl))
    return y.reshape(x.shape)
