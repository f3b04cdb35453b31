"""Admissions in cohorts (serving/cohorts.py): the gate's rule, and serve's worker admitting rows freed apart in
one call while every answer stays its target alone's."""

from __future__ import annotations

import pytest

from domino_graft.serving import cohorts
from domino_graft.serving.cohorts import Cohorts
from tests.serving.test_scheduler import _cancel_and_check_each_against_the_target_alone, _job, engine  # noqa: F401


@pytest.fixture(autouse=True)
def _unforced(monkeypatch):
    """The gate as its callers set it, whatever DOMINO_GRAFT_COHORTS says in this environment."""
    monkeypatch.setattr(cohorts, "FORCED", None)


def test_nothing_is_held_before_an_admission_was_measured_or_with_the_gate_off():
    assert Cohorts(True).due(0.0)
    off = Cohorts(False)
    off.admitted(1.0)
    off.stepped(0.001, 1, 32, now=0.0)
    assert off.due(0.0)


def test_the_queue_is_held_until_the_free_rows_have_sat_out_one_admission():
    """Median admission 8 ms; steps of 1 ms with 4 of 32 rows free and fillable, and a row always about to end:
    0.125 ms of rent a step, so the 64th step pays it."""
    gate = Cohorts(True)
    for s in (0.008, 0.5, 0.001):  # the median, not the mean: one slow admission does not hold the queue
        gate.admitted(s)
    for step in range(1, 65):
        assert not gate.due(now=0.0), step
        gate.stepped(0.001, 4, 32, now=0.0, soonest_left=0, tokens_per_row=1.0)
    assert gate.due(now=0.0)
    gate.admitted(0.008)
    assert not gate.due(now=0.0), "the rent starts again after an admission"


@pytest.mark.parametrize("soonest_left, tokens_per_row, held", [
    (6, 2.0, True),  # 3 blocks to the next end: 0.375 ms of rent to come, under the 8 ms an admission costs
    (200, 2.0, False),  # 100 blocks: 12.5 ms of rent before the next row frees, more than an admission
    (None, 2.0, False),  # no row running
    (6, 0.0, False),  # nothing emitted: no end foreseen
])
def test_the_queue_is_held_only_for_an_end_foreseen_within_the_rent(soonest_left, tokens_per_row, held):
    gate = Cohorts(True)
    gate.admitted(0.008)
    gate.stepped(0.001, 4, 32, now=0.0, soonest_left=soonest_left, tokens_per_row=tokens_per_row)
    assert gate.due(now=0.0) is not held


def test_a_request_waits_at_most_wait_admissions_admissions():
    gate = Cohorts(True)
    gate.admitted(0.01)
    gate.stepped(0.001, 1, 32, now=100.0, soonest_left=0, tokens_per_row=1.0)  # a free row meets a request here
    assert not gate.due(now=100.0 + 0.5 * cohorts.WAIT_ADMISSIONS * 0.01)
    assert gate.due(now=100.0 + 1.01 * cohorts.WAIT_ADMISSIONS * 0.01)


def test_rows_without_a_request_to_fill_them_pay_no_rent():
    gate = Cohorts(True)
    gate.admitted(0.002)
    gate.stepped(0.001, 3, 4, now=0.0, soonest_left=0, tokens_per_row=1.0)
    gate.stepped(0.001, 0, 4, now=1.0)  # the queue ran dry: the wait starts over
    assert gate.idle_s == 0.0 and gate.waiting_since is None and not gate.due(now=5.0)


@pytest.mark.parametrize("target_only", [False, True])
def test_rows_freed_apart_are_admitted_in_one_call_and_each_equals_its_target_alone(engine, target_only,
                                                                                    monkeypatch):
    """Three short rows end at their own blocks beside a long one while three requests queue: with an admission
    priced far above the rent, the gate holds the queue until WAIT_ADMISSIONS of them after the first freed row, by
    which time all three have ended, and admits the three requests in one call."""
    from domino_graft.serving.scheduler import Scheduler

    sched = Scheduler(engine, max_batch=4, max_queue=16, target_only=target_only, pad_batches=True, cohorts=True)
    sched.cohorts.admitted(0.5 / cohorts.WAIT_ADMISSIONS)  # held 0.5 s: steps of the tiny model pay little rent
    sched.start()
    try:
        long = _job(engine, [5, 6, 7, 8], 1500)
        first = [_job(engine, [9, 3, 4], 3), _job(engine, [11, 2], 7), _job(engine, [4, 4, 4, 4, 4], 11)]
        for job in [long, *first]:
            sched.submit(job)
        later = [_job(engine, [7, 1, 3, 9, 2, 8], 11), _job(engine, [12], 8), _job(engine, [3, 5], 10)]
        for job in later:
            sched.submit(job)
        for job in [*first, *later]:
            assert job.done.wait(60)
        assert long.finish_reason is None, "the long request should still be decoding"
        assert (sched.admissions, sched.admitted_in_place, sched.rebuilds) == (1, 3, 1)
        _cancel_and_check_each_against_the_target_alone(engine, long, [*first, *later])
    finally:
        assert sched.stop(30)
