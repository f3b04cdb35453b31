"""The server's warm start (serving/warmup.py), in process on a CPU: the static caches are reserved
once at full size and every later batch reuses them; the warm-up visits every shape (the target's
graph keys, the drafter's captured calls) that traffic then meets; greedy outputs stay the target
alone's; /metrics counts no warm-up row; /health says "warming" until done; a warm start that fails
stops `serve` with one line."""

from __future__ import annotations

import threading
import time

import pytest

from .test_scheduler import _job, _until


@pytest.fixture
def engine(tiny_run):
    """A fresh engine: no static cache yet."""
    from domino_graft.decoding import Engine, stop_token_ids
    from domino_graft.loading import load_run_or_bundle

    loaded = load_run_or_bundle(str(tiny_run))
    return Engine(loaded.target, loaded.adapter, loaded.head, stop_ids=stop_token_ids(loaded.target))


def _auto_budget():
    from domino_graft.decoding.budget import VerifyBudget, VerifyCosts

    # the verify dear at 4 rows: auto mixes plain steps, short and full verifies
    costs = VerifyCosts.from_dict({"step_ms": {"1": {"1": 1.0, "4": 1.1, "8": 1.2}, "4": {"1": 1.0, "4": 2.5, "8": 5.0}},
                                   "propose_ms": {"1": 0.2, "4": 0.4}})
    return VerifyBudget.parse("auto", costs)


def _submit_all(sched, jobs) -> None:
    for job in jobs:
        sched.submit(job)
        time.sleep(0.03)  # arrivals in flight: rebuilds at several batch sizes
    for job in jobs:
        assert job.done.wait(120), job.prompt_ids


def _deep_row_and_three_short(engine, sched, long_tokens: int):
    """A long request whose row decodes from position 300 on (so an admission parks past the first kv
    bucket) beside three short ones, all submitted. -> (long, the short jobs)."""
    long = _job(engine, [5, 6, 7, 8] * 75, long_tokens)
    first = [_job(engine, [9, 3, 4], 6), _job(engine, [11, 2], 9), _job(engine, [4, 4, 4, 4, 4], 5)]
    for job in [long, *first]:
        sched.submit(job)
    return long, first


def _serve(sched, jobs) -> None:
    sched.start()
    try:
        _submit_all(sched, jobs)
    finally:
        assert sched.stop(30)


def test_the_cache_is_reserved_once_and_every_batch_reuses_it(engine, monkeypatch):
    """Rows of every admitted size (prompt + max_tokens up to max_model_len) and batch size run on the
    cache and drafter the warm start made: no FastLM or static drafter is built after it; the outputs
    are the target alone's; the metrics count the requests only."""
    from domino_graft import fast
    from domino_graft.adapters.dflash import fast as dflash_fast
    from domino_graft.serving.metrics import Metrics
    from domino_graft.serving.scheduler import Scheduler

    built, drafters = [], []
    from_hf, drafter_init = fast.FastLM.from_hf, dflash_fast.StaticDFlashDrafter.__init__
    monkeypatch.setattr(fast.FastLM, "from_hf", lambda model, **kw: (built.append(kw), from_hf(model, **kw))[1])

    def init(self, adapter, max_len, max_batch=1):
        drafters.append((max_len, max_batch))
        drafter_init(self, adapter, max_len, max_batch)

    monkeypatch.setattr(dflash_fast.StaticDFlashDrafter, "__init__", init)
    positions, k = 64, engine.adapter.num_slots
    metrics = Metrics()
    sched = Scheduler(engine, max_batch=4, max_queue=16, metrics=metrics, warm_start=positions)
    assert sched.warming and sched.batch_sizes() == [1, 2, 3, 4]
    prompts = [([5, 6, 7, 8] * 10, positions - 40), ([9, 3, 4], 12), ([11, 2] * 15, 25), ([7, 7, 1, 2, 3], 18),
               ([3] * 63, 1), ([8, 9, 10], positions - 3), ([4, 5], 30)]
    jobs = [_job(engine, p, n) for p, n in prompts]
    sched.start()
    try:
        _until(lambda: not sched.warming, 60)
        assert built == [{"max_batch": 4, "max_len": built[0]["max_len"]}]
        assert built[0]["max_len"] >= positions + k + 1
        assert len(drafters) == 1 and drafters[0][1] == 4 and drafters[0][0] >= positions + k + 1
        reserved = engine._ragged_static
        assert metrics.verify_steps._value.get() == 0 and metrics.generation_tokens._value.get() == 0
        assert metrics.registry.get_sample_value("domino_graft_batch_size") == 0
        assert not [s for m in metrics.requests.collect() for s in m.samples]  # no request finished
        _submit_all(sched, jobs)
    finally:
        assert sched.stop(30)
    assert len(built) == 1 and len(drafters) == 1 and engine._ragged_static is reserved
    assert sched.warm.status()["cache_kept"] is True
    for job, (p, n) in zip(jobs, prompts):
        assert job.tokens == engine.target_only(p, max_new_tokens=n).tokens, (p, n)
    assert metrics.generation_tokens._value.get() == sum(len(j.tokens) for j in jobs)
    assert sum(s.value for m in metrics.requests.collect() for s in m.samples) == len(jobs)


