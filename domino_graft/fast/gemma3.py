"""The fast engine's own forward for Gemma-3 text models (``Gemma3ForCausalLM``, model_type
"gemma3_text"), on the same static cache, positions and graph runner as the Llama family.

What differs from llama.py's math, op for op as transformers' modeling_gemma3.py does it:

* RMSNorm is ``(x_normed * (1 + w))`` in fp32, cast once (Llama casts before the multiply);
  four norms a layer: input, post-attention (on the attention output, before the residual
  add), pre-feedforward and post-feedforward (on the MLP output, before its residual add);
  per-head q/k norms;
* the embedding is scaled by ``sqrt(hidden_size)`` rounded to the weights' dtype (HF's
  ``embed_scale`` buffer);
* attention scale ``query_pre_attn_scalar ** -0.5``; MLP ``gelu_tanh(gate) * up``;
* two kinds of layers (``config.layer_types``): "full_attention" (causal) and
  "sliding_attention": query at position p sees keys in ``(p - window, p]`` (HF's
  ``sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``, and causal), each kind with
  its own RoPE (``inv_freq`` and attention scaling read from HF's rotary module's buffers).

The cache keeps every position of every layer (a sliding layer just masks the old ones), so a
rollback is a length move as for the other families; the window costs no memory saving here.
Softcapping, bidirectional attention and other activations raise ``UnsupportedModel``.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .llama import ARCHITECTURES, STATIC_ROPE_TYPES, FastConfig, FastLM, UnsupportedModel, fuse_linears
from .llama_math import attention_mask, rope_cos_sin, rotate_half
from .llama_split import attention_reference, rope_qkv_reference
from .static_cache import StaticKVCache

MODEL_TYPE = "gemma3_text"
LAYER_TYPES = ("full_attention", "sliding_attention")
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")

# weights of one decoder layer, in this order (None where the model has none)
LAYER_FIELDS = ("in_norm", "wqkv", "bqkv", "wo", "bo", "q_norm", "k_norm", "post_attn_norm", "pre_ff_norm",
                "post_ff_norm", "wgu", "wd")


# --------------------------------------------------------------------------- the math
def gemma_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma3RMSNorm: normalise and scale by (1 + w) in fp32, then cast."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + w.to(torch.float32))).to(x.dtype)


def window_mask(q_pos: torch.Tensor, key_pos: torch.Tensor, group: int, window: int) -> torch.Tensor:
    """Boolean mask ``[B, 1, group*T, S]`` of a sliding layer: query (r, i) of row b sees keys in
    ``(q_pos[b, i] - window, q_pos[b, i]]`` (folded GQA layout, as llama.attention_mask)."""
    b, t = q_pos.shape
    kp, qp = key_pos[None, None, :], q_pos[:, :, None]
    allowed = (kp <= qp) & (kp > qp - window)  # [B, T, S]
    return allowed[:, None].expand(b, group, t, key_pos.shape[0]).reshape(b, 1, group * t, key_pos.shape[0])


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def gemma_prologue(q_pos, key_pos, ropes, window: int, dtype: torch.dtype, group: int, float_mask: bool = False):
    """Per layer kind (0 = full, 1 = sliding): (cos, sin, mask), once per forward."""
    full = attention_mask(q_pos, key_pos, group)
    slide = window_mask(q_pos, key_pos, group, window) if window else full
    out = []
    for (inv_freq, scaling), mask in zip(ropes, (full, slide)):
        cos, sin = rope_cos_sin(q_pos, inv_freq, scaling, dtype)
        out.append((cos, sin, _additive(mask, dtype) if float_mask else mask))
    return tuple(out)


def gemma_layer(x, cos, sin, mask, rows, idx, kc, vc, w, num_heads: int, num_kv_heads: int, head_dim: int,
                eps: float, kv_len: int, scale: float):
    """One Gemma-3 decoder layer; writes this step's K/V into kc/vc at idx ``[B, T]``."""
    (in_norm, wqkv, bqkv, wo, bo, q_norm, k_norm, post_attn_norm, pre_ff_norm, post_ff_norm, wgu, wd) = w
    b, t, _ = x.shape
    h = gemma_norm(x, in_norm, eps)
    nq, nkv = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = F.linear(h, wqkv, bqkv).split((nq, nkv, nkv), dim=-1)
    q = gemma_norm(q.reshape(b, t, num_heads, head_dim), q_norm, eps).transpose(1, 2)
    k = gemma_norm(k.reshape(b, t, num_kv_heads, head_dim), k_norm, eps).transpose(1, 2)
    v = v.reshape(b, t, num_kv_heads, head_dim)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    kc[rows, :, idx] = k.transpose(1, 2)
    vc[rows, :, idx] = v
    group = num_heads // num_kv_heads
    qf = q.reshape(b, num_kv_heads, group * t, head_dim)
    o = F.scaled_dot_product_attention(qf, kc[:, :, :kv_len], vc[:, :, :kv_len], attn_mask=mask, scale=scale)
    o = o.reshape(b, num_heads, t, head_dim).transpose(1, 2).reshape(b, t, num_heads * head_dim)
    x = x + gemma_norm(F.linear(o, wo, bo), post_attn_norm, eps)
    gate, up = F.linear(gemma_norm(x, pre_ff_norm, eps), wgu).chunk(2, dim=-1)
    return x + gemma_norm(F.linear(F.gelu(gate, approximate="tanh") * up, wd), post_ff_norm, eps)


