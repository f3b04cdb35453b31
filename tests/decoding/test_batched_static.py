"""Batched decoding on the fast engine's static cache (decoding/session.py `StaticSession`): the path
batched.py takes wherever the target's architecture supports it. CPU, fp32, eager (the graph
runner's CPU path).

- every row of a batched greedy decode equals its solo decode token for token (and its per-step
  acceptance counts), over random llama/qwen3 models, ragged prompt sets and early stops, with
  the static path asserted taken; the same batch on the DynamicCache fallback agrees;
- the padding and stale entries past each row's position are invisible: garbage written into
  every cache slot a row has not verified changes nothing;
- the prefill gives each row its own last logits and the features of its own prompt;
- the fallback (kv="dynamic") still passes the batched chi-square test, and its wrong-q control
  still fails (the default path runs test_batched_sampling.py itself).
"""

from __future__ import annotations

import random

import pytest
import torch

from domino_graft.decoding import Engine, Sampling, stop_token_ids
from domino_graft.decoding.batched import batched_chain, batched_target_only, ragged_target
from domino_graft.decoding.session import DynamicSession, StaticSession
from tests.decoding.test_batched import RowOracle, variant
from tests.decoding.test_decoding import build


def ragged_case(seed: int):
    cfg = variant(100 + seed)
    target, adapter, head = build(seed, **cfg)
    rng = random.Random(seed)
    b = rng.randint(3, 7)
    prompts = [[rng.randrange(2, cfg["vocab"] - 1) for _ in range(rng.randint(1, 18))] for _ in range(b)]
    return cfg, target, adapter, head, prompts, rng


