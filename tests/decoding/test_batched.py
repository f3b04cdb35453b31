"""Batched greedy chain decoding (decoding/batched.py): every row of a ragged batch equals its
own solo decode, token for token, including rows that stop early.

`RowOracle` nudges the real drafter toward each row's known continuation, so rows accept
different numbers of drafts at every step (the ragged cache and context paths). Whether slot j
of row r is hit depends only on (seed, r, the slot's position): a solo decode of row r and the
batch see the same drafts, so even the per-step acceptance counts must agree.
"""

from __future__ import annotations

import random

import pytest
import torch

from domino_graft.adapters.base import DraftBlock
from domino_graft.decoding import Engine, Sampling, stop_token_ids
from tests.decoding.test_decoding import build


class RowOracle:
    def __init__(self, inner, references: list[list[int]], rows: list[int], hit: float, seed: int, vocab: int):
        self.inner, self.references, self.rows = inner, references, rows
        self.hit, self.seed, self.vocab = hit, seed, vocab

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, anchor, position):
        block = self.inner.propose(anchor, position)
        starts = position.tolist() if torch.is_tensor(position) else [int(position)] * block.base_logits.shape[0]
        return self.nudge(block, starts)

    def nudge(self, block, starts: list[int]):
        """The block with each row's slots nudged toward (or away from) its reference after `starts[b]`."""
        base = block.base_logits.clone()
        for b, (row, ref, start) in enumerate(zip(self.rows, self.references, starts)):
            for j in range(base.shape[1]):
                at = start + 1 + j
                if at >= len(ref):
                    continue
                rng = random.Random(hash((self.seed, row, at)))
                if rng.random() < self.hit:
                    base[b, j, ref[at]] += 30.0
                else:
                    base[b, j, (ref[at] + 1 + rng.randrange(5)) % (self.vocab - 1)] += 30.0
        return DraftBlock(block.hidden, base)


def variant(seed: int) -> dict:
    rng = random.Random(2000 + seed)
    cfg = dict(arch=rng.choice(["qwen3", "llama"]), vocab=rng.choice([37, 61, 97]), tie=rng.random() < 0.25,
                layers=rng.choice([2, 3]), block_size=rng.choice([2, 3, 4, 6, 8]), shift=rng.random() < 0.5,
                draft_layers=rng.choice([1, 2]))
    cfg["ppl"] = rng.choice([0, 1]) if cfg["block_size"] > 2 else 0  # K = 1 leaves no slot after a pure one
    return cfg


