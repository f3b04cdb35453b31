"""Which projection tier a small target's verify should run (issue #39, SmolLM2 at B >= 16).

On the H100 (session 38's phases, `bench/results/batched_overhead_h100/2db8afa_phases_t0.json.gz`) the
SmolLM2-shape target forward cost 0.70 ms for 16 rows and 1.06 ms for 64, then ~1.15 ms up to 256: a jump
at the rows where kernels/engine/small_linear.py leaves its 16-row tier (cuBLAS for the residual-free
SPLIT-1 calls from 17 rows, the many-rows tiles from 64). At this size every weight sits in L2 and a step
is ~200 launches chained by PDL (kernels/engine/pdl.py), which cuBLAS's kernels do not join. This times the
same graphed forward (fast.GraphRunner, random bf16 weights, context --context) under each tier rule:

* ``default``: the engine's rules as shipped;
* ``before``: the rules before 64 x 16 tiles for small models' 64-255 rows and CUBLAS_MIN_WEIGHT_BYTES;
* ``no_cublas``: small_linear.CUBLAS_ROWS off (the Triton tiers at every M);
* ``few_rows``: no cuBLAS and no many-rows tiles (the 16-row tier at every M);
* ``cublas``: every projection through F.linear (DOMINO_GRAFT_LINEARS=torch; not batch-invariant);
* ``m64n16``, ``m32n16``, ``m64n32`` (``_no_cublas``): the SmolLM2 projections from 32 rows on in tiles of
  BLOCK_M x BLOCK_N (``TILES``), with the few-row tier's K ranges (so its bits);

and checks that every batch-invariant variant gives row 0's logits the same bits as ``default`` at each B
(their K ranges are one plan's; only the tiles differ); ``--profile``: one eager forward's kernels by name at
those B x T, PDL off. Writes --out (JSON).

    source experiments/gpu_env.sh
    python3 experiments/linear_tiers.py --out /tmp/linear_tiers.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import engine_speed  # noqa: E402  (row configs, random models, timing)

VARIANTS = ("default", "before", "no_cublas", "few_rows", "cublas", "m64n16", "m32n16", "m64n32", "m64n16_no_cublas")
# the SmolLM2 projections' weights [N, K] (+ "swiglu"): the keys of small_linear's tables
SMOLLM2 = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576, "swiglu"), "down": (576, 1536)}
# tile variants: (BLOCK_M, BLOCK_N) for every SmolLM2 projection from 32 rows on, BLOCK_K 64, 4 warps, 4 stages.
# At 64 rows the 16-row tier runs 4 M tiles of N / 16 programs (qkv 240, gate_up 192: over 132 SMs)
# and the many-rows tiles 64 x 64 (qkv 15 programs, each walking all of K): both wait on a few programs' loops.
TILES = {"m64n16": (64, 16), "m32n16": (32, 16), "m64n32": (64, 32), "m64n16_no_cublas": (64, 16)}


def set_variant(sl, variant: str, saved: dict) -> None:
    """The tier rule `variant` (module docstring), on small_linear's module globals (read at each call)."""
    sl.CUBLAS_ROWS, sl.WIDE_FROM_ROWS = saved["CUBLAS_ROWS"], saved["WIDE_FROM_ROWS"]
    sl.CUBLAS_MIN_WEIGHT_BYTES = saved["CUBLAS_MIN_WEIGHT_BYTES"]
    for name in ("MEASURED_WIDE_SM90", "_measured_wide"):  # (FastLM's setup copies the first into the second)
        getattr(sl, name).clear()
        getattr(sl, name).update(saved[name])
    if variant == "before":  # the rules until 64 x 16 tiles (_SMALL_MID) and CUBLAS_MIN_WEIGHT_BYTES came in
        sl.CUBLAS_MIN_WEIGHT_BYTES = 0
        for key in SMOLLM2.values():
            table = sl.MEASURED_WIDE_SM90[key]
            if table[0][1] == sl._SMALL_MID:
                old = ((table[0][0], sl._wide(64, 64, 4, 4, 64)),) + table[2:]
                sl.MEASURED_WIDE_SM90[key] = sl._measured_wide[key] = old
    sl.WIDE.clear()  # (not TUNED: the engine's setup tuned the few-row tier once; clear_configs() lost it)
    sl._CUBLAS_SAME.clear()
    os.environ.pop("DOMINO_GRAFT_LINEARS", None)
    if variant in ("no_cublas", "few_rows", "m64n16_no_cublas"):  # (the tile variants' qkv: default's rule)
        sl.CUBLAS_ROWS = False
    if variant == "few_rows":
        sl.WIDE_FROM_ROWS = 1 << 30
    if variant == "cublas":
        os.environ["DOMINO_GRAFT_LINEARS"] = "torch"
    if variant in TILES:
        bm, bn = TILES[variant]
        sl.WIDE_FROM_ROWS = 32
        for key in SMOLLM2.values():
            base = sl.lookup_config(key[0], key[1], swiglu=len(key) == 3)
            cfg = sl.Config(BLOCK_N=bn, BLOCK_K=64, SPLIT=base.SPLIT, num_warps=4, num_stages=4, BLOCK_M=bm)
            sl.register_config(key[0], key[1], cfg, swiglu=len(key) == 3, wide=True)


