"""The target's side of a decode, one contract for every decoder: a session holds the target's KV
cache for B rows (B = 1 for a solo decode), each row at its own position.

    prefill(prompts, capture, rows=None)  the prompts at positions 0..n-1: every row (a new batch of
                                          len(prompts) rows), or only `rows` (freed slots of the batch
                                          in flight; the other rows keep their state)
                                          -> (each prompt's last logits [P, V], features [P, n_max, F]
                                          or None, ids [P, n_max], positions [P, n_max], -1 at padding)
    step(seq, pos, capture, host_pos)     seq [B, T] at positions pos_b..pos_b+T-1 -> (logits, features)
    keep(kept, longest)                   after a step row b keeps its first kept[b] new entries (a
                                          rejection rolls the rest back); `longest` = the most any row
                                          keeps, known on the host
    free(row)                             the row's entries are no one's: a later prefill(rows=[row])
                                          starts it afresh
    compact(rows)                         the batch becomes len(rows) rows: new row i is old row rows[i],
                                          with its entries and position (a batch whose rows ended
                                          shrinks: decoding/batched.py)

Two implementations, chosen per decode by `Engine.session` (solo) and `batched.ragged_target` (batches):

  StaticSession    the fast engine's static cache (domino_graft/fast): row b is cache row b at pos_b;
                   on CUDA one graph per batch size, step length and attention bucket, eager on a CPU;
                   a rejection is just the row's next position (nothing moves)
  DynamicSession   one HF DynamicCache: a single row runs the plain HF forward (rollback = crop); B > 1
                   rows share the cache through a validity mask [B, L] (a 4D attention mask hides the
                   other rows' entries, a rejection leaves a hole)

Why a row only ever attends its own decode on the static cache: before each step of row b, every
cache position < pos_b holds that row's verified tokens (induction: the prefill wrote 0..n_b-1; a
step writes pos_b..pos_b+K before attending and keeps pos_b..pos_b+a_b, the next starting right
after). Positions >= pos_b hold stale entries (padding, rejected drafts, a finished or freed row's
repeats); each step overwrites the ones its queries may see before they see them, and the mask
hides the rest. tests/decoding/test_batched_static.py checks this with garbage written past every
row. A prefill into some rows steps the others at positions past everything they verified (their
"parking" positions), so it leaves them as they were. With DOMINO_GRAFT_ADMIT_ROWS=1, where the admitted rows are
few (`admission_rows`: a power of two of them, at most half the batch) they are moved to the front of the cache and
run alone, every row going back to its slot after: an admission then costs its own rows' prefill, not the whole
batch's. On the CPU at 8 rows the whole batch's prefills took 41% of + Domino's served wall, the admitted rows alone
13% (bench/results/admission_rows_cpu/); on the H100 at 32 rows an admission cost about the same either way
(bench/results/served_rollouts_h100/), so it is off by default.

A finished row stays in the batch at its last position: its steps rewrite the same stale positions,
its outputs are dropped, and the other rows never wait for it; once half the rows have ended the
decoder compacts the batch (`compact`), so a step costs what its rows that go on cost. Compaction
moves each kept row's cache entries, nothing else: a row's logits do not depend on which row of
the batch it is, nor on the batch size (the kernels are batch-invariant: docs/design.md §5).

The tree decoder (tree.py) uses a DynamicSession for its prefill only: its verify needs a tree mask
and keeps a non-prefix path, which this contract's causal step and prefix keep do not express.
"""

from __future__ import annotations

import os
from typing import Optional, Protocol, Sequence

import torch


class TargetSession(Protocol):
    kv_path: str  # "static" | "dynamic": DecodeResult.kv_path

    def prefill(self, prompts: list[torch.Tensor], capture, rows: Optional[Sequence[int]] = None): ...

    def step(self, seq: torch.Tensor, pos: Optional[torch.Tensor], capture, host_pos: Optional[list[int]]): ...

    def keep(self, kept, longest: int) -> None: ...

    def free(self, row: int) -> None: ...

    def compact(self, rows: Sequence[int]) -> None: ...


