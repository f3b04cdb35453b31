"""Measured arms for serve's batches: the whole-decode outcomes of static batches (decoding/outcomes.py, docs/design.md
§5 "Whole decodes") carried over to a batch that never ends.

The verify budget's step model prices a block from measured costs and an acceptance estimate. In serve's worker its
wall-clock samples also hold what happens between blocks (admissions' prefills, the rows' pushes), a per-request
cost it books per block, and a plain step has no lean sample to be costed by. On an H100 at 515831e
(bench/results/rollouts_h100/: 96 GSM8K prompts, 32 rows refilled as they end, the shipped drafter) it verified
drafts at 293 of 295 blocks and + Domino ran 0.48x the target alone, whose steps were twice as fast.

A static batch settles this by measuring each arm's whole tokens/s; a served batch is cut into windows of WINDOW_S
instead. Each window is one BudgetRun started as a static decode starts (`VerifyBudget.start` without a carry: the
arm its batch size's outcomes choose, "plain" the target alone's lean steps, "spec" drafts verified at every
block, None the step model's probe), and at its end its tokens/s (every token the batch emitted in it over its
wall time; admissions and pushes, which both arms pay per token, included) joins its batch size's outcomes. The
outcomes' rules then apply unchanged: each arm measured, a verdict once they lie apart, probes spaced out.
On CUDA under `--verify-budget auto`; DOMINO_GRAFT_SERVE_ARMS=0 turns it off (the step model alone, as before).

A window's tokens/s is scaled to a full batch: divided by the share of the batch's rows that were live in its steps
(`count`). A batch runs at its padded size whatever its live rows (ended rows stay masked until a rebuild), so both
arms' cost per step is the full batch's and their tokens scale with the live rows. Where the queue drains (the end of
a pass of RL rollouts, a lull in traffic) the rows end one by one and a window there emits a fraction of a full
window's tokens; unscaled, whichever arm ran it would be measured that much slower.
"""

from __future__ import annotations

import os
import time
from typing import Optional

import torch

from ..decoding.budget import BudgetRun, VerifyBudget

# a window's wall time: about a static decode's at B = 32 (~0.1 s), enough tokens that one admission burst does not
# decide it, short enough that the arms are measured within seconds of traffic
WINDOW_S = 0.1
SERVE_ARMS = os.environ.get("DOMINO_GRAFT_SERVE_ARMS", "1") != "0"


def windows_on(budget: Optional[VerifyBudget], device) -> bool:
    """Whether a served batch runs measured windows (module docstring)."""
    return SERVE_ARMS and budget is not None and budget.mode == "auto" and torch.device(device).type == "cuda"


class Windows:
    """One batch's windows: when the current one began, and what the batch had emitted by then."""

    def __init__(self, budget: VerifyBudget, k: int, batch: int, emitted: int):
        self.budget, self.k, self.batch = budget, k, batch
        self.began, self.emitted = time.perf_counter(), emitted
        self.skipped = 0.0  # seconds of this window that are no arm's (`skip`)
        self.row_steps, self.steps = 0, 0  # this window's steps and their live rows (`count`)

    def run(self) -> BudgetRun:
        """The next window's run: its arm from the outcomes of this batch size (what the last window learned is
        the budget's memory: `BudgetRun.finish`). Windows exist on CUDA only, whose wall clock they read."""
        return self.budget.start(self.k, self.batch, "cuda")

    def due(self) -> bool:
        return time.perf_counter() - self.began - self.skipped >= WINDOW_S

    def count(self, rows: int) -> None:
        """A step (a block, or a plain step) of `rows` live rows ran in this window."""
        self.row_steps += rows
        self.steps += 1

    def skip(self, seconds: float) -> None:
        """Leave `seconds` of this window out of its wall: the drafter's catch-up after plain steps (serving/lag.py),
        a cost of changing arms that the windows' alternation while the arms are measured would charge to
        speculation."""
        self.skipped += seconds

    def turn(self, run: BudgetRun, emitted: int, pending: Optional[int]) -> BudgetRun:
        """End the window `run` ran: its outcome (a block chosen and drafted ahead, `pending` drafts, is withdrawn
        from it); -> the next window's run."""
        if pending is not None:
            run.withdraw(pending)
        live = self.row_steps / (self.steps * self.batch) if self.steps else 1.0  # (module docstring)
        run.finish(emitted - self.emitted, (time.perf_counter() - self.began - self.skipped) * live,
                   switch=self.skipped * live)  # (its probes' gap counts it: decoding/outcomes.py)
        self.began, self.emitted, self.skipped = time.perf_counter(), emitted, 0.0
        self.row_steps, self.steps = 0, 0
        return self.run()
