"""Few-row linear layers on one GPU: cuBLAS (F.linear) against kernels/engine/small_linear.py's Triton
kernels at the decode shapes of Qwen3-8B and SmolLM2-135M (batch 1: M = 1 a decode step, M = 16
a verify of 16 tokens), bf16, random non-zero weights.

    PYTHONPATH=. python bench/linear_speed.py --out bench/work/linear_speed_h200.json
    PYTHONPATH=. python bench/linear_speed.py --shapes smollm2_135m --m 1,4,16 --out OUT.json

For each model's projections (qkv, o, gate_up, down, and Qwen3-8B's lm_head) and each M it times

  cublas              F.linear(x, w)
  small_linear        every config of ``candidate_configs(N, K)`` (<= 24; the default first)
  cublas_swiglu       gate_up only: F.linear, then F.silu(g) * u (three kernels, as the engine does)
  small_linear_swiglu gate_up only: every SwiGLU candidate (one kernel, no [M, 2I] intermediate)
  cublas_residual     o and down only: r + F.linear(x, w) (two kernels), against
  fused_residual      small_linear(x, w, residual=r) with the row's fastest config

Timing: ``--calls`` (20) back-to-back calls captured in one CUDA graph, so the launch overhead is
what the engine's graphed decode step sees, replayed ``--reps`` times (after a warm-up replay),
each replay timed with CUDA events; per call = replay time / calls, the median over replays.
The calls cycle through enough copies of the weight to cover twice the L2 (``weight_copies``),
so every call reads its weight from HBM, as a model whose every layer has its own weights.

Per timing: median us, GB/s of the bytes a call must move (W, x and y once each, bf16), and the
percentage of the measured read bandwidth: a ``.sum()`` over a 4 GiB bf16 tensor of random
values (bytes read / median time of 10 sums, far beyond the L2). ``floor_us`` = bytes / that
bandwidth. Each small_linear config also gives its max abs diff against F.linear. ``winners``:
per layer the config with the least total time over the M values run (a config must not depend
on M: a row's bits would then change with the number of rows), and each M's own fastest.

``--deadline-s`` (80): no new timing starts after it; skipped configs are listed and the report
says ``complete: false``, so the script stays under 90 s even with a cold Triton cache (each new
config is a compile). Records torch / triton versions, the device, the git sha (DG_GIT_SHA, else
``git rev-parse``). GPU only; ``--help`` and the pure-Python helpers work anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# hidden, heads, kv heads, head_dim, intermediate, vocab (None: the LM head is left out)
MODELS = {
    "qwen3_8b": {"hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "intermediate": 12288, "vocab": 151936},
    "smollm2_135m": {"hidden": 576, "heads": 9, "kv_heads": 3, "head_dim": 64, "intermediate": 1536, "vocab": None},
}
RESIDUAL_LAYERS = ("o", "down")  # the layers whose output is added to the residual stream
BW_PROBE = "torch.sum over a 4 GiB bf16 tensor of random values: bytes read / median of 10 (3 warm-up)"


def model_shapes(name: str) -> dict[str, tuple[int, int]]:
    """Layer -> (N, K) of its weight [N, K] (gate_up: the fused [2I, hidden])."""
    d = MODELS[name]
    h = d["hidden"]
    out = {
        "qkv": ((d["heads"] + 2 * d["kv_heads"]) * d["head_dim"], h),
        "o": (h, d["heads"] * d["head_dim"]),
        "gate_up": (2 * d["intermediate"], h),
        "down": (h, d["intermediate"]),
    }
    if d["vocab"]:
        out["lm_head"] = (d["vocab"], h)
    return out


def bytes_moved(n: int, k: int, m: int, elem: int, out_cols: int | None = None) -> int:
    """What one call must read and write at least: W [n, k], x [m, k], y [m, out_cols or n]."""
    return elem * (n * k + m * k + m * (n if out_cols is None else out_cols))


def gbps(nbytes: float, us: float) -> float:
    return nbytes / us / 1e3


def _csv(kind):
    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("an empty list")
        if kind is int:
            try:
                vals = [int(t) for t in items]
            except ValueError as e:
                raise argparse.ArgumentTypeError(f"{text!r}: not a comma-separated list of ints") from e
            if min(vals) < 1:
                raise argparse.ArgumentTypeError(f"{text!r}: rows must be >= 1")
            return vals
        bad = [t for t in items if t not in MODELS]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown shapes {bad}; valid: {', '.join(MODELS)}")
        return items

    return parse


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="write the JSON report here (else stdout only)")
    p.add_argument("--shapes", type=_csv(str), default=list(MODELS),
                   help=f"comma-separated models (default: all): {', '.join(MODELS)}")
    p.add_argument("--m", type=_csv(int), default=[1, 16], help="comma-separated row counts (default 1,16)")
    p.add_argument("--calls", type=int, default=20, help="back-to-back calls per CUDA graph (default 20)")
    p.add_argument("--reps", type=int, default=20, help="timed graph replays per measurement (default 20)")
    p.add_argument("--deadline-s", type=float, default=80.0,
                   help="start no new timing after this many seconds (default 80)")
    p.add_argument("--max-candidates", type=int, default=24, help="configs per shape (default 24, the most)")
    return p.parse_args(argv)


def git_sha() -> str | None:
    if os.environ.get("DG_GIT_SHA"):
        return os.environ["DG_GIT_SHA"]
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True,
                           timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return r.stdout.strip() or None


def _import_small_linear():
    try:
        from domino_graft.kernels.engine import small_linear

        return small_linear
    except ImportError:  # uninstalled checkout: map kernels/ into the namespace as pyproject does
        spec = importlib.util.spec_from_file_location(
            "domino_graft.kernels", REPO / "kernels" / "__init__.py",
            submodule_search_locations=[str(REPO / "kernels")])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["domino_graft.kernels"] = mod
        spec.loader.exec_module(mod)
        from domino_graft.kernels.engine import small_linear

        return small_linear


# ------------------------------------------------------------------------------- GPU parts


def read_bandwidth(torch) -> float:
    """GB/s of a sum over 4 GiB of bf16 (see BW_PROBE)."""
    x = torch.randn(2**31, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x.sum()
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.sum()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    nbytes = x.numel() * 2
    del x
    torch.cuda.empty_cache()
    return gbps(nbytes, statistics.median(times))


def time_in_graph(torch, fns: list, calls: int, reps: int) -> float:
    """Median us per call of ``calls`` back-to-back calls (cycling through fns) in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fns[i % len(fns)]()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    del g
    return statistics.median(times)


