"""The Domino head's kernels: its rollout at decode time, its cross-entropy at training time.

Importing this package needs torch only: the Triton programs (`triton_rollout.py`,
`triton_persistent.py`, `sample_rows.py`: a sampled slot's draw, `verify_sampled.py`: the sampled accept
rule) are imported when they are used.
"""

from .domino_rollout import (
    ROLLOUT_NAMES,
    CudaGraphRollout,
    FusedRollout,
    KernelConfig,
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