@pytest.mark.parametrize("seed", range(6))
def test_static_batched_greedy_equals_solo(seed):
    cfg, target, adapter, head, prompts, rng = ragged_case(seed)
    budget = rng.choice([12, 20])
    engine = Engine(target, adapter, head, stop_ids=stop_token_ids(target))
    refs = [engine.target_only(p, max_new_tokens=budget) for p in prompts]
    early = [t for r in refs for t in r.tokens[1: budget // 2]]
    extra = [rng.choice(early)] if early else []  # a stop token some row emits early
    refs = [engine.target_only(p, max_new_tokens=budget, stop_ids=extra) for p in prompts]
    want = [r.tokens for r in refs]
    where = f"seed {seed} {cfg} K={adapter.num_slots} prompts {prompts} stop {extra}"

    got = engine.target_only_batch(prompts, max_new_tokens=budget, stop_ids=extra)
    assert {r.kv_path for r in got} == {"static"}, where
    assert isinstance(engine._ragged_static, StaticSession)
    assert [r.tokens for r in got] == want, where
    assert [r.target_forwards for r in got] == [r.target_forwards for r in refs], where
    for use_head in (True, False):
        got = engine.speculative_batch(prompts, max_new_tokens=budget, stop_ids=extra, use_head=use_head)
        assert {r.kv_path for r in got} == {"static"}, where
        assert [r.tokens for r in got] == want, f"{where} use_head={use_head}"
        assert [r.stop_reason for r in got] == [r.stop_reason for r in refs], where

    # ragged acceptance (rows accept different counts at every step), rejections right after
    # full acceptances: every row's acceptance equals its solo decode's, on both caches
    full = [p + r.tokens for p, r in zip(prompts, refs)]
    oracle = Engine(target, RowOracle(adapter, full, list(range(len(prompts))), 0.7, seed, cfg["vocab"]), head,
                    stop_ids=stop_token_ids(target))
    static = oracle.speculative_batch(prompts, max_new_tokens=budget, stop_ids=extra)
    dynamic = batched_chain(oracle, prompts, max_new_tokens=budget, stop_ids=extra, kv="dynamic")
    assert {r.kv_path for r in static} == {"static"} and {r.kv_path for r in dynamic} == {"dynamic"}
    assert [r.tokens for r in static] == [r.tokens for r in dynamic] == want, where
    for r, p in enumerate(prompts):
        solo = Engine(target, RowOracle(adapter, [full[r]], [r], 0.7, seed, cfg["vocab"]), head,
                      stop_ids=stop_token_ids(target)).speculative(p, max_new_tokens=budget, stop_ids=extra)
        assert static[r].accepted == dynamic[r].accepted == solo.accepted, f"{where} row {r}"
        assert static[r].target_forwards == solo.target_forwards


def test_harness_reaches_ragged_static_cases():
    """The cases above must hold rows of different lengths, rows accepting different counts in one
    step, a full acceptance followed by a rejection, and a row finishing while others go on."""
    seen = {"ragged": 0, "differ": 0, "full_then_reject": 0, "early": 0}
    for seed in range(6):
        cfg, target, adapter, head, prompts, rng = ragged_case(seed)
        k = adapter.num_slots
        engine = Engine(target, adapter, head, stop_ids=stop_token_ids(target))
        refs = [engine.target_only(p, max_new_tokens=20).tokens for p in prompts]
        full = [p + r for p, r in zip(prompts, refs)]
        got = Engine(target, RowOracle(adapter, full, list(range(len(prompts))), 0.7, seed, cfg["vocab"]),
                     head).speculative_batch(prompts, max_new_tokens=20, stop_ids=[refs[0][2]])
        seen["ragged"] += len({len(p) for p in prompts}) > 1
        steps = min(len(r.accepted) for r in got)
        seen["differ"] += any(len({r.accepted[s] for r in got}) > 1 for s in range(steps))
        seen["full_then_reject"] += any(a == k and b < k for r in got for a, b in zip(r.accepted, r.accepted[1:]))
        seen["early"] += len({len(r.tokens) for r in got}) > 1
    assert all(seen.values()), seen


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_stale_cache_entries_are_invisible(arch):
    """Padding K/V (written at positions >= a row's prompt length by the right-padded prefill),
    rejected drafts and a finished row's repeated writes all sit at positions >= the row's next
    position: each step overwrites those its queries can see before attending, the mask hides
    the rest. Fill every slot no row has verified with huge garbage before each step: nothing
    changes."""
    target, adapter, head = build(4, arch=arch, vocab=61, block_size=4)
    prompts = [[5, 9, 13, 4, 22, 7, 31, 8, 9, 10, 11, 3], [7], [3, 14, 15]]
    engine = Engine(target, adapter, head)
    want = [engine.target_only(p, max_new_tokens=16).tokens for p in prompts]
    clean = engine.speculative_batch(prompts, max_new_tokens=16)
    assert [r.tokens for r in clean] == want

    static = engine._ragged_static
    g = torch.Generator().manual_seed(0)
    real_step = static.step
    steps = []

    def poisoned_step(seq, pos, capture, host_pos):
        cache = static.lm.cache
        for t in (*cache.k, *cache.v):
            for b, p in enumerate(host_pos):
                t[b, :, p:] = torch.randn(t[b, :, p:].shape, generator=g) * 1e3
        steps.append(list(host_pos))
        return real_step(seq, pos, capture, host_pos)

    static.step = poisoned_step
    try:
        got = engine.speculative_batch(prompts, max_new_tokens=16)
        alone = engine.target_only_batch(prompts, max_new_tokens=16)
    finally:
        del static.step
    assert engine._ragged_static is static and len(steps) > 3
    assert [r.tokens for r in got] == [r.tokens for r in alone] == want
    assert [r.accepted for r in got] == [r.accepted for r in clean]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_prefill_rows_equal_solo_prefill(arch):
    target, adapter, _ = build(5, arch=arch, vocab=61, layers=3)
    capture = tuple(adapter.capture_layers())
    prompts = [torch.tensor(p) for p in ([3, 9, 4, 17, 5, 6, 8], [11], [20, 2, 44, 6])]
    with torch.inference_mode():
        for cap in (capture, (0, -1), ()):
            static, why = StaticSession.create(target, len(prompts), 32)
            assert static is not None, why
            last, feats, ids, pos = static.prefill(prompts, cap)
            for b, p in enumerate(prompts):
                n = p.numel()
                ref_logits, ref_feats = target(p[None], capture=cap)
                torch.testing.assert_close(last[b], ref_logits[0, -1], atol=1e-4, rtol=0)
                assert pos[b].tolist() == list(range(n)) + [-1] * (ids.shape[1] - n)
                assert ids[b, :n].tolist() == p.tolist()
                if cap:
                    torch.testing.assert_close(feats[b, :n], ref_feats[0], atol=1e-4, rtol=0)
                else:
                    assert feats is None


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_split_forward_batches_equal_solo(arch):
    """The forward CUDA runs (FastLM.use_kernels: the layer split around the attention kernels,
    which read each row's position on the device), here with the kernels' torch math: ragged
    prefill, per-row steps, ragged acceptance."""
    target, adapter, head = build(8, arch=arch, vocab=61, block_size=5)
    prompts = [[5, 9, 13, 4, 22, 7, 31], [7], [3, 14, 15, 9]]
    engine = Engine(target, adapter, head)
    want = [engine.target_only(p, max_new_tokens=20).tokens for p in prompts]
    full = [p + w for p, w in zip(prompts, want)]
    oracle = Engine(target, RowOracle(adapter, full, [0, 1, 2], 0.7, 8, 61), head)
    oracle.target_only_batch(prompts, max_new_tokens=20)
    oracle._ragged_static.lm.use_kernels("reference")
    assert [r.tokens for r in oracle.target_only_batch(prompts, max_new_tokens=20)] == want
    got = oracle.speculative_batch(prompts, max_new_tokens=20)
    assert oracle._ragged_static.lm.kernels == "reference" and [r.tokens for r in got] == want
    assert len({a for r in got for a in r.accepted}) > 1


def test_static_target_is_reused_and_grown():
    target, adapter, head = build(6, vocab=61)
    engine = Engine(target, adapter, head)
    prompts = [[3, 4, 5], [6], [7, 8, 9, 10]]
    engine.speculative_batch(prompts, max_new_tokens=8)
    first = engine._ragged_static
    engine.speculative_batch(prompts[:2], max_new_tokens=8)
    assert engine._ragged_static is first  # a smaller batch reuses the cache (and its graphs on CUDA)
    more = prompts * 3
    got = engine.speculative_batch(more, max_new_tokens=8)
    assert engine._ragged_static is not first and engine._ragged_static.lm.max_batch >= len(more)
    assert [r.tokens for r in got] == [engine.target_only(p, max_new_tokens=8).tokens for p in more]


def test_fallbacks_to_the_dynamic_cache():
    target, adapter, head = build(7, vocab=61)
    engine = Engine(target, adapter, head)
    assert isinstance(ragged_target(engine, [torch.tensor([3])], 8, kv="dynamic"), DynamicSession)
    got = batched_target_only(engine, [[3, 4], [5]], max_new_tokens=6, kv="dynamic")
    assert {r.kv_path for r in got} == {"dynamic"}
    with pytest.raises(ValueError, match="kv"):
        batched_target_only(engine, [[3, 4]], max_new_tokens=6, kv="paged")
    gemma, g_adapter, g_head = build(2, arch="gemma3")
    gemma.model.config.final_logit_softcapping = 30.0  # the fast engine refuses it: the DynamicCache path
    g_engine = Engine(gemma, g_adapter, g_head)
    with pytest.raises(ValueError, match=r"sliding-window targets"):  # the static path said no, then this
        g_engine.speculative_batch([[3, 4], [5]], max_new_tokens=4)
    assert "softcapping" in g_engine.batch_kv_note


def test_dynamic_fallback_batched_sampling_matches_target_distribution():
    """test_batched_sampling.py's chi-square test on the DynamicCache fallback (the default path,
    now the static cache, runs that file itself), with its wrong-q control."""
    from tests.decoding.test_batched_sampling import PROMPTS, exact_tables, peaked, row_pvalues, wrong_q
    from tests.decoding.test_sampling import ALPHA

    target, adapter, head = peaked(0)
    warp_ = dict(temperature=1.0, top_k=0, top_p=1.0)
    sampling = Sampling(seed=0, **warp_)
    with torch.inference_mode():
        joints = []
        for prompt in PROMPTS:
            p1, p2, p3 = exact_tables(target, torch.tensor([prompt]), 8, warp_)
            joints.append(p1[:, None, None] * p2[:, :, None] * p3)
    batch = [PROMPTS[i % len(PROMPTS)] for i in range(len(PROMPTS) * 3000)]
    engine = Engine(target, adapter, head)
    assert engine.speculative_batch(batch[:3], max_new_tokens=3, sampling=sampling)[0].kv_path == "static"
    right = batched_chain(engine, batch, max_new_tokens=3, sampling=sampling, kv="dynamic")
    assert {r.kv_path for r in right} == {"dynamic"}
    engine.rollout = wrong_q
    wrong = batched_chain(engine, batch, max_new_tokens=3, sampling=sampling, kv="dynamic")
    p_right, p_wrong = row_pvalues(right, joints), row_pvalues(wrong, joints)
    assert min(p_right) > ALPHA, p_right
    assert max(p_wrong) < ALPHA, p_wrong


# ----------------------------------------------------------------------------- GPU (opt-in: -m gpu)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("head_dim", [8, 16])  # 8: the compiled per-layer math; 16: the Triton kernels
def test_gpu_batched_graphs_equal_solo(head_dim):
    """On CUDA the batched steps replay graphs (one per batch size, step length and attention
    bucket; compiled math, additive mask) and every row still equals its solo decode, through
    ragged acceptance and rejections right after full acceptances; a smaller batch replays on the
    same cache with graphs of its own size."""
    from tests.decoding.test_static_kv import graft

    target, adapter, head = graft("dflash", "qwen3", seed=2, extra=(f"target.random.head_dim={head_dim}",))
    for module in (target.model, adapter, head):
        module.to("cuda")
    engine = Engine(target, adapter, head, stop_ids=stop_token_ids(target))  # the static batch drafter too
    rng = random.Random(0)
    prompts = [[rng.randrange(2, 90) for _ in range(n)] for n in (5, 1, 17, 9)]
    refs = [engine.target_only(p, max_new_tokens=40) for p in prompts]
    assert {r.kv_path for r in refs} == {"static"}
    want = [r.tokens for r in refs]
    full = [p + r for p, r in zip(prompts, want)]
    oracle = Engine(target, RowOracle(adapter, full, [0, 1, 2, 3], 0.8, 0, target.shape.vocab_size), head,
                    stop_ids=stop_token_ids(target))
    for eng in (engine, oracle):
        got = eng.target_only_batch(prompts, max_new_tokens=40)
        assert [r.tokens for r in got] == want and {r.kv_path for r in got} == {"static"}
        for use_head in (False, True):
            got = eng.speculative_batch(prompts, max_new_tokens=40, use_head=use_head)
            assert [r.tokens for r in got] == want, f"use_head={use_head}"
    k = adapter.num_slots
    assert any(a == k and b < k for r in got for a, b in zip(r.accepted, r.accepted[1:]))
    static = oracle._ragged_static  # one cache served the target-alone and the chain batches
    keys = {key for runner in static.runners.values() for key in runner.graphs}
    assert {(4, 1), (4, k + 1)} <= {key[:2] for key in keys}, keys
    captures = sum(runner.captures for runner in static.runners.values())
    assert [r.tokens for r in oracle.speculative_batch(prompts, max_new_tokens=40)] == want
    assert sum(runner.captures for runner in static.runners.values()) == captures  # replayed, not recaptured
    got = oracle.speculative_batch(prompts[:2], max_new_tokens=40)
    assert oracle._ragged_static is static and [r.tokens for r in got] == want[:2]
    assert (2, k + 1) in {key[:2] for runner in static.runners.values() for key in runner.graphs}


def test_shrink_keeps_the_live_rows_and_pads_to_a_power_of_two():
    from domino_graft.decoding.batched import _shrink

    assert _shrink([True, False, True, False, False, False, False, False]) == [0, 2]
    assert _shrink([False, True, True, True, False, False, False, False]) == [1, 2, 3, 0]  # 3 -> 4 rows
    assert _shrink([True, True, True, False, False]) == [0, 1, 2, 3]  # 5 -> 4
    assert _shrink([True, True, False, False]) == [0, 1]  # half the rows ended
    assert _shrink([True, True, True, False]) is None  # 3 rows still take a batch of 4
    assert _shrink([False, False]) is None  # nothing goes on: the decode ends


@pytest.mark.parametrize("seed", range(3))
def test_a_batch_shrinks_as_its_rows_end_and_every_row_is_still_its_solo_decode(seed, monkeypatch):
    """Rows that end early leave the batch (batched.py `_shrink`; the chain's with shrink=True): the target's
    session and the static drafter compact to the rows that go on, and each row's output stays its solo
    decode's."""
    cfg, target, adapter, head, prompts, rng = ragged_case(seed)
    prompts = prompts + [[5] * (3 + i) for i in range(6 - len(prompts))] if len(prompts) < 6 else prompts
    stops = stop_token_ids(target)
    engine = Engine(target, adapter, head, stop_ids=stops)
    lengths = [4, 4, 4, 16, 16, 16][: len(prompts)]  # most rows end early
    refs = [engine.target_only(p, max_new_tokens=n).tokens for p, n in zip(prompts, lengths)]
    sizes = {"session": [], "drafter": []}
    real_session, real_drafter = StaticSession.compact, type(adapter.static_batch_drafter(64, 1)).compact
    monkeypatch.setattr(StaticSession, "compact", lambda self, rows: sizes["session"].append(len(rows))
                        or real_session(self, rows))
    monkeypatch.setattr(type(adapter.static_batch_drafter(64, 1)), "compact",
                        lambda self, rows: sizes["drafter"].append(len(rows)) or real_drafter(self, rows))
    # one call per row length: a batch whose rows have different max_new_tokens is a batch of batches,
    # so the early rows end by a stop token instead (each row's own 4th token)
    stop_at = {refs[r][3] for r in range(3)}
    want = [engine.target_only(p, max_new_tokens=16, stop_ids=stop_at).tokens for p in prompts]
    got = engine.speculative_batch(prompts, max_new_tokens=16, stop_ids=stop_at, shrink=True)
    assert [r.tokens for r in got] == want, (seed, cfg)
    alone = engine.target_only_batch(prompts, max_new_tokens=16, stop_ids=stop_at)
    assert [r.tokens for r in alone] == want
    if len({len(w) for w in want}) > 1:  # rows ended at different steps: the batch shrank
        assert sizes["session"] and sizes["drafter"], sizes
        assert all(s & (s - 1) == 0 for s in sizes["session"] + sizes["drafter"]), sizes
