"""The verify budget: how many of the K drafted tokens a batched chain step verifies (docs/design.md
§5, "Verify budget").

A step that verifies K' drafts (0 <= K' <= K) costs the drafter's propose (one forward, whatever K'), the
head's rollout of K' slots (slot after slot: its cost per slot is measured apart on CUDA, `ProposeTimer`)
and one target forward of T = K' + 1 tokens per row; K' = 0 is a plain target decode step (no propose,
T = 1). Until `48fc57d` the propose was timed with the full rollout, so a short K' was costed as if it
rolled out all K (+ Domino at B = 8: K' = 3 judged at 1.85 ms a step; docs/results.md §0c). With
alpha_i the running acceptance of slot i given slot i was reached, the tokens a row gains are

    E(K') = 1 + sum_{j=1..K'} prod_{i<=j} alpha_i

and the budget picks, among a few candidates (so that CUDA graphs stay few), the K' maximising
E(K') / cost(K'). A static batch (`batched_chain`, not shrinking) runs every step at full size until its
last row ends, so its rate is its slowest row's, not the mean row's: with n live rows and R tokens left
to its longest row, a row needs R / E steps give or take sigma sqrt(R) / E^1.5 (sigma^2 the variance of
a step's gain), and the slowest of n lags by E[max of n normals] of those (`batch_tokens`). On f083e02's
SmolLM2 run (bench/results/concurrency_h200.json) B = 16 ran 48.5 steps a batch where its rows' mean
needed 33 (the model: 49); the server's batches refill ended rows, so they keep E(K'). At a large batch a long verify costs several decode steps (issue #39's table:
6.2 steps for T = 16 at B = 16 with the default kernels), so a low acceptance makes K' = 0 (the target
alone) the best choice: a speculative batch is then never slower than the target.

On CUDA the cost of a step is also read off the wall clock: a step's time from one `tick` to the next
includes what the device-side costs leave out (the host's bookkeeping between steps, eager launches),
and the median of each kind's recent excess (plain steps, speculative steps; a K' with samples of its
own, its own, at most a longer K''s) is added to the device-side cost of that kind, so the choice compares
whole steps. A kind not yet seen adds nothing (it looks cheap, so it gets tried and measured). A plain step
is costed by the target alone's lean loop ("lean": no features captured, nothing written to the drafter) once that has
samples: choosing K' = 0 leads there after COMMIT_AFTER steps, and a plain step through the chain costs
more (1.12 against ~0.6 ms of excess at B = 64 in d5c6fde's run), which made K' = 0 look worse than it is.
Before the lean loop has samples, K' = 0 takes the smaller of the plain and speculative excess: the lean
loop's host work (one sync, the pushes) is a speculative step's (0.33 / 0.37 ms lean against 0.33 / 0.34
speculative at B = 16 / 64 in f083e02's run, 0.58 / 0.61 plain through the chain). The first step of a decode is
not sampled (it meets the decode's first shapes: graph captures, compiles), nor is a step over OUTLIER
times its device-side cost; the committed plain loop samples its own steps.

The acceptance estimate is one for the whole budget (`VerifyBudget.pool`), whatever the batch size:
how often slot i's draft is accepted is the drafter's and the data's, not the batch's (the batch size
enters through the costs and the slowest row, `batch_tokens`). Until e890265 each batch size kept its
own estimate, and a batch size where plain steps won learnt it only from probe decodes that verified
all K at their first step: the start of an answer is its most predictable part, so those estimates
ran high (slot 1: 0.65 at B = 64 against 0.47-0.53 at B = 1-4, where every step is observed) and
sent B = 16 and 32 back to the drafter, where its decodes ran 17-31% slower than the target alone's
(bench/results/concurrency_h200/e890265_*). Now the batch sizes where speculation pays keep the
estimate of those where it does not.

What a decode learns about its costs stays with the budget, by batch size (`VerifyBudget.memory`):
the next decode at that size starts from its excess samples; a step kind its size has no samples of
borrows the nearest batch size's (`_samples`). When auto has chosen K' = 0 for COMMIT_AFTER steps
in a row the decode commits to plain decoding (`committed()`): the callers then run the target
alone's lean loop for the rest of it (no features captured, nothing written to the drafter), so a
batch in which speculation does not pay costs what the target alone costs. A decode at a batch size
seen before whose choice at its first step would be K' = 0 starts committed (`starts_committed`):
the callers run the target alone's decode itself, without the drafter's prefill or the prompt's
features, which a decode that only commits after COMMIT_AFTER steps still pays. Such a decode
observes nothing, and the estimate loses IDLE_DECAY of its weight: after a long plain stretch it has
drifted toward the optimistic prior far enough that a decode speculates again and checks it (where
that first happens: the batch size where speculation costs least).

Near break-even the estimate's error decides, and it leans one way: on the H200 (bench/results/
concurrency_h200.json) the speculative steps auto chose at B = 16 greedy (4a3b5fe) and at B = 1, T = 1
(f083e02) were chosen at model rates a few percent over plain steps, and those runs ended 0.98x the
target alone (the slowest-row spread and an unreached slot's optimistic prior both err upward). So
auto verifies drafts only where their rate beats plain steps' by SWITCH_MARGIN (10%): speculation
gives up gains under that margin, and a batch where it does not clearly pay decodes as the target.

On CUDA a batch size whose propose and rollout were never timed verifies all K until MIN_OWN steps have
timed them (`_explores`): taken from other sizes (`VerifyCosts` extends its end segments linearly) they can be
far off, and a size that starts committed on such a guess never times its own. A decode that starts committed
samples its lean loop (`tick(0, lean=True)`), so the sizes after it can borrow the lean cost: its first
LEAN_TIMED steps only (timing every one cost ~0.9% at B = 8-64 on the H100 at c8cab9e).

Whole decodes: the step model (device costs, wall-clock excess, the slowest row) can still misjudge a
static batch: at 8c01084 on the H100 greedy B = 8 chose K' = 3 at a model rate over plain steps' and ran
0.90x the target alone, and at b0753cf B = 4 started every decode committed where speculating had run
1.16x. So on CUDA each static batch's decode (the solo chain's too, key "solo") reports its tokens/s
(`finish(tokens, seconds)`) by its arm, plain (it started committed) or speculative (it verified drafts at
every step; one that did both is neither arm's sample: `measured_arm`), and once both arms
are measured at a size the faster one's median decides the next decode's arm (`arm`, decoding/outcomes.py; a
first verdict against the model's own choice, `model_arm`, waits for more decodes),
probes (decodes left to the step model) spaced out while they confirm it. A "spec" arm verifies drafts at
every step (K' > 0: the model chooses how many); a decode that captured a CUDA graph is no sample (its wall
holds the capture: common.py `whole_decode`).

A batch shrinks as its rows end (decoding/batched.py `_shrink`); the run then costs its steps at the new
batch size (`resize`). Only a decode that committed at its first batch size counts as committed for the
next one (`committed_whole`): a tail of a few rows that went plain says nothing about the full batch.

Every K' is lossless (the verify of the first K' drafts is the same rule: decoding/verify.py), so the
policy only moves speed. This module is plain Python: the engine feeds it acceptance counts and, where
it measures them, costs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Optional

from .acceptance import IDLE_DECAY, Acceptance
from .costs import VerifyCosts  # the cost table (re-exported: callers import it from here)
from .gains import (batch_tokens, expected_max_normal, expected_tokens, gain_moments,  # re-exported too
                    tokens_variance)
from .outcomes import Outcomes

__all__ = ["Acceptance", "BudgetRun", "VerifyBudget", "VerifyCosts", "batch_tokens", "best_budget", "budget_option",
           "candidate_budgets", "expected_max_normal", "expected_tokens", "gain_moments", "tokens_variance"]

MODES = ("full", "auto")
# verify lengths T = K' + 1 the auto policy chooses among (clipped to K + 1): four graph shapes
CANDIDATE_LENGTHS = (1, 4, 8, 16)
# the first steps of a decode verify everything: every slot's acceptance gets seen (and on CUDA the
# drafter's cost measured) before the estimate decides anything
WARMUP_STEPS = 2
VALID = "full, auto, or an integer N with 0 <= N <= K (the drafts verified per step)"
# the wall-clock excess of a step kind: the median of its last WALL_WINDOW samples (a step that
# compiled or captured a graph, or met a host hiccup, is an outlier the median skips)
WALL_WINDOW = 32
# the lean steps a decode times (module docstring): a handful keeps the median honest, the rest cost host time
LEAN_TIMED = 8
# auto's K' = 0 this many steps in a row: the decode commits to the target alone's loop
COMMIT_AFTER = 3
# a step whose wall time is over OUTLIER x its device-side cost is not sampled (a graph capture or a
# compile: the real run of d5c6fde had plain-step medians of 33-63 ms at B >= 8 from such steps)
OUTLIER = 4.0
# a K' with this many wall-clock samples of its own is costed by them, not by its kind's
MIN_OWN = 3
# auto verifies drafts only where that promises SWITCH_MARGIN x plain steps' rate (module docstring)
SWITCH_MARGIN = 1.1


def _median(samples: list[float]) -> float:
    """The median of the last WALL_WINDOW excess samples, never below 0 (0 with none)."""
    window = sorted(samples[-WALL_WINDOW:])
    return max(window[len(window) // 2], 0.0) if window else 0.0


def best_budget(alphas: list[float], candidates: Iterable[int], cost_ms: Callable[[int], float],
                tokens: Optional[Callable[[int], float]] = None, margin: float = 1.0) -> int:
    """The candidate K' with the most expected tokens (`tokens(K')`, default `expected_tokens`) per
    millisecond; a tie goes to the larger K' (fewer target forwards for the same rate). margin: K' = 0's
    rate counts this many times over, so a speculative K' must promise that much more than plain steps
    (auto's SWITCH_MARGIN)."""
    tokens = tokens or (lambda kk: expected_tokens(alphas, kk))
    best, best_rate = None, -1.0
    for kk in sorted(set(candidates)):
        rate = tokens(kk) / max(cost_ms(kk), 1e-9) * (margin if kk == 0 else 1.0)
        if rate >= best_rate:
            best, best_rate = kk, rate
    return best


def candidate_budgets(k: int, lengths: Iterable[int] = CANDIDATE_LENGTHS) -> list[int]:
    """K' candidates: T - 1 for each verify length, clipped to K, and K itself."""
    return sorted({min(t - 1, k) for t in lengths} | {k})


# ----------------------------------------------------------------------- policy
@dataclass
class VerifyBudget:
    """What a batched chain verifies per step: "full" (all K: the default), "fixed" (always `n`),
    "auto" (the cost model of the module docstring, over `costs`) or "cycle" (a warm-up's: every
    candidate K' after every other, `BudgetRun.cycle`). Kept across decodes: costs the engine measures (CUDA)
    are added to `costs`, so they are measured once per (B, T)."""

    mode: str = "full"
    n: Optional[int] = None
    costs: Optional[VerifyCosts] = None
    lengths: tuple[int, ...] = CANDIDATE_LENGTHS
    # what decodes learned of their costs, by batch size (or "solo"): their last BudgetRun (module docstring)
    memory: dict = field(default_factory=dict, repr=False, compare=False)
    # the acceptance every decode shares, whatever its batch size (module docstring)
    pool: Optional[Acceptance] = field(default=None, repr=False, compare=False)
    # whole decodes' tokens/s by batch size and arm (decoding/outcomes.py)
    outcomes: Outcomes = field(default_factory=Outcomes, repr=False, compare=False)

    def __post_init__(self):
        if self.mode not in (*MODES, "fixed", "cycle"):
            raise ValueError(f"verify budget mode: {self.mode!r} is not a mode; valid: full, fixed, auto, cycle")
        if self.mode == "fixed" and (isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 0):
            raise ValueError(f"verify budget: fixed needs n, the drafts verified per step; got {self.n!r}; "
                             "valid: an integer >= 0")

    @classmethod
    def parse(cls, text, costs: Optional[VerifyCosts] = None, flag: str = "--verify-budget") -> "VerifyBudget":
        """"full", "auto", "N" or "fixed:N" (N drafts verified per step)."""
        s = str(text).strip()
        if s in MODES:
            return cls(mode=s, costs=costs)
        num = s[len("fixed:"):] if s.startswith("fixed:") else s
        try:
            n = int(num)
        except ValueError:
            raise ValueError(f"{flag}: {text!r} is not a budget; valid: {VALID}") from None
        if n < 0:
            raise ValueError(f"{flag}: {n} is negative; valid: {VALID}")
        return cls(mode="fixed", n=n, costs=costs)

    def fresh(self) -> "VerifyBudget":
        """The same policy and costs with nothing learned yet (one per decoder whose acceptance differs,
        e.g. the drafter alone and + Domino). The target's step costs stay shared (measured once per
        (B, T)); the propose costs are the copy's own: a Domino rollout costs more than the drafter's argmax."""
        costs = self.costs
        if costs is not None:
            costs = VerifyCosts(step_ms=costs.step_ms, propose_ms=dict(costs.propose_ms),
                                rollout_ms=dict(costs.rollout_ms), source=costs.source)
        return replace(self, memory={}, costs=costs, pool=None, outcomes=Outcomes())

    def check(self, k: int, device_type: str, flag: str = "--verify-budget") -> None:
        """Refuse what cannot run with a drafter of K slots on this device (before any decoding)."""
        if self.mode == "fixed" and self.n > k:
            raise ValueError(f"{flag}: {self.n} exceeds the drafter's K = {k} drafts per step; valid: full, auto, "
                             f"or an integer 0..{k}")
        if self.mode == "auto" and device_type != "cuda" and not self._table_complete():
            raise ValueError(f"{flag}: auto on {device_type} needs a cost table with step_ms and propose_ms "
                             "(--verify-costs FILE.json; costs are measured only on CUDA); valid there: full or N")

    def _table_complete(self) -> bool:
        return self.costs is not None and bool(self.costs.step_ms) and bool(self.costs.propose_ms)

    def label(self) -> str:
        return str(self.n) if self.mode == "fixed" else self.mode

    def choices(self, k: int) -> list[int]:
        """Every K' a step may verify with a drafter of K slots: K (full), N (fixed) or auto's candidates."""
        if self.mode == "full":
            return [k]
        return [self.n] if self.mode == "fixed" else candidate_budgets(k, self.lengths)  # auto, cycle

    def start(self, k: int, batch: int, device_type: str, carry: Optional["BudgetRun"] = None,
              key=None, remaining: int = 0) -> "BudgetRun":
        """The state of one decode of `batch` rows with a drafter of `k` slots; on CUDA it reads the
        wall clock too (module docstring). carry: the run this one continues (the server's rebuilt
        batch), else what the last decode under `key` (default: the batch size) learned. remaining:
        the most tokens a row may emit (a static batch's first choice is judged by its slowest row)."""
        self.check(k, device_type)
        key = batch if key is None else key
        remembered = carry is None
        if remembered:
            carry = self.memory.get(key)
        return BudgetRun(self, k, batch, wall_clock=device_type == "cuda", carry=carry, key=key,
                         remembered=remembered, remaining=remaining)

    def acceptance(self, k: int) -> Acceptance:
        """The shared acceptance estimate for a drafter of k slots (a new one if k changed)."""
        if self.pool is None or self.pool.k != k:
            self.pool = Acceptance(k)
        return self.pool


class BudgetRun:
    """One decode's choices: the running acceptance and a histogram of the K' chosen."""

    def __init__(self, budget: VerifyBudget, k: int, batch: int, wall_clock: bool = False,
                 carry: Optional["BudgetRun"] = None, key=None, remembered: bool = False, remaining: int = 0):
        self.budget, self.k, self.batch = budget, k, batch
        self.first_batch = batch  # the decode's batch size before any compaction (`resize`)
        self.remaining = remaining  # the most tokens a row may emit (the slowest row's, `batch_tokens`)
        self.key = batch if key is None else key
        self.candidates = candidate_budgets(k, budget.lengths)
        # "cycle" (a warm-up before timing or serving): each candidate then each candidate, so every ordered
        # pair of K' meets in two steps in a row. A step's shapes depend on the K' before it too: a static
        # drafter writes the block a K' = 0 step left pending with its next propose, a shape no fixed K' meets
        # (at 8c01084 one auto decode captured a graph inside a timed batch and took 2.8 s, not 0.1: likely one)
        self.cycle = [kk for a in self.candidates for b in self.candidates for kk in (a, b)]
        self.pool = budget.acceptance(k)  # shared with every decode of this budget (module docstring)
        self.decode_steps = 0  # this decode's choices
        self.lean_steps = 0  # steps of the target alone's loop this decode ran (`tick`)
        self.decodes = 0  # decodes before this one at this batch size (or key)
        self.plain_streak = 0
        self.chosen: dict[int, int] = {}
        self._before_choice = (0, False)  # the streak and committed_whole before the last `choose` (`withdraw`)
        self.propose_samples: list[float] = []  # ms of this decode's proposes (measured on CUDA)
        self.rollout_samples: list[float] = []  # ms per slot of their rollouts
        self.wall_clock = wall_clock  # add each step kind's measured wall-clock excess (module docstring)
        self._step_start: Optional[tuple[int, float, bool]] = None  # (K', when, lean) of the step under way (tick)
        self.excess: dict[str, list[float]] = {"plain": [], "spec": []}
        self.committed_whole = False  # committed to plain steps at the decode's first batch size
        self._final_alphas: Optional[list[float]] = None  # the estimate at `finish` (`report`)
        if carry is not None and carry.k == k:  # a rebuilt batch, or the last decode at this size
            self.decodes = carry.decodes + 1
            if carry.first_batch == batch:
                self.excess = {kind: list(v) for kind, v in carry.excess.items()}
                if carry.batch == batch:  # propose samples too, until MIN_OWN of them go into the table
                    self.propose_samples, self.rollout_samples = list(carry.propose_samples), list(carry.rollout_samples)
        # whole decodes measured at this size choose the arm (module docstring); else a size seen before whose
        # first choice would be plain steps runs the target alone's decode from its first step (nothing drafted)
        # (only callers that time whole decodes report them, `finish(tokens, seconds)`: a key with none has no arm)
        self.arm = budget.outcomes.arm_for(self.key) if remembered and budget.mode == "auto" and wall_clock else None
        self.by_outcome = self.arm is not None
        seen = carry is not None and carry.k == k and carry.first_batch == batch
        self.starts_committed = self.arm == "plain" or (
            self.arm is None and remembered and seen and budget.mode == "auto" and self._choice(batch, remaining) == 0)
        if self.starts_committed:
            self.plain_streak = COMMIT_AFTER
            self.committed_whole = True
            self.pool.decay(IDLE_DECAY)

    def resize(self, batch: int) -> None:
        """The batch shrank to `batch` rows (decoding/batched.py): steps cost that batch's, and the proposes
        timed so far are the old batch's."""
        costs = self.budget.costs
        if costs is not None and self.batch not in costs.propose_ms:
            self._store_propose()
        self.propose_samples, self.rollout_samples = [], []
        self.batch = batch

    def lengths_to_measure(self) -> list[int]:
        """Verify lengths whose target cost at this batch size is unknown (auto only)."""
        if self.budget.mode != "auto":
            return []
        costs = self.budget.costs
        return [kk + 1 for kk in self.candidates if costs is None or not costs.has(self.batch, kk + 1)]

    def add_measured(self, step_ms: dict[int, float]) -> None:
        """Target costs the engine measured at this batch size (T -> ms) into the budget's table."""
        if not step_ms:
            return
        b = self.budget
        if b.costs is None:
            b.costs = VerifyCosts(source="measured")
        elif "measured" not in b.costs.source:
            b.costs.source += "+measured"
        b.costs.step_ms.setdefault(self.batch, {}).update(step_ms)

    def add_propose(self, ms: float, rollout_ms: float = 0.0, slots: int = 0) -> None:
        """A step's drafter forward (`ms`) and its rollout of `slots` slots (`rollout_ms`) on the CUDA
        clock (common.ProposeTimer). At 63a585e one sample over a graph capture, alone in its decode, became
        B = 4's propose cost (1.9 s) and kept the drafter from speculating there; now the samples of a batch
        size's decodes add up, and `_propose_medians` sets its cost from MIN_OWN that are no outliers."""
        self.propose_samples.append(ms)
        self.rollout_samples.append(rollout_ms / slots if slots else 0.0)

    def _propose_medians(self) -> Optional[tuple[float, float]]:
        """(propose ms, rollout ms per slot): the medians of the samples within OUTLIER x the fastest (one over
        that held a graph capture or compile), once MIN_OWN are; else None. Until 4a3d5e9 a sample over OUTLIER x
        the full verify's cost was dropped: a drafter that slow (the GPU tests' tiny target) never got a cost."""
        lo_p = max(min(self.propose_samples, default=0.0), 1e-3)
        lo_r = min((r for r in self.rollout_samples if r > 0), default=0.0)  # 0: a step that rolled out no slot
        kept = [(p, r) for p, r in zip(self.propose_samples, self.rollout_samples)
                if p <= OUTLIER * lo_p and (not lo_r or r <= OUTLIER * lo_r)]
        if len(kept) < MIN_OWN:
            return None
        return (sorted(p for p, _ in kept)[len(kept) // 2], sorted(r for _, r in kept)[len(kept) // 2])

    def _store_propose(self) -> None:
        """The samples' medians into the budget's table as this batch size's costs (once there are enough)."""
        medians, costs = self._propose_medians(), self.budget.costs
        if medians is not None and costs is not None:
            costs.propose_ms[self.batch], costs.rollout_ms[self.batch] = medians

    def times_propose(self, device_type: str) -> bool:
        """Whether the engine should time this step's propose: auto on CUDA without a propose cost
        for this batch size, a handful of samples."""
        costs = self.budget.costs
        return (self.budget.mode == "auto" and device_type == "cuda" and len(self.propose_samples) < 8
                and (costs is None or self.batch not in costs.propose_ms))

    def finish(self, tokens: int = 0, seconds: float = 0.0, switch: float = 0.0) -> "BudgetRun":
        """The decode's end: its propose measurements go into the budget's table (as its target costs
        did) and its estimate into the budget's memory, so the next decode at this batch size starts
        with them. tokens, seconds: the whole decode's (a static batch's, on CUDA: its tokens/s joins
        the budget's outcomes at its first batch size); switch: seconds that changing arms cost before it (a
        served window's, decoding/outcomes.py). -> the run, whose `report()` is built when read
        (`Engine.last_budget`), after the decode's time: built in the decode (medians, every candidate's
        cost) it was host time inside the wall the outcomes compare (on the H100 the plain arm ran 0.2% under
        the target alone's same loop, before and after this: docs/results.md §0c)."""
        self._store_propose()
        if self.wall_clock and self.budget.mode == "auto" and tokens:
            outcomes = self.budget.outcomes
            model = self.model_arm() if outcomes.wants_model(self.key) else None
            outcomes.add(self.key, self.measured_arm(), tokens, seconds, model=model, switch=switch)
        self.budget.memory[self.key] = self
        self._final_alphas = self.pool.alphas()  # the shared estimate moves on with the next decode
        return self

    def model_arm(self) -> Optional[str]:
        """The arm the step model alone would run a decode of this size now: "spec" where its first choice
        (whatever the outcomes' arm) verifies drafts, else "plain"; None while it cannot judge (the estimate's
        warm-up, no costs, this size's propose not yet timed, or a batch that shrank). decoding/outcomes.py
        weighs a first verdict against it."""
        costs = self.budget.costs
        if (self.batch != self.first_batch or self.pool.steps < WARMUP_STEPS or costs is None or not costs.step_ms
                or self._explores()):
            return None
        return "spec" if self._best(self.candidates, self.batch, self.remaining) else "plain"

    def measured_arm(self) -> str:
        """What this decode's tokens/s is a sample of (decoding/outcomes.py): "plain" (it started committed),
        "spec" (it verified drafts at every step) or "mixed" (both: no arm's sample)."""
        if self.starts_committed:
            return "plain"
        return "mixed" if self.chosen.get(0) else "spec"

    def alphas(self) -> list[float]:
        return self.pool.alphas()

    def device_cost_ms(self, kk: int, propose_costs: Optional[tuple[float, float]] = None) -> float:
        """The step's device-side cost: the target's forward of K' + 1 tokens, plus for K' > 0 the
        drafter's forward and the rollout of K' slots (per slot: the head's GRU and residual run slot
        after slot, so a short K' rolls out for less)."""
        costs = self.budget.costs
        if kk == 0:
            return costs.step(self.batch, 1)
        propose, per_slot = propose_costs or self._propose_costs()
        return propose + per_slot * kk + costs.step(self.batch, kk + 1)

    def _propose_costs(self) -> tuple[float, float]:
        """(the drafter's propose ms, the rollout's ms per slot) at this batch size: the table's, or this decode's
        own samples where the table has none yet (CUDA)."""
        costs = self.budget.costs
        own = None if self.batch in costs.propose_ms else self._propose_medians()
        return own or (costs.propose(self.batch) or 0.0, costs.rollout(self.batch))

    def cost_ms(self, kk: int, spec_excess: Optional[dict[int, float]] = None,
                propose_costs: Optional[tuple[float, float]] = None) -> float:
        """The device-side cost and, with the wall clock on, the measured excess (K' > 0: `spec_excess`'s);
        propose_costs: `_propose_costs()`, where the caller costs several K'."""
        if kk == 0:
            lean = self._samples("lean", MIN_OWN)
            if lean:  # where K' = 0 leads (module docstring): its own samples, or the nearest size's
                return self.device_cost_ms(0) + _median(lean)
            if self.excess.get("plain") and self.excess.get("spec"):
                # the lean loop not seen yet: its host work (one sync, the pushes) is a speculative step's,
                # less than a plain step through the chain's (which also writes the drafter)
                return self.device_cost_ms(0) + min(self.excess_ms("plain"), self.excess_ms("spec"))
            # a plain step through the chain is never borrowed: at 59f8809 the nearest size's (B = 64:
            # 1.08 ms, against a lean step's 0.40) made K' = 0 look dear at B = 32, which then speculated
            # at 0.78x the target alone's speed
            return self.device_cost_ms(0) + _median(self.excess.get("plain", []))
        return self.device_cost_ms(kk, propose_costs) + (spec_excess or self.spec_excess())[kk]

    def spec_excess(self) -> dict[int, float]:
        """Each speculative K''s excess: its own with MIN_OWN samples (a longer verify books more), else its kind's;
        never over a longer K''s own (fewer slots to roll out; dbff6fe, greedy B = 2: 7 read 0.36 ms, 15 0.16)."""
        out, cap = {}, float("inf")
        for kk in sorted((k for k in self.candidates if k), reverse=True):
            own = len(self.excess.get(str(kk), [])) >= MIN_OWN
            out[kk] = min(self.excess_ms(str(kk) if own else "spec"), cap)
            cap = out[kk] if own else cap
        return out

    def excess_ms(self, key: str) -> float:
        return _median(self._samples(key))

    def _samples(self, key: str, least: int = 1) -> list[float]:
        """A step kind's excess samples: this batch size's once it has `least` of them, else the nearest
        batch size's that has (in log2 B; a tie goes to the larger, whose host work is the larger), else
        none (module docstring)."""
        mine = self.excess.get(key, [])
        if len(mine) >= least:
            return mine
        near = [r for r in self.budget.memory.values()
                if r is not self and isinstance(r.key, int) and len(r.excess.get(key, [])) >= least]
        if not near:
            return []
        return min(near, key=lambda r: (abs(math.log2(r.first_batch / self.batch)), -r.first_batch)).excess[key]

    def tick(self, kk: int, lean: bool = False) -> None:
        """Once a step, at the same point of each, for a step that verifies kk drafts (0: a plain step;
        `lean`: one of the target alone's loop): the time since the last tick is one whole step, a
        sample of the kind that tick announced (CUDA only). The decoding loops tick once a step's work is
        launched, before its sync, so this host work overlaps the device's instead of adding to the step
        (at the top of the loop, the lean loop's first LEAN_TIMED ticks and every speculative step's added
        their host time to the step); the server ticks at the top of its steps."""
        if not self.wall_clock:
            return
        if lean and self.lean_steps > LEAN_TIMED:  # sampled enough of this decode's lean loop
            self._step_start = None
            return
        now = time.perf_counter()
        if self._step_start is not None:
            kk_before, when, lean_before = self._step_start
            self.add_wall(kk_before, (now - when) * 1e3, lean=lean_before)
        self._step_start = (kk, now, lean)
        self.lean_steps += lean

    def restart_clock(self) -> None:
        """The time since the last tick holds work that is no step's (the server's admission of a prompt: its
        prefill is a request's cost, which booked to one step made speculation's fewer steps look cheaper, 0.48x
        the target alone at B = 32 on the H100 at 515831e): the step under way is not sampled."""
        self._step_start = None

    def add_wall(self, kk: int, ms: float, lean: bool = False) -> None:
        """A whole step that verified kk drafts (`lean`: the target alone's loop) took `ms` on the wall
        clock (tick to tick)."""
        if not self.wall_clock or self.budget.costs is None or not self.budget.costs.step_ms:
            return
        # the decode's first step: its first shapes (module docstring). A decode that starts committed
        # chooses nothing: its lean steps count (until 13bdded they did not, so such decodes never
        # sampled the lean loop, and B = 8 then costed K' = 0 as a plain step through the chain)
        if self.decode_steps + self.lean_steps <= 1:
            return
        device = self.device_cost_ms(kk)
        if ms > OUTLIER * device:  # a step that captured a graph or compiled: not what the kind costs
            return
        for key in ("lean",) if lean else ("spec" if kk else "plain", str(kk)):  # the kind's samples and K''s own
            samples = self.excess.setdefault(key, [])
            samples.append(ms - device)
            del samples[:-WALL_WINDOW]

    def choose(self, rows: int = 1, remaining: int = 0) -> int:
        """K' for the next step. A batch that runs until its last row ends (`batched_chain`; not the
        server's, whose ended rows are replaced) gives its live `rows` and the `remaining` tokens of its
        longest row: its rate is then its slowest row's (`batch_tokens`, module docstring)."""
        b = self.budget
        if b.mode == "full":
            kk = self.k
        elif b.mode == "fixed":
            kk = b.n
        elif b.mode == "cycle":
            kk = self.cycle[self.decode_steps % len(self.cycle)]
        else:
            kk = self._choice(rows, remaining)
        self._before_choice = (self.plain_streak, self.committed_whole)
        self.chosen[kk] = self.chosen.get(kk, 0) + 1
        self.decode_steps += 1
        self.plain_streak = self.plain_streak + 1 if kk == 0 else 0
        if self.committed() and self.batch == self.first_batch:
            self.committed_whole = True
        return kk

    def withdraw(self, kk: int) -> None:
        """The last `choose` (it gave kk) chose a step that never ran: a step drafted ahead whose batch ended
        first (decoding/batched.py, "Drafted ahead"). It leaves no count."""
        self.chosen[kk] -= 1
        if not self.chosen[kk]:
            del self.chosen[kk]
        self.decode_steps -= 1
        self.plain_streak, self.committed_whole = self._before_choice

    def adopt(self, kk: int) -> None:
        """A step the run before this one chose (and drafted ahead) runs in this one: it counts here, as a choice."""
        self._before_choice = (self.plain_streak, self.committed_whole)
        self.chosen[kk] = self.chosen.get(kk, 0) + 1
        self.decode_steps += 1
        self.plain_streak = self.plain_streak + 1 if kk == 0 else 0

    def _choice(self, rows: int, remaining: int) -> int:
        """auto's K': the shared estimate against this batch size's costs; all K for the estimate's
        first WARMUP_STEPS steps (every slot gets seen before it decides anything)."""
        costs = self.budget.costs
        if self.pool.steps < WARMUP_STEPS or costs is None or not costs.step_ms or self._explores():
            return self.k
        return self._best([kk for kk in self.candidates if kk] if self.arm == "spec" else self.candidates,
                          rows, remaining)

    def _best(self, choosable: list[int], rows: int, remaining: int) -> int:
        """The step model's K' among `choosable` (the cost model of the module docstring)."""
        alphas = self.alphas()
        spec_excess = self.spec_excess()  # one median a K' per step, not one per candidate costed
        moments, propose_costs = gain_moments(alphas, choosable), self._propose_costs()
        return best_budget(alphas, choosable, lambda kk: self.cost_ms(kk, spec_excess, propose_costs),
                           lambda kk: batch_tokens(alphas, kk, rows, remaining, moments[kk]), margin=SWITCH_MARGIN)

    def _explores(self) -> bool:
        """On CUDA, a batch size whose propose and rollout were never timed verifies all K until MIN_OWN
        steps have timed them: interpolated from other batch sizes they can be far off (at 13bdded, T = 1 on
        the H100: B = 1 and 2's rollout per slot, extended linearly, costed a B = 64 step at 86 ms, and every
        batch size from 4 up started committed without ever timing its own)."""
        costs = self.budget.costs
        return (self.wall_clock and self.batch not in costs.propose_ms
                and len(self.propose_samples) < MIN_OWN)

    def committed(self) -> bool:
        """Auto has chosen plain steps COMMIT_AFTER times in a row: the rest of the decode runs the
        target alone's loop (module docstring)."""
        return self.budget.mode == "auto" and self.plain_streak >= COMMIT_AFTER

    def commit(self) -> None:
        """The caller runs the target alone for the rest of the decode (the solo chain does on its first K' = 0)."""
        self.plain_streak = max(self.plain_streak, COMMIT_AFTER)
        if self.batch == self.first_batch:
            self.committed_whole = True

    def count_plain(self, n: int = 1) -> None:
        """Plain steps the committed loop ran (they show in the report's K' = 0 count)."""
        self.chosen[0] = self.chosen.get(0, 0) + n

    def observe(self, kk: int, accepted: Iterable[int]) -> None:
        """A step that verified kk drafts; `accepted`: each live row's accepted count (into the shared estimate)."""
        self.pool.observe(kk, accepted)

    def k_hist(self) -> dict[str, int]:
        """{K': steps} this decode chose (the report's "k_hist", without building the rest of it)."""
        return {str(kk): n for kk, n in sorted(self.chosen.items())}

    def report(self) -> dict:
        """{"mode", "batch", "k_hist": {K': steps}, "alpha": the estimate at `finish` (or now), and with
        the wall clock on "excess_ms": each step kind's excess the choice used}. Read it before the next
        decode: the costs it shows are the budget's table's, which later decodes extend."""
        alphas = self.alphas() if self._final_alphas is None else self._final_alphas
        out = {"mode": self.budget.label(), "batch": self.first_batch, "last_batch": self.batch,
               "k_hist": self.k_hist(),
               "alpha": [round(a, 4) for a in alphas]}
        if self.wall_clock:
            out["excess_ms"] = {key: round(self.excess_ms(key), 4) for key, v in self.excess.items() if v}
            out["cost_ms"] = {str(kk): round(self.cost_ms(kk), 4) for kk in self.candidates} \
                if self.budget.costs is not None and self.budget.costs.step_ms else None
            out["decodes_seen"] = self.decodes
            out["committed_whole"] = self.committed_whole
            out["starts_committed"] = self.starts_committed
            out["by_outcome"] = self.by_outcome
            out["arm"] = self.arm
        return out


def budget_option(text: str, costs_path: Optional[str], batch_size: int) -> Optional[VerifyBudget]:
    """`--verify-budget` / `--verify-costs` of generate and bench: None for "full" (today's decode),
    else the budget. Batched chains take any budget (decoding/batched.py); at batch size 1 the solo
    chain takes auto (its candidates: decoding/chain.py)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"--batch-size: {batch_size!r} is invalid; valid: an integer >= 1")
    costs = VerifyCosts.load(costs_path) if costs_path else None
    budget = VerifyBudget.parse(text, costs)
    if budget.mode == "fixed" and batch_size < 2:
        raise ValueError(f"--verify-budget: {text!r} needs batched decoding; valid: --batch-size N >= 2 with it, "
                         "or full or auto at batch size 1")
    return None if budget.mode == "full" else budget
