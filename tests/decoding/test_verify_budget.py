"""The verify budget (decoding/budget.py, batched_chain(budget=)): a step verifies K' <= K drafts.

- the policy alone (no models): plain decoding when a verify costs many steps and acceptance is low,
  the full K when acceptance is high and a verify costs about a step, choices monotone in acceptance
  and in cost, probing again after plain steps, and one clear error per bad input;
- greedy: every fixed budget (0, 1, K-1, K) and auto gives the target-alone output token for token,
  at batch sizes 1 and 3, for DFlash (its static batch drafter, and nudged through the eager path),
  Medusa and DSpark (eager), with nudged drafters so rows accept ragged counts;
- T > 0: the first three tokens of every row under budgets 1 and 3 follow the target's exact joint
  law (chi-square, as test_batched_sampling.py), and the wrong-q control is rejected; the same for the
  solo chain's short verifies (batch size 1, auto choosing K' = 3);
- DFlash's static drafter given blocks of any length, some with no propose between them (K' = 0),
  proposes what the eager adapter proposes from the same verified context.
"""

from __future__ import annotations

import json

import pytest
import torch

from domino_graft.decoding import Engine, Sampling, stop_token_ids
from domino_graft.decoding.budget import (BudgetRun, VerifyBudget, VerifyCosts, best_budget, candidate_budgets,
                                          expected_tokens)
from tests.conftest import REPO
from tests.decoding.test_batched import RowOracle
from tests.decoding.test_batched_sampling import PROMPTS, row_pvalues, wrong_q
from tests.decoding.test_sampling import ALPHA, build
from tests.decoding.test_static_kv import graft
from tests.decoding.test_tree_sampling import exact_tables

# issue #39's Qwen3-8B-shape table (default kernels, H200): step and 16-token verify by batch size
H200 = VerifyCosts.from_dict({"step_ms": {"1": {"1": 4.67, "16": 4.87}, "8": {"1": 4.79, "16": 16.47},
                                          "32": {"1": 6.34, "16": 58.14}},
                              "propose_ms": {"1": 1.1, "8": 1.6, "32": 3.0}})


def run_with(costs: VerifyCosts, k: int, batch: int, accept_prob: float, steps: int = 12) -> BudgetRun:
    """A budget run fed `steps` steps in which each of `batch` rows accepts each reached slot with
    probability ~accept_prob (deterministic: a row accepts round(p * K') of the K' verified)."""
    run = VerifyBudget("auto", costs=costs).start(k, batch, "cpu")
    for _ in range(steps):
        kk = run.choose()
        run.observe(kk, [int(round(accept_prob * kk))] * batch)
    return run


# ------------------------------------------------------------------- the policy
def test_expected_tokens_and_candidates():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5, 0.5], 2) == pytest.approx(1.75)
    assert expected_tokens([1.0] * 15, 15) == 16.0
    assert candidate_budgets(15) == [0, 3, 7, 15]
    assert candidate_budgets(5) == [0, 3, 5]  # clipped to K, and K itself is always a candidate
    assert candidate_budgets(20) == [0, 3, 7, 15, 20]
    # a tie goes to the larger K' (fewer forwards for the same rate)
    assert best_budget([0.0] * 3, [0, 3], lambda kk: 1.0) == 3


def test_speculation_must_beat_plain_steps_by_the_switch_margin():
    """A verify whose expected rate is within SWITCH_MARGIN of plain steps' loses to them (the estimate's
    error decides there); one clearly over it wins; best_budget alone keeps the plain argmax."""
    from domino_graft.decoding.budget import SWITCH_MARGIN

    alphas = [0.5] * 3  # E(3) = 1.875 tokens a step
    for ratio, want in ((1.05, 0), (SWITCH_MARGIN * 1.02, 3)):  # speculation's rate over plain steps'
        cost = {0: 1.0, 3: expected_tokens(alphas, 3) / ratio}
        assert best_budget(alphas, [0, 3], cost.get, margin=SWITCH_MARGIN) == want, ratio
        assert best_budget(alphas, [0, 3], cost.get) == 3  # no margin: the plain argmax
    assert SWITCH_MARGIN > 1.0
    costs = VerifyCosts.from_dict({"step_ms": {"4": {"1": 1.0, "4": 1.75}}, "propose_ms": {"4": 0.1}})
    run = VerifyBudget("auto", costs=costs).start(3, 4, "cpu")
    for _ in range(40):  # every row accepts 2 of 3: E(3) ~ 2.6-2.9 tokens for 1.85 ms, 1.4-1.6x plain
        kk = run.choose()
        run.observe(kk, [2] * 4 if kk else [])
    assert run.choose() == 3, run.report()


def test_policy_plain_decoding_when_verify_is_dear_and_acceptance_low():
    run = run_with(H200, k=15, batch=32, accept_prob=0.2)
    assert run.choose() == 0
    assert run.cost_ms(0) == pytest.approx(6.34) and run.cost_ms(15) == pytest.approx(3.0 + 58.14)
    # the first steps verify everything (WARMUP_STEPS), then the estimate takes over
    assert run.report()["k_hist"]["15"] >= 2 and run.report()["k_hist"]["0"] >= 8


def test_policy_full_k_when_acceptance_is_high_and_verify_costs_a_step():
    run = run_with(H200, k=15, batch=1, accept_prob=1.0)
    assert run.choose() == 15
    assert set(run.report()["k_hist"]) == {"15"}


def test_policy_is_monotone_in_acceptance_and_in_cost():
    for batch in (1, 8, 32):
        chosen = [run_with(H200, 15, batch, p).choose() for p in (0.0, 0.2, 0.5, 0.8, 1.0)]
        assert chosen == sorted(chosen), (batch, chosen)
    # at one acceptance, a dearer verify never buys a longer one
    chosen = [run_with(H200, 15, b, 0.8).choose() for b in (1, 8, 32)]
    assert chosen == sorted(chosen, reverse=True), chosen
    assert chosen[0] == 15 and chosen[-1] < 15


def test_policy_probes_again_after_plain_steps():
    """After K' = 0 nothing is observed; the decayed counts drift back to the optimistic prior, so a
    later step verifies drafts again (a batch whose drafter improves is not stuck at 0)."""
    costs = VerifyCosts.from_dict({"step_ms": {"4": {"1": 1.0, "4": 1.8, "8": 2.5, "16": 4.0}},
                                   "propose_ms": {"4": 0.2}})
    run = run_with(costs, k=15, batch=4, accept_prob=0.0, steps=6)
    assert run.choose() == 0
    for _ in range(60):
        kk = run.choose()
        run.observe(kk, [0] * 4 if kk else [])
        if kk:
            break
    assert kk > 0, run.report()


def test_wall_clock_excess_moves_the_choice():
    """On CUDA a step kind's wall-clock excess over its device-side cost joins its cost: a batch
    whose speculative steps cost much more on the wall than their events say falls back to plain
    steps; the excess is the lower quartile of the recent samples (a graph capture is skipped);
    a rebuilt batch (carry) keeps the estimate."""
    costs = VerifyCosts.from_dict({"step_ms": {"8": {"1": 1.0, "4": 1.2, "8": 1.4, "16": 2.0}},
                                   "propose_ms": {"8": 0.3}})
    budget = VerifyBudget("auto", costs=costs)
    cheap = budget.start(15, 8, "cuda")
    dear = budget.start(15, 8, "cuda")
    for run, excess in ((cheap, 0.1), (dear, 5.0)):
        for i in range(12):
            kk = run.choose()
            run.observe(kk, [min(kk, 3)] * 8)  # three drafts accepted a step
            # the decode's first step and a later one capture graphs: 500 ms, not sampled
            run.add_wall(kk, run.device_cost_ms(kk) + (500.0 if i in (0, 5) else excess if kk else 0.05))
    assert cheap.choose() > 0 and dear.choose() == 0
    assert dear.report()["excess_ms"]["spec"] == pytest.approx(5.0)
    assert budget.start(15, 8, "cpu").wall_clock is False  # off CUDA: the table's costs only
    cpu = budget.start(15, 8, "cpu")
    cpu.add_wall(15, 99.0)
    assert cpu.cost_ms(15) == cpu.device_cost_ms(15)
    rebuilt = budget.start(15, 8, "cuda", carry=dear)
    assert rebuilt.alphas() == dear.alphas() and rebuilt.choose() == 0


def test_each_k_is_costed_by_its_own_samples_once_it_has_them():
    """A long verify books more host time than a short one: with MIN_OWN samples of its own a K' is
    costed by them, not by its kind's median (which the other K' fill too)."""
    from domino_graft.decoding.budget import MIN_OWN

    costs = VerifyCosts.from_dict({"step_ms": {"8": {"1": 1.0, "4": 1.2, "8": 1.4, "16": 2.0}},
                                   "propose_ms": {"8": 0.3}})
    run = VerifyBudget("auto", costs=costs).start(15, 8, "cuda")
    run.decode_steps = 2  # past the decode's first step
    for _ in range(MIN_OWN):
        run.add_wall(15, run.device_cost_ms(15) + 2.0)
    for _ in range(2 * MIN_OWN):
        run.add_wall(3, run.device_cost_ms(3) + 0.2)
    assert run.cost_ms(15) == pytest.approx(run.device_cost_ms(15) + 2.0)
    assert run.cost_ms(3) == pytest.approx(run.device_cost_ms(3) + 0.2)
    # K' = 7 has no samples of its own: its kind's median (mostly K' = 3's)
    assert run.cost_ms(7) == pytest.approx(run.device_cost_ms(7) + 0.2)
    assert set(run.report()["excess_ms"]) == {"spec", "15", "3"}
    # a shorter verify rolls out fewer slots: its own reading over a longer K''s is noise, capped there (dbff6fe,
    # H100, greedy B = 2: K' = 7 read 0.36 ms against K' = 15's 0.16, and 80% of the steps verified 15 drafts, 1.27x
    # the target alone against 1.37x at K' = 7 in the run before)
    for _ in range(MIN_OWN):
        run.add_wall(7, run.device_cost_ms(7) + 3.0)
    assert run.cost_ms(7) == pytest.approx(run.device_cost_ms(7) + 2.0) and run.cost_ms(7) < run.cost_ms(15)


