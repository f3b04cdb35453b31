"""kernels/engine/row_norm.py's rows per program (ROWS), measured: the time of one RMSNorm call by M rows and
ROWS, inside a CUDA graph (as the engine replays it), and whether every ROWS gives ROWS = 1's bits.

    source experiments/gpu_env.sh; python3 bench/row_norm_rows.py --out bench/results/row_norm_rows_h100.json

Each (H, M, ROWS): one graph of CALLS back-to-back calls, replayed --iters times (CUDA events around each
replay), the median divided by CALLS; bf16, H = 576 (SmolLM2) and 4096 (Qwen3-8B). M: a plain step's rows
(B) up to a 16-token verify's at B = 64 (1,024) and beyond. `rows_per_program`'s table (ROWS_BY_M) is read
off these rows. --smoke: tiny shapes in Triton's interpreter on a CPU (the mechanics only).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (bench/ is not a package)

CALLS = 50


def time_call_us(fn, iters: int) -> float:
    """µs of one fn() call: a CUDA graph of CALLS calls, replayed `iters` times (median); the wall clock on a CPU."""
    if not torch.cuda.is_available():
        return 1e3 * harness.time_cuda(fn, iters=iters, warmup=1)["ms"]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    return 1e3 * harness.time_cuda(graph.replay, iters=iters, warmup=2)["ms"] / CALLS


def main(argv=None) -> int:
    from domino_graft.kernels.engine.row_norm import rms_norm_rows, rows_per_program

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", default="576,4096")
    p.add_argument("--rows", default="1,2,4,8,16", help="ROWS values to time")
    p.add_argument("--m", default="1,16,64,128,256,512,1024,2048", help="rows per call")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--smoke", action="store_true", help="CPU: H = 32, M <= 16, interpreter")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    hidden = [32] if args.smoke else [int(h) for h in args.hidden.split(",")]
    ms = [m for m in (int(v) for v in args.m.split(",")) if not args.smoke or m <= 16]
    rows_opts = [int(r) for r in args.rows.split(",")]
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for h in hidden:
        w = (1 + 0.1 * torch.randn(h, generator=g, device=dev)).to(dtype)
        for m in ms:
            x = (3 * torch.randn(m, h, generator=g, device=dev)).to(dtype)
            one = rms_norm_rows(x, w, 1e-6, rows=1)
            row = {"H": h, "M": m, "default_rows": rows_per_program(m), "us_by_rows": {}, "bits_equal_rows_1": {}}
            for r in rows_opts:
                row["bits_equal_rows_1"][str(r)] = bool(torch.equal(rms_norm_rows(x, w, 1e-6, rows=r), one))
                row["us_by_rows"][str(r)] = round(time_call_us(lambda: rms_norm_rows(x, w, 1e-6, rows=r), args.iters), 3)
            best = min(row["us_by_rows"], key=row["us_by_rows"].get)
            row["best_rows"] = int(best)
            print(f"H={h} M={m}: " + " ".join(f"{r}:{t}" for r, t in row["us_by_rows"].items()) + f" us; best {best}; "
                  f"bits equal {all(row['bits_equal_rows_1'].values())}", flush=True)
            out.append(row)
    report = {**harness.environment(), "what": "RMSNorm (kernels/engine/row_norm.py) µs a call by rows per program, "
              f"in a CUDA graph of {CALLS} calls; bits against ROWS = 1", "calls_per_graph": CALLS, "rows": out}
    harness.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
