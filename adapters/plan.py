"""Plain-data description of what a graft will do, computable from configs alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class HookPoint:
    name: str  # hidden | base_logits | embed
    source: str  # where it is read from, in words
    shape: str  # e.g. "[B, 15, 4096]"


@dataclass
class FamilyPlan:
    family: str
    summary: str  # one line: the drafter's shape
    num_slots: int
    hidden_dim: int
    emb_dim: int
    vocab_size: int
    capture_layers: list[int]
    backbone_tensors: dict[str, tuple[int, ...]]
    hooks: list[HookPoint] = field(default_factory=list)
    source: str = "fresh"  # fresh (seed) | checkpoint path

    @property
    def backbone_parameters(self) -> int:
        return count_parameters(self.backbone_tensors)


def count_parameters(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(math.prod(shape) for shape in shapes.values())
