"""serve's measured arms (serving/windows.py), forced on here (CPU; windows of no length, so every block ends one):
each window's run takes the arm the outcomes give, and the arms are made to take turns (plain, speculative, the
step model's), so that a batch goes from committed plain steps, one still under way, to speculative blocks, and
from a block drafted ahead to plain steps, again and again. Every greedy request stays the target alone's (dropping
the read of the plain step under way before a speculative block fails it), and windows of each arm report their
tokens/s to the outcomes."""

from __future__ import annotations

import itertools

from domino_graft.decoding.budget import VerifyBudget, VerifyCosts
from domino_graft.decoding.outcomes import Outcomes
from domino_graft.sampling import Sampling
from domino_graft.serving import batch as batch_module
from domino_graft.serving import windows
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
