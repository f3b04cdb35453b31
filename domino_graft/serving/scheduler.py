"""The model worker: one thread owns the engine; requests queue to it and come back as events.

The ASGI event loop never runs torch: handlers `submit` a Job and await its events, which the
worker hands over through the loop's mailbox (serving/mailbox.py: one wake-up of the loop per burst of
events). One worker, because the engine (its caches, the adapter's drafter context) is one decode's state
at a time.

Two modes, by what the drafter can do (docs/serving.md, "serve"):

    batched   chain drafters that take ragged batches (adapter.topology "chain" and
              adapter.ragged_batch), and --target-only: continuous batching. Between blocks the worker retires finished
              and cancelled rows and, when requests wait and rows are free, rebuilds the batch
              with them, first come first served (serving/batch.py). Rows of any sampling settings
              share a batch. On a GPU the batch is padded with idle rows to the next power of two
              (at most --max-batch), as engines pad to their captured sizes: the fast engine
              captures CUDA graphs (and the verify budget measures costs) per batch size, so
              arrivals meet a few sizes instead of every size up to --max-batch. An idle row is
              masked from its first block on; a row's output does not depend on its batch.
              Before its loop the worker runs the warm start (serving/warmup.py; /health "warming").
    one at a time   drafters without the ragged-batch contract, trees, and --max-batch 1: each request decodes alone through `Engine.speculative` /
              `Engine.target_only`, streamed block by block; the queue waits.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import Any, Callable, Optional

from ..decoding.common import Output
from ..sampling import Sampling
from .cohorts import Cohorts
from .text import TextSoFar, WindowText

log = logging.getLogger("domino_graft.serve")
# a prompt admitted in place longer than this is prefilled this many tokens a block (serve --prefill-chunk)
PREFILL_CHUNK = 512


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


class _Cancelled(Exception):
    """Raised inside a solo decode's token callback when the client has gone."""