def _record_keys(monkeypatch) -> set:
    """The keys of every target forward (captured layers, B, T, kv bucket, logits kept) and drafter call
    from now on, into the set returned: on a CPU nothing is captured, but each key is a graph on CUDA."""
    from domino_graft.adapters.dflash import fast as dflash_fast
    from domino_graft.fast import GraphRunner

    seen: set = set()
    runner_call, drafter_call = GraphRunner.__call__, dflash_fast.StaticDFlashDrafter._call

    def record(self, ids, pos=None, *, logits_to_keep=0, pooled=False):
        b, t = ids.shape
        end = (pos if isinstance(pos, int) else max(pos)) + t  # one row's position comes as an int
        seen.add(("target", self.capture, b, t, self.bucket(end), logits_to_keep))
        return runner_call(self, ids, pos, logits_to_keep=logits_to_keep, pooled=pooled)

    def record_drafter(self, key, fn, pool=None):
        seen.add(("drafter", *key))
        return drafter_call(self, key, fn, pool)

    monkeypatch.setattr(GraphRunner, "__call__", record)
    monkeypatch.setattr(dflash_fast.StaticDFlashDrafter, "_call", record_drafter)
    return seen


def _pad_drafter_prefills(monkeypatch, on: bool) -> None:
    """on: the static drafter's prefills through CUDA's padded shapes and their keys (adapters/dflash/fast.py
    `_prefill_write`), run eagerly here."""
    from domino_graft.adapters.dflash import fast as dflash_fast

    monkeypatch.setattr(dflash_fast.StaticDFlashDrafter, "PAD_PREFILLS", True if on else None)


