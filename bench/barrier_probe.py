"""Grid-barrier variants of the persistent pool rollout (kernels/triton_persistent.py) on one GPU.

    PYTHONPATH=. python bench/barrier_probe.py --out DIR/barrier_probe_h200.json

For each variant of `_grid_barrier` (triton_persistent.BARRIERS: how a program waits after it
arrives; "rmw" is the default):

(a) "micro": a kernel whose NPROG programs (128 and 132, at most the SM count) pass N grid
    barriers in a loop. A launch is timed N=0 and N=256 times over (median of 30 CUDA-event
    timings after warm-up, L2 not flushed; the counter is zeroed inside every timed call, which
    the difference cancels): per_barrier_us = (t256 - t0) / 256. After each series the error
    flag (must be 0) and the counter (must be N x NPROG) are read back. "timeout_check": a
    launch whose targets are never reached, with MAX_SPIN=TIMEOUT_SPIN: it must end, with the
    flag set.
(b) "rollout": the persistent pool rollout at Qwen3-8B shapes, batch 1 and 4, against the
    multi-launch one: head_latency's `pool_persistent_probe` (the fields of
    `probe_pool_persistent`) per head_latency.PERSISTENT_VARIANTS entry ("variant", with its
    KernelConfig settings): every wait, and "rmw+whh_resident", the default wait with each
    program's W_hh rows loaded once and kept for every step. The first run (session 11) showed
    ~0.8 us barriers but ~10 us phases; the resident variant tells whether re-reading W_hh was
    why. "select": the rollout's pool candidate selection alone, timed as persistent_ms is
    (eager, L2 flushed), so persistent_ms - select_ms is the rest of the rollout.

Every variant's GPU work runs in child processes: a kernel that faults poisons its process's
CUDA context, and the failure is recorded (with its error text) instead of ending the probe.

--smoke: the CPU and Triton's interpreter, (a) only: one program, N in (0, 4), "rmw" and
"volatile" ("ld_acquire" is inline PTX, which the interpreter cannot run). One program passes
every barrier at once, so this checks the code paths and the counts, not any speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import head_latency as hl  # noqa: E402  (puts the repository on sys.path, maps kernels/ if uninstalled)
from domino_graft.checkpoint import atomic_write_json  # noqa: E402
from domino_graft.rundir import git_sha  # noqa: E402
from domino_graft.kernels import triton_persistent as tp  # noqa: E402
from domino_graft.kernels.triton_persistent import _grid_barrier  # noqa: E402

NUM_WARPS = 4  # as pool_rollout_persistent launches
ITERS = 30
TIMEOUT_SPIN = 16  # MAX_SPIN of the timeout check: it fails after 16 reads instead of ~1 s
SMOKE_SKIP = {"ld_acquire": "inline PTX (ld.acquire.gpu) cannot run in the Triton interpreter"}  # -> skip reason
PURE = 1  # hl.make_problem's pure_prefix_len: the selection covers slots 1..K-1
MICRO_TIMEOUT_S = 300
ROLLOUT_TIMEOUT_S = 300


@triton.jit
def _barrier_loop_kernel(bar_ptr, err_ptr, n_barriers, extra, NPROG, MAX_SPIN: tl.constexpr, SPIN: tl.constexpr):
    """Every program passes `n_barriers` grid barriers; barrier n waits for n x NPROG arrivals
    plus `extra` (> 0: never reached, for the timeout check)."""
    failed = tl.program_id(0) * 0
    for n in range(1, n_barriers + 1):
        failed = _grid_barrier(bar_ptr, err_ptr, n * NPROG + extra, failed, MAX_SPIN, SPIN)


# ----------------------------------------------------------------------------- (a) micro


def micro_plan(smoke: bool) -> tuple[list[int], list[int]]:
    """(program counts, barrier counts): all programs must be co-resident, so at most one per SM."""
    if smoke:
        return [1], [0, 4]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return sorted({min(n, sms) for n in (128, 132)}), [0, 256]


def _launcher(sync: torch.Tensor, variant: str, nprog: int, n: int, max_spin: int, extra: int = 0):
    bar, err = sync[0:1], sync[1:2]

    def launch():
        bar.zero_()  # a fresh counter per launch; err accumulates over a series
        _barrier_loop_kernel[(nprog,)](bar, err, n, extra, nprog, MAX_SPIN=max_spin, SPIN=tp.BARRIERS[variant],
                                       num_warps=NUM_WARPS)

    return launch


def timeout_check(sync: torch.Tensor, variant: str, nprog: int, n: int = 2) -> dict:
    """Unreachable targets: every program still arrives at every barrier, gives up on the first
    after TIMEOUT_SPIN reads and never waits again, so the launch ends with the flag set."""
    sync.zero_()
    _launcher(sync, variant, nprog, n, TIMEOUT_SPIN, extra=1)()
    counter, flag = sync.tolist()
    return dict(error_flag=flag, counter_after=counter, ok=flag == 1 and counter == n * nprog)


def micro(variant: str, smoke: bool) -> list[dict]:
    """One row per program count: launch time per barrier count, per-barrier time, read-backs."""
    nprogs, ns = micro_plan(smoke)
    sync = torch.zeros(2, device=hl.DEV, dtype=torch.int32)  # [barrier counter, error flag]
    rows = []
    for nprog in nprogs:
        row = dict(variant=variant, nprog=nprog, num_warps=NUM_WARPS, launch_ms={}, counter_after={}, error_flag=0)
        for n in ns:
            launch = _launcher(sync, variant, nprog, n, tp.PERSISTENT_MAX_SPIN)
            sync.zero_()
            row["launch_ms"][str(n)] = hl.time_ms(launch, warmup=5, iters=ITERS, flush=False)
            counter, flag = sync.tolist()  # after the series' last launch
            row["counter_after"][str(n)] = counter
            row["error_flag"] = max(row["error_flag"], flag)
        row["counts_ok"] = all(row["counter_after"][str(n)] == n * nprog for n in ns)
        t = row["launch_ms"]
        row["per_barrier_us"] = 1000 * (t[str(ns[-1])] - t[str(ns[0])]) / (ns[-1] - ns[0])
        row["timeout_check"] = timeout_check(sync, variant, nprog)
        rows.append(row)
        print("micro", row, flush=True)
    return rows


def run_child(args: list[str], timeout_s: int) -> dict:
    """This script with `args` in a child process -> the JSON it wrote, or {"error": ...}."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "child.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), *args, "--out", str(path)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return dict(error=f"timed out after {timeout_s} s")
        if proc.returncode != 0 or not path.exists():
            return dict(error=(proc.stdout[-1500:] + proc.stderr[-3000:]) or "no output", returncode=proc.returncode)
        return json.loads(path.read_text())


