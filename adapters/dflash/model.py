"""DFlash (z-lab) block-diffusion drafter, implemented here (no trust_remote_code).

Facts of the family (docs/design.md §2-§3), kept in this one module:

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

from ..base import (DraftBlock, DrafterAdapter, TrainingBlocks, checkpoint_conflicts,
                    placeholder_token_problems, read_config_json, slot_targets)

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
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """positions [..., T] -> cos, sin [..., T, head_dim] (rotate-half layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float()[..., None] * inv
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, hd]; cos/sin [B or 1, T, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


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
        cos, sin = rope_cos_sin(_rows(positions), self.cfg.head_dim, self.cfg.rope_theta, ctx.dtype)
        return [layer.self_attn.project_kv(ctx, cos, sin) for layer in self.layers]

    def forward(self, block_emb: torch.Tensor, block_pos: torch.Tensor, kv_ctx, key_pos: torch.Tensor,
                allowed: Optional[torch.Tensor] = None) -> torch.Tensor:
        """block_emb [B, Q, H] at block_pos [Q] or [B, Q]; kv_ctx per-layer (k, v) [B, nkv, C, hd]
        at key_pos (context positions, [C] or [B, C]); allowed: optional bool [B, Q, C+Q]
        (True = may attend). Default: every query sees all context and the whole block."""
        h = block_emb.to(self.fc.weight.dtype)
        cos, sin = rope_cos_sin(_rows(block_pos), self.cfg.head_dim, self.cfg.rope_theta, h.dtype)
        masks = self._masks(h.shape[0], block_pos, key_pos, allowed)
        for layer, (k, v) in zip(self.layers, kv_ctx):
            mask = masks["sliding" if layer.sliding else "full"]
            h = layer(h, cos, sin, k, v, mask)
        return self.norm(h)

    def _masks(self, batch, block_pos, key_pos, allowed):
        full = None if allowed is None else allowed[:, None]
        out = {"full": full, "sliding": full}
        if any(layer.sliding for layer in self.layers) and self.cfg.sliding_window:
            qp = _rows(block_pos)
            kp = _rows(key_pos)
            b = max(qp.shape[0], kp.shape[0])
            qp = qp.expand(b, -1)
            kp = torch.cat([kp.expand(b, -1), qp], dim=-1)
            near = (qp[:, :, None] - kp[:, None, :]) < self.cfg.sliding_window
            sl = near if allowed is None else (near & allowed)
            out["sliding"] = sl[:, None]
        return out


def _rows(positions: torch.Tensor) -> torch.Tensor:
    """Positions given as [T] (shared by the batch) or [B, T] -> always [B or 1, T]."""
    return positions if positions.ndim == 2 else positions[None]


# ------------------------------------------------------------------------------ adapter
class DFlashAdapter(DrafterAdapter):
    family = "dflash"
    topology = "chain"
    one_pass = True
    ragged_batch = True

    def __init__(self, cfg: DFlashConfig, target):
        super().__init__()
        if cfg.hidden_size != target.shape.hidden_size:
            raise ValueError(
                f"drafter hidden_size {cfg.hidden_size} != target hidden_size {target.shape.hidden_size}: "
                "DFlash reuses the target's embeddings and LM head, so they must match"
            )
        if cfg.vocab_size != target.shape.vocab_size:
            raise ValueError(f"drafter vocab_size {cfg.vocab_size} != target vocab_size {target.shape.vocab_size}")
        for lid in cfg.target_layer_ids:
            if not -1 <= lid < target.shape.num_layers:
                raise ValueError(
                    f"drafter.target_layer_ids: {lid} is out of range; valid: 0..{target.shape.num_layers - 1} or -1"
                )
        self.cfg = cfg
        self.backbone = DFlashBackbone(cfg)
        # The target is shared, not owned: keep it out of this module's state_dict.
        object.__setattr__(self, "target", target)
        self.num_slots = cfg.block_size - 1
        self.hidden_dim = cfg.hidden_size
        self.emb_dim = target.shape.hidden_size
        self.vocab_size = cfg.vocab_size
        self._cache: Optional[ContextCache] = None
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def reserved_token_ids(self) -> frozenset[int]:
        return frozenset({self.cfg.mask_token_id})

    def capture_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.target_layer_ids)

    # ---- hook points
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(ids)

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(hidden)

    def slot_hidden(self, block_hidden: torch.Tensor) -> torch.Tensor:
        """Block positions -> per-slot hidden H_1..H_K (the slot/label convention)."""
        k = self.num_slots
        return block_hidden[:, :k] if self.cfg.shift_label else block_hidden[:, 1 : k + 1]

    # ---- decoding
    def reset(self, batch_size: int) -> None:
        self._cache = None
        self._pending = []

    def observe(self, features: torch.Tensor, positions: torch.Tensor, ids: Optional[torch.Tensor] = None) -> None:
        self._pending.append((features, positions))

    def context_length(self) -> int:
        n = 0 if self._cache is None else int(self._cache.positions.numel())
        return n + sum(int(p.numel()) for _, p in self._pending)

    def _flush_context(self) -> ContextCache:
        if self._pending:
            feats = torch.cat([f for f, _ in self._pending], dim=1)
            pos = torch.cat([p for _, p in self._pending], dim=-1)
            new = self.backbone.context_kv(feats, pos)
            if self._cache is None:
                self._cache = ContextCache([k for k, _ in new], [v for _, v in new], pos)
            else:
                c = self._cache
                self._cache = ContextCache(
                    [torch.cat([a, k], dim=2) for a, (k, _) in zip(c.k, new)],
                    [torch.cat([a, v], dim=2) for a, (_, v) in zip(c.v, new)],
                    torch.cat([c.positions, pos], dim=-1),
                )
            self._pending = []
        if self._cache is None:
            raise RuntimeError("DFlash propose() before any observe(): the drafter needs verified context")
        return self._cache

    def static_drafter(self, max_len: int):
        """The static-cache, graphed drafter (fast.py), kept between decodes while it has room
        (its captured graphs are reused) and the weights' device and dtype are unchanged."""
        from domino_graft.fast import round_up_pow2

        from .fast import StaticDFlashDrafter

        w = self.backbone.fc.weight
        cur = getattr(self, "_static_drafter", None)
        if cur is None or cur.max_len < max_len or (cur.device, cur.dtype) != (w.device, w.dtype):
            cur = StaticDFlashDrafter(self, round_up_pow2(max_len))
            if cur.device.type == "cuda":
                # the Triton attention kernels + compiled pieces under the graphs: 0.25 vs 0.92 ms a
                # block (eager math) at the shipped SmolLM2 drafter's shape, 1.10 vs 2.34 ms at
                # Qwen3-8B's (bench/results/engine_h200.json). The compiled eager-kernel variant
                # compiled once per attention bucket and did not pay end to end (docs/results.md §6);
                # this one compiles once per block shape.
                from domino_graft.fast import UnsupportedModel

                try:
                    cur.use_kernels("triton").compile()
                except UnsupportedModel:  # head size / sliding windows: eager math in the graphs
                    pass
            object.__setattr__(self, "_static_drafter", cur)  # not a submodule: no state_dict entry
        return cur

    def static_batch_drafter(self, max_len: int, batch: int):
        """The static drafter with `batch` rows for ragged batches (decoding/batched.py, beside the
        target's static ragged cache), or None where it would not be this adapter's propose (a
        subclass that changes propose, e.g. DSpark's Markov head). Kept apart from the solo one
        (as the target's ragged cache is from its solo cache) and, like StaticRaggedTarget, from
        64 positions up and grown to the larger of each, so that a big CPU batch of short decodes
        (the chi-square tests' 9,000 rows) keeps its cache small."""
        from domino_graft.fast import round_up_pow2

        from .fast import StaticDFlashDrafter

        if type(self).propose is not DFlashAdapter.propose:
            return None
        w = self.backbone.fc.weight
        cur = getattr(self, "_static_batch_drafter", None)
        if cur is not None and (cur.device, cur.dtype) != (w.device, w.dtype):
            cur = None
        if cur is None or cur.max_len < max_len or cur.max_batch < batch:
            if cur is not None:
                max_len, batch = max(max_len, cur.max_len), max(batch, cur.max_batch)
            cur = StaticDFlashDrafter(self, round_up_pow2(max_len, 64), max_batch=batch)
            if cur.device.type == "cuda":  # as static_drafter: the Triton kernels where they serve
                from domino_graft.fast import UnsupportedModel

                try:
                    cur.use_kernels("triton").compile()
                except UnsupportedModel:
                    pass
            object.__setattr__(self, "_static_batch_drafter", cur)
        return cur

    def block_ids(self, anchor: torch.Tensor) -> torch.Tensor:
        b = anchor.shape[0]
        ids = torch.full((b, self.cfg.block_size), self.cfg.mask_token_id, dtype=torch.long, device=anchor.device)
        ids[:, 0] = anchor
        return ids

    def propose(self, anchor: torch.Tensor, position: int) -> DraftBlock:
        cache = self._flush_context()
        ids = self.block_ids(anchor)
        bs = self.cfg.block_size
        pos = torch.arange(bs, device=anchor.device) + (position[:, None] if torch.is_tensor(position) else position)
        allowed = None
        if cache.positions.ndim == 2:  # a ragged batch: padding (negative positions) is never attended
            b, c = ids.shape[0], cache.positions.shape[-1]
            allowed = torch.cat([(cache.positions >= 0)[:, None, :].expand(b, bs, c),
                                 torch.ones(b, bs, bs, dtype=torch.bool, device=anchor.device)], dim=-1)
        hidden = self.backbone(self.embed(ids), pos, list(zip(cache.k, cache.v)), cache.positions, allowed)
        slots = self.slot_hidden(hidden)
        return DraftBlock(hidden=slots, base_logits=self.base_logits(slots))

    # ---- training
    def training_blocks(self, features, input_ids, loss_mask, anchors) -> TrainingBlocks:
        """features [B, L, n·H] (target capture over whole sequences), input_ids/loss_mask [B, L],
        anchors [B, nb] (positions a; context is < a). Ground-truth previous tokens feed the GRU."""
        cfg = self.cfg
        b, length = input_ids.shape
        nb, bs = anchors.shape[1], cfg.block_size
        dev = input_ids.device
        offs = torch.arange(bs, device=dev)
        block_pos = (anchors[:, :, None] + offs).reshape(b, nb * bs)  # [B, nb·bs]
        ids = torch.full((b, nb, bs), cfg.mask_token_id, dtype=torch.long, device=dev)
        ids[:, :, 0] = torch.gather(input_ids, 1, anchors)
        ctx_pos = torch.arange(length, device=dev)
        kv_ctx = self.backbone.context_kv(features, ctx_pos)
        # block b's queries see context strictly before its anchor, and their own block
        blk = torch.arange(nb, device=dev).repeat_interleave(bs)
        sees_ctx = ctx_pos[None, None, :] < anchors.repeat_interleave(bs, dim=1)[:, :, None]
        sees_blk = (blk[:, None] == blk[None, :]).expand(b, -1, -1)
        allowed = torch.cat([sees_ctx, sees_blk], dim=-1)
        hidden = self.backbone(self.embed(ids.reshape(b, nb * bs)), block_pos, kv_ctx, ctx_pos, allowed)
        hidden = hidden.view(b * nb, bs, -1)
        k = bs if cfg.shift_label else bs - 1
        slots = hidden[:, :k] if cfg.shift_label else hidden[:, 1:]
        # slot j (1..k) predicts x_{a+j}; the GRU reads x_{a}..x_{a+k-1}
        labels, prev = slot_targets(input_ids, loss_mask, anchors, k)
        return TrainingBlocks(
            hidden=slots,
            prev_emb=self.embed(prev),
            labels=labels,
            base_logits_fn=self.base_logits,
        )

    def backbone_parameters(self) -> list[nn.Parameter]:
        return list(self.backbone.parameters())

    # ---- persistence
    def backbone_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.backbone.state_dict().items()}

    def native_config(self) -> dict:
        return self.cfg.to_native()


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


