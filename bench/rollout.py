"""Domino-head rollout latency on one GPU (op: domino_rollout; kernels in kernels/head/triton_rollout.py).

Run from the repository root (the package need not be installed; imports torch, triton and
domino_graft.head / domino_graft.kernels only):

    PYTHONPATH=. python bench/rollout.py --out bench/results/head_latency_h200.json
    PYTHONPATH=. python bench/rollout.py --sweep --out OUT.json   # retune the launch constants first

For each shape (Qwen3-8B: H=4096, G=1024, r=256, V=151936, block 16 -> K=15 proposals;
SmolLM2-135M: H=576, G=256, r=64, V=49152, with the head and block size of
recipes/smollm2_dflash.yaml when it exists (block 8 -> K=7), and again with K=15), pure_prefix_len=1,
bf16, random non-zero weights, and batch 1/4/16/32, it times the head alone
(the base LM head is outside; `base_lm_head_ms` gives it for Qwen3-8B):

  eager_reference_ms  SpecForge-style loop: at every slot re-run the GRU over the whole prefix and
                      the full projection for every slot so far
  eager_ms            incremental: one DominoHead.step per slot (GRUCell + W1 + W2 + add + argmax)
  graph_ms            the same, captured in a CUDA graph
  fused_full_ms       make_rollout("triton"): fused kernels, full vocabulary, exact, CUDA graph
  *_copy_ms           graph_ms / fused_full_ms with the inputs alternating between two buffer sets,
                      so every call copies them into the graph's static buffers; the plain keys
                      pass the same buffers at every call, which the graph then reads in place
                      (CudaGraphRollout), as with a drafter writing into static output buffers
  fused_pool_ms       make_rollout("triton_pool", pool_size=2048), CUDA graph, with the configured
                      candidate selection (KernelConfig.pool_select, --pool-select); also per
                      method: fused_pool_bucket_ms (approximate, one launch) and
                      fused_pool_exact_ms (the fastest exact top-k of the pool_select sweep),
                      with the bucket pool's recall of the exact top-2048 / top-32; and
                      fused_pool_radix_ms (KernelConfig.pool_select="radix": the Triton radix
                      select, exact top-k on bf16 logits) with pool_radix_recall_top2048
  pool_select_only_us the candidate selection alone, per method {topk, bucket, radix} (batch 1 and 4
                      only): captured 20 times in one CUDA graph, unflushed, with each pool's
                      recall of the exact top-2048 (pool_select_only_recall_vs_exact_top) and
                      whether the Triton radix select equals its PyTorch definition
                      (pool_select_only_radix_matches_reference); "radix_sweep" (top level) times
                      radix_select's (block, warps) at Qwen3-8B shapes and picks the best
  *_replay_ms         graph replay alone (the drop-in call adds a copy of the inputs into the
                      graph's static buffers: [B, K, V] base logits)

each the median of per-call CUDA-event timings after warm-up, with the L2 flushed (a 256 MB
write, outside the timed events, as triton.testing.do_bench does) before every repetition: in
decoding the target's forward runs between two rollouts, so no rollout finds the previous one's
weights in L2. (The single-kernel sweeps replay one kernel back to back, unflushed, except
l2_reuse_sweep, which times whole rollouts.) The table times KernelConfig() as shipped. `--sweep`
first sweeps the launch constants on this GPU (w2_sweep, gru_sweep, pool_sweep, pool_select_sweep,
radix_sweep, l2_reuse_sweep: the sweeps that chose the shipped values on the H200) and times the
table with the fastest of each; single-kernel sweeps can pick a config that ties alone and is
slower in a whole rollout, so compare against a run without it. The result file records the
config used ("kernel_config"). Floors:

  floor_full_ms  = K x bytes(W2 + W1 + W_ih + W_hh) / read_bw    (the unfused full-vocabulary head
                   reads every weight once per proposal; DESIGN §6)
  floor_fused_ms = [(K - pure) x (bytes(W2) + B·V·2)  +  K x bytes(W_hh + W1b)  +  bytes(W1a)] / read_bw
                   (what the fused path must read: W2 and the base row per corrected slot, the
                   recurrent weights per step, W1a once; table rows and states are negligible)

read_bw is measured here: a sum over a 4 GiB bf16 tensor of random values (bytes read / time).

`--smoke` runs everything (the sweeps too) at a tiny shape on the CPU (Triton interpreter, fp32,
no CUDA graphs) in about a minute, to catch Python errors before a GPU run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.util
import itertools
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _import_kernels():
    try:
        import domino_graft.kernels as k

        return k
    except ImportError:  # uninstalled checkout: map kernels/ into the namespace as pyproject does
        spec = importlib.util.spec_from_file_location(
            "domino_graft.kernels", REPO / "kernels" / "__init__.py", submodule_search_locations=[str(REPO / "kernels")]
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules["domino_graft.kernels"] = mod
        spec.loader.exec_module(mod)
        return mod


K = _import_kernels().head  # the Domino head's kernels: make_rollout, reference, domino_rollout, head_ce, ...
from domino_graft.head import DominoHead, HeadSpec  # noqa: E402
from domino_graft.artifacts.provenance import git_sha  # noqa: E402

DEV = "cuda"
DT = torch.bfloat16
POOL = 2048  # SGLang's merged default
L2_FLUSH_BYTES = 256 * 2**20  # > 4x the H200's L2


@dataclass
class Block:
    hidden: torch.Tensor
    base_logits: torch.Tensor


def smollm2_dims() -> dict:
    dims = dict(h=576, g=256, r=64, v=49152, k=15)
    recipe = REPO / "recipes" / "smollm2_dflash.yaml"
    if recipe.exists():
        try:
            import yaml

            data = yaml.safe_load(recipe.read_text())
            head = data.get("head") or {}
            dims["g"] = int(head.get("gru_hidden_dim", dims["g"]))
            dims["r"] = int(head.get("rank", dims["r"]))
            bs = (data.get("drafter") or {}).get("block_size")
            if bs:
                dims["k"] = int(bs) - 1
            dims["source"] = str(recipe.relative_to(REPO))
        except Exception as exc:  # the defaults above are the recipe's documented values
            dims["source"] = f"defaults ({exc})"
    else:
        dims["source"] = "defaults (recipes/smollm2_dflash.yaml absent)"
    return dims


SHAPES = {
    "qwen3_8b": dict(h=4096, g=1024, r=256, v=151936, k=15, source="DESIGN §1"),
}
SMOKE_SHAPE = dict(h=32, g=24, r=16, v=1013, k=5, source="--smoke (tiny, CPU interpreter)")


def use_smoke_mode() -> None:
    """--smoke: the CPU, Triton's interpreter (set before triton is imported), fp32 (the
    interpreter cannot do bf16 dots), a pool small enough to be a pool at V=1013."""
    global DEV, DT, POOL
    import os

    os.environ["TRITON_INTERPRET"] = "1"
    DEV, DT, POOL = "cpu", torch.float32, 64


def on_gpu() -> bool:
    return DEV == "cuda"


def sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if on_gpu() else 2


# ----------------------------------------------------------------------------- timing


_FLUSH: dict = {}


def flush_l2() -> None:
    """Evict the L2: write a buffer several times its size (what triton.testing.do_bench does)."""
    if "buf" not in _FLUSH:
        _FLUSH["buf"] = torch.empty(L2_FLUSH_BYTES // 4, device=DEV, dtype=torch.int32)
    _FLUSH["buf"].zero_()


def time_ms(fn, *, warmup=5, iters=50, flush=True) -> float:
    """Median of per-call CUDA-event timings (no sync between calls); with `flush`, the L2 is
    flushed before every timed call, outside its events."""
    if not on_gpu():  # --smoke: the interpreter, a couple of wall-clock calls
        return _time_cpu_ms(fn, iters=min(iters, 2))
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in ev:
        if flush:
            flush_l2()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def _time_cpu_ms(fn, iters=2) -> float:
    fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def time_graphed_ms(fn, *, reps=20, iters=30) -> float:
    """Per-call time of `fn` captured `reps` times in one CUDA graph (launch gaps of a graph),
    back to back, without an L2 flush between calls."""
    if not on_gpu():
        return _time_cpu_ms(fn)
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return time_ms(g.replay, warmup=3, iters=iters, flush=False) / reps


def bandwidth() -> dict:
    n = 2**31 if on_gpu() else 2**16  # 4 GiB of bf16, far beyond the 60 MB L2
    x = torch.randn(n, device=DEV, dtype=DT)
    t_sum = time_ms(lambda: x.sum(), warmup=3, iters=20, flush=False)
    y = torch.empty_like(x)
    t_copy = time_ms(lambda: y.copy_(x), warmup=3, iters=20, flush=False)
    out = dict(read_bw_gbps=x.numel() * 2 / t_sum / 1e6, copy_bw_gbps=2 * x.numel() * 2 / t_copy / 1e6,
               read_probe="torch.sum over 4 GiB bf16 (random)", copy_probe="copy_ of 4 GiB bf16, read+write counted")
    del x, y
    empty_cache()
    return out


def empty_cache() -> None:
    gc.collect()  # rollouts are reference cycles (FusedRollout -> CudaGraphRollout -> bound _body): free them now
    if on_gpu():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- problem


def make_problem(d: dict, batch: int, seed: int = 0):
    spec = HeadSpec(hidden_dim=d["h"], emb_dim=d["h"], gru_hidden_dim=d["g"], rank=d["r"], vocab_size=d["v"],
                    pure_prefix_len=1)
    gen = torch.Generator(DEV).manual_seed(seed)
    with torch.device(DEV):
        head = DominoHead(spec, zero_init_w2=False)
    with torch.no_grad():
        for p in head.parameters():  # unit-variance pre-activations: the correction matters
            p.copy_(torch.randn(p.shape, device=DEV, generator=gen) / p.shape[-1] ** 0.5)
    head = head.to(DT)
    emb = (torch.randn(d["v"], d["h"], device=DEV, generator=gen) * 0.02).to(DT)
    return head, emb


def make_block(d: dict, batch: int, seed: int = 1):
    gen = torch.Generator(DEV).manual_seed(seed)
    hidden = torch.randn(batch, d["k"], d["h"], device=DEV, generator=gen).to(DT)
    base = (torch.randn(batch, d["k"], d["v"], device=DEV, generator=gen) * 2).to(DT)
    anchor = torch.randint(0, d["v"], (batch,), device=DEV, generator=gen)
    return Block(hidden, base), anchor


_GRU_IMPL = {"used": "nn.GRU"}


def _prefix_states(head, emb):
    """nn.GRU over the whole prefix (what SpecForge calls); a GRUCell loop if cuDNN refuses bf16."""
    if _GRU_IMPL["used"] == "nn.GRU":
        try:
            return head.prefix_gru(emb)[0]
        except Exception as exc:
            _GRU_IMPL["used"] = f"gru_cell loop ({type(exc).__name__}: {str(exc)[:120]})"
    h = torch.zeros(emb.shape[0], head.spec.gru_hidden_dim, device=emb.device, dtype=emb.dtype)
    out = []
    for t in range(emb.shape[1]):
        h = torch.gru_cell(emb[:, t], h, head.prefix_gru.weight_ih_l0, head.prefix_gru.weight_hh_l0, None, None)
        out.append(h)
    return torch.stack(out, 1)


@torch.no_grad()
def specforge_rollout(head, block, anchor, embed):
    """The reference sampling loop: every slot re-runs the GRU and the projection over the prefix."""
    hidden, base = block.hidden, block.base_logits
    _, k, _ = base.shape
    corrected = head.corrected_slots(k, base.device)
    prefix = anchor[:, None]
    for j in range(1, k + 1):
        states = _prefix_states(head, embed(prefix))
        feats = F.silu(head.embed_proj[0](torch.cat([hidden[:, :j], states], dim=-1)))
        logits = base[:, :j] + head.embed_proj[2](feats) * corrected[:j, None]
        prefix = torch.cat([prefix, logits[:, -1].argmax(-1)[:, None]], dim=1)
    return prefix[:, 1:], None


def weight_bytes(head) -> dict:
    nb = lambda t: t.numel() * t.element_size()  # noqa: E731
    return dict(w2=nb(head.embed_proj[2].weight), w1=nb(head.embed_proj[0].weight),
                w_ih=nb(head.prefix_gru.weight_ih_l0), w_hh=nb(head.prefix_gru.weight_hh_l0))


# ----------------------------------------------------------------------------- sweeps


def sweep_w2(d: dict, head, batches=(1, 32)) -> list[dict]:
    """Standalone w2_argmax (one corrected slot, with the next step's W_hh·S programs, as in the
    rollout) over launch configs; gbps = (W2 + base row + W_hh) / t."""
    from domino_graft.kernels.head import triton_rollout as tr

    sms = sm_count()
    w2 = head.embed_proj[2].weight.detach().contiguous()
    whh = head.prefix_gru.weight_hh_l0.detach().contiguous()
    v, r = w2.shape
    rows = []
    # run 1 (no W_hh programs): (64, 256, 4, 3, 2) 24.1 us > (128, 256, 8, 3, 1) 26.7 > (128, 256, 8, 2, 1) 27.2
    # run 2 (with them), batch 1: (64, 256, 4, 3, 2) 25.8 us > (128, 256, 8, 3, 1) 27.9 > (64, 256, 8, 3, 2) 28.2 >
    # (64, 256, 4, 5, 1) 33.3 > (32, 256, 4, 4, 2) 34.7 > (64, 128, 4, 4, 2) 35.2; batch 32: (128, 256, 8, 3, 1) 36.1
    configs = [  # (block_v, block_r, warps, stages, programs per SM)
        (64, 256, 4, 3, 2), (128, 256, 8, 3, 1), (64, 256, 4, 2, 2), (64, 256, 4, 2, 3), (128, 256, 8, 2, 1),
        (128, 256, 4, 3, 1),
    ]
    for b in batches:
        base = (torch.randn(b, v, device=DEV) * 2).to(DT)
        zacc = torch.randn(b, r, device=DEV)
        h = torch.randn(b, d["g"], device=DEV).to(DT)
        gh = torch.empty(b, 3 * d["g"], device=DEV)
        for bv, br, nw, st, pps in configs:
            np_ = tr.w2_programs(v, bv, pps * sms)
            pval = torch.empty(b, np_, device=DEV)
            pidx = torch.empty(b, np_, device=DEV, dtype=torch.int32)
            fn = lambda: tr.w2_argmax(base=base, zacc=zacc, w2=w2, pval=pval, pidx=pidx, block_v=bv,  # noqa: E731
                                      block_r=br, num_warps=nw, num_stages=st, gh=(h, whh, gh))
            row = dict(batch=b, block_v=bv, block_r=br, warps=nw, stages=st, programs_per_sm=pps)
            try:
                t = time_graphed_ms(fn, reps=10)
                row.update(ms=t, gbps=(w2.numel() * 2 + base.numel() * 2 + whh.numel() * 2) / t / 1e6)
            except Exception as exc:
                row.update(error=repr(exc)[:300])
            rows.append(row)
            print("w2_sweep", row, flush=True)
    return rows


def sweep_gru(d: dict, head, emb, batch=1) -> list[dict]:
    """gru_step as in the rollout: token from the previous slot's partials, W_hh·S precomputed."""
    from domino_graft.kernels.head import triton_rollout as tr

    sms = sm_count()
    table = K.build_gru_table(emb, head.prefix_gru.weight_ih_l0.detach())
    w1b = head.embed_proj[0].weight.detach()[:, d["h"]:].contiguous()
    g = d["g"]
    h_prev = torch.randn(batch, g, device=DEV).to(DT)
    h_out = torch.empty_like(h_prev)
    gh = torch.randn(batch, 3 * g, device=DEV)
    np_ = 2 * sms
    pval = torch.randn(batch, np_, device=DEV)
    pidx = torch.randint(0, d["v"], (batch, np_), device=DEV, dtype=torch.int32)
    draft = torch.empty(batch, 15, device=DEV, dtype=torch.int64)
    zacc = torch.zeros(batch, d["r"], device=DEV)
    rows = []
    for bg in (16, 32, 64):
        fn = lambda: tr.gru_step(table=table, gh=gh, h_prev=h_prev, h_out=h_out, partials=(pval, pidx),  # noqa: E731
                                 draft=draft, draft_col=3, w1b=w1b, zacc=zacc, block_g=bg)
        rows.append(timed_row("gru_sweep", dict(batch=batch, block_g=bg, partials=np_), fn, reps=15))
    return rows


