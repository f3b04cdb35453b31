"""Which projection tier a small target's verify should run (issue #39, SmolLM2 at B >= 16).

On the H100 (session 38's phases, `bench/results/batched_overhead_h100/2db8afa_phases_t0.json.gz`) the
SmolLM2-shape target forward cost 0.70 ms for 16 rows and 1.06 ms for 64, then ~1.15 ms up to 256: a jump
at the rows where kernels/engine/small_linear.py leaves its 16-row tier (cuBLAS for the residual-free
SPLIT-1 calls from 17 rows, the many-rows tiles from 64). At this size every weight sits in L2 and a step
is ~200 launches chained by PDL (kernels/engine/pdl.py), which cuBLAS's kernels do not join. This times the
same graphed forward (fast.GraphRunner, random bf16 weights, context --context) under each tier rule:

* ``default``: the engine's rules as shipped;
* ``no_cublas``: small_linear.CUBLAS_ROWS off (the Triton tiers at every M);
* ``few_rows``: no cuBLAS and no many-rows tiles (the 16-row tier at every M);
* ``cublas``: every projection through F.linear (DOMINO_GRAFT_LINEARS=torch; not batch-invariant).

and checks that every batch-invariant variant gives row 0's logits the same bits as ``default`` at each B
(their K ranges are one plan's; only the tiles differ). Writes --out (JSON).

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

VARIANTS = ("default", "no_cublas", "few_rows", "cublas")


def set_variant(sl, variant: str, saved: dict) -> None:
    """The tier rule `variant` (module docstring), on small_linear's module globals (read at each call)."""
    sl.CUBLAS_ROWS, sl.WIDE_FROM_ROWS = saved["CUBLAS_ROWS"], saved["WIDE_FROM_ROWS"]
    os.environ.pop("DOMINO_GRAFT_LINEARS", None)
    if variant in ("no_cublas", "few_rows"):
        sl.CUBLAS_ROWS = False
    if variant == "few_rows":
        sl.WIDE_FROM_ROWS = 1 << 30
    if variant == "cublas":
        os.environ["DOMINO_GRAFT_LINEARS"] = "torch"


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
    args = ap.parse_args()
    from domino_graft.fast import FastLM, GraphRunner, prepare_for_cuda_decoding
    from domino_graft.kernels.engine import pdl
    from domino_graft.kernels.engine import small_linear as sl

    batches = [int(v) for v in args.batches.split(",")]
    tokens = [int(v) for v in args.tokens.split(",")]
    saved = {"CUBLAS_ROWS": sl.CUBLAS_ROWS, "WIDE_FROM_ROWS": sl.WIDE_FROM_ROWS}
    cfg = engine_speed.load_config(engine_speed.ROWS[args.shape])
    model = engine_speed.build_model(cfg, args.seed)
    bmax, max_len = max(batches), args.context + max(tokens) + 64
    gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    prompt = torch.randint(0, cfg.vocab_size, (bmax, args.context), device="cuda", generator=gen)
    ids = torch.randint(0, cfg.vocab_size, (bmax, max(tokens)), device="cuda", generator=gen)
    times: dict[str, dict[str, list[float]]] = {v: {} for v in VARIANTS}
    row0: dict[str, dict[str, torch.Tensor]] = {v: {} for v in VARIANTS}
    t_start = time.time()
    for rnd in range(args.rounds):
        for variant in (VARIANTS if rnd % 2 == 0 else tuple(reversed(VARIANTS))):
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
            for v in VARIANTS:
                r[f"{v}_ms"] = min(times[v][key])
            for v in ("no_cublas", "few_rows"):
                r[f"{v}_bits_equal_default"] = bool(torch.equal(row0[v][key], row0["default"][key]))
            rows.append(r)
    out = {"what": __doc__.split("\n\n")[0], "command": " ".join(["experiments/linear_tiers.py", *sys.argv[1:]]),
           "git_sha": os.environ.get("DG_GIT_SHA"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "shape": args.shape, "context": args.context, "iters": args.iters, "rounds": args.rounds,
           "pdl": pdl.ENABLED,
           "note": "ms: a graphed forward of B x T tokens, CUDA events, median of --iters, the least of --rounds",
           "by_shape": rows, "raw_ms": times, "elapsed_s": round(time.time() - t_start, 1)}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(r, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