@pytest.mark.parametrize("seed", range(12))
def test_batched_greedy_equals_solo(seed):
    cfg = variant(seed)
    target, adapter, head = build(seed, **cfg)
    rng = random.Random(seed)
    b = rng.randint(2, 6)
    prompts = [[rng.randrange(2, cfg["vocab"] - 1) for _ in range(rng.randint(1, 14))] for _ in range(b)]
    budget = rng.choice([9, 16, 24])
    stops = stop_token_ids(target)
    engine = Engine(target, adapter, head, stop_ids=stops)
    refs = [engine.target_only(p, max_new_tokens=budget) for p in prompts]
    # an extra stop token some row emits early: that row ends while the others go on
    early = [t for r in refs for t in r.tokens[1: budget // 2]]
    extra = [rng.choice(early)] if early and rng.random() < 0.7 else []
    if extra:
        refs = [engine.target_only(p, max_new_tokens=budget, stop_ids=extra) for p in prompts]
    where = f"seed {seed} {cfg} K={adapter.num_slots} prompts {prompts} stop {extra}"

    got = engine.target_only_batch(prompts, max_new_tokens=budget, stop_ids=extra)
    assert [r.tokens for r in got] == [r.tokens for r in refs], where
    assert [r.stop_reason for r in got] == [r.stop_reason for r in refs], where
    assert [r.target_forwards for r in got] == [r.target_forwards for r in refs], where

    for use_head in (True, False):
        got = engine.speculative_batch(prompts, max_new_tokens=budget, stop_ids=extra, use_head=use_head)
        assert [r.tokens for r in got] == [r.tokens for r in refs], f"{where} use_head={use_head}"
        assert [r.stop_reason for r in got] == [r.stop_reason for r in refs], where

    hit = rng.choice([0.5, 0.8, 1.0])
    full = [p + r.tokens for p, r in zip(prompts, refs)]
    batch = Engine(target, RowOracle(adapter, full, list(range(b)), hit, seed, cfg["vocab"]), head, stop_ids=stops)
    got = batch.speculative_batch(prompts, max_new_tokens=budget, stop_ids=extra)
    assert [r.tokens for r in got] == [r.tokens for r in refs], f"{where} oracle hit={hit}"
    for r, p in enumerate(prompts):
        solo = Engine(target, RowOracle(adapter, [full[r]], [r], hit, seed, cfg["vocab"]), head, stop_ids=stops)
        want = solo.speculative(p, max_new_tokens=budget, stop_ids=extra)
        assert got[r].accepted == want.accepted, f"{where} row {r}"
        assert (got[r].slot_reached, got[r].slot_accepted) == (want.slot_reached, want.slot_accepted)
        assert got[r].target_forwards == want.target_forwards and got[r].seconds > 0


def test_batch_harness_reaches_ragged_acceptance_and_early_stops():
    """The property test must exercise rows accepting different counts in one step and a row
    ending while others go on; check that it does on one fixed variant."""
    target, adapter, head = build(3, block_size=6)
    prompts = [[5, 9, 13, 4], [7], [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9]]
    engine = Engine(target, adapter, head)
    refs = [engine.target_only(p, max_new_tokens=30).tokens for p in prompts]
    full = [p + r for p, r in zip(prompts, refs)]
    stop = next(t for t in refs[2][3:] if t not in refs[0])  # row 2 ends partway, row 0 runs to the end
    got = Engine(target, RowOracle(adapter, full, [0, 1, 2], 0.6, 0, 61), head).speculative_batch(
        prompts, max_new_tokens=30, stop_ids=[stop])
    want = [engine.target_only(p, max_new_tokens=30, stop_ids=[stop]).tokens for p in prompts]
    assert [r.tokens for r in got] == want
    lens = sorted(len(r.tokens) for r in got)
    assert lens[0] < lens[-1], "no row stopped before the others"
    steps = min(len(r.accepted) for r in got)
    assert any(len({r.accepted[s] for r in got}) > 1 for s in range(steps)), "acceptance never differed by row"


def test_batched_medusa_chain_equals_solo():
    from domino_graft.adapters.medusa import adapter as medusa
    from domino_graft.graft import build_head
    from domino_graft.recipe import load_recipe
    from domino_graft.target import load_target
    from tests.conftest import REPO, randomize_head

    recipe = load_recipe(REPO / "recipes" / "tiny_medusa.yaml", ["target.random.tie_word_embeddings=false"])
    target = load_target(recipe.target)
    adapter, _ = medusa.build(recipe.drafter, target)
    head = build_head(recipe, adapter)
    randomize_head(head, 0)
    assert adapter.topology == "chain"
    prompts = [[5, 9, 2, 14, 3], [8], [4, 4, 7, 90, 12, 11, 3, 6]]
    engine = Engine(target, adapter, head, stop_ids=stop_token_ids(target))
    refs = [engine.target_only(p, max_new_tokens=20).tokens for p in prompts]
    full = [p + r for p, r in zip(prompts, refs)]
    oracle = Engine(target, RowOracle(adapter, full, [0, 1, 2], 0.7, 0, 97), head, stop_ids=stop_token_ids(target))
    for eng in (engine, oracle):
        assert [r.tokens for r in eng.speculative_batch(prompts, max_new_tokens=20)] == refs


def test_batched_refusals_name_the_way_out():
    target, adapter, head = build(1)
    engine = Engine(target, adapter, head)
    with pytest.raises(ValueError, match=r"batched decoding: no prompts"):
        engine.speculative_batch([], max_new_tokens=4, sampling=Sampling(temperature=0.7))
    with pytest.raises(ValueError, match=r"outside the target vocabulary"):
        engine.speculative_batch([[3, 4], [99]], max_new_tokens=4)
    from types import SimpleNamespace

    pard_like = SimpleNamespace(topology="chain", family="pard", ragged_batch=False)
    with pytest.raises(ValueError, match=r"the pard drafter does not take ragged batches.*valid: --batch-size 1"):
        Engine(target, pard_like, head).speculative_batch([[3, 4]], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"topology 'tree'; valid: 'chain'"):
        Engine(target, SimpleNamespace(topology="tree"), head).speculative_batch([[3, 4]], max_new_tokens=4)
    gemma, g_adapter, g_head = build(2, arch="gemma3")  # on the DynamicCache (the static cache takes its windows)
    g_engine = Engine(gemma, g_adapter, g_head, kv="dynamic")
    with pytest.raises(ValueError, match=r"sliding-window targets.*valid: full-attention targets, or --batch-size 1"):
        g_engine.speculative_batch([[3, 4], [5]], max_new_tokens=4)
    # a batch of one is the solo decode's session (no validity mask), which holds sliding windows
    got = g_engine.speculative_batch([[3, 4]], max_new_tokens=4)
    assert [r.tokens for r in got] == [g_engine.target_only([3, 4], max_new_tokens=4).tokens]


# ------------------------------------------------------------------------- CLI
def test_bench_batch_size_reports_totals_and_identity(tiny_run, tmp_path, capsys):
    import json

    from tests.decoding.test_decoding import run_command

    prompts = tmp_path / "p.jsonl"
    rng = random.Random(0)
    prompts.write_text("".join(json.dumps({"prompt_ids": [rng.randrange(2, 95) for _ in range(n)]}) + "\n"
                               for n in (3, 17, 1, 9, 25, 6, 12, 2, 30, 7, 4, 14)))
    out = tmp_path / "bench.json"
    # the case: 12 ragged prompts in batches of 5 (5, 5, then 2). On the CPU: on a GPU the tiny model's
    # first batch captures graphs, inside the batch's wall but before its rows' clocks start (the rates' check below)
    args = [str(tiny_run), "--prompts", str(prompts), "--limit", "12", "--batch-size", "5", "--temperature", "0",
            "--max-new-tokens", "8", "--device", "cpu", "--json", str(out)]
    assert run_command("bench", args) == 0
    rep = json.loads(out.read_text())
    assert rep["batch_size"] == 5 and rep["num_prompts"] == 12 and len(rep["per_prompt"]) == 12
    assert rep["identical_to_target"] is True and rep["base"]["identical_to_target"] is True
    for key in ("tokens_per_s", "per_request_tokens_per_s", "target_tokens_per_s", "target_per_request_tokens_per_s",
                "base_per_request_tokens_per_s"):
        assert rep[key] > 0, key
    # a batch's wall time is counted once: its total rate exceeds what one of its requests sees
    assert rep["target_tokens_per_s"] > rep["target_per_request_tokens_per_s"]
    assert "batch size 5" in capsys.readouterr().out
    # T > 0 batches sample (their distribution: test_batched_sampling.py); the report says so
    assert run_command("bench", args[:-2] + ["--temperature", "1", "--json", str(out), "--force"]) == 0
    rep = json.loads(out.read_text())
    assert rep["batch_size"] == 5 and rep["identical_to_target"] is None and rep["tau"] >= 1.0


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("kv", ["auto", "dynamic"])
def test_pard_batches_ragged_rows_each_equal_to_its_solo_decode(arch, kv):
    """PARD's ragged contract (adapters/pard/adapter.py `_propose_ragged`: one cache of its LM, a validity
    mask per row): a batch of prompts of different lengths, one row ending early on a stop token, gives
    every row its target-alone greedy decode, and the drafter's acceptance per row is its solo decode's."""
    from tests.decoding.test_static_kv import PROMPTS, graft

    target, adapter, head = graft("pard", arch, seed=3)
    assert adapter.ragged_batch
    engine = Engine(target, adapter, head, stop_ids=stop_token_ids(target), kv="dynamic" if kv == "dynamic" else "auto")
    refs = [engine.target_only(p, max_new_tokens=20).tokens for p in PROMPTS]
    extra = [refs[0][3]]  # row 0 ends early
    want = [engine.target_only(p, max_new_tokens=20, stop_ids=extra) for p in PROMPTS]
    got = engine.speculative_batch(PROMPTS, max_new_tokens=20, stop_ids=extra)
    assert [r.tokens for r in got] == [r.tokens for r in want], (arch, kv)
    solo = [engine.speculative(p, max_new_tokens=20, stop_ids=extra) for p in PROMPTS]
    assert [r.accepted for r in got] == [r.accepted for r in solo], (arch, kv)


def test_pard_ragged_acceptance_under_nudged_drafts_equals_each_rows_solo():
    """RowOracle nudges PARD's drafts toward each row's continuation (hit rate 0.7): ragged acceptance
    (full blocks, rejections, rows accepting different counts), each row's as in its solo decode."""
    from tests.decoding.test_static_kv import PROMPTS, graft

    target, adapter, head = graft("pard", "qwen3", seed=4)
    stops, vocab = stop_token_ids(target), target.shape.vocab_size
    refs = [Engine(target, adapter, head, stop_ids=stops).target_only(p, max_new_tokens=24).tokens for p in PROMPTS]
    full = [p + r for p, r in zip(PROMPTS, refs)]
    batch = Engine(target, RowOracle(adapter, full, list(range(len(PROMPTS))), 0.7, 4, vocab), head, stop_ids=stops)
    got = batch.speculative_batch(PROMPTS, max_new_tokens=24)
    assert [r.tokens for r in got] == refs
    for r, p in enumerate(PROMPTS):
        solo = Engine(target, RowOracle(adapter, [full[r]], [r], 0.7, 4, vocab), head, stop_ids=stops)
        assert got[r].accepted == solo.speculative(p, max_new_tokens=24).accepted, r
    assert len({a for r in got for a in r.accepted}) > 2  # the nudges made acceptance ragged


@pytest.mark.parametrize("family,arch", [("peagle", "llama"), ("peagle", "qwen3"), ("pard", "llama")])
def test_ragged_acceptance_under_nudged_drafts_equals_each_rows_solo(family, arch):
    """P-EAGLE's and PARD's ragged contracts under RowOracle's nudges (hit rate 0.7): prompts of different
    lengths, one row ending early on a stop token; every row's tokens are its target-alone decode and its
    acceptance its solo speculative decode's."""
    from tests.decoding.test_static_kv import PROMPTS, graft

    target, adapter, head = graft(family, arch, seed=5)
    assert adapter.ragged_batch
    stops, vocab = stop_token_ids(target), target.shape.vocab_size
    plain = Engine(target, adapter, head, stop_ids=stops)
    refs = [plain.target_only(p, max_new_tokens=24).tokens for p in PROMPTS]
    extra = [refs[1][5]]  # some row ends early
    refs = [plain.target_only(p, max_new_tokens=24, stop_ids=extra).tokens for p in PROMPTS]
    full = [p + r for p, r in zip(PROMPTS, refs)]
    batch = Engine(target, RowOracle(adapter, full, list(range(len(PROMPTS))), 0.7, 5, vocab), head, stop_ids=stops)
    got = batch.speculative_batch(PROMPTS, max_new_tokens=24, stop_ids=extra)
    assert [r.tokens for r in got] == refs
    for r, p in enumerate(PROMPTS):
        solo = Engine(target, RowOracle(adapter, [full[r]], [r], 0.7, 5, vocab), head, stop_ids=stops)
        assert got[r].accepted == solo.speculative(p, max_new_tokens=24, stop_ids=extra).accepted, r
    assert len({a for r in got for a in r.accepted}) > 2  # the nudges made acceptance ragged
