"""Batched decoding of B prompts of different lengths: one propose, one rollout and one target
forward per step for the whole batch, with per-row acceptance, positions and stop rules.

The target is a session over B rows (decoding/session.py: prefill, step at per-row positions,
keep): wherever the target's architecture runs on the fast engine (on any device), its static
cache (`StaticSession`: row b is cache row b at its own position, a step is [B, K+1] at per-row
positions, CUDA graphs per batch size and attention bucket on a GPU, eager on a CPU, a rejection
is just the row's next position). Elsewhere (a target the fast engine refuses), or with
kv="dynamic", one HF DynamicCache shared by the rows (`DynamicSession`), in which each row owns
the entries a validity mask [B, L] marks (a 4D attention mask hides the others). A step is
[x_0, d_1..d_K] of every row at pos_b..pos_b+K; row b keeps x_0 and its accepted drafts.

Either way attention over a row's own entries only is the row's own decode: each row's greedy
output is its solo decode's, token for token, up to floating-point reassociation (the property
tests compare them, on both caches). A finished row stays in the batch, masked: its new entries
are never kept, its tokens never emitted, and the others do not wait for it (the static
target and drafter step it at its last position, its outputs dropped). Once at most half the
rows go on, the batch shrinks (`_shrink`): the target's session and the static drafter move the
rows that go on to the first rows of their caches (`compact`), padded with ended rows to a power
of two, and the next steps run at that batch size, so a batch's stragglers cost what a small batch
costs, not what the full one does. The target alone's loop always shrinks, and so does the plain tail
of a chain whose verify budget committed (its graphs at every size and attention bucket it can meet
are captured before the prefill: `StaticSession.prime_plain_tail`; its rows end at other positions than
the target alone's, and until 2be95b7 it kept its size because its compactions met shapes no warm-up
had captured); a speculating chain only with `shrink=True` (measured slower on the H200 at 80205fb:
docs/design.md), and only where the drafter can move rows (the static drafter's `compact`; the eager
ragged contract cannot).
`DecodeResult.kv_path` says which cache ran.

The drafter sees the same ragged layout. Beside the static target, a family that offers
``static_batch_drafter(max_len, batch)`` (a family's static drafter, adapters/base.py) keeps its context in
static per-row slots too: the prefill writes the right-padded prompts' features, a step is
``propose(anchor [B], positions)`` with the positions as host ints (no sync), then
``observe_block(features of all K+1 [B, K+1, F], positions)``; row b's next block reads only
its slots before its own anchor, so a rejection costs nothing, and on CUDA "write, then
propose" replays one graph per batch size and block shape. Otherwise (other families, or
the DynamicCache) the drafter runs eagerly through the adapter contract's ragged batches
(adapters/base.py: per-row positions [B, n], negative = padding; `propose` at [B] positions);
families set `ragged_batch`. Either way a step makes one device->host sync (the verify's
accept counts, bonus tokens and drafts together). Chains only (a tree's ragged verify is not
wired here): trees decode one prompt at a time.

At T > 0 each row is verified by standard speculative sampling (`verify.verify_chain`, the
solo chain path's rule and `warp()`), so each row's output is distributed exactly as its own
target-alone sampling. Randomness: one generator per batch decode, `sampling.generator(device,
seed_offset)`, consumed in a fixed order at every step: the anchors' draw at the prefill, [B]
rows at once; then per step the rollout's draws ([B] rows per slot, slot by slot), the
verifier's uniforms [B, K], then the [B] corrections / bonuses. Finished rows still draw (their
results are dropped) until the batch shrinks past them, so a batch with the same prompts, order and
seed reproduces its samples;
a row's samples depend on the batch it sits in, not only on its prompt (rows are not
bit-reproducible against their solo decode at T > 0, only equal in distribution).

Drafted ahead (`drafts_ahead`: CUDA, the static cache, a static drafter that takes its positions on the device;
DOMINO_GRAFT_SPEC_AHEAD=0 turns it off): a step's propose and rollout need only what its verify left on the device
(each row's next anchor, its position, the verified features), so step n + 1 is drafted before step n's accept
counts are read. The host's read and bookkeeping of step n then overlap the device's drafting of n + 1, where
before the device waited for them between the verify and the next propose (a speculative step's wall clock past its
device costs, `excess_ms` "spec" in the H100 run at cae7362: 0.07-0.08 / 0.17-0.22 / 0.36-0.47 ms at B = 1 / 4 / 16,
on steps of 1.0-1.5 ms).
The device moves every row live in step n by its accepts; a row that ends in step n is known on the host only
after step n + 1 was drafted, so it moves once more than it would (its outputs are dropped, as any ended row's:
`chain_room` leaves the room), and K' of step n + 1 is chosen before step n's accepts are observed. No step is
drafted ahead of one in which every row may reach max_new_tokens, and a step drafted ahead whose batch ended
leaves no count (`BudgetRun.withdraw`). The generator's draws keep their order (rollout n, verify n, rollout
n + 1), so a row's tokens are those of the loop that reads each step first wherever both choose the same K's
(tests/decoding/test_spec_ahead.py).

A verify budget (`budget=`, decoding/budget.py) makes a step verify only the first K' <= K drafts
(the rollout runs over K' slots, the verify over [x_0, d_1..d_K'], the drafter observes K' + 1
positions), or none: K' = 0 is a plain target step, the next token the target's own `pick`. K' is
the same for every row and chosen before the step's draws, so every row stays lossless. Once auto
has chosen K' = 0 a few steps in a row (`BudgetRun.committed`) the rest of the decode is the target
alone's own loop (`_target_steps`: no features captured, nothing written to the drafter).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Iterable, Optional, Sequence

import torch

from ..sampling import Sampling, pick
from .acceptance import slot_counts
from .budget import VerifyBudget
from .common import (DecodeResult, LiveMask, Output, TokenReader, check_kv, check_prompts, cuda_median_ms,
                     draft_step, stop_set, whole_decode)
from .session import DynamicSession, StaticSession, TargetSession
from .verify import verify_chain


def static_batch_drafter(adapter, target, length: int, batch: int):
    """The drafter's static, graphed path for `batch` rows, or None (the eager ragged contract):
    only beside the static ragged target, and only where the adapter's class offers
    ``static_batch_drafter(max_len, batch)`` (a family may answer None, e.g. for a subclass whose
    propose differs). Looked up on the class, as is the drafter's ``propose``: a wrapper that
    forwards attributes to an adapter it nudges (the tests' oracles) is not bypassed by a fast
    path it never declared."""
    if target.kv_path != "static" or not adapter.capture_layers():
        return None
    if getattr(type(adapter), "static_batch_drafter", None) is None:
        return None
    return adapter.static_batch_drafter(length, batch)


def _check_batch(engine, prompts, max_new_tokens: int) -> list[torch.Tensor]:
    if not len(prompts):
        raise ValueError("batched decoding: no prompts")
    return check_prompts(engine.target, prompts, max_new_tokens)


def ragged_target(engine, ids: list[torch.Tensor], length: int, kv: str = "auto") -> TargetSession:
    """The batch's target session: the fast engine's static cache (`StaticSession`, kept on the engine
    between decodes) where the target's architecture supports it and kv is not "dynamic"; else a
    `DynamicSession`. `length`: the positions the longest row may reach."""
    if check_kv(kv) != "dynamic":
        static, why = StaticSession.create(engine.target, len(ids), length, getattr(engine, "_ragged_static", None))
        if static is not None:
            engine._ragged_static = static
            return static
        engine.batch_kv_note = why
    return DynamicSession(engine.target)


@dataclass
class _Row:
    """One prompt's decode in a batch: its output and counts, whichever batch row it sits in (a
    compaction moves it: `_shrink`)."""

    out: Output
    k: int = 0  # the drafter's slots (the per-slot counts' length)
    seconds: float = 0.0  # when it ended
    forwards: int = 1  # target forwards, the prefill included
    accepted: list = field(default_factory=list)  # drafts accepted per step

    def result(self, prompt: torch.Tensor, kv_path: str, verified: Sequence[int] = ()) -> DecodeResult:
        """verified: the drafts each step of the batch verified (K'), from its first step: a row takes part
        from the first step until it ends, so its i-th accepted count is step i's. Its per-slot counts are
        tallied here, once, not per step between the device's steps (`slot_counts`)."""
        reached, accepted_slot = slot_counts(self.k, zip(self.accepted, verified))
        return DecodeResult(self.out.tokens, prompt.numel(), self.out.stop_reason, self.seconds, self.forwards,
                            self.accepted, reached, accepted_slot, kv_path=kv_path)


def _shrink(live: list[bool]) -> Optional[list[int]]:
    """The batch rows to keep once at most half the rows go on: the live rows, then ended ones up to the
    next power of two (the batch sizes a batch of B meets stay B, then powers of two: few graphs);
    None = keep the batch as it is."""
    on = [i for i, x in enumerate(live) if x]
    if not on:
        return None
    size = 1 << (len(on) - 1).bit_length()
    if size >= len(live):
        return None
    return on + [i for i, x in enumerate(live) if not x][: size - len(on)]


# The target alone's loop a step ahead (`_target_steps`): on an H100 at 07edc0a a SmolLM2-shaped step (random
# weights) took 0.692 / 0.772 / 1.155 ms at B = 1 / 16 / 64 against 0.719-0.728 / 0.815-0.817 / 1.224-1.227 ms
# reading each step before the next launch, both arms in either order (bench/results/plain_ahead_h100/).
# DOMINO_GRAFT_PLAIN_AHEAD=0 turns it off.
PLAIN_AHEAD = os.environ.get("DOMINO_GRAFT_PLAIN_AHEAD", "1") != "0"


def reads_ahead(target, device) -> bool:
    """Whether a plain loop (this one, or the solo Engine.target_only) launches a step before reading the one
    before (CUDA, the static cache, the switch)."""
    return PLAIN_AHEAD and torch.device(device).type == "cuda" and isinstance(target, StaticSession)


# A speculative step drafted ahead (`drafts_ahead`, module docstring "Drafted ahead"). DOMINO_GRAFT_SPEC_AHEAD=0
# turns it off.
SPEC_AHEAD = os.environ.get("DOMINO_GRAFT_SPEC_AHEAD", "1") != "0"


def drafts_ahead(target, drafter, device) -> bool:
    """Whether a speculative loop drafts step n + 1 before reading step n (CUDA, the static cache, a static drafter
    that takes its positions on the device, the switch)."""
    return (SPEC_AHEAD and torch.device(device).type == "cuda" and isinstance(target, StaticSession)
            and takes_device_positions(drafter))


def takes_device_positions(drafter) -> bool:
    """The static drafter's propose takes its positions as a device tensor (`at=`): looked up on its class, as
    `static_batch_drafter` is, so a wrapper that forwards attributes to one (the tests' oracles) is not bypassed."""
    return getattr(type(drafter), "positions_on_device", False)


def chain_room(k: int) -> int:
    """Cache positions past a decode's last token that its steps may write: a verify of K drafts after it, and one
    more block for a row that ended in a step whose successor was drafted ahead (it advanced before the host knew)."""
    return 2 * (k + 1)


def _can_shrink(target, drafter=None, needs_drafter: bool = False) -> bool:
    """Compaction needs the target's session and, for a chain, its static drafter to move rows."""
    return hasattr(target, "compact") and (not needs_drafter or (drafter is not None and hasattr(drafter, "compact")))


@torch.inference_mode()
def batched_target_only(engine, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                        sampling: Sampling = Sampling(), stop_ids: Iterable[int] = (),
                        seed_offset: int = 0, kv: str = "auto", run=None) -> list[DecodeResult]:
    """Target-alone decoding of every prompt at once; row b's output is
    `engine.target_only(prompts[b])`'s (greedy: token for token; T > 0: in distribution).
    kv: "dynamic" forces the HF cache; otherwise the static one where supported (`ragged_target`).
    run: a verify budget's run that starts committed (`batched_chain`): it counts the steps, and
    each row's accepted list gets a 0 per step, as its plain steps record."""
    return _target_only(engine, _check_batch(engine, prompts, max_new_tokens), max_new_tokens, sampling or Sampling(),
                        stop_ids, seed_offset, kv, run)


def _target_only(engine, ids: list[torch.Tensor], max_new_tokens: int, sampling: Sampling, stop_ids: Iterable[int],
                 seed_offset: int, kv: str, run) -> list[DecodeResult]:
    """`batched_target_only` on prompts already checked (`_check_batch`): a batched chain that starts
    committed checks its prompts once, not twice (on the H200 at 1622aa7 such decodes ran ~5 ms over the
    target alone's at B = 64, their rows' own rates equal: the checks and per-prompt copies, before the first step)."""
    dev = ids[0].device
    gen = sampling.generator(dev, seed_offset)
    stops = stop_set(engine.stop_ids, stop_ids)
    rows = [_Row(Output(max_new_tokens, stops, None)) for _ in ids]
    t0 = time.perf_counter()
    # room for a chain's K extra positions too, so that the speculative decodes of the same
    # prompts reuse this cache (and on CUDA its graphs) instead of growing it
    k = getattr(getattr(engine, "adapter", None), "num_slots", 0)
    target = ragged_target(engine, ids, max(p.numel() for p in ids) + max_new_tokens + chain_room(k), kv)
    logits, _, _, _ = target.prefill(ids, ())
    tok = pick(logits, sampling, gen)
    pos_h = [p.numel() for p in ids]  # host copy of pos: the static cache's attention bucket, no sync
    pos = torch.tensor(pos_h, device=dev)
    live = _push_each(rows, [[t] for t in tok.tolist()], None, t0)
    _target_steps(target, tok, pos, pos_h, live, list(rows), sampling, gen, t0, run, plain_counts=run is not None)
    return [r.result(p, target.kv_path) for r, p in zip(rows, ids)]


def _target_steps(target, tok, pos, pos_h, live, rows: list, sampling, gen, t0, run=None, plain_counts=True,
                  shrink: bool = True) -> None:
    """The target alone's loop until every row ends: `tok` [B] (each row's last token, not yet in
    the cache) at `pos`, `rows[b]` the decode in batch row b; one forward of one token per row a step,
    no features, one read of its tokens; the batch shrinks as its rows end (`_shrink`). Also the tail of
    a batched chain whose verify budget committed to plain steps (`run` counts them, and with `plain_counts`
    each live row's accepted list gets a 0 per step, as a K' = 0 step records; `shrink` False: the
    batch keeps its size).

    A step ahead (`reads_ahead`: CUDA, the static cache; DOMINO_GRAFT_PLAIN_AHEAD=0 turns it off): step n + 1 is
    launched before step n's tokens are read, so the host's reading and bookkeeping run while the device computes
    instead of between its steps. A plain step needs nothing the read gives: a row's next token is already on
    the device and its position moves by one. The cost is a step of lag in learning which rows ended: a row
    that ended at step n on a stop token takes part in step n + 1 (one more cache position, inside the room a
    session has for K + 1 more), whose token for it is dropped; a row that will reach max_new_tokens is known
    on the host and is not launched again. Every row's tokens are the same either way."""
    dev = tok.device
    shrinks = shrink and _can_shrink(target)
    ahead = reads_ahead(target, dev)
    # the bookkeeping of plain steps is done once, after the loop: per step it was host time the target
    # alone does not spend (budget.py LEAN_TIMED)
    every, forwards_before, steps = list(rows), [row.forwards for row in rows], 0
    mask, reader, pending = LiveMask(dev), TokenReader(dev, pinned=ahead), None
    while pending is not None or any(live):
        # rows this step decodes: those going on, less (a step ahead) those certain to end in the step under way
        step_rows = live if pending is None else [on and row.out.left() > 1 for row, on in zip(rows, live)]
        launched = None
        if any(step_rows):
            logits, _ = target.step(tok[:, None], pos, (), pos_h)
            live_t = mask.of(step_rows)
            target.keep(live_t.long, 1)
            tok = torch.where(live_t.on, pick(logits[:, -1], sampling, gen), tok)
            pos = pos + live_t.long
            if run is not None:  # the lean loop's own cost: its wall-clock samples (budget.py "lean"), taken
                run.tick(0, lean=True)  # while the device runs the step just launched (budget.py `tick`)
            pos_h = [p + on for p, on in zip(pos_h, step_rows)]
            steps += 1
            launched = (reader.send(tok), list(rows) if ahead else rows, step_rows)
        if ahead:
            pending, launched = launched, pending  # read the step before, while this one runs
        if launched is not None:
            read, step_of, on = launched
            if ahead:  # a row may have ended (read) since its step was launched: that step's token is dropped
                on = [o and row.out.stop_reason is None for row, o in zip(step_of, on)]
            for row, o in zip(step_of, on):
                row.forwards += o
            live = _push_each(step_of, [[t] for t in read()], on, t0)
        if ahead:  # (a compaction since the read's launch moved rows: which go on, in the batch's order now)
            live = [row.out.stop_reason is None for row in rows]
        keep = _shrink(live) if shrinks else None
        if keep is not None:  # (a step under way keeps its own rows list: its read goes to them)
            target.compact(keep)
            idx = torch.tensor(keep, device=dev)
            tok, pos = tok.index_select(0, idx), pos.index_select(0, idx)
            pos_h, live, rows[:] = [pos_h[i] for i in keep], [live[i] for i in keep], [rows[i] for i in keep]
            if run is not None:
                run.resize(len(keep))
    if run is not None:
        run.count_plain(steps)
    if plain_counts:
        for row, before in zip(every, forwards_before):
            row.accepted.extend([0] * (row.forwards - before))


def _all_may_end(rows: list, live: list[bool], kk: int) -> bool:
    """Whether every live row may reach its max_new_tokens in a step that emits up to kk + 1 tokens a row: then
    no step is drafted ahead of it (it would likely be drafted for nothing)."""
    return all(row.out.left() <= kk + 1 for row, on in zip(rows, live) if on)


def _batch_left(rows: list, live: list[bool]) -> tuple[int, int]:
    """(live rows, the most tokens a live row may still emit): what a step's rate is judged by when the
    batch runs at full size until its last row ends (budget.py `batch_tokens`)."""
    left = [row.out.left() for row, on in zip(rows, live) if on]
    return len(left), max(left, default=0)


def _push_each(rows: list, chunks: list[list[int]], live, t0: float) -> list[bool]:
    """Each live row's chunk into its Output; -> which rows go on (a row's seconds: when it ended)."""
    now = None
    still = []
    for r, (row, chunk) in enumerate(zip(rows, chunks)):
        if live is not None and not live[r]:
            still.append(False)
            continue
        done = row.out.push(chunk)
        if done:
            now = now or time.perf_counter()
            row.seconds = now - t0
        still.append(not done)
    return still


@torch.inference_mode()
def batched_chain(engine, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, sampling: Sampling = Sampling(),
                  stop_ids: Iterable[int] = (), use_head: bool = True, seed_offset: int = 0,
                  kv: str = "auto", budget: Optional[VerifyBudget] = None, shrink: bool = False) -> list[DecodeResult]:
    """Chain speculative decoding of every prompt at once (module docstring); row b's output is
    `engine.speculative(prompts[b])`'s: token for token (greedy), in distribution (T > 0).
    kv: "dynamic" forces the HF cache; otherwise the static one where supported (`ragged_target`).
    budget: how many drafts each step verifies (decoding/budget.py); None = all K. What it chose
    is left in `engine.last_budget` (budget.BudgetRun.report). shrink: compact the batch as its rows
    end while it speculates (module docstring); off by default: on the H200 it cost more than it saved
    (each smaller batch meets the drafter's compiled pieces and graphs at new shapes: docs/design.md).
    The plain tail of an auto budget that commits shrinks either way (module docstring)."""
    sampling = sampling or Sampling()
    adapter = engine.adapter
    if adapter.topology != "chain":
        raise ValueError(f"batched decoding: drafter topology {adapter.topology!r}; valid: 'chain' (trees decode one "
                         "prompt at a time: --batch-size 1)")
    if not getattr(adapter, "ragged_batch", False):
        raise ValueError(f"batched decoding: the {adapter.family} drafter does not take ragged batches "
                         "(adapter.ragged_batch); valid: --batch-size 1")
    if use_head and engine.head is None:
        raise ValueError("use_head=True but no Domino head is loaded")
    ids = _check_batch(engine, prompts, max_new_tokens)
    b, dev, k = len(ids), ids[0].device, adapter.num_slots
    run = None if budget is None else budget.start(k, b, dev.type, remaining=max_new_tokens)  # refused before any forward
    from ..fast import graphs_captured

    captured = graphs_captured()  # a decode that captures a graph is no sample of a size's speed (`whole_decode`)
    if run is not None and run.starts_committed:  # the target alone from the first step (budget.py)
        t0 = time.perf_counter()
        results = _target_only(engine, ids, max_new_tokens, sampling, stop_ids, seed_offset, kv, run)
        tokens = sum(len(r.tokens) for r in results)
        engine.last_run = run.finish(*whole_decode(tokens, t0, graphs_captured() != captured))
        return results
    gen = sampling.generator(dev, seed_offset)
    capture = adapter.capture_layers()
    stops = stop_set(engine.stop_ids, stop_ids)
    every = [_Row(Output(max_new_tokens, stops, None), k) for _ in ids]
    rows = list(every)  # rows[b]: the decode in batch row b (a compaction moves them)

    t0 = time.perf_counter()
    length = max(p.numel() for p in ids) + max_new_tokens + chain_room(k)
    target = ragged_target(engine, ids, length, kv)
    drafter = static_batch_drafter(adapter, target, length, b)
    engine.batch_drafter_path = "eager" if drafter is None else "static"  # what the last batch ran (bench reports)
    shrinks = shrink and _can_shrink(target, drafter, needs_drafter=True)
    # a plain tail compacts as the target alone's loop does; its graphs are captured here, before the
    # prefill rewrites what their capture wrote, since its rows end at other positions than the target
    # alone's (at 59f8809 on the H200 its mid-decode captures made timed decodes 0.3-1.5 s slower)
    tail_shrinks = run is not None and run.budget.mode == "auto" and _can_shrink(target)
    if tail_shrinks and hasattr(target, "prime_plain_tail"):
        target.prime_plain_tail(b, min(p.numel() for p in ids) + 1, length)
    adapter.reset(b)
    logits, feats, prompt_ids, prompt_pos = target.prefill(ids, capture)
    if drafter is not None:  # right-padded: row b's padding slots lie at or after its anchor
        drafter.prefill(feats, feats.shape[1])
    else:
        adapter.observe(feats, prompt_pos, ids=prompt_ids)
    anchor = pick(logits, sampling, gen)  # [B]
    pos_h = [p.numel() for p in ids]  # host copy of pos: attention buckets and drafter slots, no sync
    pos = torch.tensor(pos_h, device=dev)
    live = _push_each(rows, [[t] for t in anchor.tolist()], None, t0)
    offs = torch.arange(k + 1, device=dev)
    mask = LiveMask(dev)
    verified: list[int] = []  # K' of each step (the rows' per-slot counts, `_Row.result`)

    def measure_costs():  # the target's cost of each candidate length at this batch size, where not known yet
        if run is not None and dev.type == "cuda":
            run.add_measured(measure_step_costs(target, anchor, pos, pos_h, capture, run.lengths_to_measure()))

    measure_costs()
    ahead = drafts_ahead(target, drafter, dev) and not shrinks
    reader = TokenReader(dev, pinned=ahead)
    drafted = None  # the next step's (K', drafts, q, timer), drafted before this step was read ("Drafted ahead")

    on_device = takes_device_positions(drafter)

    def draft(kk: int, anchor, at, at_h: list[int]):
        """(drafts, q, timer) of a step from the anchors at positions `at` (on the device; `at_h` on the host, or
        bounds on them when drafted ahead)."""
        if drafter is None:
            propose = partial(adapter.propose, anchor, at)
        elif on_device:  # the positions as the device holds them: no host->device copy of them
            propose = partial(drafter.propose, anchor, at_h, at)
        else:
            propose = partial(drafter.propose, anchor, at_h)
        return draft_step(engine, propose, anchor, kk, sampling, gen, use_head, run, dev)

    while any(live):
        if drafted is None and run is not None and run.committed():  # plain from here on: the target alone's loop
            _target_steps(target, anchor, pos, pos_h, live, rows, sampling, gen, t0, run, shrink=tail_shrinks)
            break
        if drafted is not None:
            kk, drafts, q, timer = drafted
            drafted = None
        else:  # K': the drafts this step verifies; the batch runs until its last row ends, unless it shrinks
            kk = k if run is None else run.choose(*((1, 0) if shrinks else _batch_left(rows, live)))
            drafts, q, timer = draft(kk, anchor, pos, pos_h) if kk else (None, None, None)
        if kk == 0:  # a plain target step: the anchor alone, the next token the target's own pick
            seq = anchor[:, None]
            logits, feats = target.step(seq, pos, capture, pos_h)
            nxt = pick(logits[:, 0], sampling, gen)
            n_acc, drafts = torch.zeros_like(nxt), seq[:, :0]
        else:
            seq = torch.cat([anchor[:, None], drafts], dim=1)
            logits, feats = target.step(seq, pos, capture, pos_h)
            n_acc, nxt = verify_chain(logits, drafts, q, sampling, gen)
        if run is not None:  # the step's wall-clock sample, while the device runs it (budget.py `tick`)
            run.tick(kk)
        n = len(rows)
        read = reader.send(torch.cat([n_acc, nxt, drafts.flatten()]))  # one device->host sync per step
        stepped = live  # the rows this step decoded
        moved = ahead and kk > 0 and not _all_may_end(rows, live, kk)
        if moved:  # the next step drafted now, while the device verifies this one ("Drafted ahead")
            # each row's next position, at most (`chain_room` holds them: a row that ends in this step moves on once)
            upper = [p + (kk + 1 if on else 0) for p, on in zip(pos_h, live)]
            kept = torch.where(mask.of(live).on, n_acc + 1, 0)
            anchor, pos = torch.where(kept > 0, nxt, anchor), pos + kept
            drafter.observe_block(feats, pos_h)
            kk_next = k if run is None else run.choose(*_batch_left(rows, live))  # (not committed: this K' > 0)
            drafted = (kk_next, *draft(kk_next, anchor, pos, upper)) if kk_next else (0, None, None, None)
        host = read()
        n_acc_h, nxt_h, drafts_h = host[:n], host[n: 2 * n], host[2 * n:]
        if timer is not None:
            run.add_propose(*timer.read(), slots=kk)
        verified.append(kk)
        chunks = []
        for r, row in enumerate(rows):
            a = n_acc_h[r]
            chunks.append(drafts_h[r * kk: r * kk + a] + [nxt_h[r]])
            if live[r]:  # (the per-slot counts: once, at the end, `_Row.result`)
                row.forwards += 1
                row.accepted.append(a)
        if run is not None:
            run.observe(kk, [a for a, on in zip(n_acc_h, live) if on])
        live = _push_each(rows, chunks, live, t0)
        if not any(live):
            if drafted is not None and run is not None:  # chosen (and drafted) ahead, never verified
                run.withdraw(drafted[0])
            break
        if moved:  # the anchors and positions moved on the device already, by the rows this step decoded
            pos_h = [p + (a + 1 if on else 0) for p, a, on in zip(pos_h, n_acc_h, stepped)]
            continue
        # rows that just ended keep nothing more; the others x_0 and their accepted drafts
        kept = torch.where(mask.of(live).on, n_acc + 1, 0)
        longest = max(a + 1 for a, on in zip(n_acc_h, live) if on)
        target.keep(kept, longest)
        if drafter is not None:  # all K'+1 of every row, finished ones too (at their last position)
            drafter.observe_block(feats, pos_h)
        else:  # the kept entries at their positions, -1 elsewhere
            new = offs[None, :longest] < kept[:, None]
            adapter.observe(None if feats is None else feats[:, :longest],
                            torch.where(new, pos[:, None] + offs[:longest], -1), ids=seq[:, :longest])
        anchor = torch.where(kept > 0, nxt, anchor)
        pos = pos + kept
        pos_h = [p + (a + 1 if on else 0) for p, a, on in zip(pos_h, n_acc_h, live)]
        keep = _shrink(live) if shrinks else None
        if keep is not None:  # half the rows or more have ended: the others go on as a smaller batch
            target.compact(keep)
            drafter.compact(keep)
            idx = torch.tensor(keep, device=dev)
            anchor, pos = anchor.index_select(0, idx), pos.index_select(0, idx)
            pos_h, live, rows = [pos_h[i] for i in keep], [live[i] for i in keep], [rows[i] for i in keep]
            if run is not None:
                run.resize(len(keep))
                measure_costs()
    engine.last_run = None if run is None else run.finish(
        *whole_decode(sum(len(r.out.tokens) for r in every), t0, graphs_captured() != captured))
    return [r.result(p, target.kv_path, verified) for r, p in zip(every, ids)]


def measure_step_costs(target, anchor: torch.Tensor, pos: torch.Tensor, pos_h: list[int], capture,
                       lengths: list[int]) -> dict[int, float]:
    """ms of the target's forward of T tokens per row at this batch and these positions, for each T
    in `lengths` (`cuda_median_ms`). Nothing stays: the static cache is overwritten by the next step
    before any query reads it (session.py), the dynamic one is cropped back."""
    none_kept = torch.zeros_like(pos)
    out = {}
    for t in lengths:
        seq = anchor[:, None].expand(-1, t).contiguous()
        out[t] = cuda_median_ms(lambda: target.step(seq, pos, capture, pos_h), lambda: target.keep(none_kept, 0))
    return out