def profile_forward(lm, x, context: int, top: int = 14) -> dict:
    """Device ms by kernel name of one eager forward of x (torch.profiler; PDL off, so that a kernel's time
    is its own, not its early launch's wait)."""
    from torch.profiler import ProfilerActivity, profile

    from domino_graft.kernels.engine import pdl

    was, pdl.ENABLED = pdl.ENABLED, False
    try:
        for _ in range(2):
            lm.forward(x, context, update_lengths=False)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            lm.forward(x, context, update_lengths=False)
            torch.cuda.synchronize()
    finally:
        pdl.ENABLED = was
    by_name: dict[str, list] = {}
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if us and ev.key and not ev.key.startswith("ProfilerStep"):
            got = by_name.setdefault(ev.key[:60], [0.0, 0])
            got[0] += us / 1e3
            got[1] += ev.count
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])
    return {"kernel_ms_total": round(sum(v[0] for v in by_name.values()), 3),
            "top": [{"kernel": k, "ms": round(v[0], 4), "calls": v[1]} for k, v in ranked[:top]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="smollm2_135m")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--tokens", default="1,4,8,16")
    ap.add_argument("--context", type=int, default=160)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="each variant timed this many times, alternating")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--profile", default="16x1,16x4", help="BxT list: an eager forward's kernels (PDL off)")
    args = ap.parse_args()
    variants = tuple(args.variants.split(","))
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"--variants: {unknown[0]!r} is not a variant; valid: {', '.join(VARIANTS)}")
    try:
        profiles = [tuple(int(v) for v in bt.split("x")) for bt in args.profile.split(",") if bt]
        assert all(len(p) == 2 and min(p) >= 1 for p in profiles)
    except (ValueError, AssertionError):
        ap.error(f"--profile: {args.profile!r} is not a list of BxT; valid: e.g. 16x1,16x4 (or empty)")
    from domino_graft.fast import FastLM, GraphRunner, prepare_for_cuda_decoding
    from domino_graft.kernels.engine import pdl
    from domino_graft.kernels.engine import small_linear as sl

    batches = [int(v) for v in args.batches.split(",")]
    tokens = [int(v) for v in args.tokens.split(",")]
    sl.use_measured_configs(torch.device("cuda"))
    saved = {"CUBLAS_ROWS": sl.CUBLAS_ROWS, "WIDE_FROM_ROWS": sl.WIDE_FROM_ROWS,
             "CUBLAS_MIN_WEIGHT_BYTES": sl.CUBLAS_MIN_WEIGHT_BYTES, "_measured_wide": dict(sl._measured_wide),
             "MEASURED_WIDE_SM90": dict(sl.MEASURED_WIDE_SM90)}
    cfg = engine_speed.load_config(engine_speed.ROWS[args.shape])
    model = engine_speed.build_model(cfg, args.seed)
    bmax, max_len = max(batches), args.context + max(tokens) + 64
    gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    prompt = torch.randint(0, cfg.vocab_size, (bmax, args.context), device="cuda", generator=gen)
    ids = torch.randint(0, cfg.vocab_size, (bmax, max(tokens)), device="cuda", generator=gen)
    times: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
    row0: dict[str, dict[str, torch.Tensor]] = {v: {} for v in variants}
    profiled: dict[str, dict] = {}
    t_start = time.time()
    for rnd in range(args.rounds):
        for variant in (variants if rnd % 2 == 0 else tuple(reversed(variants))):
            set_variant(sl, variant, saved)
            torch._dynamo.reset()
            lm = prepare_for_cuda_decoding(FastLM.from_hf(model, bmax, max_len))
            run = GraphRunner(lm, kv_block=256)
            lm.forward(prompt, 0, logits_to_keep=1, use_compiled=False, update_lengths=False)
            for b in batches:
                for t in tokens:
                    x = ids[:b, :t]
                    got = engine_speed.time_steps(lambda: run(x, args.context)[0][:, -1].argmax(-1),
                                                  args.iters, args.warmup)
                    times[variant].setdefault(f"{b}x{t}", []).append(round(got["ms"], 4))
                    if rnd == 0:
                        row0[variant][f"{b}x{t}"] = run(x, args.context)[0][0].float().clone()
            if rnd == 0 and variant != "cublas":
                for b, t in profiles:
                    profiled.setdefault(variant, {})[f"{b}x{t}"] = profile_forward(lm, ids[:b, :t], args.context)
            print(f"round {rnd} {variant}: {json.dumps({k: v[-1] for k, v in times[variant].items()})}", flush=True)
            run.graphs.clear()
            del run, lm
            torch.cuda.empty_cache()
    set_variant(sl, "default", saved)
    rows = []
    for b in batches:
        for t in tokens:
            key = f"{b}x{t}"
            r = {"B": b, "T": t, "rows": b * t}
            for v in variants:
                r[f"{v}_ms"] = min(times[v][key])
            for v in variants:
                if v not in ("default", "cublas") and "default" in variants:
                    r[f"{v}_bits_equal_default"] = bool(torch.equal(row0[v][key], row0["default"][key]))
            rows.append(r)
    out = {"what": __doc__.split("\n\n")[0], "command": " ".join(["experiments/linear_tiers.py", *sys.argv[1:]]),
           "git_sha": os.environ.get("DG_GIT_SHA"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "shape": args.shape, "context": args.context, "iters": args.iters, "rounds": args.rounds,
           "pdl": pdl.ENABLED,
           "note": "ms: a graphed forward of B x T tokens, CUDA events, median of --iters, the least of --rounds",
           "by_shape": rows, "raw_ms": times, "tiles": {v: TILES[v] for v in variants if v in TILES},
           "profile_eager_pdl_off": profiled, "elapsed_s": round(time.time() - t_start, 1)}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(r, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
