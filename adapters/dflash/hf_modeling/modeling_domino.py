"""DFlash drafter + Domino head as a transformers model (remote code shipped in the bundle).

    model = AutoModel.from_pretrained(BUNDLE, trust_remote_code=True)
    out = model.spec_generate(target, input_ids, 256)   # lossless speculative decoding (rollout_domino.py)

Self-contained: torch + transformers only. The drafter owns no embedding and no LM head;
the caller passes the target's (DFlash reuses them), exactly as serving engines do.

Conventions (domino-graft docs/design.md §2), which this file must keep exactly:
* the block is [x_0, MASK x (block_size-1)] at positions a .. a+block_size-1, non-causal
  inside the block; keys/values also come from ctx = hidden_norm(fc(target features)),
  the target's layer outputs `target_layer_ids` (0-based decoder-layer outputs,
  `hidden_states[id + 1]` in transformers) at every verified position < a;
* shift_label=true: block position k predicts x_{a+1+k}; false: position k predicts x_{a+k};
  either way K = block_size-1 proposals;
* slot j (1-based) reads the GRU state after E(x_0)..E(x_{j-1}); slots j <= pure_draft_prefix_len
  keep the plain base logits. Greedy: d_1 = argmax base_1; every proposal is fed back.

Loading is strict: a missing, unexpected or mis-shaped tensor raises (transformers only
warns), so a bundle without its head cannot load as a plain DFlash drafter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from .configuration_domino import DominoDFlashConfig
from .rollout_domino import reference_rollout
from .rollout_domino import spec_generate as _spec_generate


def _setting(config, name, default=None):
    """dflash_config first (SGLang's layout), then the top level (vLLM speculators' layout)."""
    nested = getattr(config, "dflash_config", None) or {}
    if nested.get(name) is not None:
        return nested[name]
    value = getattr(config, name, None)
    return default if value is None else value


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        return float(rope["rope_theta"])
    return float(getattr(config, "rope_theta", None) or 1_000_000.0)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions, head_dim: int, theta: float, dtype):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float()[..., None] * inv
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class DFlashAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        hd = config.head_dim
        self.head_dim = hd
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.num_heads * hd, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def _kv(self, x, cos, sin):
        b, t, _ = x.shape
        # explicit head counts: an empty context (a one-token prompt) has t = 0
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, x, ctx, cos_ctx, sin_ctx, cos_blk, sin_blk, mask):
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.num_heads, self.head_dim)).transpose(1, 2)
        q = apply_rope(q, cos_blk, sin_blk)
        # Context keys/values come from the projected target features, not from the layer
        # input: the context is never transformed layer to layer.
        k_ctx, v_ctx = self._kv(ctx, cos_ctx, sin_ctx)
        k_blk, v_blk = self._kv(x, cos_blk, sin_blk)
        k = torch.cat([k_ctx.expand(b, -1, -1, -1), k_blk], dim=2)
        v = torch.cat([v_ctx.expand(b, -1, -1, -1), v_blk], dim=2)
        rep = self.num_heads // self.num_kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DFlashMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, config, sliding: bool):
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = DFlashMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.sliding = sliding

    def forward(self, h, ctx, rope_ctx, rope_blk, mask):
        h = h + self.self_attn(self.input_layernorm(h), ctx, *rope_ctx, *rope_blk, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DominoDraftModel(PreTrainedModel):
    config_class = DominoDFlashConfig
    # No checkpoint key carries a prefix; a prefix no key starts with keeps transformers
    # from stripping or adding one.
    base_model_prefix = "domino_draft"
    _no_split_modules = ["DFlashLayer"]

    def __init__(self, config):
        super().__init__(config)
        n = config.num_hidden_layers
        layer_types = list(config.layer_types or ["full_attention"] * n)
        self.layers = nn.ModuleList([DFlashLayer(config, t == "sliding_attention") for t in layer_types])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        ids = _setting(config, "target_layer_ids")
        self.fc = nn.Linear(len(ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Domino head: bias-free GRU over previous-token embeddings + low-rank logit residual.
        gru_dim = int(_setting(config, "gru_hidden_dim"))
        rank = int(_setting(config, "emb_dim"))
        self.prefix_gru = nn.GRU(config.hidden_size, gru_dim, num_layers=1, bias=False, batch_first=True)
        self.embed_proj = nn.Sequential(
            nn.Linear(config.hidden_size + gru_dim, rank, bias=False),
            nn.SiLU(),
            nn.Linear(rank, config.vocab_size, bias=False),
        )
        self.block_size = int(_setting(config, "block_size"))
        self.num_proposals = self.block_size - 1
        self.shift_label = bool(_setting(config, "shift_label"))
        self.pure_draft_prefix_len = int(_setting(config, "pure_draft_prefix_len"))
        self.mask_token_id = _setting(config, "mask_token_id")
        self.target_layer_ids = list(ids)
        self.post_init()

    def _init_weights(self, module):
        # Only reached for tensors a checkpoint does not provide, which strict loading
        # rejects anyway; fresh models (from_config) get small random weights.
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, nn.GRU):
            for p in module.parameters():
                nn.init.normal_(p, std=0.02)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        problems = []
        for key, what in (("missing_keys", "missing tensor"), ("unexpected_keys", "unexpected tensor"),
                          ("mismatched_keys", "tensor with the wrong shape")):
            for item in sorted(info.get(key) or [], key=str):
                problems.append(f"{what} {item!r}")
        if problems:
            raise ValueError(
                f"{cls.__name__}: the checkpoint does not match its config.json: " + "; ".join(problems)
            )
        return (model, info) if want_info else model

    # ------------------------------------------------------------------ backbone
    def forward(self, noise_embedding: torch.Tensor, target_hidden: torch.Tensor,
                position_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """Block hidden states [B, block_size, H] (after the final norm).

        noise_embedding [B, Q, H]: the target's embeddings of [x_0, MASK, ...];
        target_hidden [B or 1, C, n*H]: the target's layer outputs `target_layer_ids`, concatenated
        in that order, at the C verified positions; position_ids [B or 1, C+Q]: context positions
        then block positions.
        """
        if position_ids.ndim == 1:
            position_ids = position_ids[None]
        q_len = noise_embedding.shape[1]
        h = noise_embedding.to(self.fc.weight.dtype)
        ctx = self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))
        theta = _rope_theta(self.config)
        cfg = self.config
        cos, sin = rope_cos_sin(position_ids, cfg.head_dim, theta, h.dtype)
        c = position_ids.shape[1] - q_len
        rope_ctx, rope_blk = (cos[:, :c], sin[:, :c]), (cos[:, c:], sin[:, c:])
        masks = {False: None, True: None}
        window = getattr(cfg, "sliding_window", None)
        if window and any(layer.sliding for layer in self.layers):
            qp = position_ids[:, c:]
            masks[True] = ((qp[:, :, None] - position_ids[:, None, :]) < window)[:, None]
        for layer in self.layers:
            h = layer(h, ctx, rope_ctx, rope_blk, masks[layer.sliding])
        return self.norm(h)

    def proposal_hidden(self, block_hidden: torch.Tensor) -> torch.Tensor:
        """Block positions -> H_1..H_K, the hidden states slots 1..K read (shift_label convention)."""
        k = self.num_proposals
        return block_hidden[:, :k] if self.shift_label else block_hidden[:, 1 : k + 1]

    # ------------------------------------------------------------------ Domino head
    def domino_correction(self, hidden: torch.Tensor, prev_embedding: torch.Tensor) -> torch.Tensor:
        """Logit residual W2·SiLU(W1·[H_j; S_j]) for every slot, teacher-forced.

        hidden [B, K, H] = H_1..H_K; prev_embedding [B, K, H] = E(x_0)..E(x_{K-1})."""
        states, _ = self.prefix_gru(prev_embedding.to(self.prefix_gru.weight_ih_l0.dtype))
        return self.embed_proj(torch.cat([hidden.to(states.dtype), states], dim=-1))

    def domino_logits(self, hidden: torch.Tensor, base_logits: torch.Tensor,
                      prev_embedding: torch.Tensor) -> torch.Tensor:
        """Final logits [B, K, V]: base + correction, slots 1..pure_draft_prefix_len left as base."""
        delta = self.domino_correction(hidden, prev_embedding).to(base_logits.dtype)
        slot = torch.arange(1, hidden.shape[1] + 1, device=hidden.device)
        keep = (slot > self.pure_draft_prefix_len).to(delta.dtype)
        return base_logits + delta * keep[None, :, None]

    @torch.no_grad()
    def draft_greedy(self, proposal_hidden: torch.Tensor, base_logits: torch.Tensor,
                     anchor_ids: torch.Tensor, embed_tokens: nn.Module) -> torch.Tensor:
        """Greedy proposals d_1..d_K [B, K]: the GRU reads E(x_0), then each realised proposal
        (the PyTorch reference rollout of rollout_domino.py)."""
        return reference_rollout(self, proposal_hidden, base_logits, anchor_ids, embed_tokens)[0]

    # ------------------------------------------------------------------ speculative decoding
    def spec_generate(self, target, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                      top_p: float = 1.0, **kwargs) -> torch.Tensor:
        """Speculative decoding of `target` (a transformers causal LM) drafted by this bundle, batch 1:
        greedy output identical to `target.generate(input_ids, do_sample=False)`, temperature > 0 by
        speculative sampling with the exact draft distribution q (lossless). The greedy rollout runs
        the shipped Triton kernels on CUDA when triton imports, the PyTorch reference elsewhere.
        Keywords: generator (torch.Generator), rollout ("auto" | "torch" | "triton"), return_stats.
        See rollout_domino.spec_generate."""
        return _spec_generate(self, target, input_ids, max_new_tokens, temperature, top_p, **kwargs)
