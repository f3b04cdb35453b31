"""`head_ce`: the head's cross-entropy over base + W2·z, chunked over rows.

The dense loss builds logits [N, V] (N = blocks·K) in fp32, and autograd keeps them plus their
gradient: 2 × 4·N·V bytes, 5 GB for 4096 rows of Qwen3's 151,936-token vocabulary. `head_ce`
computes the same per-row losses chunk by chunk: the forward keeps only the log-sum-exp per
row; the backward recomputes each chunk's logits (one extra [c, r]×[r, V] GEMM per chunk, cheap
next to the softmax traffic) and turns them into gradients in place. Peak extra memory is a
few [c, V] fp32 buffers instead of [N, V] ones.

Gradients flow to z, W2 and base (the backbone's logits, when the backbone trains). The
gradient w.r.t. base is [N, V] by nature (same size as base itself); it is only formed when
base requires grad.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

_DEFAULT_CHUNK_BYTES = 256 << 20  # fp32 logits per chunk: ~441 rows of a 151,936-token vocabulary


def _chunk_rows(vocab: int, chunk_rows: Optional[int]) -> int:
    if chunk_rows:
        return int(chunk_rows)
    return max(1, _DEFAULT_CHUNK_BYTES // (4 * vocab))


def _logits(z, w2, base_rows):
    out = base_rows.float()
    if z is not None:
        out = out + F.linear(z, w2).float()
    return out


class _HeadCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, w2, base, labels, chunk, ignore_index):
        n = base.shape[0]
        loss = torch.zeros(n, device=base.device, dtype=torch.float32)
        lse = torch.zeros(n, device=base.device, dtype=torch.float32)
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            logits = _logits(None if z is None else z[s:e], w2, base[s:e])
            lab = labels[s:e]
            valid = lab != ignore_index
            lse_c = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(-1, lab.clamp(min=0)[:, None]).squeeze(-1)
            loss[s:e] = torch.where(valid, lse_c - picked, torch.zeros_like(lse_c))
            lse[s:e] = lse_c
            del logits
        ctx.save_for_backward(z, w2, base, labels, lse)
        ctx.chunk, ctx.ignore_index = chunk, ignore_index
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        z, w2, base, labels, lse = ctx.saved_tensors
        chunk, ignore_index = ctx.chunk, ctx.ignore_index
        need_z = z is not None and ctx.needs_input_grad[0]
        need_w2 = w2 is not None and ctx.needs_input_grad[1]
        need_base = ctx.needs_input_grad[2]
        gz = torch.zeros_like(z) if need_z else None
        gw2 = torch.zeros(w2.shape, device=w2.device, dtype=torch.float32) if need_w2 else None
        gbase = torch.empty_like(base) if need_base else None
        n = base.shape[0]
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            g = _logits(None if z is None else z[s:e], w2, base[s:e])
            g.sub_(lse[s:e, None]).exp_()  # softmax, in place
            lab = labels[s:e]
            valid = lab != ignore_index
            rows = torch.arange(e - s, device=g.device)
            g[rows, lab.clamp(min=0)] -= valid.to(g.dtype)
            g.mul_((grad_loss[s:e] * valid.to(grad_loss.dtype))[:, None])
            if need_base:
                gbase[s:e] = g.to(base.dtype)
            if need_z or need_w2:
                gg = g.to(z.dtype)
                if need_z:
                    gz[s:e] = gg @ w2
                if need_w2:
                    gw2 += (gg.t() @ z[s:e]).float()
            del g
        return gz, (gw2.to(w2.dtype) if need_w2 else None), gbase, None, None, None


def head_ce(z: Optional[torch.Tensor], w2: Optional[torch.Tensor], base: torch.Tensor, labels: torch.Tensor, *,
            chunk_rows: Optional[int] = None, ignore_index: int = -100) -> torch.Tensor:
    """Per-row cross-entropy [N] (fp32) of logits base + z·W2^T, chunked over rows.

    z [N, r] (the head's SiLU features; None = CE of base alone), w2 [V, r], base [N, V],
    labels [N] (ignore_index rows give 0 loss and no gradient). Weight and reduce the result
    as the objective needs (slot weights, the λ curriculum).
    """
    if base.dim() != 2:
        raise ValueError(f"head_ce wants base [N, V], got {tuple(base.shape)}")
    return _HeadCE.apply(z, w2, base, labels, _chunk_rows(base.shape[1], chunk_rows), ignore_index)


def dense_head_ce(z, w2, base, labels, *, ignore_index: int = -100) -> torch.Tensor:
    """The dense reference: all [N, V] logits at once."""
    return F.cross_entropy(_logits(z, w2, base), labels, reduction="none", ignore_index=ignore_index)
