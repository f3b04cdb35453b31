"""The `drafter:` section of a P-EAGLE recipe (torch-free: `validate` imports it)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from domino_graft.schema import MAX_LAYERS, MAX_SLOTS, MAX_WIDTH, Strict, check_layer_ids, path_fields, seed_field

# Fields a P-EAGLE checkpoint's config.json decides (a recipe value that contradicts one is an error).
CHECKPOINT_FIELDS = ("layer_type", "num_layers", "num_slots", "target_layer_ids", "mask_token_id", "draft_vocab_size",
                     "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


class PEagleDrafter(Strict):
    """P-EAGLE (speculators 0.9.0 `peagle`): parallel EAGLE-3. One forward drafts K tokens from
    [(x_0, target features at a-1), (mask token, learned mask_hidden) x (K-1)], causal, over the
    verified context; its own embeddings and an LM head over a draft vocabulary mapped to the
    target's by `d2t` / `t2d` (docs/peagle.md).

    Sources: `path`, a speculators P-EAGLE folder (config.json + model.safetensors, its d2t/t2d
    inside); `config`, that config.json alone (planning); neither: fresh weights from `seed`,
    embeddings and LM head copied from the target as speculators does."""

    family: Literal["peagle"]
    path: Optional[str] = None
    config: Optional[str] = None
    # the draft decoder layers; default llama (speculators' train CLI builds P-EAGLE drafts on a LlamaConfig)
    layer_type: Optional[Literal["llama", "qwen3"]] = None
    num_layers: int = Field(1, ge=1, le=MAX_LAYERS)
    # K: tokens drafted per forward (speculators' speculative_tokens / num_depths, default 8)
    num_slots: int = Field(8, ge=2, le=MAX_SLOTS)
    # 0-based decoder-layer outputs of the target (config.json stores speculators ids, +1);
    # default: speculators' [2, L//2, L-3] in its own convention
    target_layer_ids: Optional[list[int]] = None
    mask_token_id: Optional[int] = Field(None, ge=0)  # default: the last vocabulary row
    # default: the target's vocabulary (no d2t/t2d maps, as speculators writes it then)
    draft_vocab_size: Optional[int] = Field(None, ge=2)
    # speculators' vocabulary maps (`d2t-N.npy` / `t2d-N.npy` from its token-frequency step), for a
    # fresh drafter with draft_vocab_size < the target's; without them a seeded random subset is drawn
    # (tests and dry runs only: a real draft vocabulary comes from token frequencies)
    d2t_path: Optional[str] = None
    t2d_path: Optional[str] = None
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    intermediate_size: Optional[int] = Field(None, ge=8, le=MAX_WIDTH)  # default: the target's
    seed: int = seed_field()

    _resolve_paths = path_fields("path", "config", "d2t_path", "t2d_path")

    @field_validator("target_layer_ids")
    @classmethod
    def _distinct_ids(cls, ids):
        return check_layer_ids(ids, lowest=0, empty_hint="at least one 0-based target layer id, or leave it out "
                               "for speculators' default [2, L//2, L-3] (minus one)",
                               range_hint="0-based decoder-layer outputs (speculators' "
                               "eagle_aux_hidden_state_layer_ids minus one; the embedding output cannot be "
                               "captured)")

    @model_validator(mode="after")
    def _consistent(self):
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm are both true; valid: at most one of them (speculators "
                             "Eagle3SpeculatorConfig refuses both)")
        if (self.d2t_path is None) != (self.t2d_path is None):
            given = "d2t_path" if self.d2t_path is not None else "t2d_path"
            raise ValueError(f"{given} is given alone; valid: d2t_path and t2d_path together (speculators' "
                             "d2t-N.npy and t2d-N.npy), or neither")
        return self

    def declared_num_slots(self):
        """K when the recipe decides it (a checkpoint's speculative_tokens wins otherwise)."""
        if (self.path is None and self.config is None) or "num_slots" in self.model_fields_set:
            return self.num_slots
        return None
