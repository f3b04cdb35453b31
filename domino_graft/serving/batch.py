"""Batches that can be stepped one block at a time: the loop bodies of
`decoding.batched.batched_chain` (ChainBatch) and `batched_target_only` (TargetBatch, for
`serve --target-only`), cut at their block boundaries so a scheduler can retire rows between
blocks and rebuild the batch to admit new ones.

Admission in place (`admit`): where the target's session is the fast engine's static cache and the
drafter (if any) takes rows in flight (`admits_rows`: a family's static drafter that fills single rows, or
an adapter whose eager ragged context drops and refills rows, adapters/base.py), new prompts are
prefilled into freed rows of the batch in flight: `TargetSession.prefill(prompts, capture, rows=slots)` (the
other rows park past their ends, decoding/session.py), then the static drafter's `prefill(features, n, rows=slots)` or the adapter's
`observe_prompts` (the rows' old context dropped, adapters/base.py). The rows in flight
keep their caches, their anchors and the verify budget's run; nothing of theirs is recomputed. When the
freed rows are too few, a new row would not fit the caches, or a row in flight has no room left to park,
the batch is rebuilt instead. A prompt longer than the scheduler's chunk is prefilled a chunk a block
(`prefill_chunks`, docs/serving.md "Chunked prefill"): pending until its last chunk, then it decodes.

Why a rebuild otherwise: a batch is built by one prefill of the whole batch (`adapter.reset(B)`, then
`observe`/`propose` over all B rows). So a rebuild re-prefills the batch: each running row's verified
context (its prompt and every token it emitted but the last) and each new row's prompt,
right-padded as `batched_chain` pads them. The running row's last token is already chosen: it is
the row's anchor again, and the prefill's pick for that row is dropped. A row's state is thus
only its token history, which is why its output cannot depend on the batch: attention sees only
the row's own entries (batched.py's argument), and a rebuilt row continues from exactly the
context its solo decode would hold. The cost is the running rows' prefill at each admission.

Rows that finish or are cancelled stay in the batch, masked, until the next rebuild drops them
(batched_chain's rule: their outputs are dropped and the others never wait for them).

A verify budget (decoding/budget.py) works here as in `batched_chain`: each block verifies K' <= K drafts (K' = 0:
a plain target step), the same K' for every row, chosen before the block's draws; a rebuilt batch carries the
acceptance estimate of the batch it replaces, and the costs live in the server's one `VerifyBudget`.

Steps ahead of their reads (docs/serving.md): where `decoding.batched.drafts_ahead` holds (CUDA, the static cache,
a static drafter on device positions) ChainBatch drafts block n + 1 from what block n's verify left on the device
before it reads block n, as `batched_chain` does; where `reads_ahead` holds, a plain step is launched before the
one before it is read. A row that ended moves once more on the device (`chain_room`; its tokens dropped). A row
admitted into a freed slot is verified against the block drafted for the row before it: lossless whatever drafted
the tokens (greedy: the target's argmax; T > 0: speculative sampling is exact for any q); a plain step under way
gives it nothing (the token was the row before's). A slot whose sampling setting changed drops the block; so do a
warm-start step and a batch's end (`drop_drafted`: the budget's choice is withdrawn).

Measured arms (serving/windows.py, CUDA under auto, the static cache): the budget runs in windows, each a run whose
arm its batch size's outcomes choose, each reporting its tokens/s there. A speculative block after a stretch of lean
plain steps first gives the drafter what they decoded (serving/lag.py, `_catch_up`).

Each row has its own sampling setting. The library's rollout and verifier take one setting per
call, so a step runs them once per setting present, on that setting's rows (both work row by row:
a row's drafts and verdict read only its own block, logits and q), while the drafter's propose
and the target's forward, the costly parts, run once over all rows. One generator per batch, so
at T > 0 a row's samples depend on its batch (its distribution does not; batched.py).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Optional

import torch

from ..decoding.batched import (chain_room, drafts_ahead, measure_step_costs, reads_ahead, static_batch_drafter,
                                takes_device_positions)
from ..decoding.budget import BudgetRun, VerifyBudget
from ..decoding.common import LiveMask, TokenReader, first_slots, propose_timer
from ..decoding.session import admission_rows
from ..decoding.verify import verify_chain
from ..sampling import pick
from .lag import DrafterLag, chunks
from .rows import BatchRow, Chunked, batch_generator, batch_target, sampling_groups, setting_key
from .windows import Windows, windows_on


class _Rows:
    """What both batches share: the rows, their groups and generator, the target's ragged cache,
    the anchors and positions, and which rows are live."""

    def _start(self, engine, rows: list[BatchRow], extra: int, seed: Optional[int]) -> list[torch.Tensor]:
        """Groups, generator and target (room for `extra` positions past the longest row's budget);
        -> the rows' contexts as tensors, for the prefill."""
        self.engine, self.rows = engine, rows
        self.pending: dict[int, Chunked] = {}  # slot -> a prompt admitted in chunks, not yet all prefilled
        self.chunk: Optional[int] = None  # tokens per chunk of those (admit's `chunk`)
        self.dev = dev = engine.target.device
        self._mask = LiveMask(dev)  # the live rows on the device, copied again only when they change
        self.groups = sampling_groups(rows, dev)
        self.gen = batch_generator(self.groups, dev, seed)
        ids = [torch.tensor(r.context, dtype=torch.long, device=dev) for r in rows]
        self.target = batch_target(engine, len(rows), max(r.positions_needed for r in rows) + extra)
        self.plain_ahead = reads_ahead(self.target, dev)  # "Steps ahead of their reads", module docstring
        self.plain_reader = TokenReader(dev, pinned=self.plain_ahead)
        self.in_flight = None  # a plain step launched and not yet read: (its read, its rows, which it stepped)
        self.emitted = 0  # tokens the rows' steps emitted (each prompt's first, the prefill's, not counted)
        self.run: Optional[BudgetRun] = None  # the verify budget's (ChainBatch's)
        return ids

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, V] -> [B]: each group's rows by its own setting (greedy: argmax)."""
        if len(self.groups) == 1:
            return pick(logits, self.groups[0][1], self.gen)
        out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        for idx, s in self.groups:
            out[idx] = pick(logits[idx], s, self.gen)
        return out

    def _anchor(self, logits: torch.Tensor) -> None:
        """After the prefill: each new row's first token is picked from its last logits and pushed;
        a running row keeps its anchor."""
        picked = self._pick(logits).tolist()
        rows = self.rows
        anchors = [picked[b] if r.anchor is None else r.anchor for b, r in enumerate(rows)]
        self.anchor = torch.tensor(anchors, dtype=torch.long, device=self.dev)
        self.pos_h = [len(r.context) for r in rows]  # host copy: attention buckets, drafter slots, no sync
        self.pos = torch.tensor(self.pos_h, device=self.dev)
        self.live = [True] * len(rows)
        for b, r in enumerate(rows):
            if r.anchor is None:
                r.anchor = anchors[b]
                self.live[b] = not r.push([anchors[b]])

    def _advance(self, r: int, chunk: list[int]) -> None:
        """Row r emitted `chunk`: push it; its anchor joins its context, the chunk's last token is
        its next anchor."""
        row = self.rows[r]
        self.emitted += len(chunk)
        self.live[r] = not row.push(chunk)
        row.context.append(row.anchor)
        row.context.extend(chunk[:-1])
        row.anchor = chunk[-1]

    @property
    def any_live(self) -> bool:
        return any(self.live) or bool(self.pending)

    def running(self) -> list[BatchRow]:
        """The rows still decoding, each with its context and anchor as of now, and the prompts still being
        prefilled in chunks (no anchor yet: a rebuild prefills them whole)."""
        return ([r for r, on in zip(self.rows, self.live) if on and r.alive()]
                + [c.row for c in self.pending.values() if c.row.alive()])

    def seek(self, position: int) -> None:
        """Every row's next step at `position` (the warm start's visits of kv buckets, serving/warmup.py;
        an eager drafter's context then no longer ends where its rows are, so its drafts are noise: only
        the shapes count there).
        Harmless to what any later batch outputs: each batch starts with its own prefill, and a
        row never reads the cache at or past its own position before writing it (decoding/session.py)."""
        self.pos_h = [position] * len(self.rows)
        self.pos = torch.tensor(self.pos_h, device=self.dev)

    def visit(self, t: int, end: int, capture=()) -> None:
        """The target's forward of t tokens per row ending at position `end` (a kv bucket), nothing kept:
        the warm start's visit of one shape, as measure_step_costs runs one."""
        pos_h = [end - t] * len(self.rows)
        seq = self.anchor[:, None].expand(-1, t).contiguous()
        self.target.step(seq, torch.tensor(pos_h, device=self.dev), tuple(capture), pos_h)
        self.target.keep(torch.zeros(len(self.rows), dtype=torch.long, device=self.dev), 0)

    def plain_step(self) -> None:
        """One token per live row from the target alone: no features, no drafter (TargetBatch's
        step, and a ChainBatch's once its verify budget committed to plain steps). A step ahead
        (`plain_ahead`): this step is launched before the one before it is read."""
        # rows this step decodes: the live ones, less those the step under way steps and that are certain to end in it
        step_rows = [on and not (self._under_way(b) and self._left(r) <= 1) for b, (r, on) in
                     enumerate(zip(self.rows, self.live))]
        launched = None
        if any(step_rows):
            logits, _ = self.target.step(self.anchor[:, None], self.pos, (), self.pos_h)
            mask = self._mask.of(step_rows)
            self.target.keep(mask.long, 1)  # each stepped row keeps its one new entry
            self.anchor = torch.where(mask.on, self._pick(logits[:, -1]), self.anchor)
            self.pos = self.pos + mask.long
            self.pos_h = [p + on for p, on in zip(self.pos_h, step_rows)]
            launched = (self.plain_reader.send(self.anchor), list(self.rows), step_rows)
        if self.plain_ahead:
            launched, self.in_flight = self.in_flight, launched  # read the step before, while this one runs
        self._read_plain(launched)

    def flush_plain(self) -> None:
        """Read the plain step under way, if any (before a speculative block: its rows' tokens come first)."""
        launched, self.in_flight = self.in_flight, None
        self._read_plain(launched)

    def _read_plain(self, launched) -> None:
        if launched is None:
            return
        read, rows, stepped = launched
        host = read()  # the step's one sync
        for r, (row, on) in enumerate(zip(rows, stepped)):
            # a row that ended (read) or was replaced since its step was launched: that step's token is dropped
            if on and self.rows[r] is row and self.live[r]:
                self._advance(r, [host[r]])

    def _under_way(self, b: int) -> bool:
        """Whether the plain step under way (launched, not yet read) steps the row now in slot b."""
        if self.in_flight is None:
            return False
        _, rows, stepped = self.in_flight
        return stepped[b] and rows[b] is self.rows[b]

    def soonest_end(self, running: list[BatchRow]) -> Optional[int]:
        """The fewest tokens any of `running` (this batch's `running()`, which the caller has) may still emit by its
        budget, None where it is empty: the next end the scheduler can foresee (serving/cohorts.py)."""
        return min(map(self._left, running), default=None)

    @staticmethod
    def _left(row: BatchRow) -> int:
        """The most tokens the row may still emit (its budget less what it emitted; a step under way not counted)."""
        return row.positions_needed - len(row.context) - 1

    def drop_drafted(self) -> None:
        """Nothing is drafted ahead here (ChainBatch's)."""

    def _off_the_clock(self) -> None:
        """An admission's prefill is no step's time: the verify budget does not sample the step it falls in."""
        if self.run is not None:
            self.run.restart_clock()

    def free_slots(self) -> list[int]:
        """Rows whose request ended (finished, cancelled, or an idle pad): a prompt may be admitted there."""
        return [b for b, (r, on) in enumerate(zip(self.rows, self.live)) if not (on and r.alive())
                and b not in self.pending]

    def can_admit(self, rows: list[BatchRow], chunk: Optional[int] = None) -> bool:
        """Whether `rows` can be prefilled into freed rows of this batch (module docstring); with prompts
        in chunks (`chunk`, or some already pending), also whether every chunk's park fits (`_chunk_room`)."""
        target = self.target
        if target.kv_path != "static" or len(rows) > len(self.free_slots()):
            return False
        if max(r.positions_needed for r in rows) + self.extra > self._room():
            return False
        chunked = self.pending or (chunk is not None and any(len(r.context) > chunk for r in rows))
        return not chunked or self._chunk_room(rows, chunk or self.chunk)

    def _chunk_room(self, rows: list[BatchRow], chunk: int) -> bool:
        """Every other row parks a chunk's padded length past its end at each chunk (decoding/session.py
        `_park`): each row's furthest end must leave room. A row that has stepped ends before its
        positions_needed plus a verify's extra; one admitted whole now ends at its padded prompt until its
        first step, which comes after the next chunk."""
        from ..fast import prefill_length

        room = self._room()
        t = prefill_length(chunk, room)
        ends = [r.positions_needed + self.extra for r in self.running()]
        ends += [max(r.positions_needed + self.extra, prefill_length(len(r.context), room)) for r in rows]
        return all(e + t <= room for e in ends)

    def _room(self) -> int:
        """The positions a row may reach in this batch's caches."""
        return self.target.lm.max_len

    @torch.inference_mode()
    def admit(self, rows: list[BatchRow], chunk: Optional[int] = None) -> list[int]:
        """Prefill `rows` into freed rows of the batch in flight (`can_admit` first); the others keep their
        state. -> the slots they took. A row in flight without room to park raises ValueError (the
        caller rebuilds). chunk: a prompt longer than this many tokens is prefilled this many at a time,
        one chunk before each block (`step`), so the rows in flight keep decoding meanwhile; it starts
        decoding once its last chunk is in."""
        slots = self.free_slots()[: len(rows)]
        whole = [(s, r) for s, r in zip(slots, rows) if chunk is None or len(r.context) <= chunk]
        if whole:  # first: a park that does not fit raises before the batch changes (the caller rebuilds)
            ids = [torch.tensor(r.context, dtype=torch.long, device=self.dev) for _, r in whole]
            logits, feats = self._prefill_admitted(ids, [s for s, _ in whole], slots)
        self._off_the_clock()
        if any(setting_key(self.rows[s].sampling) != setting_key(r.sampling) for s, r in zip(slots, rows)):
            self.drop_drafted()  # a block drafted ahead is verified by the groups that drafted it
        for slot, row in zip(slots, rows):
            self.rows[slot] = row
            self.live[slot] = False
        self.groups = sampling_groups(self.rows, self.dev)
        if self.gen is None:  # the first sampled row of an all-greedy batch
            self.gen = batch_generator(self.groups, self.dev, None)
        if whole:
            self._begin([s for s, _ in whole], [r for _, r in whole], logits, feats)
        if len(whole) < len(rows):  # their chunks come one a block, before each (`_retire_cancelled`)
            self.chunk = chunk
            for slot, row in zip(slots, rows):
                if len(row.context) > chunk:
                    self.pending[slot] = Chunked(row)
        return slots

    def _prefill_admitted(self, ids: list[torch.Tensor], slots: list[int], taken: list[int]):
        """The target's prefill of whole prompts into `slots` -> (their last logits, their features). The prefill
        runs only the admitted rows where they are few (decoding/session.py `admission_rows`: a power of two of
        them), so a count short of its power of two is made up with copies of the first prompt in other free rows
        (their entries are stale until their own admission, which starts at position 0): a batch of that many
        prompts at position 0, the shape the warm start visits, not the admitted rows beside parked ones."""
        front = admission_rows(len(slots), len(self.rows))
        spare = [s for s in self.free_slots() if s not in taken][: front - len(slots)] if front < len(self.rows) else []
        if front < len(self.rows) and len(spare) == front - len(slots):
            logits, feats, _, _ = self.target.prefill(ids + [ids[0]] * len(spare), self._capture(), rows=slots + spare)
            return logits[: len(slots)], None if feats is None else feats[: len(slots)]
        logits, feats, _, _ = self.target.prefill(ids, self._capture(), rows=slots)
        return logits, feats

    @torch.inference_mode()
    def prefill_chunks(self) -> None:
        """The next chunk of every pending prompt, in one prefill (each at its own start; the other rows
        park); a prompt whose last chunk this was starts decoding (`_begin`)."""
        if not self.pending:
            return
        self._off_the_clock()
        slots = sorted(self.pending)
        parts = [self.pending[s].next_ids(self.chunk, self.dev) for s in slots]
        starts = [self.pending[s].done for s in slots]
        logits, feats, _, _ = self.target.prefill(parts, self._capture(), rows=slots, starts=starts)
        done = []
        for i, (slot, ids) in enumerate(zip(slots, parts)):
            c = self.pending[slot]
            c.add(ids.numel(), None if feats is None else feats[i, : ids.numel()])
            self.pos_h[slot] = c.done  # a step's placeholder lands where the next chunk overwrites it
            if c.done == len(c.row.context):
                done.append(i)
        if done:
            ended = [slots[i] for i in done]
            chunked = [self.pending.pop(s) for s in ended]
            self._begin(ended, [c.row for c in chunked], logits[done], Chunked.features(chunked))
        self.pos = torch.tensor(self.pos_h, device=self.dev)

    def _begin(self, slots: list[int], rows: list[BatchRow], logits: torch.Tensor, feats) -> None:
        """Rows whose prompts are all in the target's cache: the drafter's context, their first tokens."""
        self._prefill_drafter(feats, slots, rows)
        picked = self._pick_rows(logits, rows).tolist()
        idx = torch.tensor(slots, device=self.dev)
        self.anchor = self.anchor.index_copy(0, idx, torch.tensor(picked, dtype=torch.long, device=self.dev))
        for slot, row, first in zip(slots, rows, picked):
            self.pos_h[slot] = len(row.context)
            row.anchor = first
            self.live[slot] = not row.push([first])
        self.pos = torch.tensor(self.pos_h, device=self.dev)

    def _pick_rows(self, logits: torch.Tensor, rows: list[BatchRow]) -> torch.Tensor:
        """logits [P, V] of `rows` -> [P]: each by its own setting, as `_pick` does for the batch."""
        out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        for idx, s in sampling_groups(rows, logits.device):
            out[idx] = pick(logits[idx], s, self.gen)
        return out

    def _capture(self) -> tuple:
        return ()

    def _prefill_drafter(self, feats, slots: list[int], rows: list[BatchRow]) -> None:
        """The target alone has no drafter."""

    def _retire_cancelled(self) -> bool:
        """A cancelled row is retired at the block boundary: masked like a finished one (a pending prompt
        dropped); the pending prompts' next chunks; -> any live."""
        self.live = [on and r.alive() for on, r in zip(self.live, self.rows)]
        for slot in [s for s, c in self.pending.items() if not c.row.alive()]:
            del self.pending[slot]
        self.prefill_chunks()
        return any(self.live)


