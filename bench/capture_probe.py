"""Which capture-hygiene measure of kernels/domino_rollout.py keeps the persistent pool rollout's
first CUDA-graph capture valid on a cold Triton cache (GPU only).

    python bench/capture_probe.py --out capture_probe.json

Each variant runs the kernels' `-m gpu` tests in a fresh process with an empty TRITON_CACHE_DIR
(cold: every Triton kernel compiles in that process, as on a new machine), with the module
constants GC_OFF_DURING_CAPTURE / CAPTURE_ERROR_MODE set by a tiny pytest plugin after the tests
are collected:

- `shipped`: both measures (the defaults), the whole `-m gpu` kernel suite;
- `neither`: neither measure (the code before them), the persistent tests only;
- `gc_only` / `thread_local_only`: one measure each, the persistent tests only.

The failure it was written for (3 of 31 on two machines, cold cache only) did not occur on the
fresh machine it first ran on, in any variant, alone, beside an idle CUDA context or beside a busy
one (bench/results/capture_probe_h200*.json). The JSON lists each variant's pytest summary line,
failed tests and exit status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

VARIANTS = {  # name: (GC_OFF_DURING_CAPTURE, CAPTURE_ERROR_MODE, -k filter or None for the whole suite)
    "shipped": (True, "thread_local", None),
    "neither": (False, "global", "persistent"),
    "gc_only": (True, "global", "persistent"),
    "thread_local_only": (False, "thread_local", "persistent"),
}

PLUGIN = '''
import os, sys

def pytest_collection_finish(session):
    mod = sys.modules["domino_graft.kernels.domino_rollout"]
    mod.GC_OFF_DURING_CAPTURE = os.environ["PROBE_GC_OFF"] == "1"
    mod.CAPTURE_ERROR_MODE = os.environ["PROBE_MODE"]
    print(f"capture probe: GC_OFF_DURING_CAPTURE={mod.GC_OFF_DURING_CAPTURE} CAPTURE_ERROR_MODE={mod.CAPTURE_ERROR_MODE}")
'''


def run_variant(name: str, gc_off: bool, mode: str, filt: str | None, plugin_dir: Path, timeout: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"triton_cold_{name}_") as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "PROBE_GC_OFF": "1" if gc_off else "0", "PROBE_MODE": mode,
               "PYTHONPATH": os.pathsep.join([str(plugin_dir), str(REPO), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=",
               "-p", "capture_variant", "-s", str(REPO / "tests" / "test_kernels.py")] + (["-k", filt] if filt else [])
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    failed = [ln for ln in lines if ln.startswith("FAILED")]
    return {"gc_off_during_capture": gc_off, "capture_error_mode": mode, "tests": filt or "all -m gpu",
            "returncode": proc.returncode, "summary": lines[-1] if lines else proc.stderr[-500:],
            "failed": failed, "seconds": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    p.add_argument("--timeout", type=int, default=300, help="seconds per variant")
    args = p.parse_args(argv)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA device (the failure is in CUDA-graph capture)")
    results = {}
    with tempfile.TemporaryDirectory() as plugin_dir:
        (Path(plugin_dir) / "capture_variant.py").write_text(PLUGIN)
        for name in names:
            results[name] = run_variant(name, *VARIANTS[name], Path(plugin_dir), args.timeout)
            print(name, results[name]["summary"], flush=True)
    report = {"what": "cold-Triton-cache CUDA-graph capture of the kernels' -m gpu tests, per capture-hygiene variant",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "git_sha": os.environ.get("DG_GIT_SHA"), "command": " ".join(["python", "bench/capture_probe.py", *sys.argv[1:]]),
              "variants": results}
    sys.path.insert(0, str(REPO))
    from domino_graft.checkpoint import atomic_write_json

    atomic_write_json(Path(args.out), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