@pytest.mark.parametrize("target_only, pad_prefills", [(False, False), (True, False), (False, True)])
def test_the_warm_start_visits_every_shape_traffic_meets(engine, monkeypatch, target_only, pad_prefills):
    """Padded batches (1, 2, 4 rows) under the auto budget, rows reaching 3 kv buckets: every target
    forward's graph key (captured layers, B, T, kv bucket, logits kept) and every drafter call key met
    in traffic was met in the warm-up, which covered each (B, T, bucket) the loop can build; with the drafter's
    prefills padded as on CUDA, their keys too."""
    from domino_graft.serving.scheduler import Scheduler

    _pad_drafter_prefills(monkeypatch, pad_prefills)
    seen = _record_keys(monkeypatch)
    positions = 600
    sched = Scheduler(engine, max_batch=4, max_queue=16, budget=None if target_only else _auto_budget(),
                      pad_batches=True, target_only=target_only, warm_start=positions, sweep=True)
    assert sched.batch_sizes() == [1, 2, 4]
    prompts = [([5, 6, 7, 8] * 130, 78), ([9, 3, 4], 60), ([11, 2] * 100, 90), ([7, 7, 1, 2, 3], 40),
               ([4, 5] * 270, 55)]
    jobs = [_job(engine, p, n) for p, n in prompts]
    _serve(sched, [])
    warm = set(seen)
    report = sched.warm.report
    assert report["kv_buckets"] == 3 and report["cache"]["rows"] == 4
    capture = () if target_only else tuple(engine.adapter.capture_layers())
    lengths = [1] if target_only else report["verify_lengths"]
    assert lengths == [1] or lengths == [1, 4, engine.adapter.num_slots + 1]
    for b in (1, 2, 4):
        for bucket in (256, 512, 768):
            for t in lengths:
                assert ("target", capture, b, t, bucket, 0) in warm, (b, t, bucket)
            assert ("target", (), b, 1, bucket, 0) in warm  # the target alone's step (committed plain loop)
    seen.clear()
    # padded batches, admission by rebuild (test_the_warm_start_visits_the_prefills_of_admission_in_place
    # admits in place)
    _serve(Scheduler(engine, max_batch=4, max_queue=16, budget=None if target_only else _auto_budget(),
                     pad_batches=True, target_only=target_only, admit_in_place=False), jobs)
    assert seen and seen <= warm, sorted(seen - warm)
    assert {key[4] for key in seen if key[0] == "target"} >= {768}  # traffic reached the last bucket
    for job, (p, n) in zip(jobs, prompts):
        assert job.tokens == engine.target_only(p, max_new_tokens=n).tokens, (p, n)


@pytest.mark.parametrize("target_only, admit_rows, pad_prefills",
                         [(False, True, False), (True, True, False), (False, False, False), (False, False, True)])
def test_the_warm_start_visits_the_prefills_of_admission_in_place(engine, monkeypatch, target_only, admit_rows,
                                                                   pad_prefills):
    """Requests admitted into freed rows while the row in flight is deep in the cache: their prefills'
    graph keys and the drafter's write of the pending block before them were all met in the warm-up, which runs
    them because the scheduler admits in place (a default wherever the warm start sweeps). An admission runs the
    admitted row alone, moved to the front of the cache (decoding/session.py `admission_rows`): a batch of one at
    its own kv bucket; with DOMINO_GRAFT_ADMIT_ROWS=0 the whole batch, at the larger bucket the parked row's end
    sets."""
    from domino_graft.decoding import session
    from domino_graft.fast import KV_BLOCK, kv_bucket, prefill_length
    from domino_graft.serving.scheduler import Scheduler

    monkeypatch.setattr(session, "ADMIT_ROWS", admit_rows)
    _pad_drafter_prefills(monkeypatch, pad_prefills)
    seen = _record_keys(monkeypatch)
    positions = 600
    # no budget: every block verifies K, so only an admission writes a pending block of K + 1 alone
    sched = Scheduler(engine, max_batch=4, max_queue=16, pad_batches=True, target_only=target_only,
                      warm_start=positions, sweep=True)
    assert sched.admit_in_place
    _serve(sched, [])
    warm = set(seen)
    report = sched.warm.report
    max_len = report["cache"]["positions"]
    assert report["admission_prefills"] >= 2 * report["prefill_lengths"]  # batch sizes 2 and 4, every length
    seen.clear()
    sched = Scheduler(engine, max_batch=4, max_queue=16, pad_batches=True, target_only=target_only,
                      admit_in_place=True)
    sched.start()
    try:
        long, first = _deep_row_and_three_short(engine, sched, 280)
        later = [_job(engine, [7, 1, 3, 9, 2, 8], 11), _job(engine, [12, 3] * 20, 8)]  # padded to 16 and 64
        for job, at in zip(later, (0, 230)):
            _until(lambda at=at: all(j.finish_reason for j in first) and len(long.tokens) > at, 120)
            sched.submit(job)
            assert job.done.wait(60)
        assert long.finish_reason is None and sched.admitted_in_place >= len(later)
        long.cancel()
        assert long.done.wait(30)
    finally:
        assert sched.stop(30)
    assert seen and seen <= warm, sorted(seen - warm)
    # (T, bucket) of the prefills whose bucket is past a prefill at position 0's: parked rows set it
    parked = {(key[3], key[4]) for key in seen
              if key[0] == "target" and key[5] == 1 and key[4] > kv_bucket(key[3], max_len)}
    lengths = {prefill_length(6, max_len), prefill_length(40, max_len)}
    if admit_rows:  # the admitted row alone: a batch of one, at a position-0 prefill's bucket
        alone = {key[3] for key in seen if key[0] == "target" and key[5] == 1 and key[2] == 1}
        assert lengths <= alone and not parked
    else:
        assert {(prefill_length(6, max_len), 2 * KV_BLOCK), (prefill_length(40, max_len), 3 * KV_BLOCK)} <= parked
    if not target_only:
        k = engine.adapter.num_slots
        assert ("drafter", "write", 4, k + 1) in seen  # the pending block, written before the admitted prompt
        admits = {key for key in seen if key[:2] == ("drafter", "admit")}  # the admitted prompt's own, padded
        assert admits == ({("drafter", "admit", 1, t) for t in lengths} if pad_prefills else set()), admits
        shapes = 3 * report["prefill_lengths"] if pad_prefills else 0  # widths 1, 2, 4 at every padded length
        assert report.get("drafter_admission_shapes", 0) == shapes
    for job in [*first, *later]:
        assert job.tokens == engine.target_only(job.prompt_ids, max_new_tokens=job.max_tokens).tokens


