"""kernels/head/domino_rollout.py: make_rollout, KernelConfig, the CUDA-graph and fallback
bookkeeping, the candidate selection around the kernels, the recipe fields that choose them.

Tolerances and shapes: tests/kernels/head_kit.py (CPU: Triton's interpreter; GPU: -m gpu)."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.kernels.head_kit import (  # noqa: I001  (sets TRITON_INTERPRET before triton loads)
    K,
    needs_interpreter,
    Block,
    make_head,
    make_inputs,
    first_mismatches,
    assert_close,
    GPUKit,
    _CUDA,
)
from domino_graft.head import DominoHead, HeadSpec


def test_pool_candidates_two_stage_is_exact():
    x = torch.randn(3, 2, 1013)
    for method, chunks in (("topk2", 4), ("topk2", 7), ("sort", 1)):
        vals, ids = K.domino_rollout.pool_candidates(x, 40, method, chunks)
        ref = torch.topk(x, 40, dim=-1)
        assert torch.equal(ids.sort(-1).values, ref.indices.sort(-1).values)
        assert torch.equal(vals, x.gather(-1, ids))


@needs_interpreter
@pytest.mark.parametrize("select", ["topk", "bucket", "radix"])
@pytest.mark.parametrize("b,pure,streams", [(1, 1, 1), (3, 1, 2), (4, 2, 3), (2, 0, 2)])
def test_pool_select_per_slot_matches_batched(select, b, pure, streams):
    """KernelConfig.pool_select_overlap selects each corrected slot's candidates on its own (on a
    CPU inline; on CUDA on side streams: TestGPU). The per-slot pools are the batched pools, so the
    greedy drafts, and the sampled drafts with their q, are the batched path's and the reference's."""
    k, h, g, r, v = 5, 24, 20, 12, 1013
    head = make_head(h, g, r, v, pure=pure, w2_scale=8.0)
    emb, block, anchor = make_inputs(b, k, h, v)
    embed = K.reference.dense_embed(emb)
    batched = K.make_rollout("triton_pool", head, emb, pool_size=40, config=K.KernelConfig(pool_select=select))
    per_slot = K.make_rollout("triton_pool", head, emb, pool_size=40,
                              config=K.KernelConfig(pool_select=select, pool_select_overlap=streams))
    out, _ = per_slot(head, block, anchor, embed)
    want, _ = batched(head, block, anchor, embed)
    assert torch.equal(out, want), first_mismatches(out, want)
    ref, _ = K.reference_rollout(head, block, anchor, embed, pool_size=40, pool_select=select)
    assert torch.equal(out, ref), first_mismatches(out, ref)
    kw = dict(temperature=0.7, top_k=0, top_p=1.0)
    drawn, q = per_slot(head, block, anchor, embed, generator=torch.Generator().manual_seed(3), **kw)
    drawn_ref, q_ref = K.reference_rollout(head, block, anchor, embed, generator=torch.Generator().manual_seed(3),
                                           pool_size=40, pool_select=select, **kw)
    assert torch.equal(drawn, drawn_ref), first_mismatches(drawn, drawn_ref)
    assert_close(q, q_ref, what="per-slot pool q vs reference")


def test_pool_select_overlap_must_be_a_count():
    head = make_head(16, 20, 8, 97)
    with pytest.raises(ValueError, match="pool_select_overlap -1.*>= 0"):
        K.make_rollout("triton_pool", head, pool_size=8, config=K.KernelConfig(pool_select_overlap=-1))


def test_make_rollout_falls_back_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    K.domino_rollout._warned.clear()
    b, k, h, g, r, v = 2, 3, 16, 20, 8, 97
    head = make_head(h, g, r, v)
    emb, block, anchor = make_inputs(b, k, h, v)
    embed = K.reference.dense_embed(emb)
    roll = K.make_rollout("triton", head, emb)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out1, _ = roll(head, block, anchor, embed)
        out2, _ = roll(head, block, anchor, embed)
    said = [w for w in caught if "using the PyTorch path" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]  # said once
    ref, _ = K.reference_rollout(head, block, anchor, embed)
    assert torch.equal(out1, ref) and torch.equal(out2, ref)


def test_graph_rollout_in_place_bookkeeping(monkeypatch):
    """CudaGraphRollout's choice between copying and in-place graphs, without CUDA (captures faked):
    in place from the second call on the same buffers, never for sampling, and at most
    `max_in_place` address sets per shape, so moving buffers cannot recapture forever."""
    captured = []

    class FakeGraph:
        def __init__(self, in_place):
            self.in_place = in_place
            self.ids = torch.zeros(1, 2, dtype=torch.int64)
            self.q = None
            self.hidden, self.base, self.anchor = torch.zeros(1, 2, 4), torch.zeros(1, 2, 8), torch.zeros(1)
            self.uniforms = torch.zeros(1, 2)
            self.graph = type("G", (), {"replay": lambda _self: None})()

    def fake_capture(self, hidden, base, anchor, sampling, *args, in_place=False):
        captured.append(in_place)
        return FakeGraph(in_place)

    monkeypatch.setattr(K.CudaGraphRollout, "_capture", fake_capture)
    roll = K.CudaGraphRollout(body=None, max_in_place=2)
    blocks = [(Block(torch.zeros(1, 2, 4), torch.zeros(1, 2, 8)), torch.zeros(1)) for _ in range(4)]
    roll(*blocks[0])
    assert captured == [False] and roll.in_place_replays == 0  # first call: the copying graph
    roll(*blocks[0])
    roll(*blocks[0])
    assert captured == [False, True] and roll.in_place_replays == 2  # captured once, then replayed
    roll(*blocks[1])
    roll(*blocks[1])  # a second address set: its own in-place graph
    roll(*blocks[0])  # the first one is still known
    assert captured == [False, True, True] and roll.in_place_replays == 4
    for _ in range(3):  # a third set repeats, but the budget of two is spent: copies, no capture
        roll(*blocks[2])
    assert captured == [False, True, True] and roll.in_place_replays == 4
    roll(*blocks[3], temperature=1.0)
    roll(*blocks[3], temperature=1.0)  # sampling always copies (fresh uniforms every call)
    assert captured.count(True) == 2 and roll.in_place_replays == 4


def test_make_rollout_names():
    head = make_head(16, 20, 8, 97)
    assert K.make_rollout("torch", head) is K.reference_rollout  # the one eager reference, not built per head
    assert K.make_rollout("triton_pool", head, pool_size=64).pool_size == 64
    with pytest.raises(ValueError, match="torch, triton, triton_pool"):
        K.make_rollout("cuda", head)
    other = make_head(16, 20, 8, 97, seed=9)
    emb, block, anchor = make_inputs(1, 2, 16, 97)
    with pytest.raises(ValueError, match="another DominoHead"):
        K.make_rollout("triton", head, emb)(other, block, anchor, K.reference.dense_embed(emb))


def test_recipe_bench_head_kernel_fields():
    pytest.importorskip("pydantic")
    from domino_graft.recipe import Bench

    assert Bench().head_kernel == "torch" and Bench().pool_size == 2048
    assert Bench().pool_select == K.KernelConfig().pool_select  # the recipe default is the kernel default
    with pytest.raises(Exception):
        Bench(pool_select="sorted")
    assert Bench(pool_select="radix").pool_select == "radix"
    assert set(Bench.model_fields["pool_select"].annotation.__args__) <= set(K.reference.POOL_SELECTS)
    assert Bench(head_kernel="triton_pool", pool_size=0).pool_size == 0
    with pytest.raises(Exception):
        Bench(head_kernel="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA device")
class TestGPU(GPUKit):
    @pytest.mark.parametrize("name,pool", [("triton", 0), ("triton_pool", 256)])
    def test_graph_reads_repeated_buffers_in_place(self, name, pool):
        """A caller refilling the same buffers: from the second call on, the graph reads them in
        place. Every call's drafts still equal the reference on that call's contents, and other
        buffers fall back to the copying graph."""
        head, emb, block, anchor, embed = self._setup(3, 6, 256, 96, 64, 32000, torch.float32, w2_scale=2.0)
        roll = K.make_rollout(name, head, emb, pool_size=pool)
        gen = torch.Generator("cuda").manual_seed(5)
        for i in range(4):
            block.hidden.copy_(torch.randn(block.hidden.shape, generator=gen, device="cuda"))
            block.base_logits.copy_(torch.randn(block.base_logits.shape, generator=gen, device="cuda") * 3)
            anchor.copy_(torch.randint(0, 32000, anchor.shape, generator=gen, device="cuda"))
            out, _ = roll(head, block, anchor, embed)
            ref, _ = K.reference_rollout(head, block, anchor, embed, pool_size=pool)
            assert torch.equal(out, ref), f"call {i}: " + first_mismatches(out, ref)
        assert roll._graphs.in_place_replays == 3
        out, _ = roll(head, Block(block.hidden.clone(), block.base_logits.clone()), anchor.clone(), embed)
        assert torch.equal(out, ref), "copying graph: " + first_mismatches(out, ref)
        assert roll._graphs.in_place_replays == 3

    @pytest.mark.parametrize("streams,pure", [(1, 1), (2, 1), (4, 1), (2, 0)])
    @pytest.mark.parametrize("graphs", [False, True])
    def test_pool_select_overlap_matches_batched(self, streams, pure, graphs):
        """The selection and the W1a GEMM forked onto side streams (each slot's scoring waits on its
        own event, the first corrected step on the GEMM's): the batched path's tokens in fp32, eager
        and graphed, over replays with new inputs."""
        head, emb, _, _, embed = self._setup(3, 8, 256, 96, 64, 32000, torch.float32, pure=pure, w2_scale=2.0)
        batched = K.make_rollout("triton_pool", head, emb, pool_size=256, cuda_graphs=graphs)
        over = K.make_rollout("triton_pool", head, emb, pool_size=256, cuda_graphs=graphs,
                              config=K.KernelConfig(pool_select_overlap=streams))
        for seed in (1, 2, 3):
            _, block, anchor = make_inputs(3, 8, 256, 32000, device="cuda", seed=seed)
            want, _ = batched(head, block, anchor, embed)
            out, _ = over(head, block, anchor, embed)
            assert torch.equal(out, want), f"seed {seed}: " + first_mismatches(out, want)
        ref, _ = K.reference_rollout(head, block, anchor, embed, pool_size=256)
        assert torch.equal(out, ref), first_mismatches(out, ref)

    def test_pool_select_overlap_bf16_qwen3_8b(self):
        head, emb, block, anchor, embed = self._setup(1, 15, **self.QWEN, dtype=torch.bfloat16)
        want, _ = K.make_rollout("triton_pool", head, emb, pool_size=2048)(head, block, anchor, embed)
        out, _ = K.make_rollout("triton_pool", head, emb, pool_size=2048,
                                config=K.KernelConfig(pool_select_overlap=2))(head, block, anchor, embed)
        # the same kernels; the pools match but for bf16 ties at the 2048th base logit, which a
        # batched and a per-row torch.topk may break differently (a tied candidate rarely wins)
        agree = (out == want).float().mean().item()
        print(f"bf16 overlapped vs batched selection: agreement {agree:.3f}")
        assert agree >= 0.9


@needs_interpreter
@pytest.mark.parametrize("name", ["triton", "triton_pool"])
def test_sampled_slots_through_sample_rows(monkeypatch, name):
    """SAMPLE_ROWS on: each sampled slot is drawn by kernels/head/sample_rows.py, with the torch draw's
    rule: for this seed no draw sits on a rounding boundary, so the drafts and their q are the torch
    draw's exactly (a later slot's q follows the drafts before it), and every draft has q > 0."""
    from domino_graft.kernels.head import sample_rows as kernel

    monkeypatch.setattr(K.domino_rollout, "SAMPLE_LOGITS", False)  # every slot through _sample's draw
    calls = []
    real = kernel.sample_rows
    monkeypatch.setattr(kernel, "sample_rows", lambda p, u, **kw: calls.append(p.shape) or real(p, u, **kw))
    k, h, g, r, v = 5, 24, 20, 12, 1013
    head = make_head(h, g, r, v, pure=1, w2_scale=8.0)
    emb, block, anchor = make_inputs(3, k, h, v)
    embed = K.reference.dense_embed(emb)
    roll = K.make_rollout(name, head, emb, **({"pool_size": 40} if name == "triton_pool" else {}))
    kw = dict(temperature=0.7, top_k=0, top_p=1.0)
    torch_draw, q_torch = roll(head, block, anchor, embed, generator=torch.Generator().manual_seed(3), **kw)
    monkeypatch.setattr(K.domino_rollout, "SAMPLE_ROWS", True)
    drawn, q = roll(head, block, anchor, embed, generator=torch.Generator().manual_seed(3), **kw)
    assert len(calls) == k  # every slot drew through the kernel
    assert torch.equal(drawn, torch_draw), first_mismatches(drawn, torch_draw)
    assert torch.equal(q, q_torch)
    assert (q.gather(-1, drawn[..., None]) > 0).all()


@needs_interpreter
def test_sampled_slots_through_sample_logits(monkeypatch):
    """SAMPLE_LOGITS on (the default): each full-vocabulary slot of a temperature-only warp is one `sample_logits` (q and
    draw in two launches): for this seed no draw sits on a rounding boundary, so the drafts are the torch
    path's and their q equal to it up to rounding (a later slot's q follows the drafts before it), every
    draft has q > 0; with top-k on the slots keep the torch warp."""
    from domino_graft.kernels.head import sample_logits as kernel

    calls = []
    real = kernel.sample_logits
    monkeypatch.setattr(kernel, "sample_logits", lambda x, *a, **kw: calls.append(x.shape) or real(x, *a, **kw))
    k, h, g, r, v = 5, 24, 20, 12, 1013
    head = make_head(h, g, r, v, pure=1, w2_scale=8.0)
    emb, block, anchor = make_inputs(3, k, h, v)
    embed = K.reference.dense_embed(emb)
    roll = K.make_rollout("triton", head, emb)
    kw = dict(temperature=0.7, top_k=0, top_p=1.0)
    monkeypatch.setattr(K.domino_rollout, "SAMPLE_LOGITS", False)
    torch_draw, q_torch = roll(head, block, anchor, embed, generator=torch.Generator().manual_seed(3), **kw)
    assert not calls
    monkeypatch.setattr(K.domino_rollout, "SAMPLE_LOGITS", True)
    drawn, q = roll(head, block, anchor, embed, generator=torch.Generator().manual_seed(3), **kw)
    assert len(calls) == k  # every slot, the pure one too
    assert torch.equal(drawn, torch_draw), first_mismatches(drawn, torch_draw)
    torch.testing.assert_close(q, q_torch, rtol=1e-5, atol=1e-7)
    assert (q.gather(-1, drawn[..., None]) > 0).all()
    calls.clear()
    roll(head, block, anchor, embed, generator=torch.Generator().manual_seed(3), **{**kw, "top_k": 50})
    assert not calls