def _right_pad(prompts: list[torch.Tensor], width: int):
    """-> (ids [P, width] right-padded with 0, lengths [P], real [P, n_max] bool, positions [P, n_max], -1 at padding)."""
    dev = prompts[0].device
    lens = torch.tensor([p.numel() for p in prompts], device=dev)
    n = max(p.numel() for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device=dev)
    for r, p in enumerate(prompts):
        ids[r, : p.numel()] = p
    cols = torch.arange(n, device=dev)
    real = cols[None] < lens[:, None]
    return ids, lens, real, torch.where(real, cols[None], -1)


def _host_pos(pos, host_pos) -> list[int]:
    if host_pos is not None:
        return list(host_pos)
    return [int(p) for p in pos.tolist()]  # a device sync: callers on hot paths pass host_pos


# DOMINO_GRAFT_ADMIT_ROWS=1: an admission in place runs only the admitted rows (moved to the front of the cache),
# not the whole batch (`StaticSession.prefill`). Off by default: on the CPU it cut + Domino's admissions 4.7x, but on
# the H100 at 32 rows an admission cost about the same either way (7.7 against 10.6 ms, the target alone's 6.8
# against 7.5: bench/results/served_rollouts_h100/), so the whole batch's prefill is not what an admission pays there
ADMIT_ROWS = os.environ.get("DOMINO_GRAFT_ADMIT_ROWS", "0") == "1"


def admission_rows(admitted: int, batch: int) -> int:
    """The rows an admission prefill of `admitted` prompts into a batch of `batch` rows runs: the next power of
    two (a few graph shapes, as batch sizes are padded), or the whole batch where that power is over half of it
    (the rows saved are then few against the rows moved; the balance is not measured on a GPU) or ADMIT_ROWS is
    off."""
    front = 1 << (admitted - 1).bit_length()
    return front if ADMIT_ROWS and 2 * front <= batch else batch


def _to_front(rows: list[int], batch: int) -> list[int]:
    """A permutation of range(batch) whose first len(rows) entries are `rows` (in order): each takes the place of
    the row it displaces."""
    order = list(range(batch))
    for i, r in enumerate(rows):
        j = order.index(r)
        order[i], order[j] = order[j], order[i]
    return order


def _inverse(order: list[int]) -> list[int]:
    back = [0] * len(order)
    for r, o in enumerate(order):
        back[o] = r
    return back


