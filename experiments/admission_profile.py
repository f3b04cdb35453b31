"""Where an admission in place goes on the GPU (serving/batch.py `admit`, through serve's worker).

On the H100 at 32 rows an admission cost ~7 ms against a ~1 ms SmolLM2 step, whether it prefilled the whole batch or the
admitted rows alone (bench/results/served_rollouts_h100/), so the prefill's rows are not what it pays. This runs
bench/rollouts.py's setting (GSM8K prompts, B rows refilled as they end, greedy) for the target alone and for + Domino
verifying every block in full (no verify budget: every admission a speculating row's), and during one timed pass times
the admission's parts with a device sync on each side of each (so a part's time is its own launches and kernels, not its
neighbours'): the wait for the work in flight when the admission starts, the target's prefill (its host-side padding and
parking, the graph runner, the logits, the features), the drafter's prefill, the first tokens' pick, the sampling
groups. It also records each admission's wall without the syncs (as the scheduler's `admission_s` does), its prefill
shape, and whether a CUDA graph was captured inside it (a shape the warm start did not visit).

--count-ops adds a pass that counts, per part, the torch ops an admission dispatches on the host (each a kernel
launch on CUDA, views aside) and its graph calls (the target's runner, the drafters' captured calls: one replay each
on CUDA, so the ops inside them are not counted): the same on any device, so a CPU run says where the launches are.
--pad-prefills on|off sets the static DFlash drafter's padded, graphed prefills (adapters/dflash/fast.py; default:
where graphs are captured). Each mode records its warm start's report and, on CUDA, the memory held once it ends
(`cuda_memory_after_warm_start`: the graphs' pools and buffers beside the weights and caches).

    python experiments/admission_profile.py --run RUN --prompts …/gsm8k/prompts.jsonl --out admission_profile.json
    python experiments/admission_profile.py --run RUN --device cpu --count-ops --pad-prefills off --out …
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import harness  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
import rollouts  # noqa: E402
from concurrency import load, read_items  # noqa: E402


class Parts:
    """Synced seconds of wrapped methods, counted only inside an admission (`admission` is the outer part)."""

    def __init__(self, sync):
        self.sync, self.inside, self.on = sync, False, False
        self.seconds, self.calls, self.saved = {}, {}, []
        self.admissions: list[dict] = []
        self.ops: Ops | None = None  # set: the pass counts ops instead of timing

    def wrap(self, owner, name: str, key: str, outer: bool = False, count_only: bool = False) -> None:
        fn = getattr(owner, name)
        self.saved.append((owner, name, vars(owner).get(name)))
        parts = self

        def timed(*a, **kw):
            if parts.ops is not None:
                return parts.ops.within(key, outer, fn, a, kw)
            if count_only or not parts.on or (not outer and not parts.inside):
                return fn(*a, **kw)
            if outer:
                from domino_graft.fast.graphs import graphs_captured

                parts.admissions.append({})  # this call's record (its shape, its wall, its captures)
                t0 = time.perf_counter()
                parts.sync()
                parts._add("wait_for_work_in_flight", time.perf_counter() - t0)
                parts.inside, captured, t1 = True, graphs_captured(), time.perf_counter()
                try:
                    out = fn(*a, **kw)
                    parts.sync()
                finally:
                    parts.inside = False
                parts._add(key, time.perf_counter() - t1)
                parts.admissions[-1].update(ms=round(1e3 * (time.perf_counter() - t1), 3),
                                            captured=graphs_captured() - captured, placed=bool(out))
                return out
            parts.sync()
            t1 = time.perf_counter()
            out = fn(*a, **kw)
            parts.sync()
            parts._add(key, time.perf_counter() - t1)
            return out

        setattr(owner, name, staticmethod(timed) if isinstance(vars(owner).get(name), staticmethod) else timed)

    def _add(self, key: str, s: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + s
        self.calls[key] = self.calls.get(key, 0) + 1

    def restore(self) -> None:
        for owner, name, fn in reversed(self.saved):
            if fn is None:
                delattr(owner, name)
            else:
                setattr(owner, name, fn)

    def report(self) -> dict:
        return {k: {"calls": self.calls[k], "total_ms": round(1e3 * s, 2),
                    "mean_ms": round(1e3 * s / self.calls[k], 3)} for k, s in sorted(self.seconds.items())}


class Ops(TorchDispatchMode):
    """The torch ops dispatched inside admissions, by part (the innermost wrapped method running), and the graph
    calls (GRAPH_CALLS: one replay on CUDA; nothing inside them is counted). Views count too: each is a dispatch."""

    GRAPH_CALLS = ("target_prefill.graph_runner", "captured_call")

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.muted = 0
        self.by_part: collections.Counter = collections.Counter()
        self.graphs: collections.Counter = collections.Counter()
        self.by_op: collections.Counter = collections.Counter()
        self.admissions = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.muted:
            self.by_part[self.stack[-1]] += 1
            self.by_op[f"{self.stack[-1]}: {func}"] += 1
        return func(*args, **(kwargs or {}))

    def within(self, key: str, outer: bool, fn, a, kw):
        if outer:  # an admission: counted where it placed its rows (a call that found no room returns at once)
            before = (self.by_part.copy(), self.graphs.copy(), self.by_op.copy())
            self.stack.append(key)
            try:
                with self:
                    out = fn(*a, **kw)
            finally:
                self.stack.pop()
            if out:
                self.admissions += 1
            else:
                self.by_part, self.graphs, self.by_op = before
            return out
        if not self.stack:  # outside an admission
            return fn(*a, **kw)
        graph = key in self.GRAPH_CALLS
        if graph and not self.muted:
            self.graphs[self.stack[-1]] += 1
        self.stack.append(key)
        self.muted += graph
        try:
            return fn(*a, **kw)
        finally:
            self.muted -= graph
            self.stack.pop()

    def report(self) -> dict:
        n = max(self.admissions, 1)
        return {"admissions": self.admissions,
                "dispatches_per_admission": {k: round(v / n, 1) for k, v in self.by_part.most_common()},
                "dispatches_total_per_admission": round(sum(self.by_part.values()) / n, 1),
                "graph_calls_per_admission": {k: round(v / n, 2) for k, v in self.graphs.most_common()},
                "top_ops_per_admission": {k: round(v / n, 1) for k, v in self.by_op.most_common(25)}}


def instrument(parts: Parts) -> None:
    from domino_graft.decoding import session
    from domino_graft.fast import FastLM, GraphRunner
    from domino_graft.serving import batch as batch_module
    from domino_graft.serving.scheduler import Scheduler

    parts.wrap(Scheduler, "_admit_in_place", "admission", outer=True)
    rows_cls = batch_module.ChainBatch.__mro__[1]  # the rows' common base (_Rows)
    for owner, name, key in [
        (rows_cls, "_prefill_admitted", "target_prefill"),
        (session.StaticSession, "_park", "target_prefill.park"),
        (session, "_right_pad", "target_prefill.right_pad"),
        (GraphRunner, "__call__", "target_prefill.graph_runner"),
        (FastLM, "project_logits", "target_prefill.project_logits"),
        (session.StaticSession, "_features", "target_prefill.features"),
        (batch_module.ChainBatch, "_prefill_drafter", "drafter_prefill"),
        (rows_cls, "_pick_rows", "first_tokens_pick"),
        (batch_module, "sampling_groups", "sampling_groups"),
        (rows_cls, "_off_the_clock", "off_the_clock"),
        (batch_module.ChainBatch, "drop_drafted", "drop_drafted"),
    ]:
        parts.wrap(owner, name, key)
    from domino_graft.fast import CapturedCall

    parts.wrap(CapturedCall, "__call__", "captured_call", count_only=True)  # timed within its part


def shapes(parts: Parts) -> None:
    """Each admission's rows admitted and prefill shape (recorded before the call, unsynced)."""
    from domino_graft.decoding import session

    fn = session.StaticSession.prefill

    def prefill(self, prompts, capture, rows=None, starts=None):
        if parts.on and parts.inside:
            from domino_graft.fast import prefill_length

            parts.admissions[-1].update(admitted=len(rows or prompts), batch_rows=self.rows,
                                        t=prefill_length(max(p.numel() for p in prompts), self.lm.max_len))
        return fn(self, prompts, capture, rows, starts)

    parts.saved.append((session.StaticSession, "prefill", fn))
    session.StaticSession.prefill = prefill


