"""Which tiles can serve many rows with the few-row kernel's bits? (issue #39, step 1)

    source experiments/gpu_env.sh; python3 bench/linear_rows_probe.py --out bench/results/linear_rows_probe_h200.json
    CUBLAS_WORKSPACE_CONFIG=:0:0 python3 bench/linear_rows_probe.py --cublas-only --out OUT.json
    python3 bench/linear_rows_probe.py --engine-path 1088 --out bench/results/linear_engine_path_h200.json

For each Qwen3-8B and SmolLM2-135M projection (bf16, random weights): the few-row config's output over 1,024 rows
(a row's bits depend on that row only: 16-row tiles, see kernels/engine/small_linear.py) against the same
rows through larger tiles (BLOCK_M 64-256, other BLOCK_N / BLOCK_K / warps / stages) that keep the
few-row config's SPLIT and K ranges: ``bits_equal`` says whether every row came out the same. Then
each config's time by M against cuBLAS (weights cycled over twice the L2, CUDA events, median), and
cuBLAS's own rows across M (whether F.linear is batch-invariant here, with or without split-K).
``--engine-path MAX_M``: small_linear as the engine calls it (both tiers, and cuBLAS where it gives the
same bits), every row's bits at every M in 1..MAX_M, and its time by M.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package


SHAPES = {  # name: (N, K, swiglu, residual)
    "qkv": (6144, 4096, False, False),
    "o": (4096, 4096, False, True),
    "gate_up": (24576, 4096, True, False),
    "down": (4096, 12288, False, True),
    "lm_head": (151936, 4096, False, False),
    "smollm2_qkv": (960, 576, False, False),
    "smollm2_o": (576, 576, False, True),
    "smollm2_gate_up": (3072, 576, True, False),
    "smollm2_down": (576, 1536, False, True),
    "smollm2_lm_head": (49152, 576, False, False),
}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); shapes with SPLIT > 1 try each inline and not
WIDE = ((64, 64, 64, 4, 4), (64, 128, 64, 4, 3), (64, 128, 64, 8, 4), (64, 256, 64, 8, 3),
        (128, 64, 64, 4, 4), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3),
        (128, 128, 128, 8, 3), (128, 64, 128, 8, 3), (256, 128, 64, 8, 3), (256, 64, 64, 8, 4),
        (128, 128, 64, 4, 4), (128, 256, 64, 8, 4))
MS = (64, 128, 256, 512, 1024)  # B x T of the verifies that batch: B = 4..64 at T = 16
FEW_MS = (1, 16, 32, 64, 128)  # the few-row tier around the switch
BITS_MS = (1, 15, 16, 17, 63, 64, 65, 256, 512, 1024)


def time_in_graph(torch, fn, calls: int = 10, reps: int = 7) -> float:
    """Median us per call of ``calls`` back-to-back calls fn(0..calls-1) in one CUDA graph (no
    launch overhead: what the engine's graphed step sees); linear_speed.py's timing."""
    import linear_speed

    return linear_speed.time_in_graph(torch, [lambda i=i: fn(i) for i in range(calls)], calls, reps)


ENGINE_MS = (1, 16, 32, 64, 128, 256, 512, 1024)  # the engine path's timings


def engine_path(torch, S, name: str, gen, l2: int, max_m: int) -> dict:
    """small_linear as the engine calls it (config=None: the few-row tier, the many-rows tier and cuBLAS
    where cuBLAS gives the same bits): whether every row of every M in 1..max_m has the bits it has
    in the max_m call, the Ms cuBLAS ran, and the time by M against cuBLAS alone."""
    import torch.nn.functional as F

    n, k, swiglu, res = SHAPES[name]
    n_out = n // 2 if swiglu else n
    x = torch.randn((max_m, k), generator=gen, device="cuda").bfloat16()
    copies = S.weight_copies(n * k * 2, l2)
    ws = [(torch.randn((n, k), generator=gen, device="cuda") / k ** 0.5).bfloat16() for _ in range(copies)]
    r = torch.randn((max_m, n_out), generator=gen, device="cuda").bfloat16() if res else None

    def op(m, w=ws[0]):
        rr = None if r is None else r[:m]
        return S.small_linear_swiglu(x[:m], w) if swiglu else S.small_linear(x[:m], w, residual=rr)

    S._CUBLAS_SAME.clear()
    full = op(max_m)
    differing = [m for m in range(1, max_m + 1) if not torch.equal(op(m), full[:m])]
    cublas_ms = sorted(key[2] for key, same in S._CUBLAS_SAME.items() if same)
    S.CUBLAS_ROWS = False  # DOMINO_GRAFT_CUBLAS_ROWS=0: the Triton tiers alone
    triton_full = op(max_m)
    S.CUBLAS_ROWS = True
    row = {"N": n, "K": k, "swiglu": swiglu, "residual": res, "max_m": max_m,
           "ms_whose_rows_differ_from_max_m": differing, "equal_to_triton_alone": bool(torch.equal(full, triton_full)),
           "cublas_ran_at": (f"{len(cublas_ms)} Ms, {cublas_ms[0]}..{cublas_ms[-1]}" if cublas_ms else "none"),
           "engine_us": {}, "cublas_us": {}}
    for m in ENGINE_MS:
        row["engine_us"][str(m)] = round(time_in_graph(torch, lambda i, m=m: op(m, ws[i % len(ws)])), 2)
        row["cublas_us"][str(m)] = round(time_in_graph(torch, lambda i, m=m: F.linear(x[:m], ws[i % len(ws)])), 2)
    del ws, x, r, full, triton_full
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    import torch
    import torch.nn.functional as F

    from domino_graft.kernels.engine import small_linear as S

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--cublas-only", action="store_true")
    ap.add_argument("--deadline-s", type=float, default=420)
    ap.add_argument("--engine-path", type=int, default=0, metavar="MAX_M",
                    help="only the engine's path (engine_path): every M in 1..MAX_M and its time by M")
    args = ap.parse_args(argv)
    t0 = time.time()
    dev = torch.device("cuda")
    S.use_measured_configs(dev)
    l2 = S._l2_bytes(dev)
    gen = torch.Generator(dev).manual_seed(0)
    import triton

    out = {"command": "python3 bench/linear_rows_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "timing": "CUDA graph of 10 calls cycling weight copies over 2x L2, median of 7 replays, us per call",
           "shapes": {}}
    if args.engine_path:
        for name in args.shapes.split(","):
            if time.time() - t0 > args.deadline_s:
                break
            out["shapes"][name] = engine_path(torch, S, name, gen, l2, args.engine_path)
            print(name, out["shapes"][name], flush=True)
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        out["elapsed_s"] = round(time.time() - t0, 1)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        return 0
    for name in args.shapes.split(","):
        n, k, swiglu, res = SHAPES[name]
        n_out = n // 2 if swiglu else n
        x = torch.randn((max(MS), k), generator=gen, device=dev).bfloat16()
        copies = S.weight_copies(n * k * 2, l2)
        ws = [(torch.randn((n, k), generator=gen, device=dev) / k ** 0.5).bfloat16() for _ in range(copies)]
        r = torch.randn((max(MS), n_out), generator=gen, device=dev).bfloat16() if res else None
        row = {"N": n, "K": k, "swiglu": swiglu, "residual": res}
        full = F.linear(x, ws[0])
        row["cublas_rows_equal_across_m"] = {
            str(m): bool(torch.equal(F.linear(x[:m], ws[0]), full[:m])) for m in BITS_MS}

        def timed(op, m):
            return round(time_in_graph(torch, lambda i: op(x[:m], ws[i % len(ws)], None if r is None else r[:m])), 2)

        def cublas(x_, w, r_):
            y = F.linear(x_, w)
            if swiglu:
                g, u = y.chunk(2, dim=-1)
                y = F.silu(g) * u
            return y if r_ is None else y + r_

        row["cublas_us"] = {str(m): timed(cublas, m) for m in FEW_MS[1:] + MS[1:]}
        if args.cublas_only:
            out["shapes"][name] = row
            continue
        base = S.lookup_config(n, k, swiglu=swiglu)
        kps = base.k_per_split(k)
        row["base"] = base.as_dict()
        ref = S._launch(x, ws[0], None, r, base, n_out, swiglu)
        one = [S._launch(x[j:j + 1], ws[0], None, None if r is None else r[j:j + 1], base, n_out, swiglu)
               for j in (0, 17, 1023)]
        row["base_rows_equal_alone"] = all(torch.equal(o[0], ref[j]) for o, j in zip(one, (0, 17, 1023)))
        row["base_us"] = {str(m): timed(lambda x_, w, r_: S._launch(x_, w, None, r_, base, n_out, swiglu), m)
                          for m in FEW_MS}
        cands = []
        for tile in WIDE:
            for inline in ((False, True) if base.SPLIT > 1 else (False,)):
                bm, bn, bk, warps, stages = tile
                c = {"tile": list(tile), "split_inline": inline}
                if time.time() - t0 > args.deadline_s:
                    c["skipped"] = "deadline"
                    cands.append(c)
                    continue
                if kps % bk:
                    continue
                cfg = S.Config(BLOCK_N=bn, BLOCK_K=bk, SPLIT=base.SPLIT, num_warps=warps, num_stages=stages,
                               BLOCK_M=bm, SPLIT_INLINE=inline)
                try:
                    y = S._launch(x, ws[0], None, r, cfg, n_out, swiglu, k_per_split=kps)
                    c["bits_equal"] = bool(torch.equal(y, ref))
                    c["rows_differing"] = int((y != ref).any(-1).sum())
                    c["us"] = {str(m): timed(lambda x_, w, r_, cfg=cfg: S._launch(
                        x_, w, None, r_, cfg, n_out, swiglu, k_per_split=kps), m) for m in MS}
                except Exception as e:  # noqa: BLE001  a tile that does not fit (shared memory): recorded
                    c["error"] = f"{type(e).__name__}: {e}"[:200]
                cands.append(c)
                print(name, c, flush=True)
        ok = [c for c in cands if c.get("bits_equal") and "us" in c]
        if ok:  # the least total time over the verifies' M: one config for every M (the bits allow more)
            best = min(ok, key=lambda c: sum(c["us"].values()))
            row["best_wide"] = best
            row["best_wide_over_cublas"] = {m: round(best["us"][m] / row["cublas_us"][m], 3)
                                            for m in best["us"] if m in row["cublas_us"]}
        row["wide"] = cands
        out["shapes"][name] = row
        print(name, "cublas", row["cublas_us"], "base", row["base_us"], "best", row.get("best_wide"), flush=True)
        del ws, x, r, ref
        torch.cuda.empty_cache()
    out["elapsed_s"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