def test_health_says_warming_and_requests_wait_for_the_warm_start(engine, monkeypatch):
    from domino_graft.serving import warmup
    from domino_graft.serving.app import health_status
    from domino_graft.serving.scheduler import Scheduler

    release = threading.Event()
    real = warmup.warm_start

    def slow(*args, **kw):
        assert release.wait(30)
        return real(*args, **kw)

    monkeypatch.setattr(warmup, "warm_start", slow)
    sched = Scheduler(engine, max_batch=2, max_queue=4, warm_start=32)
    sched.start()
    try:
        status, body = health_status(sched)
        assert (status, body["status"]) == (503, "warming")
        job = _job(engine, [5, 6, 7], 9)
        sched.submit(job)  # accepted: it waits in the queue
        time.sleep(0.2)
        assert not job.tokens and health_status(sched)[1]["queued"] == 1
        release.set()
        assert job.done.wait(30) and job.tokens == engine.target_only([5, 6, 7], max_new_tokens=9).tokens
        status, body = health_status(sched)
        assert status == 200 and body["status"] == "ok" and body["warm_start"]["batch_sizes"] == [1, 2]
        assert body["warm_start"]["seconds"] >= 0 and body["warm_start"]["cache_kept"] is True
    finally:
        release.set()
        assert sched.stop(30)


