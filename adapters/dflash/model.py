"""DFlash (z-lab) block-diffusion drafter, implemented here (no trust_remote_code).

Facts of the family (docs/design.md §2-§3), kept in this module (the config, the drafter's
modules, its tensors and the Domino keys of its config.json); adapter.py attaches it to a target:

* The block is [x_0, MASK × (block_size-1)] at absolute positions a .. a+block_size-1,
  attention is non-causal inside the block; keys/values also come from the verified
  context, projected once: ctx = hidden_norm(fc(concat(target layer outputs))). Every
  layer projects the same ctx features (they are not transformed layer to layer).
* Context is every position < a (the anchor x_0 itself is not yet seen by the target).
* Noise embeddings and the LM head are the target's; the drafter stores neither.
* shift_label=true: block position k predicts x_{a+1+k} (Domino checkpoints);
  shift_label=false: position k predicts x_{a+k}, position 0 unused (z-lab DFlash).
  Either way a block makes K = block_size-1 proposals.
* Native tensor names: layers.{i}.self_attn.{q,k,v,o}_proj.weight, .{q,k}_norm.weight,
  layers.{i}.mlp.{gate,up,down}_proj.weight, layers.{i}.{input,post_attention}_layernorm.weight,
  norm.weight, fc.weight, hidden_norm.weight. No `model.` prefix.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import RMSNorm, apply_rope, position_rows, rope_cos_sin

ARCHITECTURE = "DFlashDraftModel"
BACKBONE_PREFIXES = ("layers.", "norm.", "fc.", "hidden_norm.")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Spread capture points over the target's depth (z-lab's rule: Qwen3-8B, 5 -> [1, 9, 17, 25, 33])."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass
class DFlashConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = 16
    shift_label: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    layer_types: Optional[list[str]] = None
    sliding_window: Optional[int] = None
    extra: dict = field(default_factory=dict)  # fields we carry through untouched (e.g. Domino keys)

    def __post_init__(self):
        if self.layer_types is None:
            self.layer_types = ["full_attention"] * self.num_hidden_layers

    # ---- z-lab config.json <-> config
    @classmethod
    def from_native(cls, cfg: dict) -> "DFlashConfig":
        dcfg = cfg.get("dflash_config") or {}
        rope = cfg.get("rope_parameters") or {}
        known = {
            "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "num_target_layers", "block_size", "rms_norm_eps",
            "rope_theta", "rope_parameters", "max_position_embeddings", "layer_types", "sliding_window",
            "dflash_config",
            # read here or by domino_head_fields(), rewritten by to_native()/the exporter: carrying
            # them in `extra` would re-emit a stale Domino declaration (or an HF auto_map) in a
            # run's plain drafter/config.json
            *DOMINO_KEYS, "auto_map",
        }
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                               "vocab_size") if k not in cfg]
        if missing:
            raise ValueError(f"DFlash config.json lacks {', '.join(missing)}: not a z-lab DFlash config")
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"DFlash config.json: rope_type {rope.get('rope_type')!r} is not supported; valid: 'default'")
        n_layers = cfg["num_hidden_layers"]
        num_target_layers = cfg.get("num_target_layers", 0)
        # vLLM speculators' layout has these at the top level only; domino_head_fields() rejects
        # a config whose two copies disagree
        ids = (dcfg.get("target_layer_ids") or cfg.get("target_layer_ids")
               or default_target_layer_ids(num_target_layers, n_layers))
        heads = cfg["num_attention_heads"]
        return cls(
            hidden_size=cfg["hidden_size"],
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            num_target_layers=num_target_layers,
            target_layer_ids=list(ids),
            mask_token_id=int(dcfg.get("mask_token_id", cfg.get("mask_token_id", cfg["vocab_size"] - 1))),
            block_size=int(cfg.get("block_size", dcfg.get("block_size", 16))),
            shift_label=bool(dcfg.get("shift_label", cfg.get("shift_label", False))),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 40960)),
            layer_types=list(cfg.get("layer_types") or ["full_attention"] * n_layers),
            sliding_window=cfg.get("sliding_window"),
            extra={k: v for k, v in cfg.items() if k not in known},
        )

    def to_native(self) -> dict:
        """config.json in the z-lab layout (a Qwen3 config of the draft + dflash_config)."""
        out = dict(self.extra)
        out.update(
            architectures=[ARCHITECTURE],
            model_type="qwen3",
            hidden_act="silu",
            attention_bias=False,
            attention_dropout=0.0,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            num_target_layers=self.num_target_layers,
            block_size=self.block_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
            max_position_embeddings=self.max_position_embeddings,
            layer_types=list(self.layer_types),
            sliding_window=self.sliding_window,
            use_sliding_window=any(t == "sliding_attention" for t in self.layer_types),
            tie_word_embeddings=False,
            dflash_config={
                **(self.extra.get("dflash_config") or {}),
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
                "shift_label": self.shift_label,
            },
        )
        return out

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------ modules
class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def project_kv(self, x: torch.Tensor, cos, sin):
        b, t, _ = x.shape
        hd = self.cfg.head_dim
        k = self.k_norm(self.k_proj(x).view(b, t, -1, hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, hd).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, k_ctx, v_ctx, mask):
        b, t, _ = x.shape
        hd = self.cfg.head_dim
        q = self.q_norm(self.q_proj(x).view(b, t, -1, hd)).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k_blk, v_blk = self.project_kv(x, cos, sin)
        k = torch.cat([k_ctx, k_blk], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=hd**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DFlashMLP(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig, idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = DFlashMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.sliding = cfg.layer_types[idx] == "sliding_attention"

    def forward(self, h, cos, sin, k_ctx, v_ctx, mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, k_ctx, v_ctx, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass
class ContextCache:
    """Per-layer K/V of verified context (after rope), and their positions."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    positions: torch.Tensor  # [T]