# ------------------------------------------------------------------------- static
class StaticSession:
    """Steps on one FastLM of `max_batch` rows; built by `create`, kept by the engine between decodes
    (its compiled shapes and captured graphs are reused while it has room)."""

    kv_path = "static"

    def __init__(self, target, lm, runner_cls):
        self.target, self.lm, self._runner_cls = target, lm, runner_cls
        self.runners: dict[tuple[int, ...], object] = {}
        self.rows = 0  # the batch the last full prefill started
        self._ends: list[int] = []  # per row: past every position it has written (where it may park)

    @classmethod
    def create(cls, target, batch: int, length: int, previous: Optional["StaticSession"] = None, *,
               start: int = 64) -> tuple[Optional["StaticSession"], Optional[str]]:
        """(a session with >= `batch` rows of >= `length` positions, None), reusing `previous` when it
        fits and still reads the target's weights; or (None, why the target cannot run on it).
        start: the smallest cache (powers of two from it): the engine's solo sessions start at 256,
        batches at 64 (a big CPU batch of short decodes, the chi-square tests' 9,000 rows, keeps its
        cache small)."""
        from ..fast import FastLM, GraphRunner, UnsupportedModel, prepare_for_cuda_decoding, round_up_pow2

        model = target.model
        embed = model.get_input_embeddings().weight
        if previous is not None and previous.fits(target, batch, length):
            return previous, None
        if previous is not None and previous.target is target:  # larger than before: keep the larger of each
            batch, length = max(batch, previous.lm.max_batch), max(length, previous.lm.max_len)
        size = max(length, min(round_up_pow2(length, start), target.shape.max_position_embeddings + 64))
        try:
            lm = FastLM.from_hf(model, max_batch=batch, max_len=size)
        except UnsupportedModel as e:
            return None, str(e)
        if embed.device.type == "cuda":
            prepare_for_cuda_decoding(lm)
        return cls(target, lm, GraphRunner), None

    def fits(self, target, batch: int, length: int) -> bool:
        embed = target.model.get_input_embeddings().weight
        lm = self.lm
        return (target is self.target and lm.max_batch >= batch and lm.max_len >= length
                and lm.embed.data_ptr() == embed.data_ptr() and lm.dtype == embed.dtype)

    def _runner(self, capture: tuple[int, ...]):
        runner = self.runners.get(capture)
        if runner is None:
            runner = self.runners[capture] = self._runner_cls(self.lm, capture=capture)
        return runner

    @staticmethod
    def _features(hidden: dict, capture: tuple[int, ...]):
        """The captured layers' outputs concatenated along the last dim in the order given (-1 = the
        final post-norm state), or None: what `TargetModel.__call__(..., capture=...)` returns."""
        return torch.cat([hidden[i] for i in capture], dim=-1) if capture else None

    def prefill(self, prompts: list[torch.Tensor], capture, rows: Optional[Sequence[int]] = None,
                starts: Optional[Sequence[int]] = None):
        """The prompts right-padded to `fast.prefill_length(n_max)` and run through the graph runner
        like a step: a handful of padded shapes, each compiled and captured once, instead of an eager
        launch-bound forward per prompt (SmolLM2's eager forward is ~22 ms against a ~1 ms graphed
        step; docs/design.md §5). Row b's padding writes K/V at positions >= n_b, which no real query
        of row b sees before a step overwrites them. rows: the slots the prompts go to (the others
        park past their ends); None = a new batch of len(prompts) rows. starts (with rows): each
        prompt's first position, a chunk of a longer one whose earlier chunks are in the cache
        (serving/batch.py's chunked admission; default 0)."""
        from ..fast import prefill_length

        dev = prompts[0].device
        n = max(p.numel() for p in prompts)
        t = prefill_length(n, self.lm.max_len)
        ids, lens, real, pos = _right_pad(prompts, t)
        order = None
        if rows is None:
            self.rows, self._ends = len(prompts), [t] * len(prompts)
            batch, at, slots = ids, [0] * len(prompts), torch.arange(len(prompts), device=dev)
        else:
            front = admission_rows(len(rows), self.rows)
            if front < self.rows:  # the admitted rows move to the front and only the first `front` run
                order = _to_front(list(rows), self.rows)
                self._permute(order)
                placed = list(range(len(rows)))
            else:
                placed = list(rows)
            try:
                batch, at = self._park(t, placed, starts, width=front)
            except ValueError:  # no room to park (the caller rebuilds): every row back in its slot first
                if order is not None:
                    self._permute(_inverse(order))
                raise
            slots = torch.tensor(placed, device=dev)
            batch[slots] = ids
            if starts is not None:
                pos = torch.where(real, pos + torch.tensor(list(starts), device=dev)[:, None], -1)
        capture = tuple(capture)
        # the final post-norm state gives each row's logits at its own last prompt token (the runner's
        # logits are the padded batch's last column)
        need = capture if -1 in capture else capture + (-1,)
        # pooled: the graph's outputs are copied out below (an index, a cat) before any other graph replays
        _, hidden = self._runner(need)(batch, at[0] if len(at) == 1 else at, logits_to_keep=1, pooled=True)
        last = self.lm.project_logits(hidden[-1][slots, lens - 1])
        feats = self._features(hidden, capture)
        if feats is not None:
            feats = feats[:, :n] if rows is None else feats[slots, :n]
        if order is not None:  # every row back to its slot
            self._permute(_inverse(order))
        return last, feats, ids[:, :n], pos

    def _park(self, t: int, rows: Sequence[int], starts: Optional[Sequence[int]] = None,
              width: Optional[int] = None) -> tuple[torch.Tensor, list[int]]:
        """-> (a [width, t] batch, each of its rows' positions): `rows` at their starts (0 by default), every
        other of the first `width` rows (default: all) `t` placeholder tokens at its end, past all it verified, so
        nothing of it changes. A parked row's end stays where it was: what it verified still ends there, and the
        next park may overwrite this one's placeholders (so parks in a row, a chunked admission's, need room for
        one of them only)."""
        width = self.rows if width is None else width
        first = dict(zip(rows, starts if starts is not None else [0] * len(rows)))
        at = [first.get(r, e) for r, e in enumerate(self._ends[:width])]
        full = [r for r, e in enumerate(at) if e + t > self.lm.max_len]
        if full:
            raise ValueError(f"prefill into a batch in flight: row {full[0]} has no {t} positions left to park "
                             f"(cache of {self.lm.max_len}); valid: a session created with room for them")
        self._ends[:width] = [a + t if r in first else e for r, (a, e) in enumerate(zip(at, self._ends))]
        return torch.zeros(width, t, dtype=torch.long, device=self.lm.device), at

    def _permute(self, order: list[int]) -> None:
        """Row r of the batch becomes what row order[r] was: its K/V, its length and its parking end (only the
        rows that move are copied)."""
        moved = [r for r, o in enumerate(order) if o != r]
        if not moved:
            return
        cache = self.lm.cache
        dst = torch.tensor(moved, device=cache.lengths.device)
        src = torch.tensor([order[r] for r in moved], device=cache.lengths.device)
        for kc, vc in zip(cache.k, cache.v):
            kc.index_copy_(0, dst, kc.index_select(0, src))  # a gathered copy first: rows swap places
            vc.index_copy_(0, dst, vc.index_select(0, src))
        cache.lengths.index_copy_(0, dst, cache.lengths.index_select(0, src))
        if cache.host_lengths is not None:
            was = list(cache.host_lengths)
            for r in moved:
                cache.host_lengths[r] = was[order[r]]
        if self._ends:
            was = list(self._ends)
            for r in moved:
                self._ends[r] = was[order[r]]

    def step(self, seq: torch.Tensor, pos: Optional[torch.Tensor], capture, host_pos: Optional[list[int]]):
        """seq [B, T] at positions pos_b..pos_b+T-1 (`host_pos`: the same positions on the host, which
        pick the attention bucket without a device sync) -> (logits [B, T, V], features). The logits
        are the graph's static buffer on CUDA: valid until the next step."""
        capture = tuple(capture)
        at = _host_pos(pos, host_pos)
        t = seq.shape[1]
        self._ends = [p + t for p in at]  # all a row verified lies before: a prefill into another row parks it there
        logits, hidden = self._runner(capture)(seq, at[0] if len(at) == 1 else at)
        return logits, self._features(hidden, capture)

    def prime_plain_tail(self, batch: int, first_end: int, length: int) -> int:
        """Before a prefill of `batch` rows: capture the plain step's graphs (one token a row, no features)
        at every batch size a compaction of it can reach (`batched._shrink`: powers of two below `batch`)
        and every attention bucket from `first_end` (the shortest prompt's first step) to `length`, so a
        plain tail that compacts never captures one mid-decode. -> the graphs it captured."""
        runner = self._runner(())
        buckets = sorted({runner.bucket(end) for end in range(first_end, length + 1, runner.kv_block)}
                         | {runner.bucket(length)})
        sizes = [1 << i for i in range(max(batch - 1, 0).bit_length()) if 1 << i < batch]
        return sum(runner.prime(b, 1, kv) for b in sizes for kv in buckets)

    def keep(self, kept, longest: int) -> None:
        """Nothing to do in the cache: the next step of row b starts after its kept entries."""

    def free(self, row: int) -> None:
        """Nothing to release: the row's entries are stale from now, overwritten by its next prefill."""

    def compact(self, rows: Sequence[int]) -> None:
        """Rows `rows` of the cache become rows 0..len(rows)-1 (their K/V, lengths and parking ends); the
        next step is [len(rows), T]: the graphs of that batch size read the cache's first rows."""
        rows = list(rows)
        cache = self.lm.cache
        idx = torch.tensor(rows, device=cache.lengths.device)
        n = len(rows)
        for kc, vc in zip(cache.k, cache.v):
            kc[:n] = kc.index_select(0, idx)  # a gathered copy first: rows may move onto one another
            vc[:n] = vc.index_select(0, idx)
        cache.lengths[:n] = cache.lengths.index_select(0, idx)
        if cache.host_lengths is not None:
            cache.host_lengths[:n] = [cache.host_lengths[r] for r in rows]
        self._ends = [self._ends[r] for r in rows] if self._ends else self._ends
        self.rows = n


