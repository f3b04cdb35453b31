"""When the batch in flight admits the queued requests: at once, or a few rows' ends later, together.

An admission in place costs about the same whatever it admits: on the H100 at 32 rows ~7 ms a call, for the target
alone's cohorts of several rows (its rows, stopped by one token budget, end together) and for + Domino's single rows alike
(its rows end at scattered blocks), against a ~1 ms step (bench/results/served_rollouts_h100/). A free row costs only
its share of each step it sits out. So the worker holds the queue while the rows it could fill, having sat out less
than one admission's measured cost (the ski-rental rule: never worse than twice the better choice in hindsight), would
still have paid less by the time the next running row reaches its token budget; then it admits every row freed
meanwhile in one call. Where no row is due to end within the rent (the target alone's rows, ended together, leave the
others a whole budget away) it admits at once: a row that ends by a stop token is not foreseen, so the gate holds only
for ends it can see coming. It never holds a request longer than WAIT_ADMISSIONS admissions take (its first token's
delay: ~60 ms on the H100 at 32 rows). vLLM's --scheduler-delay-factor holds prompts for the same reason.
docs/design.md §5, "Admissions in cohorts".
"""

from __future__ import annotations

import collections
import os
import statistics
from typing import Optional

WAIT_ADMISSIONS = 8  # the longest a request waits for its cohort while rows are free, in admissions' median cost
HISTORY = 16  # the admissions whose median cost is the rent's price

# DOMINO_GRAFT_COHORTS=0/1: off/on whatever the caller asked (A/B runs). Off by default (serve --admission-cohorts
# auto) until a GPU run measures it: on the CPU it cut + Domino's admissions 20 -> 6 calls but its tokens/s moved
# within the CPU's spread (bench/results/cohorts_cpu/), and admissions of the rows alone, kept on after a CPU run,
# then halved the H100's served tokens/s (bench/results/served_rollouts_h100/)
FORCED = {"0": False, "1": True}.get(os.environ.get("DOMINO_GRAFT_COHORTS", ""))


class Cohorts:
    """The serve worker's admission gate (serving/scheduler.py): `due` before admitting, `stepped` after each
    block, `admitted` after each admission in place."""

    def __init__(self, on: bool):
        self.on = on if FORCED is None else FORCED
        self.costs: collections.deque[float] = collections.deque(maxlen=HISTORY)
        self.cost: Optional[float] = None  # their median: the rent's price (None: none measured yet)
        self.idle_s = 0.0  # row-shares of step seconds the fillable free rows sat out since the last admission
        self.waiting_since: Optional[float] = None  # when a free row and a queued request first met
        self.rent_s, self.next_end_blocks = 0.0, float("inf")  # the last block's rent; blocks to the next end

    def due(self, now: float) -> bool:
        """Whether to admit now: always before any admission was measured; once the rent paid, with the rent until
        the next foreseen end, reaches an admission's median cost; or once a request has waited WAIT_ADMISSIONS of
        them."""
        cost = self.cost
        if not self.on or cost is None:
            return True
        if self.waiting_since is not None and now - self.waiting_since >= WAIT_ADMISSIONS * cost:
            return True
        return self.idle_s + self.rent_s * self.next_end_blocks >= cost

    def stepped(self, seconds: float, fillable: int, rows: int, now: float, soonest_left: Optional[int] = None,
                tokens_per_row: float = 0.0) -> None:
        """After a block of `seconds` in a batch of `rows` rows: `fillable` requests queued that could start now
        (min(the queue, the rows free or a rebuilt batch would add)); soonest_left: the fewest tokens a running row
        may still emit (its budget's end; None: no row running), and tokens_per_row: what a live row emitted in
        this block, which together foresee the next end."""
        if fillable <= 0:  # the wait starts over; a request arriving next is held one block, until a block sees it
            self.idle_s, self.waiting_since, self.rent_s, self.next_end_blocks = 0.0, None, 0.0, 0.0
            return
        if self.waiting_since is None:
            self.waiting_since = now
        self.rent_s = seconds * fillable / rows  # a block's rent
        self.idle_s += self.rent_s
        self.next_end_blocks = (max(soonest_left, 0) / tokens_per_row if soonest_left is not None
                                and tokens_per_row > 0 else float("inf"))

    def admitted(self, seconds: float) -> None:
        """An admission in place took `seconds` (its prefill, the first tokens' read, the wait for the block in
        flight): the rent starts again."""
        self.costs.append(seconds)
        self.cost = statistics.median(self.costs)  # once an admission, not at every block's `due`
        self.idle_s, self.waiting_since = 0.0, None