def _key(config: dict) -> tuple:
    return tuple(sorted(config.items()))


def _timed_ok(entry: dict) -> bool:
    return isinstance(entry.get("us"), float) and math.isfinite(entry["us"])


def pick_winners(rows: list[dict]) -> dict:
    """Per (model, layer, op): the config with the least total time over the M values run (only
    configs timed at every M compete: the engine uses one config whatever M), and each M's fastest."""
    groups: dict[tuple, list[dict]] = {}
    for rw in rows:
        groups.setdefault((rw["model"], rw["layer"], rw["op"]), []).append(rw)
    winners = {}
    for (model, layer, op), mine in groups.items():
        per_row = [{_key(c["config"]): c["us"] for c in rw["configs"] if _timed_ok(c)} for rw in mine]
        common = set.intersection(*(set(t) for t in per_row)) if per_row else set()
        total = {key: sum(t[key] for t in per_row) for key in common}
        pick = min(sorted(total), key=total.get) if total else None
        as_given = {_key(c["config"]): c["config"] for rw in mine for c in rw["configs"]}
        cublas = [rw["cublas"]["us"] for rw in mine if _timed_ok(rw["cublas"])]
        winners[f"{model}/{layer}/{op}"] = {
            "n": mine[0]["n"], "k": mine[0]["k"], "m": [rw["m"] for rw in mine],
            "config_all_m": as_given[pick] if pick else None, "us_sum_all_m": total[pick] if pick else None,
            "cublas_us_sum_all_m": sum(cublas) if len(cublas) == len(mine) else None,
            "per_m": {str(rw["m"]): rw["best"]["config"] for rw in mine if "best" in rw},
        }
    return winners


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("linear_speed: needs a CUDA device (GPU timing with CUDA graphs)", file=sys.stderr)
        return 2
    import triton

    S = _import_small_linear()
    dev = torch.device("cuda")
    dt = torch.bfloat16
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 50 << 20))
    bw = read_bandwidth(torch)
    print(f"read bandwidth {bw:.0f} GB/s ({BW_PROBE}); L2 {l2 >> 20} MiB; {props.multi_processor_count} SMs")
    gen = torch.Generator(dev).manual_seed(0)
    calls = max(1, args.calls)
    state = {"complete": True}
    skipped, rows = [], []

    def timed(label: str, fns: list, nbytes: int, **extra) -> dict:
        """One measurement as a report entry: us, GB/s, % of read bw; skipped past the deadline;
        the error of a config that does not run (e.g. too much shared memory)."""
        if time.perf_counter() - t0 > args.deadline_s:
            state["complete"] = False
            skipped.append(label)
            return {"skipped": True, **extra}
        try:
            us = time_in_graph(torch, fns, max(calls, len(fns)), args.reps)
        except Exception as e:  # noqa: BLE001  recorded, the sweep goes on
            print(f"  {label}: failed: {type(e).__name__}: {str(e)[:200]}")
            return {"error": f"{type(e).__name__}: {e}"[:300], **extra}
        rate = gbps(nbytes, us)
        return {"us": us, "gbps": rate, "pct_read_bw": 100 * rate / bw, **extra}

    def max_diff(a, b) -> float:
        return (a.float() - b.float()).abs().max().item()

    for model in args.shapes:
        for layer, (n, k) in model_shapes(model).items():
            copies = S.weight_copies(n * k * 2, l2)
            ws = [(torch.randn((n, k), generator=gen, device=dev) / math.sqrt(k)).to(dt) for _ in range(copies)]
            for m in args.m:
                x = torch.randn((m, k), generator=gen, device=dev).to(dt)
                r = torch.randn((m, n), generator=gen, device=dev).to(dt)
                for op in ["linear"] + (["swiglu"] if layer == "gate_up" else []):
                    sw = op == "swiglu"
                    nbytes = bytes_moved(n, k, m, 2, n // 2 if sw else n)
                    label = f"{model}/{layer}/{op}/m{m}"
                    kern = S.small_linear_swiglu if sw else S.small_linear
                    ref_fn = _swiglu_eager(F, x) if sw else (lambda w, x=x: F.linear(x, w))
                    ref = ref_fn(ws[0])
                    row = {"model": model, "layer": layer, "op": op, "n": n, "k": k, "m": m, "bytes": nbytes,
                           "weight_copies": copies, "floor_us": nbytes / bw / 1e3,
                           "cublas": timed(label + "/cublas", [lambda w=w, f=ref_fn: f(w) for w in ws], nbytes),
                           "configs": []}
                    cands = S.candidate_configs(n, k, swiglu=sw, dtype=dt, limit=args.max_candidates)
                    for cfg in cands:
                        extra = {"config": cfg.as_dict(), "default": cfg == cands[0]}
                        try:
                            extra["max_abs_diff_vs_cublas"] = max_diff(kern(x, ws[0], config=cfg), ref)
                        except Exception as e:  # noqa: BLE001
                            row["configs"].append({"error": f"{type(e).__name__}: {e}"[:300], **extra})
                            continue
                        fns = [lambda w=w, c=cfg, f=kern, x=x: f(x, w, config=c) for w in ws]
                        row["configs"].append(timed(f"{label}/{cfg}", fns, nbytes, **extra))
                    ok = [c for c in row["configs"] if _timed_ok(c)]
                    if ok:
                        row["best"] = min(ok, key=lambda c: c["us"])
                        row["default"] = next((c for c in ok if c["default"]), None)
                        if _timed_ok(row["cublas"]):
                            row["speedup_vs_cublas"] = row["cublas"]["us"] / row["best"]["us"]
                    if ok and layer in RESIDUAL_LAYERS and not sw:  # the fused epilogue against two kernels
                        cfg = S.Config(**row["best"]["config"])
                        rb = bytes_moved(n, k, m, 2) + 2 * m * n
                        row["cublas_residual"] = timed(label + "/cublas_residual",
                                                       [lambda w=w, x=x, r=r: r + F.linear(x, w) for w in ws], rb)
                        fns = [lambda w=w, x=x, r=r, c=cfg: S.small_linear(x, w, residual=r, config=c) for w in ws]
                        diff = max_diff(S.small_linear(x, ws[0], residual=r, config=cfg), r + F.linear(x, ws[0]))
                        row["fused_residual"] = timed(label + "/fused_residual", fns, rb, config=cfg.as_dict(),
                                                      max_abs_diff_vs_cublas=diff)
                    rows.append(row)
                    msg = f"{label}: cublas {row['cublas'].get('us', float('nan')):.2f} us"
                    if "best" in row:
                        b = row["best"]
                        msg += f", best {b['us']:.2f} us ({b['pct_read_bw']:.0f}% of read bw) {b['config']}"
                    print(msg + f", floor {row['floor_us']:.2f} us")
            del ws
            gc.collect()
            torch.cuda.empty_cache()

    report = {
        "bench": "linear_speed", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(dev), "sms": props.multi_processor_count, "l2_bytes": l2,
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda, "git_sha": git_sha(),
        "command": " ".join([Path(sys.argv[0]).name] + (list(argv) if argv is not None else sys.argv[1:])),
        "dtype": "bfloat16", "read_bw_gbps": bw, "read_probe": BW_PROBE, "calls_per_graph": calls,
        "reps": args.reps, "m": args.m, "shapes": args.shapes, "complete": state["complete"], "skipped": skipped,
        "seconds": time.perf_counter() - t0, "winners": pick_winners(rows), "rows": rows,
    }
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out} ({report['seconds']:.0f} s, complete={state['complete']})")
    else:
        print(text)
    return 0


def _swiglu_eager(F, x):
    """The engine's eager MLP input: F.linear, then F.silu(gate) * up in bf16 (three kernels)."""
    def run(w):
        g, u = F.linear(x, w).chunk(2, dim=-1)
        return F.silu(g) * u

    return run


if __name__ == "__main__":
    raise SystemExit(main())
