"""serve's measured arms end to end on this CPU (serving/windows.py, which runs on CUDA only, forced on here).

On a CPU speculation cannot speed decoding up, so the target alone's lean steps are the faster arm at every batch
size: what the arms must find, as they must at B = 32 on the H100, where the served step model kept speculating and
+ Domino ran 0.48x the target alone (bench/results/rollouts_h100/). The real SmolLM2-135M-Instruct and a graft of the
shipped DFlash drafter (`apply smollm2_graft`, untrained: the drafter's drafts), fp32, GSM8K prompts through serve's
worker (rows refilled as they end), greedy, `--verify-budget auto` over a flat cost table (the step model verifies
all K, as it did there). Three modes, each its own scheduler:

    target      the target alone (`serve --target-only`)
    arms        + Domino, windows of --window-s whose arms the outcomes choose (the real Outcomes: both arms
                measured, a verdict, probes); untimed passes until the verdict (at most --settle-passes)
    step_model  + Domino, the step model alone (DOMINO_GRAFT_SERVE_ARMS=0)

Reports tokens/s (median of --rounds timed passes), blocks by K', the arms' outcomes at the batch size, whether
every prompt's tokens equal the target alone's, and where the timed passes' wall went apart from the steps: the
admissions in place (`admit`, and `prefill_chunks`: a long prompt's chunks, one before each step), the rebuilds and
(+ Domino) the drafter's catch-ups after plain windows, each's seconds and calls (`timed_calls`; an admit that found
no room to park fails at once, and a rebuild follows). CPU walls: what they show is which arm the windows settle on
and what + Domino then costs against the target alone, not GPU speed.

    python experiments/served_arms_check.py --run RUN --prompts …/gsm8k/prompts.jsonl \
        --out bench/results/served_arms_cpu.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "experiments"))

import rollouts  # noqa: E402
from drafter_lag_check import Tally, compare_modes, flat_costs, served_parser  # noqa: E402


class Timed:
    """Seconds and calls of a few batch methods while `on` (the timed passes): wraps them on their classes."""

    NAMES = ("admit", "prefill_chunks", "__init__", "_catch_up")

    def __init__(self):
        from domino_graft.serving import batch as batch_module

        self.on, self.seconds, self.calls, self.saved = False, {}, {}, []
        for cls in (batch_module.ChainBatch, batch_module.TargetBatch):
            for name in self.NAMES:
                if hasattr(cls, name):  # (its own, or inherited: shadowed on the class until `restore`)
                    self.saved.append((cls, name, vars(cls).get(name)))
                    setattr(cls, name, self._timed(name, getattr(cls, name)))

    def _timed(self, name, fn):
        key = {"__init__": "rebuild", "_catch_up": "catch_up"}.get(name, name)

        def timed(*a, **kw):
            t0 = time.perf_counter()
            busy = name != "prefill_chunks" or bool(a[0].pending)  # (called before every step: counted with chunks)
            try:
                return fn(*a, **kw)
            finally:
                if self.on and busy:
                    self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0
                    self.calls[key] = self.calls.get(key, 0) + 1
        return timed

    def restore(self) -> None:
        for cls, name, fn in self.saved:
            if fn is None:
                delattr(cls, name)
            else:
                setattr(cls, name, fn)

    def report(self) -> dict:
        return {k: {"seconds": round(v, 2), "calls": self.calls[k]} for k, v in sorted(self.seconds.items())}


def run_mode(engine, items, mode: str, args) -> tuple[dict, list]:
    from domino_graft.decoding.budget import VerifyBudget, VerifyCosts
    from domino_graft.sampling import Sampling
    from domino_graft.serving import batch as batch_module
    from domino_graft.serving import windows
    from domino_graft.serving.scheduler import Scheduler

    saved = (batch_module.windows_on, windows.WINDOW_S)
    timed = Timed()
    budget = None if mode == "target" else VerifyBudget(
        "auto", costs=VerifyCosts.from_dict(flat_costs(range(1, args.concurrency + 1))))
    try:
        if mode == "arms":
            batch_module.windows_on = lambda b, device: b is not None and b.mode == "auto"
            windows.WINDOW_S = args.window_s
        tally = Tally()
        s = Scheduler(engine, max_batch=args.concurrency, max_queue=len(items), target_only=mode == "target",
                      metrics=tally, budget=budget, pad_batches=True)  # (as on a GPU)
        s.start()
        try:
            sampling = Sampling()
            passes = 0
            while True:  # untimed: the arms' verdict (arms), the budget's estimate (step_model)
                rollouts.decode_all(s, items, args.max_new_tokens, sampling, engine.stop_ids)
                passes += 1
                if mode != "arms" or passes >= args.settle_passes or budget.outcomes.settled(args.concurrency):
                    break
            tally.__init__()
            timed.on = True
            walls, tokens = [], None
            for _ in range(args.rounds):
                tokens, wall = rollouts.decode_all(s, items, args.max_new_tokens, sampling, engine.stop_ids)
                walls.append(round(wall, 2))
        finally:
            s.stop(timeout=60, abandon=True)
    finally:
        batch_module.windows_on, windows.WINDOW_S = saved
        timed.restore()
    n = sum(map(len, tokens))
    row = {"untimed_passes": passes, "walls_s": walls, "tokens": n,
           "tokens_per_s": round(n / statistics.median(walls), 2), "timed_calls": timed.report()}
    if mode != "target":
        row.update(blocks_by_k={str(k): c for k, c in sorted(tally.blocks_by_k.items())},
                   accepted_per_spec_row_step=round(tally.spec_accepted / max(tally.spec_row_steps, 1), 3))
    if mode == "arms":
        row["outcomes"] = budget.outcomes.summary(args.concurrency)
    return row, tokens


def main(argv=None) -> int:
    p = served_parser(__doc__, 12)
    p.add_argument("--settle-passes", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="timed passes a mode (this CPU's walls vary: median)")
    return compare_modes(p.parse_args(argv), ("arms", "step_model"), run_mode)


if __name__ == "__main__":
    sys.exit(main())
