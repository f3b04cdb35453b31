"""The server's warm start: before /health says ok, everything traffic would otherwise build mid-traffic.

Without it the first requests paid for the fast engine's setup, and so did later ones: on one H200
(bench/results/serve_sweep_h200.json, issue #40) the speculative server's TTFT p99 was 1,145 ms at
4 requests/s (the target alone's 120 ms) and its TPOT p99 27.9 ms (3.0 ms), because

  - the static ragged cache (decoding/session.py `StaticSession`) and the static drafter are rebuilt, with all
    their graphs, whenever a batch needs more rows or positions than they have;
  - a CUDA graph (and a torch.compile of its shape) is made the first time a shape is met: per
    (batch size B, tokens per row T, kv bucket) for a step, per (B, padded prompt length) for a prefill,
    per (B, previous T, kv bucket) for the drafter's propose;
  - the auto verify budget measures the target's cost of each verify length at a new B (decoding/budget.py).

The warm start, run once by the worker before its loop (serving/scheduler.py):

  1. reserves the target's static cache, and the family's static drafter where it has one, at full
     size: the largest batch x the positions a request may reach (the server's max_model_len, which
     bounds prompt + max_tokens, plus the room a ChainBatch leaves: decoding/batched.py `chain_room`), so
     no batch ever re-creates them;
  2. per batch size the loop can build (Scheduler.batch_sizes), builds a batch of placeholder rows and
     visits every shape: a prefill at each padded prompt length a rebuild can meet, then, at a position
     in each kv bucket, a step of every verify length the budget may choose (and each one followed by a
     full block and by a plain step, the drafter's shapes after each), and the committed plain step.
     An eager drafter (a family without a static path) reads only the context it observed: its blocks
     run once where the rows are, and at each bucket the target's forwards alone;
  3. where the scheduler admits in place (serving/batch.py `admit`), per batch size of two rows or more
     (a batch of one is retired when its row ends, never admitted into), admission prefills through the
     real `admit` of a placeholder batch: of the whole batch (more than half its rows admitted) for each of
     those padded prompt lengths, one per kv bucket the rows in flight can park it in (their ends,
     decoding/session.py `_park`, set the bucket: a larger one than a prefill at position 0 meets), and, with a
     static drafter, one after each verify length (the pending block its `prefill(rows=)` writes first: a shape
     of its own); of the admitted rows alone (decoding/session.py `admission_rows`), each power of two up to half
     the batch at each padded prompt length; and, where the static drafter offers `visit_admissions`, its own
     write of the admitted prompts: one graph per power-of-two count of them at each padded prompt length (a
     visit above admits one row, a cohort more);
  4. seeds the auto budget's cost table at each of those batch sizes (ChainBatch.measure_costs).

`sweep=False` (the CPU default: nothing is captured or compiled there) visits the first kv bucket and
the shortest prefill only (and its first admission). Placeholder rows belong to no job: nothing reaches
/metrics, and the state they leave cannot change an output (every batch starts with its own prefill; a
row never reads the cache at or past its position before writing it: decoding/session.py and the static
drafters' own rule).
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from ..decoding.batched import chain_room
from ..decoding.session import admission_rows
from ..fast import KV_BLOCK, prefill_length
from ..sampling import Sampling
from .batch import ChainBatch, TargetBatch
from .rows import BatchRow, batch_target


def block_script(budgets: list[int]) -> list[int]:
    """The K' of the steps one kv bucket's visit runs, right after a prefill: a block with the largest
    K' (the drafter's propose with nothing pending), then each K' followed by that block (a propose
    after K' + 1 observed tokens) and, where plain steps may be chosen, by a plain step (a pending
    block written without a propose)."""
    spec = max(budgets)
    script = [spec]
    for kk in budgets:
        script += [kk, spec] + ([kk, 0] if 0 in budgets else [])
    return script


def prefill_contexts(positions: int, max_len: int, sweep: bool) -> list[int]:
    """A context length for each padded prompt length a rebuild can meet (`fast.prefill_length` of
    every length up to the longest, positions - 1, that a running row's context reaches)."""
    longest = max(1, positions - 1)
    lengths = [1 << i for i in range(longest.bit_length())] + [longest]  # prefill_length pads to powers of two
    out = sorted({min(prefill_length(n, max_len), longest) for n in lengths})
    return out if sweep else out[:1]


def bucket_ends(length: int, sweep: bool) -> list[int]:
    """One step end per kv bucket (`fast.KV_BLOCK`, the target's and the static drafters') up to
    `length` positions (the first only without the sweep)."""
    ends = list(range(KV_BLOCK, length, KV_BLOCK)) + [length]
    return ends if sweep else ends[:1]


def admission_ends(t: int, low: int, length: int, max_len: int, sweep: bool) -> list[int]:
    """Parked ends for an admission prefill of padded length t, one per kv bucket (of end + t) it can
    land in: the rows in flight's ends run from `low` (past a step's tokens) to `length`, and parking
    needs t positions past them in the cache (decoding/session.py `_park`). The first only without the sweep."""
    top = min(length, max_len - t)
    if top < low:
        return []
    sums = [s for s in range(KV_BLOCK, top + t, KV_BLOCK) if s - t >= low] + [top + t]
    ends = [s - t for s in sums]
    return ends if sweep else ends[:1]


def placeholder_rows(n: int, context: int, positions: int, alive: bool = True) -> list[BatchRow]:
    """n greedy rows of `context` tokens that never finish and belong to no job. alive=False: rows whose
    client has gone (their slot stays free for the next admission)."""
    return [BatchRow([0] * context, None, positions, Sampling(temperature=0.0), lambda ids: False, lambda: alive)
            for _ in range(n)]


def whole_admission(b: int) -> int:
    """The fewest rows an admission into a batch of b rows prefills as the whole batch (decoding/session.py
    `admission_rows`: fewer run alone, at the front of the cache)."""
    return next(n for n in range(1, b + 1) if admission_rows(n, b) == b)


def visit_admissions(warm, contexts: list[int], verify: list[Optional[int]], *, positions: int, length: int,
                     max_len: int, sweep: bool) -> int:
    """Admission prefills into freed rows of `warm` (its first `whole_admission` rows' clients gone), each through
    `admit` as traffic runs it, right after a step that parks the rows in flight at an end admission_ends chose:
    every padded prompt length at each of its buckets after a step of K' = verify[0], and at the first of them
    one after each other K' too (the pending block the drafter writes first has its shape). Those admit
    `whole_admission` rows (a prefill of the whole batch, the rows in flight parked: their ends set its bucket);
    fewer run alone at the front of the cache, a power of two of them from position 0 (batch.py pads a count
    short of one), so each such count is visited once per prompt length. verify: the K' of the parking steps,
    largest first (None: the target alone's step). -> how many (0 where the batch cannot admit in place)."""
    if not warm.can_admit(placeholder_rows(1, contexts[0], positions)):
        return 0  # a drafter that cannot take rows in flight: admission rebuilds
    first = verify[0]
    t_step = 1 if first is None else first + 1
    whole = whole_admission(len(warm.rows))
    visits = []
    for context in contexts:
        ends = admission_ends(prefill_length(context, max_len), t_step, length, max_len, sweep)
        for end in ends:
            visits += [(context, end, kk, whole) for kk in (verify if sweep and not visits else verify[:1])]
        front = 1
        while ends and front < whole:  # the fronts: one visit each, at the first end, after a step of verify[0]
            visits.append((context, ends[0], first, front))
            front *= 2
    for context, end, kk, n in visits:
        # every parking step starts where a block of K' = verify[0] ending at `end` does, as the bucket
        # visits' blocks start (their shapes, nothing new); a shorter K' parks the rows a little earlier
        warm.seek(end - t_step)
        if kk is None:
            warm.step()
        else:
            warm.step(verify=kk)
        warm.admit(placeholder_rows(n, context, positions, alive=False))
    return len(visits)


@torch.inference_mode()
def warm_start(engine, *, batch_sizes: list[int], positions: int, target_only: bool, use_head: bool,
               budget=None, sweep: Optional[bool] = None, measure: Optional[bool] = None,
               admit: bool = False) -> "WarmStart":
    """Reserve, visit every shape, seed the budget (module docstring) -> what it did (WarmStart).
    positions: what a request may reach (prompt + max_tokens <= the server's max_model_len).
    sweep: every kv bucket and prefill length (default: on CUDA). measure: seed the auto budget's
    costs (default: on CUDA, where ChainBatch measures them; elsewhere auto reads a given table).
    admit: the scheduler admits in place, so visit its prefills too."""
    t0 = time.perf_counter()
    cuda = engine.target.device.type == "cuda"
    sweep = cuda if sweep is None else sweep
    adapter = None if target_only else engine.adapter
    k = getattr(engine.adapter, "num_slots", 0)
    length = positions + chain_room(k)  # the room a ChainBatch leaves past its longest row (TargetBatch: less)
    target = batch_target(engine, max(batch_sizes), length)
    report = {"batch_sizes": list(batch_sizes), "positions": positions, "cache": _cache(target)}
    runners_before = _captures(target)
    budgets = [] if adapter is None else [k] if budget is None else budget.choices(k)
    auto = budget is not None and budget.mode == "auto"
    static_drafter, drafter = False, None
    if adapter is not None:
        from ..decoding.batched import static_batch_drafter

        drafter = static_batch_drafter(adapter, target, length, max(batch_sizes))
        static_drafter = drafter is not None
        report["drafter"] = "static" if static_drafter else "eager"
        report["verify_lengths"] = sorted({kk + 1 for kk in budgets} | ({1} if auto else set()))
    static = target.kv_path == "static"  # a DynamicCache captures nothing: only the costs to measure
    contexts = prefill_contexts(positions, target.lm.max_len if static else length, sweep and static)
    ends = bucket_ends(length, sweep) if static else []
    script = block_script(budgets) if budgets else []
    measure = auto and (cuda if measure is None else measure)

    def batch(b: int, context: int, gone: int = 0):
        # `gone` first rows whose client has gone: free for an admission
        rows = placeholder_rows(gone, context, positions, alive=False) + placeholder_rows(b - gone, context, positions)
        return TargetBatch(engine, rows) if adapter is None else ChainBatch(engine, rows, use_head=use_head)

    capture = () if adapter is None else tuple(adapter.capture_layers())
    lengths = sorted({kk + 1 for kk in budgets})
    steps = admitted = 0
    # admission in place needs the static cache (elsewhere it rebuilds, and a rebuild's prefill is at
    # position 0) and a drafter that takes rows in flight (ChainBatch.can_admit, asked in visit_admissions):
    # a static one, or an eager context (its blocks after a seek read a stale context: nothing kept)
    admit = admit and static
    verify = [None] if adapter is None else sorted(budgets, reverse=True)
    for b in batch_sizes:
        for n in contexts[1:]:  # each longer padded prompt length: its prefill
            batch(b, n)
        for i, end in enumerate(ends or [None]):  # each kv bucket, right after a prefill: nothing pending
            warm = batch(b, contexts[0])
            if i == 0 and measure:
                warm.measure_costs(budget.start(k, b, engine.target.device.type))
            if end is None:
                continue
            blocks = script if static_drafter or i == 0 else []
            for kk in blocks:  # a static drafter's blocks at each bucket: its graphs too
                if static_drafter:
                    warm.seek(max(end - k - 1, 0))
                warm.step(verify=kk)
            # an eager drafter reads the context it observed: its blocks ran once, where the rows are, and
            # each bucket gets the target's forwards alone
            visits = [] if static_drafter else [(t, capture) for t in lengths]
            if adapter is None or auto:  # the target alone's step (the committed plain loop's, under auto)
                visits.append((1, ()))
            for t, layers in visits:
                warm.visit(t, end, layers)
            steps += len(blocks) + len(visits)
        if admit and b > 1:  # a batch of one row is retired when its row ends: nothing is admitted into it
            n = visit_admissions(batch(b, contexts[0], gone=whole_admission(b)), contexts, verify, positions=positions,
                                 length=length, max_len=target.lm.max_len, sweep=sweep)
            admitted, steps = admitted + n, steps + n
    if admit and admitted and hasattr(drafter, "visit_admissions"):
        # the drafter's admission prefills at every width of admitted rows (a visit above admits one row)
        report["drafter_admission_shapes"] = drafter.visit_admissions(contexts)
    if cuda:
        torch.cuda.synchronize()
    report.update(prefill_lengths=len(contexts), kv_buckets=len(ends), steps=steps, admission_prefills=admitted,
                  graphs=_captures(target) - runners_before, seconds=round(time.perf_counter() - t0, 3))
    return WarmStart(engine, target, report)


class WarmStart:
    """What the warm start did (`report`) and, asked later (/health), what traffic has built since:
    target graphs captured after it (`graphs_since`, 0 when it covered every shape met) and whether
    the engine still decodes on the cache it reserved (`cache_kept`)."""

    def __init__(self, engine, target, report: dict):
        self.engine, self.target, self.report = engine, target, report
        self._graphs = _captures(target)

    def status(self) -> dict:
        out = dict(self.report)
        if self.target.kv_path == "static":
            out["graphs_since"] = _captures(self.target) - self._graphs
            out["cache_kept"] = getattr(self.engine, "_ragged_static", None) is self.target
        return out


def _cache(target) -> dict:
    lm = getattr(target, "lm", None)  # the static ragged target's FastLM; a DynamicCache has none
    if lm is None:
        return {"kind": target.kv_path}
    return {"kind": target.kv_path, "rows": lm.max_batch, "positions": lm.max_len}


def _captures(target) -> int:
    """CUDA graphs the target's runners have captured (0 on a CPU, or on the dynamic cache); a copy of
    the runners first: /health asks from the event loop while the worker may add one."""
    return sum(getattr(r, "captures", 0) for r in list(getattr(target, "runners", {}).values()))
