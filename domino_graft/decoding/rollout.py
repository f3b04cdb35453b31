"""Chain rollout over one DraftBlock: the drafter's proposals d_1..d_K.

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
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

import torch

from ..sampling import sample, warp

RolloutFn = Callable[..., tuple[torch.Tensor, Optional[torch.Tensor]]]


def rollout(
    head,
    block,
    anchor: torch.Tensor,
    embed: Callable[[torch.Tensor], torch.Tensor],
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: Optional[torch.Generator] = None,
    use_head: bool = True,
):
    """The PyTorch reference rollout (see the module docstring for the contract)."""
    base = block.base_logits
    greedy = temperature == 0.0
    if not use_head or head is None:
        # Without the head the slots do not depend on each other: draft them all at once.
        if greedy:
            return base.argmax(-1), None
        q = warp(base, temperature, top_k, top_p)
        return sample(q, generator), q

    b, k, _ = base.shape
    state = head.init_state(b, device=base.device)
    prev = anchor
    drafts, qs = [], []
    for j in range(k):
        final, state = head.step(state, embed(prev), block.hidden[:, j], base[:, j])
        if greedy:
            d = final.argmax(-1)
        else:
            qj = warp(final, temperature, top_k, top_p)
            d = sample(qj, generator)
            qs.append(qj)
        drafts.append(d)
        prev = d
    return torch.stack(drafts, 1), (torch.stack(qs, 1) if qs else None)


# name -> "module:attribute" of a function with the signature above. Names not listed here
# are looked up in domino_graft.kernels (make_rollout: "triton", "triton_pool"), imported
# only when asked for, so "torch" never imports Triton.
ROLLOUTS: dict[str, str] = {
    "torch": "domino_graft.decoding.rollout:rollout",
}


def register_rollout(name: str, target: str) -> None:
    """Make `get_rollout(name)` resolve to `target` ("package.module:function")."""
    ROLLOUTS[name] = target


def _kernel_names() -> tuple[str, ...]:
    try:
        from domino_graft.kernels import ROLLOUT_NAMES
    except ImportError:
        return ()
    return tuple(n for n in ROLLOUT_NAMES if n not in ROLLOUTS)


def rollout_names() -> tuple[str, ...]:
    return tuple(ROLLOUTS) + _kernel_names()


def check_rollout_name(name: str) -> str:
    if name not in rollout_names():
        raise ValueError(f"--rollout: {name!r} is not a rollout implementation; valid: {', '.join(rollout_names())}")
    return name


def get_rollout(name: str, head=None, *, pool_size: Optional[int] = None,
                pool_select: Optional[str] = None) -> RolloutFn:
    """The rollout called `name`. Kernel rollouts are built per head (they precompute weight
    layouts from it), so pass the head that will be used. pool_size / pool_select configure
    "triton_pool" (None = the kernels' defaults)."""
    if check_rollout_name(name) in ROLLOUTS:
        module, attr = ROLLOUTS[name].split(":")
        return getattr(importlib.import_module(module), attr)
    from domino_graft.kernels import KernelConfig, make_rollout  # a kernel name (check_rollout_name passed)

    kw = {} if pool_size is None else {"pool_size": int(pool_size)}
    config = KernelConfig(pool_select=pool_select) if pool_select is not None else None
    return make_rollout(name, head, config=config, **kw)


def rollout_choice(bench_section, override: Optional[str] = None) -> dict:
    """The rollout a recipe asks for (`bench.head_kernel`, `pool_size`, `pool_select`), with an
    optional CLI override of the name: {"name", "pool_size", "pool_select"} (pool keys only for
    "triton_pool"). Recorded in bench reports so a number says which kernel made it."""
    choice = {"name": check_rollout_name(override or getattr(bench_section, "head_kernel", "torch"))}
    if choice["name"] == "triton_pool":
        choice["pool_size"] = getattr(bench_section, "pool_size", 2048)
        choice["pool_select"] = getattr(bench_section, "pool_select", "topk")
    return choice
