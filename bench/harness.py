"""The benchmark suite's shared harness: timing, spread, environment, result files, the index.

Every bench script times with `time_cuda` (CUDA events around each call after `warmup` untimed
ones; wall clock on the CPU, where the numbers only prove the script runs), reports medians with
their spread (`spread`), and stamps its report with `environment(command)`: gpu, torch / triton /
CUDA versions, commit, date and the command line. `read_json` reads a report plain or gzipped
(bench/results keeps raw records and history as `.json.gz` / `.jsonl.gz`).

    python bench/harness.py index              # rebuild bench/results/index.json from the reports
    python bench/harness.py index --check      # exit 1 if the committed index is stale

bench/ is not a package: scripts import this module with bench/ on sys.path (running a script
puts its folder there).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def git_sha(short: bool = True) -> Optional[str]:
    """DG_GIT_SHA (a checkout copied to a GPU machine without .git), else git's HEAD, else None."""
    if os.environ.get("DG_GIT_SHA"):
        return os.environ["DG_GIT_SHA"]
    try:
        out = subprocess.run(["git", "rev-parse", *(["--short"] if short else []), "HEAD"], cwd=REPO,
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    return out or None


def switches() -> dict:
    """The kernels' switches (DOMINO_GRAFT_PDL, _SAMPLE_LOGITS, _SAMPLE_ROWS, _LINEARS, ...) a run is under."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("DOMINO_GRAFT_") and k != "DOMINO_GRAFT_CACHE"}


def environment(command: Optional[str] = None) -> dict:
    """Where a number was measured: gpu, versions, commit, date (UTC) and the command line."""
    import torch

    env = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "commit": git_sha(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": command if command is not None else shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}
    env["switches"] = switches()
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def cuda_memory() -> dict:
    """The CUDA caching allocator's memory now (GiB): allocated, reserved, peak allocated; {} without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {}
    torch.cuda.synchronize()
    gib = 2.0 ** 30
    return {"allocated_gib": round(torch.cuda.memory_allocated() / gib, 3),
            "reserved_gib": round(torch.cuda.memory_reserved() / gib, 3),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / gib, 3)}


def spread(samples_ms: list[float]) -> dict:
    """Median and spread of timings: min, quartiles, max, n (ms)."""
    s = sorted(samples_ms)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {"ms": statistics.median(s), "min_ms": s[0], "p25_ms": q[0], "p75_ms": q[2], "max_ms": s[-1], "n": len(s)}


def time_cuda(fn: Callable[[], object], iters: int = 20, warmup: int = 3) -> dict:
    """`spread` of fn()'s time: CUDA events around each call on a GPU (one synchronise per call, so
    calls do not overlap), wall clock on the CPU. `warmup` untimed calls first (compiles, autotunes)."""
    import torch

    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ts.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    return spread(ts)


def read_json(path) -> dict:
    """A report, plain (`.json`) or gzipped (`.json.gz`)."""
    path = Path(path)
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


def read_jsonl(path) -> list[dict]:
    """Records, one JSON per line, plain or gzipped."""
    path = Path(path)
    data = path.read_bytes()
    text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_json(path, report: dict) -> None:
    Path(path).write_text(json.dumps(report, indent=1) + "\n")


# ------------------------------------------------------------------------------------------ the index

# older reports name these fields their own way (device, git_sha, ...); the index reads them all
_FIELDS = {"gpu": ("gpu", "device", "device_name"), "commit": ("commit", "git_sha"), "date": ("date", "timestamp"),
           "command": ("command",)}


# where a report keeps its provenance beside the top level (not a section's own run: engine_h200.json's
# end_to_end section carries the end-to-end call's command, not the file's)
_PROVENANCE = ("hardware", "versions", "environment", "env")


def _first(report: dict, names):
    """The first scalar under any of `names`: at the top level, else in a provenance section."""
    for where in (report, *(report.get(k) for k in _PROVENANCE)):
        if isinstance(where, dict):
            for name in names:
                if name in where and not isinstance(where[name], (dict, list)):
                    return where[name]
    return None


def index_rows(results: Path = RESULTS, root: Path = REPO) -> list[dict]:
    """One row per committed report (bench/results/*.json): its file (relative to root) and where it came from."""
    rows = []
    for path in sorted(results.glob("*.json")):
        if path.name == "index.json":
            continue
        report = read_json(path)
        row = {"file": path.relative_to(root).as_posix()}
        for field, names in _FIELDS.items():
            value = _first(report, names)
            row[field] = None if value is None else str(value)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="bench/results/index.json: one row per report (gpu, commit, date, command)")
    p.add_argument("what", choices=["index"])
    p.add_argument("--check", action="store_true", help="compare with the committed index instead of writing it")
    args = p.parse_args(argv)
    index = {"what": "one row per report in bench/results: the gpu, commit, date and command it records "
                     "(null: the report does not record it; docs/results.md says where it was measured)",
             "command": "python bench/harness.py index", "rows": index_rows()}
    out = RESULTS / "index.json"
    if args.check:
        same = out.is_file() and json.loads(out.read_text()) == index
        print(f"{out.relative_to(REPO)}: {'up to date' if same else 'STALE (python bench/harness.py index)'}")
        return 0 if same else 1
    write_json(out, index)
    print(f"wrote {out.relative_to(REPO)} ({len(index['rows'])} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