def test_tick_samples_each_step_under_its_own_k(monkeypatch):
    """tick(K') at each step's top: the step before, now ended, is sampled under its own K' (loop top
    to loop top); off CUDA the clock is off."""
    from domino_graft.decoding import budget as budget_mod

    costs = VerifyCosts.from_dict({"step_ms": {"2": {"1": 1.0, "16": 2.0}}, "propose_ms": {"2": 0.5}})
    now = iter([10.0, 10.0035, 10.0046])  # seconds: a 3.5 ms step with 15 drafts, then a 1.1 ms plain one
    monkeypatch.setattr(budget_mod.time, "perf_counter", lambda: next(now))
    run = VerifyBudget("auto", costs=costs).start(15, 2, "cuda")
    run.decode_steps = 2  # past the decode's first step
    for kk in (15, 0, 15):
        run.tick(kk)
    assert run.excess["15"] == [pytest.approx(3.5 - run.device_cost_ms(15))]
    assert run.excess["0"] == [pytest.approx(1.1 - run.device_cost_ms(0))]
    off = VerifyBudget("auto", costs=costs).start(15, 2, "cpu")
    off.tick(15)
    off.tick(0)
    assert off.excess == {"plain": [], "spec": []}


def test_choices_are_every_k_a_step_may_verify():
    k = 15
    assert VerifyBudget.parse("full").choices(k) == [k]
    assert VerifyBudget.parse("3").choices(k) == [3]
    assert VerifyBudget.parse("auto").choices(k) == candidate_budgets(k) == [0, 3, 7, 15]


def test_fixed_and_full_ignore_costs():
    assert VerifyBudget.parse("full").start(7, 3, "cpu").choose() == 7
    run = VerifyBudget.parse("fixed:2").start(7, 3, "cpu")
    assert [run.choose() for _ in range(3)] == [2, 2, 2] and run.report()["k_hist"] == {"2": 3}
    assert VerifyBudget.parse(" 0 ").start(7, 3, "cpu").choose() == 0


def test_costs_interpolate_in_batch_and_length():
    assert H200.step(8, 1) == 4.79 and H200.step(8, 16) == 16.47
    assert H200.step(8, 4) == pytest.approx(4.79 + (16.47 - 4.79) * 3 / 15)  # between T = 1 and 16
    assert H200.step(16, 16) == pytest.approx(16.47 + (58.14 - 16.47) * 8 / 24)  # between B = 8 and 32
    assert H200.step(64, 16) > H200.step(32, 16)  # past the table: along its last segment
    rows = VerifyCosts.from_dict({"by_batch": [{"B": 2, "T": 1, "default_ms": 4.7, "cublas_ms": 5.1,
                                                "propose_ms": 1.2}, {"B": 2, "T": 16, "default_ms": 6.0}]})
    assert rows.step(2, 16) == 6.0 and rows.propose(2) == 1.2
    assert VerifyCosts.from_dict(H200.to_dict()).to_dict() == H200.to_dict()  # a report's costs read back


@pytest.mark.parametrize("text,match", [
    ("-1", r"--verify-budget: -1 is negative; valid: full, auto, or an integer N with 0 <= N <= K"),
    ("sometimes", r"--verify-budget: 'sometimes' is not a budget; valid: full, auto, or an integer N"),
    ("fixed:x", r"--verify-budget: 'fixed:x' is not a budget; valid: full, auto"),
])
def test_bad_budgets_name_the_value(text, match):
    with pytest.raises(ValueError, match=match):
        VerifyBudget.parse(text)


def test_budget_refusals_at_decode_start():
    with pytest.raises(ValueError, match=r"--verify-budget: 9 exceeds the drafter's K = 3 drafts per step; "
                                         r"valid: full, auto, or an integer 0..3"):
        VerifyBudget.parse("9").start(3, 2, "cpu")
    with pytest.raises(ValueError, match=r"--verify-budget: auto on cpu needs a cost table with step_ms and "
                                         r"propose_ms \(--verify-costs FILE.json"):
        VerifyBudget.parse("auto").check(3, "cpu")
    VerifyBudget.parse("auto").check(3, "cuda")  # measured there
    with pytest.raises(ValueError, match=r"verify budget mode: 'always' is not a mode; valid: full, fixed, auto"):
        VerifyBudget("always")
    with pytest.raises(ValueError, match=r"verify budget: fixed needs n, .* got None; valid: an integer >= 0"):
        VerifyBudget("fixed")


@pytest.mark.parametrize("data,match", [
    ([1, 2], r"verify costs: a list; valid: an object with step_ms and propose_ms"),
    ({"stepms": {}}, r"verify costs: unknown key 'stepms'; valid keys: step_ms"),
    ({"propose_ms": {"1": 1.0}}, r"verify costs: no step_ms; valid keys"),
    ({"step_ms": {}}, r"verify costs: step_ms is \{\}; valid: \{B: \{T: ms\}\}"),
    ({"step_ms": {"x": {"1": 1.0}}}, r"verify costs: step_ms: key 'x' is not a batch size; valid: integers >= 1"),
    ({"step_ms": {"4": {"0": 1.0}}}, r"step_ms\['4'\]: key '0' is not a verify length T; valid: integers >= 1"),
    ({"step_ms": {"4": {"1": -2}}}, r"step_ms\['4'\]\['1'\]: -2 is not a time; valid: milliseconds > 0"),
    ({"step_ms": {"4": [1.0]}}, r"step_ms\['4'\] is \[1.0\]; valid: \{T: ms\}"),
    ({"step_ms": {"4": {"1": 1.0}}, "propose_ms": {"4": "fast"}},
     r"propose_ms\['4'\]: 'fast' is not a time; valid: milliseconds > 0"),
    ({"by_batch": [{"B": 1, "T": 4}]}, r"by_batch\[0\]: .*; valid: an object with B, T and default_ms \(or ms\)"),
])
def test_malformed_cost_tables_name_the_field(data, match):
    with pytest.raises(ValueError, match=match):
        VerifyCosts.from_dict(data)