def timed_row(sweep: str, row: dict, fn, reps: int) -> dict:
    """row + us (graphed time of fn, `time_graphed_ms`) or error; printed under the sweep's name."""
    try:
        row.update(us=1000 * time_graphed_ms(fn, reps=reps))
    except Exception as exc:
        row.update(error=repr(exc)[:300])
    print(sweep, row, flush=True)
    return row


def sweep_pool_select(d: dict, batches=(1, 32), pool=None) -> list[dict]:
    """Candidate selection for all corrected slots at once: torch.topk vs the exact two-stage top-k
    vs a full sort (exact), and the one-launch bucket maxima (approximate) at a few tile heights.
    Unflushed: in the rollout the base logits were just copied into the graph's buffers (L2-hot)."""
    from domino_graft.kernels.head import triton_rollout as tr

    pool = pool or POOL
    rows = []
    for b in batches:
        base = (torch.randn(b, d["k"] - 1, d["v"], device=DEV) * 2).to(DT)
        # run 2: topk 89 us (B=1) / 599 us (B=32); topk2 with 4/8/16 chunks slower at both
        for method, chunks in (("topk", 1), ("sort", 1), ("topk2", 4), ("bucket", 8), ("bucket", 16), ("bucket", 32)):
            if method == "bucket":  # chunks = buckets per program (block_p)
                fn = lambda: tr.bucket_max(base, pool, block_p=chunks)  # noqa: E731
            else:
                fn = lambda: K.domino_rollout.pool_candidates(base, pool, method, chunks)  # noqa: E731
            row = dict(batch=b, method=method, chunks=chunks)
            try:
                row.update(us=1000 * time_ms(fn, iters=30, flush=False))
            except Exception as exc:
                row.update(error=repr(exc)[:300])
            rows.append(row)
            print("pool_select_sweep", row, flush=True)
    return rows


