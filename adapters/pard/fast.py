"""PARD on the fast engine: the drafter LM on its own static KV cache, and one CUDA graph per block
for "write the verified tokens, propose the next block".

The dynamic adapter (model.py) runs the HF drafter on a DynamicCache: each propose feeds the
newly verified tokens and the block ``[x_0, pard × (k-1)]`` in one forward, then crops the block
off. Here the drafter runs on the fast engine's own Llama-family forward (domino_graft/fast/
llama.py: ``run_model``) over a preallocated cache, and the shapes are fixed: after a verify all
K+1 tokens ``x_0, d_1..d_K`` at ``pos..pos+K`` are handed over (``observe_block``), and the next
propose, anchored at ``p = pos + 1 + a``, runs ONE forward over

    [x_0, d_1..d_K] at pos..pos+K  then  [x'_0, pard × (k-1)] at p..p+k-1      (T = K+1+k)

with RoPE and the causal mask at those positions (query at q sees keys <= q). The first a+1
tokens (the accepted ones, positions < p) write their K/V at their positions; the rejected
drafts' K/V go to one scratch slot past ``max_len`` that no query reads (their queries'
outputs are dropped), so no position is written twice in one layer. The block's queries see
the context before p (written in the same layer, before the attention) and the block's own
keys, exactly the dynamic adapter's attention, so blocks equal its up to floating-point
reassociation (tests/decoding/test_static_drafters.py). Keys of earlier rejected drafts at or
after p are overwritten by this block's (or masked) before anything reads them: DFlash's
masking argument (adapters/dflash/fast.py). Nothing is cropped.

The drafter's weights are a fused copy (``FastLM.from_hf`` on a deep copy of the HF model:
from_hf rebinds the HF modules' parameters to views of fused tensors, which would orphan the
parameters an optimizer holds); ``PardAdapter.static_drafter`` rebuilds it when the weights
change (their version counters), so drafts never go stale. Attention reads the first ``kv_len``
slots, kv_len = the block's end rounded up to fast.KV_BLOCK: one graph per (shape, bucket). On a CPU
the same calls run eagerly. Drafters outside the fast engine's architectures (sliding windows,
soft-capping, Gemma-3, ...) raise UnsupportedModel: the adapter then answers None (eager propose).
"""

from __future__ import annotations

import copy
from typing import Optional

import torch

from domino_graft.fast import CapturedCall, FastLM, UnsupportedModel, kv_bucket
from domino_graft.fast.llama_math import decoder_layer, run_model

from ..base import DraftBlock
from .vocab import fit_vocab

RUN_MODEL_TYPES = ("llama", "qwen3", "qwen2", "mistral")  # the drafters whose forward is run_model's


