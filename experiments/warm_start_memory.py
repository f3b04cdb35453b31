"""How much GPU memory serve's warm start holds (serving/warmup.py `warm_start`, as `domino-graft serve` runs it).

Every graph the warm start captures keeps its input buffers and its memory pool for as long as the server runs: the
target's steps and prefills at each batch size, padded prompt length and kv bucket (fast.GraphRunner: a private pool
a step, one pool for the prefills), the drafter's blocks, and its padded prefills (adapters/dflash/fast.py: one input
buffer and one pool for all).
This builds random bf16 weights at a real shape, runs the warm start of a server of --max-batch rows and --positions
positions (admission in place on, every block verifying all K), and records the memory allocated and reserved before
and after, beside the static KV caches' bytes, the graphs captured and the seconds taken.

  --shape smollm2_135m: the SmolLM2-135M target with the shipped drafter's shape (bench/batched_overhead.py's);
  --shape qwen3_8b: Qwen3-8B with z-lab's 5-layer DFlash drafter (bench/engine_batch.py's shape).
  --prefill-pools private: each prefill graph (the target's, the drafter's) in a pool of its own, as before they
      shared one (the saving's A/B).
  --pad-prefills off: the drafter's prefills eager, no prefill graphs.

    source experiments/gpu_env.sh
    python3 experiments/warm_start_memory.py --shape qwen3_8b --max-batch 32 --positions 512 --out …/wsm.json
    python3 experiments/warm_start_memory.py --device cpu --shape tiny --max-batch 2 --positions 64 --out …  # smoke
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import batched_overhead  # noqa: E402  (the SmolLM2 shape with the shipped drafter's)
import harness  # noqa: E402

SHAPES = {
    "tiny": [],  # recipes/tiny_dflash.yaml as it is: the CPU smoke run
    "smollm2_135m": batched_overhead.SHAPE,
    "qwen3_8b": [
        "target.random.architecture=qwen3", "target.random.vocab_size=151936", "target.random.hidden_size=4096",
        "target.random.num_layers=36", "target.random.num_heads=32", "target.random.num_kv_heads=8",
        "target.random.head_dim=128", "target.random.intermediate_size=12288", "target.random.eos_token_id=151645",
        "drafter.num_layers=5", "drafter.block_size=16", "drafter.target_layer_ids=[1,9,17,25,33]",
        "drafter.mask_token_id=151669", "head.gru_hidden_dim=1024", "head.rank=256"],
}


def build(shape: str, device: str):
    """An Engine of random weights at `shape` on `device` (bf16 on CUDA, created there: no 8B model on the host)."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return batched_overhead.build(SHAPES[shape], device, dtype, create_on_device=device == "cuda")


def _gib(*tensors) -> float:
    return round(sum(t.numel() * t.element_size() for t in tensors if t is not None) / 2 ** 30, 3)


def cache_gib(engine, drafter) -> dict:
    """The static KV caches' bytes (the target's ragged one, the drafter's): memory the warm start reserves that is
    not the graphs'."""
    target = engine._ragged_static
    out = {}
    if target is not None:
        cache = target.lm.cache
        out["target_kv_gib"] = _gib(*cache.k, *cache.v)
    if drafter is not None:
        out["drafter_kv_gib"] = _gib(*drafter.k, *drafter.v)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3_8b")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--positions", type=int, default=512, help="what a request may reach (serve's max_model_len)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--prefill-pools", choices=["shared", "private"], default="shared")
    p.add_argument("--pad-prefills", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import torch

    from domino_graft.adapters.dflash.fast import StaticDFlashDrafter
    from domino_graft.serving.warmup import warm_start

    if args.pad_prefills != "auto":
        StaticDFlashDrafter.PAD_PREFILLS = args.pad_prefills == "on"
    if args.prefill_pools == "private":  # experiment only: every prefill graph keeps a pool of its own
        from domino_graft.fast import GraphRunner

        StaticDFlashDrafter._prefill_pool_handle = lambda self: None
        GraphRunner._pooled = lambda self: None
    torch.manual_seed(0)
    t0 = time.perf_counter()
    engine = build(args.shape, args.device)
    if args.device == "cuda":
        torch.cuda.empty_cache()  # what building the weights left behind is not the warm start's
        torch.cuda.reset_peak_memory_stats()
    before = harness.cuda_memory()
    built_s = time.perf_counter() - t0
    sizes = [1 << i for i in range(args.max_batch.bit_length()) if 1 << i <= args.max_batch]
    out_of_memory = None
    try:
        warm = warm_start(engine, batch_sizes=sizes, positions=args.positions, target_only=False, use_head=True,
                          admit=True, sweep=True)
    except torch.cuda.OutOfMemoryError as e:  # a result too: the warm start does not fit at this size
        warm, out_of_memory = None, str(e).splitlines()[0]
    after = harness.cuda_memory()
    drafter = getattr(engine.adapter, "_static_batch_drafter", None)
    calls = getattr(drafter, "_calls", {})
    report = {**harness.environment(), "shape": args.shape, "max_batch": args.max_batch, "positions": args.positions,
              "prefill_pools": args.prefill_pools, "pad_prefills": args.pad_prefills, "build_s": round(built_s, 1),
              "warm_start": None if warm is None else warm.report, "out_of_memory": out_of_memory,
              "memory_before": before, "memory_after": after,
              "held_by_warm_start_gib": {k: round(after[k] - before[k], 3) for k in after if k != "peak_allocated_gib"},
              "caches": cache_gib(engine, drafter),
              "drafter_graphs": {kind: sum(1 for key in calls if key[0] == kind)
                                 for kind in sorted({key[0] for key in calls})},
              "drafter_prefill_buffer_gib": _gib(getattr(drafter, "_prefill_buffer", None))}
    print({k: report[k] for k in ("memory_before", "memory_after", "held_by_warm_start_gib", "caches", "drafter_graphs",
                                  "drafter_prefill_buffer_gib")}, flush=True)
    harness.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
