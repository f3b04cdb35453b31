"""The `drafter:` section of a Medusa recipe (torch-free: `validate` imports it)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from domino_graft.schema import MAX_LAYERS, MAX_SLOTS, Strict, path_fields, seed_field


class MedusaDrafter(Strict):
    """Medusa-1 heads on the frozen target (FasterDecoding layout).

    Head i (0-based) reads the target's final post-norm hidden state of the last verified
    token t and predicts token t+2+i (the target's own LM head gives t+1, the anchor):
    slot j = i+1, K = num_heads."""

    family: Literal["medusa"]
    path: Optional[str] = None  # FasterDecoding folder: config.json + medusa_lm_head.safetensors (or .pt)
    config: Optional[str] = None  # a Medusa config.json, for planning when the weights are not there
    num_heads: int = Field(4, ge=1, le=MAX_SLOTS)
    num_layers: int = Field(1, ge=1, le=MAX_LAYERS)  # ResBlocks per head
    # Static tree in Medusa's "choices" notation: each path lists, per depth, the rank of the
    # chosen token among its parent's (Domino-corrected) top-k, e.g. [[0], [0, 0], [1]].
    # Every prefix of a path must itself be a path. None = chain decoding (top-1 per slot).
    tree: Optional[list[list[int]]] = None
    seed: int = seed_field()

    _resolve_paths = path_fields("path", "config")

    @model_validator(mode="after")
    def _tree_is_a_tree(self):
        tree = self.tree
        if tree is None:
            return self
        # the depth limit is num_heads: the recipe's, or the checkpoint's (checked when planning)
        depth = self.num_heads if self.declared_num_slots() is not None else None
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
            elif depth is not None and len(path) > depth:
                problems.append(f"tree[{n}]: {path} is {len(path)} deep; valid: at most num_heads = {depth}")
            elif key in seen:
                problems.append(f"tree[{n}]: {path} appears twice")
            seen.add(key)
        for n, path in enumerate(tree):
            if len(path) > 1 and tuple(path[:-1]) not in seen:
                problems.append(f"tree[{n}]: {path} has no parent {path[:-1]} in the tree; add it")
        if problems:
            raise ValueError("\n".join(problems[:8] + ([f"tree: ... and {len(problems) - 8} more problem(s)"]
                                                        if len(problems) > 8 else [])))
        return self

    def declared_num_slots(self):
        """Proposals per block (heads) when the recipe decides it (a checkpoint's count wins otherwise)."""
        if (self.path is None and self.config is None) or "num_heads" in self.model_fields_set:
            return self.num_heads
        return None
