"""Triton kernels of domino-graft (installed as `domino_graft.kernels`), grouped by the code they serve:

* `head/`: the Domino head's kernels. Decoding: `make_rollout("torch" | "triton" | "triton_pool",
  head, embedding_weight)` -> a drop-in rollout (`domino_rollout.py`; the Triton programs in
  `triton_rollout.py` and `triton_persistent.py`, a sampled slot's draw in `sample_rows.py`, imported only when used; the eager reference
  every rollout is tested against in `reference.py`). Training: `head_ce`, cross-entropy over
  `base + W2·z` without materialising all logits (`head_ce.py`).
* `engine/`: the fast target engine's kernels (`domino_graft.fast`): `small_linear.py` (few-row
  linears with fused epilogues), `decode_attention.py` (norm + RoPE + cache write, decode
  attention), `row_norm.py` (RMSNorm per row), `pdl.py` (programmatic dependent launch for their
  chains). They import Triton: import them by module.

Each kernel has a test of its own name (tests/kernels/test_<kernel>.py) and a bench entry of
its own name (bench/README.md, "Kernels"). Importing this package needs torch only (no Triton,
no pydantic); the names below are the head's, re-exported.
"""

from . import head
from .head import *  # noqa: F403  (the head's names, re-exported: head.__all__)

__all__ = list(head.__all__)