class Job:
    """One request inside the worker: its prompt, settings, output so far, and its way back to
    the client (`send(event)`, thread-safe). Events: ("delta", text, ids), ("done", finish_reason),
    ("error", message). text: how its tokens become text (serving/text.py), or `detokenize` (ids -> text) in a
    window of them."""

    _ids = itertools.count(1)

    def __init__(self, prompt_ids: list[int], *, max_tokens: int, sampling: Sampling, stop: list[str],
                 stop_ids: frozenset[int], send: Callable[[tuple], None],
                 detokenize: Optional[Callable[[list[int]], str]] = None, text: Optional[TextSoFar] = None):
        self.id = next(self._ids)
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.stop = stop
        self.send = send
        self.out = Output(max_tokens, stop_ids, None)
        self.cancelled = False
        self.stopped_by_string = False  # the decoder itself would go on: a solo decode must be stopped
        self.finish_reason: Optional[str] = None
        self.text = ""  # the text sent so far
        if text is None and detokenize is None:
            raise ValueError("a Job needs `text` (serving/text.py) or `detokenize` (ids -> text)")
        self._so_far = text or WindowText(detokenize)  # the tokens' text so far (serving/text.py)
        self.arrived = time.perf_counter()
        self.first_token: Optional[float] = None
        self.last_token: Optional[float] = None
        self.accepted: list[int] = []
        self.on_finish: Optional[Callable[["Job"], None]] = None  # the scheduler's metrics

    @property
    def tokens(self) -> list[int]:
        return self.out.tokens

    def cancel(self) -> None:
        """From the event loop: the client went away. The worker retires the row at the next block."""
        self.cancelled = True

    def push(self, ids: list[int]) -> bool:
        """New tokens from the decoder -> the text delta to the client; True when this job is done
        (a stop token, max_tokens, or a stop string: the text is cut before it)."""
        if self.finish_reason is not None:
            return True
        now = time.perf_counter()
        self.first_token = self.first_token or now
        self.last_token = now
        done = self.out.push(ids)
        text = self._decode(final=done)
        hold = 0
        for s in self.stop:
            at = text.find(s, max(0, len(self.text) - len(s)))
            if at >= 0:
                text, done = text[:at], True
                self.out.stop_reason = "stop"
                self.stopped_by_string = True
        if not done:
            if text.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for its next byte
                hold = len(text) - len(text.rstrip("\ufffd"))
            for s in self.stop:  # a tail that may begin a stop string is held back, never sent then cut
                for n in range(min(len(s) - 1, len(text)), 0, -1):
                    if text.endswith(s[:n]):
                        hold = max(hold, n)
                        break
        delta = text[len(self.text): len(text) - hold]
        if delta or done:
            self.text += delta
            self.send(("delta", delta))
        if done:
            self.finish(self.out.stop_reason or "stop")
        return done

    def _decode(self, final: bool) -> str:
        """The text of every token so far, complete characters only until the last push (serving/text.py)."""
        return self._so_far.text(self.out.tokens, final)

    def finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.send(("done", reason))
            if self.on_finish is not None:
                self.on_finish(self)

    def fail(self, message: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = "error"
            self.send(("error", message))
            if self.on_finish is not None:
                self.on_finish(self)


class Scheduler:
    """The queue and the model worker thread (module docstring)."""

    def __init__(self, engine, *, max_batch: int, max_queue: int, target_only: bool = False, metrics=None,
                 budget=None, pad_batches: Optional[bool] = None, warm_start: Optional[int] = None,
                 sweep: Optional[bool] = None, admit_in_place: Optional[bool] = None,
                 prefill_chunk: Optional[int] = PREFILL_CHUNK, cohorts: Optional[bool] = None):
        """warm_start: the positions a request may reach (prompt + max_tokens, the server's
        max_model_len); given, the worker warms the batched loop up before serving (serving/warmup.py;
        sweep: its every kv bucket and prefill length, by default on CUDA). admit_in_place: prefill new
        requests into freed rows of the batch in flight where it can (serving/batch.py); on by default (on
        the H200 it served 6-12% more tokens/s than rebuilding at 64 requests/s and 8-32 in flight, and cut
        TTFT p99 at 64/s from 391 to 86 ms: docs/serving.md). Its prefills meet graph shapes of their own
        (parked rows, larger kv buckets), which the warm start visits where it is on (serving/warmup.py).
        prefill_chunk: a prompt admitted in place and longer than this is prefilled this many tokens a
        block, between the blocks of the rows in flight (serving/batch.py `admit`; None: whole). cohorts:
        hold queued requests while rows free up, to admit them in one call (serving/cohorts.py); off by
        default until a GPU run measures it."""
        adapter = engine.adapter
        self.engine = engine
        cuda = engine.target.device.type == "cuda"
        # pad each batch to a power of two (module docstring); by default where graphs are captured
        self.pad_batches = cuda if pad_batches is None else pad_batches
        self.rebuilds = 0  # batches built (the first of each busy spell included): each re-prefills its rows
        self.admitted_in_place = 0  # requests prefilled into freed rows of the batch in flight
        # the calls that admitted them and the wall seconds in those calls and in the rebuilds (bench/rollouts.py's
        # report): an admission in place is a forward of the whole batch however few rows it admits (every other
        # row parks, decoding/session.py), and rows that end apart are admitted apart
        self.admissions, self.admission_s, self.rebuild_s = 0, 0.0, 0.0
        self.budget = budget  # the batched chains' verify budget (decoding/budget.py; None: all K)
        self.max_batch, self.max_queue = max_batch, max_queue
        self.target_only = target_only
        self.use_head = engine.head is not None
        self.batched = max_batch > 1 and (target_only or (adapter is not None and adapter.topology == "chain"
                                                          and getattr(adapter, "ragged_batch", False)))
        self.metrics = metrics
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._active: set[Job] = set()  # submitted and not finished
        self.running = 0  # rows decoding now (the metrics' batch size)
        self.error: Optional[str] = None  # set if the worker thread itself died
        self.warm_positions = warm_start if self.batched else None  # one at a time: nothing batched to warm
        self.warm_sweep = sweep
        self.admit_in_place = True if admit_in_place is None else admit_in_place
        self.prefill_chunk = prefill_chunk
        self.cohorts = Cohorts(bool(cohorts))
        self.warming = self.warm_positions is not None  # /health: "warming" (503) until the loop starts
        self.warm = None  # what the warm start did (warmup.WarmStart), once done
        self.warm_failed = False
        self.on_fatal: Optional[Callable[[str], None]] = None  # the server's way to stop when the warm start fails
        self._thread = threading.Thread(target=self._main, name="domino-graft-model", daemon=True)

    @property
    def mode(self) -> str:
        return "batched" if self.batched else "one at a time"

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float, *, abandon: bool = False) -> bool:
        """Finish queued and running jobs (for at most `timeout` s), then end the worker; False
        if it was still busy (its remaining jobs are failed). abandon: cancel them all first
        (after the HTTP server's own drain no client is left to read them), so the worker ends
        at its next block."""
        with self._cond:
            self._stopping = True
            if abandon:
                for job in list(self._active):
                    job.cancel()
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cond:
                for job in self._queue:
                    job.fail("the server shut down before this request ran")
                self._queue.clear()
            return False
        return True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def queue_depth(self) -> int:
        return len(self._queue)

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} requests wait; --max-queue)")
            job.on_finish = self._done
            self._active.add(job)
            self._queue.append(job)
            self._gauges()
            self._cond.notify()

    # ------------------------------------------------------------------ worker
    def batch_sizes(self) -> list[int]:
        """Every batch size the batched loop can build: the padded sizes (`_padded`), or 1..max_batch."""
        sizes = range(1, self.max_batch + 1)
        return sorted({self._padded(n) for n in sizes}) if self.pad_batches else list(sizes)

    def _warm_start(self) -> None:
        from .warmup import warm_start

        try:
            self.warm = warm_start(self.engine, batch_sizes=self.batch_sizes(), positions=self.warm_positions,
                                   target_only=self.target_only, use_head=self.use_head, budget=self.budget,
                                   sweep=self.warm_sweep, admit=self.admit_in_place)
        except Exception:
            self.warm_failed = True
            raise
        finally:
            self.warming = False
        r = self.warm.report
        log.info("warm start: %.1f s; batch sizes %s, %d prefill lengths, %d kv buckets, %d steps, %d admission "
                 "prefills, %d target graphs captured; cache %s", r["seconds"], r["batch_sizes"], r["prefill_lengths"],
                 r["kv_buckets"], r["steps"], r["admission_prefills"], r["graphs"], r["cache"])

    def _main(self) -> None:
        try:
            if self.warming:
                self._warm_start()
            (self._loop_batched if self.batched else self._loop_solo)()
        except BaseException as e:  # a bug in the loop itself, or a warm start that failed: /health reports it
            self.error = f"{type(e).__name__}: {e}"
            if self.warm_failed:  # the model cannot run the shapes traffic would: the server stops (serve exits 1)
                self.error = f"the warm start failed: {self.error}"
                log.error("%s", self.error, exc_info=log.isEnabledFor(logging.DEBUG))
                if self.on_fatal is not None:
                    self.on_fatal(self.error)
            else:
                log.exception("the model worker stopped")
            with self._cond:
                for job in self._queue:
                    job.fail(f"the model worker stopped: {self.error}")
                self._queue.clear()

    def _next(self, block: bool) -> Optional[Job]:
        """The queue's head (waiting for one when `block`), skipping jobs cancelled while queued;
        None when stopping with nothing left, or nothing queued and not blocking."""
        with self._cond:
            while True:
                while self._queue and self._queue[0].cancelled:
                    self._queue.popleft().finish("cancelled")
                if self._queue or not block or self._stopping:
                    break
                self._cond.wait(1.0)
            return self._queue[0] if self._queue else None

    def _pop(self) -> Job:
        with self._cond:
            job = self._queue.popleft()
            self._gauges()
            return job

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._queue))
            self.metrics.batch_size.set(self.running)

    def _loop_solo(self) -> None:
        engine = self.engine
        while True:
            if self._next(block=True) is None:
                return  # stopping, queue empty
            job = self._pop()
            self.running = 1
            self._gauges()

            def on_tokens(ids, job=job):
                if job.cancelled:
                    raise _Cancelled
                if job.push(ids) and job.stopped_by_string:
                    raise _Cancelled  # the decoder's own stop rules would go on: no more blocks for it

            kw = dict(max_new_tokens=job.max_tokens, sampling=job.sampling, on_tokens=on_tokens)
            try:
                if self.target_only:
                    res = engine.target_only(job.prompt_ids, **kw)
                else:
                    res = engine.speculative(job.prompt_ids, use_head=self.use_head, **kw)
                    job.accepted = list(res.accepted)
                    if self.metrics is not None:
                        self.metrics.observe_steps(res.accepted, engine.adapter.num_slots)
            except _Cancelled:
                pass
            except Exception as e:  # one request's failure must not stop the server
                log.exception("request %d failed", job.id)
                job.fail(f"decoding failed: {type(e).__name__}: {e}")
            if job.cancelled:
                job.finish("cancelled")
            job.finish(job.out.stop_reason or "stop")
            self.running = 0
            self._gauges()

    def _loop_batched(self) -> None:
        from .batch import ChainBatch, TargetBatch
        from .rows import BatchRow

        batch: Optional[ChainBatch | TargetBatch] = None
        jobs: dict[BatchRow, Job] = {}  # each row of the batch -> its job
        while True:
            running = batch.running() if batch is not None else []
            if batch is not None and not running:  # every row finished or cancelled: retire them all
                batch.drop_drafted()
                for row in batch.rows:
                    if row in jobs:  # not an idle row
                        self._retire(jobs.pop(row))
                batch = None
                self.running = 0
                self._gauges()
            head = self._next(block=not running)
            if head is None and not running:
                return  # stopping, nothing queued or running
            if head is not None and running and not self.cohorts.due(time.perf_counter()):
                head = None  # held for the rows still to free up: one admission for them all
            # admission, first come first served, while rows are free
            admitted: list[Job] = []
            while head is not None and len(running) + len(admitted) < self.max_batch:
                admitted.append(self._pop())
                head = self._next(block=False)
            if admitted:
                for row in (batch.rows if batch is not None else []):
                    if row not in running and row in jobs:
                        self._retire(jobs.pop(row))
                new_rows = []
                for job in admitted:
                    row = BatchRow(job.prompt_ids, None, len(job.prompt_ids) + job.max_tokens, job.sampling,
                                   job.push, lambda job=job: not job.cancelled)
                    jobs[row] = job
                    new_rows.append(row)
                try:
                    placed = self._admit_in_place(batch, new_rows)
                except Exception as e:
                    self._fail_all(jobs, e)
                    batch = None
                    continue
                if placed:
                    self.running = len(batch.running())
                    self._gauges()
                    new_rows = None
            if admitted and new_rows is not None:
                rows = running + new_rows
                if self.pad_batches:
                    rows = rows + [idle_row(rows[0]) for _ in range(self._padded(len(rows)) - len(rows))]
                self.rebuilds += 1
                began = time.perf_counter()
                try:
                    carry = getattr(batch, "run", None)  # the replaced batch's acceptance estimate goes on
                    if batch is not None:
                        batch.drop_drafted()
                    batch = (TargetBatch(self.engine, rows) if self.target_only else
                             ChainBatch(self.engine, rows, use_head=self.use_head, on_step=self._on_step,
                                        budget=self.budget, carry=carry))
                    self.rebuild_s += time.perf_counter() - began
                except Exception as e:
                    self._fail_all(jobs, e)
                    batch = None
                    continue
                self.running = len(batch.running())
                self._gauges()
            if batch is None:
                continue
            if self.cohorts.on:  # the block's wall and tokens a live row, for the gate's rent
                mark = (time.perf_counter(), batch.emitted, sum(batch.live))
            try:
                batch.step()
            except Exception as e:
                self._fail_all(jobs, e)
                batch = None
                continue
            if self.cohorts.on:
                self._rent(batch, *mark)
            for b, (row, on) in enumerate(zip(batch.rows, batch.live)):
                job = jobs.get(row)  # None: an idle row
                if job is not None and not on and job.finish_reason is None and b not in batch.pending:
                    job.finish("cancelled" if job.cancelled else (job.out.stop_reason or "stop"))
            self.running = sum(batch.live)
            self._gauges()

    def _admit_in_place(self, batch, rows: list) -> bool:
        """Prefill `rows` into freed rows of the batch in flight (serving/batch.py `admit`); False when it
        cannot (then the caller rebuilds). Any other failure propagates: the caller fails the batch's
        requests, as after a failed step."""
        if batch is None or not self.admit_in_place or not batch.can_admit(rows, self.prefill_chunk):
            return False
        began = time.perf_counter()
        try:
            batch.admit(rows, self.prefill_chunk)
        except ValueError:  # a row in flight has no positions left to park: rebuild
            return False
        self.admitted_in_place += len(rows)
        self.admissions += 1
        took = time.perf_counter() - began  # (its first tokens' read waits for the device: all of it)
        self.admission_s += took
        self.cohorts.admitted(took)
        return True

    def _rent(self, batch, began: float, emitted: int, live: int) -> None:
        """The cohort gate's view after a block begun at `began` with `emitted` tokens so far and `live` rows
        (serving/cohorts.py): the queued requests that could start now (into free rows, or into a rebuilt batch where
        it has none) and the next end a running row's budget foresees."""
        now, running = time.perf_counter(), batch.running()
        fillable = min(self.max_batch - len(running), self.queue_depth())
        self.cohorts.stepped(now - began, fillable, len(batch.rows), now, batch.soonest_end(running),
                             (batch.emitted - emitted) / max(live, 1))

    def _padded(self, n: int) -> int:
        """The batch size n rows run at: the next power of two, at most max_batch."""
        return min(self.max_batch, 1 << (n - 1).bit_length())

    def _on_step(self, accepted: list[int], verified: int) -> None:
        if self.metrics is not None:
            self.metrics.observe_steps(accepted, verified)

    def _retire(self, job: Job) -> None:
        if job.finish_reason is None:
            job.finish("cancelled" if job.cancelled else (job.out.stop_reason or "stop"))

    def _fail_all(self, jobs: dict, e: Exception) -> None:
        log.exception("a batch failed; its requests get an error")
        for job in jobs.values():
            job.fail(f"decoding failed: {type(e).__name__}: {e}")
        jobs.clear()

    def _done(self, job: Job) -> None:
        self._active.discard(job)
        if self.metrics is not None:
            self.metrics.observe_job(job)


def idle_row(like):
    """A row that pads a batch: one token of context, its anchor given, no client (masked from its
    first block on, nothing pushed); `like`'s sampling, so it adds no sampling group."""
    from .rows import BatchRow

    return BatchRow([0], 0, 2, like.sampling, lambda ids: True, lambda: False)


def describe(scheduler: Scheduler) -> dict[str, Any]:
    budget = scheduler.budget if scheduler.batched else None
    return {"mode": scheduler.mode, "max_batch": scheduler.max_batch if scheduler.batched else 1,
            "max_queue": scheduler.max_queue, "verify_budget": "full" if budget is None else budget.label()}
