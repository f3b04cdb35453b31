"""serve's measured arms (serving/windows.py), forced on here (CPU; windows of no length, so every block ends one):
each window's run takes the arm the outcomes give, and the arms are made to take turns (plain, speculative, the
step model's), so that a batch goes from committed plain steps, one still under way, to speculative blocks, and
from a block drafted ahead to plain steps, again and again. Every greedy request stays the target alone's (dropping
the read of the plain step under way before a speculative block fails it), and windows of each arm report their
tokens/s to the outcomes."""

from __future__ import annotations

import itertools

import pytest
import torch

from domino_graft.decoding.budget import VerifyBudget, VerifyCosts
from domino_graft.decoding.outcomes import Outcomes
from domino_graft.sampling import Sampling
from domino_graft.serving import batch as batch_module
from domino_graft.serving import windows
from tests.serving.harness import FAMILIES, apply_tiny
from tests.serving.test_steps_ahead import LoggedReader, _force, _serve, _setup

COSTS = {"step_ms": {"3": {"1": 1.0, "4": 1.2, "8": 1.4, "16": 1.8}}, "propose_ms": {"3": 0.3},
         "rollout_ms": {"3": 0.05}}


def test_windows_taking_turns_keep_every_request_the_target_alone(monkeypatch):
    arms = itertools.cycle(["plain", "spec", None, "plain", "plain", "spec"])
    monkeypatch.setattr(Outcomes, "arm_for", lambda self, batch: next(arms))
    monkeypatch.setattr(batch_module, "windows_on", lambda budget, device: budget is not None)
    monkeypatch.setattr(windows, "WINDOW_S", 0.0)
    added = []
    add = Outcomes.add

    def recorded(self, b, arm, *a, **kw):
        added.append((b, arm))
        return add(self, b, arm, *a, **kw)

    monkeypatch.setattr(Outcomes, "add", recorded)
    for seed in range(3):
        engine, oracle, prompts, budgets, stops, refs = _setup(seed)
        for ahead in (False, True):
            _force(monkeypatch, ahead, plain=ahead)
            oracle.log.clear()
            LoggedReader.log = oracle.log
            budget = VerifyBudget("auto", costs=VerifyCosts.from_dict(COSTS))
            got, _ = _serve(engine, prompts, budgets, stops, [Sampling()] * len(prompts), rows=3, budget=budget)
            assert got == refs, f"seed {seed} ahead {ahead}"
    assert {arm for _, arm in added} >= {"plain", "spec"}  # windows of each arm reported their tokens/s


def test_an_admission_is_no_step_of_the_budgets_clock(monkeypatch):
    """A prompt's admission into a batch in flight (its prefill: a request's cost) falls between two ticks of the
    verify budget's wall clock; that interval is not sampled as a step (BudgetRun.restart_clock), and the scheduler's
    admissions in place call it."""
    import time

    from domino_graft.decoding.budget import BudgetRun

    # device costs far over the sleep: a slow machine's wall stays under the outlier bound (budget.py OUTLIER)
    slow = {"step_ms": {"3": {"1": 50.0, "4": 60.0, "8": 70.0, "16": 80.0}}, "propose_ms": {"3": 10.0}}
    budget = VerifyBudget("auto", costs=VerifyCosts.from_dict(slow))
    for restart in (False, True):
        run = budget.start(3, 3, "cuda")
        run.choose(), run.choose()  # past a decode's first step, which is never sampled
        run.tick(3)
        time.sleep(0.002)
        if restart:
            run.restart_clock()
        run.tick(3)
        assert len(run.excess.get("spec", [])) == (0 if restart else 1)

    restarts = []
    restart_clock = BudgetRun.restart_clock
    monkeypatch.setattr(BudgetRun, "restart_clock", lambda self: (restarts.append(1), restart_clock(self)))
    engine, oracle, prompts, budgets, stops, refs = _setup(1)
    got, s = _serve(engine, prompts, budgets, stops, [Sampling()] * len(prompts), rows=3,
                    budget=VerifyBudget("auto", costs=VerifyCosts.from_dict(COSTS)))
    assert got == refs and s.admitted_in_place > 0 and len(restarts) >= 1


def _stretch(engine, prompts, catch_up: bool, monkeypatch):
    """A ChainBatch that speculates, runs lean plain steps (committed), then speculates again -> (its drafter's
    context K of each row at the positions before that block, those positions, the rows' contexts)."""
    from domino_graft.serving.batch import ChainBatch
    from domino_graft.serving.rows import BatchRow

    if not catch_up:  # the stretch ends, nothing given back (as before serving/lag.py)
        monkeypatch.setattr(ChainBatch, "_catch_up", lambda self: self.lag.holes(self.pos_h, self.live))
    rows = [BatchRow(p, None, len(p) + 40, Sampling(), lambda ids: False, lambda: True) for p in prompts]
    batch = ChainBatch(engine, rows, use_head=True, budget=VerifyBudget("auto", costs=VerifyCosts.from_dict(COSTS)))
    assert batch.drafter is not None  # the static DFlash drafter beside the static cache
    for _ in range(2):
        batch.step()
    batch.run.commit()
    for _ in range(9):
        batch.step()
    assert batch.lag and batch.run.chosen.get(0, 0) >= 9
    batch.run.plain_streak = 0  # a speculative window's run
    held = list(batch.pos_h)
    assert all(len(r.context) == p for r, p in zip(rows, held))
    contexts = [list(r.context) for r in rows]
    batch.step()
    return [k.clone() for k in batch.drafter.k], held, contexts


