"""The Llama family's decoder in plain torch, op for op as transformers computes it (RMSNorm in
fp32 then cast, RoPE from the model's own ``inv_freq``, Qwen3's per-head q/k norms, SwiGLU), on a
static cache under an explicit mask; GQA folds the query heads of one KV head into the query-length
axis. FastLM (llama.py) runs it; it is also the reference the kernels are tested against."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dt = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(dt)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(q_pos: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype):
    """cos/sin ``[B, 1, T, D]`` for positions ``[B, T]``, computed in fp32 as HF does."""
    freqs = q_pos[..., None].to(torch.float32) * inv_freq.to(torch.float32)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * scaling).to(dtype)
    sin = (emb.sin() * scaling).to(dtype)
    return cos[:, None], sin[:, None]


def attention_mask(q_pos: torch.Tensor, key_pos: torch.Tensor, group: int) -> torch.Tensor:
    """Boolean mask ``[B, 1, group*T, S]``: query (r, i) of row b sees keys <= q_pos[b, i]
    (causal within the new tokens, everything before them), for the folded GQA layout."""
    b, t = q_pos.shape
    allowed = key_pos[None, None, :] <= q_pos[:, :, None]  # [B, T, S]
    return allowed[:, None].expand(b, group, t, key_pos.shape[0]).reshape(b, 1, group * t, key_pos.shape[0])


def prologue(q_pos, key_pos, inv_freq, scaling: float, dtype: torch.dtype, group: int, float_mask: bool = False):
    """RoPE cos/sin and the attention mask, once per forward (every layer reads them). float_mask:
    an additive 0 / -inf mask in the compute dtype instead of a boolean one (attention kernels
    that take only a bias would otherwise convert it in every layer)."""
    cos, sin = rope_cos_sin(q_pos, inv_freq, scaling, dtype)
    mask = attention_mask(q_pos, key_pos, group)
    if float_mask:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    return cos, sin, mask


def decoder_layer(x, cos, sin, mask, rows, idx, kc, vc, w, num_heads: int, num_kv_heads: int, head_dim: int,
                  eps: float, kv_len: int):
    """One pre-norm decoder layer; writes this step's K/V into kc/vc at idx ``[B, T]``."""
    (in_norm, wqkv, bqkv, wo, bo, q_norm, k_norm, post_norm, wgu, bgu, wd, bd) = w
    b, t, _ = x.shape
    h = rms_norm(x, in_norm, eps)
    nq, nkv = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = F.linear(h, wqkv, bqkv).split((nq, nkv, nkv), dim=-1)
    q = q.reshape(b, t, num_heads, head_dim)
    k = k.reshape(b, t, num_kv_heads, head_dim)
    v = v.reshape(b, t, num_kv_heads, head_dim)
    if q_norm is not None:
        q = rms_norm(q, q_norm, eps)
        k = rms_norm(k, k_norm, eps)
    q = q.transpose(1, 2)
    k = k.transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    # the cache write: advanced indices around a slice index a [B, T, H, D] view
    kc[rows, :, idx] = k.transpose(1, 2)
    vc[rows, :, idx] = v
    group = num_heads // num_kv_heads
    qf = q.reshape(b, num_kv_heads, group * t, head_dim)
    o = F.scaled_dot_product_attention(qf, kc[:, :, :kv_len], vc[:, :, :kv_len], attn_mask=mask,
                                       scale=head_dim ** -0.5)
    o = o.reshape(b, num_heads, t, head_dim).transpose(1, 2).reshape(b, t, num_heads * head_dim)
    x = x + F.linear(o, wo, bo)
    h = rms_norm(x, post_norm, eps)
    gate, up = F.linear(h, wgu, bgu).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, wd, bd)


def epilogue(x, norm_w, lm_w, eps: float, keep: int):
    h = rms_norm(x, norm_w, eps)
    return h, F.linear(h[:, -keep:] if keep else h, lm_w)


def run_model(ids, q_pos, key_pos, rows, kcs, vcs, embed, layers, norm_w, lm_w, inv_freq, scaling: float,
              dtype: torch.dtype, capture: tuple, num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
              kv_len: int, keep: int, float_mask: bool = False, pro: Callable = prologue,
              layer_fn: Callable = decoder_layer, epi: Callable = epilogue):
    """The whole forward: (logits, [hidden of each captured layer id, in ascending order, -1 last]).
    ``compile(scope="model")`` compiles this function as one graph; scope "layer" passes
    compiled pieces as pro / layer_fn / epi."""
    cos, sin, mask = pro(q_pos, key_pos, inv_freq, scaling, dtype, num_heads // num_kv_heads, float_mask)
    x = F.embedding(ids, embed)
    hidden = []
    for i, w in enumerate(layers):
        x = layer_fn(x, cos, sin, mask, rows, q_pos, kcs[i], vcs[i], w, num_heads, num_kv_heads, head_dim, eps,
                     kv_len)
        if i in capture:
            hidden.append(x)
    h, logits = epi(x, norm_w, lm_w, eps, keep)
    if -1 in capture:
        hidden.append(h)
    return logits, hidden
