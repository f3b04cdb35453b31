"""DFlash on the fast engine: the drafter's context K/V in preallocated tensors, and one CUDA graph
per block for "write the verified context, propose the next block".

The dynamic adapter (model.py) keeps its context as growing tensors (a torch.cat per block) and
runs its modules eagerly: ~100 kernel launches per block, more than the target's whole verify
when that replays as a graph. Here, as in the target's static cache (domino_graft/fast), every
context position has a fixed slot: after a verify the K+1 features of ``x_0, d_1..d_K`` are all
written at ``pos..pos+K`` (a fixed shape), and the next block, anchored at ``pos + 1 + a``, reads
only the keys before its anchor, so the rejected drafts' entries are masked until they are
overwritten. Nothing is cropped or copied on a rejection.

The math is the backbone's own (``DFlashBackbone.context_kv`` / ``forward`` with an explicit
mask), so blocks equal the dynamic adapter's up to floating-point reassociation (a test checks).
On a CPU the same calls run eagerly.

Ragged batches (decoding/batched.py, beside the target's static ragged cache): with
``max_batch`` B rows the caches are [B, Hkv, S, D] and row b is cache row b at its own position,
as in decoding/session.py. The prefill writes the right-padded prompts' features at
0..n_max-1 of every row; row b's padding slots lie at or after its anchor n_b, so they are
masked (the default math) or overwritten by the block's own keys before they are read (the
kernels), and later overwritten by the verified context, exactly like a rejected draft's slot.
A step is ``propose(anchor [B], positions)`` then ``observe_block(features [B, K+1, F],
positions)`` with B host ints: each row writes its K+1 features at its own start and its next
block reads only its keys before its own anchor, so rows advance by their own accepts, and a
finished row re-proposing at its last position harms nobody. The kernels read the positions as
a [B] tensor on the device; the default math builds per-row masks (a query of row b sees the
context keys < pos_b and the whole block). Graphs are keyed by (B, block shape, kv bucket or key
splits). tests/decoding/test_batched_static_drafter.py checks every row against its solo drafter.
``compact(rows)`` shrinks the batch as the target's session does (its rows' context K/V and the
pending block move to rows 0..len(rows)-1).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.nn.functional as F

from domino_graft.fast import CapturedCall, host_ints, kv_bucket, prefill_length
from domino_graft.fast.llama import UnsupportedModel, fuse_linears
from domino_graft.fast.llama_math import rms_norm
from domino_graft.fast.llama_split import attention_kernels, layer_out, triton_kernels_unsupported

from ..base import DraftBlock


class StaticDFlashDrafter:
    """``prefill(features, n)`` once per decode, then per block ``propose(anchor, pos)`` and, after
    the verify, ``observe_block(features, pos)`` with the verify's features of all K+1 tokens.
    pos: an int (one row), or one host int per row of a batch of up to ``max_batch`` rows."""

    # padded, graphed prefills (`_prefill_write`). None: where graphs are captured; tests set True to check CUDA's
    # shapes on a CPU; DOMINO_GRAFT_PAD_PREFILLS=0/1 forces either for an A/B
    PAD_PREFILLS: Optional[bool] = {"0": False, "1": True}.get(os.environ.get("DOMINO_GRAFT_PAD_PREFILLS", ""))

    def __init__(self, adapter, max_len: int, max_batch: int = 1):
        cfg = adapter.cfg
        self.adapter, self.backbone = adapter, adapter.backbone
        self.max_len, self.max_batch = int(max_len), int(max_batch)
        self.block = cfg.block_size
        w = self.backbone.fc.weight
        self.device, self.dtype = w.device, w.dtype
        shape = (self.max_batch, cfg.num_key_value_heads, self.max_len, cfg.head_dim)
        n = cfg.num_hidden_layers
        self.k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(n)]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(n)]
        self._slots = torch.arange(self.max_len, device=self.device)
        self._rows = torch.arange(self.max_batch, device=self.device)
        self._zeros = torch.zeros(self.max_batch, dtype=torch.long, device=self.device)  # a prefill's first positions
        self._pending: Optional[tuple[torch.Tensor, list[int]]] = None  # (features [B, K+1, F], first positions)
        self._calls: dict[tuple, CapturedCall] = {}
        # the prefill graphs' one input buffer (flat) and one memory pool (`_prefill_input`)
        self._prefill_buffer: Optional[torch.Tensor] = None
        self._prefill_pool = None
        self.use_graphs = self.device.type == "cuda"
        # prefills as graphs of a few padded shapes (`_prefill_write`); on a CPU the exact shapes, eagerly
        self.pad_prefills = self.use_graphs if self.PAD_PREFILLS is None else self.PAD_PREFILLS
        self.compiled = False
        self.kernels = "torch"
        self._split = None  # use_kernels: (fused per-layer weights, inv_freq, compiled pieces)

    def use_kernels(self, name: str) -> "StaticDFlashDrafter":
        """"triton": a block runs through the fast engine's attention kernels (kernels/engine/decode_attention.py):
        per layer one q/k/v matmul over [the pending context rows; the block's rows] (the weights
        are read once for both), norm + RoPE + cache write of the context's k/v and then of the
        block's (the block's keys overwrite the rejected drafts' slots: the order is the launch
        order), attention over every key before ``position + block`` read on the device (no kv
        bucket, so no per-bucket recompile), and each layer's last residual add deferred into the
        next layer's norm. "reference": the same split in torch math (a CPU check). "torch":
        the backbone's own modules (the default). Call before compile()."""
        if name == "torch":
            self.kernels, self._split = name, None
            return self
        attention_kernels(name)  # an unknown name or a missing Triton fails here
        if self.compiled:
            raise ValueError("use_kernels() after compile(): choose the kernels first")
        bb, cfg = self.backbone, self.adapter.cfg
        if any(layer.sliding for layer in bb.layers) and cfg.sliding_window:
            raise UnsupportedModel(f"drafter kernels {name!r}: sliding-window layers are not supported; valid: torch")
        why = triton_kernels_unsupported(cfg.head_dim) if name == "triton" else None
        if why:
            raise UnsupportedModel(why)
        layers = []
        for layer in bb.layers:
            at, m = layer.self_attn, layer.mlp
            layers.append((layer.input_layernorm.weight, fuse_linears((at.q_proj, at.k_proj, at.v_proj), "weight"),
                           at.o_proj.weight, at.q_norm.weight, at.k_norm.weight,
                           layer.post_attention_layernorm.weight,
                           fuse_linears((m.gate_proj, m.up_proj), "weight"), m.down_proj.weight))
        hd = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, device=self.device, dtype=torch.float32) / hd))
        self.kernels = name
        self._split = dict(layers=layers, inv_freq=inv_freq, pieces=dict(
            ctx=_context_rows, block_in=_block_in, l_out=_layer_out, final=_final_norm))
        self._calls = {}
        return self

    def use_linears(self, name: str) -> "StaticDFlashDrafter":
        """After use_kernels: "triton" runs every norm and projection of the block (and of the
        context rows) through kernels/engine/small_linear.py and kernels/engine/row_norm.py, as the target's
        FastLM.use_linears does, with the residual adds and SiLU·mul in the projections'
        epilogues; nothing is left to compile. "reference": their torch math (a CPU check).
        Not the CUDA default: not measured yet (bench/drafter_speed.py variant triton_linears)."""
        if name not in ("triton", "reference"):
            raise ValueError(f"drafter linears {name!r}; valid: triton, reference")
        if self._split is None:
            raise ValueError("use_linears() needs use_kernels('triton' or 'reference') first")
        if self.compiled:
            raise ValueError("use_linears() after compile(): choose the kernels first")
        from domino_graft.fast.llama_split import linear_kernels

        linear, swiglu, norm = linear_kernels(name)
        self._split["pieces"] = _linear_pieces(linear, swiglu, norm)
        self._split["linears"] = name
        self._calls = {}
        return self

    def compile(self, **kwargs) -> "StaticDFlashDrafter":
        """torch.compile the context write and the propose math under the graphs (each block
        shape and kv bucket compiles once: the positions are tensors). With use_kernels("triton"),
        only the pieces around the kernels, which no kv bucket reaches: one compile per shape."""
        import torch._dynamo

        # one compile per (batch size, block length, pending rows) shape: the SmolLM2 concurrency run of 9865542
        # reached dynamo's limit of 64 in `_block_in` at its seventh batch size (B = 64), past which a new
        # shape runs eagerly (bench/results/concurrency_h200/9865542_concurrency.log.gz)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 512)
        torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 2048)
        opts = dict(dynamic=False)
        opts.update(kwargs)
        if self._split is not None:
            if "linears" not in self._split:  # the linears' pieces are kernels already
                self._split["pieces"] = {k: torch.compile(f, **opts) for k, f in self._split["pieces"].items()}
            self._calls = {}
            self.compiled = True
            return self
        self._write = torch.compile(self._write, **opts)
        self._propose = torch.compile(self._propose, **opts)
        self._calls = {}  # graphs captured over the eager functions
        self.compiled = True
        return self

    # ------------------------------------------------------------------ context
    def _write(self, feats: torch.Tensor, start: torch.Tensor, rows: Optional[torch.Tensor] = None) -> None:
        """Context K/V of feats [B, T, F]: row b at positions start[b]..start[b]+T-1 (start: [B]) of cache
        row b, or of cache row rows[b] (rows: [B], prompts admitted into freed rows)."""
        b, t = feats.shape[:2]
        pos = start[:, None] + self._slots[:t]  # [B, T]
        new = self.backbone.context_kv(feats, pos)
        if b == 1 and rows is None:  # one row: along the positions of cache row 0 (the solo drafter's write)
            for kc, vc, (k, v) in zip(self.k, self.v, new):
                kc[:1].index_copy_(2, pos[0], k)
                vc[:1].index_copy_(2, pos[0], v)
            return
        rows = (self._rows[:b] if rows is None else rows)[:, None]
        for kc, vc, (k, v) in zip(self.k, self.v, new):  # k [B, Hkv, T, D] -> slots [B, T, Hkv, D]
            kc[rows, :, pos] = k.transpose(1, 2)
            vc[rows, :, pos] = v.transpose(1, 2)

    def _positions(self, host: list[int]) -> torch.Tensor:
        """[B] host ints (positions, or an admission's cache rows) on the device without waiting on it: a fill for
        one row (the solo path), else a non-blocking copy of the host ints (as fast.GraphRunner does)."""
        if len(host) == 1:
            return torch.full((1,), host[0], dtype=torch.long, device=self.device)
        return torch.tensor(host, dtype=torch.long).to(self.device, non_blocking=True)

    def prefill(self, feats: torch.Tensor, n: int, rows=None) -> None:
        """The prompts' features [P, >= n, F] at positions 0..n-1 of rows 0..P-1 (eager: one shape
        per prompt), or of cache rows `rows` (prompts admitted into freed rows of a batch in flight:
        the other rows keep their context). Ragged prompts come right-padded: row b's slots >= its
        own length are harmless (module docstring)."""
        if n > self.max_len:
            raise ValueError(f"prompt of {n} positions > the drafter cache's {self.max_len}")
        b = feats.shape[0]
        if b > self.max_batch or (rows is not None and max(rows) >= self.max_batch):
            raise ValueError(f"batch of {b if rows is None else max(rows) + 1} rows > the drafter cache's "
                             f"{self.max_batch}")
        if rows is not None:
            self._flush()  # the rows in flight's last block first: it may lie where a new prompt goes
        self._prefill_write(feats, n, None if rows is None else list(rows))
        if rows is None:
            self._pending = None

    def _prefill_write(self, feats: torch.Tensor, n: int, rows: Optional[list[int]]) -> None:
        """The context K/V of a prefill. Eagerly it is ~150 host dispatches at the shipped SmolLM2 drafter's 4 layers
        (the backbone's projections, norms, RoPE and the cache writes: bench/results/admission_ops_cpu/), paid at
        every batch built and every admission in place (serving/batch.py). With pad_prefills (CUDA) it is one graph
        replay of a few shapes: the prompts right-padded to `fast.prefill_length(n)` (the target's own prefill
        shapes) and an admission's prompts widened to a power of two by repeating its first (the same values
        written twice to the same slots): graphs keyed by (rows, padded length), which the warm start captures
        (`visit_admissions`, serving/warmup.py). The padding's slots lie at or past each row's own length:
        harmless, like a ragged prompt's (module docstring)."""
        b = feats.shape[0]
        if not self.pad_prefills:
            idx = None if rows is None else self._positions(rows)
            self._write(feats[:, :n], self._zeros[:b], idx)
            return
        t = prefill_length(n, self.max_len)
        width = b if rows is None else min(self.max_batch, 1 << (b - 1).bit_length())
        x = self._prefill_input(width, t)
        # past the caller's features (or its own padding, where it reaches t) the buffer holds what an earlier prefill
        # left there (zeros at first): finite features, written only at slots past each row's own length
        m = min(feats.shape[1], t)
        x[:b, :m].copy_(feats[:, :m])
        if width > b:
            x[b:].copy_(x[:1].expand(width - b, -1, -1))
        pool = self._prefill_pool_handle()
        if rows is None:
            self._call(("prefill", b, t), lambda start: self._write(x, start), pool)(self._zeros[:b])
            return
        rows = rows + [rows[0]] * (width - b)
        self._call(("admit", width, t), lambda r: self._write(x, self._zeros[:width], r), pool)(self._positions(rows))

    def _prefill_input(self, width: int, t: int) -> torch.Tensor:
        """[width, t, F], the input of the prefill graph of that shape: a view of one flat buffer that every
        prefill graph reads (contiguous at every shape), so their inputs cost the largest one's, not their sum
        (at z-lab's Qwen3-8B drafter, F = 20,480: 2.7 GB at 32 rows of 2,048 positions, ~4× that as one buffer a
        shape). A shape the buffer cannot hold reallocates it, at that shape, and drops the graphs that read
        the old one (and their pool): the warm start captures the largest first (`visit_admissions`)."""
        f = self.backbone.fc.weight.shape[1]
        need = width * t * f
        if self._prefill_buffer is None or self._prefill_buffer.numel() < need:
            self._calls = {k: c for k, c in self._calls.items() if k[0] not in ("prefill", "admit")}
            self._prefill_buffer = self._prefill_pool = None  # freed before the larger one is allocated
            self._prefill_buffer = torch.zeros(need, dtype=self.dtype, device=self.device)
        return self._prefill_buffer[:need].view(width, t, f)

    def _prefill_pool_handle(self):
        """The prefill graphs' one memory pool (None without graphs): they have no outputs and replay on one
        stream, so one graph's intermediates may lie where another's did (CapturedCall's `pool`)."""
        if self.use_graphs and self._prefill_pool is None:
            self._prefill_pool = torch.cuda.graph_pool_handle()
        return self._prefill_pool

    def visit_admissions(self, lengths: list[int]) -> int:
        """Capture each admission prefill's graph (`_prefill_write`: every power-of-two width up to max_batch, at
        each padded prompt length of `lengths`) before traffic meets it: placeholders written into the first rows,
        which a row's own prefill overwrites before it reads them (serving/warmup.py). -> how many shapes (0
        without pad_prefills: nothing to capture)."""
        if not self.pad_prefills:
            return 0
        # the largest first: the input buffer is sized once, and the pool's first graph holds the peak others reuse
        shapes = sorted({(w, prefill_length(n, self.max_len)) for n in lengths
                         for w in [min(1 << i, self.max_batch) for i in range(self.max_batch.bit_length() + 1)]},
                        key=lambda s: (s[0] * s[1], s), reverse=True)
        feats = self.backbone.fc.weight.shape[1]
        for width, t in shapes:  # one position given: the rest of each row is whatever the input buffer holds
            self._prefill_write(torch.zeros(width, 1, feats, dtype=self.dtype, device=self.device), t,
                                list(range(width)))
        return len(shapes)

    def observe_block(self, feats: torch.Tensor, pos) -> None:
        """The verify's features [B, T, F] of x_0, d_1..d_{T-1} at pos..pos+T-1 of each row (pos: an
        int or B host ints; T = K+1, or fewer under a verify budget), written with the next propose
        (inside its graph); only those before each row's next anchor are ever read. A block still
        pending (a step that proposed nothing: decoding/budget.py's K' = 0) is written first."""
        self._flush()
        self._pending = (feats, host_ints(pos, feats.shape[0]))

    def _flush(self) -> None:
        """Write the pending block now, not with the next propose (on CUDA one graph per shape: one launch)."""
        if self._pending is not None:
            feats, start = self._pending_start()
            self._call(("write", *feats.shape[:2]), self._write)(feats, start)
            self._pending = None

    admits_rows = True  # prefill(..., rows=): prompts into freed rows of a batch in flight (serving/batch.py)
    takes_short_blocks = True  # observe_block of T < K+1 (a verify budget's K' < K): the solo chain's too

    def compact(self, rows) -> None:
        """Rows `rows` become rows 0..len(rows)-1: their context K/V and their part of the pending block
        (decoding/session.py's `compact`, for the drafter's side of the batch)."""
        rows = list(rows)
        idx = torch.tensor(rows, device=self.device)
        n = len(rows)
        for kc, vc in zip(self.k, self.v):
            kc[:n] = kc.index_select(0, idx)  # a gathered copy first: rows may move onto one another
            vc[:n] = vc.index_select(0, idx)
        if self._pending is not None:
            feats, start = self._pending
            self._pending = (feats.index_select(0, idx), [start[r] for r in rows])

    # ------------------------------------------------------------------ propose
    def _propose(self, anchor: torch.Tensor, pos: torch.Tensor, kv_len: int):
        a = self.adapter
        b = anchor.shape[0]
        ids = a.block_ids(anchor)
        block_pos = pos[:, None] + self._slots[: self.block]  # [B, Q]
        key_pos = self._slots[:kv_len]
        # row b's queries: its context before its own anchor, then the whole block
        ctx_ok = (key_pos[None, :] < pos[:, None])[:, None, :].expand(b, self.block, kv_len)
        allowed = torch.cat([ctx_ok, torch.ones(b, self.block, self.block, dtype=torch.bool, device=self.device)], -1)
        kv = [(k[:b, :, :kv_len], v[:b, :, :kv_len]) for k, v in zip(self.k, self.v)]
        hidden = self.backbone(a.embed(ids), block_pos, kv, key_pos, allowed=allowed)
        slots = a.slot_hidden(hidden)
        return slots, a.base_logits(slots)

    def _call(self, key: tuple, fn, pool=None) -> CapturedCall:
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = CapturedCall(fn, use_graphs=self.use_graphs, pool=pool)
        return call

    def _propose_split(self, feats: Optional[torch.Tensor], start: Optional[torch.Tensor], anchor: torch.Tensor,
                       pos: torch.Tensor, kv_len: int):
        """use_kernels' block: the pending context (feats at start.., or None) written, then the
        block proposed; -> (slot hidden, base logits)."""
        a, cfg, sp = self.adapter, self.adapter.cfg, self._split
        rope, rope_attention = attention_kernels(self.kernels)
        pc = sp["pieces"]
        bb = self.backbone
        eps, inv = cfg.rms_norm_eps, sp["inv_freq"]
        h, hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        b = anchor.shape[0]
        ctx = None if feats is None else pc["ctx"](feats, bb.fc.weight, bb.hidden_norm.weight, eps)
        nctx = 0 if ctx is None else ctx.shape[1]
        x, delta = a.embed(a.block_ids(anchor)).to(self.dtype), None
        for (in_norm, wqkv, wo, qn, kn, post, wgu, wd), kc, vc in zip(sp["layers"], self.k, self.v):
            kc, vc = kc[:b], vc[:b]  # the batch's rows: views, so the kernels write the cache itself
            x, qkv = pc["block_in"](x, delta, ctx, in_norm, wqkv, eps)
            if nctx:
                rope(qkv[:, :nctx], kc, vc, start, inv, 1.0, qn, kn, eps, h, hkv, hd, kv_only=True)
            o = rope_attention(qkv[:, nctx:], kc, vc, pos, inv, 1.0, qn, kn, eps, h, hkv, hd, kv_len, causal=False)
            x, delta = pc["l_out"](x, o, wo, post, wgu, wd, eps)
        slots = a.slot_hidden(pc["final"](x, delta, bb.norm.weight, eps))
        return slots, a.base_logits(slots)

    def _pending_start(self) -> tuple[torch.Tensor, torch.Tensor]:
        feats, start = self._pending
        if max(start) + feats.shape[1] > self.max_len:
            raise ValueError(f"context at {max(start)}..{max(start) + feats.shape[1] - 1} outside the drafter cache")
        return feats, self._positions(start)

    def _propose_with_kernels(self, anchor: torch.Tensor, host: list[int], pos: torch.Tensor) -> DraftBlock:
        from domino_graft.kernels.engine.decode_attention import attention_splits

        b = anchor.shape[0]
        end = max(host) + self.block
        kv_len = kv_bucket(end, self.max_len)
        # the kernels read exactly each row's position + block keys: graphs differ only by the
        # batch and the key splits
        bound = attention_splits(kv_len) if self.kernels == "triton" else kv_len
        if self._pending is None:
            call = self._call(("split", b, 0, bound), lambda anc, p: self._propose_split(None, None, anc, p, kv_len))
            slots, logits = call(anchor, pos)
        else:
            feats, at = self._pending_start()
            call = self._call(("split", b, feats.shape[1], bound),
                              lambda f, s, anc, p: self._propose_split(f, s, anc, p, kv_len))
            slots, logits = call(feats, at, anchor, pos)
            self._pending = None
        return DraftBlock(hidden=slots, base_logits=logits)

    # propose(..., at=): the positions may come as a device tensor (decoding/batched.py's step drafted ahead)
    positions_on_device = True

    def propose(self, anchor: torch.Tensor, position, at: Optional[torch.Tensor] = None) -> DraftBlock:
        """anchor [B] = x_0 of each row at its `position` (an int, or B host ints); the pending
        verified context is written first. at: the positions as a [B] long tensor on the device, for a
        block drafted before the host has read the verify that sets them (decoding/batched.py, "Drafted
        ahead"); `position` then bounds each row's from above (the attention bucket and the checks): the
        kernels read each row's own keys either way, only the bucket's key splits may differ."""
        b = anchor.shape[0]
        if b > self.max_batch:
            raise ValueError(f"batch of {b} rows > the drafter cache's {self.max_batch}")
        host = host_ints(position, b)
        end = max(host) + self.block
        if end > self.max_len:
            raise ValueError(f"block at {max(host)}..{end - 1} outside the drafter cache ({self.max_len})")
        pos = self._positions(host) if at is None else at
        if self._split is not None:
            return self._propose_with_kernels(anchor, host, pos)
        kv_len = kv_bucket(max(max(host), 1), self.max_len)
        if self._pending is None:
            call = self._call(("propose", b, kv_len), lambda anc, p: self._propose(anc, p, kv_len))
            slots, logits = call(anchor, pos)
        else:
            feats, start = self._pending_start()

            def write_then_propose(f, s, anc, p, kv_len=kv_len):
                self._write(f, s)
                return self._propose(anc, p, kv_len)

            call = self._call(("observe+propose", b, feats.shape[1], kv_len), write_then_propose)
            slots, logits = call(feats, start, anchor, pos)
            self._pending = None
        return DraftBlock(hidden=slots, base_logits=logits)