# ------------------------------------------------------------------------ dynamic
def new_cache(target, *, rollback: bool):
    from transformers import DynamicCache

    cache = DynamicCache(config=target.model.config)
    # Sliding-window layers (Gemma3) drop old states unless told to keep them until the
    # next crop; without this a rejection past the window cannot be rolled back. The
    # baseline never rolls back, so it keeps the lean window-sized cache.
    if rollback and hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def rollback(cache, keep: int) -> None:
    """Keep the first `keep` positions (transformers 5.x: crop takes a negative count),
    then shrink recording sliding-window layers back to their window.

    A recording sliding layer keeps every state until the next crop. transformers 5.24
    only hands the last window-1+q of them to attention; 5.17 hands all of them while
    its mask expects window-1+q (a shape error), so after the prefill and after a fully
    accepted block (nothing cropped) the surplus must go. Keys older than the window are
    never needed again: a rollback removes at most K of the newest positions."""
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)
    for layer in getattr(cache, "layers", ()):
        if not (getattr(layer, "is_sliding", False) and getattr(layer, "record_past", False)):
            continue
        window = getattr(layer, "sliding_window", None)
        if window and getattr(layer, "keys", None) is not None and layer.keys.shape[-2] > window - 1:
            layer.keys = layer.keys[..., -(window - 1):, :]
            layer.values = layer.values[..., -(window - 1):, :]


