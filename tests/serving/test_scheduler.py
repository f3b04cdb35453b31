"""The scheduler in process, without HTTP: a request that arrives while another decodes joins the
batch at a block boundary and finishes while the first goes on, each equal to its target-alone
decode; a cancelled row stops at the next block; greedy and sampled rows share a batch; the
one-at-a-time mode (trees, --target-only) serves its queue in turn."""

from __future__ import annotations

import threading
import time

import pytest

from domino_graft.sampling import Sampling


@pytest.fixture(scope="module")
def engine(tiny_run):
    from domino_graft.decoding import Engine, stop_token_ids
    from domino_graft.loading import load_run_or_bundle

    loaded = load_run_or_bundle(str(tiny_run))
    return Engine(loaded.target, loaded.adapter, loaded.head, stop_ids=stop_token_ids(loaded.target))


def _job(engine, prompt, max_tokens, temperature=0.0):
    from domino_graft.serving.scheduler import Job

    done = threading.Event()

    def send(ev):
        if ev[0] != "delta":
            done.set()

    job = Job(prompt, max_tokens=max_tokens, sampling=Sampling(temperature=temperature), stop=[],
              stop_ids=engine.stop_ids, detokenize=lambda ids: " ".join(map(str, ids)), send=send)
    job.done = done
    return job


def _until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("cohorts", [False, True])
def test_a_request_joins_the_batch_in_flight_and_leaves_first(engine, cohorts, monkeypatch):
    """With admissions in cohorts too (serving/cohorts.py, an admission priced at 50 ms): the first request's batch
    of one row has no free row, and the second, which a rebuilt batch takes, must still not wait for it to end."""
    from domino_graft.serving import cohorts as cohorts_module
    from domino_graft.serving.metrics import Metrics
    from domino_graft.serving.scheduler import Scheduler

    monkeypatch.setattr(cohorts_module, "FORCED", None)
    sched = Scheduler(engine, max_batch=4, max_queue=8, metrics=Metrics(), cohorts=cohorts)
    if cohorts:
        sched.cohorts.admitted(0.05)
    assert sched.mode == "batched"
    sched.start()
    try:
        long, short = _job(engine, [5, 6, 7, 8], 1500), _job(engine, [9, 3, 4], 12)
        sched.submit(long)
        _until(lambda: len(long.tokens) > 0)
        sched.submit(short)
        assert short.done.wait(30)
        assert long.finish_reason is None, "the first request stopped for the second"
        assert short.finish_reason in ("stop", "length")
        n = len(long.tokens)
        long.cancel()
        assert long.done.wait(30) and long.finish_reason == "cancelled"
        assert len(long.tokens) - n <= 2 * engine.adapter.num_slots  # retired at the next block or so
        assert long.tokens == engine.target_only([5, 6, 7, 8], max_new_tokens=len(long.tokens)).tokens
        assert short.tokens == engine.target_only([9, 3, 4], max_new_tokens=12).tokens
    finally:
        assert sched.stop(30)


def test_sampled_and_greedy_rows_share_a_batch(engine):
    """Requests of three settings join one batch in flight; the greedy ones still equal the target
    alone, and the sampled ones finish while the first greedy row goes on."""
    from domino_graft.serving.scheduler import Scheduler

    sched = Scheduler(engine, max_batch=4, max_queue=8)
    sched.start()
    try:
        first = _job(engine, [5, 6, 7], 1500)
        sched.submit(first)
        _until(lambda: len(first.tokens) > 0)
        others = [_job(engine, [8, 9], 20, temperature=0.8), _job(engine, [10, 11], 7),
                  _job(engine, [12, 13, 14], 15, temperature=1.3)]
        for job in others:
            sched.submit(job)
        for job in others:
            assert job.done.wait(60)
        assert first.finish_reason is None  # all three joined and left while it decoded
        first.cancel()
        assert first.done.wait(30)
        assert first.tokens == engine.target_only([5, 6, 7], max_new_tokens=len(first.tokens)).tokens
        assert others[1].tokens == engine.target_only([10, 11], max_new_tokens=7).tokens
        for job in (others[0], others[2]):
            assert job.finish_reason in ("stop", "length") and 1 <= len(job.tokens) <= job.max_tokens
    finally:
        assert sched.stop(30)