def run_mode(engine, items, mode: str, args, parts: Parts) -> dict:
    from domino_graft.sampling import Sampling
    from domino_graft.serving.scheduler import Scheduler

    positions = max(len(x) for x in items) + args.max_new_tokens
    s = Scheduler(engine, max_batch=args.concurrency, max_queue=len(items), target_only=mode == "target",
                  metrics=rollouts.StepTally(), budget=None,
                  warm_start=args.warm_start or (positions if args.device == "cuda" else None))
    sampling = Sampling()
    s.start()
    try:
        while s.warming and s.alive:
            time.sleep(0.05)
        memory = harness.cuda_memory() if args.device == "cuda" else None  # the warm start's graphs and buffers held
        rollouts.decode_all(s, items, args.max_new_tokens, sampling, engine.stop_ids)  # untimed
        before = (s.admissions, s.admission_s)
        _, wall = rollouts.decode_all(s, items, args.max_new_tokens, sampling, engine.stop_ids)
        calls, admit_s = s.admissions - before[0], s.admission_s - before[1]
        parts.on, parts.seconds, parts.calls, parts.admissions = True, {}, {}, []
        try:
            _, synced_wall = rollouts.decode_all(s, items, args.max_new_tokens, sampling, engine.stop_ids)
        finally:
            parts.on = False
        counted = None
        if args.count_ops:
            parts.ops = Ops()
            try:
                rollouts.decode_all(s, items, args.max_new_tokens, sampling, engine.stop_ids)
            finally:
                counted, parts.ops = parts.ops.report(), None
    finally:
        s.stop(timeout=60, abandon=True)
    recs = [a for a in parts.admissions if "ms" in a]
    placed = [a["ms"] for a in recs if a["placed"]]
    return {"unsynced_pass": {"wall_s": round(wall, 3), "admissions": calls, "admission_s": round(admit_s, 4),
                              "ms_per_admission": round(1e3 * admit_s / max(calls, 1), 3)},
            "synced_pass": {"wall_s": round(synced_wall, 3), "parts": parts.report(),
                            # of the calls that admitted (a call that found no room returns at once; a rebuild follows)
                            "admission_ms_median": statistics.median(placed) if placed else None,
                            "graphs_captured_in_admissions": sum(a["captured"] for a in recs),
                            "admissions": recs},
            **({"ops_pass": counted} if counted is not None else {}),
            **({"cuda_memory_after_warm_start": memory} if memory is not None else {}),
            "warm_start": s.warm.report if s.warm is not None else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a run dir (apply smollm2_graft on the shipped drafter)")
    p.add_argument("--prompts", type=Path, help="a prompts JSONL (default: the GSM8K test questions)")
    p.add_argument("--num-prompts", type=int, default=96)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the mechanics (times meaningless)")
    p.add_argument("--modes", default="target,domino", help="comma-separated: target (alone), domino (+ Domino)")
    p.add_argument("--count-ops", action="store_true", help="a pass counting each part's dispatches and graph calls")
    p.add_argument("--pad-prefills", choices=["auto", "on", "off"], default="auto",
                   help="the static DFlash drafter's padded, graphed prefills (auto: where graphs are captured)")
    p.add_argument("--warm-start", type=int, help="the positions the worker's warm start reserves (default: on CUDA "
                   "the longest prompt + max new tokens; on a CPU none, so a longer one gives its rows room to park)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import torch

    torch.manual_seed(0)
    cuda = args.device == "cuda"
    loaded, engine = load(args.run, "bf16" if cuda else "fp32", args.device, "auto")
    items = read_items(loaded, args.prompts, args.num_prompts)
    parts = Parts(torch.cuda.synchronize if cuda else lambda: None)
    instrument(parts)
    if args.pad_prefills != "auto":
        from domino_graft.adapters.dflash.fast import StaticDFlashDrafter

        StaticDFlashDrafter.PAD_PREFILLS = args.pad_prefills == "on"
    shapes(parts)
    report = {**harness.environment(), "run": args.run, "num_prompts": len(items), "concurrency": args.concurrency,
              "max_new_tokens": args.max_new_tokens, "pad_prefills": args.pad_prefills, "modes": {}}
    try:
        for mode in args.modes.split(","):
            report["modes"][mode] = run_mode(engine, items, mode, args, parts)
            m = report["modes"][mode]
            print(mode, m["unsynced_pass"], {k: v["mean_ms"] for k, v in m["synced_pass"]["parts"].items()},
                  "captured", m["synced_pass"]["graphs_captured_in_admissions"], flush=True)
            if "ops_pass" in m:
                print(mode, "dispatches", m["ops_pass"]["dispatches_per_admission"], "graph calls",
                      m["ops_pass"]["graph_calls_per_admission"], flush=True)
    finally:
        parts.restore()
    harness.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