SELECT_ONLY_BATCHES = (1, 4)


def _select_fns(base, pool: int, cfg) -> dict:
    """The pool candidate selections of the corrected slots' base logits base [B, K-1, V], alone."""
    from domino_graft.kernels.head import triton_rollout as tr

    return dict(
        topk=lambda: torch.topk(base, pool, dim=-1, sorted=False),
        bucket=lambda: tr.bucket_max(base, pool, block_p=cfg.pool_bucket_block_p),
        radix=lambda: tr.radix_select(base, pool, block=cfg.pool_radix_block, num_warps=cfg.pool_radix_warps),
    )


def pool_select_only(d: dict, b: int, cfg, pool: int) -> dict:
    """Each selection method alone on [B, K-1, V] bf16 base logits: per-call time captured 20 times in
    one CUDA graph (launch gaps of a graph, unflushed: in the rollout the logits were just copied in),
    and the recall of the exact top-`pool` (torch.topk) of each approximate-or-not pool."""
    base = (torch.randn(b, d["k"] - 1, d["v"], device=DEV) * 2).to(DT)
    out = dict(us={}, recall={})
    exact = torch.topk(base.float(), pool, dim=-1).indices
    for method, fn in _select_fns(base, pool, cfg).items():
        try:
            out["us"][method] = 1000 * time_graphed_ms(fn, reps=20)
            ids = fn()[1]
            member = torch.zeros(base.shape, dtype=torch.bool, device=base.device).scatter_(-1, ids, True)
            out["recall"][method] = float(member.gather(-1, exact).float().mean())
        except Exception as exc:
            out["us"][method] = None
            out.setdefault("errors", {})[method] = repr(exc)[:300]
    try:  # the Triton radix select against its PyTorch definition (same ids, same order)
        ids = _select_fns(base, pool, cfg)["radix"]()[1]
        out["radix_matches_reference"] = bool(torch.equal(ids, K.reference.radix_candidates(base, pool)[1]))
    except Exception as exc:
        out.setdefault("errors", {})["radix_reference"] = repr(exc)[:300]
    return out


