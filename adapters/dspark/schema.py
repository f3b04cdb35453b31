"""The `drafter:` section of a DSpark recipe (torch-free: `validate` imports it)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from domino_graft.schema import MAX_LAYERS, MAX_SLOTS, MAX_WIDTH, Strict, check_layer_ids, path_fields, seed_field

# Fields a DSpark checkpoint's config.json decides (a recipe value that contradicts one is an error).
CHECKPOINT_FIELDS = ("block_size", "num_layers", "target_layer_ids", "mask_token_id", "sample_from_anchor",
                     "markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")


class DSparkDrafter(Strict):
    """DSpark (speculators 0.9.0 `dspark`): a DFlash backbone, a sequential low-rank "Markov"
    logit bias over the previous block token, and a per-position confidence head (docs/dspark.md).

    `graft` picks what the Domino head does: `on_top` keeps DSpark's Markov correction in the base
    logits and adds Domino's residual after it; `in_place` drops the Markov head from drafting (its
    tensors are kept and exported untouched) and Domino corrects the plain DFlash logits."""

    family: Literal["dspark"]
    path: Optional[str] = None  # a speculators DSpark checkpoint folder (config.json + model.safetensors)
    config: Optional[str] = None  # its config.json alone, for planning without weights
    graft: Literal["on_top", "in_place"] = "on_top"
    block_size: int = Field(8, ge=2, le=MAX_SLOTS)  # speculators' default
    num_layers: int = Field(1, ge=1, le=MAX_LAYERS)
    # 0-based decoder-layer outputs of the target (the checkpoint stores them +1: speculators ids)
    target_layer_ids: Optional[list[int]] = None
    mask_token_id: Optional[int] = Field(None, ge=0)
    # true (DSpark's default): block position k predicts x_{a+1+k}, K = block_size proposals;
    # false: position k predicts x_{a+k}, position 0 unused, K = block_size - 1
    sample_from_anchor: bool = True
    markov_rank: int = Field(256, ge=0, le=MAX_WIDTH)  # 0: no Markov head (plain DFlash drafting)
    markov_head_type: Literal["vanilla", "gated", "rnn"] = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    intermediate_size: Optional[int] = Field(None, ge=8, le=MAX_WIDTH)  # default: the target's
    seed: int = seed_field()

    _resolve_paths = path_fields("path", "config")

    @field_validator("target_layer_ids")
    @classmethod
    def _distinct_ids(cls, ids):
        return check_layer_ids(ids, lowest=0, empty_hint="at least one 0-based target layer id, or leave it out "
                               "for the default spread",
                               range_hint="0-based decoder-layer outputs (speculators' layer ids minus one; the "
                               "embedding output cannot be captured)")

    @model_validator(mode="after")
    def _consistent(self):
        if self.path is None and self.config is None:  # fresh: the recipe decides every field
            if self.confidence_head_with_markov and self.enable_confidence_head and self.markov_rank == 0:
                raise ValueError("confidence_head_with_markov: true needs markov_rank > 0 (speculators "
                                 "DSparkDraftModel refuses it); set it false or give a markov_rank")
            if self.markov_head_type == "rnn" and not self.sample_from_anchor:
                raise ValueError("markov_head_type: 'rnn' with sample_from_anchor: false is not supported "
                                 "(its state would run over the unused block position 0); valid: "
                                 "sample_from_anchor: true, or 'vanilla' / 'gated'")
        return self

    def declared_num_slots(self):
        """Proposals per block when the recipe decides it (a checkpoint's block size wins otherwise)."""
        if (self.path is None and self.config is None) or "block_size" in self.model_fields_set:
            return self.block_size if self.sample_from_anchor else self.block_size - 1
        return None
