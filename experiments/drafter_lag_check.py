"""Served speculative blocks after plain windows, with and without the drafter's catch-up (serving/lag.py).

The real SmolLM2-135M-Instruct and a graft of the shipped DFlash drafter (`apply smollm2_graft`, untrained: the
drafter's drafts), fp32 on this CPU. GSM8K prompts through serve's worker (serving/scheduler.py: rows refilled as
they end), greedy, `--verify-budget auto` over a flat cost table (the step model verifies all K), the measured
arms forced on (serving/windows.py is CUDA-only) with windows of --window-s seconds whose arms are forced too:

    spec_only     every window speculates (no plain step, nothing to catch up)
    alternating   plain and speculative windows take turns, the catch-up on (this tree)
    no_catch_up   the same turns, the catch-up off (as before serving/lag.py)

Reports each mode's speculative blocks, their accepted drafts per row (the quantity the catch-up restores) and
whether every prompt's tokens equal the target alone's. The walls are this CPU's and mean nothing for speed.

    python experiments/drafter_lag_check.py --run RUN --out bench/results/drafter_lag_cpu.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import harness  # noqa: E402
import rollouts  # noqa: E402
from concurrency import load, read_items  # noqa: E402

MODES = {"spec_only": ["spec"], "alternating": ["plain", "spec"], "no_catch_up": ["plain", "spec"]}


class Tally(rollouts.StepTally):
    """rollouts' tally, and the speculative blocks' row-steps and accepted drafts apart from the plain steps'."""

    def __init__(self):
        super().__init__()
        self.spec_row_steps, self.spec_accepted = 0, 0

    def observe_steps(self, accepted: list[int], k: int) -> None:
        super().observe_steps(accepted, k)
        if k > 0:
            self.spec_row_steps += len(accepted)
            self.spec_accepted += sum(accepted)


def flat_costs(batches) -> dict:
    """Every verify length at one cost: the step model verifies all K drafts in a speculative window."""
    return {"step_ms": {str(b): {str(t): 10.0 for t in (1, 4, 8, 16)} for b in batches},
            "propose_ms": {str(b): 1.0 for b in batches}, "rollout_ms": {str(b): 0.01 for b in batches}}


def run_mode(engine, items, mode: str, args) -> dict:
    from domino_graft.decoding.budget import VerifyBudget, VerifyCosts
    from domino_graft.decoding.outcomes import Outcomes
    from domino_graft.sampling import Sampling
    from domino_graft.serving import batch as batch_module
    from domino_graft.serving import windows
    from domino_graft.serving.scheduler import Scheduler

    saved = (Outcomes.arm_for, batch_module.windows_on, windows.WINDOW_S, batch_module.ChainBatch._catch_up)
    arms = itertools.cycle(MODES[mode]) if mode in MODES else None
    try:
        if arms is not None:
            Outcomes.arm_for = lambda self, batch: next(arms)
            batch_module.windows_on = lambda budget, device: budget is not None
            windows.WINDOW_S = args.window_s
            if mode == "no_catch_up":  # the stretch ends with nothing given back
                batch_module.ChainBatch._catch_up = lambda self: self.lag.holes(self.pos_h, self.live)
        tally = Tally()
        budget = None if arms is None else VerifyBudget(
            "auto", costs=VerifyCosts.from_dict(flat_costs(range(1, args.concurrency + 1))))
        s = Scheduler(engine, max_batch=args.concurrency, max_queue=len(items), target_only=arms is None,
                      metrics=tally, budget=budget)
        s.start()
        try:
            tokens, wall = rollouts.decode_all(s, items, args.max_new_tokens, Sampling(), engine.stop_ids)
        finally:
            s.stop(timeout=60, abandon=True)
    finally:
        Outcomes.arm_for, batch_module.windows_on, windows.WINDOW_S, batch_module.ChainBatch._catch_up = saved
    row = {"wall_s": round(wall, 2), "tokens": sum(map(len, tokens))}
    if arms is not None:
        row.update(blocks_by_k={str(k): n for k, n in sorted(tally.blocks_by_k.items())},
                   spec_row_steps=tally.spec_row_steps,
                   accepted_per_spec_row_step=round(tally.spec_accepted / max(tally.spec_row_steps, 1), 3))
    return row, tokens


def served_parser(doc: str, num_prompts: int) -> argparse.ArgumentParser:
    """The arguments both CPU checks of serve's worker take (this one and served_arms_check.py)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a run dir (apply smollm2_graft on the shipped drafter)")
    p.add_argument("--prompts", type=Path, help="a prompts JSONL (default: the GSM8K test questions)")
    p.add_argument("--num-prompts", type=int, default=num_prompts)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--window-s", type=float, default=0.25, help="each forced window's wall time (serve's: 0.1 s)")
    p.add_argument("--out", required=True)
    return p


def compare_modes(args, modes, run_mode) -> int:
    """The target alone, then each mode, through `run_mode(engine, items, mode, args) -> (row, tokens)`: each row
    with whether its tokens equal the target alone's and its tokens/s against it (where it reports tokens/s),
    into one report at --out."""
    import torch

    torch.manual_seed(0)
    loaded, engine = load(args.run, "fp32", "cpu", "auto")
    items = read_items(loaded, args.prompts, args.num_prompts)
    report = {**harness.environment(), "run": args.run, "num_prompts": len(items), "concurrency": args.concurrency,
              "max_new_tokens": args.max_new_tokens, "window_s": args.window_s, "modes": {}}
    ref = None
    for mode in ("target", *modes):
        row, tokens = run_mode(engine, items, mode, args)
        if mode == "target":
            ref = tokens
        else:
            row["identical_to_target"] = tokens == ref
            if "tokens_per_s" in row:
                row["x_target"] = round(row["tokens_per_s"] / report["modes"]["target"]["tokens_per_s"], 3)
        report["modes"][mode] = row
        print(mode, row, flush=True)
    harness.write_json(args.out, report)
    return 0


def main(argv=None) -> int:
    return compare_modes(served_parser(__doc__, 8).parse_args(argv), MODES, run_mode)


if __name__ == "__main__":
    sys.exit(main())
