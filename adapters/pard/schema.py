"""The `drafter:` section of a PARD recipe (torch-free: `validate` imports it)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from domino_graft.schema import MAX_LAYERS, MAX_SLOTS, RandomModel, Strict, path_fields, seed_field


class PardDrafter(Strict):
    """PARD: a small causal LM drafting k tokens in one pass, from
    [verified context, x_0, pard_token x (k-1)]; its own embedding and LM head.

    Sources (at most one of path / random): `path`, an HF causal-LM folder (PARD checkpoints
    carry `pard_token` in config.json); `random`, a fresh random LM of its own shape (its
    vocabulary must be the target's); neither: a copy of the target's first `num_layers`
    decoder layers with its embeddings, final norm and LM head (a warm start)."""

    family: Literal["pard"]
    path: Optional[str] = None
    random: Optional[RandomModel] = None
    num_layers: int = Field(2, ge=1, le=MAX_LAYERS)  # only for the copy-of-the-target start
    num_slots: int = Field(8, ge=2, le=MAX_SLOTS)  # k proposals per forward
    # default: the checkpoint's `pard_token`, else the last vocabulary row
    pard_token_id: Optional[int] = Field(None, ge=0)
    seed: int = seed_field()

    _resolve_paths = path_fields("path")

    @model_validator(mode="after")
    def _one_source(self):
        if self.path is not None and self.random is not None:
            raise ValueError("give at most one of path, random (neither = copy the target's first num_layers layers)")
        return self

    def declared_num_slots(self):
        """k when the recipe decides it (a checkpoint's pard_num_slots wins otherwise)."""
        if self.path is None or "num_slots" in self.model_fields_set:
            return self.num_slots
        return None