def test_cost_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--verify-costs '.*nope.json': no such file"):
        VerifyCosts.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{step_ms")
    with pytest.raises(ValueError, match=r"--verify-costs '.*bad.json': not valid JSON"):
        VerifyCosts.load(bad)
    good = tmp_path / "costs.json"
    good.write_text(json.dumps(H200.to_dict()))
    assert VerifyCosts.load(good).to_dict() == H200.to_dict()


# ------------------------------------------------------------- greedy identity
# verify is dear at B = 3 (T = 16 costs 6 steps), cheap at B = 1: auto moves between K' values
CPU_COSTS = {"step_ms": {"1": {"1": 1.0, "4": 1.1, "8": 1.2, "16": 1.4}, "3": {"1": 1.0, "4": 2.2, "8": 3.5, "16": 6.0}},
             "propose_ms": {"1": 0.2, "3": 0.4}}
FAMILIES = [("dflash", "qwen3"), ("medusa", "llama"), ("dspark", "qwen3")]


@pytest.mark.parametrize("family,arch", FAMILIES)
def test_greedy_every_budget_equals_target_alone(family, arch):
    from tests.decoding.test_batched_static_drafter import StaticRowOracle

    target, adapter, head = graft(family, arch, seed=2)
    k, vocab, stops = adapter.num_slots, target.shape.vocab_size, stop_token_ids(target)
    prompts = [[5, 9, 13, 4, 22], [7], [3, 14, 15, 9, 26, 5, 35, 8, 9]]
    plain = Engine(target, adapter, head, stop_ids=stops)
    refs = [plain.target_only(p, max_new_tokens=16).tokens for p in prompts]
    full = [p + r for p, r in zip(prompts, refs)]
    nudge = StaticRowOracle if family == "dflash" else RowOracle  # DFlash: nudged on its static drafter too
    engines = {"plain": plain, "nudged": Engine(target, nudge(adapter, full, [0, 1, 2], 0.8, 1, vocab), head,
                                                 stop_ids=stops)}
    chosen = set()
    for spec in ("0", "1", str(k - 1), str(k), "auto"):
        budget = VerifyBudget.parse(spec, VerifyCosts.from_dict(CPU_COSTS))
        for name, engine in engines.items():
            for rows in ([0], [0, 1, 2]):
                got = engine.speculative_batch([prompts[r] for r in rows], max_new_tokens=16, budget=budget)
                where = f"{family} budget {spec} {name} rows {rows}"
                assert [r.tokens for r in got] == [refs[r] for r in rows], where
                hist = engine.last_budget["k_hist"]
                chosen |= {int(kk) for kk in hist}
                if spec != "auto":
                    assert set(hist) == {spec}, where
                    n = int(spec)  # slots past the budget are never verified
                    assert all(r.slot_reached[n:] == [0] * (k - n) for r in got), where
    assert {0, k} <= chosen and len(chosen) >= 3, chosen  # auto chose between several K'


def test_solo_auto_budget_commits_to_the_target_alone_or_verifies_everything():
    """Batch size 1 (decoding/chain.py): auto chooses between all K and the target alone for the rest
    of the decode. A dear verify and a drafter that misses: after the warm-up steps the decode commits
    (K' = 0 steps in the report) and still equals the target alone token for token; a cheap verify and
    a drafter that hits: every step verifies all K. The next decode starts from what this one learned
    (no warm-up steps)."""
    from tests.decoding.test_batched import RowOracle

    target, adapter, head = graft("dflash", "qwen3", seed=2)
    k, vocab, stops = adapter.num_slots, target.shape.vocab_size, stop_token_ids(target)
    prompts = [[5, 9, 13, 4, 22], [3, 14, 15, 9, 26, 5, 35, 8, 9]]
    plain = Engine(target, adapter, head, stop_ids=stops)
    refs = [plain.target_only(p, max_new_tokens=24).tokens for p in prompts]
    full = [p + r for p, r in zip(prompts, refs)]
    dear = VerifyCosts.from_dict({"step_ms": {"1": {"1": 1.0, str(k + 1): 9.0}}, "propose_ms": {"1": 1.0}})
    cheap = VerifyCosts.from_dict({"step_ms": {"1": {"1": 1.0, str(k + 1): 1.05}}, "propose_ms": {"1": 0.05}})
    for costs, hit, want in ((dear, 0.0, "commit"), (cheap, 1.0, "verify")):
        budget = VerifyBudget.parse("auto", costs)
        for i, (p, ref) in enumerate(zip(prompts, refs)):
            engine = Engine(target, RowOracle(adapter, full, [i], hit, 1, vocab), head, stop_ids=stops)
            got = engine.speculative(p, max_new_tokens=24, budget=budget)
            assert got.tokens == ref, (want, i)
            hist = engine.last_budget["k_hist"]
            if want == "commit":
                assert hist.get("0", 0) > 0 and set(hist) <= {"0", str(k)}, hist
                assert len(got.accepted) == got.target_forwards - 1  # every step recorded, the plain ones as 0
            else:
                assert set(hist) == {str(k)}, hist
        assert budget.memory["solo"].decodes == 1  # the second decode started from the first's estimate
    from domino_graft.graft import build_head
    from domino_graft.recipe import load_recipe
    from domino_graft.registry import get_family
    from domino_graft.target import load_target

    recipe = load_recipe(REPO / "recipes" / "tiny_medusa.yaml", ["drafter.tree=[[0],[1],[0,0]]"])
    tree_target = load_target(recipe.target)
    tree_adapter, tensors = get_family("medusa").build(recipe.drafter, tree_target)
    assert tree_adapter.topology == "tree"
    with pytest.raises(ValueError, match="with a tree drafter"):
        Engine(tree_target, tree_adapter, build_head(recipe, tree_adapter, tensors)).speculative(
            [5, 6], max_new_tokens=4, budget=VerifyBudget.parse("auto", dear))


@pytest.mark.parametrize("family,kv", [("dflash", "dynamic"), ("dflash", "static"), ("medusa", "static")])
def test_the_solo_chain_verifies_a_short_block_where_its_drafter_takes_one(monkeypatch, family, kv):
    """Batch size 1 (decoding/chain.py) has the batched chain's candidates where its drafter takes short blocks:
    over a table where a 4-token verify costs about a plain step and a whole block many, the solo decode
    verifies K' = 3 and equals the target alone token for token, through the eager drafter (the HF cache, a
    nudged drafter that hits) and DFlash's static drafter (the static cache). Medusa's static drafter needs
    whole blocks (no ``takes_short_blocks``): all K or none, so the same table sends it to the target alone."""
    from domino_graft.decoding import budget as budget_mod

    monkeypatch.setattr(budget_mod, "WARMUP_STEPS", 0)  # the prior chooses the first step: a static drafter misses
    target, adapter, head = graft(family, "qwen3", seed=2)
    k, stops = adapter.num_slots, stop_token_ids(target)
    prompt = [5, 9, 13, 4, 22]
    ref = Engine(target, adapter, head, stop_ids=stops).target_only(prompt, max_new_tokens=24).tokens
    if kv == "dynamic":
        adapter = RowOracle(adapter, [prompt + ref], [0], 1.0, 1, target.shape.vocab_size)
    costs = VerifyCosts.from_dict({"step_ms": {"1": {"1": 1.0, "4": 1.05, str(k + 1): 9.0}},
                                   "propose_ms": {"1": 0.05}})
    engine = Engine(target, adapter, head, stop_ids=stops, kv=kv)
    got = engine.speculative(prompt, max_new_tokens=24, budget=VerifyBudget.parse("auto", costs))
    assert got.tokens == ref
    hist = engine.last_budget["k_hist"]
    if family == "dflash":
        assert hist.get("3", 0) > 0, hist
        assert got.slot_reached[3:] == [0] * (k - 3) and max(got.accepted) <= 3
    else:
        assert set(hist) <= {"0", str(k)}, hist


def test_a_decode_where_plain_steps_win_runs_the_target_alone_from_its_first_step(monkeypatch):
    """starts_committed (decoding/budget.py): once a batch size has been seen and the shared estimate
    says plain steps win there, its decodes run the target alone's decode outright (no drafter built or
    prefilled, no rollout: every step K' = 0); outputs equal the target alone's throughout, batched
    (B = 3) and solo (B = 1)."""
    from domino_graft.decoding import batched

    target, adapter, head = graft("dflash", "qwen3", seed=2)
    k, stops = adapter.num_slots, stop_token_ids(target)
    prompts = [[5, 9, 13, 4, 22], [7], [3, 14, 15, 9, 26, 5, 35, 8, 9]]
    engine = Engine(target, adapter, head, stop_ids=stops)
    refs = [engine.target_only(p, max_new_tokens=12).tokens for p in prompts]
    built = []
    real = batched.static_batch_drafter
    monkeypatch.setattr(batched, "static_batch_drafter", lambda *a: built.append(a) or real(*a))
    dear = VerifyCosts.from_dict({"step_ms": {"1": {"1": 1.0, "4": 20.0, "8": 30.0, str(k + 1): 40.0},
                                              "3": {"1": 1.0, "4": 20.0, "8": 30.0, str(k + 1): 40.0}},
                                  "propose_ms": {"1": 5.0, "3": 5.0}})
    budget = VerifyBudget.parse("auto", dear)
    for decode in range(4):
        built.clear()
        got = engine.speculative_batch(prompts, max_new_tokens=12, budget=budget)
        assert [r.tokens for r in got] == refs, decode
        hist = engine.last_budget["k_hist"]
        if decode == 0:  # the estimate's first steps verify all K, then plain steps win: it commits
            assert hist.get(str(k), 0) >= 1 and hist.get("0", 0) > 0 and built, (decode, hist)
        else:
            assert set(hist) == {"0"} and not built, (decode, hist)
            assert all(r.accepted == [0] * r.decode_steps for r in got)
        # solo: its first decode commits at its first choice (the estimate is the batched decodes'),
        # the later ones start committed
        solo = engine.speculative(prompts[0], max_new_tokens=12, budget=budget)
        assert solo.tokens == refs[0], decode
        assert set(engine.last_budget["k_hist"]) == {"0"}, (decode, engine.last_budget)
        assert len(solo.accepted) == solo.decode_steps


# ------------------------------------------------------------- T > 0: in law
def sampled_setup(seed: int, rows_per_prompt: int = 2000):
    """K = 4 (block 5) over an 8-token vocabulary, the target peaked (as test_batched_sampling.peaked):
    (target, adapter, head, each prompt's exact joint law of its first three tokens at T = 1, the
    sampling, the batch of rows_per_prompt rows per prompt)."""
    target, adapter, head = build(seed, vocab=8, ppl=0, block_size=5, head_scale=2.0)
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(15.0)
    warp_ = dict(temperature=1.0, top_k=0, top_p=1.0)
    with torch.inference_mode():
        joints = []
        for prompt in PROMPTS:
            p1, p2, p3 = exact_tables(target, torch.tensor([prompt]), 8, warp_)
            joints.append(p1[:, None, None] * p2[:, :, None] * p3)
    batch = [PROMPTS[i % len(PROMPTS)] for i in range(len(PROMPTS) * rows_per_prompt)]
    return target, adapter, head, joints, Sampling(seed=seed, **warp_), batch


@pytest.mark.parametrize("spec", ["1", "3"])
def test_budgeted_sampling_matches_target_distribution(spec):
    """K = 4 (block 5): the budget verifies 1 or 3 of them; the same chi-square as the full verify's
    (test_batched_sampling.py), the wrong-q control rejected."""
    target, adapter, head, joints, sampling, batch = sampled_setup(seed=0)
    engine = Engine(target, adapter, head)
    budget = VerifyBudget.parse(spec)
    results = engine.speculative_batch(batch, max_new_tokens=3, sampling=sampling, budget=budget)
    assert engine.last_budget["k_hist"].keys() == {spec}
    assert max(a for r in results for a in r.accepted) == int(spec)  # some rows took all K' drafts
    right = row_pvalues(results, joints)
    engine.rollout = wrong_q
    wrong = row_pvalues(engine.speculative_batch(batch, max_new_tokens=3, sampling=sampling, budget=budget), joints)
    assert min(right) > ALPHA, f"budget {spec}: a row deviates from the target: {right}"
    assert max(wrong) < ALPHA, f"budget {spec}: the test cannot tell a wrong q from the right one: {wrong}"


def test_the_solo_chains_short_verifies_match_target_distribution():
    """Batch size 1 at T = 1 over a table where K' = 3 of K = 4 pays (decoding/chain.py): 300 solo decodes of
    each of two prompts, each decode its own seed; the first three tokens follow the target's exact joint law,
    and the wrong-q control is rejected on both. (The one-token prompt [4] is left out: its control needs ~500
    decodes to be rejected, at ~15 ms a solo decode on 2 CPU cores.)"""
    target, adapter, head, joints, sampling, _ = sampled_setup(seed=0, rows_per_prompt=0)
    prompts = [0, 2]  # indices into PROMPTS
    costs = VerifyCosts.from_dict({"step_ms": {"1": {"1": 1.0, "4": 1.05, "5": 9.0}}, "propose_ms": {"1": 0.05}})
    engine = Engine(target, adapter, head)

    def pvalues():
        budget, hist, results = VerifyBudget.parse("auto", costs), {}, []
        for i in range(300 * len(prompts)):
            results.append(engine.speculative(PROMPTS[prompts[i % len(prompts)]], max_new_tokens=3, sampling=sampling,
                                              seed_offset=i, budget=budget))
            for kk, n in engine.last_budget["k_hist"].items():
                hist[kk] = hist.get(kk, 0) + n
        assert hist.get("3", 0) > 300 * len(prompts), hist  # the warm-up's first steps verify all K, then K' = 3
        return row_pvalues(results, [joints[p] for p in prompts])

    right = pvalues()
    engine.rollout = wrong_q
    wrong = pvalues()
    assert min(right) > ALPHA, f"a row deviates from the target: {right}"
    assert max(wrong) < ALPHA, f"the test cannot tell a wrong q from the right one: {wrong}"


@pytest.mark.parametrize("warmup", [1, 0])
def test_auto_budget_that_commits_mid_decode_matches_target_distribution(monkeypatch, warmup):
    """auto at T = 1 over a table that makes every verify dear, COMMIT_AFTER shortened to 1. warmup 1:
    the first step verifies all K, the second is a plain step through the chain (chosen from the
    first's outcome); warmup 0: a plain step through the chain, then the committed target-alone loop.
    The first three tokens of every row follow the target's exact joint law; with a speculative step
    in them, the wrong-q control is rejected."""
    from domino_graft.decoding import budget as budget_mod

    monkeypatch.setattr(budget_mod, "WARMUP_STEPS", warmup)
    monkeypatch.setattr(budget_mod, "COMMIT_AFTER", 1)
    target, adapter, head, joints, sampling, batch = sampled_setup(seed=1)
    dear = {"step_ms": {str(len(batch)): {"1": 1.0, "2": 50.0, "4": 60.0, "5": 70.0}},
            "propose_ms": {str(len(batch)): 5.0}}
    k = adapter.num_slots
    want = {str(k): 1, "0": 1} if warmup else {"0": 2}  # the committed loop's steps count as K' = 0 too
    engine = Engine(target, adapter, head)

    def decode():
        budget = VerifyBudget.parse("auto", VerifyCosts.from_dict(dear))
        out = engine.speculative_batch(batch, max_new_tokens=3, sampling=sampling, budget=budget)
        assert engine.last_budget["k_hist"] == want, engine.last_budget["k_hist"]
        return out

    results = decode()
    right = row_pvalues(results, joints)
    assert min(right) > ALPHA, f"a row deviates from the target: {right}"
    if warmup:
        assert any(r.accepted[0] >= 2 for r in results) and any(r.accepted[0] == 0 for r in results)
        engine.rollout = wrong_q
        wrong = row_pvalues(decode(), joints)
        assert max(wrong) < ALPHA, f"the test cannot tell a wrong q from the right one: {wrong}"


# ------------------------------------------------- DFlash's static drafter
def test_static_drafter_takes_short_blocks_and_blocks_without_a_propose():
    """Blocks of T = 1..K+1 verified features, two of them (K' = 0 steps) with no propose between:
    every row's next block equals the eager adapter's over the same kept context."""
    from domino_graft.adapters.dflash.fast import StaticDFlashDrafter

    target, adapter, _ = graft("dflash", "qwen3", seed=3)
    k, f = adapter.num_slots, adapter.cfg.hidden_size * len(adapter.cfg.target_layer_ids)
    g = torch.Generator().manual_seed(0)
    lens = [4, 9]
    # per step: the verify's length T (K' + 1) and each row's accepted count (< T)
    steps = [(k + 1, [1, k]), (1, [0, 0]), (1, [0, 0]), (3, [2, 0]), (1, [0, 0]), (k + 1, [k, 0])]
    drafter = StaticDFlashDrafter(adapter, 128, max_batch=2)
    feats = torch.randn(2, max(lens), f, generator=g)
    kept = [[(feats[r: r + 1, :n], torch.arange(n))] for r, n in enumerate(lens)]  # each row's verified context
    pos = list(lens)
    with torch.inference_mode():
        drafter.prefill(feats, max(lens))
        for i, (t, accepts) in enumerate(steps):
            anchor = torch.randint(0, target.shape.vocab_size, (2,), generator=g)
            if t > 1:  # a step with drafts proposes first; a K' = 0 step does not
                got = drafter.propose(anchor, pos)
                for r in range(2):
                    adapter.reset(1)
                    for fe, at in kept[r]:
                        adapter.observe(fe, at)
                    want = adapter.propose(anchor[r: r + 1], pos[r])
                    torch.testing.assert_close(got.base_logits[r: r + 1], want.base_logits, atol=2e-5, rtol=1e-4,
                                               msg=f"step {i} row {r}")
            verified = torch.randn(2, t, f, generator=g)
            drafter.observe_block(verified, pos)
            for r, a in enumerate(accepts):
                kept[r].append((verified[r: r + 1, : a + 1], torch.arange(pos[r], pos[r] + a + 1)))
                pos[r] += a + 1
        got = drafter.propose(torch.zeros(2, dtype=torch.long), pos)  # after the last block
        for r in range(2):
            adapter.reset(1)
            for fe, at in kept[r]:
                adapter.observe(fe, at)
            want = adapter.propose(torch.zeros(1, dtype=torch.long), pos[r])
            torch.testing.assert_close(got.base_logits[r: r + 1], want.base_logits, atol=2e-5, rtol=1e-4)


# ------------------------------------------------------------------------- CLI
def test_bench_and_generate_take_a_budget(tiny_run, tmp_path, capsys):
    from tests.decoding.test_batched_generate import PROMPTS as GEN_PROMPTS
    from tests.decoding.test_batched_generate import answers
    from tests.decoding.test_decoding import run_command

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": ids}) + "\n"
                               for ids in ([5, 9, 13], [7], [3, 14, 15, 9, 26, 5, 35], [8, 8, 2], [11, 4])))
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(CPU_COSTS))
    out = tmp_path / "bench.json"
    base = [str(tiny_run), "--prompts", str(prompts), "--batch-size", "3", "--temperature", "0",
            "--max-new-tokens", "8", "--json", str(out), "--force"]
    assert run_command("bench", base + ["--verify-budget", "2"]) == 0
    rep = json.loads(out.read_text())
    assert rep["identical_to_target"] is True and rep["base"]["identical_to_target"] is True
    vb = rep["verify_budget"]
    assert vb["mode"] == "2" and sorted(vb["by_batch_size"]) == ["2", "3"]  # batches of 3, then 2
    assert all(set(h) == {"2"} for modes in vb["by_batch_size"].values() for h in modes.values())
    assert rep["slot_reached"][2:] == [0] * 5  # K = 7: slots past the budget never verified
    assert "verify budget 2, batch 3: K' chosen (K' x steps): base 2x" in capsys.readouterr().out
    assert run_command("bench", base + ["--verify-budget", "auto", "--verify-costs", str(costs)]) == 0
    rep = json.loads(out.read_text())
    assert rep["identical_to_target"] is True and rep["verify_budget"]["mode"] == "auto"
    assert rep["verify_budget"]["costs"]["step_ms"]["3"]["16"] == 6.0
    assert sum(rep["verify_budget"]["by_batch_size"]["3"]["domino"].values()) > 0
    capsys.readouterr()

    many = [a for ids in GEN_PROMPTS for a in ("--prompt-ids", ids)]
    want = None
    for budget in ("full", "0", "3"):
        assert run_command("generate", [str(tiny_run), *many, "--max-new-tokens", "7", "--batch-size", "3",
                                        "--verify-budget", budget]) == 0
        cap = capsys.readouterr()
        want = want or answers(cap.out)
        assert answers(cap.out) == want, budget
        assert (f"verify budget K': steps {{'{budget}'" in cap.err) == (budget != "full"), cap.err