@pytest.fixture(scope="module")
def tree_engine(tmp_path_factory):
    """A Medusa tree: no ragged tree verify, so its requests decode one at a time."""
    from domino_graft.decoding import Engine, stop_token_ids
    from domino_graft.loading import load_run_or_bundle

    from .harness import apply_tiny

    run = apply_tiny("medusa", tmp_path_factory.mktemp("tree") / "run",
                     ["drafter.tree=[[0],[1],[0,0],[0,1],[0,0,0]]"])
    loaded = load_run_or_bundle(str(run))
    assert loaded.adapter.topology == "tree"
    return Engine(loaded.target, loaded.adapter, loaded.head, stop_ids=stop_token_ids(loaded.target))


@pytest.mark.parametrize("target_only", [False, True])
def test_one_at_a_time_serves_trees_and_the_target_alone(tree_engine, target_only):
    from domino_graft.serving.metrics import Metrics
    from domino_graft.serving.scheduler import Scheduler

    metrics = Metrics()
    # a tree decodes alone at any --max-batch; the target alone does at --max-batch 1
    sched = Scheduler(tree_engine, max_batch=1 if target_only else 8, max_queue=8, target_only=target_only,
                      metrics=metrics)
    assert sched.mode == "one at a time"
    sched.start()
    try:
        prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
        jobs = [_job(tree_engine, p, 10 + 3 * i) for i, p in enumerate(prompts)]
        long = _job(tree_engine, [14, 15], 1500)
        sched.submit(long)
        for job in jobs:
            sched.submit(job)
        _until(lambda: len(long.tokens) > 0)
        long.cancel()  # the solo decode stops at its next block; the queue goes on
        for job in [long, *jobs]:
            assert job.done.wait(60)
        assert long.finish_reason == "cancelled" and len(long.tokens) < 1500
        for i, (p, job) in enumerate(zip(prompts, jobs)):
            assert job.tokens == tree_engine.target_only(p, max_new_tokens=10 + 3 * i).tokens
        assert (metrics.registry.get_sample_value("domino_graft_verify_steps_total") == 0) == target_only
    finally:
        assert sched.stop(30)


def test_target_only_batches_too(engine):
    """--target-only (the baseline) batches continuously: a greedy and a sampled row join a greedy
    row in flight; greedy rows equal the target alone's solo decode; no verify step is counted."""
    from domino_graft.serving.metrics import Metrics
    from domino_graft.serving.scheduler import Scheduler

    metrics = Metrics()
    sched = Scheduler(engine, max_batch=4, max_queue=8, target_only=True, metrics=metrics)
    assert sched.mode == "batched"
    sched.start()
    try:
        first = _job(engine, [5, 6, 7], 1500)
        sched.submit(first)
        _until(lambda: len(first.tokens) > 0)
        others = [_job(engine, [10, 11], 9), _job(engine, [8, 9], 12, temperature=0.9)]
        for job in others:
            sched.submit(job)
        for job in others:
            assert job.done.wait(60)
        assert first.finish_reason is None
        first.cancel()
        assert first.done.wait(30) and first.finish_reason == "cancelled"
        assert first.tokens == engine.target_only([5, 6, 7], max_new_tokens=len(first.tokens)).tokens
        assert others[0].tokens == engine.target_only([10, 11], max_new_tokens=9).tokens
        sampled = others[1]  # its tokens are random; its stop rule is not
        assert sampled.finish_reason in ("length", "stop"), sampled.finish_reason
        if sampled.finish_reason == "length":
            assert len(sampled.tokens) == 12
        else:
            assert len(sampled.tokens) <= 12 and sampled.tokens[-1] in engine.stop_ids
        assert metrics.registry.get_sample_value("domino_graft_verify_steps_total") == 0
    finally:
        assert sched.stop(30)


