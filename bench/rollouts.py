"""Many prompts at a fixed concurrency, rows refilled as they end: the target alone against + Domino.

bench/concurrency.py decodes static batches: a batch runs until its slowest row ends, and speculation, which
spreads the rows' ends, loses there past B = 8 (docs/results.md §0c, session 44). Serving and RL rollouts keep
B rows busy instead: an ended row takes the next prompt. This drives `serve`'s worker (serving/scheduler.py:
continuous batching, admission in place, the verify budget) directly, with no HTTP and no detokenising: all
--num-prompts prompts are queued at once and at most B decode at a time. Each mode (`--target-only`, and the
drafter + the Domino head) in turn gets its own scheduler per B, warm-started over every batch size it builds
(serving/warmup.py), then decodes the prompts once untimed (the verify budget learns its costs and acceptance;
+ Domino's on CUDA until its measured arms settle, serving/windows.py, at most --settle-passes) and --rounds times
timed. tokens/s = generated tokens / the wall from the first
submission to the last completion; each mode's timed passes also report their admission calls in place and the wall
seconds in them and in rebuilds (an admission prefills the whole batch, however few rows it admits). Greedy: each
prompt's tokens under + Domino equal the target alone's (`identical_to_target`). + Domino's timed blocks by the K'
they verified (0: a plain step through the chain; a batch committed to plain steps counts one block a step) and its
accepted drafts per row-step.

    python3 bench/rollouts.py --run RUN --prompts …/gsm8k/prompts.jsonl --num-prompts 256 \
        --concurrency 1,8,16,32,64 --temperatures 0,1 --out bench/results/rollouts_<gpu>.json
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from concurrency import load, read_items  # noqa: E402

MODES = ("target", "domino")


def run_jobs(scheduler, specs: list[dict], timeout_s: float = None) -> list[list[int]]:
    """Jobs (each spec: Job's keyword arguments bar `detokenize` and `send`) submitted at once; -> each one's
    tokens once all have ended (RuntimeError if any failed or, with `timeout_s`, did not end in time)."""
    from domino_graft.serving.scheduler import Job

    done = threading.Semaphore(0)
    failed: list[str] = []

    def send(event: tuple) -> None:
        if event[0] == "error":
            failed.append(event[1])
        if event[0] in ("done", "error"):
            done.release()

    jobs = [Job(**spec, detokenize=lambda t: "", send=send) for spec in specs]
    for job in jobs:
        scheduler.submit(job)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    for _ in jobs:
        if not done.acquire(timeout=None if deadline is None else max(0.0, deadline - time.monotonic())):
            raise RuntimeError(f"requests still running after {timeout_s} s")
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed; the first: {failed[0]}")
    return [list(job.tokens) for job in jobs]


def decode_all(scheduler, items: list[list[int]], max_new: int, sampling, stop_ids) -> tuple[list[list[int]], float]:
    """Every prompt through the scheduler at once -> (each prompt's tokens, wall seconds)."""
    t0 = time.perf_counter()
    tokens = run_jobs(scheduler, [dict(prompt_ids=ids, max_tokens=max_new, sampling=sampling, stop=[],
                                       stop_ids=stop_ids) for ids in items])
    return tokens, time.perf_counter() - t0


class StepTally:
    """The scheduler's metrics hooks (serving/metrics.py's names), keeping only what the report reads: the row-steps
    of speculative and plain blocks, their accepted drafts, and the blocks by the K' they verified."""

    class _Gauge:
        def set(self, value) -> None:
            pass

    queue_depth = batch_size = _Gauge()

    def __init__(self):
        self.row_steps, self.accepted, self.blocks_by_k = 0, 0, collections.Counter()

    def observe_steps(self, accepted: list[int], k: int) -> None:
        self.row_steps += len(accepted)
        self.accepted += sum(accepted)
        self.blocks_by_k[k] += 1

    def observe_job(self, job) -> None:
        pass


def measure(engine, items, b: int, temperature: float, args, budgets: dict) -> dict:
    """One concurrency at one temperature: each mode in turn its own scheduler (warm-started before any prompt;
    two workers on one engine never run at once), an untimed pass, then the timed rounds."""
    from domino_graft.sampling import Sampling
    from domino_graft.serving.scheduler import Scheduler

    positions = max(len(x) for x in items) + args.max_new_tokens
    sampling = Sampling(temperature=temperature, seed=0 if temperature > 0 else None)
    row = {"concurrency": b, "temperature": temperature, "num_prompts": len(items), "walls_s": {}}
    tokens = {}
    for mode in MODES:
        tally = StepTally()
        s = Scheduler(engine, max_batch=b, max_queue=len(items), target_only=mode == "target", metrics=tally,
                      budget=budgets.get(mode), warm_start=positions if args.device == "cuda" else None)
        s.start()
        try:
            while s.warming and s.alive:
                time.sleep(0.05)
            if not s.alive:
                raise RuntimeError(f"the {mode} scheduler's worker ended: {s.error}")
            # untimed: the budget learns; + Domino's on CUDA until its measured arms have a verdict at this size
            # (serving/windows.py: windows of 0.1 s, both arms measured), at most --settle-passes
            budget, passes = budgets.get(mode), 0
            while True:
                decode_all(s, items, args.max_new_tokens, sampling, engine.stop_ids)
                passes += 1
                if (budget is None or args.device != "cuda" or passes >= args.settle_passes
                        or budget.outcomes.settled(b)):
                    break
            row[f"{mode}_untimed_passes"] = passes
            tally.__init__()  # the timed passes' blocks only
            before = (s.admissions, s.admission_s, s.rebuild_s)
            walls = []
            for _ in range(args.rounds):
                toks, wall = decode_all(s, items, args.max_new_tokens, sampling, engine.stop_ids)
                walls.append(round(wall, 5))
                tokens.setdefault(mode, toks)
        finally:
            s.stop(timeout=60, abandon=True)
        n = sum(len(t) for t in tokens[mode])
        row["walls_s"][mode] = walls
        row[f"{mode}_tokens"] = n
        row[f"{mode}_tokens_per_s"] = round(n / statistics.median(walls), 1)
        row[f"{mode}_rebuilds"], row[f"{mode}_admitted_in_place"] = s.rebuilds, s.admitted_in_place
        # the timed passes' admission calls in place and wall seconds in them and in rebuilds (serving/scheduler.py)
        calls, admit_s, rebuild_s = (now - then for now, then in
                                     zip((s.admissions, s.admission_s, s.rebuild_s), before))
        row[f"{mode}_timed_admissions"] = calls
        row[f"{mode}_timed_admission_s"], row[f"{mode}_timed_rebuild_s"] = round(admit_s, 4), round(rebuild_s, 4)
        if mode == "domino" and budgets.get(mode) is not None:  # the measured arms at this size, if any
            row["domino_outcomes"] = budgets[mode].outcomes.summary(b)
        if mode == "domino":  # (the target alone's batch reports no blocks)
            row["domino_blocks_by_k"] = {str(k): n for k, n in sorted(tally.blocks_by_k.items())}
            row["domino_accepted_per_row_step"] = round(tally.accepted / max(tally.row_steps, 1), 4)
    row["speedup"] = round(row["domino_tokens_per_s"] / row["target_tokens_per_s"], 4)
    if temperature == 0:
        same = [a == t for a, t in zip(tokens["domino"], tokens["target"])]
        row["identical_to_target"], row["not_identical"] = all(same), same.count(False)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a run dir or bundle (the graft)")
    p.add_argument("--prompts", type=Path, help="a prompts JSONL (default: the GSM8K test questions)")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--concurrency", default="1,8,16,32,64", help="rows decoding at once (comma-separated)")
    p.add_argument("--temperatures", default="0", help="comma-separated; 0 = greedy (identity checked)")
    p.add_argument("--verify-budget", default="auto", help="+ Domino's: full, auto or N (decoding/budget.py)")
    p.add_argument("--verify-costs", default=None, help="a cost table for auto (off CUDA)")
    p.add_argument("--rounds", type=int, default=2, help="timed passes a mode (medians)")
    p.add_argument("--settle-passes", type=int, default=6,
                   help="+ Domino's untimed passes at most, on CUDA, until its measured arms settle")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the mechanics (numbers meaningless)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from domino_graft.decoding.budget import budget_option

    loaded, engine = load(args.run, args.dtype, args.device, "auto")
    items = read_items(loaded, args.prompts, args.num_prompts)
    command = " ".join(["bench/rollouts.py", *(sys.argv[1:] if argv is None else argv)])
    report = {"what": __doc__.splitlines()[0], "run": args.run, "max_new_tokens": args.max_new_tokens,
              "verify_budget": args.verify_budget, "dtype": args.dtype, "rounds": args.rounds,
              **harness.environment(command), "by_concurrency": []}
    for temperature in [float(x) for x in args.temperatures.split(",")]:
        # + Domino's budget goes on from one concurrency to the next, as one server's would
        budget = budget_option(args.verify_budget, args.verify_costs, 2)  # (2: any batched size; it gates fixed N)
        for b in [int(x) for x in args.concurrency.split(",")]:
            row = measure(engine, items, b, temperature, args, {"domino": budget})
            report["by_concurrency"].append(row)
            print(f"B = {b} T = {temperature:g}: target {row['target_tokens_per_s']:,.0f}, + Domino "
                  f"{row['domino_tokens_per_s']:,.0f} tok/s ({row['speedup']:.3f}x); identical "
                  f"{row.get('identical_to_target')}", flush=True)
            harness.write_json(args.out, report)  # after every row: a cut-off run keeps what it measured
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