def gemma_embed(ids, embed, embed_scale):
    return F.embedding(ids, embed) * embed_scale.to(embed.dtype)


def gemma_epilogue(x, norm_w, lm_w, eps: float, keep: int):
    h = gemma_norm(x, norm_w, eps)
    return h, F.linear(h[:, -keep:] if keep else h, lm_w)


def run_gemma3(ids, q_pos, key_pos, rows, kcs, vcs, embed, embed_scale, layers, kinds: tuple, norm_w, lm_w,
               ropes: tuple, window: int, dtype: torch.dtype, capture: tuple, num_heads: int, num_kv_heads: int,
               head_dim: int, eps: float, scale: float, kv_len: int, keep: int, float_mask: bool = False,
               pro: Callable = gemma_prologue, layer_fn: Callable = gemma_layer, epi: Callable = gemma_epilogue):
    """The whole forward, as llama.run_model: (logits, [captured hidden states, ascending, -1 last]).
    kinds[i]: 0 = full attention, 1 = sliding window (selects the layer's RoPE and mask)."""
    per_kind = pro(q_pos, key_pos, ropes, window, dtype, num_heads // num_kv_heads, float_mask)
    x = gemma_embed(ids, embed, embed_scale)
    hidden = []
    for i, w in enumerate(layers):
        cos, sin, mask = per_kind[kinds[i]]
        x = layer_fn(x, cos, sin, mask, rows, q_pos, kcs[i], vcs[i], w, num_heads, num_kv_heads, head_dim, eps,
                     kv_len, scale)
        if i in capture:
            hidden.append(x)
    h, logits = epi(x, norm_w, lm_w, eps, keep)
    if -1 in capture:
        hidden.append(h)
    return logits, hidden


# --------------------------------------------------------------------------- config
def _rope_of(cfg, rotary, inner, kind: str) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention scaling) of one layer kind from HF's rotary module(s). transformers 5.x:
    one module with ``{kind}_inv_freq`` / ``{kind}_attention_scaling``; 4.5x: ``rotary_emb``
    (global) and ``rotary_emb_local`` (sliding)."""
    inv = getattr(rotary, f"{kind}_inv_freq", None)
    if inv is not None:
        return inv, float(getattr(rotary, f"{kind}_attention_scaling", 1.0))
    mod = getattr(inner, "rotary_emb_local", None) if kind == "sliding_attention" else rotary
    if mod is None or getattr(mod, "inv_freq", None) is None:
        raise UnsupportedModel(f"fast engine: gemma3_text without a RoPE buffer for {kind} layers")
    return mod.inv_freq, float(getattr(mod, "attention_scaling", 1.0))


def _rope_types(cfg) -> dict:
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and "full_attention" in params:
        return {k: (v or {}).get("rope_type", (v or {}).get("type", "default")) or "default"
                for k, v in params.items()}
    old = getattr(cfg, "rope_scaling", None) or {}  # 4.5x: rope_scaling for the global layers only
    return {"full_attention": old.get("rope_type", old.get("type", "default")) or "default",
            "sliding_attention": "default"}


def check_supported(cfg, max_len: int) -> None:
    """Raise UnsupportedModel with the reason when this Gemma-3 config is outside the fast path."""
    act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", None)
    if act not in ACTIVATIONS:
        raise UnsupportedModel(f"fast engine: gemma3_text hidden_activation {act!r} is not supported; "
                               f"supported: {', '.join(ACTIVATIONS)}")
    for flag in ("final_logit_softcapping", "attn_logit_softcapping"):
        if getattr(cfg, flag, None) is not None:
            raise UnsupportedModel(f"fast engine: {flag} is not supported (gemma3_text with softcapping)")
    if getattr(cfg, "use_bidirectional_attention", False):
        raise UnsupportedModel("fast engine: use_bidirectional_attention is not supported")
    if not getattr(cfg, "layer_types", None):
        raise UnsupportedModel("fast engine: gemma3_text config without layer_types")
    bad = sorted({t for t in cfg.layer_types if t not in LAYER_TYPES})
    if bad:
        raise UnsupportedModel(f"fast engine: layer types {bad} are not supported; supported: {', '.join(LAYER_TYPES)}")
    if "sliding_attention" in cfg.layer_types and not (getattr(cfg, "sliding_window", None) or 0) > 0:
        raise UnsupportedModel("fast engine: sliding layers without a sliding_window")
    for kind, rope_type in _rope_types(cfg).items():
        if kind in cfg.layer_types and rope_type not in STATIC_ROPE_TYPES:
            raise UnsupportedModel(f"fast engine: RoPE type {rope_type!r} ({kind} layers) is not supported; "
                                   f"supported: {', '.join(STATIC_ROPE_TYPES)} (use the Hugging Face forward)")


class Gemma3LM(FastLM):
    """FastLM for gemma3_text: the same forward contract, cache, rollback, graph runner and
    ``use_kernels`` ("triton": Gemma's norm in norm_rope_cache, the window in decode_attention);
    its own math (run_gemma3, run_gemma3_split). Build through ``FastLM.from_hf``."""

    def __init__(self, cfg: FastConfig, *, embed_scale: torch.Tensor, kinds: tuple, ropes: tuple, window: int,
                 scale: float, **kw):
        super().__init__(cfg, inv_freq=ropes[0][0], rope_scaling=ropes[0][1], **kw)
        self.embed_scale, self.kinds, self.ropes = embed_scale, kinds, ropes
        self.window, self.attn_scale = int(window), float(scale)
        self._model_fn = run_gemma3

    @classmethod
    def from_hf(cls, model, max_batch: int = 1, max_len: int = 2048) -> "Gemma3LM":
        cfg = model.config
        check_supported(cfg, max_len)
        inner = model.model
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        if heads % kv_heads:
            raise UnsupportedModel(f"fast engine: {heads} heads are not a multiple of {kv_heads} KV heads")
        rotary = getattr(inner, "rotary_emb", None)
        kinds = tuple(LAYER_TYPES.index(t) for t in cfg.layer_types[:len(inner.layers)])
        # HF builds the RoPE of the kinds in use only (a 4-layer model is all sliding layers)
        present = {LAYER_TYPES[k]: _rope_of(cfg, rotary, inner, LAYER_TYPES[k]) for k in sorted(set(kinds))}
        ropes = tuple(present.get(kind, next(iter(present.values()))) for kind in LAYER_TYPES)
        window = int(cfg.sliding_window or 0) if 1 in kinds else 0
        embed = inner.embed_tokens.weight
        embed_scale = getattr(inner.embed_tokens, "embed_scale", None)
        if not isinstance(embed_scale, torch.Tensor):
            embed_scale = torch.tensor(cfg.hidden_size ** 0.5, device=embed.device)
        fc = FastConfig(model_type=cfg.model_type, num_layers=len(inner.layers), hidden_size=cfg.hidden_size,
                        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=cfg.vocab_size,
                        rms_norm_eps=float(cfg.rms_norm_eps), rope_type=_rope_types(cfg)["full_attention"],
                        tie_word_embeddings=model.get_output_embeddings().weight is embed)
        layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            qkv, gate_up = (a.q_proj, a.k_proj, a.v_proj), (m.gate_proj, m.up_proj)
            if any(getattr(mod, "bias", None) is not None for mod in (*gate_up, m.down_proj)):
                raise UnsupportedModel("fast engine: gemma3_text MLP with biases")
            layers.append((
                layer.input_layernorm.weight, fuse_linears(qkv, "weight"), fuse_linears(qkv, "bias"),
                a.o_proj.weight, getattr(a.o_proj, "bias", None), a.q_norm.weight, a.k_norm.weight,
                layer.post_attention_layernorm.weight, layer.pre_feedforward_layernorm.weight,
                layer.post_feedforward_layernorm.weight, fuse_linears(gate_up, "weight"), m.down_proj.weight,
            ))
        cache = StaticKVCache(fc.num_layers, max_batch, kv_heads, max_len, head_dim, dtype=embed.dtype,
                              device=embed.device)
        return cls(fc, embed=embed, layers=layers, norm=inner.norm.weight, lm_head=model.get_output_embeddings().weight,
                   cache=cache, embed_scale=embed_scale, kinds=kinds, ropes=ropes, window=window,
                   scale=float(cfg.query_pre_attn_scalar) ** -0.5)

    def use_linears(self, name: str) -> "Gemma3LM":
        """Only "torch": Gemma's four norms a layer and GELU-tanh MLP have no small_linear forward."""
        if name != "torch":
            raise UnsupportedModel(f"fast engine: linears {name!r} for gemma3_text; valid: torch")
        return self

    def _math(self) -> dict:
        """FastLM.compile's functions, Gemma's (one layer function serves full and sliding layers
        alike: the mask and RoPE are arguments)."""
        return dict(run=run_gemma3, pro=gemma_prologue, layer_fn=gemma_layer, epi=gemma_epilogue,
                    l_in=gemma_layer_in, l_out=gemma_layer_out, split_epi=gemma_epilogue_add)

    def _run(self, ids, p, q_pos, rows, kcs, vcs, capture: tuple, kv_len: int, keep: int, use_compiled: bool):
        c = self.cfg
        if self.kernels != "torch":
            pieces = self._split_pieces if use_compiled else {}
            return run_gemma3_split(ids, p.contiguous(), kcs, vcs, self.embed, self.embed_scale, self.layers,
                                    self.kinds, self.norm, self.lm_head, self.ropes, self.window, capture,
                                    c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps, self.attn_scale, kv_len,
                                    keep, self.kernels, **pieces)
        fn = self._model_fn if use_compiled else run_gemma3
        return fn(ids, q_pos, self._arange[:kv_len], rows, kcs, vcs, self.embed, self.embed_scale, self.layers,
                  self.kinds, self.norm, self.lm_head, self.ropes, self.window, self.dtype, capture, c.num_heads,
                  c.num_kv_heads, c.head_dim, c.rms_norm_eps, self.attn_scale, kv_len, keep, self.float_mask)


# ------------------------------------------------- the layer split around attention kernels
def gemma_layer_in(x, delta, in_norm, wqkv, bqkv, eps: float):
    if delta is not None:
        x = x + delta
    return x, F.linear(gemma_norm(x, in_norm, eps), wqkv, bqkv)


def gemma_layer_out(x, o, wo, bo, post_attn_norm, pre_ff_norm, post_ff_norm, wgu, wd, eps: float):
    x = x + gemma_norm(F.linear(o, wo, bo), post_attn_norm, eps)
    gate, up = F.linear(gemma_norm(x, pre_ff_norm, eps), wgu).chunk(2, dim=-1)
    return x, gemma_norm(F.linear(F.gelu(gate, approximate="tanh") * up, wd), post_ff_norm, eps)


def gemma_epilogue_add(x, delta, norm_w, lm_w, eps: float, keep: int):
    return gemma_epilogue(x + delta, norm_w, lm_w, eps, keep)


def run_gemma3_split(ids, pos, kcs, vcs, embed, embed_scale, layers, kinds, norm_w, lm_w, ropes, window: int,
                     capture: tuple, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, scale: float,
                     kv_len: int, keep: int, kernels: str, l_in: Callable = gemma_layer_in,
                     l_out: Callable = gemma_layer_out, epi: Callable = gemma_epilogue_add):
    """The forward as layer_in / norm + RoPE + cache write / attention / layer_out (llama.py's
    split) with Gemma's norms ((1 + w) in fp32) and each layer kind's RoPE and window."""
    rope_fn, attend = _gemma_attention(kernels)
    x = gemma_embed(ids, embed, embed_scale)
    delta = None
    hidden = []
    for i, w in enumerate(layers):
        (in_norm, wqkv, bqkv, wo, bo, q_norm, k_norm, post_attn_norm, pre_ff_norm, post_ff_norm, wgu, wd) = w
        inv_freq, scaling = ropes[kinds[i]]
        x, qkv = l_in(x, delta, in_norm, wqkv, bqkv, eps)
        q = rope_fn(qkv, kcs[i], vcs[i], pos, inv_freq, scaling, q_norm, k_norm, eps, num_heads, num_kv_heads,
                    head_dim)
        o = attend(q, kcs[i], vcs[i], pos, num_heads, num_kv_heads, head_dim, kv_len, scale,
                   window if kinds[i] else 0)
        x, delta = l_out(x, o, wo, bo, post_attn_norm, pre_ff_norm, post_ff_norm, wgu, wd, eps)
        if i in capture:
            hidden.append(x + delta)
    h, logits = epi(x, delta, norm_w, lm_w, eps, keep)
    if -1 in capture:
        hidden.append(h)
    return logits, hidden


def _gemma_attention(kernels: str):
    """(rope, attend) for Gemma: the norm_rope_cache of the kernels in Gemma's norm convention
    (``plus_one``), and attention with a scale and a window."""
    if kernels == "reference":
        def rope(qkv, kc, vc, pos, inv_freq, scaling, qn, kn, eps, h, hkv, d):
            return rope_qkv_reference(qkv, kc, vc, pos, inv_freq, scaling, qn, kn, eps, h, hkv, d,
                                      norm=gemma_norm)

        def attend(q, kc, vc, pos, h, hkv, d, kv_len, scale, window):
            return attention_reference(q, kc, vc, pos, num_heads=h, num_kv_heads=hkv, head_dim=d, kv_len=kv_len,
                                       scale=scale, window=window)

        return rope, attend
    from domino_graft.kernels.engine import decode_attention as kern

    def rope(qkv, kc, vc, pos, inv_freq, scaling, qn, kn, eps, h, hkv, d):
        return kern.norm_rope_cache(qkv, kc, vc, pos, inv_freq, scaling, qn, kn, eps, h, hkv, d, plus_one=True)

    def attend(q, kc, vc, pos, h, hkv, d, kv_len, scale, window):
        return kern.decode_attention(q, kc, vc, pos, num_heads=h, num_kv_heads=hkv, head_dim=d, scale=scale,
                                     splits=kern.attention_splits(kv_len), window=window)

    return rope, attend


ARCHITECTURES[MODEL_TYPE] = (Gemma3LM, check_supported)
