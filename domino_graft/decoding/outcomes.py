"""Whole decodes' tokens/s by batch size: which arm a static batch on CUDA runs (docs/design.md §5,
"Whole decodes").

The verify budget's step model (decoding/budget.py) prices one step from measured costs and an
acceptance estimate; near break-even its errors decide. The quantity the budget exists to maximise is
a whole batch's tokens per second, and a static batch's decode measures exactly that. So each such
decode reports its tokens/s here under its arm: "plain" (it ran the target alone from its first step)
or "spec" (it verified drafts at every step). A decode that did both ("mixed": the step model's, which
speculated and then went plain) is neither arm's sample: at d9b24dd on the H100 greedy B = 8's speculative
side was measured on three warm-up decodes (median 9,656 tok/s against plain's 10,014) and the size went
plain, where the timed speculative decodes of the run before had run 1.10x the target alone; its mixed
decodes count here only as a sign that the step model sits near break-even, after which the arms are
run on their own until each has OUTCOME_MIN decodes. Once one arm has OUTCOME_MIN decodes and the other fewer,
the next decodes run the other arm, so both get measured: at `b0753cf` on the H100 the step model
started every B = 4 decode committed (+ Domino 0.99x the target alone) where `c8cab9e`'s decodes, which
speculated, had run 1.16x; until then only speculation's side was ever compared. Both measured is not yet
decided: a first verdict needs the arms' medians apart by more than SPREAD_MARGIN times the wider arm's median
absolute deviation, or both windows full, for a static batch's tokens/s moves with its prompts (a speculative
decode's with their acceptance): at aa4e088 on the H100 greedy B = 8's speculative decodes ran 0.97-1.25x the
target alone batch by batch, three of them left the verdict plain, and 6 of 16 timed batches ran plain before the
verdict turned (the arms' medians then 11,482 against 9,826 tok/s). A verdict against the step model's own choice
at that size (what it would run now, reported with each decode: `add`'s `model`) waits for both windows full: two
estimates that disagree ask for more decodes. At cae7362 on the H100 (greedy B = 4) + Domino went plain on three
speculative warm-up decodes at a median of 4,486 tok/s against plain's 5,782, where the step model chose
speculation and the drafter alone's eight speculative decodes ran 6,210 (1.09x its plain arm); the verdict held
through all 16 timed batches. Until then each arm runs alone in turn, the one with fewer decodes first. With a
verdict,
a size runs the arm whose recent decodes' median is the faster (plain on a tie), and a probe decode is
the step model's to choose, so a change in either arm is seen again. Probes come PROBE_EVERY decided
decodes apart, the gap doubling (to PROBE_MAX) each time a probe leaves the verdict as it was and back to
PROBE_EVERY when the verdict turns; a first verdict's gap, and a kept one's, is never under the arms' margin
over PROBE_COST (a probe against the verdict costs about that margin of one decode: at 924e452's greedy B = 32
on the H100 the arms lay 14% apart and one probe in 16 timed batches left + Domino 0.981x the target alone).
A served batch's windows (serving/windows.py) pay one more cost at a probe: changing arms. A
speculative window after plain ones first recomputes what they decoded for the drafter (serving/lag.py), out of the
window's wall, so each window reports that switch's seconds (`add`'s `switch`, as a share of its own wall) and the
gap counts them too: on the CPU at 7a3e4d9 (bench/results/served_arms_cpu.json, windows of 0.25 s) one catch-up took
0.26 s, the arms lay 53% apart, and the gap reached PROBE_MAX where the margin alone gives 85 windows.
Where the step model disagrees with a settled verdict, its probes are the
loss (at T = 1, B = 1 on the H100 at `41c3e2d`, the 4 probes of 64 decodes speculated at ~7% under the
plain arm and left + Domino 0.993x the target alone), and a long run of decodes (RL rollouts) pays for
fewer of them.
"""

from __future__ import annotations

import math
from statistics import median_high
from typing import Optional