@pytest.mark.parametrize("argv,message", [
    (["generate", "--prompt-ids", "5", "--verify-budget", "2"],
     "--verify-budget: '2' needs batched decoding; valid: --batch-size N >= 2 with it, or full or auto at batch size 1"),
    (["generate", "--prompt-ids", "5", "--verify-budget", "-2"],
     "--verify-budget: -2 is negative; valid: full, auto, or an integer N with 0 <= N <= K"),
    (["generate", "--prompt-ids", "5", "--batch-size", "2", "--verify-budget", "often"],
     "--verify-budget: 'often' is not a budget; valid: full, auto, or an integer N with 0 <= N <= K"),
    (["generate", "--prompt-ids", "5", "--batch-size", "2", "--verify-budget", "99"],
     "--verify-budget: 99 exceeds the drafter's K = 7 drafts per step; valid: full, auto, or an integer 0..7"),
    (["bench", "--batch-size", "2", "--verify-budget", "auto"],
     "--verify-budget: auto on cpu needs a cost table with step_ms and propose_ms (--verify-costs FILE.json"),
    (["bench", "--batch-size", "2", "--verify-budget", "auto", "--verify-costs", "nope.json"],
     "--verify-costs 'nope.json': no such file"),
])
def test_budget_flags_name_the_value(tiny_run, capsys, argv, message):
    from tests.decoding.test_decoding import run_command

    assert run_command(argv[0], [str(tiny_run), *argv[1:]]) == 1
    assert message in capsys.readouterr().err


