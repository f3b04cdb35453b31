"""The `drafter:` section of a DFlash recipe (torch-free: `validate` imports it)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator

from domino_graft.schema import MAX_LAYERS, MAX_SLOTS, MAX_WIDTH, Strict, check_layer_ids, path_fields, seed_field


class DFlashDrafter(Strict):
    """DFlash block-diffusion drafter (z-lab format), reading target hidden states."""

    family: Literal["dflash"]
    path: Optional[str] = None  # existing z-lab DFlash (or DFlash+Domino) checkpoint folder
    config: Optional[str] = None  # drafter config.json for planning without weights
    block_size: int = Field(16, ge=2, le=MAX_SLOTS)
    num_layers: int = Field(1, ge=1, le=MAX_LAYERS)
    # 0-based decoder-layer outputs of the target; default: spread over the target's depth
    target_layer_ids: Optional[list[int]] = None
    mask_token_id: Optional[int] = Field(None, ge=0)
    # true: block position k predicts x_{a+1+k} (Domino checkpoints); false: position k predicts x_{a+k}
    shift_label: bool = True
    intermediate_size: Optional[int] = Field(None, ge=8, le=MAX_WIDTH)  # default: the target's
    seed: int = seed_field()

    _resolve_paths = path_fields("path", "config")

    @field_validator("target_layer_ids")
    @classmethod
    def _distinct_ids(cls, ids):
        return check_layer_ids(ids, lowest=-1, empty_hint="at least one 0-based target layer id (or -1), or leave "
                               "it out for the default spread",
                               range_hint="0-based decoder-layer outputs, or -1 (the final norm)")

    def declared_num_slots(self):
        """Proposals per block when the recipe decides it (a checkpoint's block size wins otherwise)."""
        if (self.path is None and self.config is None) or "block_size" in self.model_fields_set:
            return self.block_size - 1
        return None
