"""The target's attention during training's feature passes: SDPA with the KV heads repeated.

Why: with no attention mask (training batches are right-padded, so none is needed) transformers
calls SDPA with `enable_gqa=True` for a grouped-query target, and on CUDA in fp32 no fused kernel
takes GQA: every layer runs the math path ([B, H, L, L] scores, softmax, mask). On an H200 that is
~25 ms of a 0.21 s step of a SmolLM2 drafter (bench/results/train_profile_h200/). Repeating the KV heads
first lets the memory-efficient kernel run, causal, with no scores in memory.

Only the feature passes of training use it (`features.target_features`, no gradients): decoding
keeps the attention it was verified with. Any failure inside it (a model whose attention takes
arguments this function does not handle) switches it off for the process and the pass reruns
with the model's own attention, with one note.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

NAME = "domino_sdpa_repeat_kv"
_state = {"registered": False, "failed": None}


def _sdpa_repeat_kv(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                    is_causal=None, **kwargs):
    """transformers' attention-interface signature -> ([B, L, H, D] output, None)."""
    unsupported = [k for k in ("softcap", "position_bias", "s_aux", "sinks") if kwargs.get(k) is not None]
    if unsupported:
        raise NotImplementedError(f"{NAME}: {unsupported[0]} is not supported")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # transformers' repeat_kv: head h reads KV head h // groups
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and attention_mask is None and query.shape[2] > 1)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    if not _state["registered"]:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(NAME, _sdpa_repeat_kv)
        AttentionMaskInterface.register(NAME, sdpa_mask)  # the same masks as "sdpa" builds
        _state["registered"] = True


def wanted(model) -> bool:
    """CUDA, fp32, grouped-query heads, the model on SDPA: where the math path would run."""
    cfg = model.config
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    p = next(model.parameters())
    return (_state["failed"] is None and p.device.type == "cuda" and p.dtype == torch.float32
            and heads is not None and kv is not None and kv < heads
            and getattr(cfg, "_attn_implementation", None) == "sdpa")


@contextlib.contextmanager
def repeated_kv_attention(model):
    """Within it, `model` (an HF causal LM) attends through `_sdpa_repeat_kv`; its own attention
    again afterwards."""
    _register()
    cfg = model.config
    old = cfg._attn_implementation
    cfg._attn_implementation = NAME
    try:
        yield
    finally:
        cfg._attn_implementation = old


def run_with_fallback(model, fn, *, echo=print, force: bool = False):
    """fn() under repeated_kv_attention where `wanted` (or `force`: the tests, on a CPU); if it
    raises there, once: a note, the attention stays off for this process, and fn() runs again
    with the model's own attention."""
    if not (force or wanted(model)):
        return fn()
    try:
        with repeated_kv_attention(model):
            return fn()
    except Exception as e:  # noqa: BLE001 - any failure of the swapped attention falls back to the model's own
        _state["failed"] = f"{type(e).__name__}: {e}"
        echo(f"note: target features: {NAME} failed ({_state['failed']}); using the model's own attention")
        return fn()
