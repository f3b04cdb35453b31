"""The target's step and verify by batch size on one GPU: the engine's default kernels (every
projection through kernels/engine/small_linear.py, batch-invariant) against cuBLAS (F.linear,
DOMINO_GRAFT_LINEARS=torch) in the same process, beside the byte and compute floors; and the
DFlash drafter's batched propose. Random bf16 weights at real shapes (issue #39).

    source experiments/gpu_env.sh
    python3 bench/engine_batch.py --out bench/results/engine_batch_h200.json

Per shape (qwen3_8b: recipes/configs/qwen3-8b.json, z-lab's 5-layer DFlash drafter; smollm2_135m:
the shipped drafter's shape) and batch B, each row at context ``--context``: a forward of T tokens
per row (T = 1 a decode step, T = 4/8/16 a verify of T-1 drafts + the anchor, logits for all T),
replayed from a CUDA graph (fast.GraphRunner, the engine's path), timed with CUDA events, median of
``--iters`` after ``--warmup``. ``default_ms``: the engine's kernels; ``cublas_ms``: the same model
with F.linear; ``bytes_floor_ms``: weight bytes + the KV cache read / the measured read bandwidth;
``compute_floor_ms``: 2 x params x B x T (+ attention) / ``--peak-tflops``. ``propose_ms``: the
DFlash drafter's block (write the verified features, propose; StaticDFlashDrafter with the Triton
kernels, CUDA graph) for B rows, on the T = 16 rows. ``bits``: whether row 0's logits (T = 16,
default kernels) are the same bits at every B (a row's output never depends on its batch).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import engine_speed  # noqa: E402  (row configs, random models, timing)
import harness  # noqa: E402

SHAPES = ("qwen3_8b", "smollm2_135m")
T0 = time.time()


def floors(cfg, params: int, b: int, t: int, ctx: int, bw_gbs: float, peak_tflops: float) -> tuple[float, float]:
    """(bytes floor ms, compute floor ms) of one forward of B x T tokens at context ctx."""
    kv_bytes = 2 * cfg.num_hidden_layers * b * (ctx + t) * cfg.num_key_value_heads * cfg.head_dim * 2
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attn_flops = 4 * cfg.num_hidden_layers * b * t * (ctx + t) * cfg.num_attention_heads * head_dim
    bytes_ms = (params * 2 + kv_bytes) / (bw_gbs * 1e9) * 1e3
    compute_ms = (2 * params * b * t + attn_flops) / (peak_tflops * 1e12) * 1e3
    return bytes_ms, compute_ms


def run_shape(name: str, args, bw_gbs: float) -> dict:
    from domino_graft.fast import FastLM, GraphRunner, prepare_for_cuda_decoding

    dev = "cuda"
    cfg = engine_speed.load_config(engine_speed.ROWS[name])
    if args.num_layers:
        cfg.num_hidden_layers = args.num_layers
    model = engine_speed.build_model(cfg, args.seed)
    params = sum(p.numel() for p in model.parameters())
    bmax = max(args.batches)
    max_len = args.context + max(args.tokens) + 64
    lms = {}
    for variant, linears in (("default", "triton"), ("cublas", "torch")):
        os.environ["DOMINO_GRAFT_LINEARS"] = linears
        torch._dynamo.reset()
        lm = prepare_for_cuda_decoding(FastLM.from_hf(model, bmax, max_len))
        lms[variant] = (lm, GraphRunner(lm, kv_block=args.kv_block))
    os.environ.pop("DOMINO_GRAFT_LINEARS", None)
    gen = torch.Generator(device=dev).manual_seed(args.seed + 1)
    vocab = cfg.vocab_size
    prompt = torch.randint(0, vocab, (bmax, args.context), device=dev, generator=gen)
    ids = torch.randint(0, vocab, (bmax, max(args.tokens)), device=dev, generator=gen)
    for lm, _ in lms.values():  # the context: one prefill of random tokens per row
        lm.forward(prompt, 0, logits_to_keep=1, use_compiled=False, update_lengths=False)
    rows, bits = [], {}
    for b in args.batches:
        for t in args.tokens:
            if time.time() - T0 > args.deadline_s:
                print(f"[{name}] deadline: B={b} T={t} skipped", flush=True)
                continue
            r = {"B": b, "T": t}
            for variant, (lm, run) in lms.items():
                try:
                    x = ids[:b, :t]
                    got = engine_speed.time_steps(lambda: run(x, args.context)[0][:, -1].argmax(-1),
                                                  args.iters, args.warmup)
                    r[f"{variant}_ms"] = round(got["ms"], 4)
                    if variant == "default" and t == max(args.tokens):
                        bits[b] = run(x, args.context)[0][0].float().clone()
                except Exception as e:  # noqa: BLE001  recorded, the sweep goes on
                    r[f"{variant}_ms"] = engine_speed.short_error(e)
                    traceback.print_exc()
            r["bytes_floor_ms"], r["compute_floor_ms"] = (round(v, 4) for v in floors(
                cfg, params, b, t, args.context, bw_gbs, args.peak_tflops))
            if isinstance(r.get("default_ms"), float) and isinstance(r.get("cublas_ms"), float):
                r["default_over_cublas"] = round(r["default_ms"] / r["cublas_ms"], 3)
            rows.append(r)
            print(f"[{name}] {r}", flush=True)
    ref = bits.get(min(bits)) if bits else None
    out = {"params": params, "context": args.context, "by_batch": rows,
           "row0_bits_equal_across_B": {str(b): bool(torch.equal(v, ref)) for b, v in bits.items()}}
    if args.profile:
        out["profile"] = {variant: profile_step(lm, ids, args) for variant, (lm, _) in lms.items()}
    for _, run in lms.values():
        run.graphs.clear()
    del lms
    torch.cuda.empty_cache()
    if args.propose and name in args.propose_shapes.split(","):
        try:
            out["propose_ms_by_batch"] = propose_by_batch(name, model, args)
        except Exception as e:  # noqa: BLE001
            out["propose_ms_by_batch"] = engine_speed.short_error(e)
            traceback.print_exc()
        by_b = out["propose_ms_by_batch"]
        if isinstance(by_b, dict):
            for r in rows:
                if r["T"] == max(args.tokens) and str(r["B"]) in by_b:
                    r["propose_ms"] = by_b[str(r["B"])]
    del model
    torch.cuda.empty_cache()
    return out


def propose_by_batch(name: str, model, args) -> dict:
    """The DFlash drafter's block for B rows (graphed, Triton kernels), ms by B."""
    import drafter_speed
    from domino_graft.adapters.dflash.adapter import DFlashAdapter
    from domino_graft.adapters.dflash.fast import StaticDFlashDrafter
    from domino_graft.target import TargetModel

    dev = "cuda"
    dcfg = drafter_speed.drafter_config(name)
    if args.num_layers:
        dcfg.num_hidden_layers = min(dcfg.num_hidden_layers, args.num_layers)
        dcfg.layer_types = dcfg.layer_types[: dcfg.num_hidden_layers]
        dcfg.target_layer_ids = [i % args.num_layers for i in dcfg.target_layer_ids]
    adapter = DFlashAdapter(dcfg, TargetModel(model)).to(device=dev, dtype=torch.bfloat16).eval()
    gen = torch.Generator(device=dev).manual_seed(args.seed + 3)
    with torch.no_grad():
        for p in adapter.parameters():
            p.requires_grad_(False)
            p.normal_(0.0, 0.02, generator=gen) if p.dim() >= 2 else p.fill_(1.0)
    k1 = dcfg.block_size
    f = dcfg.hidden_size * len(dcfg.target_layer_ids)
    bmax = max(args.batches)
    drafter = StaticDFlashDrafter(adapter, args.context + 2 * k1 + 64, max_batch=bmax).use_kernels("triton")
    if args.drafter_linears:
        drafter.use_linears("triton")
    out = {}
    with torch.inference_mode():
        feats = torch.randn(bmax, args.context, f, device=dev, dtype=torch.bfloat16, generator=gen)
        drafter.prefill(feats, args.context)
        verified = torch.randn(bmax, k1, f, device=dev, dtype=torch.bfloat16, generator=gen)
        anchor = torch.randint(0, dcfg.vocab_size, (bmax,), device=dev, generator=gen)
        for b in args.batches:
            pos = [args.context] * b

            def block(b=b, pos=pos):
                drafter.observe_block(verified[:b], pos)
                return drafter.propose(anchor[:b], [p + 1 for p in pos]).base_logits.argmax(-1)

            out[str(b)] = round(engine_speed.time_steps(block, args.iters, args.warmup)["ms"], 4)
            print(f"[{name}] propose B={b}: {out[str(b)]} ms", flush=True)
    del drafter, adapter
    return out


