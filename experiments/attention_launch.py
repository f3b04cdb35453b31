"""Which launch of the engine's decode attention (kernels/engine/decode_attention.py: keys per loop
step, warps, pipeline stages) is fastest at Qwen3-8B's attention shape, B = 1 (a decode step, where 16
programs each walk 512 keys: about 0.35 ms of the 4.76 ms step at 80ccb72) and at the batched shapes
issue #39 measures (B = 32 / 64). Each setting is one value for every B and T (a row's bits must
not depend on the batch), so a setting is judged over all the shapes at once.

Per setting and shape: one CUDA graph of 36 layers' decode_attention calls, each on its own KV cache
(so keys come from HBM, not L2, as in the model), replayed --iters times, median ms of the 36; and
whether row 0's output has the same bits at B = 1 and at the batched size (the setting keeps a
row's output independent of its batch).

    source experiments/gpu_env.sh && python3 experiments/attention_launch.py --out $OUT/attention_launch_h200.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from domino_graft.decoding.common import cuda_median_ms  # noqa: E402
from kernels.engine import decode_attention as attn  # noqa: E402

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 36, 32, 8, 128  # Qwen3-8B
SHAPES = ((1, 1), (1, 16), (8, 16), (32, 1), (32, 16), (64, 1))  # (B, T)


def measure(b: int, t: int, ctx: int, iters: int, caches) -> tuple[float, torch.Tensor]:
    kcs, vcs = caches
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(b, t, HEADS * HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    pos = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    splits = attn.attention_splits(ctx + t + 255 & ~255)  # the engine's static bound: a 256-key bucket

    def layers():
        return [attn.decode_attention(q, kcs[i][:b], vcs[i][:b], pos, num_heads=HEADS, num_kv_heads=KV_HEADS,
                                      head_dim=HEAD_DIM, splits=splits) for i in range(LAYERS)]

    out = layers()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layers()
    return cuda_median_ms(graph.replay, lambda: None, repeats=iters), out[0][0].clone()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--tiles", default="64,128")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2,3,4")
    args = ap.parse_args(argv)
    bmax, tmax = max(b for b, _ in SHAPES), max(t for _, t in SHAPES)
    size = args.context + tmax + 256
    gen = torch.Generator(device="cuda").manual_seed(0)
    caches = ([torch.randn(bmax, KV_HEADS, size, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(LAYERS)],
              [torch.randn(bmax, KV_HEADS, size, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(LAYERS)])
    rows = []
    for tile, warps, stages in itertools.product(*(map(int, v.split(",")) for v in (args.tiles, args.warps, args.stages))):
        attn.key_tile = lambda head_dim, tile=tile: tile if head_dim <= 128 else 32
        attn.ATTENTION_WARPS, attn.ATTENTION_STAGES = warps, stages
        row = {"key_tile": tile, "warps": warps, "stages": stages, "ms": {}, "row0_bits_equal_across_B": {}}
        try:
            first = {}
            for b, t in SHAPES:
                ms, row0 = measure(b, t, args.context, args.iters, caches)
                row["ms"][f"B{b}_T{t}"] = round(ms, 4)
                if t in first:
                    row["row0_bits_equal_across_B"][f"B{b}_T{t}"] = bool(torch.equal(row0, first[t]))
                else:
                    first[t] = row0
        except Exception as e:  # noqa: BLE001  a setting that does not fit (shared memory) is recorded, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    report = {"what": __doc__.split("\n")[0], "context": args.context, "layers": LAYERS, "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "command": "python3 experiments/attention_launch.py " + " ".join(argv or sys.argv[1:]),
              "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