class DFlashBackbone(nn.Module):
    """The trainable part of a DFlash drafter; state_dict keys are the native names."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([DFlashLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if p.ndim == 2:
                    p.copy_(torch.randn(p.shape, generator=g) * std)
                else:
                    p.fill_(1.0)

    def context_kv(self, feats: torch.Tensor, positions: torch.Tensor):
        """feats [B, T, n·H] of the target -> per-layer (k, v) after rope."""
        ctx = self.hidden_norm(self.fc(feats.to(self.fc.weight.dtype)))
        cos, sin = rope_cos_sin(position_rows(positions), self.cfg.head_dim, self.cfg.rope_theta, ctx.dtype)
        return [layer.self_attn.project_kv(ctx, cos, sin) for layer in self.layers]

    def forward(self, block_emb: torch.Tensor, block_pos: torch.Tensor, kv_ctx, key_pos: torch.Tensor,
                allowed: Optional[torch.Tensor] = None) -> torch.Tensor:
        """block_emb [B, Q, H] at block_pos [Q] or [B, Q]; kv_ctx per-layer (k, v) [B, nkv, C, hd]
        at key_pos (context positions, [C] or [B, C]); allowed: optional bool [B, Q, C+Q]
        (True = may attend). Default: every query sees all context and the whole block."""
        h = block_emb.to(self.fc.weight.dtype)
        cos, sin = rope_cos_sin(position_rows(block_pos), self.cfg.head_dim, self.cfg.rope_theta, h.dtype)
        masks = self._masks(h.shape[0], block_pos, key_pos, allowed)
        for layer, (k, v) in zip(self.layers, kv_ctx):
            mask = masks["sliding" if layer.sliding else "full"]
            h = layer(h, cos, sin, k, v, mask)
        return self.norm(h)

    def _masks(self, batch, block_pos, key_pos, allowed):
        full = None if allowed is None else allowed[:, None]
        out = {"full": full, "sliding": full}
        if any(layer.sliding for layer in self.layers) and self.cfg.sliding_window:
            qp = position_rows(block_pos)
            kp = position_rows(key_pos)
            b = max(qp.shape[0], kp.shape[0])
            qp = qp.expand(b, -1)
            kp = torch.cat([kp.expand(b, -1), qp], dim=-1)
            near = (qp[:, :, None] - kp[:, None, :]) < self.cfg.sliding_window
            sl = near if allowed is None else (near & allowed)
            out["sliding"] = sl[:, None]
        return out


def backbone_num_parameters(cfg: DFlashConfig) -> int:
    return sum(math.prod(s) for s in backbone_tensor_shapes(cfg).values())


def backbone_tensor_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    h, hd = cfg.hidden_size, cfg.head_dim
    out: dict[str, tuple[int, ...]] = {}
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        out[p + "self_attn.q_proj.weight"] = (cfg.num_attention_heads * hd, h)
        out[p + "self_attn.k_proj.weight"] = (cfg.num_key_value_heads * hd, h)
        out[p + "self_attn.v_proj.weight"] = (cfg.num_key_value_heads * hd, h)
        out[p + "self_attn.o_proj.weight"] = (h, cfg.num_attention_heads * hd)
        out[p + "self_attn.q_norm.weight"] = (hd,)
        out[p + "self_attn.k_norm.weight"] = (hd,)
        out[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, h)
        out[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, h)
        out[p + "mlp.down_proj.weight"] = (h, cfg.intermediate_size)
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
    out["norm.weight"] = (h,)
    out["fc.weight"] = (h, len(cfg.target_layer_ids) * h)
    out["hidden_norm.weight"] = (h,)
    return out


HEAD_KEYS_PREFIXES = ("prefix_gru.", "embed_proj.")

# ------------------------------------------------------------- Domino keys in config.json
# DFlash+Domino checkpoints (SGLang >= #36899, Huang2020/Qwen3-8B-Domino-b16) declare the head
# in `dflash_config`; vLLM speculators reads the same fields at the top level, and SGLang's
# parser requires a top-level `emb_dim`: bundles write both places. Upstream's `emb_dim` is the
# low-rank width r (embed_proj.0 maps [H; S] -> emb_dim), not an embedding size.
DOMINO_KEYS = ("projector_type", "gru_hidden_dim", "emb_dim", "pure_draft_prefix_len", "shift_label",
               "mask_token_id", "target_layer_ids")
PLAIN_PROJECTORS = (None, "dflash")  # a DFlash drafter without a Domino head


def domino_config_fields(cfg: DFlashConfig, spec) -> dict:
    """The Domino declaration of a bundle's config.json (written nested and at the top level)."""
    return {
        "mask_token_id": cfg.mask_token_id,
        "target_layer_ids": list(cfg.target_layer_ids),
        "projector_type": "domino",
        "gru_hidden_dim": spec.gru_hidden_dim,
        "emb_dim": spec.rank,
        "pure_draft_prefix_len": spec.pure_prefix_len,
        "shift_label": cfg.shift_label,
    }


