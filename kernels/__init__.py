"""Fused kernels for the Domino head (installed as `domino_graft.kernels`).

* rollout (decoding): `make_rollout("torch" | "triton" | "triton_pool", head, embedding_weight)`
  -> a drop-in `rollout(head, block, anchor, embed, *, temperature, top_k, top_p, generator,
  use_head)`; Triton kernels in `triton_rollout.py` (imported only when used), eager reference
  in `reference.py`.
* training: `head_ce` — cross-entropy over `base + W2·z` without materialising all logits.

Importing this package needs torch only (no Triton, no pydantic).
"""

from .domino_rollout import (
    ROLLOUT_NAMES,
    CudaGraphRollout,
    FusedRollout,
    KernelConfig,
    TorchRollout,
    build_gru_table,
    make_rollout,
    triton_unavailable_reason,
)
from .head_ce import dense_head_ce, head_ce
from .reference import argmax_lowest_id, filtered_probs, inverse_cdf, reference_rollout, teacher_forced_logits

__all__ = [
    "ROLLOUT_NAMES",
    "CudaGraphRollout",
    "FusedRollout",
    "KernelConfig",
    "TorchRollout",
    "argmax_lowest_id",
    "build_gru_table",
    "dense_head_ce",
    "filtered_probs",
    "head_ce",
    "inverse_cdf",
    "make_rollout",
    "reference_rollout",
    "teacher_forced_logits",
    "triton_unavailable_reason",
]