ARMS = ("spec", "plain")
MIXED = "mixed"  # a decode that speculated and then went plain: no arm's sample (module docstring)
# the tokens/s of a size's last OUTCOME_WINDOW decodes of each arm; an arm needs OUTCOME_MIN of them to compare
# (a median of three, not the larger of two: one decode on easy or hard prompts does not decide a size)
OUTCOME_WINDOW = 8
OUTCOME_MIN = 3
# a first verdict needs the medians apart by this many median absolute deviations of the wider arm (or both
# windows full): module docstring
SPREAD_MARGIN = 2.0
# once both arms are measured, a probe (the step model's decode) after PROBE_EVERY decided decodes, the gap
# doubling up to PROBE_MAX while probes leave the verdict as it was (module docstring)
PROBE_EVERY = 16
PROBE_MAX = 256
# a probe the step model runs against the verdict costs about the arms' margin of one decode: probes come at least
# margin / PROBE_COST decided decodes apart, so they cost at most ~PROBE_COST of the throughput (16 apart up to a
# 10% margin; at 924e452's greedy B = 32 on the H100, 14% apart, one probe in 16 batches cost 1.7%); a served window's
# switch of arms counts too (module docstring)
PROBE_COST = 0.00625
# the switches a size's gap is judged by: the median of the last few a served batch reported
SWITCH_WINDOW = 8