def test_a_failed_warm_start_stops_serve_with_one_line(tiny_run, monkeypatch, capsys):
    from domino_graft.serving import warmup
    from tests.decoding.test_decoding import run_command

    def broken(*args, **kw):
        raise RuntimeError("CUDA out of memory (injected)")

    monkeypatch.setattr(warmup, "warm_start", broken)
    assert run_command("serve", [str(tiny_run), "--port", "0", "--log-level", "critical"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: serve: the warm start failed: RuntimeError: CUDA out of memory (injected);")



@pytest.mark.parametrize("flag, want", [("off", False), ("on", True), ("auto", True)])  # auto: on
def test_the_serve_flag_for_admission_in_place_reaches_the_scheduler(tiny_run, monkeypatch, flag, want):
    """`serve --admit-in-place` was once parsed and dropped (the H200 sweep at 80ccb72 ran with it "on" and
    admitted nothing in place): the command's value must reach ServeOptions, the scheduler and /health."""
    from domino_graft.cli import main
    from domino_graft.serving import server
    from domino_graft.serving.app import health_status

    seen = []
    monkeypatch.setattr(server, "serve", lambda opts: seen.append(opts) or 0)
    assert main(["serve", str(tiny_run), "--admit-in-place", flag]) == 0
    assert seen[0].admit_in_place == flag
    _, served = server.build(seen[0])
    assert served.scheduler.admit_in_place is want
    served.scheduler.warming = False
    monkeypatch.setattr(type(served.scheduler), "alive", property(lambda self: True))
    assert health_status(served.scheduler)[1]["batches"]["admit_in_place"] is want


@pytest.mark.parametrize("flag, want", [("off", False), ("on", True), ("auto", False)])  # auto: off for now
def test_the_serve_flag_for_admission_cohorts_reaches_the_scheduler(tiny_run, monkeypatch, flag, want):
    from domino_graft.cli import main
    from domino_graft.serving import cohorts, server
    from domino_graft.serving.app import health_status

    monkeypatch.setattr(cohorts, "FORCED", None)
    seen = []
    monkeypatch.setattr(server, "serve", lambda opts: seen.append(opts) or 0)
    assert main(["serve", str(tiny_run), "--admission-cohorts", flag]) == 0
    assert seen[0].admission_cohorts == flag
    _, served = server.build(seen[0])
    assert served.scheduler.cohorts.on is want
    served.scheduler.warming = False
    monkeypatch.setattr(type(served.scheduler), "alive", property(lambda self: True))
    assert health_status(served.scheduler)[1]["batches"]["cohorts"] is want


def test_a_bad_admission_cohorts_value_is_named():
    from domino_graft.serving.server import ServeOptions

    with pytest.raises(ValueError, match=r"--admission-cohorts: 'often' is invalid; valid: auto, on, off"):
        ServeOptions(run=None, admission_cohorts="often").check()


def test_a_bad_admit_in_place_value_is_named():
    from domino_graft.serving.server import ServeOptions

    with pytest.raises(ValueError, match=r"--admit-in-place: 'maybe' is invalid; valid: auto, on, off"):
        ServeOptions(run=None, admit_in_place="maybe").check()


def test_a_bad_prefill_chunk_is_named():
    from domino_graft.serving.server import ServeOptions

    with pytest.raises(ValueError, match=r"--prefill-chunk: 0 is invalid; valid: an integer >= 1"):
        ServeOptions(run=None, prefill_chunk=0).check()
    ServeOptions(run=None, prefill_chunk=16).check()


@pytest.mark.parametrize("family", ["pard", "peagle"])
def test_an_eager_drafters_admissions_are_visited_too(family, monkeypatch):
    """An eager drafter (no static batched path) admits in place through `observe_prompts`: the warm start
    runs its admission prefills too (their rows parked deep in the cache), so every target graph key the
    traffic's admissions meet was met in the warm-up; answers stay the target alone's."""
    from domino_graft.decoding import Engine, stop_token_ids
    from domino_graft.serving.scheduler import Scheduler
    from tests.decoding.test_static_kv import graft

    target, adapter, head = graft(family, "qwen3", seed=3)
    engine = Engine(target, adapter, head, stop_ids=stop_token_ids(target))
    seen = _record_keys(monkeypatch)
    sched = Scheduler(engine, max_batch=4, max_queue=16, pad_batches=True, warm_start=400, sweep=True)
    _serve(sched, [])
    warm = set(seen)
    assert sched.warm.report["drafter"] == "eager" and sched.warm.report["admission_prefills"] > 0
    assert sched.admit_in_place
    seen.clear()
    sched = Scheduler(engine, max_batch=4, max_queue=16, pad_batches=True, admit_in_place=True)
    sched.start()
    try:
        long, first = _deep_row_and_three_short(engine, sched, 90)
        _until(lambda: all(j.finish_reason for j in first), 120)
        later = _job(engine, [7, 1, 3, 9, 2, 8], 11)
        sched.submit(later)
        assert later.done.wait(60)
        assert long.finish_reason is None and sched.admitted_in_place >= 1
        long.cancel()
        assert long.done.wait(30)
    finally:
        assert sched.stop(30)
    assert seen and seen <= warm, sorted(seen - warm)
    for job in [*first, later]:
        assert job.tokens == engine.target_only(job.prompt_ids, max_new_tokens=job.max_tokens).tokens
