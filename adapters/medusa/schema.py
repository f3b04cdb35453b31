"""The `drafter:` section of a Medusa recipe (torch-free: `validate` imports it)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, ValidationInfo, field_validator

from domino_graft.schema import Strict, path_fields


class MedusaDrafter(Strict):
    """Medusa-1 heads on the frozen target (FasterDecoding layout).

    Head i (0-based) reads the target's final post-norm hidden state of the last verified
    token t and predicts token t+2+i (the target's own LM head gives t+1, the anchor):
    slot j = i+1, K = num_heads."""

    family: Literal["medusa"]
    path: Optional[str] = None  # FasterDecoding folder: config.json + medusa_lm_head.safetensors (or .pt)
    config: Optional[str] = None  # a Medusa config.json, for planning when the weights are not there
    num_heads: int = Field(4, ge=1)
    num_layers: int = Field(1, ge=1)  # ResBlocks per head
    # Static tree in Medusa's "choices" notation: each path lists, per depth, the rank of the
    # chosen token among its parent's (Domino-corrected) top-k, e.g. [[0], [0, 0], [1]].
    # Every prefix of a path must itself be a path. None = chain decoding (top-1 per slot).
    tree: Optional[list[list[int]]] = None
    seed: int = 0

    _resolve_paths = path_fields("path", "config")

    @field_validator("tree")
    @classmethod
    def _tree_is_a_tree(cls, tree, info: ValidationInfo):
        if tree is None:
            return tree
        depth = info.data.get("num_heads", 4)
        problems = []
        if not tree:
            problems.append("tree: [] has no nodes; give at least [[0]] or leave tree out for chain decoding")
        seen = set()
        for n, path in enumerate(tree):
            key = tuple(path)
            if not path:
                problems.append(f"tree[{n}]: [] is empty; every path names at least one rank")
            elif any(r < 0 for r in path):
                problems.append(f"tree[{n}]: {path} has a negative rank; valid ranks are 0, 1, 2, ...")
            elif len(path) > depth:
                problems.append(f"tree[{n}]: {path} is {len(path)} deep; valid: at most num_heads = {depth}")
            elif key in seen:
                problems.append(f"tree[{n}]: {path} appears twice")
            seen.add(key)
        for n, path in enumerate(tree):
            if len(path) > 1 and tuple(path[:-1]) not in seen:
                problems.append(f"tree[{n}]: {path} has no parent {path[:-1]} in the tree; add it")
        if problems:
            raise ValueError("; ".join(problems))
        return tree
