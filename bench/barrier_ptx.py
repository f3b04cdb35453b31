"""The PTX Triton emits for each grid-barrier wait (kernels/triton_persistent.py BARRIERS), compiled
offline for sm_90 (no GPU needed): the memory and synchronisation instructions of
bench/barrier_probe.py's barrier-loop kernel, in order, so one can read how each wait polls.

    python bench/barrier_ptx.py --out bench/results/barrier_ptx_sm90.txt

What to look for: "rmw" (tl.atomic_add(bar, 0, acquire)) polls with one thread's
ld.global.gpu.acquire, passed to the CTA through shared memory between bar.sync's at every read;
"volatile" and "ld_acquire" poll with a load in every thread and no bar.sync inside the loop.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

sys.path.insert(0, str(Path(__file__).resolve().parent))
import barrier_probe as bp  # noqa: E402  (maps kernels/ like head_latency does)

SIGNATURE = {"bar_ptr": "*i32", "err_ptr": "*i32", "n_barriers": "i32", "extra": "i32", "NPROG": "i32",
             "MAX_SPIN": "constexpr", "SPIN": "constexpr"}
# loads, stores, atomics, barriers, branches and labels: the shape of each wait loop
KEEP = re.compile(r"^\s*(\$L__|@?%?\S*\s*(ld\.|st\.|atom\.|bar\.|bra|fence|membar))")


def ptx_of(barrier: str, arch: int = 90) -> str:
    src = triton.compiler.ASTSource(fn=bp._barrier_loop_kernel, signature=SIGNATURE,
                                    constexprs={"MAX_SPIN": 1024, "SPIN": bp.tp.BARRIERS[barrier]})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32)).asm["ptx"]


def sync_lines(ptx: str) -> list[str]:
    body = ptx[ptx.index("{"):]  # the kernel body, after the .entry's parameter list
    return [" ".join(line.split()) for line in body.splitlines() if KEEP.match(line) and "param" not in line]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    parts = [f"# triton {triton.__version__}, sm_{args.arch}: bench/barrier_probe.py's _barrier_loop_kernel, "
             "memory and synchronisation instructions only"]
    for barrier in bp.tp.BARRIERS:
        parts += ["", f"## {barrier}", *sync_lines(ptx_of(barrier, args.arch))]
    text = "\n".join(parts) + "\n"
    if args.out:
        from domino_graft.checkpoint import atomic_write_text

        atomic_write_text(args.out, text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