# ------------------------------------------------------------------ recipe -> drafter
def config_from_recipe(d, tshape) -> DFlashConfig:
    """The drafter's config: from its checkpoint (drafter.path / drafter.config) or fresh
    from recipe settings and the target's shape. Explicit recipe settings that contradict
    a checkpoint are errors, never silently overridden; values the recipe did not set yield
    to the checkpoint's. Every problem is one line of the ValueError raised."""
    source = d.path or d.config
    problems = []
    if source is not None:
        field_name = "drafter.path" if d.path else "drafter.config"
        cfg = DFlashConfig.from_native(read_config_json(source, field_name))
        # None = "the default", never a contradiction (a run's resolved recipe lists every field)
        problems += checkpoint_conflicts(d, {**{name: getattr(cfg, name) for name in (
            "block_size", "target_layer_ids", "mask_token_id", "shift_label")}, "num_layers": cfg.num_hidden_layers})
        if cfg.num_target_layers in (0, None):
            cfg.num_target_layers = tshape.num_layers
        for name, ours, theirs in (("hidden_size", cfg.hidden_size, tshape.hidden_size),
                                   ("vocab_size", cfg.vocab_size, tshape.vocab_size)):
            if ours != theirs:
                problems.append(f"{field_name}: the checkpoint's {name} {ours} != the target's {theirs}; DFlash reuses "
                                "the target's embeddings and LM head, so they must match (a drafter for another target?)")
        if cfg.block_size < 2:
            problems.append(f"{field_name}: the checkpoint's block_size {cfg.block_size} is invalid; valid: >= 2")
        ids_from = " (from the checkpoint's config)"
    else:
        ids = d.target_layer_ids or default_target_layer_ids(tshape.num_layers, d.num_layers)
        cfg = DFlashConfig(
            hidden_size=tshape.hidden_size,
            num_hidden_layers=d.num_layers,
            num_attention_heads=tshape.num_heads,
            num_key_value_heads=tshape.num_kv_heads,
            head_dim=tshape.head_dim,
            intermediate_size=d.intermediate_size or tshape.intermediate_size,
            vocab_size=tshape.vocab_size,
            num_target_layers=tshape.num_layers,
            target_layer_ids=list(ids),
            mask_token_id=d.mask_token_id if d.mask_token_id is not None else tshape.vocab_size - 1,
            block_size=d.block_size,
            shift_label=d.shift_label,
            rms_norm_eps=tshape.rms_norm_eps,
            rope_theta=tshape.rope_theta,
            max_position_embeddings=tshape.max_position_embeddings,
        )
        ids_from = "" if d.target_layer_ids else (
            f" (the default spread for {d.num_layers} drafter layer(s); set drafter.target_layer_ids)")
    n = tshape.num_layers
    ids = cfg.target_layer_ids
    bad = [i for i in ids if not -1 <= i < n]
    if bad:
        problems.append(f"drafter.target_layer_ids: {bad[0]} in {ids} is out of range{ids_from}; valid: 0..{n - 1} "
                        f"(0-based outputs of the target's {n} decoder layers) or -1 (the final norm)")
    elif len(set(ids)) != len(ids):
        problems.append(f"drafter.target_layer_ids: {ids} lists a layer twice{ids_from}; valid: distinct ids in "
                        f"0..{n - 1} or -1")
    problems += placeholder_token_problems("mask_token_id", cfg.mask_token_id, tshape.vocab_size, tshape.eos_token_ids)
    if problems:
        raise ValueError("\n".join(problems))
    return cfg