class TargetBatch(_Rows):
    """The target alone over B rows (`serve --target-only`, the baseline): `batched_target_only`'s
    loop cut at its steps, one token per live row per target forward."""

    @torch.inference_mode()
    def __init__(self, engine, rows: list[BatchRow], *, seed: Optional[int] = None):
        # room for a chain's K extra positions too, as batched_target_only leaves: one cache for both
        k = getattr(getattr(engine, "adapter", None), "num_slots", 0)
        self.extra = k + 1
        ids = self._start(engine, rows, k + 1, seed)
        logits, _, _, _ = self.target.prefill(ids, ())
        self._anchor(logits)

    @torch.inference_mode()
    def step(self) -> None:
        if self._retire_cancelled():
            self.plain_step()


class ChainBatch(_Rows):
    """B rows, prefilled together, then `step()` per block."""

    @torch.inference_mode()
    def __init__(self, engine, rows: list[BatchRow], *, use_head: bool,
                 on_step: Optional[Callable[[list[int], int], None]] = None, seed: Optional[int] = None,
                 budget: Optional[VerifyBudget] = None, carry: Optional[BudgetRun] = None):
        """seed: the batch generator's (None: fresh entropy, as the server runs; tests fix it).
        on_step(each live row's accepted drafts, K' verified). budget: the drafts each block
        verifies (None: all K); carry: the budget run of the batch this one replaces."""
        adapter = self.adapter = engine.adapter
        self.use_head, self.on_step = use_head, on_step
        self.k = k = adapter.num_slots
        self.extra = chain_room(k)  # a verify past a row's last token, and a block drafted ahead of its end
        ids = self._start(engine, rows, self.extra, seed)
        self.capture = adapter.capture_layers()
        length = max(r.positions_needed for r in rows) + self.extra  # the target's, as _start made it
        self.drafter = static_batch_drafter(adapter, self.target, length, len(rows))
        self.on_device = takes_device_positions(self.drafter)
        self.ahead = drafts_ahead(self.target, self.drafter, self.dev)  # "Steps ahead of their reads", module docstring
        self.reader = TokenReader(self.dev, pinned=self.ahead)
        self.drafted = None  # the next block (K', drafts, each group's q, timer), drafted before a read
        self.lag = DrafterLag()  # where lean plain steps left the drafter behind (serving/lag.py)
        adapter.reset(len(rows))
        logits, feats, prompt_ids, prompt_pos = self.target.prefill(ids, self.capture)
        if self.drafter is not None:
            self.drafter.prefill(feats, feats.shape[1])
        else:
            adapter.observe(feats, prompt_pos, ids=prompt_ids)
        self._anchor(logits)
        self.offs = torch.arange(k + 1, device=self.dev)
        # measured arms (serving/windows.py): each window's run from its batch size's outcomes, not the replaced batch's
        on = windows_on(budget, self.dev) and self.target.kv_path == "static"  # (`_catch_up` rewrites the cache)
        self.windows = Windows(budget, k, len(rows), self.emitted) if on else None
        if self.windows is not None:
            self.run = self.windows.run()
        else:
            self.run = None if budget is None else budget.start(k, len(rows), self.dev.type, carry)
        if self.run is not None and self.dev.type == "cuda":
            self.measure_costs(self.run)

    def can_admit(self, rows: list[BatchRow], chunk: Optional[int] = None) -> bool:
        """As `_Rows.can_admit`, and the drafter must take new rows in flight: a static one that fills
        single rows, or an adapter whose eager context does (`admits_rows`: adapters/base.py
        `observe_prompts`)."""
        takes = self.drafter if self.drafter is not None else self.adapter
        return getattr(takes, "admits_rows", False) and super().can_admit(rows, chunk)

    def _room(self) -> int:
        return super()._room() if self.drafter is None else min(super()._room(), self.drafter.max_len)

    def _capture(self) -> tuple:
        return tuple(self.capture)

    def _prefill_drafter(self, feats, slots: list[int], rows: list[BatchRow]) -> None:
        self.lag.admitted(slots, [len(r.context) for r in rows])
        if self.drafter is not None:
            self.drafter.prefill(feats, feats.shape[1], rows=slots)
            return
        # the eager contract: the prompts right-padded into one [B, n] observe, -1 outside the admitted rows
        b, n = len(self.rows), max(len(r.context) for r in rows)
        pos = torch.full((b, n), -1, dtype=torch.long, device=self.dev)
        ids = torch.zeros((b, n), dtype=torch.long, device=self.dev)
        full = None if feats is None else feats.new_zeros((b, n, *feats.shape[2:]))
        for i, (slot, row) in enumerate(zip(slots, rows)):
            m = len(row.context)
            pos[slot, :m] = torch.arange(m, device=self.dev)
            ids[slot, :m] = torch.tensor(row.context, dtype=torch.long, device=self.dev)
            if full is not None:
                full[slot, :m] = feats[i, :m]
        self.adapter.observe_prompts(full, pos, ids, slots)

    def measure_costs(self, run: BudgetRun) -> None:
        """The target's cost at this batch size of each candidate verify length the budget's table
        lacks (CUDA events: measure_step_costs), into the table: once per B, and for every padded B
        by the warm start (serving/warmup.py), so traffic measures nothing."""
        run.add_measured(measure_step_costs(self.target, self.anchor, self.pos, self.pos_h, self.capture,
                                            run.lengths_to_measure()))

    def _draft(self, kk: int, anchor: torch.Tensor, at: torch.Tensor, at_h: list[int]):
        """(drafts, each group's q, timer) of a block of K' = kk from the anchors at positions `at` (on the device;
        `at_h` on the host: exact, or bounds on them when drafted ahead)."""
        timer = propose_timer(self.run, self.dev)
        if self.drafter is None:
            block = self.adapter.propose(anchor, at)
        elif self.on_device:  # the positions as the device holds them: no host->device copy of them
            block = self.drafter.propose(anchor, at_h, at)
        else:
            block = self.drafter.propose(anchor, at_h)
        if timer is not None:
            timer.proposed()
        if kk < self.k:  # only the first K' slots are rolled out
            block = first_slots(block, kk)
        drafts, qs = self._rollout(block, anchor)
        if timer is not None:
            timer.rolled_out()
        return drafts, qs, timer

    def drop_drafted(self) -> None:
        """A block drafted ahead that will not be verified (the batch ends or is replaced, a warm-start step, or
        a row admitted with another sampling setting than the row it replaces: `admit`): it leaves no count in the
        budget."""
        if self.drafted is not None and self.run is not None:
            self.run.withdraw(self.drafted[0])
        self.drafted = None

    def _may_all_end(self, kk: int) -> bool:
        """Every live row may reach its token budget in a block of kk + 1 tokens: nothing is drafted ahead of it."""
        return all(self._left(r) <= kk + 1 for r, on in zip(self.rows, self.live) if on)

    @torch.inference_mode()
    def step(self, verify: Optional[int] = None) -> None:
        """One block for every live row: propose, roll out, verify (K' drafts; K' = 0 a plain
        target step), push each row's tokens. verify: K' for this block (the warm start's shapes),
        else the budget's choice (the block may have been drafted already: "Steps ahead of their reads")."""
        if not self._retire_cancelled():
            self.drop_drafted()
            return
        if verify is not None:
            self.drop_drafted()
        if self.drafted is None and verify is None and self.run is not None and self.run.committed():
            rows = sum(self.live)  # the target alone's step until a rebuild (or, measured arms, the window's end)
            self.lag.begin(self.pos_h, self.live)
            self.run.tick(0, lean=True)
            self.plain_step()
            self.run.count_plain()
            if self.on_step is not None:
                self.on_step([0] * rows, 0)
            self._turn_window(rows)
            return
        self.flush_plain()  # (a window of plain steps before this one: its last step's tokens)
        if not any(self.live):
            return
        if self.lag:
            self._catch_up()
        b = len(self.rows)
        anchor, pos, pos_h = self.anchor, self.pos, self.pos_h
        if self.drafted is not None:
            kk, drafts, qs, timer = self.drafted
            self.drafted = None
        else:
            kk = verify if verify is not None else self.k if self.run is None else self.run.choose()
            drafts, qs, timer = self._draft(kk, anchor, pos, pos_h) if kk else (None, None, None)
        if kk == 0:  # the anchor alone; the next token each row's own pick
            seq = anchor[:, None]
            logits, feats = self.target.step(seq, pos, self.capture, pos_h)
            nxt = self._pick(logits[:, 0])
            n_acc, drafts = torch.zeros_like(nxt), seq[:, :0]
        else:
            seq = torch.cat([anchor[:, None], drafts], dim=1)
            logits, feats = self.target.step(seq, pos, self.capture, pos_h)
            n_acc, nxt = self._verify(logits, drafts, qs)
        if self.run is not None and verify is None:  # the step's wall-clock sample, while the device runs it
            self.run.tick(kk)
        read = self.reader.send(torch.cat([n_acc, nxt, drafts.flatten()]))  # the step's one device->host sync
        stepped = list(self.live)
        moved = self.ahead and verify is None and kk > 0 and not self._may_all_end(kk)
        if moved:  # the next block drafted now, while the device verifies this one
            kept = torch.where(self._mask.of(stepped).on, n_acc + 1, 0)
            self.anchor, self.pos = torch.where(kept > 0, nxt, anchor), pos + kept
            self.drafter.observe_block(feats, pos_h)
            upper = [p + (kk + 1 if on else 0) for p, on in zip(pos_h, stepped)]
            kk_next = self.k if self.run is None else self.run.choose()  # (not committed: this K' > 0)
            block = self._draft(kk_next, self.anchor, self.pos, upper) if kk_next else (None, None, None)
            self.drafted = (kk_next, *block)
        host = read()
        n_acc_h, nxt_h, drafts_h = host[:b], host[b: 2 * b], host[2 * b:]
        if timer is not None:
            self.run.add_propose(*timer.read(), slots=kk)
        live_acc = [n_acc_h[r] for r in range(b) if stepped[r]]
        if self.run is not None:
            self.run.observe(kk, live_acc)
        if self.on_step is not None:
            self.on_step(live_acc, kk)
        for r in range(b):
            if stepped[r]:
                a = n_acc_h[r]
                self._advance(r, drafts_h[r * kk: r * kk + a] + [nxt_h[r]])
        if not any(self.live):
            self.drop_drafted()
            return
        if moved:  # the anchors and positions moved on the device already, by the rows this block decoded
            self.pos_h = [p + (a + 1 if on else 0) for p, a, on in zip(pos_h, n_acc_h, stepped)]
            self._turn_window(len(live_acc))
            return
        # rows that just ended keep nothing more; the others x_0 and their accepted drafts
        kept = torch.where(self._mask.of(self.live).on, n_acc + 1, 0)
        longest = max(n + 1 for n, on in zip(n_acc_h, self.live) if on)
        self.target.keep(kept, longest)
        if self.drafter is not None:  # all K+1 of every row, finished ones too (at their last position)
            self.drafter.observe_block(feats, pos_h)
        else:  # the kept entries at their positions, -1 elsewhere
            new = self.offs[None, :longest] < kept[:, None]
            self.adapter.observe(None if feats is None else feats[:, :longest],
                                 torch.where(new, pos[:, None] + self.offs[:longest], -1), ids=seq[:, :longest])
        self.anchor = torch.where(kept > 0, nxt, anchor)
        self.pos = pos + kept
        self.pos_h = [p + (n + 1 if on else 0) for p, n, on in zip(pos_h, n_acc_h, self.live)]
        self._turn_window(len(live_acc))

    def _catch_up(self) -> None:
        """The first speculative block after lean plain steps: the drafter gets the features of what they decoded
        (serving/lag.py), recomputed by forwards of the full verify's shape. Off the budget's clock and out of the
        window's wall: a cost of changing arms, not of either arm."""
        holes = self.lag.holes(self.pos_h, self.live)
        if not holes or self.target.kv_path != "static":  # (a dynamic cache keeps the hole: lossless, worse drafts)
            return
        began = time.perf_counter()
        contexts = [r.context for r in self.rows]
        anchors = self.anchor.tolist()
        for starts, seqs, owned in chunks(holes, contexts, self.pos_h, anchors, self.k + 1):
            seq = torch.tensor(seqs, dtype=torch.long, device=self.dev)
            at = torch.tensor(starts, device=self.dev)
            _, feats = self.target.step(seq, at, self.capture, starts)
            if self.drafter is not None:  # every entry, as a verify's block (placeholders are never read)
                self.drafter.observe_block(feats, starts)
            else:  # the eager contract: the hole's positions only, -1 elsewhere
                mine = torch.tensor(owned, device=self.dev)
                self.adapter.observe(feats, torch.where(mine, at[:, None] + self.offs, -1), ids=seq)
        self._off_the_clock()
        if self.windows is not None:
            if self.dev.type == "cuda":
                torch.cuda.synchronize(self.dev)
            self.windows.skip(time.perf_counter() - began)

    def _turn_window(self, rows: int) -> None:
        """At a block boundary (a block or plain step of `rows` live rows), a window that has run its time ends
        (serving/windows.py); a block drafted ahead for the next goes on into it unless the next window runs plain
        steps."""
        if self.windows is None:
            return
        self.windows.count(rows)
        if not self.windows.due():
            return
        pending = None if self.drafted is None else self.drafted[0]
        self.run = self.windows.turn(self.run, self.emitted, pending)
        if pending is not None:
            if self.run.committed() or pending == 0:
                self.drafted = None
            else:
                self.run.adopt(pending)

    def _rollout(self, block, anchor: torch.Tensor):
        """-> (drafts [B, K], each group's q): the rollout once per sampling setting."""
        engine = self.engine
        if len(self.groups) == 1:  # the common case: one call over the block as is
            s = self.groups[0][1]
            drafts, q = engine.rollout(engine.head, block, anchor, self.adapter.embed, temperature=s.temperature,
                                       top_k=s.top_k, top_p=s.top_p, generator=self.gen, use_head=self.use_head)
            return drafts, [q]
        drafts = torch.empty(anchor.shape[0], block.hidden.shape[1], dtype=torch.long, device=anchor.device)
        qs = []
        for idx, s in self.groups:
            part = replace(block, hidden=block.hidden[idx], base_logits=block.base_logits[idx])
            d, q = engine.rollout(engine.head, part, anchor[idx], self.adapter.embed, temperature=s.temperature,
                                  top_k=s.top_k, top_p=s.top_p, generator=self.gen, use_head=self.use_head)
            drafts[idx] = d
            qs.append(q)
        return drafts, qs

    def _verify(self, logits: torch.Tensor, drafts: torch.Tensor, qs: list):
        """-> (n_acc [B], next [B]): each group by its own rule (greedy, or speculative sampling)."""
        if len(self.groups) == 1:
            return verify_chain(logits, drafts, qs[0], self.groups[0][1], self.gen)
        b = drafts.shape[0]
        n_acc = torch.empty(b, dtype=torch.long, device=drafts.device)
        nxt = torch.empty(b, dtype=torch.long, device=drafts.device)
        for (idx, s), q in zip(self.groups, qs):
            n_acc[idx], nxt[idx] = verify_chain(logits[idx], drafts[idx], q, s, self.gen)
        return n_acc, nxt
