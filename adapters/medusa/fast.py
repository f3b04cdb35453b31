"""Medusa on the fast engine: the heads' propose as one CUDA graph per block.

Medusa keeps no context beyond one hidden state: at ``propose(x_0, p)`` every head reads the
target's final post-norm state h_{p-1} (model.py). The static protocol hands the drafter all
K+1 verify features of ``x_0, d_1..d_K`` at ``pos..pos+K`` (a fixed shape) and not the accept
count; the next anchor tells it: with a accepted drafts the next block is anchored at
``p = pos + 1 + a``, so the state the heads read is row ``p - 1 - pos = a`` of those features,
the last accepted token's (the verify's output at the position the target's correction came
from). After the prefill the row is the prompt's last, ``n - 1``.

So ``observe_block`` only keeps a reference to the features, and ``propose`` gathers the row
(its index a device tensor filled from the host int: no sync) and runs the heads, as one
``CapturedCall`` keyed by (B, rows of the pending features); on a CPU the same call runs
eagerly. The row is read in the propose, before the target's next forward reuses the verify's
static output tensors, and the call copies it into its own buffers anyway. Trees stay on the
dynamic path (decoding/tree.py never asks for a static drafter).
"""

from __future__ import annotations

from typing import Optional

import torch

from domino_graft.fast import CapturedCall, host_ints

from ..base import DraftBlock


class StaticMedusaDrafter:
    """``prefill(features, n)``, then per block ``propose(anchor, pos)`` and, after the verify,
    ``observe_block(features of all K+1 verified tokens, pos)``. pos: an int, or B host ints."""

    def __init__(self, adapter, max_len: int, max_batch: int = 1):
        self.adapter, self.heads = adapter, adapter.heads
        self.max_len, self.max_batch = int(max_len), int(max_batch)
        w = self.heads[0][-1].weight
        self.device, self.dtype = w.device, w.dtype
        self._rows = torch.arange(self.max_batch, device=self.device)
        # (features [B, T, H] at start[b]..start[b]+T-1 of each row, start as host ints)
        self._pending: Optional[tuple[torch.Tensor, list[int]]] = None
        self._calls: dict[tuple, CapturedCall] = {}
        self.use_graphs = self.device.type == "cuda"
        self.proposals = 0  # blocks proposed (tests check the path was taken)

    def prefill(self, feats: torch.Tensor, n: int, ids: Optional[torch.Tensor] = None) -> None:
        """The prompt's features [B, >= n, H] at 0..n-1: only the last, h_{n-1}, is kept (a copy:
        the prefill's output tensor may be reused by the target)."""
        if n < 1:
            raise ValueError("Medusa prefill: the heads need at least one verified position")
        if n > self.max_len:
            raise ValueError(f"prompt of {n} positions > the drafter's max_len {self.max_len}")
        self._pending = (feats[:, n - 1: n].clone(), [n - 1] * feats.shape[0])

    def observe_block(self, feats: torch.Tensor, pos, ids: Optional[torch.Tensor] = None) -> None:
        """The verify's features [B, K+1, H] of x_0, d_1..d_K at pos..pos+K; the next propose's
        anchor picks the row (module docstring). ids: unused (Medusa reads no tokens)."""
        self._pending = (feats, host_ints(pos, feats.shape[0]))

    def _propose(self, feats: torch.Tensor, row: torch.Tensor):
        """feats [B, T, H], row [B]: the heads on feats[b, row[b]] -> (slot hidden, base logits)."""
        h = feats[self._rows[: feats.shape[0]], row].to(self.dtype)  # [B, H]
        hidden = self.heads.hidden(h)
        return hidden, self.heads.logits(hidden)

    def propose(self, anchor: torch.Tensor, position) -> DraftBlock:
        """anchor [B] = x_0 of each row at `position` (the heads do not read it: Medusa drafts from
        h_{position-1} alone)."""
        if self._pending is None:
            raise RuntimeError("Medusa static propose() before prefill(): the heads need the target's hidden state")
        b = anchor.shape[0]
        feats, start = self._pending
        if feats.shape[0] != b:
            raise ValueError(f"a batch of {b} anchors for features of {feats.shape[0]} rows")
        host = host_ints(position, b)
        rows = [p - 1 - s for p, s in zip(host, start)]
        t = feats.shape[1]
        bad = [(p, s) for p, r, s in zip(host, rows, start) if not 0 <= r < t]
        if bad:
            p, s = bad[0]
            raise RuntimeError(f"Medusa static propose(anchor at position {p}): the heads read the hidden state at "
                               f"{p - 1}, but the observed features cover {s}..{s + t - 1}")
        if b == 1:  # a fill, not a host->device copy
            row = torch.full((1,), rows[0], dtype=torch.long, device=self.device)
        else:
            row = torch.tensor(rows, dtype=torch.long).to(self.device, non_blocking=True)
        key = (b, t)
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = CapturedCall(self._propose, use_graphs=self.use_graphs)
        hidden, logits = call(feats, row)
        self.proposals += 1
        return DraftBlock(hidden=hidden, base_logits=logits)