def recipe_values(d, tshape) -> dict:
    """The drafter fields a checkpoint decided, as built (graft.effective_recipe records them in a
    run's resolved recipe, so that reloading it never finds a schema default in conflict)."""
    if d.path is None and d.config is None:
        return {}
    cfg = config_from_recipe(d, tshape)
    return {"block_size": cfg.block_size, "num_layers": cfg.num_hidden_layers,
            "target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
            "shift_label": cfg.shift_label}


def plan(d, tshape):
    from ..plan import FamilyPlan, HookPoint

    cfg = config_from_recipe(d, tshape)
    k = cfg.block_size - 1
    h = cfg.hidden_size
    where = "positions 0..K-1 (shift_label)" if cfg.shift_label else "positions 1..K"
    return FamilyPlan(
        family="dflash",
        summary=(
            f"DFlash {cfg.num_hidden_layers} layer(s), hidden {h}, block {cfg.block_size}, "
            f"mask id {cfg.mask_token_id}, shift_label {cfg.shift_label}, capture {cfg.target_layer_ids}"
        ),
        num_slots=k,
        hidden_dim=h,
        emb_dim=tshape.hidden_size,
        vocab_size=cfg.vocab_size,
        capture_layers=list(cfg.target_layer_ids),
        backbone_tensors=backbone_tensor_shapes(cfg),
        hooks=[
            HookPoint("hidden", f"drafter norm output, block {where}", f"[B, {k}, {h}]"),
            HookPoint("base_logits", "target lm_head(hidden)", f"[B, {k}, {cfg.vocab_size}]"),
            HookPoint("embed", "target input embeddings of x_0..x_{K-1}", f"[B, {k}, {tshape.hidden_size}]"),
        ],
        source=d.path or f"fresh (seed {d.seed})",
    )


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