def micro_all(smoke: bool) -> list[dict]:
    rows = []
    for variant in tp.BARRIERS:
        if smoke and variant in SMOKE_SKIP:
            rows.append(dict(variant=variant, skipped=SMOKE_SKIP[variant]))
            continue
        out = run_child(["--micro-child", variant] + (["--smoke"] if smoke else []), MICRO_TIMEOUT_S)
        rows += out["rows"] if "rows" in out else [dict(variant=variant, **out)]
    return rows


# ----------------------------------------------------------------------------- (b) rollout


def rollout_all(cfg) -> list[dict]:
    """head_latency's persistent-vs-multi-launch probe (its own child process) per variant
    (head_latency.PERSISTENT_VARIANTS: every wait, and W_hh resident at the default wait)."""
    return [dict(variant=name, **hl.PERSISTENT_VARIANTS[name], **probe)
            for name, probe in hl.pool_persistent_probes(cfg, ROLLOUT_TIMEOUT_S).items()]


def select_only(cfg, batches=(1, 4)) -> list[dict]:
    """The pool rollout's candidate selection ([B, K-1, V] bf16 base logits -> POOL) alone, per call
    (eager, L2 flushed before every call: as persistent_ms is timed, plus its launch overhead)."""
    d = hl.SHAPES["qwen3_8b"]
    rows = []
    for b in batches:
        block, _ = hl.make_block(d, b)
        base = block.base_logits[:, PURE:]
        select = hl._select_fns(base, hl.POOL, cfg)[cfg.pool_select]  # what the fused rollout runs
        rows.append(dict(batch=b, pool_select=cfg.pool_select, pool=hl.POOL,
                         select_ms=hl.time_ms(select, iters=100)))
        print("select", rows[-1], flush=True)
        del block, base
        hl.empty_cache()
    return rows


# ----------------------------------------------------------------------------- the record


def header(smoke: bool) -> dict:
    gpu = not smoke
    return dict(
        op="grid_barrier_probe",
        device=torch.cuda.get_device_name(0) if gpu else "cpu (TRITON_INTERPRET=1)",
        sms=torch.cuda.get_device_properties(0).multi_processor_count if gpu else None,
        torch=torch.__version__, triton=triton.__version__, git_sha=git_sha(),
        command="python " + shlex.join(sys.argv),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        smoke=smoke, variants=list(tp.BARRIERS), max_spin=tp.PERSISTENT_MAX_SPIN, timeout_spin=TIMEOUT_SPIN,
        notes=("micro: launches of a kernel whose programs pass N grid barriers (no other work), median of "
               f"{ITERS} CUDA-event timings, L2 not flushed, counter zeroed inside each timed call; "
               "per_barrier_us = (t_N - t_0) / N. rollout: head_latency's pool_persistent_probe per barrier variant "
               "(Qwen3-8B shapes, bf16, pool 2048, CUDA graph, L2 flushed before every call, child process). "
               "select: the pool selection alone, eager, L2 flushed."
               + (" SMOKE: Triton interpreter, one program: code paths and counts only, no timing meaning."
                  if smoke else "")),
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, Triton interpreter, part (a) only: checks the code paths")
    ap.add_argument("--micro-child", default=None, help=argparse.SUPPRESS)  # one variant's (a), in a child process
    args = ap.parse_args()
    if args.smoke:
        hl.use_smoke_mode()
    if args.micro_child:
        atomic_write_json(args.out, dict(rows=micro(args.micro_child, args.smoke)))
        return
    t0 = time.time()
    res = header(args.smoke)
    res["micro"] = micro_all(args.smoke)
    atomic_write_json(args.out, res)  # partial results survive a later failure
    if not args.smoke:
        cfg = hl.K.KernelConfig()
        res["kernel_config"] = dataclasses.asdict(cfg)
        res["select"] = select_only(cfg)
        res["rollout"] = rollout_all(cfg)
    res["errors"] = [f"{part} {r.get('variant', r.get('barrier'))}: {r['error'][-300:]}"
                     for part in ("micro", "rollout") for r in res.get(part, []) if "error" in r]
    res["wall_s"] = time.time() - t0
    atomic_write_json(args.out, res)
    for r in res["micro"]:
        print(r["variant"], r.get("nprog"), r.get("per_barrier_us", r.get("skipped") or r.get("error", "")[-200:]))
    print(f"errors: {len(res['errors'])}  wall {res['wall_s']:.0f}s  -> {args.out}")


if __name__ == "__main__":
    main()