def sweep_radix(d: dict, cfg, batches=(1, 4), pool=None) -> list[dict]:
    """radix_select alone (graphed, unflushed) over (V elements per program, warps)."""
    pool = pool or POOL
    rows = []
    for b in batches:
        base = (torch.randn(b, d["k"] - 1, d["v"], device=DEV) * 2).to(DT)
        for block, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16)):
            rcfg = dataclasses.replace(cfg, pool_radix_block=block, pool_radix_warps=warps)
            fn = _select_fns(base, pool, rcfg)["radix"]
            rows.append(timed_row("radix_sweep", dict(batch=b, block=block, warps=warps), fn, reps=20))
    return rows


def sweep_pool(d: dict, head, batches=(1,), pool=None) -> list[dict]:
    from domino_graft.kernels.head import triton_rollout as tr

    sms = sm_count()
    pool = pool or POOL
    w2 = head.embed_proj[2].weight.detach().contiguous()
    rows = []
    for b in batches:
        base = (torch.randn(b, d["v"], device=DEV) * 2).to(DT)
        top = torch.topk(base, pool, sorted=False)
        ids, vals = top.indices, top.values.float()
        zacc = torch.randn(b, d["r"], device=DEV)
        h = torch.randn(b, d["g"], device=DEV).to(DT)
        whh = head.prefix_gru.weight_hh_l0.detach().contiguous()
        gh = torch.empty(b, 3 * d["g"], device=DEV)
        # run 1 (no W_hh programs), batch 1: block 16: 2.86 us; 32 (2/SM): 3.30; 64: 3.27; 32 (4/SM, 2 warps): 3.27
        for bp, nw, pps in [(16, 4, 2), (16, 4, 4), (8, 4, 4), (32, 4, 2)]:
            np_ = max(1, min(math.ceil(pool / bp), math.ceil(pps * sms / b)))
            pval = torch.empty(b, np_, device=DEV)
            pidx = torch.empty(b, np_, device=DEV, dtype=torch.int32)
            fn = lambda: tr.pool_argmax(ids=ids, vals=vals, zacc=zacc, w2=w2, pval=pval, pidx=pidx,  # noqa: E731
                                        block_p=bp, num_warps=nw, gh=(h, whh, gh))
            rows.append(timed_row("pool_sweep", dict(batch=b, block_p=bp, warps=nw, programs_per_sm=pps), fn, reps=15))
    return rows