def checkpoint_head_fields(d) -> dict:
    """The Domino head declared by the checkpoint at drafter.path (from its config alone)."""
    if d.path is None:
        return {}
    return domino_head_fields(read_config_json(d.path, "drafter.path"), f"{d.path}/config.json")


def build(d, target):
    """-> (adapter, head tensors found in the checkpoint). Weights are checked strictly."""
    from pathlib import Path

    from domino_graft.artifacts.files import CheckpointError
    from domino_graft.artifacts.tensors import check_tensors, load_tensors

    cfg = config_from_recipe(d, target.shape)
    adapter = DFlashAdapter(cfg, target)
    head_tensors: dict = {}
    if d.path is not None:
        weights = Path(d.path) / "model.safetensors"
        state = load_tensors(weights)
        state = {k.removeprefix("model."): v for k, v in state.items()}
        head_tensors = {k: v for k, v in state.items() if k.startswith(HEAD_KEYS_PREFIXES)}
        backbone = {k: v for k, v in state.items() if not k.startswith(HEAD_KEYS_PREFIXES)}
        check_tensors(backbone, backbone_tensor_shapes(cfg), source=str(weights))
        adapter.backbone.load_state_dict(backbone, strict=True)
        # graft.build_head reads this: a declared head must be loaded whole (even when its
        # tensors are all missing), and its G, r, pure prefix override recipe defaults.
        adapter.checkpoint_head_fields = checkpoint_head_fields(d)
        if head_tensors and not adapter.checkpoint_head_fields:
            raise CheckpointError(
                f"{weights}: tensor {sorted(head_tensors)[0]!r} belongs to a Domino head but config.json does not "
                "declare one (dflash_config.projector_type must be 'domino', with gru_hidden_dim, emb_dim, "
                "pure_draft_prefix_len)"
            )
    else:
        adapter.backbone.init_weights(d.seed)
    adapter.backbone.to(device=target.device, dtype=target.dtype)
    return adapter, head_tensors
