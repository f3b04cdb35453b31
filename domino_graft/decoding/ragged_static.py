"""The target over a ragged batch on the fast engine's static KV cache: batched.py's default
wherever the target's architecture runs on the fast engine (domino_graft/fast), with
`batched.RaggedTarget` (one HF DynamicCache, a validity mask) as the fallback.

Row b of the batch is row b of one `FastLM` cache, at its own position pos_b (FastLM's forward
takes positions per row: query i of row b sees key positions <= pos_b + i):

    prefill   the prompts right-padded to the longest, all at position 0. Row b's padding writes
              K/V at positions >= n_b; no real query of row b sees them (they lie after it)
    step      [x_0, d_1..d_K] of every row at pos_b..pos_b+K; on CUDA one CUDA graph per batch
              size, step length and attention bucket (fast.GraphRunner), eager on a CPU
    keep      nothing moves: the next step of row b starts at pos_b + 1 + a_b, which is all a
              rejection is (no cropping, no holes)

Why a row only ever attends its own decode: before each step of row b, every cache position
< pos_b holds that row's verified tokens (induction: the prefill wrote 0..n_b-1; a step writes
pos_b..pos_b+K before attending and keeps pos_b..pos_b+a_b, the next starting right after).
Positions >= pos_b hold stale entries (padding, rejected drafts, a finished row's repeats);
each step overwrites the ones its queries may see before they see them, and the mask hides the
rest. tests/decoding/test_batched_static.py checks this with garbage written past every row.

A finished row stays in the batch at its last position: its steps rewrite the same stale
positions, its outputs are dropped, and the other rows never wait for it.
"""

from __future__ import annotations

from typing import Optional

import torch

from .common import GraphedSteps


class StaticRaggedTarget(GraphedSteps):
    """Batched steps on one FastLM of `max_batch` rows; built by `create`, kept by the engine
    between decodes (its compiled shapes and captured graphs are reused while it has room)."""

    kv_path = "static"

    def __init__(self, target, lm, runner_cls):
        self.target, self.lm, self._runner_cls = target, lm, runner_cls
        self.runners: dict[tuple[int, ...], object] = {}

    @classmethod
    def create(cls, target, batch: int, length: int,
               previous: Optional["StaticRaggedTarget"] = None) -> tuple[Optional["StaticRaggedTarget"], Optional[str]]:
        """(a static target with >= `batch` rows of >= `length` positions, None), reusing
        `previous` when it fits and still reads the target's weights; or (None, why not)."""
        from ..fast import FastLM, GraphRunner, UnsupportedModel, prepare_for_cuda_decoding, round_up_pow2

        model = target.model
        embed = model.get_input_embeddings().weight
        if previous is not None and previous.fits(target, batch, length):
            return previous, None
        if previous is not None and previous.target is target:  # larger than before: keep the larger of each
            batch, length = max(batch, previous.lm.max_batch), max(length, previous.lm.max_len)
        # from 64 (StaticTarget's solo caches start at 256): a big CPU batch of short decodes
        # (the chi-square tests run 9,000 rows) keeps its cache small
        size = max(length, min(round_up_pow2(length, 64), target.shape.max_position_embeddings + 64))
        try:
            lm = FastLM.from_hf(model, max_batch=batch, max_len=size)
        except UnsupportedModel as e:
            return None, str(e)
        if embed.device.type == "cuda":
            prepare_for_cuda_decoding(lm)  # as StaticTarget.reserve
        return cls(target, lm, GraphRunner), None

    def fits(self, target, batch: int, length: int) -> bool:
        embed = target.model.get_input_embeddings().weight
        lm = self.lm
        return (target is self.target and lm.max_batch >= batch and lm.max_len >= length
                and lm.embed.data_ptr() == embed.data_ptr() and lm.dtype == embed.dtype)

    # ---------------------------------------------------------------- decoding
    def prefill(self, prompts: list[torch.Tensor], capture):
        """-> (each row's last logits [B, V], features [B, n_max, F] or None, ids [B, n_max],
        positions [B, n_max] with -1 at padding), as RaggedTarget.prefill. The batch is
        right-padded to `fast.prefill_length(n_max)` and runs through the graph runner like a
        step (as StaticTarget.prefill: a few padded shapes, each captured once)."""
        from ..fast import prefill_length

        dev = prompts[0].device
        b = len(prompts)
        lens = torch.tensor([p.numel() for p in prompts], device=dev)
        n = max(p.numel() for p in prompts)
        t = prefill_length(n, self.lm.max_len)
        ids = torch.zeros(b, t, dtype=torch.long, device=dev)
        for r, p in enumerate(prompts):
            ids[r, : p.numel()] = p
        capture = tuple(capture)
        # the final post-norm state gives each row's logits at its own last prompt token
        # (the runner's logits are the padded batch's last column)
        need = capture if -1 in capture else capture + (-1,)
        _, hidden = self._runner(need)(ids, [0] * b, logits_to_keep=1)  # only hidden[-1]'s rows are read
        last = self.lm.project_logits(hidden[-1][torch.arange(b, device=dev), lens - 1])
        feats = self._features(hidden, capture)
        cols = torch.arange(n, device=dev)
        real = cols[None] < lens[:, None]
        return last, None if feats is None else feats[:, :n], ids[:, :n], torch.where(real, cols[None], -1)

    def step(self, seq: torch.Tensor, pos: torch.Tensor, capture, host_pos: list[int]):
        """seq [B, T] at positions pos_b..pos_b+T-1 (`host_pos`: the same positions on the host,
        which pick the attention bucket without a device sync) -> (logits [B, T, V], features).
        The logits are the graph's static buffer on CUDA: valid until the next step."""
        capture = tuple(capture)
        logits, hidden = self._runner(capture)(seq, host_pos)
        return logits, self._features(hidden, capture)

    def keep(self, kept: torch.Tensor, longest: int) -> torch.Tensor:
        """Row b keeps its first kept[b] new entries: nothing to do in the cache (the next step
        starts after them); -> valid [B, longest] of the new entries, for the drafter."""
        return torch.arange(longest, device=kept.device)[None] < kept[:, None]