class StaticPardDrafter:
    """``prefill(None, n, ids=prompt)``, then per block ``propose(anchor, pos)`` and, after the
    verify, ``observe_block(None, pos, ids=[x_0, d_1..d_K])``. Batch 1."""

    reads_ids = True  # chain.py passes the token ids to prefill / observe_block

    def __init__(self, adapter, max_len: int):
        self.adapter = adapter
        self.k = adapter.num_slots
        self.max_len = int(max_len)
        mt = getattr(adapter.model.config, "model_type", None)
        if mt not in RUN_MODEL_TYPES:  # before the copy: e.g. Gemma-3 has math of its own (fast/gemma3.py)
            raise UnsupportedModel(f"PARD static drafter: model_type {mt!r}; valid: {', '.join(RUN_MODEL_TYPES)}")
        with torch.no_grad():
            model = copy.deepcopy(adapter.model)
        # slot max_len: the scratch slot the rejected drafts write (never read: kv_len <= max_len)
        self.lm = FastLM.from_hf(model, max_batch=1, max_len=self.max_len + 1)
        if type(self.lm) is not FastLM:  # a subclass runs other math than run_model's
            raise UnsupportedModel(f"PARD static drafter: {type(self.lm).__name__} is not run_model's architecture")
        self.device, self.dtype = self.lm.device, self.lm.dtype
        self._slots = torch.arange(self.max_len + 1, device=self.device)
        self._rows = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        self._pending: Optional[tuple[torch.Tensor, int]] = None  # (ids [1, K+1], their first position)
        self._ctx = 0  # positions 0.._ctx-1 hold verified context (the host knows: no sync)
        self._calls: dict[tuple, CapturedCall] = {}
        self.use_graphs = self.device.type == "cuda"
        self.proposals = 0  # blocks proposed (tests check the path was taken)

    # ------------------------------------------------------------------ the forward
    def _forward(self, ids: torch.Tensor, q_pos: torch.Tensor, write: torch.Tensor, kv_len: int):
        """ids / q_pos / write [1, T]: RoPE and the mask at q_pos, K/V written at `write` ->
        (slot hidden [1, k, H], base logits [1, k, V]) of the last k tokens."""
        lm, c = self.lm, self.lm.cfg

        def layer(x, cos, sin, mask, rows, _q_pos, *rest):  # run_model writes at q_pos; we at `write`
            return decoder_layer(x, cos, sin, mask, rows, write, *rest)

        logits, hidden = run_model(ids, q_pos, self._slots[:kv_len], self._rows, lm.cache.k, lm.cache.v, lm.embed,
                                   lm.layers, lm.norm, lm.lm_head, lm.inv_freq, lm.rope_scaling, lm.dtype, (-1,),
                                   c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps, kv_len, self.k,
                                   layer_fn=layer)
        return hidden[-1][:, -self.k:], fit_vocab(logits, self.adapter.vocab_size)

    def _block(self, anchor: torch.Tensor, pos: torch.Tensor, kv_len: int):
        """The block alone at pos..pos+k-1 (the first block after the prefill)."""
        q_pos = pos[:, None] + self._slots[: self.k]
        return self._forward(self.adapter.block_ids(anchor), q_pos, q_pos, kv_len)

    def _observe_and_block(self, ids: torch.Tensor, start: torch.Tensor, anchor: torch.Tensor, pos: torch.Tensor,
                           kv_len: int):
        """The K+1 verified-or-rejected tokens at start.., then the block at pos (module docstring)."""
        n = ids.shape[1]
        ctx_pos = start[:, None] + self._slots[:n]
        scratch = torch.full_like(ctx_pos, self.max_len)
        ctx_write = torch.where(ctx_pos < pos[:, None], ctx_pos, scratch)  # the rejected drafts: scratch
        blk_pos = pos[:, None] + self._slots[: self.k]
        seq = torch.cat([self.adapter.known(ids), self.adapter.block_ids(anchor)], dim=1)
        return self._forward(seq, torch.cat([ctx_pos, blk_pos], 1), torch.cat([ctx_write, blk_pos], 1), kv_len)

    # ------------------------------------------------------------------ protocol
    def prefill(self, feats, n: int, ids: Optional[torch.Tensor] = None) -> None:
        """The prompt's ids [1, >= n] at 0..n-1, eagerly (one shape per prompt)."""
        if ids is None:
            raise ValueError("PARD static prefill(): token ids are required (the drafter reads tokens)")
        if ids.shape[0] != 1:
            raise ValueError(f"PARD static drafter: batch 1 only, got {ids.shape[0]} rows")
        if n + self.k > self.max_len:
            raise ValueError(f"prompt of {n} positions (+ a block of {self.k}) > the drafter cache's {self.max_len}")
        self.lm.forward(self.adapter.known(ids[:, :n]), 0, logits_to_keep=1, use_compiled=False)
        self._pending, self._ctx = None, int(n)

    def observe_block(self, feats, pos: int, ids: Optional[torch.Tensor] = None) -> None:
        """The verify's K+1 tokens [1, K+1] (x_0, d_1..d_K) at pos..pos+K, written with the next
        propose (inside its graph); only those before its anchor count."""
        if ids is None:
            raise ValueError("PARD static observe_block(): token ids are required (the drafter reads tokens)")
        if int(pos) != self._ctx:
            raise RuntimeError(f"PARD static observe_block(at {int(pos)}): the last block was anchored at {self._ctx}")
        self._pending = (ids, int(pos))

    def propose(self, anchor: torch.Tensor, position: int) -> DraftBlock:
        """anchor [1] = x_0 at `position`; every position before it must have been observed."""
        if anchor.shape[0] != 1:
            raise ValueError(f"PARD static drafter: batch 1 only, got {anchor.shape[0]} rows")
        position = int(position)
        end = position + self.k
        if end > self.max_len:
            raise ValueError(f"block at {position}..{end - 1} outside the drafter cache ({self.max_len})")
        kv_len = kv_bucket(end, self.max_len)
        pos = torch.full((1,), position, dtype=torch.long, device=self.device)
        if self._pending is None:
            if position != self._ctx:
                raise RuntimeError(f"PARD static propose(anchor at position {position}): the drafter has seen "
                                   f"positions 0..{self._ctx - 1}; it needs every verified position before the anchor")
            call = self._call(("block", kv_len), lambda anc, p: self._block(anc, p, kv_len))
            hidden, logits = call(anchor, pos)
        else:
            ids, start = self._pending
            if not start < position <= start + ids.shape[1]:
                raise RuntimeError(f"PARD static propose(anchor at position {position}): the observed block covers "
                                   f"{start}..{start + ids.shape[1] - 1}; the anchor must follow one of its tokens")
            at = torch.full((1,), start, dtype=torch.long, device=self.device)
            call = self._call(("observe+block", ids.shape[1], kv_len),
                              lambda i, s, anc, p: self._observe_and_block(i, s, anc, p, kv_len))
            hidden, logits = call(ids, at, anchor, pos)
            self._pending, self._ctx = None, position
        self.proposals += 1
        return DraftBlock(hidden=hidden, base_logits=logits)

    def _call(self, key: tuple, fn) -> CapturedCall:
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = CapturedCall(fn, use_graphs=self.use_graphs)
        return call