# ----------------------------------------------------------------------------- GPU (opt-in: -m gpu)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_budgets_replay_graphs_and_measure_costs():
    """On CUDA: every budget's batch equals the target alone through the graphed target and the
    static drafter (its Triton kernels: head_dim 16); auto with no table measures the target's
    cost of each candidate length at the batch size before its first step and the drafter's cost
    during its first steps, into the budget's table (reused by the next decode)."""
    from tests.decoding.test_batched_static_drafter import StaticRowOracle

    target, adapter, head = graft("dflash", "qwen3", seed=2, extra=("target.random.head_dim=16",))
    for module in (target.model, adapter, head):
        module.to("cuda")
    k, vocab, stops = adapter.num_slots, target.shape.vocab_size, stop_token_ids(target)
    prompts = [[5, 9, 13, 4, 22], [7], [3, 14, 15, 9, 26, 5, 35, 8, 9], [40, 41]]
    plain = Engine(target, adapter, head, stop_ids=stops)
    refs = [plain.target_only(p, max_new_tokens=40).tokens for p in prompts]
    full = [p + r for p, r in zip(prompts, refs)]
    nudged = Engine(target, StaticRowOracle(adapter, full, [0, 1, 2, 3], 0.8, 0, vocab), head, stop_ids=stops)
    auto = VerifyBudget.parse("auto")
    for spec in ("0", "1", str(k), "auto"):
        budget = auto if spec == "auto" else VerifyBudget.parse(spec)
        for engine in (plain, nudged):
            got = engine.speculative_batch(prompts, max_new_tokens=40, budget=budget)
            assert [r.tokens for r in got] == refs, (spec, engine.last_budget)
            print(spec, engine.last_budget)
    costs = auto.costs
    assert costs.source == "measured" and set(costs.step_ms[4]) == {kk + 1 for kk in candidate_budgets(k)}
    assert costs.propose_ms[4] > 0 and all(ms > 0 for ms in costs.step_ms[4].values())
    print(costs.to_dict())
    graphs = {key[:2] for runner in plain._ragged_static.runners.values() for key in runner.graphs}
    assert {(4, 1), (4, 2), (4, k + 1)} <= graphs, graphs
    got = plain.speculative_batch(prompts, max_new_tokens=40, sampling=Sampling(temperature=1.0, seed=0),
                                  budget=auto)  # T > 0 runs (its law: the CPU chi-square above)
    assert all(1 <= len(r.tokens) <= 40 for r in got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_a_committed_tail_compacts_without_capturing_a_graph():
    """On CUDA: before an auto budget's prefill the plain step's graphs at every compacted size (powers of
    two below B) and attention bucket are captured (`prime_plain_tail`), once; a decode that commits and
    compacts then captures none, and its rows equal the target alone's."""
    from domino_graft.fast import graphs_captured

    target, adapter, head = graft("dflash", "qwen3", seed=2, extra=("target.random.head_dim=16",))
    for module in (target.model, adapter, head):
        module.to("cuda")
    k, stops = adapter.num_slots, stop_token_ids(target)
    prompts = [[5, 9, 13, 4, 22], [7], [3, 14, 15, 9, 26, 5, 35, 8, 9], [40, 41], [8, 8, 8]]
    engine = Engine(target, adapter, head, stop_ids=stops)
    refs = [r.tokens for r in engine.target_only_batch(prompts, max_new_tokens=300)]
    dear = VerifyCosts.from_dict({"step_ms": {"5": {"1": 1.0, "4": 20.0, "8": 30.0, str(k + 1): 40.0}},
                                  "propose_ms": {"5": 5.0}})
    budget = VerifyBudget.parse("auto", dear)
    first = engine.speculative_batch(prompts, max_new_tokens=300, budget=budget)
    assert [r.tokens for r in first] == refs
    plain = engine._ragged_static.runners[()]
    keys = {key[:3] for key in plain.graphs}
    assert {(b, 1, kv) for b in (1, 2, 4) for kv in (256, 512)} <= keys, keys
    budget.memory.clear()  # the next decode speculates, then commits again (not started committed)
    before = graphs_captured()
    again = engine.speculative_batch(prompts, max_new_tokens=300, budget=budget)
    assert [r.tokens for r in again] == refs and graphs_captured() == before
    assert engine.last_budget["k_hist"].get("0", 0) > 0


# ------------------------------------------------- the lean loop, probes, a shrinking batch
def test_a_plain_step_is_costed_by_the_lean_loop_once_it_has_samples():
    """K' = 0 leads to the target alone's lean loop (batched.py `_target_steps`), which costs less than
    a plain step through the chain: once the lean kind has MIN_OWN samples, K' = 0 is costed by them."""
    from domino_graft.decoding.budget import MIN_OWN

    costs = VerifyCosts.from_dict({"step_ms": {"8": {"1": 1.0, "4": 1.2, "8": 1.4, "16": 2.0}},
                                   "propose_ms": {"8": 0.3}})
    run = VerifyBudget("auto", costs=costs).start(15, 8, "cuda")
    run.decode_steps = 2
    for _ in range(MIN_OWN):
        run.add_wall(0, run.device_cost_ms(0) + 1.2)  # through the chain
    assert run.cost_ms(0) == pytest.approx(run.device_cost_ms(0) + 1.2)
    for _ in range(MIN_OWN - 1):
        run.add_wall(0, run.device_cost_ms(0) + 0.5, lean=True)
    assert run.cost_ms(0) == pytest.approx(run.device_cost_ms(0) + 1.2)  # too few lean samples yet
    run.add_wall(0, run.device_cost_ms(0) + 0.5, lean=True)
    assert run.cost_ms(0) == pytest.approx(run.device_cost_ms(0) + 0.5)
    assert run.excess["plain"] == [pytest.approx(1.2)] * MIN_OWN  # lean samples stay apart
    assert "lean" in run.report()["excess_ms"]


def test_the_acceptance_estimate_is_shared_by_every_batch_size():
    """What a decode at one batch size observes decides at every other (module docstring: a batch size
    where plain steps win would otherwise learn its acceptance only from the first steps of its
    decodes); fresh() budgets (the drafter alone, + Domino) keep their own estimates."""
    budget = VerifyBudget("auto", costs=H200)
    run = budget.start(15, 1, "cpu")
    for _ in range(12):
        run.observe(15, [2])  # two drafts accepted a step, the third refused
    run.finish()
    other = budget.start(15, 32, "cpu")
    assert other.alphas() == run.alphas()
    assert other.alphas()[0] > 0.9 and other.alphas()[2] < 0.2
    other.observe(15, [0] * 32)
    assert run.alphas()[0] < 0.7  # 32 rows refusing the first draft: every batch size sees them
    assert budget.fresh().start(15, 1, "cpu").alphas() == [0.8] * 15  # its own, the prior


def test_a_long_plain_stretch_ends_in_a_decode_that_checks_the_estimate():
    """A decode that starts committed observes nothing and the estimate loses IDLE_DECAY of its weight:
    after many such decodes it has drifted toward the optimistic prior, one decode speculates again,
    sees the drafter still miss and commits; the decodes after it start committed again. The checks
    are rare (dozens of decodes apart)."""
    costs = VerifyCosts.from_dict({"step_ms": {"4": {"1": 1.0, "4": 1.6, "8": 2.2, "16": 3.5}},
                                   "propose_ms": {"4": 0.2}})
    budget = VerifyBudget("auto", costs=costs)
    checks = []
    for decode in range(400):
        run = budget.start(15, 4, "cpu")
        if not run.starts_committed:
            checks.append(decode)
            while not run.committed():
                run.observe(run.choose(), [0] * 4)
        run.finish()
    assert checks[0] == 0 and len(checks) >= 3, checks  # the first decode, then checks now and then
    gaps = [b - a for a, b in zip(checks, checks[1:])]
    assert min(gaps) >= 50, checks


def test_a_shrunk_batch_costs_its_own_size_and_a_committed_tail_is_not_a_committed_decode():
    """resize: after a compaction the run costs steps at the new batch size and keeps the old size's
    proposes apart; a decode that commits only once shrunk has not committed at its first size, and the
    next decode there speculates (the estimate says drafts pay at B = 8)."""
    costs = VerifyCosts.from_dict({"step_ms": {"8": {"1": 1.0, "16": 1.5}, "1": {"1": 0.5, "16": 5.0}},
                                   "propose_ms": {"1": 4.0}})
    budget = VerifyBudget("auto", costs=costs)
    run = budget.start(15, 8, "cuda")
    run.propose_samples, run.rollout_samples = [0.3, 0.3, 0.3], [0.0, 0.0, 0.0]
    for _ in range(4):
        run.observe(run.choose(), [15] * 8)
    assert not run.committed()
    run.resize(1)
    assert run.batch == 1 and run.first_batch == 8 and costs.propose_ms[8] == pytest.approx(0.3)
    assert run.device_cost_ms(0) == 0.5 and run.propose_samples == []
    while not run.committed():
        run.observe(run.choose(), [0])
    assert not run.committed_whole
    report = run.finish().report()
    assert report["batch"] == 8 and report["last_batch"] == 1
    assert not budget.start(15, 8, "cuda").starts_committed


# ------------------------------------------------- a static batch runs until its slowest row ends
def _simulated_batch_tokens(alphas, k, rows, remaining, trials, seed=0):
    """Monte Carlo of `batch_tokens`: rows draw each step's gain from the alphas until `remaining` tokens;
    the batch's steps are its slowest row's."""
    import random

    rng = random.Random(seed)
    steps = 0
    for _ in range(trials):
        worst = 0
        for _ in range(rows):
            n = got = 0
            while got < remaining:
                x = 1
                for a in alphas[:k]:
                    if rng.random() >= a:
                        break
                    x += 1
                got, n = got + x, n + 1
            worst = max(worst, n)
        steps += worst
    return remaining * trials / steps


def test_batch_tokens_is_the_slowest_rows_rate():
    """`batch_tokens`: the spread of a step's gain (its exact variance) and the slowest of n rows (the
    renewal count's normal approximation) against a simulation, within 3%; one row or plain steps: the
    mean; more rows: fewer tokens per step."""
    from domino_graft.decoding.budget import batch_tokens, expected_max_normal, tokens_variance

    alphas = [0.55, 0.6, 0.57, 0.57, 0.74, 0.63, 0.58, 0.74, 0.64, 0.75, 0.81, 0.78, 0.8, 0.76, 0.78]
    assert tokens_variance([0.5], 1) == pytest.approx(0.25)  # 1 or 2 tokens, even odds
    assert tokens_variance([1.0] * 4, 4) == 0.0
    assert expected_max_normal(1) == 0.0 and expected_max_normal(16) == pytest.approx(1.766)
    assert batch_tokens(alphas, 15, 1, 96) == expected_tokens(alphas, 15)
    assert batch_tokens(alphas, 0, 64, 96) == 1.0
    by_rows = [batch_tokens(alphas, 15, n, 96) for n in (1, 4, 16, 64)]
    assert by_rows == sorted(by_rows, reverse=True)
    for n in (4, 16):
        assert batch_tokens(alphas, 15, n, 96) == pytest.approx(_simulated_batch_tokens(alphas, 15, n, 96, 200),
                                                                rel=0.03)


def test_gain_moments_are_the_per_candidate_sums_bit_for_bit():
    """`gain_moments` (one pass for every candidate, budget.py `_choice`) returns at each k what a pass for that
    k alone does (`expected_tokens`, `tokens_variance`), bit for bit, and the sums written out; k = 0 and k past
    the alphas included; `batch_tokens` given them equals `batch_tokens` computing its own."""
    import random

    from domino_graft.decoding.budget import batch_tokens, gain_moments, tokens_variance

    rng = random.Random(0)
    for _ in range(500):
        alphas = [rng.choice((0.0, 1.0)) if rng.random() < 0.1 else rng.random() for _ in range(rng.randint(0, 16))]
        ks = rng.sample(range(18), rng.randint(1, 5))
        moments = gain_moments(alphas, ks)
        assert sorted(moments) == sorted(ks)
        for k in ks:
            assert moments[k] == (expected_tokens(alphas, k), tokens_variance(alphas, k)), (alphas, k)
            # against the sums written out: P(X >= j) the products of the first j - 1 alphas
            reach = [1.0]
            for a in alphas[:k]:
                reach.append(reach[-1] * a)
            mean = sum(reach)
            second = sum((2 * j - 1) * p for j, p in enumerate(reach, start=1))
            assert moments[k][0] == pytest.approx(mean, rel=1e-12)
            assert moments[k][1] == pytest.approx(max(second - mean * mean, 0.0), rel=1e-9, abs=1e-12)
            rows, remaining = rng.choice((1, 2, 16, 64)), rng.randint(0, 200)
            assert batch_tokens(alphas, k, rows, remaining, moments[k]) == batch_tokens(alphas, k, rows, remaining)


def test_a_static_batch_goes_plain_where_its_slowest_row_would_not_pay():
    """H200 costs of f083e02's SmolLM2 run at B = 32 (a 16-token verify 2.6 ms, a lean step ~1.2): per
    row speculation pays (2.4 tokens a step), but a batch that runs until its slowest of 32 rows ends
    gains ~1.9 a step: plain. With one live row left it speculates (two rows are within SWITCH_MARGIN)."""
    costs = VerifyCosts.from_dict({"step_ms": {"32": {"1": 0.85, "4": 1.5, "8": 1.7, "16": 1.75}},
                                   "propose_ms": {"32": 0.55}})
    alphas = [0.57, 0.62, 0.59, 0.58, 0.65, 0.67, 0.64, 0.66, 0.69, 0.71, 0.82, 0.72, 0.83, 0.75, 0.81]
    run = VerifyBudget("auto", costs=costs).start(15, 32, "cuda")
    run.decode_steps = run.pool.steps = 2
    run.pool.reached, run.pool.accepted = [1000.0] * 15, [1000.0 * a for a in alphas]
    for kk, excess in ((15, 0.32), (0, 0.53)):
        for _ in range(3):
            run.add_wall(kk, run.device_cost_ms(kk) + excess)
    assert run.cost_ms(0) == pytest.approx(0.85 + 0.32)  # no lean samples yet: a speculative step's excess
    assert run.choose() == 15  # each row on its own
    assert run.choose(32, 96) == 0  # the batch, to its last row
    assert run.choose(1, 96) == 15
    assert run.choose(2, 96) == 0
    from domino_graft.decoding.budget import batch_tokens

    assert batch_tokens(alphas, 15, 32, 3) == 1.0  # a step gains at least a token: never below plain's


def test_a_propose_cost_needs_several_samples_and_skips_outliers():
    """add_propose: a sample over OUTLIER x the fastest (a graph capture between the events) does not count;
    the table takes a batch size's propose cost only from MIN_OWN samples that do, which add up over its
    decodes (at 63a585e a lone 1.9 s sample became B = 4's cost and kept the drafter plain; a decode that
    commits after one or two speculative steps still contributes them). A drafter slower than OUTLIER x the
    full verify still gets its cost (the GPU test's tiny target: until 4a3d5e9 every sample was dropped)."""
    from domino_graft.decoding.budget import OUTLIER

    costs = VerifyCosts.from_dict({"step_ms": {"4": {"1": 1.0, "16": 2.0}}})
    budget = VerifyBudget("auto", costs=costs)
    run = budget.start(15, 4, "cuda")
    run.add_propose(OUTLIER * 2.0 + 1, 1.5, slots=15)  # a capture in between
    run.add_propose(0.5, 0.15, slots=15)
    assert run.finish() is run and 4 not in costs.propose_ms  # one sample that counts: not the table's
    run = budget.start(15, 4, "cuda")  # the next decode at B = 4 goes on from it
    assert run.propose_samples == [OUTLIER * 2.0 + 1, 0.5] and run.times_propose("cuda")
    run.add_propose(0.6, 0.15, slots=15)
    run.add_propose(0.7, 0.15, slots=15)
    assert run.device_cost_ms(15) == pytest.approx(0.6 + 0.15 + 2.0)
    run.finish()
    assert costs.propose_ms[4] == pytest.approx(0.6) and not budget.start(15, 4, "cuda").times_propose("cuda")
    slow = VerifyBudget("auto", costs=VerifyCosts.from_dict({"step_ms": {"1": {"1": 0.07, "16": 0.08}}}))
    run = slow.start(15, 1, "cuda")
    for ms in (0.9, 1.0, 1.1):  # each over OUTLIER x the verify's 0.08 ms
        run.add_propose(ms, 0.3, slots=15)
    run.finish()
    assert slow.costs.propose_ms[1] == pytest.approx(1.0) and slow.costs.rollout_ms[1] == pytest.approx(0.02)


def test_fresh_budgets_share_the_targets_costs_and_keep_their_own_proposes():
    """One budget per decoder (bench/concurrency.py: the drafter alone and + Domino): the target's step
    costs are measured once for both, each keeps its own propose cost and its own memory."""
    base = VerifyBudget("auto", costs=VerifyCosts.from_dict({"step_ms": {"8": {"1": 1.0}}, "propose_ms": {"8": 0.3}}))
    a, b = base.fresh(), base.fresh()
    a.start(15, 8, "cuda").add_measured({4: 1.2})
    assert b.costs.step_ms[8] == {1: 1.0, 4: 1.2}
    a.costs.propose_ms[8] = 0.5
    assert b.costs.propose_ms[8] == 0.3 and base.costs.propose_ms[8] == 0.3
    a.start(15, 8, "cuda").finish()
    assert a.memory and not b.memory


def test_a_short_verify_is_costed_for_the_slots_it_rolls_out():
    """The drafter's forward costs the same at any K'; the head's rollout runs slot after slot, so the
    budget costs it per slot (ProposeTimer's two parts): a short K' pays for its own slots only. The
    table keeps both (rollout_ms per slot), and a bad rollout_ms is named."""
    costs = VerifyCosts.from_dict({"step_ms": {"8": {"1": 1.0, "4": 1.1, "8": 1.2, "16": 1.5}}})
    budget = VerifyBudget("auto", costs=costs)
    run = budget.start(15, 8, "cuda")
    run.decode_steps = 2
    for _ in range(3):
        run.add_propose(0.3, rollout_ms=0.75, slots=15)  # 0.05 ms a slot
    assert run.device_cost_ms(15) == pytest.approx(0.3 + 0.75 + 1.5)
    assert run.device_cost_ms(3) == pytest.approx(0.3 + 0.15 + 1.1)
    run.finish()
    assert costs.propose_ms[8] == pytest.approx(0.3) and costs.rollout_ms[8] == pytest.approx(0.05)
    again = VerifyCosts.from_dict(json.loads(json.dumps(costs.to_dict())))
    assert again.rollout(8) == pytest.approx(0.05) and again.propose(8) == pytest.approx(0.3)
    assert VerifyCosts.from_dict({"step_ms": {"8": {"1": 1.0}}}).rollout(8) == 0.0  # a table without: nothing added
    with pytest.raises(ValueError, match=r"rollout_ms\['8'\]: -1 is not a time"):
        VerifyCosts.from_dict({"step_ms": {"8": {"1": 1.0}}, "rollout_ms": {"8": -1}})


def test_a_plain_step_borrows_the_nearest_sizes_lean_loop_never_its_chain_steps():
    """A batch size with no lean samples of its own costs K' = 0 by the nearest size's lean loop (where
    K' = 0 leads); a plain step through the chain (dearer: it writes the drafter) is never borrowed, and a
    speculative one is (so an unseen size does not look cheap to speculate at)."""
    from domino_graft.decoding.budget import MIN_OWN

    costs = VerifyCosts.from_dict({"step_ms": {b: {"1": 1.0, "4": 1.5, "8": 2.0, "16": 3.0} for b in ("16", "32", "64")},
                                   "propose_ms": {"16": 0.3, "32": 0.3, "64": 0.3}})
    budget = VerifyBudget("auto", costs=costs)
    seen = budget.start(15, 64, "cuda")
    seen.decode_steps = 2
    for _ in range(MIN_OWN):
        seen.add_wall(0, seen.device_cost_ms(0) + 1.1)  # through the chain
        seen.add_wall(3, seen.device_cost_ms(3) + 0.9)
    seen.finish()  # what a decode at B = 64 learnt stays with the budget
    new = budget.start(15, 32, "cuda")
    assert new.cost_ms(0) == pytest.approx(1.0)  # no lean samples anywhere: the chain's 1.1 is not borrowed
    assert new.cost_ms(3) == pytest.approx(new.device_cost_ms(3) + 0.9)  # a speculative step's is
    for _ in range(MIN_OWN):
        seen.add_wall(0, seen.device_cost_ms(0) + 0.4, lean=True)
    assert new.cost_ms(0) == pytest.approx(1.4)  # the lean loop's, from B = 64


def test_a_committed_tail_compacts_as_the_target_alone_does(monkeypatch):
    """The plain tail of a batched chain that commits mid-decode compacts as its rows end, as the target
    alone's loop does (its graphs primed before the prefill: `StaticSession.prime_plain_tail`, a no-op
    off CUDA). Forced to move its rows (a compaction that reverses them), its outputs still equal the
    target alone's."""
    from domino_graft.decoding import batched

    target, adapter, head = graft("dflash", "qwen3", seed=2)
    k, stops = adapter.num_slots, stop_token_ids(target)
    prompts = [[5, 9, 13, 4, 22], [7], [3, 14, 15, 9, 26, 5, 35, 8, 9]]
    engine = Engine(target, adapter, head, stop_ids=stops)
    refs = [r.tokens for r in engine.target_only_batch(prompts, max_new_tokens=12)]
    moves = []

    def reverse_once(live):  # the first time the tail asks: every row kept, in reverse order
        if moves:
            return None
        moves.append(list(live))
        return list(range(len(live)))[::-1]

    monkeypatch.setattr(batched, "_shrink", reverse_once)
    dear = VerifyCosts.from_dict({"step_ms": {"3": {"1": 1.0, "4": 20.0, "8": 30.0, str(k + 1): 40.0}},
                                  "propose_ms": {"3": 5.0}})
    got = engine.speculative_batch(prompts, max_new_tokens=12, budget=VerifyBudget.parse("auto", dear))
    assert [r.tokens for r in got] == refs
    assert engine.last_budget["k_hist"].get("0", 0) > 0 and str(k) in engine.last_budget["k_hist"]
    assert moves  # the committed tail compacted (the speculating steps never ask: shrink=False)



def _budget_whose_batch_of_4_goes_plain() -> VerifyBudget:
    """An auto budget whose next decode at B = 4 starts committed: a 20 ms verify, nothing ever accepted."""
    costs = VerifyCosts.from_dict({"step_ms": {"4": {"1": 1.0, "16": 20.0}}, "propose_ms": {"4": 5.0}})
    budget = VerifyBudget("auto", costs=costs)
    first = budget.start(15, 4, "cuda")
    for _ in range(8):
        first.observe(15, [0] * 4)
    first.finish()
    return budget


def test_a_decode_that_starts_committed_samples_its_lean_loop(monkeypatch):
    """tick(0, lean=True) of a decode that chooses nothing (it started committed): its steps after the
    first are lean samples, so later batch sizes can borrow them (until 13bdded it never sampled)."""
    from domino_graft.decoding import budget as budget_mod

    budget = _budget_whose_batch_of_4_goes_plain()
    now = iter([10.0, 10.005, 10.0062, 10.0074])  # a 5 ms first step (its shapes), then two of 1.2 ms
    monkeypatch.setattr(budget_mod.time, "perf_counter", lambda: next(now))
    run = budget.start(15, 4, "cuda")
    assert run.starts_committed
    for _ in range(4):
        run.tick(0, lean=True)
    assert run.excess["lean"] == [pytest.approx(0.2), pytest.approx(0.2)]


def test_a_committed_decode_times_only_its_first_lean_steps(monkeypatch):
    """A decode that starts committed times LEAN_TIMED lean steps and no more (timing each one put such
    decodes ~0.9% under the target alone's at c8cab9e); a step after the cap is never sampled from a stale start."""
    from domino_graft.decoding import budget as budget_mod
    from domino_graft.decoding.budget import LEAN_TIMED

    budget = _budget_whose_batch_of_4_goes_plain()
    clock = iter(10.0 + 0.0012 * i for i in range(1000))  # 1.2 ms a step
    reads = []
    monkeypatch.setattr(budget_mod.time, "perf_counter", lambda: reads.append(1) or next(clock))
    run = budget.start(15, 4, "cuda")
    assert run.starts_committed
    for _ in range(10 * LEAN_TIMED):
        run.tick(0, lean=True)
    assert len(reads) == LEAN_TIMED + 1  # the clock is read by the timed steps only
    assert run.excess["lean"] == [pytest.approx(0.2)] * (LEAN_TIMED - 1)  # the first step (its shapes) is skipped
    run.tick(0)  # a step after the cap starts a span of its own: nothing sampled from the last timed step
    assert run.excess["plain"] == []


def test_an_untimed_batch_size_verifies_everything_until_its_proposes_are_timed():
    """On CUDA a batch size whose propose and rollout were never timed does not take them from other sizes
    (extended linearly they can be far off): it verifies all K until MIN_OWN steps have timed them, then
    chooses by its own costs. Off CUDA (a given table) it chooses at once."""
    from domino_graft.decoding.budget import MIN_OWN

    costs = VerifyCosts.from_dict({"step_ms": {b: {"1": 1.0, "16": 1.5} for b in ("1", "2", "64")},
                                   "propose_ms": {"1": 0.2, "2": 2.0}})  # extended to B = 64: ~115 ms
    budget = VerifyBudget("auto", costs=costs)
    warm = budget.start(15, 1, "cuda")
    for _ in range(4):
        warm.observe(15, [15])
    assert budget.start(15, 64, "cpu").choose() == 0  # the table's extension: plain
    run = budget.start(15, 64, "cuda")
    assert not run.starts_committed
    for _ in range(MIN_OWN):
        assert run.choose() == 15
        run.add_propose(0.3, rollout_ms=0.3, slots=15)
    assert run.choose() == 15  # by its own costs: 0.3 + 0.3 + 1.5 ms for ~16 tokens
    run.finish()
    assert costs.propose_ms[64] == pytest.approx(0.3)


def _whole_decode(budget, rate, accepted, device="cuda"):
    """One static batch of 8 rows under `budget` (K = 15): four steps whose rows each accept `accepted`
    drafts (at most K'), then its tokens/s by its arm (`rate[starts_committed]`)."""
    run = budget.start(15, 8, device)
    if not run.starts_committed:
        for _ in range(4):
            kk = run.choose()
            run.observe(kk, [min(accepted, kk)] * 8)
    run.finish(tokens=1000, seconds=1000 / rate[run.starts_committed])
    return run


WHOLE_COSTS = {"step_ms": {"8": {"1": 1.0, "4": 1.1, "8": 1.2, "16": 1.4}}, "propose_ms": {"8": 0.2},
               "rollout_ms": {"8": 0.01}}


def test_whole_decodes_turn_speculation_off_where_plain_decodes_ran_faster():
    """Whole decodes (budget.py, decoding/outcomes.py): on CUDA a static batch's decode reports its tokens/s by
    arm. Where the step model speculates, after OUTCOME_MIN speculative decodes plain ones run to compare;
    plain decodes ran faster, against the model's choice, so the arms run in turn until both windows are full
    (decoding/outcomes.py); then while plain decodes are the faster (medians) the size starts committed, except
    probes (the model's choice, PROBE_EVERY decodes apart, then twice as far each time one leaves the verdict).
    Off CUDA nothing is recorded."""
    from domino_graft.decoding.outcomes import OUTCOME_MIN, OUTCOME_WINDOW, PROBE_EVERY

    slow_spec = {False: 900.0, True: 1000.0}  # tokens/s of speculative / plain decodes
    budget = VerifyBudget("auto", costs=VerifyCosts.from_dict(WHOLE_COSTS))
    runs = [_whole_decode(budget, slow_spec, 12) for _ in range(2 * OUTCOME_WINDOW)]
    turns = 2 * (OUTCOME_WINDOW - OUTCOME_MIN)
    assert [r.arm for r in runs] == [None] * OUTCOME_MIN + ["plain"] * OUTCOME_MIN + ["spec", "plain"] * (turns // 2)
    assert all(r.starts_committed == (r.arm == "plain") for r in runs)  # plain: the target alone's decode
    assert budget.outcomes.summary(8)["model"] == "spec" and budget.outcomes.summary(8)["verdict"] == "plain"
    runs = [_whole_decode(budget, slow_spec, 12) for _ in range(4 * PROBE_EVERY)]
    assert runs[0].by_outcome and runs[0].report()["arm"] == "plain"
    probes = [i for i, r in enumerate(runs) if r.arm is None]
    # the step model's, which speculates here; each leaves plain the faster, so the next comes twice as late
    assert probes == [PROBE_EVERY - 1, 3 * PROBE_EVERY - 1]
    assert all(not runs[i].starts_committed for i in probes)
    assert all(r.starts_committed for i, r in enumerate(runs) if i not in probes)

    cpu = VerifyBudget("auto", costs=VerifyCosts.from_dict(WHOLE_COSTS))
    assert not any(_whole_decode(cpu, slow_spec, 12, "cpu").starts_committed for _ in range(5)) and not cpu.outcomes


def test_whole_decodes_turn_speculation_on_where_the_step_model_went_plain_but_drafts_ran_faster():
    """The other side (b0753cf, H100, B = 4: every decode started committed where speculating had run 1.16x the
    target alone): a size the step model sends plain gets speculative decodes to compare, and where those ran
    faster its decodes speculate at every step (K' > 0: the arm is the measured one, the model only chooses how
    many drafts), though the model's own estimate still says plain. The model's first decode speculated, then
    committed: mixed, no arm's sample; the arms then run alone in turn, until both windows are full (the
    measured arms disagree with the model: decoding/outcomes.py)."""
    from domino_graft.decoding.outcomes import OUTCOME_WINDOW

    fast_spec = {False: 1300.0, True: 1000.0}
    budget = VerifyBudget("auto", costs=VerifyCosts.from_dict(WHOLE_COSTS))
    n = 1 + 2 * OUTCOME_WINDOW + 6
    runs = [_whole_decode(budget, fast_spec, 0) for _ in range(n)]  # nothing accepted: the model says plain
    assert runs[0].arm is None and runs[0].chosen.get(15) and runs[0].chosen.get(0)
    assert runs[0].measured_arm() == "mixed" and budget.outcomes.summary(8)["mixed"] == 1
    assert [r.arm for r in runs[1:]] == ["spec", "plain"] * OUTCOME_WINDOW + ["spec"] * 6
    assert budget.outcomes.summary(8)["model"] == "plain"
    for r in runs[1:]:
        assert r.starts_committed == (r.arm == "plain")
        if r.arm == "spec":
            assert 0 not in r.chosen and sum(r.chosen.values()) == 4 and r.measured_arm() == "spec"
    assert budget.outcomes.settled(8) and budget.outcomes.summary(8)["spec"]["median_tokens_per_s"] == 1300.0


def test_the_solo_chain_keeps_its_whole_decodes_under_solo_and_its_spec_arm_verifies_all_k():
    """The solo chain (key "solo", candidates all K or none: decoding/chain.py) measures its whole decodes too:
    at T = 1 on the H200 (38066dc) B = 1's first timed decodes speculated at break-even and the row ended 0.98x
    the target alone. A "spec" arm there never chooses the target alone's loop; other keys are not whole decodes."""
    from domino_graft.decoding.outcomes import OUTCOME_MIN

    budget = VerifyBudget("auto", costs=VerifyCosts.from_dict({"step_ms": {"1": {"1": 1.0, "16": 1.2}},
                                                              "propose_ms": {"1": 0.3}, "rollout_ms": {"1": 0.01}}))
    for _ in range(OUTCOME_MIN):
        budget.outcomes.add("solo", "plain", 100, 1.0)
    run = budget.start(15, 1, "cuda", key="solo")
    run.candidates = [0, 15]
    assert run.arm == "spec" and not run.starts_committed
    for _ in range(6):
        kk = run.choose()
        run.observe(kk, [0])  # nothing accepted: the step model alone would go plain
        assert kk == 15
    run.finish(tokens=100, seconds=0.5)
    assert budget.outcomes.summary("solo")["spec"] == {"decodes": 1, "median_tokens_per_s": 200.0}
    assert budget.start(15, 1, "cuda", key=("rebuilt", 1)).arm is None


def test_a_cycle_budget_meets_every_k_after_every_other_and_stays_lossless():
    """"cycle" (a warm-up's budget: bench/concurrency.py runs it before timing): K' steps through every
    candidate after every other, so a decode long enough meets each ordered pair of K' in consecutive
    steps (the shapes a step meets depend on the K' before it); its output is the target alone's."""
    target, adapter, head = graft("dflash", "qwen3", seed=2)
    k, stops = adapter.num_slots, stop_token_ids(target)
    budget = VerifyBudget("cycle")
    run = budget.start(k, 3, "cpu")
    steps = [run.choose() for _ in range(2 * len(run.candidates) ** 2)]
    pairs = set(zip(steps, steps[1:]))
    assert pairs == {(a, b) for a in run.candidates for b in run.candidates}, pairs
    prompts = [[5, 9, 13, 4, 22], [7], [3, 14, 15, 9, 26, 5, 35, 8, 9]]
    engine = Engine(target, adapter, head, stop_ids=stops)
    refs = [r.tokens for r in engine.target_only_batch(prompts, max_new_tokens=24)]
    got = engine.speculative_batch(prompts, max_new_tokens=24, budget=budget)
    assert [r.tokens for r in got] == refs
    assert set(engine.last_budget["k_hist"]) == {str(c) for c in run.candidates}
    with pytest.raises(ValueError, match="valid: full, fixed, auto, cycle"):
        VerifyBudget("sometimes")


def test_slot_counts_and_acceptance_match_counting_row_by_row():
    """The per-slot counts by equal (accepted, K') pairs (acceptance.slot_counts: a batched decode's rows at its
    end, the shared estimate per step) equal counting each row's slots one by one, K' = 0 steps included."""
    import random

    from domino_graft.decoding.acceptance import DECAY, Acceptance, slot_counts

    rng = random.Random(0)
    for trial in range(50):
        k = rng.randint(1, 16)
        steps = [(rng.randint(0, kk), kk) for kk in (rng.randint(0, k) for _ in range(rng.randint(0, 40)))]
        reached, accepted = [0] * k, [0] * k
        for a, kk in steps:
            for j in range(min(a + 1, kk)):
                reached[j] += 1
                accepted[j] += j < a
        assert slot_counts(k, steps) == (reached, accepted), (trial, steps)
        pool, by_row = Acceptance(k), [[0.0] * k, [0.0] * k]
        for kk in (rng.randint(0, k) for _ in range(5)):
            rows = [rng.randint(0, kk) for _ in range(rng.randint(0, 64))]
            pool.observe(kk, rows)
            by_row = [[x * DECAY for x in xs] for xs in by_row]
            for a in rows:
                for j in range(min(a + 1, kk)):
                    by_row[0][j] += 1
                    by_row[1][j] += j < a
        assert pool.reached == pytest.approx(by_row[0], rel=1e-12) and pool.accepted == pytest.approx(by_row[1],
                                                                                                      rel=1e-12)

