"""kernels/engine/row_norm.py (RMSNorm, one program per row) against the engine's torch norm
(domino_graft.fast.llama_math.rms_norm), fp32 in Triton's interpreter on CPU."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="CPU kernel tests run in Triton's interpreter")


@needs_interpreter
@pytest.mark.parametrize("m,h", [(1, 64), (5, 576), (17, 100)])
def test_rms_norm_rows_equals_the_engine_norm(m, h):
    """One program per row (kernels/engine/row_norm.py) = domino_graft.fast.llama_math.rms_norm, fp32."""
    from domino_graft.fast.llama_math import rms_norm
    from domino_graft.kernels.engine.row_norm import rms_norm_rows

    g = torch.Generator().manual_seed(m + h)
    x = torch.randn((m, h), generator=g) * 3
    w = 1 + 0.1 * torch.randn((h,), generator=g)
    err = (rms_norm_rows(x, w, 1e-6) - rms_norm(x, w, 1e-6)).abs().max().item()
    assert err <= 1e-5, err
    with pytest.raises(ValueError, match=r"rms_norm_rows: weight shape \(3,\) does not match x's last dim"):
        rms_norm_rows(x, w[:3], 1e-6)
