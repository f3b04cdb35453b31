"""The decoder layer split around the attention and linear kernels (FastLM.use_kernels /
use_linears): the "triton" kernels or their "reference" torch twins, which are the spec the
kernels are tested against (kernels/engine/decode_attention.py, kernels/engine/small_linear.py)."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .llama_math import epilogue, rms_norm, rope_cos_sin, rotate_half


# ------------------------------------------------- the layer split around attention kernels
# With kernels "triton" (or their torch twins, "reference") a layer runs as
#   layer_in    residual add of the previous layer's MLP output + RMSNorm + the q/k/v matmul
#   rope + attention   q/k norms + RoPE, k and v written into the cache, attention over the
#               cache's first pos + T keys: one Triton launch at decode shapes (kernels/engine/decode_attention.py)
#   layer_out   o matmul + residual add + RMSNorm + gate/up + SiLU·mul + down
# Deferring each layer's last residual add into the next layer's norm saves a kernel a layer;
# reading the positions on the device means no mask tensor and no kv bucket in the attention.
def rope_qkv_reference(qkv, kc, vc, pos, inv_freq, scaling: float, q_norm, k_norm, eps: float, num_heads: int,
                       num_kv_heads: int, head_dim: int, kv_only: bool = False,
                       norm: Callable = rms_norm) -> Optional[torch.Tensor]:
    """The torch math of ``kernels.engine.decode_attention.norm_rope_cache``: qkv ``[B, T, (H+2Hkv)D]``
    at positions ``pos[b] + t`` -> q ``[B, T, H·D]`` (None if kv_only); k and v written into kc / vc.
    norm: the q/k norm (gemma3.gemma_norm is the kernel's ``plus_one``)."""
    b, t, _ = qkv.shape
    nq, nkv = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split((nq, nkv, nkv), dim=-1)
    q = q.reshape(b, t, num_heads, head_dim)
    k = k.reshape(b, t, num_kv_heads, head_dim)
    v = v.reshape(b, t, num_kv_heads, head_dim)
    if q_norm is not None:
        q = norm(q, q_norm, eps)
        k = norm(k, k_norm, eps)
    q_pos = pos[:, None] + torch.arange(t, device=qkv.device)
    cos, sin = rope_cos_sin(q_pos, inv_freq, scaling, qkv.dtype)
    cos, sin = cos.transpose(1, 2), sin.transpose(1, 2)  # [B, T, 1, D]
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    rows = torch.arange(b, device=qkv.device)[:, None]
    kc[rows, :, q_pos] = k
    vc[rows, :, q_pos] = v
    return None if kv_only else q.reshape(b, t, nq)


def attention_reference(q, kc, vc, pos, *, num_heads: int, num_kv_heads: int, head_dim: int, causal: bool = True,
                        kv_len: Optional[int] = None, scale: Optional[float] = None, window: int = 0) -> torch.Tensor:
    """The torch math of ``kernels.engine.decode_attention.decode_attention``: q ``[B, T, H·D]`` ->
    ``[B, T, H·D]``; causal: query t sees keys ``<= pos + t``, else every key ``< pos + T``.
    window > 0 (causal only): also only keys ``> pos + t - window`` (a sliding layer, HF's convention)."""
    b, t, _ = q.shape
    group = num_heads // num_kv_heads
    kv_len = kc.shape[2] if kv_len is None else kv_len
    key_pos = torch.arange(kv_len, device=q.device)
    if causal:
        qp = (pos[:, None] + torch.arange(t, device=q.device))[:, :, None]
        allowed = key_pos[None, None, :] <= qp
        if window:
            allowed = allowed & (key_pos[None, None, :] > qp - window)
    else:
        if window:
            raise ValueError("attention_reference: a window needs causal=True")
        allowed = (key_pos[None, None, :] < pos[:, None, None] + t).expand(b, t, kv_len)
    mask = allowed[:, None].expand(b, group, t, kv_len).reshape(b, 1, group * t, kv_len)
    qf = q.reshape(b, t, num_heads, head_dim).transpose(1, 2).reshape(b, num_kv_heads, group * t, head_dim)
    o = F.scaled_dot_product_attention(qf, kc[:, :, :kv_len], vc[:, :, :kv_len], attn_mask=mask,
                                       scale=head_dim ** -0.5 if scale is None else scale)
    return o.reshape(b, num_heads, t, head_dim).transpose(1, 2).reshape(b, t, num_heads * head_dim)


def layer_in(x, delta, in_norm, wqkv, bqkv, eps: float):
    """(the residual stream with the previous layer's MLP output added, the q/k/v projection)."""
    if delta is not None:
        x = x + delta
    return x, F.linear(rms_norm(x, in_norm, eps), wqkv, bqkv)


def layer_out(x, o, wo, bo, post_norm, wgu, bgu, wd, bd, eps: float):
    """(the residual stream after attention, the MLP's output: added by the next layer_in)."""
    x = x + F.linear(o, wo, bo)
    gate, up = F.linear(rms_norm(x, post_norm, eps), wgu, bgu).chunk(2, dim=-1)
    return x, F.linear(F.silu(gate) * up, wd, bd)


def epilogue_add(x, delta, norm_w, lm_w, eps: float, keep: int):
    return epilogue(x + delta, norm_w, lm_w, eps, keep)


def triton_kernels_unsupported(head_dim: int) -> Optional[str]:
    """Why the Triton attention kernels cannot serve this head size, or None: a tile holds one
    head (a power of two) and tl.dot needs at least 16 along it."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"Triton attention kernels: head_dim {head_dim}; valid: a power of two >= 16"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton attention kernels: triton is not installed"
    return None


def attention_kernels(name: str) -> tuple[Callable, Callable]:
    """(rope, rope_attention) of the "triton" kernels or their "reference" torch math.
    rope(qkv, kc, vc, pos, inv_freq, scaling, q_norm, k_norm, eps, H, Hkv, D, kv_only=False)
    writes k / v into the cache and returns q; rope_attention(same ..., kv_len, causal=True)
    also attends and returns the attention output. kv_len: a static bound on the keys read (the
    Triton kernels read exactly pos + T of them and use the bound to choose key splits)."""
    if name == "reference":
        def rope_attention(qkv, kc, vc, pos, inv_freq, scaling, q_norm, k_norm, eps, h, hkv, d, kv_len, causal=True):
            q = rope_qkv_reference(qkv, kc, vc, pos, inv_freq, scaling, q_norm, k_norm, eps, h, hkv, d)
            return attention_reference(q, kc, vc, pos, num_heads=h, num_kv_heads=hkv, head_dim=d, kv_len=kv_len,
                                       causal=causal)

        return rope_qkv_reference, rope_attention
    if name == "triton":
        from domino_graft.kernels.engine import decode_attention as kern

        def rope_attention(qkv, kc, vc, pos, inv_freq, scaling, q_norm, k_norm, eps, h, hkv, d, kv_len, causal=True):
            return kern.rope_attention(qkv, kc, vc, pos, inv_freq, scaling, q_norm, k_norm, eps, h, hkv, d,
                                       causal=causal, splits=kern.attention_splits(kv_len))

        return kern.norm_rope_cache, rope_attention
    raise ValueError(f"attention kernels {name!r}; valid: torch, triton, reference")


def run_model_split(ids, pos, kcs, vcs, embed, layers, norm_w, lm_w, inv_freq, scaling: float,
                    capture: tuple, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, kv_len: int,
                    keep: int, rope_attention: Callable, l_in: Callable = layer_in,
                    l_out: Callable = layer_out, epi: Callable = epilogue_add):
    """The forward as layer_in / rope / attention / layer_out (comment above); same outputs as
    run_model. pos: the ``[B]`` positions of the first new token (contiguous)."""
    x = F.embedding(ids, embed)
    delta = None
    hidden = []
    for i, w in enumerate(layers):
        (in_norm, wqkv, bqkv, wo, bo, q_norm, k_norm, post_norm, wgu, bgu, wd, bd) = w
        x, qkv = l_in(x, delta, in_norm, wqkv, bqkv, eps)
        o = rope_attention(qkv, kcs[i], vcs[i], pos, inv_freq, scaling, q_norm, k_norm, eps, num_heads,
                           num_kv_heads, head_dim, kv_len)
        x, delta = l_out(x, o, wo, bo, post_norm, wgu, bgu, wd, bd, eps)
        if i in capture:
            hidden.append(x + delta)
    h, logits = epi(x, delta, norm_w, lm_w, eps, keep)
    if -1 in capture:
        hidden.append(h)
    return logits, hidden


def linear_kernels(name: str) -> tuple[Callable, Callable, Callable]:
    """(linear, swiglu, norm) of the "triton" kernels (kernels/engine/small_linear.py, kernels/engine/row_norm.py)
    or their "reference" torch math: linear(x, w, bias, residual=None) = x @ w.T + bias + residual
    and swiglu(x, w_gate_up, bias) = silu(g) * u, each accumulated in fp32 and rounded once;
    norm(x, w, eps) = rms_norm."""
    if name == "triton":
        from domino_graft.kernels.engine.row_norm import rms_norm_rows
        from domino_graft.kernels.engine.small_linear import small_linear, small_linear_swiglu

        return small_linear, small_linear_swiglu, rms_norm_rows
    if name == "reference":
        from domino_graft.kernels.engine.small_linear import small_linear_reference, small_linear_swiglu_reference

        return small_linear_reference, small_linear_swiglu_reference, rms_norm
    raise ValueError(f"linear kernels {name!r}; valid: torch, triton, reference")


def run_model_linears(ids, pos, kcs, vcs, embed, layers, norm_w, lm_w, inv_freq, scaling: float,
                      capture: tuple, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, kv_len: int,
                      keep: int, rope_attention: Callable, linear: Callable, swiglu: Callable, norm: Callable):
    """The forward with every norm and projection through `norm` / `linear` / `swiglu`
    (FastLM.use_linears): per layer a norm, the q/k/v projection, the attention kernels, the o
    projection with the residual add in its epilogue, a norm, gate/up with SiLU·mul in its
    epilogue, down with the residual add: nine launches a layer (plus split-K reductions), no
    compiled code. Same outputs as run_model up to rounding (each projection rounds once)."""
    x = F.embedding(ids, embed)
    hidden = []
    for i, w in enumerate(layers):
        (in_norm, wqkv, bqkv, wo, bo, q_norm, k_norm, post_norm, wgu, bgu, wd, bd) = w
        qkv = linear(norm(x, in_norm, eps), wqkv, bqkv)
        o = rope_attention(qkv, kcs[i], vcs[i], pos, inv_freq, scaling, q_norm, k_norm, eps, num_heads,
                           num_kv_heads, head_dim, kv_len)
        x = linear(o, wo, bo, residual=x)
        x = linear(swiglu(norm(x, post_norm, eps), wgu, bgu), wd, bd, residual=x)
        if i in capture:
            hidden.append(x)
    h = norm(x, norm_w, eps)
    logits = linear(h[:, -keep:] if keep else h, lm_w)
    if -1 in capture:
        hidden.append(h)
    return logits, hidden
