"""CUDA-graph capture and replay (opt-in: -m gpu): the graphed target steps and the graphed DFlash
propose equal their eager selves, through rollbacks that follow full acceptances; and the engine's
GPU default (kv=auto: static cache, compiled forward, graphs) decodes greedily exactly like the
target alone."""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _graft(seed: int = 0):
    from tests.decoding.test_static_kv import graft

    target, adapter, head = graft("dflash", "qwen3", seed=seed)
    for module in (target.model, adapter, head):  # the device properties follow the weights
        module.to("cuda")
    assert target.device.type == "cuda"
    return target, adapter, head


def test_graph_runner_replay_with_rollback_equals_eager():
    from domino_graft.fast import FastLM, GraphRunner

    target, _, _ = _graft()
    lm = FastLM.from_hf(target.model, max_len=1024)
    graphed, eager = GraphRunner(lm, capture=(0, -1)), GraphRunner(lm, capture=(0, -1), use_graphs=False)
    ids = torch.randint(0, target.shape.vocab_size, (1, 700), device="cuda")
    rng = random.Random(0)
    pos, k = 230, 7  # 40 blocks from here cross the 256 attention bucket
    lm.forward(ids[:, :pos], 0, use_compiled=False)
    accepts = [k, 0, k, k, 2, k, 0]  # rejections right after full acceptances
    for step in range(40):
        seq = ids[:, pos:pos + k + 1]
        g_logits, g_hidden = graphed(seq, pos)
        g_logits, g_hidden = g_logits.clone(), {i: h.clone() for i, h in g_hidden.items()}
        e_logits, e_hidden = eager(seq, pos)
        torch.testing.assert_close(g_logits, e_logits, atol=1e-4, rtol=1e-4)
        for i in e_hidden:
            torch.testing.assert_close(g_hidden[i], e_hidden[i], atol=1e-4, rtol=1e-4)
        a = accepts[step % len(accepts)] if step < len(accepts) else rng.randrange(k + 1)
        pos += a + 1
        lm.cache.set_lengths(pos)
    assert graphed.captures >= 2  # crossed a kv bucket: one graph per bucket, replayed


