"""`make_rollout`: the Domino-head rollout as a drop-in, eager or fused, with CUDA graphs.

Every rollout has the decoding signature

    rollout(head, block, anchor, embed, *, temperature, top_k, top_p, generator, use_head=True)
        -> (draft_ids [B, K] int64, q [B, K, V] fp32 or None)

and the semantics of `reference.reference_rollout`. Names:

* "torch"        the eager reference (one `DominoHead.step` per slot);
* "triton"       fused, full vocabulary: table-lookup GRU, W1 split into one batched W1a GEMM
                 plus W1b per step, W2 GEMV + base add + running argmax without materialising
                 logits (greedy), exact over all V tokens with fp32 accumulation;
* "triton_pool"  the same on `pool_size` base candidates of each corrected slot (0 = full
                 vocabulary): the exact top-k, or (KernelConfig.pool_select="bucket") the max of
                 each of `pool_size` contiguous V buckets, an approximate top-k in one launch,
                 or ("radix") a Triton radix select (exact top-k on bf16/fp16 logits).
                 Under sampling q is the pool distribution.

On CUDA the fused rollout is captured once per static shape (B, K, dtypes, sampling knobs) in a
CUDA graph and replayed; the randomness (one uniform per slot) is drawn outside the graph.
On the CPU without TRITON_INTERPRET=1, or any other device, the Triton names fall back to
the PyTorch path with the same semantics (pool included) and say so once.

Greedy results of "triton" equal the reference token for token in fp32 (up to fp32 near-ties
of ~1e-6). In bf16/fp16 the fused path accumulates in fp32 and never rounds the logits to 16
bits, so it can break near-ties that the eager path (which rounds base + delta to bf16, often
creating exact ties) resolves by lowest id: it is the more precise of the two.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .reference import (POOL_SELECTS, bucket_candidates, draw_uniforms, filtered_probs, inverse_cdf, is_sampling,
                        radix_candidates, reference_rollout)

# the persistent pool rollout's grid-barrier waits: triton_persistent.BARRIERS's names (kept here
# too because that module imports triton, which validating a KernelConfig must not need)
PERSISTENT_BARRIERS = ("rmw", "volatile", "ld_acquire")

_warned: set[str] = set()
# a sampled slot's draw through kernels/head/sample_rows.py (one launch pair) instead of the torch
# inverse CDF (a scan along each row): off until the GPU measures it (module docstring of sample_rows.py)
SAMPLE_ROWS = os.environ.get("DOMINO_GRAFT_SAMPLE_ROWS") == "1"
# a full-vocabulary slot whose warp is a temperature alone: softmax, q and draw in two launches
# (kernels/head/sample_logits.py) instead of a dozen or more small torch kernels; DOMINO_GRAFT_SAMPLE_LOGITS=0
# turns it off (on since 8c01084's H100 run: a sampled slot then cost ~9 us over a greedy one at B = 1, ~41 before)
SAMPLE_LOGITS = os.environ.get("DOMINO_GRAFT_SAMPLE_LOGITS", "1") != "0"


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_unavailable_reason(device: torch.device) -> Optional[str]:
    """None if the Triton path can run on `device`, else why not."""
    if device.type not in ("cuda", "cpu"):
        return f"no Triton path for device {device.type!r}"
    if device.type == "cpu" and not _interpreting():
        return "CPU tensors need TRITON_INTERPRET=1 for Triton"
    try:
        import triton  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the install
        return f"triton is not importable ({exc})"
    return None


@dataclass
class KernelConfig:
    """Launch constants, chosen on the H200 by bench/rollout.py's sweeps (Qwen3-8B shapes,
    bf16; bench/results/head_latency_h200.json "w2_sweep", "gru_sweep", "pool_sweep",
    "pool_select_sweep"). The interpreter ignores them except for program counts."""

    # w2_argmax with the next step's W_hh programs, batch 1 (final run, 2026-11-30): (block_v 64,
    # block_r 256, 4 warps, 2 stages, 2 programs/SM) 24.9 us = 3.39 TB/s; 3 stages 26.0; 3/SM 25.1
    # (the zig-zag run's sweep: 2/SM and 3/SM both 24.97 us; it kept 3);
    # (128, 256, 4, 3, 1) 27.5; (128, 256, 8, 3, 1) 27.9; (128, 256, 8, 2, 1) 28.4.
    w2_block_v: int = 64
    w2_block_r: int = 256
    w2_warps: int = 4
    w2_stages: int = 2
    w2_programs_per_sm: int = 2
    # batch > 16 (a 32-wide batch tile): (block_v, block_r, warps, stages, programs/SM); None = the
    # settings above. Batch 32: (64, 256, 4, 2, 2) 33.6 us; (128, 256, 4, 3, 1) 34.6; (128, 256, 8, 3, 1)
    # 36.4; (64, 256, 4, 3, 2) 45.6.
    w2_large_batch: Optional[tuple] = (64, 256, 4, 2, 2)
    # gru_step (token from 264 partials, W_hh·S precomputed), batch 1: block_g 32: 2.89 us; 16: 3.01; 64: 3.18.
    # (The first gru_step, W_hh·S inline, took 8.3 us at any block shape: hence whh_gemv.)
    gru_block_g: int = 32
    gh_block: int = 32  # W_hh rows per whh_gemv program: 3G=3072 -> 96 programs
    gh_block_k: int = 256
    # pool_argmax with W_hh programs, batch 1, P=2048: block_p 16 at 4 programs/SM: 3.90 us;
    # 2/SM: 3.92; block 32: 4.46; block 8: 4.96.
    pool_block_p: int = 16
    pool_warps: int = 4
    pool_programs_per_sm: int = 4
    # candidate selection (exact in all three): "topk" = torch.topk over [B, K-1, V]; "topk2" =
    # two-stage top-k over pool_chunks slices, then their union; "sort" = a full descending sort.
    # [B, 14, 151936] -> 2048: topk 89 us (B=1) / 601 us (B=32); sort 159 / 2664; topk2 (4 chunks)
    # 277 / 783. torch.topk wins, and it is half of the pool rollout's time at batch 1.
    # "bucket" (approximate, one Triton launch, `triton_rollout.bucket_max`): the max of each of
    # pool_size contiguous V buckets; contains the base argmax, misses a top-k token only when a
    # higher one shares its bucket (random logits: ~63% of the top-2048, ~99% of the top-32).
    # Lossless all the same (verification is exact; under sampling q is the pool distribution).
    # Measured on the H200 (head_latency_h200.json, Qwen3-8B, batch 1, L2 flushed): the bucket
    # kernel alone 73-83 us (one program per bucket block: latency-bound), topk 126 us; whole
    # pool rollout 0.225 ms (bucket) vs 0.211 ms (exact topk). Not faster end to end and only
    # approximate, so the exact top-k stays the default; "bucket" remains an option.
    # "radix" (`triton_rollout.radix_select`, definition `reference.radix_candidates`): a two-level
    # radix select (12 + 12 key bits: 4096-bin histograms with atomics, a count pass, an
    # order-stable compaction) over [rows, V / pool_radix_block] programs: no torch.topk, no
    # per-row loop, no host sync, CUDA-graph capturable. Exact top-k for bf16/fp16 logits
    # (boundary ties to the lowest ids), to 2^-15 relative for fp32. Measured on the H200
    # (the radix probe, commit 1d66318, Qwen3-8B, batch 1): the selection alone 364 us against
    # torch.topk's 53 us (both inside a CUDA graph), whole pool rollout 0.544 ms vs 0.211 ms;
    # the best block/warps of its sweep (2048/4) are the defaults below. Correct but slow: an option.
    pool_select: str = "topk"
    pool_chunks: int = 8
    pool_bucket_block_p: int = 16  # buckets per bucket_max program (bench "pool_select_sweep", method bucket)
    pool_radix_block: int = 2048  # V elements per radix_select program (bench "radix_sweep")
    pool_radix_warps: int = 4
    # Fraction of W2's rows (the first ones) the full-vocabulary scan loads with evict_last so that
    # they stay in L2 from one corrected step to the next (W2 = 77.8 MB > the ~50 MB L2 at Qwen3-8B
    # shapes; the rest streams with evict_first). 0 disables. Swept by head_latency's
    # "l2_pin_sweep" at commit 1d66318 (0 / 0.3 / 0.45 / 0.6, end-to-end rollouts with the L2 flushed between
    # repetitions). Measured on the H200, batch 1: 0 -> 0.448 ms, 0.3 -> 0.576, 0.45 -> 0.577,
    # 0.6 -> 0.576: the hints cost more than the reuse saves, so pinning is off (the zig-zag below
    # gets W2 rows from L2 without hints).
    w2_l2_pin_fraction: float = 0.0
    # Zig-zag scan: each corrected step's W2 scan walks the rows in the opposite direction to the
    # previous step's, so it starts on the rows the previous scan read last, still in L2 (a
    # same-direction scan of a W2 larger than the L2 evicts each row before it is read again).
    # w2_stream marks W2 loads evict_first (the original streaming scan). Neither changes a token.
    # Measured on the H200 (head_latency_h200.json "l2_reuse_sweep", Qwen3-8B, batch 1, whole graphed
    # rollouts, L2 flushed between calls): streaming 0.445 ms; zig-zag 0.416 (evict_first or not:
    # 0.417); same direction without the hint 0.445; 30% pinned 0.597. So the zig-zag is on.
    w2_zigzag: bool = True
    w2_stream: bool = False
    # Greedy pool rollouts at batch <= pool_persistent_max_batch on CUDA as ONE persistent launch
    # (`triton_persistent.pool_rollout_persistent`: a software grid barrier between the GRU and the
    # scoring phase of every step) instead of two launches a step. Measured on the H200
    # (Qwen3-8B, bucket pool): correct (same tokens, no error flag) but slower, 0.432 ms vs
    # 0.224 ms at batch 1 and 0.897 vs 0.476 at batch 4 (not the barriers, ~0.8 us each: its
    # phases, ~10 us each; barrier_probe, commit 1d66318), so it stays off (docs/kernels.md).
    pool_persistent: bool = False
    pool_persistent_max_batch: int = 4
    # How its programs wait at a grid barrier (PERSISTENT_BARRIERS, `triton_persistent._grid_barrier`):
    # "rmw" (tl.atomic_add(bar, 0) acquire reads, the code measured above), "volatile" (volatile
    # loads, then one acquire read) or "ld_acquire" (inline-PTX acquire loads). Measured on the
    # H200 (barrier_probe, commit 1d66318): 0.79, 1.05 and 0.74 us a barrier, whole rollouts within 1.3%.
    pool_persistent_barrier: str = "rmw"
    # Each persistent program's rows of W_hh (3 gates x BLOCK_G x G: 48 KB in bf16 at Qwen3-8B's G
    # with 128 programs) loaded once before the first step and kept on chip for all K steps, as
    # its W1b slice already is, instead of re-read from L2 in G/BLOCK_KC dependent chunks every
    # step (the suspect for the ~10 us phases). Same products, summed in another order. Measured
    # on the H200 (barrier_probe, commit 1d66318, Qwen3-8B, topk pool): 0.232 ms vs 0.408 re-reading at
    # batch 1 (0.508 vs 0.735 at batch 4), same tokens: the phases fall from ~10 to ~4.5 us, still
    # slower than the multi-launch rollout (0.177 / 0.309 ms), so it stays off with the rest.
    pool_persistent_whh_resident: bool = False
    # The candidate selection forked onto this many side streams (0: none), one selection per
    # corrected slot dealt round-robin over them, each slot's scoring kernel waiting only for its
    # own slot's candidates; the W1a GEMM goes to the last side stream, the first corrected GRU
    # step waiting for it. Neither needs more than the block's inputs, so they run beside the
    # pure slots' steps and the earlier slots instead of before the chain: at batch 1 the batched
    # selection is ~0.07 of the pool rollout's 0.177 ms. Same candidate sets, so the same greedy
    # tokens (ties go to the lowest id whatever a pool's order). Inside a CUDA graph the fork
    # becomes parallel branches. Measured slower on the H200 (head_latency's
    # select_overlap_probe at commit 1d66318, Qwen3-8B shapes, batch 1): 0.660 / 0.402 / 0.269 ms with 1 / 2 / 4
    # streams against 0.174 ms batched, same tokens; a one-row torch.topk is hardly quicker than
    # fourteen, so the first corrected slot waits for a whole selection anyway. Off. On a CPU (and under the interpreter) the per-slot
    # selections run inline, which is what CI checks.
    pool_select_overlap: int = 0
    # Greedy chains with programmatic dependent launch (sm_90+): every kernel after the first
    # gru_step may become resident while its predecessor runs and waits on it in-kernel
    # (`triton_rollout` docstring), hiding the launch gap between the ~30 dependent kernels of a
    # rollout. Same kernels, same arithmetic, same tokens. Measured on the H200 (Qwen3-8B shapes,
    # bf16, CUDA graph, head_latency's "pdl_probe" at commit 22c64d4): full vocabulary 0.395 -> 0.373 ms at
    # batch 1 and 0.433 -> 0.417 at batch 4, pool 0.201 -> 0.174 and 0.315 -> 0.306, identical
    # drafts in all four, so it is on. It is ignored where it cannot run (CPU, the interpreter,
    # pre-sm_90 GPUs, sampling). On another GPU, time it with bench/rollout.py (docs/kernels.md).
    pdl: bool = True


@dataclass
class _Prepared:
    """Weights in the layout the kernels read, built once per (device, dtype)."""

    table: torch.Tensor  # [Vt, 3G] = E_all @ W_ih^T
    whh: torch.Tensor  # [3G, G]
    w1a: torch.Tensor  # [r, H]
    w1b: torch.Tensor  # [r, G]
    w2: torch.Tensor  # [V, r]


def build_gru_table(embedding_weight: torch.Tensor, w_ih: torch.Tensor, rows_per_chunk: int = 8192) -> torch.Tensor:
    """table[v] = W_ih · E[v] for every token: the GRU's input projection as a row lookup.

    Exact for a bias-free GRU. Computed in fp32, stored in W_ih's dtype ([V, 3G]: 0.93 GB in
    bf16 for Qwen3-8B, the price of reading 6 KB instead of 25 MB per step).
    """
    out = torch.empty(embedding_weight.shape[0], w_ih.shape[0], dtype=w_ih.dtype, device=w_ih.device)
    w = w_ih.float().t()
    for s in range(0, embedding_weight.shape[0], rows_per_chunk):
        e = embedding_weight[s:s + rows_per_chunk].to(device=w_ih.device, dtype=torch.float32)
        out[s:s + rows_per_chunk] = (e @ w).to(w_ih.dtype)
    return out


# Capture hygiene (CudaGraphRollout._capture). On two H200 machines that had been training drafters,
# with a cold Triton cache only, the first capture of the persistent pool rollout at (batch 4,
# pure 2, topk) was invalidated ("operation failed due to a previous error during capture"); with
# the cache warm it passed (the GPU test logs of commit 1d66318). Two suspects lie outside the
# captured stream: a garbage collection during the capture freeing an earlier graph or its memory
# pool (a rollout holds itself in a cycle through its bound `_body`, so only the cyclic collector
# frees it), and a CUDA call from another thread, which the default "global" capture mode counts
# against the capture. So: no automatic collection while warming up and capturing (torch.cuda.graph
# still runs one gc.collect() before it starts), and capture errors counted for this thread only.
# Not shown to be the fix: on a fresh machine the failure did not occur even without them
# (capture_probe, commit 1d66318).
GC_OFF_DURING_CAPTURE = True
CAPTURE_ERROR_MODE = "thread_local"


@dataclass
class _Graph:
    graph: "torch.cuda.CUDAGraph"
    hidden: torch.Tensor
    base: torch.Tensor
    anchor: torch.Tensor
    uniforms: Optional[torch.Tensor]
    ids: torch.Tensor
    q: Optional[torch.Tensor]


class CudaGraphRollout:
    """Capture a rollout body per static shape and replay it.

    `body(hidden, base, anchor, uniforms, temperature, top_k, top_p, use_head) -> (ids, q)` must be
    free of host syncs and allocate its outputs inside, and must not write to its inputs. Each
    (B, K, dtypes, knobs) key gets its own graph and private memory pool (graphs are never replayed
    out of capture order on a shared pool). Inputs are copied into the graph's static buffers (a
    [B, K, V] copy of the base logits), except in greedy mode when a caller passes the same
    buffers twice in a row (a drafter writing into static output buffers, as graphed serving
    engines do): a second graph is then captured that reads those addresses in place, and it is
    replayed whenever the inputs sit at exactly those addresses, strides and shapes again. Only the
    addresses are kept, never the tensors, so the caller's allocator stays free to reuse them. At
    most `max_in_place` address sets per key get such a graph (a capture costs milliseconds: a
    caller whose buffers keep moving must not recapture on every move); others copy.
    """

    def __init__(self, body: Callable, *, max_graphs: int = 64, max_in_place: int = 4):
        self.body = body
        self.max_graphs = max_graphs
        self.max_in_place = max_in_place
        self._graphs: dict = {}
        self._in_place: dict = {}  # key -> {input addresses: graph reading them in place}
        self._last_addresses: dict = {}  # key -> the previous call's input addresses
        self.in_place_replays = 0

    @staticmethod
    def _addresses(hidden, base, anchor) -> tuple:
        return tuple((t.data_ptr(), tuple(t.stride())) for t in (hidden, base, anchor))

    def __call__(self, block, anchor, *, temperature=0.0, top_k=0, top_p=1.0, generator=None, use_head=True):
        hidden, base = block.hidden, block.base_logits
        sampling = is_sampling(temperature)
        key = (tuple(hidden.shape), hidden.dtype, tuple(base.shape), base.dtype, base.device, anchor.dtype,
               float(temperature) if sampling else 0.0, top_k if sampling else 0, top_p if sampling else 1.0,
               bool(use_head))
        if not sampling:  # (sampling copies fresh uniforms in at every call anyway)
            addresses = self._addresses(hidden, base, anchor)
            known = self._in_place.setdefault(key, {})
            direct = known.get(addresses)
            repeated = self._last_addresses.get(key) == addresses
            self._last_addresses[key] = addresses
            if direct is None and repeated and len(known) < self.max_in_place:
                # the same buffers twice in a row: read them in place from now on
                direct = known[addresses] = self._capture(hidden, base, anchor, sampling, temperature, top_k,
                                                          top_p, use_head, in_place=True)
            if direct is not None:
                self.in_place_replays += 1
                direct.graph.replay()
                return direct.ids.clone(), None
        g = self._graphs.get(key)
        if g is None:
            if len(self._graphs) >= self.max_graphs:
                self._graphs.clear()
                self._in_place.clear()
                self._last_addresses.clear()
            g = self._graphs[key] = self._capture(hidden, base, anchor, sampling, temperature, top_k, top_p, use_head)
        g.hidden.copy_(hidden)
        g.base.copy_(base)
        g.anchor.copy_(anchor)
        if sampling:
            g.uniforms.copy_(draw_uniforms(base.shape[0], base.shape[1], generator, base.device))
        g.graph.replay()
        return g.ids.clone(), (g.q.clone() if g.q is not None else None)

    def _capture(self, hidden, base, anchor, sampling, temperature, top_k, top_p, use_head,
                 in_place: bool = False) -> _Graph:
        if in_place:  # the graph reads the caller's buffers; keep no reference to them
            s_hidden, s_base, s_anchor = hidden, base, anchor
        else:
            s_hidden, s_base, s_anchor = hidden.clone(), base.clone(), anchor.clone()
        s_u = torch.rand(base.shape[:2], device=base.device) if sampling else None

        def run():
            return self.body(s_hidden, s_base, s_anchor, s_u, temperature, top_k, top_p, use_head)

        gc_was_on = gc.isenabled()
        if GC_OFF_DURING_CAPTURE:
            gc.disable()
        try:
            side = torch.cuda.Stream(device=base.device)
            side.wait_stream(torch.cuda.current_stream(base.device))
            with torch.cuda.stream(side):  # warm-up: Triton compiles, cuBLAS picks its kernels
                for _ in range(2):
                    run()
            torch.cuda.current_stream(base.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode=CAPTURE_ERROR_MODE):
                ids, q = run()
        finally:
            if gc_was_on:
                gc.enable()
        if in_place:
            return _Graph(graph, None, None, None, s_u, ids, q)
        return _Graph(graph, s_hidden, s_base, s_anchor, s_u, ids, q)


class FusedRollout:
    """The Triton rollout ("triton" with pool_size=0, "triton_pool" otherwise)."""

    def __init__(self, head, embedding_weight: Optional[torch.Tensor] = None, *, pool_size: int = 0,
                 cuda_graphs: bool = True, config: Optional[KernelConfig] = None):
        self.head = head
        self.embedding_weight = embedding_weight
        self.pool_size = int(pool_size)
        self.name = "triton_pool" if self.pool_size else "triton"
        self.config = config or KernelConfig()
        if self.config.pool_select not in POOL_SELECTS:
            raise ValueError(f"KernelConfig.pool_select {self.config.pool_select!r}: valid: {', '.join(POOL_SELECTS)}")
        if self.config.pool_persistent_barrier not in PERSISTENT_BARRIERS:
            raise ValueError(f"KernelConfig.pool_persistent_barrier {self.config.pool_persistent_barrier!r}: "
                             f"valid: {', '.join(PERSISTENT_BARRIERS)}")
        if not isinstance(self.config.pool_select_overlap, int) or self.config.pool_select_overlap < 0:
            raise ValueError(f"KernelConfig.pool_select_overlap {self.config.pool_select_overlap!r}: valid: an int "
                             ">= 0 (side streams for the candidate selection; 0 = none)")
        self.cuda_graphs = cuda_graphs
        self._prepared: dict = {}
        self._streams: dict = {}  # (device, n) -> side streams of the overlapped pool selection
        self._graphs = CudaGraphRollout(self._body)

    def refresh(self) -> None:
        """Drop the derived weights (table, splits) and graphs: call after the head's weights change."""
        self._prepared.clear()
        self._graphs = CudaGraphRollout(self._body)

    # ---------------------------------------------------------------- the drop-in
    def __call__(self, head, block, anchor, embed, *, temperature=0.0, top_k=0, top_p=1.0, generator=None,
                 use_head=True):
        if head is not None and head is not self.head:
            raise ValueError(f"{self.name} rollout was built for another DominoHead; make a new one with make_rollout")
        device = block.base_logits.device
        reason = triton_unavailable_reason(device)
        if reason is not None or not use_head:
            if reason is not None:
                _warn_once(f"make_rollout({self.name!r}): {reason}; using the PyTorch path")
            return reference_rollout(self.head, block, anchor, embed, temperature=temperature, top_k=top_k,
                                     top_p=top_p, generator=generator, use_head=use_head, pool_size=self.pool_size,
                                     pool_select=self.config.pool_select)
        self._ensure_prepared(device, embed, block.base_logits.shape[-1])
        if device.type == "cuda" and self.cuda_graphs and not _interpreting():
            return self._graphs(block, anchor, temperature=temperature, top_k=top_k, top_p=top_p,
                                generator=generator, use_head=use_head)
        u = None
        if is_sampling(temperature):
            u = draw_uniforms(block.base_logits.shape[0], block.base_logits.shape[1], generator, device)
        return self._body(block.hidden, block.base_logits, anchor, u, temperature, top_k, top_p, use_head)

    # ---------------------------------------------------------------- preparation
    def _ensure_prepared(self, device, embed, vocab: int) -> _Prepared:
        key = (device, self.head.prefix_gru.weight_hh_l0.dtype)
        if key in self._prepared:
            return self._prepared[key]
        head = self.head
        spec = head.spec
        emb = self.embedding_weight
        with torch.no_grad():
            if emb is None:  # no table given: read the embedding through the decoder's own callable
                emb = embed(torch.arange(vocab, device=device))
            w_ih = head.prefix_gru.weight_ih_l0.detach().to(device)
            w1 = head.embed_proj[0].weight.detach().to(device)
            prep = _Prepared(
                table=build_gru_table(emb, w_ih),
                whh=head.prefix_gru.weight_hh_l0.detach().to(device).contiguous(),
                w1a=w1[:, :spec.hidden_dim].contiguous(),
                w1b=w1[:, spec.hidden_dim:].contiguous(),
                w2=head.embed_proj[2].weight.detach().to(device).contiguous(),
            )
        self._prepared[key] = prep
        return prep

    def _sm_count(self, device) -> int:
        if device.type == "cuda" and not _interpreting():
            return torch.cuda.get_device_properties(device).multi_processor_count
        return 2  # interpreter: a few programs still exercise the two-stage reduction

    # ---------------------------------------------------------------- the launch sequence
    @torch.no_grad()
    def _body(self, hidden, base, anchor, uniforms, temperature, top_k, top_p, use_head):
        from . import triton_rollout as tr

        cfg = self.config
        device = base.device
        prep = self._ensure_prepared(device, None, base.shape[-1])
        wdt = prep.whh.dtype
        bsz, k, vocab = base.shape
        g = prep.whh.shape[1]
        r = prep.w2.shape[1]
        pure = min(self.head.spec.pure_prefix_len, k)
        sampling = is_sampling(temperature)
        if base.stride(-1) != 1:
            base = base.contiguous()
        anchor = anchor.to(torch.int64).contiguous()
        sms = self._sm_count(device)
        # PDL for every kernel after the first of the chain (its predecessor is a PyTorch op)
        pdl = self._use_pdl(device, sampling)

        # S_0 = 0 is never read (step 1 runs the S_0 = 0 formula), nor are a pure slot's z rows:
        # empty, not zeroed (two launches fewer in the graph)
        states = torch.empty(k + 1, bsz, g, device=device, dtype=wdt)
        # z pre-activations of every slot: W1a·H_j for all slots in one GEMM; each GRU step adds W1b·S_j
        zacc = torch.empty(k, bsz, r, device=device, dtype=torch.float32)
        pool = min(self.pool_size, vocab) if self.pool_size else 0
        overlap = bool(pool and k > pure and cfg.pool_select_overlap > 0 and cfg.pool_select != "block_shared"
                       and not self._use_persistent(device, bsz, sampling))  # block_shared: one pool, not one a slot
        side = self._fork(device) if overlap else []  # side streams (CUDA only; none inline)
        zacc_ready = None  # set when W1a·H runs on a side stream: the first corrected step waits on it
        if k > pure:
            # beside the chain when the selection is: the pure slots need no z
            with torch.cuda.stream(side[-1]) if side else contextlib.nullcontext():
                zacc[pure:] = F.linear(hidden[:, pure:].to(wdt), prep.w1a).transpose(0, 1)
                zacc_ready = _recorded_event() if side else None

        pool_rows, pool_ready = [], []  # per corrected slot: (vals [B, P], ids [B, P]); its event
        if pool and k > pure:
            if self._use_persistent(device, bsz, sampling):
                pool_vals, pool_ids = self._select(tr, base[:, pure:], pool)
                return self._pool_persistent(tr, prep, base, anchor, zacc, pool_vals, pool_ids, pure, sms), None
            if overlap:
                pool_rows, pool_ready = self._select_per_slot(tr, base, pure, pool, side)
            else:
                pool_vals, pool_ids = self._select(tr, base[:, pure:], pool)
                pool_rows = [(pool_vals[:, c], pool_ids[:, c]) for c in range(k - pure)]
            np_pool = max(1, min(triton_cdiv(pool, cfg.pool_block_p),
                                 triton_cdiv(cfg.pool_programs_per_sm * sms, bsz)))
            pv_pool = torch.empty(bsz, np_pool, device=device, dtype=torch.float32)
            pi_pool = torch.empty(bsz, np_pool, device=device, dtype=torch.int32)
            pool_logits = torch.empty(bsz, pool, device=device, dtype=torch.float32) if sampling else None
        w2v, w2r, w2w, w2s, w2p = (cfg.w2_large_batch if bsz > 16 and cfg.w2_large_batch else
                                   (cfg.w2_block_v, cfg.w2_block_r, cfg.w2_warps, cfg.w2_stages, cfg.w2_programs_per_sm))
        np_full = tr.w2_programs(vocab, w2v, w2p * sms)
        pin = tr.l2_pin_programs(cfg.w2_l2_pin_fraction, np_full)
        pv_full = torch.empty(bsz, np_full, device=device, dtype=torch.float32)
        pi_full = torch.empty(bsz, np_full, device=device, dtype=torch.int32)

        draft = torch.empty(bsz, k, device=device, dtype=torch.int64)
        tok = torch.empty(k, bsz, device=device, dtype=torch.int64) if sampling else None  # drawn tokens, per slot
        q = torch.empty(bsz, k, vocab, device=device, dtype=torch.float32) if sampling else None
        logits = torch.empty(vocab, bsz, device=device, dtype=torch.float32) if sampling else None  # [V, B]

        gh = torch.empty(bsz, 3 * g, device=device, dtype=torch.float32)  # W_hh·S_{j-1} for step j
        last = None  # partials of the previous slot (greedy)
        for j in range(1, k + 1):
            corrected = j > pure
            step = dict(table=prep.table, h_prev=states[j - 1], h_out=states[j], block_g=cfg.gru_block_g,
                        gh=gh if j > 1 else None)  # S_0 = 0: no recurrent term at step 1
            if corrected:
                step.update(w1b=prep.w1b, zacc=zacc[j - 1])
                if j == pure + 1 and zacc_ready is not None:
                    torch.cuda.current_stream(device).wait_event(zacc_ready)
            # slot j's scoring kernel also computes W_hh·S_j for step j+1 (not needed after the last)
            nxt = dict(gh=(states[j], prep.whh, gh) if j < k else None, block_gh=cfg.gh_block,
                       gh_block_k=cfg.gh_block_k)
            if j == 1:
                tr.gru_step(tok=anchor, **step)
            elif sampling:
                tr.gru_step(tok=tok[j - 2], **step)
            else:
                tr.gru_step(partials=last, draft=draft, draft_col=j - 2, pdl=pdl, **step)

            base_j = base[:, j - 1]
            if not corrected:
                if sampling:
                    if nxt["gh"] is not None:
                        tr.whh_gemv(h=states[j], whh=prep.whh, gh=gh, block_gh=cfg.gh_block,
                                    gh_block_k=cfg.gh_block_k)
                    self._sample_slot(base_j, temperature, top_k, top_p, uniforms, q, tok, j)
                else:
                    tr.w2_argmax(base=base_j, pval=pv_full, pidx=pi_full, block_v=w2v, num_warps=w2w,
                                 num_stages=w2s, pdl=pdl, **nxt)
                    last = (pv_full, pi_full)
            elif pool:
                c = j - pure - 1
                vals_c, ids_c = pool_rows[c]
                if pool_ready:  # this slot's candidates, selected on a side stream
                    torch.cuda.current_stream(device).wait_event(pool_ready[c])
                tr.pool_argmax(ids=ids_c, vals=vals_c, zacc=zacc[j - 1], w2=prep.w2,
                               pval=pv_pool, pidx=pi_pool, logits=pool_logits, block_p=cfg.pool_block_p,
                               block_r=w2r, num_warps=cfg.pool_warps, pdl=pdl, **nxt)
                last = (pv_pool, pi_pool)
                if sampling:
                    self._sample(filtered_probs(pool_logits, temperature, top_k, top_p), ids_c,
                                 uniforms, q, tok, j)
            else:
                reverse = cfg.w2_zigzag and (j - pure - 1) % 2 == 1  # corrected steps alternate direction
                tr.w2_argmax(base=base_j, pval=pv_full, pidx=pi_full, zacc=zacc[j - 1], w2=prep.w2, logits=logits,
                             block_v=w2v, block_r=w2r, num_warps=w2w, num_stages=w2s, pin_programs=pin,
                             reverse=reverse, stream=cfg.w2_stream, pdl=pdl, **nxt)
                last = (pv_full, pi_full)
                if sampling:
                    self._sample_slot(logits.t(), temperature, top_k, top_p, uniforms, q, tok, j)
        for stream in side:  # join every forked stream (a graph capture must end on one stream)
            torch.cuda.current_stream(device).wait_stream(stream)
        if sampling:
            return tok.t().contiguous(), q
        tr.argmax_finalize(pval=last[0], pidx=last[1], draft=draft, draft_col=k - 1, pdl=pdl)
        return draft, q

    def _select(self, tr, rows, pool: int):
        """The configured candidate selection of base rows [B, N, V] -> (vals [B, N, P] fp32, ids
        [B, N, P] int64), both contiguous (the scoring kernel reads them with one stride)."""
        cfg = self.config
        if cfg.pool_select == "bucket":
            return tr.bucket_max(rows, pool, block_p=cfg.pool_bucket_block_p)
        if cfg.pool_select == "radix":
            return tr.radix_select(rows, pool, block=cfg.pool_radix_block, num_warps=cfg.pool_radix_warps)
        if cfg.pool_select == "block_shared":
            return tr.block_shared(rows, pool)
        vals, ids = pool_candidates(rows, pool, cfg.pool_select, cfg.pool_chunks)
        return vals.float().contiguous(), ids.contiguous()

    def _select_per_slot(self, tr, base, pure: int, pool: int, streams: list):
        """One selection per corrected slot (KernelConfig.pool_select_overlap), dealt round-robin
        over the forked side streams, each recording an event its slot's scoring kernel waits on;
        inline without streams. -> (per-slot (vals [B, P], ids [B, P]), events (empty inline))."""
        rows, ready = [], []
        for c in range(base.shape[1] - pure):
            with torch.cuda.stream(streams[c % len(streams)]) if streams else contextlib.nullcontext():
                vals, ids = self._select(tr, base[:, pure + c: pure + c + 1], pool)
                if streams:
                    ready.append(_recorded_event())
            rows.append((vals[:, 0], ids[:, 0]))
        return rows, ready

    def _fork(self, device) -> list:
        """KernelConfig.pool_select_overlap side streams, each made to wait for the current stream
        (in a graph capture this joins them to it); [] off CUDA, where the work runs inline.

        Streams are created once per device (outside any capture: the graph's warm-up runs the body
        before capturing it) and reused. No record_stream is needed for what they allocate and the
        current stream reads (the candidates): every call forks them from the current stream first,
        so a side stream reuses a freed block only after the reads that preceded the fork."""
        if device.type != "cuda" or _interpreting():
            return []
        n = self.config.pool_select_overlap
        if (device, n) not in self._streams:  # (not setdefault: that would create streams at every call)
            self._streams[(device, n)] = [torch.cuda.Stream(device=device) for _ in range(n)]
        streams = self._streams[(device, n)]
        for stream in streams:
            stream.wait_stream(torch.cuda.current_stream(device))
        return streams

    def _use_pdl(self, device, sampling: bool) -> bool:
        # greedy only: sampling puts PyTorch ops between the kernels
        return (self.config.pdl and not sampling and device.type == "cuda" and not _interpreting()
                and torch.cuda.get_device_capability(device)[0] >= 9)

    def _use_persistent(self, device, bsz: int, sampling: bool) -> bool:
        cfg = self.config
        # Under the interpreter programs run one after another, so a spin barrier with two programs
        # would deadlock; it runs with ONE program (`_pool_persistent`), whose barriers pass at once:
        # CI checks the kernel's steps there, the GPU its barriers.
        return (cfg.pool_persistent and not sampling and bsz <= cfg.pool_persistent_max_batch
                and (device.type == "cuda" or _interpreting()))

    def _pool_persistent(self, tr, prep, base, anchor, zacc, pool_vals, pool_ids, pure: int, sms: int):
        """Greedy pool drafts from one persistent launch (`triton_persistent`). Leaves its error flag in
        `self.persistent_error` (int32 [1], inside the graph's memory when graphed): non-zero means
        a grid barrier timed out and the drafts are void (the bench checks it)."""
        from . import triton_persistent as tp

        bsz, k, _ = base.shape
        g = prep.whh.shape[1]
        nprog, block_g = tp.persistent_programs(g, 1 if _interpreting() else sms)  # see _use_persistent
        draft = torch.empty(bsz, k, device=base.device, dtype=torch.int64)
        toks = torch.empty(bsz, pure + 1, device=base.device, dtype=torch.int64)
        toks[:, 0] = anchor
        if pure:  # pure slots: the plain base argmax (lowest id on ties), known before any GRU step
            draft[:, :pure] = base[:, :pure].argmax(-1)
            toks[:, 1:] = draft[:, :pure]
        states = torch.empty(k + 1, bsz, g, device=base.device, dtype=prep.whh.dtype)
        pval = torch.empty(k + 1, bsz, nprog, device=base.device, dtype=torch.float32)
        pidx = torch.empty(k + 1, bsz, nprog, device=base.device, dtype=torch.int32)
        sync = torch.zeros(2, device=base.device, dtype=torch.int32)  # [barrier counter, error flag]
        tp.pool_rollout_persistent(toks=toks, table=prep.table, whh=prep.whh, w1b=prep.w1b, w2=prep.w2,
                                   ids=pool_ids, vals=pool_vals, zacc=zacc, states=states, pval=pval, pidx=pidx,
                                   draft=draft, bar=sync[0:1], err=sync[1:2], pure=pure, block_g=block_g,
                                   block_p=self.config.pool_block_p, barrier=self.config.pool_persistent_barrier,
                                   whh_resident=self.config.pool_persistent_whh_resident)
        self.persistent_error = sync[1:2]
        return draft

    @classmethod
    def _sample_slot(cls, logits, temperature, top_k, top_p, uniforms, q, tok, j):
        """Draw slot j from the warped logits [B, V] over the full vocabulary and record q_j: in two
        launches (`sample_logits`) where the warp is a temperature alone and SAMPLE_LOGITS is on (the
        default), else the torch warp and draw."""
        if SAMPLE_LOGITS:
            from . import sample_logits as kernel

            if kernel.fits(temperature, top_k, top_p, logits):
                kernel.sample_logits(logits, temperature, uniforms[:, j - 1], q[:, j - 1], tok[j - 1])
                return
        cls._sample(filtered_probs(logits, temperature, top_k, top_p), None, uniforms, q, tok, j)

    @staticmethod
    def _sample(probs, ids, uniforms, q, tok, j):
        """Draw slot j from probs (over the pool when ids is given) and record q_j densely."""
        pos = _draw(probs, uniforms[:, j - 1])
        if ids is None:
            q[:, j - 1] = probs
            tok[j - 1] = pos
        else:
            q[:, j - 1].zero_()
            q[:, j - 1].scatter_(-1, ids, probs)
            tok[j - 1] = ids.gather(-1, pos[:, None]).squeeze(-1)


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw a row of probs [N, M] from uniforms u [N]: `inverse_cdf`'s rule, through the Triton
    `sample_rows` where SAMPLE_ROWS is on and it can run."""
    if SAMPLE_ROWS and (probs.is_cuda or _interpreting()):
        from . import sample_rows as kernel

        if kernel.supported(probs):
            return kernel.sample_rows(probs, u)
    return inverse_cdf(probs, u)


def _recorded_event() -> "torch.cuda.Event":
    """An event recorded on the current stream (inside a capture: a dependency the graph keeps)."""
    event = torch.cuda.Event()
    event.record()
    return event


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pool_candidates(base: torch.Tensor, pool: int, method: str = "topk", chunks: int = 8):
    """The top-`pool` entries of base [..., V] along the last dim: (values, ids), unsorted
    ("bucket": the approximate bucket maxima of `reference.bucket_candidates`, values fp32).

    "topk2" is exact too: every global top-`pool` entry is in the top-`pool` of its chunk. It
    trades one long radix select per row for `chunks` shorter ones plus one over their union.
    Ties at the boundary are resolved as torch.topk resolves them (unspecified).
    """
    vocab = base.shape[-1]
    if method == "block_shared":  # not a per-row selection: one pool for a block's slots
        raise ValueError("pool_candidates: 'block_shared' selects one pool per block; use reference.block_shared_ids")
    if method == "bucket":
        return bucket_candidates(base, pool)
    if method == "radix":
        return radix_candidates(base, pool)
    if method == "sort":  # one segmented radix sort (cub) instead of a radix select per row
        vals, ids = torch.sort(base, dim=-1, descending=True)
        return vals[..., :pool], ids[..., :pool]
    size = triton_cdiv(vocab, chunks)
    if method == "topk" or size < 2 * pool:
        top = torch.topk(base, pool, dim=-1, sorted=False)
        return top.values, top.indices
    if method != "topk2":
        raise ValueError(f"pool_select {method!r}: valid: {', '.join(POOL_SELECTS)}")
    n_full = vocab // size
    head = base[..., : n_full * size].unflatten(-1, (n_full, size))
    top = torch.topk(head, pool, dim=-1, sorted=False)
    offsets = torch.arange(n_full, device=base.device)[:, None] * size
    vals, ids = [top.values.flatten(-2)], [(top.indices + offsets).flatten(-2)]
    if n_full * size < vocab:  # the ragged tail (shorter than a chunk): keep all of it
        tail = base[..., n_full * size:]
        vals.append(tail)
        ids.append(torch.arange(n_full * size, vocab, device=base.device).expand(tail.shape))
    vals, ids = torch.cat(vals, -1), torch.cat(ids, -1)
    top = torch.topk(vals, pool, dim=-1, sorted=False)
    return top.values, ids.gather(-1, top.indices)


def make_rollout(name: str, head, embedding_weight: Optional[torch.Tensor] = None, *, pool_size: int = 2048,
                 cuda_graphs: bool = True, config: Optional[KernelConfig] = None):
    """Build a rollout callable by name ("torch" | "triton" | "triton_pool"); see the module docstring.

    embedding_weight [V, E] is the table the GRU reads (e.g. the target's input embedding, for drafters that reuse it);
    without it the fused path builds its table from `embed(arange(V))` at the first call.
    pool_size only applies to "triton_pool" (0 = full vocabulary).
    """
    if name not in ROLLOUTS:
        raise ValueError(f"unknown rollout {name!r}; valid: {', '.join(ROLLOUTS)}")
    return ROLLOUTS[name](head, embedding_weight, pool_size=pool_size, cuda_graphs=cuda_graphs, config=config)


def _torch(head, embedding_weight=None, **_):
    """The eager reference, used as it is: it keeps no state per head, so it is not built."""
    return reference_rollout


def _triton(head, embedding_weight=None, *, cuda_graphs=True, config=None, **_):
    return FusedRollout(head, embedding_weight, pool_size=0, cuda_graphs=cuda_graphs, config=config)


def _triton_pool(head, embedding_weight=None, *, pool_size=2048, cuda_graphs=True, config=None):
    return FusedRollout(head, embedding_weight, pool_size=pool_size, cuda_graphs=cuda_graphs, config=config)


# The one rollout registry: name -> builder(head, embedding_weight, *, pool_size, cuda_graphs, config)
# -> a callable with the decoding signature. `make_rollout` and `domino_graft.decoding.get_rollout`
# both read it, so "torch" is one thing everywhere: reference.reference_rollout, the eager reference
# every kernel is tested against. Plug-ins add names with decoding.register_rollout.
ROLLOUTS: dict[str, Callable] = {"torch": _torch, "triton": _triton, "triton_pool": _triton_pool}
ROLLOUT_NAMES = tuple(ROLLOUTS)  # the built-in names (the recipe's `bench.head_kernel` choices)