class Outcomes:
    """Per batch size (or the solo chain's "solo"): each arm's recent tokens/s and the decodes decided since the
    last probe."""

    def __init__(self):
        self.by_batch: dict[int, dict] = {}

    def __bool__(self) -> bool:
        return bool(self.by_batch)

    def _seen(self, batch: int) -> dict:
        return self.by_batch.setdefault(batch, {"spec": [], "plain": [], "mixed": 0, "decided": 0,
                                                "gap": PROBE_EVERY, "probe_at": 0, "pending": None, "verdict": None,
                                                "model": None, "switch": []})

    def wants_model(self, batch: int) -> bool:
        """Whether `add` should be told the step model's choice at this size: only before its first verdict
        (after it the choice is not read, and working it out is host time inside a decode)."""
        seen = self.by_batch.get(batch)
        return seen is None or seen["verdict"] is None

    def _verdict(self, seen: dict) -> str:
        return "plain" if median_high(seen["plain"]) >= median_high(seen["spec"]) else "spec"

    def arm_for(self, batch: int) -> Optional[str]:
        """The arm the next decode of `batch` rows runs: None (the step model chooses) while neither arm
        has OUTCOME_MIN decodes and no decode was mixed, and at a probe (module docstring); the arm short
        of them while the other has them (after a mixed decode: the one with fewer, speculation first),
        and so too while both have them but are not yet apart (`settled`); else the faster arm by median (plain
        on a tie)."""
        seen = self.by_batch.get(batch)
        if seen is None:
            return None
        spec, plain = len(seen["spec"]), len(seen["plain"])
        if spec < OUTCOME_MIN and plain < OUTCOME_MIN and not seen["mixed"]:
            return None
        if min(spec, plain) < OUTCOME_MIN:
            if spec < OUTCOME_MIN and plain < OUTCOME_MIN:  # near break-even (a mixed decode): each arm alone
                return "spec" if spec <= plain else "plain"
            return "spec" if spec < plain else "plain"
        if seen["verdict"] is None:  # both measured, not yet apart (`settled`): each arm alone in turn
            return "spec" if spec <= plain else "plain"
        seen["decided"] += 1  # both arms measured: `add` keeps the verdict current
        if seen["decided"] - seen["probe_at"] >= seen["gap"]:
            seen["probe_at"], seen["pending"] = seen["decided"], seen["verdict"]
            return None
        return seen["verdict"]

    def add(self, batch: int, arm: str, tokens: int, seconds: float, model: Optional[str] = None,
            switch: float = 0.0) -> None:
        """A whole decode of `batch` rows that ran `arm`: its tokens/s (no sample without tokens or time;
        a MIXED decode is counted, never compared). model: the arm the step model alone would choose at this
        size now (None: it cannot say yet); the latest one said is kept (module docstring). switch: seconds that
        changing arms cost before it, left out of `seconds` (a served window's drafter catch-up)."""
        if arm not in ARMS + (MIXED,):
            raise ValueError(f"outcome arm: {arm!r}; valid: {', '.join(ARMS + (MIXED,))}")
        if model not in ARMS + (None,):
            raise ValueError(f"outcome model: {model!r}; valid: {', '.join(ARMS)} or None")
        if seconds <= 0 or tokens <= 0:
            return
        seen = self._seen(batch)
        if model is not None:
            seen["model"] = model
        if switch > 0:
            seen["switch"] = (seen["switch"] + [switch / seconds])[-SWITCH_WINDOW:]
        if arm == MIXED:
            seen["mixed"] += 1
            if seen["pending"] is not None:  # a probe the step model ran mixed: nothing against the verdict
                seen["gap"], seen["pending"] = min(2 * seen["gap"], PROBE_MAX), None
            return
        rates = seen[arm]
        rates.append(tokens / seconds)
        del rates[:-OUTCOME_WINDOW]
        if not self.settled(batch):
            return
        verdict = self._verdict(seen)
        if seen["pending"] is not None:  # the probe's decode: the verdict it left (kept: further apart)
            kept = verdict == seen["pending"]
            seen["gap"] = max(min(2 * seen["gap"], PROBE_MAX), _least_gap(seen)) if kept else PROBE_EVERY
            seen["pending"] = None
        elif seen["verdict"] is None:  # a first verdict
            seen["gap"] = _least_gap(seen)
        elif verdict != seen["verdict"]:  # the verdict's own arm turned it (its decodes grew slower): probe soon
            seen["gap"] = PROBE_EVERY
        seen["verdict"] = verdict

    def settled(self, batch: int) -> bool:
        """The size has a verdict, or its arms are measured well enough for one: each has OUTCOME_MIN decodes
        and their medians lie apart beyond the spread the way the step model chooses too (or it has not said),
        or both windows are full (a warm-up runs until then: bench/concurrency.py)."""
        seen = self.by_batch.get(batch)
        if seen is None or not all(len(seen[arm]) >= OUTCOME_MIN for arm in ARMS):
            return False
        if seen["verdict"] is not None or min(len(seen[arm]) for arm in ARMS) >= OUTCOME_WINDOW:
            return True
        # apart, and not against the step model's own choice (module docstring)
        return apart(seen["spec"], seen["plain"]) and seen["model"] in (None, self._verdict(seen))

    def summary(self, batch: int) -> Optional[dict]:
        """{arm: {"decodes", "median_tokens_per_s"}, "mixed": decodes, "verdict", "probe_gap"} at this size
        (bench reports), None if none seen."""
        seen = self.by_batch.get(batch)
        if seen is None:
            return None
        arms = {arm: {"decodes": len(seen[arm]),
                      "median_tokens_per_s": round(median_high(seen[arm]), 1) if seen[arm] else None} for arm in ARMS}
        return {**arms, "mixed": seen["mixed"], "verdict": seen["verdict"], "probe_gap": seen["gap"],
                "model": seen["model"]}


def _least_gap(seen: dict) -> int:
    """The fewest decided decodes between probes at the arms' margin now and what a switch of arms costs, in
    decodes (PROBE_COST)."""
    fast, slow = sorted((median_high(seen["spec"]), median_high(seen["plain"])), reverse=True)
    switch = median_high(seen["switch"]) if seen["switch"] else 0.0
    return min(PROBE_MAX, max(PROBE_EVERY, math.ceil((1 - slow / fast + switch) / PROBE_COST - 1e-9)))


def apart(spec: list[float], plain: list[float]) -> bool:
    """Whether two arms' recent tokens/s lie apart: medians more than SPREAD_MARGIN median absolute deviations of
    the wider arm apart (robust to one odd decode, unlike a range). Full windows decide without it (`settled`)."""
    spread = max(_mad(spec), _mad(plain))
    return abs(median_high(spec) - median_high(plain)) > SPREAD_MARGIN * spread


def _mad(rates: list[float]) -> float:
    mid = median_high(rates)
    return median_high([abs(r - mid) for r in rates])
