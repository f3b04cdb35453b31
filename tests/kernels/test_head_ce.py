"""kernels/head/head_ce.py (the Domino head's chunked cross-entropy) against the dense loss:
values, gradients and memory.

Tolerances and shapes: tests/kernels/head_kit.py (CPU: Triton's interpreter; GPU: -m gpu)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.head_kit import (  # noqa: I001  (sets TRITON_INTERPRET before triton loads)
    K,
    assert_close,
    _LargestTensor,
    GPUKit,
    _CUDA,
)


@pytest.mark.parametrize("chunk_rows", [7, 64])
def test_head_ce_matches_dense(chunk_rows):
    n, r, v = 45, 12, 1013
    gen = torch.Generator().manual_seed(6)
    z0 = torch.randn(n, r, generator=gen)
    w20 = torch.randn(v, r, generator=gen) / r**0.5
    base0 = torch.randn(n, v, generator=gen) * 2
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[::5] = -100
    gw = torch.rand(n, generator=gen)  # per-row weights, like the slot weights

    def run(fn):
        z, w2, base = (t.clone().requires_grad_() for t in (z0, w20, base0))
        loss = fn(z, w2, base, labels)
        (loss * gw).sum().backward()
        return loss.detach(), z.grad, w2.grad, base.grad

    dense = run(K.dense_head_ce)
    chunked = run(lambda *a: K.head_ce(*a, chunk_rows=chunk_rows))
    for name, a, b in zip(("loss", "grad z", "grad W2", "grad base"), chunked, dense):
        assert_close(a, b, atol=1e-5, rtol=1e-5, what=f"head_ce {name}")
    assert (chunked[0][::5] == 0).all() and (chunked[3][::5] == 0).all()


def test_head_ce_memory_largest_intermediate():
    """Forward + backward with a frozen backbone: dense holds [N, V] fp32, chunked [c, V]."""
    n, r, v, c = 256, 16, 1013, 32
    z = torch.randn(n, r, requires_grad=True)
    w2 = torch.randn(v, r, requires_grad=True)
    base = torch.randn(n, v)
    labels = torch.randint(0, v, (n,))
    sizes = {}
    for name, fn in (("dense", K.dense_head_ce), ("chunked", lambda *a: K.head_ce(*a, chunk_rows=c))):
        with _LargestTensor() as mode:
            fn(z, w2, base, labels).sum().backward()
        sizes[name] = mode.largest
    assert sizes["dense"] >= n * v * 4
    assert sizes["chunked"] <= c * v * 4, sizes
    assert sizes["chunked"] * (n // c) <= sizes["dense"], sizes


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA device")
class TestGPU(GPUKit):
    def test_head_ce_bf16(self):
        n, r, v = 512, 256, 151936
        z = (torch.randn(n, r, device="cuda") / 4).bfloat16().requires_grad_()
        w2 = (torch.randn(v, r, device="cuda") / 16).bfloat16().requires_grad_()
        base = torch.randn(n, v, device="cuda").bfloat16().requires_grad_()
        labels = torch.randint(0, v, (n,), device="cuda")
        outs = []
        for fn in (K.dense_head_ce, lambda *a: K.head_ce(*a, chunk_rows=128)):
            for t in (z, w2, base):
                t.grad = None
            loss = fn(z, w2, base, labels)
            loss.sum().backward()
            outs.append([loss.detach().float()] + [t.grad.float() for t in (z, w2, base)])
        for name, a, b in zip(("loss", "grad z", "grad W2", "grad base"), *outs):
            rel = ((a - b).norm() / b.norm()).item()
            assert rel < 1e-2, f"head_ce bf16 {name}: relative error {rel:.2e}"