def test_a_failing_batch_fails_its_requests_and_the_next_one_is_served(engine, monkeypatch):
    from domino_graft.serving.scheduler import Scheduler

    sched = Scheduler(engine, max_batch=4, max_queue=8)
    real = engine.rollout
    calls = {"n": 0}

    def broken(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return real(*args, **kw)

    monkeypatch.setattr(engine, "rollout", broken)
    events = []
    sched.start()
    try:
        bad = _job(engine, [5, 6, 7], 50)
        bad_done = threading.Event()
        bad.send = lambda ev: (events.append(ev), ev[0] != "delta" and bad_done.set())
        sched.submit(bad)
        assert bad_done.wait(30)
        assert bad.finish_reason == "error" and "injected fault" in events[-1][1]
        good = _job(engine, [5, 6, 7], 9)
        sched.submit(good)
        assert good.done.wait(30)
        assert good.tokens == engine.target_only([5, 6, 7], max_new_tokens=9).tokens
        assert sched.alive
    finally:
        assert sched.stop(30)


@pytest.mark.parametrize("spec,pad", [("0", False), ("2", True), ("auto", True)])
def test_a_verify_budget_keeps_every_greedy_row_the_target_alones(engine, spec, pad, monkeypatch):
    """The batched chain under a verify budget (K' = 0: plain steps; 2 of K; auto over a cost table
    that makes the verify dear at 3 rows): rows join and leave a batch in flight, each still its
    target-alone decode; the budget run is carried across the rebuilds; the metrics count only the
    slots a block verified. pad: batches padded with idle rows to a power of two (the GPU default)."""
    from domino_graft.decoding.budget import VerifyBudget, VerifyCosts
    from domino_graft.serving.metrics import Metrics
    from domino_graft.serving.scheduler import Scheduler, describe

    costs = VerifyCosts.from_dict({"step_ms": {"1": {"1": 1.0, "4": 1.1, "8": 1.2}, "4": {"1": 1.0, "4": 2.5, "8": 5.0}},
                                   "propose_ms": {"1": 0.2, "4": 0.4}})
    budget = VerifyBudget.parse(spec, costs)
    metrics = Metrics()
    from domino_graft.serving import batch as batch_mod

    sizes = []  # the size of every batch built

    class Recording(batch_mod.ChainBatch):
        def __init__(self, engine, rows, **kw):
            sizes.append(len(rows))
            super().__init__(engine, rows, **kw)

    monkeypatch.setattr(batch_mod, "ChainBatch", Recording)
    sched = Scheduler(engine, max_batch=4, max_queue=8, metrics=metrics, budget=budget, pad_batches=pad)
    assert describe(sched)["verify_budget"] == (spec if spec != "auto" else "auto")
    prompts = [([5, 6, 7, 8], 40), ([9, 3, 4], 12), ([11, 2], 25), ([7, 7, 1, 2, 3], 18)]
    sched.start()
    try:
        jobs = []
        for prompt, n in prompts:
            jobs.append(_job(engine, prompt, n))
            sched.submit(jobs[-1])
            time.sleep(0.05)  # arrivals in flight: each admission rebuilds the batch
        for job in jobs:
            assert job.done.wait(60)
        for job, (prompt, n) in zip(jobs, prompts):
            assert job.tokens == engine.target_only(prompt, max_new_tokens=n).tokens, (spec, prompt)
        assert sched.running == 0 and sched.queue_depth() == 0
        assert len(sizes) >= 2, sizes  # arrivals in flight rebuilt the batch
        if pad:  # padded with idle rows: powers of two only
            assert set(sizes) <= {1, 2, 4}, sizes
    finally:
        assert sched.stop(30)
    if spec == "0":  # plain steps only: no slot was ever verified
        assert metrics.verify_steps._value.get() > 0 and metrics.accepted_drafts._value.get() == 0


@pytest.mark.parametrize("argv,message", [
    (["--verify-budget", "often"], "--verify-budget: 'often' is not a budget; valid: full, auto, or an integer N"),
    (["--verify-budget", "99"], "--verify-budget: 99 exceeds the drafter's K = 7 drafts per step; valid: full, auto, "
                                "or an integer 0..7"),
    (["--verify-budget", "auto"], "--verify-budget: auto on cpu needs a cost table with step_ms and propose_ms"),
])
def test_serve_refuses_a_bad_verify_budget_before_binding(tiny_run, capsys, argv, message):
    from tests.decoding.test_decoding import run_command

    assert run_command("serve", [str(tiny_run), "--port", "0", *argv]) == 1
    assert message in capsys.readouterr().err


def _admit_after_a_first_batch(sched, engine, long, later: list, wait: float = 60) -> tuple[int, list]:
    """`long` and two short requests as the first batch; once the short ones end, the `later` (prompt,
    max_tokens) requests arrive and end while `long` still decodes. -> (rebuilds before them, the ended jobs)."""
    first = [_job(engine, [9, 3, 4], 4), _job(engine, [11, 2], 5)]
    for job in [long, *first]:
        sched.submit(job)
    for job in first:
        assert job.done.wait(wait)
    built = sched.rebuilds
    jobs = [_job(engine, p, n) for p, n in later]
    for job in jobs:
        sched.submit(job)
    for job in jobs:
        assert job.done.wait(wait)
    assert long.finish_reason is None, "the long request should still be decoding"
    return built, [*first, *jobs]


def _cancel_and_check_each_against_the_target_alone(engine, long, done: list) -> None:
    """Cancel the row still in flight; every finished answer, and what it emitted, equal target-alone decodes."""
    long.cancel()
    assert long.done.wait(30)
    for job in done:
        assert job.tokens == engine.target_only(job.prompt_ids, max_new_tokens=job.max_tokens).tokens
    assert long.tokens == engine.target_only(long.prompt_ids, max_new_tokens=len(long.tokens)).tokens


@pytest.mark.parametrize("target_only", [False, True])
def test_requests_join_freed_rows_in_place_and_each_equals_its_target_alone(engine, target_only):
    """Admission in place (serving/batch.py `admit`): once a row of the batch in flight has ended, the
    next requests are prefilled into freed rows; the row still decoding is not rebuilt (its cache,
    anchor and drafter context stay), and every greedy answer equals its target-alone decode."""
    from domino_graft.serving.scheduler import Scheduler

    sched = Scheduler(engine, max_batch=4, max_queue=16, target_only=target_only, pad_batches=True)
    assert type(engine.adapter).__name__ == "DFlashAdapter"  # a static drafter that admits rows
    sched.start()
    try:
        long = _job(engine, [5, 6, 7, 8], 400)
        first = [_job(engine, [9, 3, 4], 6), _job(engine, [11, 2], 9), _job(engine, [4, 4, 4, 4, 4], 5)]
        for job in [long, *first]:
            sched.submit(job)
        for job in first:
            assert job.done.wait(60)
        assert long.finish_reason is None, "the long request should still be decoding"
        built = sched.rebuilds
        later = [_job(engine, [7, 1, 3, 9, 2, 8], 11), _job(engine, [12], 8), _job(engine, [3, 5], 10)]
        for job in later:
            sched.submit(job)
        for job in later:
            assert job.done.wait(60)
        assert sched.admitted_in_place >= len(later) and sched.rebuilds == built, (sched.admitted_in_place,
                                                                                   sched.rebuilds, built)
        _cancel_and_check_each_against_the_target_alone(engine, long, [*first, *later])
    finally:
        assert sched.stop(30)


@pytest.mark.parametrize("target_only", [False, True])
def test_a_long_prompt_admitted_in_place_is_prefilled_in_chunks_between_blocks(engine, target_only, monkeypatch):
    """Chunked prefill (serving/batch.py `admit`, `prefill_chunks`): a prompt longer than prefill_chunk goes
    into the target's cache that many tokens a block, each chunk at its own start, while the row in flight
    keeps decoding between them; it decodes once its last chunk is in, and every greedy answer, the one
    still in flight included, equals its target-alone decode."""
    from domino_graft.decoding.session import StaticSession
    from domino_graft.serving.scheduler import Scheduler

    calls = []  # (each chunked prompt's start, tokens the row in flight had by then)
    real = StaticSession.prefill

    def spy(self, prompts, capture, rows=None, starts=None):
        if starts is not None:
            calls.append((list(starts), len(long.tokens)))
        return real(self, prompts, capture, rows=rows, starts=starts)

    monkeypatch.setattr(StaticSession, "prefill", spy)
    sched = Scheduler(engine, max_batch=4, max_queue=16, target_only=target_only, pad_batches=True, prefill_chunk=8)
    sched.start()
    try:
        long = _job(engine, [5, 6, 7, 8], 300)
        prompts = [[(3 * i + 1) % 29 + 1 for i in range(30)], [(5 * i + 2) % 23 + 1 for i in range(20)], [7, 1, 3]]
        built, done = _admit_after_a_first_batch(sched, engine, long, list(zip(prompts, (9, 7, 6))))
        assert sched.rebuilds == built and sched.admitted_in_place >= 3
        _cancel_and_check_each_against_the_target_alone(engine, long, done)
    finally:
        assert sched.stop(30)
    starts = sorted({s for st, _ in calls for s in st})
    assert {0, 8, 16, 24} <= set(starts), calls  # the 30-token prompt's chunks, each at its own start
    # one chunk a block: the row in flight decoded between any two of them
    assert len(calls) >= 4 and all(a < b for (_, a), (_, b) in zip(calls, calls[1:])), calls


# ----------------------------------------------------------------------------- GPU (opt-in: -m gpu)
@pytest.mark.gpu
@pytest.mark.parametrize("target_only", [False, True])
def test_gpu_admission_in_place_and_chunked_prefill_equal_the_target_alone(target_only):
    """On CUDA (graphs, Triton kernels), after the warm start: requests admitted into freed rows, one of them
    in chunks of 8, every greedy answer equal to its target-alone decode, no rebuild. The graphs captured
    after the warm start are printed (the chunks' shapes are not among its visits)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from domino_graft.decoding import Engine, stop_token_ids
    from domino_graft.serving.scheduler import Scheduler
    from tests.decoding.test_static_kv import graft

    target, adapter, head = graft("dflash", "qwen3", seed=2, extra=("target.random.head_dim=16",))
    for module in (target.model, adapter, head):
        module.to("cuda")
    engine = Engine(target, adapter, head, stop_ids=stop_token_ids(target))
    sched = Scheduler(engine, max_batch=4, max_queue=16, target_only=target_only, pad_batches=True,
                      admit_in_place=True, prefill_chunk=8, warm_start=160, sweep=False)
    sched.start()
    try:
        long = _job(engine, [5, 6, 7, 8], 100)
        prompts = [[(3 * i + 1) % 29 + 1 for i in range(30)], [7, 1, 3]]
        built, done = _admit_after_a_first_batch(sched, engine, long, list(zip(prompts, (9, 6))), wait=120)
        assert sched.rebuilds == built and sched.admitted_in_place >= 2, (sched.rebuilds, built)
        _cancel_and_check_each_against_the_target_alone(engine, long, done)
        print(f"target_only={target_only}: warm start {sched.warm.status()}")
    finally:
        assert sched.stop(60)


def test_chunks_are_admitted_only_where_every_park_fits(engine):
    """Each chunk parks the other rows a padded chunk past their ends (decoding/session.py `_park`): a batch
    whose row in flight may reach too near the cache's end refuses a chunked admission (the scheduler then
    rebuilds), where the session's park would have failed mid-prompt; with room to spare it takes it."""
    from domino_graft.fast import prefill_length
    from domino_graft.serving.batch import TargetBatch
    from domino_graft.serving.warmup import placeholder_rows

    batch = TargetBatch(engine, placeholder_rows(1, 4, 100) + placeholder_rows(1, 4, 100, alive=False))
    room, t = batch._room(), prefill_length(8, batch._room())
    new = placeholder_rows(1, 30, 40)
    assert batch.can_admit(new, chunk=8)  # 100 + extra + 16 well inside the cache
    near = room - batch.extra - t + 1  # one position too far: the last chunk's park would not fit
    batch = TargetBatch(engine, placeholder_rows(1, 4, near) + placeholder_rows(1, 4, near, alive=False))
    assert batch._room() == room and not batch.can_admit(new, chunk=8)
    assert batch.can_admit(new, chunk=None)  # whole, its one park is the session's to check (ValueError: rebuild)


