"""The running acceptance a verify budget decides by (decoding/budget.py, whose module docstring gives the
policy): per drafter slot, how many rows reached it and how many of those accepted; and a batched decode's
rows' own per-slot counts (`slot_counts`)."""

from __future__ import annotations

from collections import Counter
from typing import Iterable

# the acceptance estimate: counts decay per step (a half-life of ~14 steps) toward a prior of
# PRIOR_ALPHA worth PRIOR_COUNT rows, so a slot that stops being verified (K' below it, or K' = 0)
# drifts back to the optimistic prior and gets verified again: the budget keeps probing
DECAY = 0.95
# ... and by this much per decode that starts committed (it observes nothing): after ~70 such decodes
# the estimate has halved its weight, so a long plain stretch ends in a decode that checks it again
IDLE_DECAY = 0.99
PRIOR_ALPHA = 0.8
PRIOR_COUNT = 2.0


class Acceptance:
    """The running acceptance of a drafter's K slots that every decode of one budget shares, at any
    batch size (budget.py's module docstring): per slot, how many rows reached it and how many of those accepted,
    decayed by DECAY per observed step and by IDLE_DECAY per decode that observes nothing."""

    def __init__(self, k: int):
        self.k = k
        self.reached = [0.0] * k
        self.accepted = [0.0] * k
        self.steps = 0  # steps observed

    def alphas(self) -> list[float]:
        return [(a + PRIOR_ALPHA * PRIOR_COUNT) / (n + PRIOR_COUNT) for a, n in zip(self.accepted, self.reached)]

    def decay(self, factor: float) -> None:
        self.reached = [n * factor for n in self.reached]
        self.accepted = [a * factor for a in self.accepted]

    def observe(self, kk: int, accepted: Iterable[int]) -> None:
        """A step that verified kk drafts; `accepted`: each live row's accepted count."""
        self.steps += 1
        self.decay(DECAY)
        # by a count of rows per accepted length, not slot by slot for each row: this runs between the
        # device's steps, and at B = 64 the row-by-row count took ~70 us of this machine's CPU (K' = 3)
        counts = [0] * (kk + 1)
        for a in accepted:
            counts[a] += 1
        more = 0  # rows that accepted more than j drafts: slot j is reached by them and by those that accepted j
        for j in range(kk - 1, -1, -1):
            more += counts[j + 1]
            self.reached[j] += more + counts[j]
            self.accepted[j] += more


def slot_counts(k: int, steps: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """-> ([K]: the steps whose slot j was verified, [K]: ... and accepted) over (accepted, K') pairs: a batched
    decode's row, once when it ends (batched.py `_Row.result`), by equal pairs. A step that accepted a of K'
    drafts verified slots 0 .. min(a, K' - 1) and accepted slots 0 .. a - 1."""
    reached, accepted = [0] * k, [0] * k
    for (a, kk), n in Counter(steps).items():
        for j in range(min(a + 1, kk)):
            reached[j] += n
            accepted[j] += n * (j < a)
    return reached, accepted
