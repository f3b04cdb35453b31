"""The `drafter:` section of a DFlash recipe (torch-free: `validate` imports it)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from domino_graft.schema import Strict, path_fields


class DFlashDrafter(Strict):
    """DFlash block-diffusion drafter (z-lab format), reading target hidden states."""

    family: Literal["dflash"]
    path: Optional[str] = None  # existing z-lab DFlash (or DFlash+Domino) checkpoint folder
    config: Optional[str] = None  # drafter config.json for planning without weights
    block_size: int = Field(16, ge=2)
    num_layers: int = Field(1, ge=1)
    # 0-based decoder-layer outputs of the target; default: spread over the target's depth
    target_layer_ids: Optional[list[int]] = None
    mask_token_id: Optional[int] = Field(None, ge=0)
    # true: block position k predicts x_{a+1+k} (Domino checkpoints); false: position k predicts x_{a+k}
    shift_label: bool = True
    intermediate_size: Optional[int] = Field(None, ge=8)  # default: the target's
    seed: int = 0

    _resolve_paths = path_fields("path", "config")