def test_a_plain_stretch_leaves_the_drafter_no_hole(monkeypatch):
    """After lean plain steps, the next speculative block gives the drafter what they decoded (serving/lag.py): its
    context at every position before that block's anchor is what a batch prefilled with the same tokens holds. Without
    the catch-up the plain steps' positions keep stale entries (on the real SmolLM2 a speculative block accepted
    1.04 drafts a row after plain windows against 1.90 without them: bench/results/drafter_lag_cpu.json)."""
    from domino_graft.decoding import Engine
    from domino_graft.serving.batch import ChainBatch
    from domino_graft.serving.rows import BatchRow
    from tests.decoding.test_decoding import build

    target, adapter, head = build(3, block_size=4)
    engine = Engine(target, adapter, head, stop_ids=())
    prompts = [[5, 9, 2, 7, 11, 3], [4, 8], [6, 1, 12, 10, 2, 9, 13, 5, 7, 3, 8]]
    for catch_up in (True, False):
        got, held, contexts = _stretch(engine, prompts, catch_up, monkeypatch)
        rows = [BatchRow(c, 0, len(c) + 40, Sampling(), lambda ids: False, lambda: True) for c in contexts]
        ref = ChainBatch(engine, rows, use_head=False).drafter.k  # its prefill of each row's whole context
        hole = [slice(len(p), n) for p, n in zip(prompts, held)]  # what the plain steps decoded, at the least
        close = [torch.allclose(g[b, :, :n], r[b, :, :n], atol=1e-5) for g, r in zip(got, ref)
                 for b, n in enumerate(held)]
        stale = [not torch.allclose(g[b, :, s], r[b, :, s], atol=1e-3) for g, r in zip(got, ref)
                 for b, s in enumerate(hole)]
        if catch_up:
            assert all(close)
        else:
            assert any(stale)
        monkeypatch.undo()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_catches_up_after_plain_windows_and_stays_the_target_alone(family, tmp_path, monkeypatch):
    """Plain and speculative windows taking turns behind each family's drafter (the static DFlash drafter's writes, the
    eager adapters' `observe`): the catch-ups run and every request stays the target alone's."""
    import random

    from domino_graft.decoding import Engine
    from domino_graft.loading import load_run_or_bundle
    from domino_graft.serving.batch import ChainBatch

    loaded = load_run_or_bundle(str(apply_tiny(family, tmp_path / family)))
    engine = Engine(loaded.target, loaded.adapter, loaded.head, stop_ids=())
    rng = random.Random(7)
    prompts = [[rng.randrange(2, 90) for _ in range(rng.randrange(2, 20))] for _ in range(7)]
    budgets = [rng.randrange(8, 30) for _ in prompts]
    refs = [engine.target_only(p, max_new_tokens=m).tokens for p, m in zip(prompts, budgets)]
    arms = itertools.cycle(["plain", "plain", "spec", None, "spec"])
    monkeypatch.setattr(Outcomes, "arm_for", lambda self, batch: next(arms))
    monkeypatch.setattr(batch_module, "windows_on", lambda budget, device: budget is not None)
    monkeypatch.setattr(windows, "WINDOW_S", 0.0)
    caught = []
    catch_up = ChainBatch._catch_up
    monkeypatch.setattr(ChainBatch, "_catch_up", lambda self: (caught.append(self.lag.behind), catch_up(self)))
    costs = VerifyCosts.from_dict({"step_ms": {str(b): {"1": 1.0, "4": 1.2, "8": 1.4, "16": 1.8} for b in (1, 2, 3)},
                                   "propose_ms": {str(b): 0.3 for b in (1, 2, 3)}})
    got, _ = _serve(engine, prompts, budgets, [[]] * len(prompts), [Sampling()] * len(prompts), rows=3,
                    budget=VerifyBudget("auto", costs=costs))
    assert got == refs
    assert any(caught)  # speculative blocks came after plain steps with holes to fill


def test_a_windows_tokens_per_s_is_scaled_to_a_full_batch(monkeypatch):
    """Where rows end and none is admitted (the queue drains) a window emits a fraction of a full one's tokens at the
    same cost per step (the batch runs at its size): its rate is scaled by its live rows, so the arm that ran it is not
    measured slower for it (serving/windows.py)."""
    clock = [0.0]
    monkeypatch.setattr(windows.time, "perf_counter", lambda: clock[0])
    rates = []
    monkeypatch.setattr(Outcomes, "add", lambda self, b, arm, tokens, seconds, **kw:
                        rates.append(tokens / seconds))
    w = windows.Windows(VerifyBudget("auto", costs=VerifyCosts.from_dict(COSTS)), 3, 4, emitted=0)
    run = w.run()
    for live, emitted in ((4, 40), (1, 50), (2, 70)):  # 10 steps of a window, one token a live row each
        for _ in range(10):
            w.count(live)
        clock[0] += 0.1
        run = w.turn(run, emitted, None)
    assert rates == pytest.approx([400.0] * 3)
