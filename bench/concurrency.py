"""Throughput against concurrency (issue #27): N GSM8K prompts decoded B at a time, for B = 1, 2,
4, ..., 32, by the target alone, the base DFlash drafter and the drafter + Domino, greedy, on the
engine's default path: the real SmolLM2-135M-Instruct target with the drafter the repository
ships (models/smollm2-135m-dflash/) and a Domino head grafted onto it (bench/end_to_end.py's
graft, reused by import), or any trained run dir / bundle given with --run.

    python bench/concurrency.py --run WORK/graft --out concurrency_h200.json           # a trained graft
    python bench/concurrency.py --data WORK/train.regen.jsonl --work WORK --out ...    # graft it first

Batch size 1 runs the solo path bench/end_to_end.py times (Engine.target_only / speculative: on a
GPU the static target and DFlash's static drafter, both graphed; --verify-budget auto there decides
per decode between all K and the target alone for the rest of it, decoding/chain.py; a fixed N
runs the batched chain one row at a time); B > 1 the batched chains
(decoding/batched.py: the static ragged target under CUDA graphs per batch size, and DFlash's static
drafter over the ragged batch, graphed too). --also-batched-1 adds a row "1_batched": the batched path at B = 1, to see
what the batched code itself costs. Each row says which path ran (`path`).

Per batch size: every shape it will meet (its batch sizes, both ends of the prompt lengths) is decoded
once untimed first (compile, graph capture, cache sizing; with --verify-budget auto also with every draft
verified, at each shorter K' the budget may choose, and cycling through every K' after every other, so that
no timed batch captures a graph; under auto the budget's own warm-up then decodes batches of the prompts in
order, at most SETTLE_BATCHES, until the size is settled: both arms, speculating and the target alone, measured
by whole decodes and apart beyond their spread, or measured enough (decoding/outcomes.py); then the
prompts in order, B at a time, each batch by the three modes in turn, in each of the six orders by turns
(`ORDERS`: every mode goes first, and follows each other mode, equally often, and each order is followed by its
reverse, so an even count of batches runs each mode before each other as often as after it; until 13bdded the
order only rotated). tokens/s = generated tokens / wall
seconds of the batches (prefill included); per-request tokens/s = each request's tokens over its own
latency (a row's latency ends when it does), averaged; speedup_<mode>_median_batch = the median over batches of the
mode's tokens/s over the target's in the same batch (robust to one stalled decode); by_batch's
domino_speedup_ci95 = a 95% interval of + Domino's over the target's, resampling batches (`speedup_interval`;
`--summarize REPORT` prints it for an earlier report). `batches`: each timed batch's mode order and
each mode's wall seconds and the CUDA graphs it captured (none, when the warm-up met every shape), and for a
speculative mode under a verify budget whether its decode started committed (those that did not are the
decodes that can differ from the target alone's where the budget commits), its arm (decoding/outcomes.py) and the
K' it chose; verify_budget_outcomes: each size's arms' decodes and medians, verdict and probe gap.
identical_to_target: every row of every batch, in every mode, equals the target-alone solo greedy output (batch
size 1's target decodes, or a solo pass first when 1 is not among the sizes).

--rounds R times every batch R times over (a row's num_prompts counts each decode): at B = 64 the 64
prompts are one batch a mode, ~0.2 s, within the noise of one measurement. --min-batches M gives each B
at least M timed batches a mode (more rounds only where N / B < M).
--deadline-s S: the report is rewritten after every batch, and no batch starts after S seconds
(the row then says complete: false): a time-limited call leaves what it measured.
The garbage collector runs between timed decodes, never inside one, for every mode alike: after the
warm-up the heap is frozen (`gc.freeze`) and collected before each decode.
CPU smoke (numbers meaningless): tests/test_concurrency_bench.py.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import end_to_end as e2e  # noqa: E402  (bench/ is not a package)
import harness  # noqa: E402

MODES = ("target", "base", "domino")
# the order of the modes within a batch, batch after batch: all six, so that each mode goes first and follows
# each other mode equally often (each ordered pair sits side by side in two of them); each order is followed by
# its reverse, so that any even number of batches runs every mode before every other as often as after it (a mode
# that runs after another was measured ~0.2-0.4% faster on an H100; 16 batches in plain permutation order ran
# the target before + Domino in 9 of them)
ORDERS = [o for p in itertools.permutations(MODES) if p < p[::-1] for o in (list(p), list(p[::-1]))]
# the batches at most that the budget's warm-up decodes until a size is settled (`measure`): OUTCOME_MIN whole
# decodes of each arm apart beyond their spread, or full windows (decoding/outcomes.py); a decode that captured
# a graph none. Arms apart against the step model's choice wait for both windows (2 x 8 decodes, in turn): 16
# left no room for the model's own first decodes
SETTLE_BATCHES = 24


class Clock:
    def __init__(self, deadline_s):
        self.t0 = time.monotonic()
        self.deadline_s = deadline_s

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def over(self) -> bool:
        return self.deadline_s is not None and self.elapsed() >= self.deadline_s


def load(run: str, dtype: str, device: str, kv: str):
    """(loaded run, engine) as end_to_end.decode builds them."""
    import torch

    from domino_graft.decoding import Engine
    from domino_graft.decoding.chat import stop_token_ids
    from domino_graft.loading import load_run_or_bundle

    loaded = load_run_or_bundle(run, device=device)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    loaded.target.model.to(dt)
    loaded.adapter.to(dt)
    loaded.head.to(dt)
    engine = Engine(loaded.target, loaded.adapter, loaded.head, rollout="triton" if device == "cuda" else "torch",
                    stop_ids=stop_token_ids(loaded.target), kv=kv)
    return loaded, engine


def read_items(loaded, path, limit: int) -> list[list[int]]:
    """The first `limit` prompts (token ids): of --prompts FILE, else the GSM8K test questions."""
    if path is None:
        return [ids for s, _, ids in e2e.prompts(loaded, limit) if s == "gsm8k"]
    from domino_graft.benchmark import encode, read_prompts

    return [encode(loaded, item) for item in read_prompts(str(path), limit=limit)]


def mode_budgets(budget) -> dict:
    """The speculative modes' own copies of the verify budget (what decodes learn is the mode's own); None each
    without one."""
    return {m: None if budget is None else budget.fresh() for m in ("base", "domino")}


def decoders(engine, max_new: int, solo: bool, temperature: float = 0.0, budget=None, shrink: bool = False,
             budgets=None):
    """mode -> f(list of prompts) -> list[DecodeResult]; temperature > 0: sampled (seed 0); budget:
    the batched chains' verify budget (decoding/budget.py; None = every draft verified); budgets: the
    speculative modes' own copies of it, if they go on from earlier batch sizes; shrink: the batched
    chains compact as their rows end (decoding/batched.py)."""
    from domino_graft.sampling import Sampling

    kw = {"max_new_tokens": max_new, "sampling": Sampling(temperature=temperature, seed=0 if temperature else None)}
    # one budget per mode (what decodes learn is the mode's own); a fixed N at B = 1 is the batched chain's
    budgets = budgets or mode_budgets(budget)
    if solo and budget is not None and budget.mode == "fixed":
        return {"target": lambda ps: [engine.target_only(p, **kw) for p in ps],
                "base": lambda ps: [r for p in ps for r in engine.speculative_batch([p], **kw, use_head=False,
                                                                                   budget=budgets["base"])],
                "domino": lambda ps: [r for p in ps for r in engine.speculative_batch([p], **kw, use_head=True,
                                                                                     budget=budgets["domino"])]}
    if solo:
        return {"target": lambda ps: [engine.target_only(p, **kw) for p in ps],
                "base": lambda ps: [engine.speculative(p, **kw, use_head=False, budget=budgets["base"]) for p in ps],
                "domino": lambda ps: [engine.speculative(p, **kw, use_head=True, budget=budgets["domino"])
                                      for p in ps]}
    return {"target": lambda ps: engine.target_only_batch(ps, **kw),
            "base": lambda ps: engine.speculative_batch(ps, **kw, use_head=False, budget=budgets["base"], shrink=shrink),
            "domino": lambda ps: engine.speculative_batch(ps, **kw, use_head=True, budget=budgets["domino"],
                                                          shrink=shrink)}


def warm_up(runs, items: list[list[int]], b: int) -> None:
    """Decode, untimed, every batch shape the timed pass meets: batches of b (and of the last
    batch's size) of the longest prompts, then of the shortest (caches sized for the longest
    first, so no timed batch re-sizes them; graphs captured for the attention buckets both ends
    reach), then one whose longest prompt is the longest of each other padded prefill length
    (fast.prefill_length: the batched prefill's graphed shapes)."""
    from domino_graft.fast import prefill_length

    by_len = sorted(items, key=len)
    ends: dict[int, int] = {}  # padded prefill length -> index of its longest prompt in by_len
    for i, ids in enumerate(by_len):
        ends[prefill_length(len(ids), 1 << 30)] = i
    for n in sorted({b, len(items) % b or b}):
        chunks = [by_len[-n:], by_len[:n]]
        chunks += [by_len[max(0, i + 1 - n): i + 1] for i in sorted(ends.values(), reverse=True)[1:]]
        for chunk in chunks:
            for mode in MODES:
                runs[mode](chunk)


def path_of(engine, solo: bool, device: str, kv_paths: set, budget=None) -> dict:
    """Which code decoded: the decoder, the target's cache (as the results' kv_path say), the drafter."""
    graphs = device == "cuda"
    static = kv_paths == {"static"}
    if static:
        target = "fast engine, static cache" + (", CUDA graphs" if graphs else ", eager")
    else:
        target = "+".join(sorted(kv_paths)) + " cache (HF forward where dynamic), eager"
    if solo and budget is not None and budget.mode == "fixed":
        return {"decoder": "target alone: solo (Engine.target_only); speculative: the batched chain one row at a "
                           "time (a fixed verify budget lives there: decoding/budget.py)", "target": target,
                "drafter": "static over the ragged batch" + (", graphed" if graphs else ", eager")
                if getattr(engine, "batch_drafter_path", None) == "static" else "eager, ragged batch"}
    if solo:
        fast_drafter = static and hasattr(engine.adapter, "static_drafter")
        return {"decoder": "solo (Engine.target_only / speculative, as bench/end_to_end.py)", "target": target,
                "drafter": ("static, graphed propose" if graphs else "static, eager") if fast_drafter else "eager"}
    batch_drafter = getattr(engine, "batch_drafter_path", None) == "static"
    return {"decoder": "batched (decoding/batched.py)",
            "target": target + (" (one graph per batch size, step length and kv bucket)" if static and graphs else ""),
            "drafter": ("static over the ragged batch" + (", graphed" if graphs else ", eager")) if batch_drafter
            else "eager, ragged batch"}


def measure(engine, items, b: int, max_new: int, refs, clock: Clock, device: str, solo: bool, write,
            temperature: float = 0.0, budget=None, shrink: bool = False, rounds: int = 1, budgets=None) -> dict:
    import torch

    from domino_graft.decoding.budget import VerifyBudget, candidate_budgets
    from domino_graft.decoding.divergence import first_divergence
    from domino_graft.fast import graphs_captured

    budgets = budgets or mode_budgets(budget)
    runs = decoders(engine, max_new, solo, temperature, budget, shrink, budgets)
    sampled = temperature > 0  # no identity to check: rows agree with the target in law only
    t0 = time.perf_counter()
    if budget is not None:  # every verify shape the budget may choose, its graphs captured before any timing
        warm_up(decoders(engine, max_new, solo, temperature, None, shrink), items, b)
        if budget.mode == "auto" and not solo:
            for kk in candidate_budgets(engine.adapter.num_slots, budget.lengths):
                if kk < engine.adapter.num_slots:
                    fixed = VerifyBudget("fixed", n=kk, costs=budget.costs)
                    warm_up(decoders(engine, max_new, solo, temperature, fixed, shrink), items, b)
            # every K' after every other: the shapes of a step depend on the one before (budget.py, "cycle")
            cycle = VerifyBudget("cycle", costs=budget.costs)
            warm_up(decoders(engine, max_new, solo, temperature, cycle, shrink), items, b)
    # under the budget: its costs measured, its first estimates made, and (static batches on CUDA) both arms'
    # whole decodes measured at this size, so the timed pass runs the faster (decoding/outcomes.py)
    key = "solo" if solo else b  # what the budget keeps the decodes' outcomes under (decoding/budget.py)
    warm_up(runs, items, b)
    # then batches as the timed pass takes them (the prompts in order), until the size is settled: warm_up's
    # chunks (the longest prompts, the shortest, ...) come in a fixed cycle, and the arms alternate, so at
    # 8c90ce8 (H100, greedy B = 4) one arm's decodes were always the long prompts' and + Domino's speculative
    # side read 5,166 tok/s there against 5,533 in the timed batches: it ran plain until a probe turned it
    auto = {m: x for m, x in budgets.items() if x is not None and x.mode == "auto"}
    starts = list(range(0, len(items), b))
    for i in range(SETTLE_BATCHES if device == "cuda" else 0):
        if all(x.outcomes.settled(key) for x in auto.values()):
            break
        chunk = items[starts[i % len(starts)]: starts[i % len(starts)] + b]
        for mode in auto:
            runs[mode](chunk)
    if device == "cuda":
        torch.cuda.synchronize()
    # what the warm-up left (models, caches, graphs) out of the collector's way. A full collection over it
    # inside a timed decode is one stall a mode can meet: at 13bdded on the H100 (B = 4, T = 1) one batch of
    # identical work ran 1.64x the target's wall (+~70 ms of 0.12 s); whatever that was, no mode pays for GC
    gc.collect()
    gc.freeze()
    row = {"batch_size": b, "temperature": temperature, "path": None,
           "warmup_s": round(time.perf_counter() - t0, 2), "complete": False, "num_prompts": 0, "num_batches": 0}
    tokens = {m: 0 for m in MODES}
    wall = {m: 0.0 for m in MODES}
    rates = {m: [] for m in MODES}
    steps = {m: [0, 0] for m in ("base", "domino")}  # [verify steps, tokens those steps gave]
    kv = {m: set() for m in MODES}
    chosen = {m: {} for m in ("base", "domino")}  # the verify budget's K' -> steps, over the timed batches
    last_report: dict = {}  # each mode's last decode's budget report (its estimate, costs and excess)
    bad = {m: 0 for m in MODES}
    bad_in_batch = {m: 0 for m in ("base", "domino")}  # against the same batch's target-alone rows
    divergences = []
    starts = [s for _ in range(rounds) for s in range(0, len(items), b)]  # every batch, `rounds` times
    for i, start in enumerate(starts):
        if clock.over():
            row["stopped"] = f"deadline: {clock.elapsed():.0f} s >= --deadline-s {clock.deadline_s}"
            break
        chunk = items[start: start + b]
        batch_target = None
        results_of, budget_of = {}, {}
        order = ORDERS[i % len(ORDERS)]
        this = {"start": start, "order": list(order), "wall_s": {}}  # the batch's own record (`batches`)
        # the modes take turns going first and following each other (whatever state a decode leaves the
        # GPU and the host in, every mode meets it as often); their rows are checked after, the target's first
        for mode in order:
            captured = graphs_captured()
            gc.collect()  # between decodes, untimed; none inside one (every mode alike)
            gc.disable()
            t1 = time.perf_counter()
            try:
                results_of[mode] = runs[mode](chunk)
            finally:
                this["wall_s"][mode] = round(time.perf_counter() - t1, 5)
                gc.enable()
            wall[mode] += this["wall_s"][mode]
            # a graph captured in a timed decode: a shape the warm-up did not meet (its capture is in the wall)
            this.setdefault("graphs_captured", {})[mode] = graphs_captured() - captured
            budget_of[mode] = getattr(engine, "last_budget", None) if mode != "target" else None
            if budget_of[mode]:  # which decodes differ from the target alone's: those not started committed
                this[mode] = {key: budget_of[mode].get(key) for key in ("starts_committed", "arm", "k_hist")}
        this["tokens"] = {mode: sum(len(r.tokens) for r in results_of[mode]) for mode in order}
        row.setdefault("batches", []).append(this)
        for mode in MODES:  # "target" first: its rows are what this batch's speculative rows must equal
            results = results_of[mode]
            for n, r in enumerate(results):
                tokens[mode] += len(r.tokens)
                rates[mode].append(len(r.tokens) / r.seconds if r.seconds > 0 else 0.0)
                kv[mode].add(r.kv_path)
                if mode != "target":
                    steps[mode][0] += len(r.accepted)
                    steps[mode][1] += sum(a + 1 for a in r.accepted)
                    bad_in_batch[mode] += not sampled and r.tokens != batch_target[n]
                if sampled:
                    continue
                ref = refs[start + n]
                if ref is None:  # the solo target pass is the reference
                    refs[start + n] = ref = r.tokens
                if r.tokens != ref:
                    bad[mode] += 1
                    if len(divergences) < 10:
                        div = first_divergence(engine.target, chunk[n], ref, r.tokens)
                        divergences.append({"mode": mode, "prompt": start + n, **(div or {})})
            if mode == "target":
                batch_target = [r.tokens for r in results]
            elif budget_of[mode]:
                for kk, n in budget_of[mode]["k_hist"].items():
                    chosen[mode][str(kk)] = chosen[mode].get(str(kk), 0) + n
                last_report[mode] = budget_of[mode]
        row["num_prompts"] += len(chunk)
        row["num_batches"] += 1
        row["path"] = path_of(engine, solo, device, set().union(*kv.values()), budget)
        fill(row, tokens, wall, rates, steps, kv, bad, bad_in_batch, divergences, sampled)
        if any(chosen.values()):
            row["verify_budget_k"] = chosen
            row["verify_budget_last"] = last_report
            # what whole decodes measured at this size, by arm (decoding/outcomes.py): what chose each batch's
            row["verify_budget_outcomes"] = {m: x.outcomes.summary(key) for m, x in budgets.items() if x is not None}
        write(row)
    row["rounds"] = rounds
    row["complete"] = row["num_prompts"] == rounds * len(items)
    fill(row, tokens, wall, rates, steps, kv, bad, bad_in_batch, divergences, sampled)
    return row


def fill(row, tokens, wall, rates, steps, kv, bad, bad_in_batch, divergences, sampled: bool = False) -> None:
    """The row's figures. Two identities: `identical_to_target`, every row of every mode equal to
    its prompt's solo target-alone decode (needs the target's numerics not to depend on the batch
    size), and `identical_to_batch_target`, every speculative row equal to the target-alone row of
    the same batch (speculation's own losslessness at this batch size)."""
    for m in MODES:
        row[f"{m}_tokens_per_s"] = tokens[m] / wall[m] if wall[m] > 0 else None
        row[f"{m}_per_request_tokens_per_s"] = statistics.fmean(rates[m]) if rates[m] else None
        row[f"{m}_tokens"] = tokens[m]
        row[f"{m}_wall_s"] = round(wall[m], 4)
    for m in ("base", "domino"):
        row[f"tau_{m}"] = steps[m][1] / steps[m][0] if steps[m][0] else None
        t = row["target_tokens_per_s"]
        row[f"speedup_{m}"] = row[f"{m}_tokens_per_s"] / t if t and row[f"{m}_tokens_per_s"] else None
        # the median over batches of the mode's tokens/s over the target's in the same batch: a stall of one
        # decode (tens of ms in a 0.1 s batch, `batches`) moves the totals above, not this
        per_batch = sorted((b["tokens"][m] / b["wall_s"][m]) / (b["tokens"]["target"] / b["wall_s"]["target"])
                           for b in row.get("batches", []) if "tokens" in b and min(b["wall_s"].values()) > 0)
        row[f"speedup_{m}_median_batch"] = per_batch[len(per_batch) // 2] if per_batch else None
    row["kv_path"] = {m: sorted(kv[m]) for m in MODES}
    if sampled:  # sampled rows: equal to the target in distribution (the chi-square tests), not token for token
        row["identical_to_target"] = row["identical_to_batch_target"] = None
        return
    row["not_identical"] = dict(bad)
    row["identical_to_target"] = row["num_prompts"] > 0 and not any(bad.values())
    row["not_identical_to_batch_target"] = dict(bad_in_batch)
    row["identical_to_batch_target"] = row["num_prompts"] > 0 and not any(bad_in_batch.values())
    if divergences:
        row["divergences"] = divergences


def speedup_interval(row: dict, mode: str = "domino", reps: int = 2000) -> Optional[list[float]]:
    """The 95% interval of `mode`'s total tokens/s over the target alone's in this row, by a paired bootstrap
    over its timed batches (each batch decoded by both, one after the other; seed 0, so it is reproducible):
    whether a ratio near 1 is within the spread of the batches. None with fewer than two batches."""
    batches = [b for b in row.get("batches", []) if {mode, "target"} <= set(b.get("wall_s", {}))]
    if len(batches) < 2:
        return None

    def ratio(sample: list) -> float:
        rate = {m: sum(b["tokens"][m] for b in sample) / sum(b["wall_s"][m] for b in sample) for m in (mode, "target")}
        return rate[mode] / rate["target"]

    rng = random.Random(0)
    draws = sorted(ratio([rng.choice(batches) for _ in batches]) for _ in range(reps))
    return [round(draws[int(0.025 * reps)], 4), round(draws[int(0.975 * reps) - 1], 4)]


def by_batch(rows: dict) -> list[dict]:
    """The issue's flat table: per batch size and temperature the three modes' tokens/s (B = 1:
    the solo path's row), identity for greedy rows."""
    out = []
    for key, row in rows.items():
        if key.startswith("1_batched"):
            continue
        out.append({"B": row["batch_size"], "temperature": row.get("temperature", 0.0),
                    "target_tokens_per_s": row["target_tokens_per_s"], "drafter_tokens_per_s": row["base_tokens_per_s"],
                    "domino_tokens_per_s": row["domino_tokens_per_s"], "tau_domino": row.get("tau_domino"),
                    "domino_median_batch_speedup": row.get("speedup_domino_median_batch"),
                    "domino_speedup_ci95": speedup_interval(row),
                    "identical_to_target": row["identical_to_target"], "complete": row["complete"]})
    return sorted(out, key=lambda r: (r["temperature"], r["B"]))


def summarize(path: Path) -> int:
    """`--summarize REPORT`: the report's table by batch size with + Domino's interval (`speedup_interval`)."""
    try:
        rows = json.loads(path.read_text())["rows"]
        table = by_batch(rows)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"--summarize {path}: not a concurrency report ({type(e).__name__}: {e}); valid: a JSON file this "
              "script wrote (with its \"rows\")", file=sys.stderr)
        return 2
    print("B\tT\ttarget tok/s\t+ Domino tok/s\tx target\tmedian batch\t95% interval")
    for r in table:
        ci = r["domino_speedup_ci95"]
        print(f"{r['B']}\t{r['temperature']:g}\t{r['target_tokens_per_s']:.0f}\t{r['domino_tokens_per_s']:.0f}\t"
              f"{r['domino_tokens_per_s'] / r['target_tokens_per_s']:.3f}\t{r['domino_median_batch_speedup'] or 0:.3f}\t"
              + (f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-"))
    return 0


def rounds_for(b: int, n: int, rounds: int, min_batches: int) -> int:
    """How many times batch size b decodes its n prompts: `rounds`, or more until it has timed at least
    `min_batches` batches (B = 64 of 64 prompts is one batch a round)."""
    per_round = -(-n // b)
    return max(rounds, -(-min_batches // per_round))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="a trained run dir or bundle (default: graft one with --data into --work)")
    p.add_argument("--data", type=Path, help="the pipeline's regenerated responses, to graft the head (no --run)")
    p.add_argument("--work", type=Path, default=Path("bench/work/concurrency"))
    p.add_argument("--head-steps", type=int, default=500)
    p.add_argument("--prompts", type=Path, help="a prompts JSONL instead of the GSM8K asset (the CPU smoke test)")
    p.add_argument("--num-prompts", type=int, default=64, help="N (a multiple of the largest batch size is best)")
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    p.add_argument("--temperatures", default="0", help="comma-separated; 0 = greedy (identity checked), > 0 sampled")
    p.add_argument("--verify-budget", default="full", help="batched chains: full, auto or N (decoding/budget.py)")
    p.add_argument("--verify-costs", default=None, help="a cost table for --verify-budget auto (else measured on CUDA)")
    p.add_argument("--rounds", type=int, default=1,
                   help="time every batch this many times (a large B has only N / B batches: one is noisy)")
    p.add_argument("--min-batches", type=int, default=1,
                   help="time each B at least this many batches a mode (more rounds where N / B is small)")
    p.add_argument("--shrink", action="store_true",
                   help="batched chains compact as their rows end (the target alone's loop always does)")
    p.add_argument("--also-batched-1", action="store_true", help='add row "1_batched": the batched path at B = 1')
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the mechanics (numbers meaningless)")
    p.add_argument("--kv", default="auto", choices=("auto", "dynamic", "static"), help="the solo path's cache")
    p.add_argument("--deadline-s", type=float, default=None, help="start no batch after this many seconds")
    p.add_argument("--out", type=Path, default=Path("concurrency_h200.json"))
    p.add_argument("--resume", type=Path, default=None,
                   help="an earlier report of this run (a call cut short by its time limit): its complete rows are "
                        "kept and not measured again")
    p.add_argument("--summarize", type=Path, default=None, metavar="REPORT",
                   help="print an earlier report's table with each + Domino row's 95%% interval (a paired bootstrap "
                        "over its batches) and exit; nothing is decoded")
    args = p.parse_args(argv)
    if args.summarize is not None:
        return summarize(args.summarize)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: valid: an integer >= 1")
    if args.min_batches < 1:
        p.error(f"--min-batches {args.min_batches}: valid: an integer >= 1")
    sizes = sorted({int(x) for x in args.batch_sizes.split(",") if x.strip()})
    if not sizes or sizes[0] < 1:
        p.error(f"--batch-sizes {args.batch_sizes!r}: valid: positive integers, comma-separated")
    try:
        temps = [float(x) for x in args.temperatures.split(",") if x.strip()]
    except ValueError:
        temps = []
    if not temps or any(not (t >= 0 and t < float("inf")) for t in temps):
        p.error(f"--temperatures {args.temperatures!r}: valid: finite numbers >= 0, comma-separated")
    clock = Clock(args.deadline_s)
    from domino_graft.decoding.budget import VerifyBudget, VerifyCosts

    try:
        costs = VerifyCosts.load(args.verify_costs) if args.verify_costs else None
        budget = VerifyBudget.parse(args.verify_budget, costs)
    except ValueError as e:
        p.error(str(e))
    budget = None if budget.mode == "full" else budget

    import torch

    from domino_graft.artifacts.files import atomic_write_json
    from domino_graft.artifacts.provenance import git_sha, hardware, versions

    torch.backends.cuda.matmul.allow_tf32 = False  # as end_to_end.py: identity is compared token for token
    training = None
    run = args.run
    if run is None:
        if args.data is None:
            p.error("give --run RUN_OR_BUNDLE (trained), or --data to graft and train a head first")
        args.work.mkdir(parents=True, exist_ok=True)
        training = e2e.graft(args.work, args.data, args.head_steps, args.device)
        run = str(args.work / "graft")
    loaded, engine = load(run, args.dtype, args.device, args.kv)
    items = read_items(loaded, args.prompts, args.num_prompts)
    if not items:
        p.error("no prompts")
    report = {
        "what": "throughput against batch size: N GSM8K prompts decoded B at a time by the target alone, the base "
                "drafter and drafter + Domino, greedy (and sampled at each --temperatures); B = 1 on the solo path "
                "(as bench/end_to_end.py), B > 1 on batched chains; tokens/s = generated tokens / wall seconds, prefill included",
        "run": str(run), "head_training": training, "num_prompts": len(items), "max_new_tokens": args.max_new_tokens,
        "batch_sizes": sizes, "dtype": args.dtype,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "git_sha": os.environ.get("DG_GIT_SHA") or git_sha(),
        "command": " ".join([Path(sys.argv[0]).name if argv is None else "bench/concurrency.py",
                             *(sys.argv[1:] if argv is None else argv)]),
        "hardware": hardware(), "versions": versions(), "kv_note": engine.kv_note,
        "verify_budget": args.verify_budget, "shrink": args.shrink,
        "switches": harness.switches(),  # the kernels' switches the run was under
        "rows": {},
    }
    def write():
        atomic_write_json(args.out, {**report, "elapsed_s": round(clock.elapsed(), 1)})

    plan = [(str(b), b, b == 1) for b in sizes]
    if args.also_batched_1:
        plan.insert(1 if 1 in sizes else 0, ("1_batched", 1, False))
    # greedy rows keep their plain keys ("8"), sampled ones say their temperature ("8@T1")
    plan = [(key if t == 0 else f"{key}@T{t:g}", b, solo, t) for t in temps for key, b, solo in plan]
    if args.resume is not None:  # the earlier call's complete rows stand; each call's command and tree are kept
        import json

        before = json.loads(args.resume.read_text())
        kept = {k: r for k, r in before.get("rows", {}).items() if r.get("complete")}
        report["rows"].update(kept)
        report["calls"] = before.get("calls") or [{k: before.get(k) for k in ("command", "git_sha", "elapsed_s")}]
        report["calls"].append({"command": report["command"], "git_sha": report["git_sha"]})
        plan = [item for item in plan if item[0] not in kept]
        report["by_batch"] = by_batch(report["rows"])
    write()
    refs: list = [None] * len(items)
    if not any(key == "1" for key, *_ in plan) and any(t == 0 for *_, t in plan):
        # the solo target-alone outputs every greedy row is compared with (B = 1's own target decodes otherwise)
        refs = [engine.target_only(ids, max_new_tokens=args.max_new_tokens).tokens for ids in items]
    learned: dict = {}  # temperature -> mode -> budget
    for key, b, solo, temperature in plan:
        if clock.over():
            report["stopped"] = f"deadline before batch size {key}: {clock.elapsed():.0f} s"
            break
        e2e.log(f"batch size {key}: warm-up, then {len(items)} prompts")

        def write_row(row, key=key):  # after every batch: a cut-off call leaves what it measured
            report["rows"][key] = row
            write()

        rounds = rounds_for(b, len(items), args.rounds, args.min_batches)
        # each mode's budget goes on from the batch sizes before, as one engine's would (what it learns
        # is kept by batch size: decoding/budget.py)
        budgets = None if budget is None else learned.setdefault(
            temperature, mode_budgets(budget))
        row = measure(engine, items, b, args.max_new_tokens, refs, clock, args.device, solo, write_row, temperature,
                      budget, args.shrink, rounds, budgets)
        write_row(row)
        report["by_batch"] = by_batch(report["rows"])
        e2e.log(f"batch size {key}: " + ", ".join(f"{m} {row[f'{m}_tokens_per_s'] or 0:.0f}" for m in MODES)
                + f" tokens/s; tau {row['tau_base']}/{row['tau_domino']}; identical {row['identical_to_target']}")
    write()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
