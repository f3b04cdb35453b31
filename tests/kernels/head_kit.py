"""Shared by the Domino head's kernel tests (tests/kernels/test_{domino_rollout,triton_rollout,
triton_persistent,reference,head_ce,block_shared}.py): random heads and blocks, the comparisons
that print the first mismatches, the tolerances. Import it before triton: it sets
TRITON_INTERPRET=1 when no CUDA device is present.

CPU (default): the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1, set below
before anything imports triton) at small, awkward shapes (V = 97 / 1013, G = 20 / 36,
r = 12, batch 1 / 3), in fp32. The interpreter cannot do bf16 dots (it returned garbage for
a 16x16 bf16 tl.dot, triton 3.9), so half precision is GPU-only.

GPU (`-m gpu`): full Qwen3-8B shapes in bf16, fp32 at medium shapes, CUDA-graph replay.

Tolerances (stated once, used everywhere):
* fp32 logits / q / GRU states: atol 2e-5 + rtol 1e-5 (fp32 with a different summation order);
* bf16 (GPU): a fused greedy draft must be an argmax of the fp32 reference logits up to
  BF16_MARGIN; bf16 states/q compared at 2e-2 relative.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[2]


def _import_kernels():
    """`domino_graft.kernels`, also from a plain checkout on PYTHONPATH (the GPU machine runs the
    tree uninstalled, where the package-dir mapping of pyproject.toml does not exist)."""
    try:
        import domino_graft.kernels as k

        return k
    except ImportError:
        spec = importlib.util.spec_from_file_location(
            "domino_graft.kernels", REPO / "kernels" / "__init__.py", submodule_search_locations=[str(REPO / "kernels")]
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules["domino_graft.kernels"] = mod
        spec.loader.exec_module(mod)
        return mod


K = _import_kernels().head  # the Domino head's kernels: make_rollout, reference, domino_rollout, head_ce, ...
from domino_graft.head import DominoHead, HeadSpec  # noqa: E402

try:
    import triton  # noqa: F401

    _TRITON = True
except Exception:  # pragma: no cover
    _TRITON = False

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(
    not (_TRITON and INTERPRETED),
    reason="CPU kernel tests need triton and TRITON_INTERPRET=1 (set by this module when no CUDA device is present)",
)

ATOL, RTOL = 2e-5, 1e-5
BF16_MARGIN = 0.05  # |logit scale| ~ 5: bf16 rounding of base + head error stays far below this


@dataclass
class Block:  # duck-types adapters.base.DraftBlock (hidden, base_logits)
    hidden: torch.Tensor
    base_logits: torch.Tensor


def make_head(h, g, r, v, *, pure=1, seed=0, w2_scale=1.0, dtype=torch.float32, device="cpu"):
    spec = HeadSpec(hidden_dim=h, emb_dim=h, gru_hidden_dim=g, rank=r, vocab_size=v, pure_prefix_len=pure)
    with torch.device(device):
        head = DominoHead(spec, zero_init_w2=False)
    gen = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            scale = w2_scale if name.startswith("embed_proj.2") else 1.0
            # non-zero, unit-variance pre-activations: the correction is the same size as the base logits
            p.copy_(torch.randn(p.shape, generator=gen, device=device) * scale / p.shape[-1] ** 0.5)
    return head.to(dtype=dtype)


def make_inputs(b, k, h, v, *, seed=1, dtype=torch.float32, device="cpu"):
    gen = torch.Generator(device).manual_seed(seed)
    rnd = lambda *shape: torch.randn(shape, generator=gen, device=device)  # noqa: E731
    emb, hidden, base = rnd(v, h), rnd(b, k, h), rnd(b, k, v) * 2.0
    anchor = torch.randint(0, v, (b,), generator=gen, device=device)
    return emb.to(dtype), Block(hidden.to(dtype), base.to(dtype)), anchor


def first_mismatches(a, b, n=5):
    bad = (a != b).nonzero()[:n].tolist()
    return ", ".join(f"{tuple(i)}: {a[tuple(i)].item()} vs {b[tuple(i)].item()}" for i in bad)


def assert_close(out, ref, atol=ATOL, rtol=RTOL, what=""):
    err = (out.double() - ref.double()).abs()
    tol = atol + rtol * ref.double().abs()
    if not bool((err <= tol).all()):
        i = int((err - tol).argmax())
        raise AssertionError(f"{what}: max excess at flat index {i}: {out.flatten()[i].item()} vs {ref.flatten()[i].item()}"
                             f" (max abs err {err.max().item():.3g}, atol {atol}, rtol {rtol})")


# (B, K, H, G, r, V, pure_prefix_len): awkward on purpose
SHAPES = [
    (1, 4, 24, 20, 12, 97, 1),
    (3, 5, 40, 36, 12, 1013, 1),
    (3, 3, 16, 20, 8, 97, 0),
    (1, 4, 16, 36, 12, 1013, 2),
]


def _bucket_brute_force(base, pool):
    """Per bucket, by definition: the largest value, lowest id among equals."""
    v = base.shape[-1]
    vals, ids = [], []
    for p in range(pool):
        lo, hi = p * v // pool, (p + 1) * v // pool
        seg = base[..., lo:hi].double()
        best = seg.amax(-1, keepdim=True)
        first = (seg == best).double().argmax(-1)  # first maximal position
        vals.append(best.squeeze(-1))
        ids.append(first + lo)
    return torch.stack(vals, -1), torch.stack(ids, -1)


def _radix_brute_force(base, pool):
    """By definition, per row: the keys above the pool-th largest 24-bit key in increasing id order,
    then the ids at that key in increasing order until `pool` slots are filled."""
    key = K.reference.radix_key24(base).reshape(-1, base.shape[-1])
    out = []
    for row in key.tolist():
        thr = sorted(row, reverse=True)[pool - 1]
        above = [i for i, x in enumerate(row) if x > thr]
        eq = [i for i, x in enumerate(row) if x == thr]
        out.append(above + eq[: pool - len(above)])
    return torch.tensor(out, dtype=torch.int64).reshape(*base.shape[:-1], pool)


def _awkward_logits(b, n, v, dtype, seed=8):
    """Random logits with many exact ties: rounded values, a tied block, a constant row, signed zeros, -inf."""
    gen = torch.Generator().manual_seed(seed)
    base = (torch.randn(b, n, v, generator=gen) * 3).round(decimals=1)
    base[0, 0, 5:40] = 2.5  # a wide tie, likely across the boundary
    if n > 1:
        base[0, 1] = 1.0  # every logit equal: the lowest ids fill the pool
    base[-1, -1, :: 7] = -0.0
    base[-1, -1, 1:: 11] = 0.0
    base[-1, -1, 3] = float("-inf")
    return base.to(dtype)


class _LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """Largest tensor (bytes) any op produces: the memory figure of a loss without a GPU."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


class GPUKit:
    """The GPU tests' shapes and set-up (each test file's TestGPU derives from it)."""

    QWEN = dict(h=4096, g=1024, r=256, v=151936)

    def _setup(self, b, k, h, g, r, v, dtype, pure=1, w2_scale=1.0, seed=0):
        head = make_head(h, g, r, v, pure=pure, dtype=dtype, device="cuda", w2_scale=w2_scale, seed=seed)
        emb, block, anchor = make_inputs(b, k, h, v, dtype=dtype, device="cuda", seed=seed + 1)
        return head, emb, block, anchor, K.reference.dense_embed(emb)