def profile_step(lm, ids, args, top: int = 12) -> dict:
    """Where one eager forward of B x T tokens (``--profile B,T``) spends its device time: CUDA
    kernel time summed by kernel name (torch.profiler), the top ones and the total, in ms."""
    from torch.profiler import ProfilerActivity, profile

    b, t = args.profile
    x = ids[:b, :t]
    for _ in range(2):  # compiled, checked (small_linear's cuBLAS check) and warm
        lm.forward(x, args.context, update_lengths=False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        lm.forward(x, args.context, update_lengths=False)
        torch.cuda.synchronize()
    by_name: dict[str, float] = {}
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if us and ev.key and not ev.key.startswith("ProfilerStep"):
            by_name[ev.key[:80]] = by_name.get(ev.key[:80], 0.0) + us / 1e3
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])
    return {"B": b, "T": t, "kernel_ms_total": round(sum(by_name.values()), 3),
            "top": [{"kernel": k, "ms": round(v, 3)} for k, v in ranked[:top]]}


def register_wide_configs(path: str) -> dict:
    """The many-rows tiles of a linear_rows_probe report, registered as small_linear.WIDE."""
    from domino_graft.kernels.engine import small_linear as S

    done = {}
    for name, row in harness.read_json(path)["shapes"].items():  # plain or .json.gz
        best = row.get("best_wide")
        if not best:
            continue
        bm, bn, bk, warps, stages = best["tile"]
        cfg = S.Config(BLOCK_N=bn, BLOCK_K=bk, SPLIT=row["base"]["SPLIT"], num_warps=warps, num_stages=stages,
                       BLOCK_M=bm, SPLIT_INLINE=best["split_inline"])
        S.register_config(row["N"], row["K"], cfg, swiglu=row["swiglu"], wide=True)
        done[name] = cfg.as_dict()
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--tokens", default="1,4,8,16")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--kv-block", type=int, default=256)
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 dense peak (DESIGN.md: H200 ~790)")
    ap.add_argument("--no-propose", dest="propose", action="store_false")
    ap.add_argument("--propose-shapes", default="qwen3_8b,smollm2_135m")
    ap.add_argument("--drafter-linears", action="store_true", help="the drafter's projections through small_linear")
    ap.add_argument("--num-layers", type=int, default=0, help="smoke runs: fewer target layers")
    ap.add_argument("--wide-configs", default=None,
                    help="bench/linear_rows_probe.py's report: register each shape's best_wide (small_linear WIDE)")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="no new (B, T) row starts after this")
    ap.add_argument("--profile", default=None, help="B,T: also profile one eager forward per variant (kernel ms)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--git-sha", default=os.environ.get("DG_GIT_SHA"))
    args = ap.parse_args(argv)
    args.batches = [int(v) for v in args.batches.split(",")]
    args.tokens = [int(v) for v in args.tokens.split(",")]
    args.profile = tuple(int(v) for v in args.profile.split(",")) if args.profile else None
    engine_speed.DEV = "cuda"
    t0 = time.time()
    wide = register_wide_configs(args.wide_configs) if args.wide_configs else {}
    bw = engine_speed.read_bandwidth_gbs()
    import triton

    sha = args.git_sha or harness.git_sha()
    report = {"command": "python3 bench/engine_batch.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "git_sha": sha, "date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "read_bandwidth_gbs": round(bw, 1),
              "peak_tflops": args.peak_tflops, "wide_configs": wide, "rows": {}}
    for name in args.shapes.split(","):
        report["rows"][name] = run_shape(name, args, bw)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    report["elapsed_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
