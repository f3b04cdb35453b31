"""Config of a DFlash drafter with a Domino head, for `AutoModel.from_pretrained(..., trust_remote_code=True)`.

Shipped inside bundles exported with `domino-graft export --format hf`. Self-contained: it
imports transformers only (never domino_graft), so the bundle loads where domino-graft is
not installed.

Fields are class-level annotated defaults and no `__init__`: transformers 4.x stores unknown
config.json keys as attributes, transformers 5.x turns annotated fields into dataclass
fields. Both versions therefore read the same config.json without a custom constructor.
"""

from __future__ import annotations

from typing import Optional

from transformers import PretrainedConfig


class DominoDFlashConfig(PretrainedConfig):
    model_type = "domino_dflash"

    # the draft transformer (a Qwen3-style stack; DFlash layer layout)
    hidden_size: int = 4096
    num_hidden_layers: int = 1
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 12288
    vocab_size: int = 151936
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    sliding_window: Optional[int] = None
    layer_types: Optional[list] = None
    # DFlash: block [x_0, MASK x (block_size-1)], keys/values also from the target's layers
    num_target_layers: int = 36
    block_size: int = 16
    dflash_config: Optional[dict] = None
    # Domino head (also inside dflash_config; the top-level copy is the vLLM speculators layout).
    # emb_dim is the upstream name of the low-rank width r (embed_proj.0: [H;S] -> emb_dim).
    projector_type: str = "domino"
    gru_hidden_dim: int = 1024
    emb_dim: int = 256
    pure_draft_prefix_len: int = 1
    shift_label: bool = True
    mask_token_id: Optional[int] = None
    target_layer_ids: Optional[list] = None