# ---------------------------------------------- admission in place for the eager drafters
@pytest.fixture(scope="module", params=("dspark", "medusa", "pard", "peagle"))
def eager_engine(request):
    """A chain family whose batched drafter is its adapter's eager ragged contract (no static batched
    drafter): admission in place goes through `observe_prompts` (adapters/base.py)."""
    from domino_graft.decoding import Engine, stop_token_ids
    from tests.decoding.test_static_kv import graft

    target, adapter, head = graft(request.param, "qwen3", seed=3)
    return Engine(target, adapter, head, stop_ids=stop_token_ids(target))


def test_eager_drafters_admit_in_place_and_each_answer_equals_its_target_alone(eager_engine):
    """DSpark, Medusa chains, PARD and P-EAGLE take new prompts into freed rows of the batch in flight: the
    rows' old drafter context is dropped and the prompts observed in their place, the row still decoding
    keeps its own; one prompt comes in chunks. No rebuild, and every greedy answer, the cancelled one's
    included, equals its target-alone decode (a row's drafts read only its own context)."""
    from domino_graft.serving.batch import ChainBatch
    from domino_graft.serving.scheduler import Scheduler
    from domino_graft.serving.warmup import placeholder_rows

    engine = eager_engine
    assert engine.adapter.admits_rows
    assert ChainBatch(engine, placeholder_rows(2, 4, 64), use_head=True).drafter is None  # the eager path
    sched = Scheduler(engine, max_batch=4, max_queue=16, pad_batches=True, prefill_chunk=8)
    sched.start()
    try:
        long = _job(engine, [5, 6, 7, 8], 300)
        later = [([(3 * i + 1) % 29 + 2 for i in range(20)], 9), ([7, 1, 3, 9, 2, 8], 11), ([12], 8)]
        built, done = _admit_after_a_first_batch(sched, engine, long, later)
        assert sched.rebuilds == built and sched.admitted_in_place >= len(later), (sched.rebuilds, built,
                                                                                    sched.admitted_in_place)
        _cancel_and_check_each_against_the_target_alone(engine, long, done)
    finally:
        assert sched.stop(30)