# (w2_zigzag, w2_stream, w2_l2_pin_fraction): the original streaming scan first (the reference
# for same_drafts_as_first), then the zig-zag with and without evict_first, then partial pinning
L2_REUSE_VARIANTS = ((False, True, 0.0), (True, False, 0.0), (True, True, 0.0), (False, False, 0.0),
                     (False, True, 0.3))


def sweep_l2_reuse(d: dict, head, emb, cfg, variants=L2_REUSE_VARIANTS, batch=1) -> list[dict]:
    """The full-vocabulary rollout (CUDA graph, L2 flushed before every call) under each way of
    getting W2 rows from L2 on the next corrected step: zig-zag scan order, eviction hints, partial
    pinning. None changes the arithmetic, so the drafts must equal the first variant's."""
    block, anchor = make_block(d, batch)
    embed = K.reference.dense_embed(emb)
    rows, first = [], None
    for zigzag, stream, frac in variants:
        row = dict(batch=batch, zigzag=zigzag, stream=stream, fraction=frac)
        try:
            var = dataclasses.replace(cfg, w2_zigzag=zigzag, w2_stream=stream, w2_l2_pin_fraction=frac)
            roll = K.make_rollout("triton", head, emb, config=var)
            ids, _ = roll(head, block, anchor, embed)
            first = ids if first is None else first
            row.update(ms=time_ms(lambda: roll(head, block, anchor, embed), iters=60),
                       same_drafts_as_first=bool(torch.equal(ids, first)))
            del roll
        except Exception as exc:
            row.update(error=repr(exc)[:300])
        rows.append(row)
        print("l2_reuse_sweep", row, flush=True)
        empty_cache()
    return rows


_POOL_SELECT: dict = {}  # batch -> {"pool_select", "pool_chunks"} of the fastest EXACT method, from the sweep


def pool_select_for(b: int) -> dict:
    """The fastest exact candidate selection measured at the nearest swept batch (1 or 32)."""
    if not _POOL_SELECT:
        return {}
    near = min(_POOL_SELECT, key=lambda x: abs(math.log2(x) - math.log2(b)))
    return _POOL_SELECT[near]


def best(rows, key, where=lambda r: True):
    ok = [r for r in rows if key in r and where(r)]
    return min(ok, key=lambda r: r[key]) if ok else None


# ----------------------------------------------------------------------------- main


def measure(name: str, d: dict, batches, bw: dict, cfg, errors: list) -> dict:
    out = dict(dims=d, batches={})
    head, emb = make_problem(d, 1)
    embed = K.reference.dense_embed(emb)
    wb = weight_bytes(head)
    k, pure = d["k"], 1
    full_bytes = k * sum(wb.values())
    out["weight_bytes"] = wb
    out["floor_full_formula"] = "K x (W2 + W1 + W_ih + W_hh) bytes / read_bw"
    floor_full = full_bytes / bw["read_bw_gbps"] / 1e6
    if name == "qwen3_8b":
        w_lm = (torch.randn(d["v"], d["h"], device=DEV) / 64).to(DT)
        x16 = torch.randn(16, d["h"], device=DEV).to(DT)
        out["base_lm_head_ms"] = time_ms(lambda: x16 @ w_lm.t(), iters=50)
        del w_lm
    torch_body = lambda hidden, base, anchor, u, t, tk, tp, uh: K.reference_rollout(  # noqa: E731
        head, Block(hidden, base), anchor, embed, temperature=t, top_k=tk, top_p=tp, use_head=uh, uniforms=u)
    for b in batches:
        row = dict(floor_full_ms=floor_full, read_bw_gbps=bw["read_bw_gbps"])
        block, anchor = make_block(d, b)
        # a second buffer set with the same contents: alternating the two defeats in-place reads
        alternate = [(block, anchor), (Block(block.hidden.clone(), block.base_logits.clone()), anchor.clone())]
        fused_bytes = ((k - pure) * (wb["w2"] + b * d["v"] * 2) + k * (wb["w_hh"] + d["r"] * d["g"] * 2)
                       + d["r"] * d["h"] * 2)
        row["floor_fused_ms"] = fused_bytes / bw["read_bw_gbps"] / 1e6
        slow_iters = 10 if b >= 16 else 20

        def run(key, fn, **kw):
            try:
                row[key] = time_ms(fn, **kw)
            except Exception:
                errors.append(f"{name} B={b} {key}: {traceback.format_exc(limit=3)}")
                print(errors[-1], flush=True)

        with torch.no_grad():
            ref_ids, _ = K.reference_rollout(head, block, anchor, embed)
            run("eager_reference_ms", lambda: specforge_rollout(head, block, anchor, embed), warmup=2, iters=slow_iters)
            try:
                sf_ids, _ = specforge_rollout(head, block, anchor, embed)
                row["specforge_agrees_with_eager"] = float((sf_ids == ref_ids).float().mean())
            except Exception:
                pass
            run("eager_ms", lambda: K.reference_rollout(head, block, anchor, embed), warmup=2, iters=slow_iters)
            if on_gpu():  # (--smoke: no CUDA graphs on the CPU)
                graphed = K.CudaGraphRollout(torch_body)
                run("graph_ms", lambda: graphed(block, anchor), iters=50)
                turn = itertools.count()
                run("graph_copy_ms", lambda: graphed(*alternate[next(turn) % 2]), iters=50)
                if graphed._graphs:
                    run("graph_replay_ms", next(iter(graphed._graphs.values())).graph.replay, iters=50)
                del graphed

            fused = K.make_rollout("triton", head, emb, config=cfg)
            run("fused_full_ms", lambda: fused(head, block, anchor, embed), iters=100)
            turn = itertools.count()
            run("fused_full_copy_ms", lambda: fused(head, *alternate[next(turn) % 2], embed), iters=100)
            if fused._graphs._graphs:
                run("fused_full_replay_ms", next(iter(fused._graphs._graphs.values())).graph.replay, iters=100)
            try:
                ids, _ = fused(head, block, anchor, embed)
                row["fused_full_token_agreement_vs_eager"] = float((ids == ref_ids).float().mean())
            except Exception:
                pass
            unfused_launch = K.make_rollout("triton", head, emb, config=cfg, cuda_graphs=False)
            run("fused_full_nograph_ms", lambda: unfused_launch(head, block, anchor, embed), iters=20)
            del fused, unfused_launch

            measure_pool(row, run, head, emb, block, anchor, ref_ids, cfg, b, min(POOL, d["v"]),
                         lambda what: errors.append(f"{name} B={b} {what}: {traceback.format_exc(limit=3)}"))
            if b in SELECT_ONLY_BATCHES:
                try:
                    sel = pool_select_only(d, b, cfg, min(POOL, d["v"]))
                    row["pool_select_only_us"] = sel["us"]
                    row["pool_select_only_recall_vs_exact_top"] = sel["recall"]
                    row["pool_select_only_radix_matches_reference"] = sel.get("radix_matches_reference")
                    if sel.get("errors"):
                        errors.append(f"{name} B={b} pool_select_only: {sel['errors']}")
                except Exception:
                    errors.append(f"{name} B={b} pool_select_only: {traceback.format_exc(limit=3)}")
        out["batches"][str(b)] = row
        print(name, b, {k2: (round(v, 4) if isinstance(v, float) else v) for k2, v in row.items()}, flush=True)
        del block
        empty_cache()
    return out


