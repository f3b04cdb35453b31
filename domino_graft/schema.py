"""Building blocks of the recipe schema, shared by the core recipe and every family's section.

A leaf module (pydantic and the standard library only, no torch): drafter families import it
to declare their own recipe section, and `domino_graft.recipe` assembles the sections it finds
in the family registry into one strict schema.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

DTYPES = ("fp32", "bf16", "fp16")
Dtype = Literal["fp32", "bf16", "fp16"]

# Upper bounds on sizes, so that a typo (10^9 layers, a rank of 10^9) is refused by name before
# planning builds per-layer tables or apply allocates; each sits far above any drafter or target
# shipped or published (Qwen3-235B: 94 layers, hidden 4,096; Gemma-3 vocab 262,144; drafter blocks of 16).
MAX_LAYERS = 512
MAX_SLOTS = 1024  # block_size / num_slots / num_heads: proposals per drafter forward
MAX_WIDTH = 131_072  # a hidden, intermediate, GRU or rank width
MAX_VOCAB = 4_194_304


def seed_field():
    """A seed: torch.manual_seed would overflow outside this range after minutes of loading."""
    from .inputs import MAX_SEED, MIN_SEED

    return Field(0, ge=MIN_SEED, le=MAX_SEED)


def shipped_recipes_dir() -> Path:
    """The shipped recipes and the configs they refer to: package data of `domino_graft.recipes`
    (the repository's top-level recipes/, mapped into the package), so a shipped recipe copied
    anywhere, or named without a path, still resolves."""
    import importlib.util

    spec = importlib.util.find_spec("domino_graft.recipes")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("domino_graft.recipes is not installed; reinstall domino-graft (pip install -e .)")
    return Path(list(spec.submodule_search_locations)[0])


class Strict(BaseModel):
    """Unknown keys are errors, values are not coerced, parsed sections are immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def resolve_path(value: Optional[str], info: ValidationInfo) -> Optional[str]:
    """A path field: `~` expanded; a relative path is taken against the recipe's folder, or,
    when nothing is there, against the shipped recipes' folder (where `configs/*.json` live)."""
    if value is None:
        return None
    p = Path(os.path.expanduser(value))
    if p.is_absolute():
        return str(p)
    base = (info.context or {}).get("base_dir")
    here = Path(base) / p if base is not None else p
    if not here.exists() and (shipped_recipes_dir() / p).exists():
        return str(shipped_recipes_dir() / p)
    return str(here)


def path_fields(*names: str):
    """`_resolve = path_fields("path", "config")` inside a section: those fields go through resolve_path."""
    return field_validator(*names)(resolve_path)


def check_layer_ids(ids, *, lowest: int, empty_hint: str, range_hint: str):
    """A drafter's captured target layer ids (its field validator's body): None (the family's
    default), or distinct ids >= `lowest`; each refusal names the bad id and what is valid."""
    if ids is None:
        return ids
    if not ids:
        raise ValueError(f"[] captures nothing; valid: {empty_hint}")
    bad = [i for i in ids if i < lowest]
    if bad:
        raise ValueError(f"{bad[0]} is out of range; valid: {range_hint}")
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"layer {dup[0]} is listed twice in {ids}; valid: distinct layer ids")
    return ids


class RandomModel(Strict):
    """A small randomly initialised HF causal LM, built in memory from a seed."""

    architecture: Literal["llama", "qwen3", "gemma3"] = "qwen3"
    vocab_size: int = Field(256, ge=8, le=MAX_VOCAB)
    hidden_size: int = Field(64, ge=8, le=MAX_WIDTH)
    num_layers: int = Field(4, ge=1, le=MAX_LAYERS)
    num_heads: int = Field(4, ge=1, le=MAX_SLOTS)
    num_kv_heads: int = Field(2, ge=1, le=MAX_SLOTS)
    head_dim: int = Field(16, ge=4, le=MAX_WIDTH)
    intermediate_size: int = Field(128, ge=8, le=MAX_WIDTH)
    tie_word_embeddings: bool = True
    eos_token_id: int = Field(1, ge=0)
    seed: int = seed_field()

    @model_validator(mode="after")
    def _consistent(self):
        """Shapes transformers would only reject at the first forward (a raw shape error)."""
        problems = []
        if self.num_heads % self.num_kv_heads:
            valid = [k for k in range(1, self.num_heads + 1) if self.num_heads % k == 0]
            problems.append(f"num_kv_heads: {self.num_kv_heads} does not divide num_heads {self.num_heads} "
                            f"(grouped-query attention); valid: {', '.join(map(str, valid))}")
        if self.head_dim % 2:
            problems.append(f"head_dim: {self.head_dim} is odd; valid: an even number (rotary embeddings rotate pairs)")
        if self.eos_token_id >= self.vocab_size:
            problems.append(f"eos_token_id: {self.eos_token_id} is outside the vocabulary; valid: 0..{self.vocab_size - 1}")
        if problems:
            raise ValueError("\n".join(problems))
        return self
