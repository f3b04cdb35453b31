"""CUDA-graph replay of the fast forward at fixed shapes.

One graph per (B, T, kv_len bucket, logits_to_keep), captured on first use and replayed
afterwards: the decode step (T=1) and the verify step (T=K+1) each get one per bucket. The
graph reads its ids and positions from static device buffers, so one capture serves every
position; K/V land in the FastLM's static cache and the cache's device lengths advance
inside the graph (``lengths = pos + T``). Attention reads the first ``kv_len`` cache
positions, where kv_len is ``max(pos) + T`` rounded up to ``kv_block`` (the host knows the
positions: it chose them, or the cache's host mirror holds them).

On a CPU (or with ``use_graphs=False``) the same calls run the forward eagerly, with the same
buckets, so tests exercise this code path.

Outputs (logits, captured hidden states) are the graph's static tensors: valid until the
next call of this runner; clone what must outlive it.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from .llama import FastLM, Pos


def round_up_pow2(length: int, start: int = 256) -> int:
    """The static size for `length` positions: powers of two from `start`, so that a slightly
    longer decode reuses the buffers (and the graphs captured over them)."""
    size = start
    while size < length:
        size *= 2
    return size


# attention reads the first kv_len cache positions, kv_len = the step's end rounded up to this: one graph
# per (shape, bucket) for the target (GraphRunner) and the static drafters alike
KV_BLOCK = 256


def kv_bucket(end: int, max_len: int, block: int = KV_BLOCK) -> int:
    """The attention bucket of a step ending at position `end` (exclusive): `end` rounded up to
    `block`, at most the cache's max_len."""
    return min(max_len, -(-int(end) // block) * block)


def prefill_length(n: int, max_len: int, start: int = 16) -> int:
    """The length a prompt of n tokens is right-padded to for a graphed prefill: powers of two
    from `start` (a few shapes, each compiled and captured once), at most the cache's max_len."""
    if n > max_len:
        raise ValueError(f"prompt of {n} tokens > the cache's {max_len} positions")
    return min(round_up_pow2(n, start), max_len)


def host_ints(position, b: int) -> list[int]:
    """Each of b rows' positions as host ints, from one int (every row's), B ints or a tensor
    (a device tensor syncs: pass host values on hot paths). Static drafters key graphs by them."""
    if torch.is_tensor(position):
        position = position.tolist()
    if not isinstance(position, (list, tuple)):
        return [int(position)] * b
    host = [int(p) for p in position]
    if len(host) != b:
        raise ValueError(f"{len(host)} positions for a batch of {b} rows")
    return host


_CAPTURED = [0]  # graphs capture_graph captured in this process (graphs_captured)


def graphs_captured() -> int:
    """How many CUDA graphs `capture_graph` has captured in this process (the target's and the static
    drafters'): a timed pass that captures one met a shape its warm-up did not (bench/concurrency.py)."""
    return _CAPTURED[0]


def capture_graph(fn, warmup: int, pool=None):
    """(graph, outputs) of `fn()` captured as a CUDA graph, after `warmup` eager runs on a side
    stream (cuBLAS workspaces, torch.compile); `fn` must read only static buffers. pool: a
    `torch.cuda.graph_pool_handle()` the graph shares with others (default: a private pool)."""
    _CAPTURED[0] += 1
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn()
    return graph, outputs


class _Captured:
    def __init__(self, graph, ids, pos, logits, hidden):
        self.graph, self.ids, self.pos, self.logits, self.hidden = graph, ids, pos, logits, hidden


class GraphRunner:
    def __init__(self, lm: FastLM, *, capture: Iterable[int] = (), use_graphs: Optional[bool] = None,
                 kv_block: int = KV_BLOCK, warmup: int = 2):
        self.lm = lm
        self.capture = tuple(capture)
        self.use_graphs = (lm.device.type == "cuda") if use_graphs is None else bool(use_graphs)
        if self.use_graphs and lm.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA model")
        self.kv_block = int(kv_block)
        self.warmup = int(warmup)
        self.graphs: dict[tuple, _Captured] = {}
        self.captures = 0  # how many graphs were captured (a test checks replay, not recapture)
        self._pool = None  # the `pooled` graphs' one memory pool

    def bucket(self, end: Optional[int]) -> int:
        if end is None:
            return self.lm.max_len
        return kv_bucket(end, self.lm.max_len, self.kv_block)

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, pos: Pos = None, *, logits_to_keep: int = 0, pooled: bool = False):
        """Like ``FastLM.forward(ids, pos)``; pos None = the cache's lengths. pooled: for a caller that copies what
        it needs of the outputs before any other graph of this runner replays (decoding/session.py's prefills):
        such graphs share one memory pool for their intermediates, which then cost the largest graph's, not
        their sum (`capture_graph`'s pool; a pool's graph may overwrite what another left there)."""
        lm = self.lm
        b, t = ids.shape
        host = lm.host_positions(pos, b)
        if host is not None:
            end = max(host) + t
            if min(host) < 0 or end > lm.max_len:
                raise ValueError(f"positions {min(host)}..{end - 1} outside the cache (max_len {lm.max_len})")
        kv_len = self.bucket(None if host is None else max(host) + t)
        if not self.use_graphs:
            return lm.forward(ids, pos, capture=self.capture, kv_len=kv_len, logits_to_keep=logits_to_keep)
        key = (b, t, kv_len, int(logits_to_keep), bool(pooled))
        g = self.graphs.get(key)
        fresh = g is None
        if fresh:
            g = _Captured(None, torch.zeros((b, t), dtype=torch.long, device=lm.device),
                          torch.zeros((b,), dtype=torch.long, device=lm.device), None, None)
        g.ids.copy_(ids, non_blocking=True)
        if pos is None:
            g.pos.copy_(lm.cache.lengths[:b])
        elif isinstance(pos, torch.Tensor):
            g.pos.copy_(pos.to(torch.long).expand(b) if pos.dim() == 0 else pos, non_blocking=True)
        elif isinstance(pos, int):
            g.pos.fill_(pos)
        else:
            g.pos.copy_(torch.tensor(host, dtype=torch.long), non_blocking=True)
        if fresh:
            self._capture(g, kv_len, int(logits_to_keep), self._pooled() if pooled else None)
            self.graphs[key] = g
        g.graph.replay()
        cache = lm.cache
        if host is not None and cache.host_lengths is not None:
            cache.host_lengths[:b] = [p + t for p in host]
        else:
            cache.host_lengths = None
        return g.logits, g.hidden

    @torch.no_grad()
    def prime(self, b: int, t: int, kv_len: int, logits_to_keep: int = 0) -> bool:
        """Capture the graph of (b, t, kv_len, logits_to_keep) now, if it is not yet, so that no step
        captures it later (a capture inside a timed decode costs its warm-up runs). Its runs write K/V at
        positions 0..t-1 of rows 0..b-1 and their lengths: prime only where those entries are rewritten
        before anything reads them (before a prefill of at least b rows). -> whether it captured."""
        key = (b, t, int(kv_len), int(logits_to_keep), False)
        if not self.use_graphs or key in self.graphs:
            return False
        dev = self.lm.device
        g = _Captured(None, torch.zeros((b, t), dtype=torch.long, device=dev), torch.zeros((b,), dtype=torch.long, device=dev),
                      None, None)
        self._capture(g, int(kv_len), int(logits_to_keep))
        self.graphs[key] = g
        return True

    def _pooled(self):
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def _capture(self, g: _Captured, kv_len: int, keep: int, pool=None) -> None:
        lm = self.lm
        # Warm-up runs (cuBLAS workspaces, torch.compile) compute exactly the step about to be
        # replayed, from the same buffers: their K/V writes and length update are idempotent.
        host_mirror = None if lm.cache.host_lengths is None else list(lm.cache.host_lengths)
        graph, (logits, hidden) = capture_graph(
            lambda: lm.forward(g.ids, g.pos, capture=self.capture, kv_len=kv_len, logits_to_keep=keep), self.warmup,
            pool)
        lm.cache.host_lengths = host_mirror
        g.graph, g.logits, g.hidden = graph, logits, hidden
        self.captures += 1


class CapturedCall:
    """Any function of tensors replayed as one CUDA graph over static input buffers.

    ``fn(*inputs)`` must be shape-static: the first call copies the inputs into buffers owned
    here, warms ``fn`` up on a side stream, captures it, and every call replays the graph after
    copying its arguments in (no host sync). Side effects ``fn`` has on tensors it closes over
    (a cache write at a position read from an input) happen at replay, as they would eagerly;
    the warm-up runs compute exactly the step being captured, so repeating its writes is
    harmless. The outputs are the graph's static tensors, valid until the next call.

    ``use_graphs=False`` (and any CPU input) calls ``fn`` directly: the same code runs eagerly.

    ``pool`` (a `torch.cuda.graph_pool_handle()`): one memory pool for several calls' intermediates, which
    then cost their largest graph's, not their sum (by default each graph keeps a private pool of its
    peak for as long as it lives). Only for calls whose outputs nobody reads (a replay of one may
    overwrite another's) and that replay on one stream."""

    def __init__(self, fn, *, use_graphs: bool = True, warmup: int = 2, pool=None):
        self.fn, self.use_graphs, self.warmup, self.pool = fn, bool(use_graphs), int(warmup), pool
        self.graph = None
        self.inputs: tuple[torch.Tensor, ...] = ()
        self.outputs = None

    @torch.no_grad()
    def __call__(self, *args: torch.Tensor):
        if not self.use_graphs or args[0].device.type != "cuda":
            return self.fn(*args)
        if self.graph is None:
            self.inputs = tuple(a.clone() for a in args)
            self.graph, self.outputs = capture_graph(lambda: self.fn(*self.inputs), self.warmup, self.pool)
        else:
            for buf, a in zip(self.inputs, args):
                buf.copy_(a, non_blocking=True)
        self.graph.replay()
        return self.outputs
