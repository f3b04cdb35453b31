"""Programmatic dependent launch (PDL, sm_90+) for chains of Triton kernels.

A decode step is a chain of short kernels (at batch 1 an 8B model's step is ~330 launches of a few
microseconds each), and between two kernels of a CUDA graph the GPU idles while the next grid is
launched and ramps up: at 80ccb72 the Qwen3-8B-shaped step's kernels summed 4.49 ms against 4.76 ms
of wall clock. With PDL a kernel is launched with ``launch_pdl=True`` and may become resident
before its predecessor ends; it then waits (``griddepcontrol.wait``) until the predecessor has
finished and its writes are visible, before it touches memory, and only then lets its own successor
launch. So every PDL kernel reads and writes only what a finished predecessor left, which by
induction covers every earlier kernel of the chain; a kernel launched without PDL (a torch op in
between) is an ordinary stream dependency. Nothing a kernel computes changes: the bits are the
same with PDL on or off.

`pdl_enter(PDL)` is the handshake at the top of a kernel, `use_pdl(t)` says whether a launch on
t's device takes it (CUDA, compute capability 9+, not under TRITON_INTERPRET=1, and not switched off
by DOMINO_GRAFT_PDL=0 or by setting ``ENABLED = False`` here), `launch_options(pdl)` the launch's
keyword. The engine's kernels (kernels/engine/small_linear.py, row_norm.py, decode_attention.py) use
it; the Domino head's greedy rollout kernels (kernels/head/triton_rollout.py) keep a copy of the
handshake, since HF bundles ship that file verbatim.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ENABLED = os.environ.get("DOMINO_GRAFT_PDL") != "0"  # read once; a bench may set it to compare


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Wait for the predecessor to finish (its writes visible), then let the successor launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@functools.lru_cache(maxsize=None)
def _sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def use_pdl(t: torch.Tensor) -> bool:
    """Whether kernels launched on t's device take the PDL handshake."""
    if not ENABLED or INTERPRETED or not t.is_cuda:
        return False
    return _sm90(t.device.index if t.device.index is not None else torch.cuda.current_device())


def launch_options(pdl: bool) -> dict:
    # the launch keyword only when asked: a launch without PDL stays exactly what it was
    return {"launch_pdl": True} if pdl else {}