def pool_recall(base: torch.Tensor, pool: int, top: int, select: str = "bucket") -> float:
    """Mean fraction of each row's exact top-`top` base tokens that the `select` pool contains."""
    ids = K.reference.pool_ids(base, pool, select)
    member = torch.zeros(base.shape, dtype=torch.bool, device=base.device).scatter_(-1, ids, True)
    return float(member.gather(-1, torch.topk(base.float(), top, dim=-1).indices).float().mean())


def measure_pool(row: dict, run, head, emb, block, anchor, ref_ids, cfg, b: int, pool: int, on_error) -> None:
    """fused_pool_bucket_ms, fused_pool_radix_ms and fused_pool_exact_ms (the fastest exact
    selection of the sweep), their token agreement with the eager pool reference of the same
    selection and with the full-vocabulary eager rollout; fused_pool_ms (and the unprefixed
    agreement keys) repeat the configured method's (cfg.pool_select). Recall: the bucket and
    radix pools vs the exact top-k of the corrected slots' base logits."""
    embed = K.reference.dense_embed(emb)
    exact = dataclasses.replace(cfg, **pool_select_for(b))
    if exact.pool_select in ("bucket", "radix"):
        exact = dataclasses.replace(exact, pool_select="topk")
    variants = {"bucket": dataclasses.replace(cfg, pool_select="bucket"), "exact": exact,
                "radix": dataclasses.replace(cfg, pool_select="radix")}
    default = cfg.pool_select if cfg.pool_select in ("bucket", "radix") else "exact"
    for method, pcfg in variants.items():
        try:
            roll = K.make_rollout("triton_pool", head, emb, pool_size=pool, config=pcfg)
        except Exception:
            on_error(f"pool {method}")
            continue
        run(f"fused_pool_{method}_ms", lambda: roll(head, block, anchor, embed), iters=100)
        if roll._graphs._graphs:
            run(f"fused_pool_{method}_replay_ms", next(iter(roll._graphs._graphs.values())).graph.replay, iters=100)
        try:
            ids, _ = roll(head, block, anchor, embed)
            if getattr(roll, "persistent_error", None) is not None:  # the persistent launch ran (cfg.pool_persistent)
                row[f"pool_{method}_persistent_error_flag"] = int(roll.persistent_error.item())
            ref_pool, _ = K.reference_rollout(head, block, anchor, embed, pool_size=pool, pool_select=pcfg.pool_select)
            row[f"pool_{method}_token_agreement_vs_eager_pool"] = float((ids == ref_pool).float().mean())
            row[f"pool_{method}_token_agreement_vs_full_eager"] = float((ids == ref_ids).float().mean())
        except Exception:
            on_error(f"pool {method} agreement")
        del roll
    row["pool_exact_select"] = f"{exact.pool_select}/{exact.pool_chunks}"
    row["pool_select"] = default if default != "exact" else row["pool_exact_select"]
    for src, dst in ((f"fused_pool_{default}_ms", "fused_pool_ms"), (f"fused_pool_{default}_replay_ms", "fused_pool_replay_ms"),
                     (f"pool_{default}_token_agreement_vs_eager_pool", "fused_pool_token_agreement_vs_eager_pool"),
                     (f"pool_{default}_token_agreement_vs_full_eager", "pool_token_agreement_vs_full_eager")):
        if src in row:
            row[dst] = row[src]
    try:
        corrected = block.base_logits[:, 1:]
        row[f"pool_bucket_recall_top{pool}"] = pool_recall(corrected, pool, pool)
        row["pool_bucket_recall_top32"] = pool_recall(corrected, pool, min(32, pool))
        row[f"pool_radix_recall_top{pool}"] = pool_recall(corrected, pool, pool, "radix")
    except Exception:
        on_error("bucket/radix recall")