# ------------------------------------------------- the pieces around the attention kernels
def _context_rows(feats, fc_w, norm_w, eps: float):
    """The drafter's context rows: hidden_norm(fc(target features)) (DFlashBackbone.context_kv)."""
    return rms_norm(F.linear(feats.to(fc_w.dtype), fc_w), norm_w, eps)


def _block_in(x, delta, ctx, in_norm, wqkv, eps: float):
    """(the residual stream, q/k/v of [context rows; the block's normed rows]): one matmul."""
    if delta is not None:
        x = x + delta
    rows = rms_norm(x, in_norm, eps)
    if ctx is not None:
        rows = torch.cat([ctx, rows], dim=1)
    return x, F.linear(rows, wqkv)


def _layer_out(x, o, wo, post_norm, wgu, wd, eps: float):
    return layer_out(x, o, wo, None, post_norm, wgu, None, wd, None, eps)


def _final_norm(x, delta, norm_w, eps: float):
    return rms_norm(x + delta, norm_w, eps)


def _linear_pieces(linear, swiglu, norm) -> dict:
    """use_linears' pieces, with _propose_split's signatures: every residual add happens in a
    projection's epilogue, so the deferred delta is always None."""
    def ctx(feats, fc_w, norm_w, eps: float):
        return norm(linear(feats.to(fc_w.dtype), fc_w), norm_w, eps)

    def block_in(x, delta, ctx_rows, in_norm, wqkv, eps: float):
        rows = norm(x, in_norm, eps)
        if ctx_rows is not None:
            rows = torch.cat([ctx_rows, rows], dim=1)
        return x, linear(rows, wqkv)

    def l_out(x, o, wo, post_norm, wgu, wd, eps: float):
        x = linear(o, wo, residual=x)
        return linear(swiglu(norm(x, post_norm, eps), wgu), wd, residual=x), None

    def final(x, delta, norm_w, eps: float):
        return norm(x, norm_w, eps)

    return dict(ctx=ctx, block_in=block_in, l_out=l_out, final=final)