class DynamicSession:
    """The target's HF forward over one DynamicCache. One row: the plain causal forward, no mask (any
    cache layer, sliding windows included). B > 1 rows: each row owns the entries a validity mask
    [B, L] marks and sees only those (full-attention targets only):

        prefill   the prompts right-padded to the longest; padding is invalid
        step      every row's tokens at its own positions, appended after the cache's L entries
        keep      row b keeps its first kept[b] new entries: the cache is cropped to the longest kept
                  run, and the rest of a shorter row's run becomes a hole

    rollback=False: the target-alone baseline's lean cache (a sliding layer keeps only its window)."""

    kv_path = "dynamic"

    def __init__(self, target, *, rollback: bool = True):
        self.target = target
        self._rollback = rollback
        self.cache = new_cache(target, rollback=rollback)
        self.valid = None  # [B, L] bool: row b owns cache entry l (B > 1)
        self.length = 0  # the cache's entries (one row)
        self.dtype = target.dtype

    def _check_ragged(self) -> None:
        sliding = [type(layer).__name__ for layer in getattr(self.cache, "layers", ())
                   if type(layer).__name__ != "DynamicLayer"]
        if sliding:
            raise ValueError(
                f"batched decoding: cache layer {sliding[0]} cannot hold a ragged batch (sliding-window targets, "
                "e.g. Gemma3); valid: full-attention targets, or --batch-size 1"
            )

    def _mask(self, allowed_new: torch.Tensor) -> torch.Tensor:
        """[B, 1, T, L + T] additive mask: each row's valid entries, then the new tokens by `allowed_new` [B|1, T, T]."""
        b, t = self.valid.shape[0], allowed_new.shape[-1]
        allowed = torch.cat([self.valid[:, None, :].expand(b, t, -1), allowed_new.expand(b, t, t)], dim=-1)
        return torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(self.dtype).min)[:, None]

    def prefill(self, prompts: list[torch.Tensor], capture, rows: Optional[Sequence[int]] = None):
        """As the contract (module docstring). Into `rows` of a batch in flight: the other rows run
        placeholders whose entries are invalid from the start, so they see and keep only their own."""
        dev = prompts[0].device
        if rows is None or (self.valid is None and list(rows) == [0]):  # a new batch (or its one row anew)
            if self.length or self.valid is not None:
                self.cache, self.valid, self.length = new_cache(self.target, rollback=self._rollback), None, 0
            rows = None
        if rows is None and len(prompts) == 1:  # one row: the solo decode's plain forward
            ids = prompts[0][None]
            n = ids.shape[1]
            pos = torch.arange(n, device=dev)[None]
            logits, feats = self.target(ids, cache=self.cache, position_ids=pos, capture=capture, logits_to_keep=1)
            self.length = n
            rollback(self.cache, n)  # a recording sliding layer's surplus goes (rollback's docstring)
            return logits[:, -1], feats, ids, pos
        self._check_ragged()
        n = max(p.numel() for p in prompts)
        ids, lens, real, pos = _right_pad(prompts, n)
        cols = torch.arange(n, device=dev)
        if rows is None:
            self.valid = torch.zeros(len(prompts), 0, dtype=torch.bool, device=dev)
            slots, batch, mine = torch.arange(len(prompts), device=dev), ids, real
        else:
            slots = torch.tensor(list(rows), device=dev)
            batch = torch.zeros(self.valid.shape[0], n, dtype=torch.long, device=dev)
            batch[slots] = ids
            mine = torch.zeros(self.valid.shape[0], n, dtype=torch.bool, device=dev)
            mine[slots] = real
            self.valid[slots] = False  # the slots' old entries are no one's (free)
        # a query sees its row's real tokens up to itself; a row with none (not prefilled) sees its own placeholder,
        # so that no query is fully masked (NaN states would reach the cache)
        alone = torch.eye(n, dtype=torch.bool, device=dev) & ~mine.any(1)[:, None, None]
        allowed = ((cols[None, :] <= cols[:, None]) & mine[:, None, :]) | alone
        logits, feats = self.target(batch, cache=self.cache, position_ids=cols[None].expand(len(batch), -1),
                                    attention_mask=self._mask(allowed), capture=capture)
        self.valid = torch.cat([self.valid, mine], dim=1)
        if feats is not None and rows is not None:
            feats = feats[slots]
        return logits[slots, lens - 1], feats, ids, pos

    def step(self, seq: torch.Tensor, pos: Optional[torch.Tensor], capture, host_pos: Optional[list[int]] = None):
        """seq [B, T] at positions pos_b..pos_b+T-1 (on the device, or `host_pos` on the host) -> (logits [B, T, V],
        features)."""
        t = seq.shape[1]
        offs = torch.arange(t, device=seq.device)
        if self.valid is None:
            at = host_pos[0] if host_pos is not None else int(pos[0])
            return self.target(seq, cache=self.cache, position_ids=(at + offs)[None], capture=capture)
        if pos is None:
            pos = torch.tensor(host_pos, device=seq.device)
        return self.target(seq, cache=self.cache, position_ids=pos[:, None] + offs,
                           attention_mask=self._mask(offs[None, :] <= offs[:, None]), capture=capture)

    def keep(self, kept, longest: int) -> None:
        """Row b keeps its first kept[b] new entries (one row: `longest` of them)."""
        if self.valid is None:
            self.length += longest
            rollback(self.cache, self.length)
            return
        if not torch.is_tensor(kept):
            kept = torch.tensor(list(kept), device=self.valid.device)
        rollback(self.cache, self.valid.shape[1] + longest)
        self.valid = torch.cat([self.valid, torch.arange(longest, device=kept.device)[None] < kept[:, None]], dim=1)

    def free(self, row: int) -> None:
        """The row's entries become invisible (the cache keeps their columns until a crop); one row: a fresh cache."""
        if self.valid is None:
            self.cache = new_cache(self.target, rollback=self._rollback)
            self.length = 0
        else:
            self.valid[row] = False

    def compact(self, rows: Sequence[int]) -> None:
        """Rows `rows` become the batch (each cache layer's rows and the validity mask gathered); one row
        stays one row."""
        if self.valid is None:
            return
        idx = torch.tensor(list(rows), device=self.valid.device)
        for layer in getattr(self.cache, "layers", ()):
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if torch.is_tensor(t) and t.dim() and t.shape[0] == self.valid.shape[0]:
                    setattr(layer, name, t.index_select(0, idx))
        self.valid = self.valid.index_select(0, idx)
