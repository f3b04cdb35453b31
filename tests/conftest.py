"""Shared fixtures: tiny random targets/drafters/heads built from the shipped tiny recipe."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import pytest
import torch

# On a CPU the Triton interpreter must be on before any kernel is defined, for the whole run. tests/kernels/
# and test_batched_static_drafter turn it on too, but only when imported: a run that loaded the rollout's
# kernels first (test_batched, then a budget test that imports test_batched_static_drafter, then
# test_kernel_rollout_is_a_drop_in) failed in the interpreter at a nested @triton.jit helper ("Cannot call
# @triton.jit'd outside of the scope of a kernel").
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]
TINY_RECIPE = REPO / "recipes" / "tiny_dflash.yaml"


def _bind_hub_kernels() -> None:
    """transformers >= 5.25 imports the distribution `kernels` (the Hub's kernels) under that top-level
    name; with the repository root on sys.path, as under pytest, the checkout's own kernels/ folder
    (installed as domino_graft.kernels) would answer it instead. Bind the name to the distribution first."""
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        return
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if Path(os.path.abspath(p or os.curdir)) != REPO]
    try:
        sys.modules.pop("kernels", None)
        import kernels  # noqa: F401  (the distribution's)
    finally:
        sys.path[:] = saved


_bind_hub_kernels()

# Two cores on CI: keep each test process from oversubscribing them.
torch.set_num_threads(1)  # measured: on 2 shared cores, tiny models run 10-100x slower with 2 threads


@pytest.fixture(scope="session")
def tiny_recipe_path() -> Path:
    return TINY_RECIPE


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A run dir written by `apply` on the tiny recipe (shared; treat as read-only)."""
    from domino_graft.apply import apply_recipe

    out = tmp_path_factory.mktemp("runs") / "tiny"
    apply_recipe(str(TINY_RECIPE), str(out), echo=lambda *_: None)
    return out


def randomize_head(head, seed: int = 0, scale: float = 0.5) -> None:
    """Give W2 (zero at graft time) real weights so the correction matters in tests."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale / max(1, p.shape[-1]) ** 0.5)
