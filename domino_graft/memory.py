"""Refuse, before anything is allocated, a graft that cannot fit in this machine's memory.

The schema caps each size (domino_graft/schema.py), but products of allowed sizes can still ask
for terabytes (a rank-100,000 head on a 4M-token vocabulary). `apply` builds the random target,
the fresh drafter and the head in fp32 on the CPU first, so their parameter count times four
bytes, from the plan alone, must fit in the memory available now; otherwise the allocator fails
minutes later with a message that names no field.
"""

from __future__ import annotations

import os
from typing import Optional

BYTES_PER_PARAMETER = 4  # built in fp32, cast afterwards


def available_bytes() -> Optional[int]:
    """MemAvailable (Linux), else free physical pages; None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def random_target_tensors(shape) -> dict[str, tuple[int, ...]]:
    """The large tensors of a random target built from a TargetShape (norms left out)."""
    h, q, kv = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * shape.intermediate_size
    out = {"target.embed_tokens": (shape.vocab_size, h), "target.layers (all)": (shape.num_layers, per_layer)}
    if not shape.tie_word_embeddings:
        out["target.lm_head"] = (shape.vocab_size, h)
    return out


def check_fits(plan, *, random_target: bool, available: Optional[int] = None) -> None:
    """ValueError naming the largest tensors when the plan's fresh tensors exceed the memory available."""
    import math

    from .target import TargetShape

    tensors = {**{f"head.{k}": v for k, v in plan.head_tensors.items()},
               **{f"drafter.{k}": v for k, v in plan.drafter.backbone_tensors.items()}}
    if random_target:
        tensors.update(random_target_tensors(TargetShape(**plan.target)))
    need = sum(math.prod(s) for s in tensors.values()) * BYTES_PER_PARAMETER
    available = available_bytes() if available is None else available
    if available is None or need <= available:
        return
    largest = sorted(tensors.items(), key=lambda kv: -math.prod(kv[1]))[:2]
    shown = ", ".join(f"{n} {list(s)}" for n, s in largest)
    raise ValueError(f"apply: the graft needs ~{need / 2**30:,.1f} GiB to build (largest: {shown}) and this machine "
                     f"has {available / 2**30:,.1f} GiB available; valid: smaller sizes (head.rank, "
                     "head.gru_hidden_dim, drafter.num_layers, target.random.*); nothing was written")