def domino_native_config(cfg: DFlashConfig, spec) -> dict:
    """config.json of a native DFlash+Domino bundle (docs/design.md §3)."""
    out = cfg.to_native()
    fields = domino_config_fields(cfg, spec)
    out["dflash_config"] = {**out["dflash_config"], **fields}
    out.update(fields)
    return out


def domino_head_fields(raw: dict, source: str) -> dict:
    """The head a DFlash config.json declares, as recipe head fields
    ({gru_hidden_dim, rank, pure_prefix_len}), or {} for a plain DFlash drafter."""
    nested = raw.get("dflash_config") or {}
    problems = []
    for k in DOMINO_KEYS:
        if nested.get(k) is not None and raw.get(k) is not None and nested[k] != raw[k]:
            problems.append(f"dflash_config.{k} = {nested[k]!r} but the top-level {k} = {raw[k]!r}")

    def get(k):
        return nested[k] if nested.get(k) is not None else raw.get(k)

    ptype = get("projector_type")
    if ptype in PLAIN_PROJECTORS and not problems:
        return {}
    if ptype not in PLAIN_PROJECTORS and ptype != "domino":
        problems.append(f"dflash_config.projector_type = {ptype!r} is not supported; valid: 'domino' or absent (plain DFlash)")
    out = {}
    for key, field_name, low in (("gru_hidden_dim", "gru_hidden_dim", 1), ("emb_dim", "rank", 1),
                                 ("pure_draft_prefix_len", "pure_prefix_len", 0)):
        v = get(key)
        if v is None:
            problems.append(f"dflash_config.{key} is missing; a Domino config must give it (an integer >= {low})")
        elif isinstance(v, bool) or not isinstance(v, int) or v < low:
            problems.append(f"dflash_config.{key} = {v!r} is invalid; valid: an integer >= {low}")
        else:
            out[field_name] = v
    shift = get("shift_label")
    if shift is not None and not isinstance(shift, bool):
        problems.append(f"dflash_config.shift_label = {shift!r} is invalid; valid: true or false")
    if problems:
        raise ValueError(f"{source}: " + "; ".join(problems))
    return out


