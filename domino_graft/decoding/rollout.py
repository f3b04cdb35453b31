"""Chain rollout over one DraftBlock: the drafter's proposals d_1..d_K, and the registry of its implementations.

The Domino head is causal over the *drafted* prefix: slot j reads the GRU state after
E(x_0), E(d_1) .. E(d_{j-1}), so each draft must be chosen before the next slot can be
corrected. We advance the GRU one slot at a time (`DominoHead.step`): re-running the GRU
and the vocabulary projection over the whole block at every slot (the SpecForge
reference loop) costs K times more for the same drafts.

Contract shared by every implementation (the fused Triton rollout is a drop-in):

    rollout(head, block, anchor, embed, *, temperature, top_k, top_p, generator, use_head=True)
        -> (draft_ids [B, K] long, q [B, K, V] fp32 or None)

temperature 0: d_j = argmax(final_j), q is None. temperature > 0: d_j ~ q_j, where q_j is
the warped, Domino-corrected distribution of slot j; it is returned because speculative
sampling is only lossless when the verifier divides by the distribution the draft was
actually drawn from. use_head=False: the base drafter (slots independent, head unused).

One registry names every implementation (`domino_graft.kernels.head.domino_rollout.ROLLOUTS`,
read here and by `make_rollout`): "torch" is `rollout`, the eager reference
(`kernels/head/reference.py`: one `DominoHead.step` per slot, sampling by inverse CDF from one
uniform per slot), which every fused kernel is tested against; "triton" and "triton_pool" are
the fused kernels. Importing this module needs torch only: a kernel's Triton code is imported
when that kernel is built.
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

import torch

from domino_graft.kernels.head.domino_rollout import ROLLOUTS, KernelConfig, make_rollout
from domino_graft.kernels.head.reference import reference_rollout as rollout

RolloutFn = Callable[..., tuple[torch.Tensor, Optional[torch.Tensor]]]

__all__ = ["ROLLOUTS", "RolloutFn", "check_rollout_name", "get_rollout", "register_rollout", "rollout",
           "rollout_choice", "rollout_names"]


def register_rollout(name: str, target: str) -> None:
    """Make `get_rollout(name)` resolve to `target` ("package.module:function"), a function with
    the signature above, imported when first asked for."""

    def build(head=None, embedding_weight=None, **_):
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    ROLLOUTS[name] = build


def rollout_names() -> tuple[str, ...]:
    return tuple(ROLLOUTS)


def check_rollout_name(name: str) -> str:
    if name not in ROLLOUTS:
        raise ValueError(f"--rollout: {name!r} is not a rollout implementation; valid: {', '.join(rollout_names())}")
    return name


def get_rollout(name: str, head=None, *, pool_size: Optional[int] = None,
                pool_select: Optional[str] = None) -> RolloutFn:
    """The rollout called `name`. Kernel rollouts are built per head (they precompute weight
    layouts from it), so pass the head that will be used. pool_size / pool_select configure
    "triton_pool" (None = the kernels' defaults)."""
    kw = {} if pool_size is None else {"pool_size": int(pool_size)}
    config = KernelConfig(pool_select=pool_select) if pool_select is not None else None
    return make_rollout(check_rollout_name(name), head, config=config, **kw)


def rollout_choice(bench_section, override: Optional[str] = None) -> dict:
    """The rollout a recipe asks for (`bench.head_kernel`, `pool_size`, `pool_select`), with an
    optional CLI override of the name: {"name", "pool_size", "pool_select"} (pool keys only for
    "triton_pool"). Recorded in bench reports so a number says which kernel made it."""
    choice = {"name": check_rollout_name(override or getattr(bench_section, "head_kernel", "torch"))}
    if choice["name"] == "triton_pool":
        choice["pool_size"] = getattr(bench_section, "pool_size", 2048)
        choice["pool_select"] = getattr(bench_section, "pool_select", "topk")
    return choice