def test_pooled_prefill_graphs_equal_eager_and_leave_a_step_graphs_outputs():
    """The prefills' graphs (`pooled`: decoding/session.py copies their outputs out at once) share one memory pool,
    replayed in turns unlike their capture order: each equals the eager forward, and a step graph's outputs, held
    across them in a pool of its own, are untouched."""
    from domino_graft.fast import FastLM, GraphRunner

    target, _, _ = _graft(3)
    vocab = target.shape.vocab_size
    lm = FastLM.from_hf(target.model, max_batch=4, max_len=512)
    graphed, eager = GraphRunner(lm, capture=(0, -1)), GraphRunner(lm, capture=(0, -1), use_graphs=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    step_logits, _ = graphed(torch.randint(0, vocab, (4, 1), device="cuda", generator=g), 300)
    held = step_logits.clone()
    shapes = [(4, 128), (1, 16), (2, 64), (4, 32), (1, 128)]
    for turn in range(2):
        for b, t in shapes[::-1] if turn else shapes:
            ids = torch.randint(0, vocab, (b, t), device="cuda", generator=g)
            _, hidden = graphed(ids, 0, logits_to_keep=1, pooled=True)
            got = {i: h.clone() for i, h in hidden.items()}
            _, want = eager(ids, 0, logits_to_keep=1)
            for i in want:
                torch.testing.assert_close(got[i], want[i], atol=1e-4, rtol=1e-4, msg=f"turn {turn} {b}x{t} layer {i}")
    assert torch.equal(step_logits, held)
    assert graphed._pool is not None and graphed.captures == 1 + len(shapes)


def test_static_dflash_propose_graph_equals_eager():
    target, adapter, _ = _graft(1)
    f = adapter.cfg.hidden_size * len(adapter.cfg.target_layer_ids)
    k = adapter.num_slots
    with torch.inference_mode():
        graphed = adapter.static_drafter(1024)
        from domino_graft.adapters.dflash.fast import StaticDFlashDrafter

        eager = StaticDFlashDrafter(adapter, graphed.max_len)
        eager.use_graphs = False
        g = torch.Generator(device="cuda").manual_seed(0)
        n = 250
        feats = torch.randn(1, n, f, device="cuda", generator=g)
        graphed.prefill(feats, n)
        eager.prefill(feats, n)
        pos = n
        for step in range(30):
            anchor = torch.randint(0, target.shape.vocab_size, (1,), device="cuda", generator=g)
            a_blk, b_blk = graphed.propose(anchor, pos), eager.propose(anchor, pos)
            torch.testing.assert_close(a_blk.base_logits, b_blk.base_logits, atol=1e-4, rtol=1e-4)
            verified = torch.randn(1, k + 1, f, device="cuda", generator=g)
            graphed.observe_block(verified, pos)
            eager.observe_block(verified, pos)
            pos += [k, 0, k, 1][step % 4] + 1
        assert len(graphed._calls) >= 2 and all(c.graph is not None for c in graphed._calls.values())


def test_static_dflash_prefill_graphs_in_one_pool_equal_the_exact_shapes():
    """The drafter's prefills and admissions as graphs of padded shapes (adapters/dflash/fast.py `_prefill_write`),
    all reading views of one input buffer and sharing one memory pool, replayed in an order unlike their capture
    (the largest first, then a reallocation): every row's context equals the eager exact shapes'."""
    from domino_graft.adapters.dflash.fast import StaticDFlashDrafter
    from tests.decoding.test_batched_static_drafter import assert_same_contexts, prefill_and_admit

    _, adapter, _ = _graft(2)
    f = adapter.cfg.hidden_size * len(adapter.cfg.target_layer_ids)
    g = torch.Generator(device="cuda").manual_seed(0)
    graphed, exact = StaticDFlashDrafter(adapter, 256, max_batch=4), StaticDFlashDrafter(adapter, 256, max_batch=4)
    exact.use_graphs = exact.pad_prefills = False
    assert graphed.pad_prefills
    lens = [30, 9, 60, 17]
    with torch.inference_mode():
        assert graphed.visit_admissions([20, 60]) == 6  # widths 1, 2, 4 at 32 and 64, the largest first
        for step in range(3):
            feats = torch.randn(4, max(lens), f, device="cuda", generator=g)
            # the last admission's 2 × 128 fits the buffer the visit sized (4 × 64); the next batch's 4 × 128 does not
            admissions = [([1], [12]), ([3, 0, 2], [40, 5, 33]), ([2, 1], [100, 3])]
            prefill_and_admit((graphed, exact), feats, lens, admissions,
                              lambda *shape: torch.randn(*shape, device="cuda", generator=g))
            assert_same_contexts(graphed, exact, lens, 1e-4, f"step {step} ")
    calls = [c for key, c in graphed._calls.items() if key[0] in ("prefill", "admit")]
    assert calls and all(c.graph is not None and c.pool is graphed._prefill_pool for c in calls)
    assert graphed._prefill_buffer.numel() == 4 * 128 * f


def test_engine_gpu_default_greedy_equals_target_alone():
    from domino_graft.decoding import Engine
    from tests.decoding.test_decoding import Oracle

    target, adapter, head = _graft(2)
    engine = Engine(target, adapter, head)  # kv="auto": static on CUDA
    assert engine.kv_path == "static"
    prompt = [3, 4, 5, 9, 11]
    ref = engine.target_only(prompt, max_new_tokens=48)
    reference = prompt + ref.tokens
    for hit in (0.0, 0.8, 1.0):
        engine.adapter = Oracle(adapter, reference, hit, seed=int(hit * 10), vocab=target.shape.vocab_size)
        for use_head in (False, True):
            out = engine.speculative(prompt, max_new_tokens=48, use_head=use_head)
            assert out.kv_path == "static"
            assert out.tokens == ref.tokens, f"hit {hit} head {use_head}: speculative != target alone"
    engine.adapter = adapter