def peak_extra_bytes(fn, params=()) -> tuple[int, int]:
    """(peak bytes allocated beyond the baseline while `fn` ran, the baseline) on the CUDA caching
    allocator; the baseline is memory_allocated() right before the call, after
    reset_peak_memory_stats().

    Why head_ce.chunked_peak_extra_bytes read 0 (run of 2026-11-30; 804 MB the run before, same
    code): 0 means allocated memory never rose above the baseline during the call, which can only
    happen if something was freed during the call. The likely source: the rollouts timed before
    are reference cycles (FusedRollout -> CudaGraphRollout -> its bound _body), each holding its
    GRU table (0.93 GB at Qwen3-8B shapes) and graph pools until Python's cyclic gc runs; a
    collection triggered inside the call frees more than the chunked loss allocates (~0.8 GB),
    masking it (the dense loss, 3.7 GB, survives such a dip). So: the garbage is collected and the
    grads freed before the baseline is read, and gc stays off until the call ends."""
    for p in params:
        p.grad = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before, before
    finally:
        if was_enabled:
            gc.enable()


def head_ce_memory(errors: list) -> dict:
    """Peak extra GPU memory of the head loss, forward + backward, dense vs chunked (Qwen3-8B vocabulary)."""
    n, r, v = 2048, 256, 151936
    z = (torch.randn(n, r, device=DEV) / 4).to(DT).requires_grad_()
    w2 = (torch.randn(v, r, device=DEV) / 16).to(DT).requires_grad_()
    base = (torch.randn(n, v, device=DEV) * 2).to(DT)  # frozen backbone: no grad
    labels = torch.randint(0, v, (n,), device=DEV)
    out = dict(rows=n, rank=r, vocab=v, dtype="bf16", base_requires_grad=False)
    for name, fn in (("dense", K.dense_head_ce), ("chunked", lambda *a: K.head_ce(*a))):
        try:
            out[f"{name}_peak_extra_bytes"], out[f"{name}_baseline_allocated_bytes"] = peak_extra_bytes(
                lambda: fn(z, w2, base, labels).sum().backward(), (z, w2))
            out[f"{name}_ms"] = time_ms(lambda: fn(z, w2, base, labels).sum().backward(), warmup=1, iters=5)
        except Exception:
            errors.append(f"head_ce {name}: {traceback.format_exc(limit=3)}")
    out["peak_extra_method"] = ("max_memory_allocated - memory_allocated, both taken right after gc.collect(), "
                                "grads freed and reset_peak_memory_stats; Python's gc disabled during the call; "
                                "includes the gradients of z and W2 the call creates")
    out["chunk_rows"] = sys.modules["domino_graft.kernels.head.head_ce"]._chunk_rows(v, None)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "head_latency_h200.json"))
    ap.add_argument("--batches", default="1,4,16,32")
    ap.add_argument("--shapes", default="qwen3_8b,smollm2,smollm2_k15")
    ap.add_argument("--sweep", action="store_true",
                    help="sweep the launch constants on this GPU first and time the table with the fastest "
                         "(default: KernelConfig() as shipped)")
    ap.add_argument("--pool-select", default=None, choices=["bucket", "topk", "radix"],
                    help="the pool rollout's candidate selection behind fused_pool_ms (default: KernelConfig's)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shape on the CPU through the Triton interpreter (fp32): checks the script, times nothing real")
    args = ap.parse_args()
    if args.smoke:
        use_smoke_mode()
        if args.out == ap.get_default("out"):
            args.out = "/tmp/head_latency_smoke.json"
    import triton

    t0 = time.time()
    batches = [int(x) for x in args.batches.split(",")] if not args.smoke else [1, 3]
    if args.smoke:
        shapes, shape_names, sweep_shape = {"tiny": SMOKE_SHAPE}, ["tiny"], SMOKE_SHAPE
    else:
        sm = smollm2_dims()
        # the recipe's own block (its block_size) and, for comparison with Qwen3-8B, block 16 (K=15)
        shapes = dict(SHAPES, smollm2=sm, smollm2_k15=dict(sm, k=15, source=sm["source"] + ", K forced to 15"))
        shape_names, sweep_shape = args.shapes.split(","), SHAPES["qwen3_8b"]
    errors: list[str] = []
    res = dict(
        op="domino_rollout", device=torch.cuda.get_device_name(0) if on_gpu() else "cpu (TRITON_INTERPRET=1)",
        torch=torch.__version__, triton=triton.__version__, git_sha=git_sha(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command="PYTHONPATH=. python bench/rollout.py " + " ".join(sys.argv[1:]),
        dtype="bf16" if DT == torch.bfloat16 else str(DT).replace("torch.", ""),
        sms=sm_count(), pool_size=POOL,
        l2_flush_between_reps=on_gpu(),
        l2_flush="a %d MB write before every timed call of every end-to-end variant (eager, graph, fused_full, "
                 "fused_pool) and in l2_reuse_sweep, outside the timed events; single-kernel sweeps unflushed"
                 % (L2_FLUSH_BYTES >> 20),
        notes=("head only (base LM head excluded); graphed timings include copying the block into the graph's "
               "static buffers; SmolLM2 head weights (~8 MB) fit in the 60 MB L2, but with the L2 flushed before "
               "every call no variant reuses the previous call's cache; random weights and random base logits: "
               "the bucket pool's recall (pool_bucket_recall_*) and the token agreement numbers are properties "
               "of these random logits, not of a trained drafter's (whose mass concentrates on few tokens)"),
    )
    res.update(bandwidth())
    print("bandwidth", res["read_bw_gbps"], res["copy_bw_gbps"], flush=True)

    cfg = K.KernelConfig()
    if args.pool_select:
        cfg.pool_select = args.pool_select
    if args.sweep or args.smoke:  # (--smoke: every code path, the sweeps too)
        d = sweep_shape
        head, emb = make_problem(d, 1)
        try:
            res["w2_sweep"] = sweep_w2(d, head)
            res["gru_sweep"] = sweep_gru(d, head, emb)
            res["pool_sweep"] = sweep_pool(d, head)
            res["pool_select_sweep"] = sweep_pool_select(d, batches=(1, 32) if on_gpu() else (1, 3))
            # choose on the batch-1 rows (the latency case), keep the defaults where nothing ran
            w = best(res["w2_sweep"], "ms", lambda r: r["batch"] == 1)
            if w:
                cfg.w2_block_v, cfg.w2_block_r, cfg.w2_warps = w["block_v"], w["block_r"], w["warps"]
                cfg.w2_stages, cfg.w2_programs_per_sm = w["stages"], w["programs_per_sm"]
            w = best(res["w2_sweep"], "ms", lambda r: r["batch"] == 32)
            if w:
                cfg.w2_large_batch = (w["block_v"], w["block_r"], w["warps"], w["stages"], w["programs_per_sm"])
            gsel = best(res["gru_sweep"], "us")
            if gsel:
                cfg.gru_block_g = gsel["block_g"]
            for bb in {r["batch"] for r in res["pool_select_sweep"]}:
                # the exact methods compete for fused_pool_exact_ms; the bucket rows pick its tile
                ps = best(res["pool_select_sweep"], "us", lambda r: r["batch"] == bb and r["method"] != "bucket")
                if ps:
                    _POOL_SELECT[bb] = dict(pool_select=ps["method"], pool_chunks=max(ps["chunks"], 2))
            ps = best(res["pool_select_sweep"], "us", lambda r: r["batch"] == 1 and r["method"] == "bucket")
            if ps:
                cfg.pool_bucket_block_p = ps["chunks"]
            res["radix_sweep"] = sweep_radix(d, cfg, batches=SELECT_ONLY_BATCHES if on_gpu() else (1,))
            ps = best(res["radix_sweep"], "us", lambda r: r["batch"] == 1)
            if ps:
                cfg.pool_radix_block, cfg.pool_radix_warps = ps["block"], ps["warps"]
            p = best(res["pool_sweep"], "us", lambda r: r["batch"] == 1 and "block_p" in r)
            if p:
                cfg.pool_block_p, cfg.pool_warps, cfg.pool_programs_per_sm = p["block_p"], p["warps"], p["programs_per_sm"]
            # last: whole rollouts with the launch configs chosen above
            res["l2_reuse_sweep"] = sweep_l2_reuse(d, head, emb, cfg)
            pin = best(res["l2_reuse_sweep"], "ms", lambda r: r.get("same_drafts_as_first"))
            if pin:
                cfg.w2_zigzag, cfg.w2_stream, cfg.w2_l2_pin_fraction = pin["zigzag"], pin["stream"], pin["fraction"]
        except Exception:
            errors.append(f"sweep: {traceback.format_exc(limit=4)}")
        del head, emb
        empty_cache()
    res["kernel_config"] = asdict(cfg)
    print("config", res["kernel_config"], flush=True)

    res["shapes"] = {}
    for name in shape_names:
        res["shapes"][name] = measure(name, shapes[name], batches, res, cfg, errors)
        json.dump(res, open(args.out, "w"), indent=1)  # partial results survive a later failure
    res["head_ce"] = head_ce_memory(errors) if on_gpu() else {}

    q = res["shapes"].get("qwen3_8b", {}).get("batches", {}).get("1", {})
    if q.get("fused_full_ms") and q.get("graph_ms"):
        res["targets_qwen3_8b_b1"] = dict(
            fused_full_le_1_3_floor=q["fused_full_ms"] <= 1.3 * q["floor_full_ms"],
            fused_full_le_graph_over_2_5=q["fused_full_ms"] <= q["graph_ms"] / 2.5,
            fused_pool_le_0_1ms=q.get("fused_pool_ms", 1e9) <= 0.1,
        )
        if q.get("fused_full_copy_ms") and q.get("graph_copy_ms"):  # both copying their inputs at every call
            res["targets_qwen3_8b_b1"]["fused_full_copy_le_graph_copy_over_2_5"] = (
                q["fused_full_copy_ms"] <= q["graph_copy_ms"] / 2.5)
    res["specforge_gru"] = _GRU_IMPL["used"]
    res["errors"] = errors
    res["wall_s"] = time.time() - t0
    json.dump(res, open(args.out, "w"), indent=1)

    cols = ["eager_reference_ms", "eager_ms", "graph_ms", "fused_full_ms", "fused_pool_ms", "floor_full_ms",
            "floor_fused_ms", "fused_full_replay_ms", "fused_pool_replay_ms"]
    print(f"\n{res['device']}  read {res['read_bw_gbps']:.0f} GB/s  torch {res['torch']}  triton {res['triton']}")
    print("shape     B  " + " ".join(f"{c.replace('_ms', ''):>14}" for c in cols))
    for name, s in res["shapes"].items():
        for b, row in s["batches"].items():
            print(f"{name:9} {b:>2}  " + " ".join(f"{row.get(c, float('nan')):14.4f}" for c in cols))
    print("targets", res.get("targets_qwen3_8b_b1"), "head_ce", {k: v for k, v in res["head_ce"].items() if "peak" in k})
    print(f"errors: {len(errors)}  wall {res['wall_s']:.0f}s")


if __name__ == "__main__":
    main()
