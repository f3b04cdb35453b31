"""toyheads: a small parallel drafter family living outside domino-graft.

K heads read the target's final hidden state h_{a-1} (the state that produced the anchor x_0)
together with E(x_0), and each adds a residual: H_j = h + SiLU(W_j [h; E(x_0)]); base logits
are the target's LM head on H_j. One pass drafts every slot, and slot j is blind to the
tokens drafted before it: the case a Domino head is for.

This module is all domino-graft imports at `validate` time: the recipe section and the
family object, no torch. The model code is in model.py, imported on first use.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from domino_graft.adapters.family import Family
from domino_graft.schema import Strict, path_fields


class ToyHeadsDrafter(Strict):
    """The recipe's `drafter:` section for this family."""

    family: Literal["toyheads"]
    path: Optional[str] = None  # a folder this family wrote: config.json + model.safetensors
    num_slots: int = Field(4, ge=1)
    seed: int = 0

    _resolve_paths = path_fields("path")


class ToyHeadsFamily(Family):
    name = "toyheads"
    display_name = "ToyHeads"
    schema = ToyHeadsDrafter
    model_module = f"{__name__}.model"  # plan() and build(), imported on first use (torch)
    # bundles use the default layout: drafter/ (this family's own files) + head.safetensors


FAMILY = ToyHeadsFamily()
