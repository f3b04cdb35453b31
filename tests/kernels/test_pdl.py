"""kernels/engine/pdl.py: programmatic dependent launch for the engine's kernel chains.

CPU (default): the handshake is off wherever it cannot run (CPU tensors, the interpreter) and the
launch keyword is only given when asked. GPU (`-m gpu`): the fast engine's layer chain (norm,
projections with split-K reductions, norm + RoPE + cache write, attention) gives the same bits with
PDL on and off, eagerly and replayed from a CUDA graph.
"""

from __future__ import annotations

import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from domino_graft.kernels.engine import pdl  # noqa: E402


def test_off_on_cpu_and_launch_keyword_only_when_asked():
    assert pdl.use_pdl(torch.zeros(1)) is False
    assert pdl.launch_options(False) == {}
    assert pdl.launch_options(True) == {"launch_pdl": True}


def test_switched_off_by_the_module_flag(monkeypatch):
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert pdl.use_pdl(torch.zeros(1, device="cuda" if _CUDA else "cpu")) is False


def _layer_chain(x, w, kc, vc, pos):
    """One decoder sub-block through the engine's kernels: norm, q/k/v, RoPE + cache + attention,
    o with the residual, norm, gate/up, down with the residual (split-K reductions included)."""
    from domino_graft.kernels.engine.decode_attention import rope_attention
    from domino_graft.kernels.engine.row_norm import rms_norm_rows
    from domino_graft.kernels.engine.small_linear import Config, small_linear, small_linear_swiglu

    qkv = small_linear(rms_norm_rows(x, w["n1"], 1e-6), w["qkv"], config=Config(BLOCK_N=64, SPLIT=4))
    o = rope_attention(qkv, kc, vc, pos, w["inv_freq"], 1.0, None, None, 1e-6, 8, 2, 64, splits=2)
    x = small_linear(o, w["o"], residual=x, config=Config(BLOCK_N=64, SPLIT=2))
    h = small_linear_swiglu(rms_norm_rows(x, w["n2"], 1e-6), w["gu"], config=Config(BLOCK_N=64, SPLIT=1))
    return small_linear(h, w["d"], residual=x, config=Config(BLOCK_N=64, SPLIT=4))


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 16])
def test_gpu_same_bits_with_and_without_pdl_eager_and_graphed(monkeypatch, rows):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90+")
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, scale=0.05):
        return (scale * torch.randn(*shape, generator=gen, device=dev)).to(dt)

    hid, inter = 512, 1024
    w = {"n1": 1 + rand(hid), "n2": 1 + rand(hid), "qkv": rand((8 + 4) * 64, hid), "o": rand(hid, 8 * 64),
         "gu": rand(2 * inter, hid), "d": rand(hid, inter),
         "inv_freq": 1.0 / (10000 ** (torch.arange(0, 64, 2, device=dev).float() / 64))}
    x = rand(1, rows, hid, scale=1.0)
    pos = torch.tensor([700], device=dev)
    k0, v0 = torch.zeros(2, 1, 2, 1024, 64, device=dev, dtype=dt)
    k0[:, :, :700] = rand(1, 2, 700, 64, scale=1.0)
    v0[:, :, :700] = rand(1, 2, 700, 64, scale=1.0)
    outs = {}
    for on in (False, True):
        monkeypatch.setattr(pdl, "ENABLED", on)
        kc, vc = k0.clone(), v0.clone()  # the same cache for both (45d49fd drew a new one per mode: that failed)
        eager = _layer_chain(x, w, kc, vc, pos)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            _layer_chain(x, w, kc, vc, pos)  # compile outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graphed = _layer_chain(x, w, kc, vc, pos)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(graphed, eager)
        outs[on] = eager
    assert torch.equal(outs[True], outs[False])
