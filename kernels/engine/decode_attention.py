"""Triton kernels of the fast engine's attention sub-block at decode shapes (T = 1 step, T = K+1
verify, a drafter's block of Q queries), reading and writing the static KV cache in place.

At batch 1 a decode step is a chain of small kernels; on an H200 at Qwen3-8B shapes the
attention part of each layer was five of them (q norm + RoPE, k norm + RoPE + cache write, a
mask, a memset, cuDNN's flash kernel: ~14 us a layer; bench/results/engine_h200.json, docs/design.md
§5 "the attention kernels"). Two launches do it here (``rope_attention`` = the two below; 2.0 +
4.7 us a layer measured):

* ``norm_rope_cache``: one launch over the fused q/k/v projection output ``[B, T, (H + 2 Hkv) D]``:
  Qwen3's per-head RMSNorm on q and k (optional), RoPE on q and k with cos/sin computed from
  the position and ``inv_freq`` in fp32 (as Hugging Face does), q written to ``[B, T, H·D]``,
  k and v written into the cache at their positions. One program a token and a fixed block of
  ``NORM_ROPE_HEADS`` head slots (q, k and v heads alike): a program per head (24k programs of
  128 elements at a 512-token verify of Qwen3-8B) took ~25 us a launch on an H200. The block's
  size never follows B·T, so a token's bits do not depend on the batch.
* ``decode_attention``: the queries of one KV head's ``group`` query heads folded into one tile
  (GQA without repeating K/V), online softmax over the cache's first ``pos + T`` keys, where
  ``pos`` is read on the device: a graph captured once serves every position, nothing waits
  on a kv bucket. ``causal=True``: query i sees keys ``<= pos + i`` (the target); ``False``:
  every key ``< pos + T`` (a drafter block that sees all of its own block and the context before
  it). ``window=W`` (a sliding layer, Gemma-3): query i sees only keys ``> pos + i - W`` as well,
  and the key tiles wholly before the window are skipped. Long contexts split the keys over
  ``splits`` programs, 512 positions each, and merge them (flash-decoding). A query row's output
  bits do not depend on T (``attention_splits``).

The reference is ``domino_graft.fast.llama_split``'s torch math (``rope_qkv_reference`` /
``attention_reference``): tests/kernels/test_decode_attention.py checks these kernels against
it in fp32 under ``TRITON_INTERPRET=1`` on a CPU and in bf16 on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, pdl_enter, use_pdl


@triton.jit
def _norm_rope_cache_kernel(QKV, QO, KC, VC, POS, INV_FREQ, QW, KW,
                            s_x_b, s_x_t, s_q_b, s_q_t, s_c_b, s_c_h, s_c_s,
                            T, eps, scaling,
                            H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HAS_NORM: tl.constexpr,
                            FIRST_SLOT: tl.constexpr, PLUS_ONE: tl.constexpr, BLOCK_H: tl.constexpr,
                            PDL: tl.constexpr):
    pdl_enter(PDL)  # kernels/engine/pdl.py
    bt = tl.program_id(0)
    b = bt // T
    i = bt % T
    # slots 0..H-1: q heads, H..H+HKV-1: k heads, then v heads; BLOCK_H of them a program
    slot = FIRST_SLOT + tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = slot < H + 2 * HKV
    is_q = slot < H
    is_k = (slot >= H) & (slot < H + HKV)
    is_v = (slot >= H + HKV) & ok
    rope = ok & (slot < H + HKV)
    half: tl.constexpr = D // 2
    d = tl.arange(0, D)
    partner = (d + half) % D
    src = QKV + b * s_x_b + i * s_x_t + slot[:, None] * D
    x = tl.load(src + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    xp = tl.load(src + partner[None, :], mask=rope[:, None], other=0.0).to(tl.float32)
    pos = tl.load(POS + b) + i
    if HAS_NORM:
        w = tl.where(is_q[:, None], tl.load(QW + d)[None, :], tl.load(KW + d)[None, :]).to(tl.float32)
        wp = tl.where(is_q[:, None], tl.load(QW + partner)[None, :], tl.load(KW + partner)[None, :]).to(tl.float32)
        # one head a row: its RMS is a row reduction, the same code whatever the block's other rows
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        if PLUS_ONE:
            # Gemma3RMSNorm: normed * (1 + weight) in fp32, rounded once
            xn = ((x * r[:, None]) * (1.0 + w)).to(QKV.dtype.element_ty).to(tl.float32)
            xpn = ((xp * r[:, None]) * (1.0 + wp)).to(QKV.dtype.element_ty).to(tl.float32)
        else:
            # HF: weight * normed.to(dtype); the products rounded like the eager math
            xn = w * (x * r[:, None]).to(QKV.dtype.element_ty).to(tl.float32)
            xpn = wp * (xp * r[:, None]).to(QKV.dtype.element_ty).to(tl.float32)
            xn = xn.to(QKV.dtype.element_ty).to(tl.float32)
            xpn = xpn.to(QKV.dtype.element_ty).to(tl.float32)
    else:
        xn = x
        xpn = xp
    # cos / sin depend on the token and d only: computed once for the block's heads
    f = pos.to(tl.float32) * tl.load(INV_FREQ + (d % half)).to(tl.float32)
    cos = (tl.cos(f) * scaling).to(QKV.dtype.element_ty).to(tl.float32)
    sin = (tl.sin(f) * scaling).to(QKV.dtype.element_ty).to(tl.float32)
    sign = tl.where(d < half, -1.0, 1.0)
    y = xn * cos[None, :] + sign[None, :] * xpn * sin[None, :]
    # masked-off rows' offsets clamped to 0: no negative head index is ever formed
    qh = tl.where(is_q, slot, 0)
    kh = tl.where(is_k, slot - H, 0)
    vh = tl.where(is_v, slot - H - HKV, 0)
    if FIRST_SLOT < H:
        tl.store(QO + b * s_q_b + i * s_q_t + qh[:, None] * D + d[None, :], y.to(QO.dtype.element_ty),
                 mask=is_q[:, None])
    cache = b * s_c_b + pos * s_c_s + d[None, :]
    tl.store(KC + cache + kh[:, None] * s_c_h, y.to(KC.dtype.element_ty), mask=is_k[:, None])
    tl.store(VC + cache + vh[:, None] * s_c_h, x.to(VC.dtype.element_ty), mask=is_v[:, None])


# head slots a program, one constant: the slot counts served (Qwen3 / Llama 48, kv_only 16) are multiples of 8;
# at D 128 in bf16 an 8-head tile is one 16-byte load a thread (4 warps), and a 1-token step still has 6 programs
NORM_ROPE_HEADS = 8


def norm_rope_cache(qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor,
                    inv_freq: torch.Tensor, scaling: float, q_norm, k_norm, eps: float,
                    num_heads: int, num_kv_heads: int, head_dim: int, kv_only: bool = False,
                    plus_one: bool = False):
    """qkv ``[B, T, (H + 2 Hkv) D]`` (last dim contiguous) at positions ``pos[b] + t`` -> q
    ``[B, T, H·D]`` after norm + RoPE; k (norm + RoPE) and v written into kc / vc
    ``[B, Hkv, S, D]`` at those positions. q_norm / k_norm: ``[D]`` weights or None.
    kv_only: write k and v, skip q (returns None): a drafter's context rows. plus_one: Gemma's
    norm, ``(normed * (1 + w))`` in fp32 rounded once (fast/gemma3.py gemma_norm)."""
    b, t, _ = qkv.shape
    q = kc if kv_only else torch.empty((b, t, num_heads * head_dim), dtype=qkv.dtype, device=qkv.device)
    has_norm = q_norm is not None
    qw = q_norm if has_norm else inv_freq
    kw = k_norm if has_norm else inv_freq
    first = num_heads if kv_only else 0
    # a fixed block of heads a program, never sized from B·T: a token's bits do not depend on the batch
    grid = (b * t, triton.cdiv(num_heads + 2 * num_kv_heads - first, NORM_ROPE_HEADS))
    pdl = use_pdl(qkv)
    _norm_rope_cache_kernel[grid](
        qkv, q, kc, vc, pos, inv_freq, qw, kw,
        qkv.stride(0), qkv.stride(1), q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2),
        t, float(eps), float(scaling),
        H=num_heads, HKV=num_kv_heads, D=head_dim, HAS_NORM=has_norm, FIRST_SLOT=first, PLUS_ONE=bool(plus_one),
        BLOCK_H=NORM_ROPE_HEADS, PDL=pdl, **launch_options(pdl),
    )
    return None if kv_only else q


@triton.jit
def _attention_kernel(Q, KC, VC, O, ML, POS, scale,
                      s_q_b, s_q_t, s_o_b, s_o_t, s_c_b, s_c_h, s_c_s,
                      T, WINDOW,
                      HKV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SPLITS: tl.constexpr, PRECISION: tl.constexpr,
                      KEYS_PER_SPLIT: tl.constexpr, HAS_WINDOW: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)  # kernels/engine/pdl.py
    pm = tl.program_id(0)  # fastest: a KV head's row tiles run side by side, all but one read K/V from L2
    pid = tl.program_id(1)
    split = tl.program_id(2)
    b = pid // HKV
    kvh = pid % HKV
    r = pm * BLOCK_M + tl.arange(0, BLOCK_M)  # folded row = g * T + i
    g = r // T
    i = r % T
    rok = r < GROUP * T
    head = kvh * GROUP + g
    d = tl.arange(0, D)
    q = tl.load(Q + b * s_q_b + i[:, None] * s_q_t + head[:, None] * D + d[None, :], mask=rok[:, None], other=0.0)
    p0 = tl.load(POS + b)
    end = p0 + T
    qpos = p0 + i
    # this split's keys: a fixed range of absolute positions, so that a row's partials (and
    # with them its output, bit for bit) depend on its position only, not on T or the split count
    lo = split * KEYS_PER_SPLIT
    hi = tl.minimum(end, lo + KEYS_PER_SPLIT)
    if split == SPLITS - 1:
        # the last split reads every key left: a caller's split count below attention_splits(pos + T)
        # costs the bit-invariance above, never the keys past SPLITS * KEYS_PER_SPLIT
        hi = end
    if HAS_WINDOW:
        # skip the key tiles before every query's window: they are fully masked, so skipping
        # them changes no bit (tiles stay aligned to lo whatever pos and T)
        first = tl.maximum(p0 - WINDOW + 1, lo)
        lo = lo + (first - lo) // BLOCK_N * BLOCK_N
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    kbase = KC + b * s_c_b + kvh * s_c_h
    vbase = VC + b * s_c_b + kvh * s_c_h
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nok = n < hi
        if HAS_WINDOW:  # nor are the keys before the first query's window read (its tile's head)
            nok = nok & (n > p0 - WINDOW)
        k = tl.load(kbase + n[:, None] * s_c_s + d[None, :], mask=nok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        if CAUSAL:
            ok = (n[None, :] <= qpos[:, None]) & nok[None, :]
            if HAS_WINDOW:  # a sliding layer: keys in (qpos - WINDOW, qpos]
                ok = ok & (n[None, :] > qpos[:, None] - WINDOW)
        else:
            ok = nok[None, :] & (qpos[:, None] >= 0)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        # a row whose keys in this split are all masked keeps m = -inf: guard exp(-inf - -inf)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(vbase + n[:, None] * s_c_s + d[None, :], mask=nok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    if SPLITS == 1:
        o = acc / l[:, None]
        tl.store(O + b * s_o_b + i[:, None] * s_o_t + head[:, None] * D + d[None, :], o.to(O.dtype.element_ty),
                 mask=rok[:, None])
    else:
        # partials: acc [B, T, H, SPLITS, D] (fp32) and (m, l) [B, T, H, SPLITS, 2] in ML
        hs = ((b * T + i) * (HKV * GROUP) + head) * SPLITS + split
        tl.store(O + hs[:, None] * D + d[None, :], acc, mask=rok[:, None])
        tl.store(ML + hs * 2, m, mask=rok)
        tl.store(ML + hs * 2 + 1, l, mask=rok)


@triton.jit
def _merge_kernel(PART, ML, O, s_o_b, s_o_t, T, H: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
                  SPLITS_P2: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)  # kernels/engine/pdl.py
    row = tl.program_id(0)  # (b * T + i) * H + head
    bt = row // H
    head = row % H
    b = bt // T
    i = bt % T
    s = tl.arange(0, SPLITS_P2)
    sok = s < SPLITS
    d = tl.arange(0, D)
    m = tl.load(ML + (row * SPLITS + s) * 2, mask=sok, other=float("-inf"))
    l = tl.load(ML + (row * SPLITS + s) * 2 + 1, mask=sok, other=0.0)
    mx = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - mx))
    acc = tl.load(PART + (row * SPLITS + s)[:, None] * D + d[None, :], mask=sok[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(O + b * s_o_b + i * s_o_t + head * D + d, o.to(O.dtype.element_ty))


def rope_attention(qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor,
                   inv_freq: torch.Tensor, scaling: float, q_norm, k_norm, eps: float, num_heads: int,
                   num_kv_heads: int, head_dim: int, *, causal: bool = True, splits: int = 1) -> torch.Tensor:
    """norm_rope_cache then decode_attention -> ``[B, T, H·D]``. Two launches on purpose: one
    fused launch (each KV head's program writing its new k / v, a barrier, then attending) had
    fewer kernels but, with one program per KV head doing the RoPE of all of its query rows, took
    77 us a layer at a 16-token verify against 2.0 + 4.7 us for the pair at Qwen3-8B shapes on an
    H200 (docs/results.md §6)."""
    q = norm_rope_cache(qkv, kc, vc, pos, inv_freq, scaling, q_norm, k_norm, eps, num_heads, num_kv_heads, head_dim)
    return decode_attention(q, kc, vc, pos, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                            causal=causal, splits=splits)


KEYS_PER_SPLIT = 512  # one program reads up to this many keys of one KV head
QUERY_ROWS = 16  # query rows per program: the same tile for a 1-token step and a 16-token verify


# the attention program's launch: one setting for every B, T and position (a row's softmax sums are
# reduced over the warps' layout, so a setting that varied with the batch would vary a row's bits)
ATTENTION_WARPS = 4
ATTENTION_STAGES = 3


def key_tile(head_dim: int) -> int:
    """Keys per loop step of a program (BLOCK_N): a function of the head size only, never of B, T or
    the position, so a row's bits do not depend on them."""
    return 64 if head_dim <= 128 else 32


def attention_splits(kv_len: int) -> int:
    """Key splits for a static bound of kv_len keys: one per KEYS_PER_SPLIT keys (flash-decoding),
    each over a fixed range of positions. A row's output is then the same bits whatever its
    step's length T or the split count (an empty split merges with weight 0, a single non-empty
    one with weight exactly 1): the 1-token target step and the 16-token verify agree on every
    position they share, which greedy speculative decoding relies on in bf16."""
    return max(1, -(-int(kv_len) // KEYS_PER_SPLIT))


def decode_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor, *,
                     num_heads: int, num_kv_heads: int, head_dim: int, causal: bool = True,
                     splits: int = 1, scale: float | None = None, window: int = 0) -> torch.Tensor:
    """q ``[B, T, H·D]`` at positions ``pos[b] + t``; kc / vc ``[B, Hkv, S, D]`` already holding
    this step's keys -> attention output ``[B, T, H·D]`` (ready for o_proj). window > 0 (causal
    only): query at p sees keys in ``(p - window, p]`` (a sliding layer, Hugging Face's convention)."""
    if window and not causal:
        raise ValueError("decode_attention: a window needs causal=True")
    b, t, _ = q.shape
    group = num_heads // num_kv_heads
    rows = group * t
    block_m = QUERY_ROWS  # fixed, not grown with T: the same MMA tile, so the same bits per row
    block_n = key_tile(head_dim)
    o = torch.empty_like(q)
    scale = head_dim ** -0.5 if scale is None else scale
    # the row tiles of one (row, KV head) first: they read the same keys and values, so they run
    # together and only the first reads them from HBM (at a 16-token verify of Qwen3-8B, B = 32: 4
    # tiles a head; with the heads first each tile read them again, 2.5 of the step's 17.9 ms)
    grid = (triton.cdiv(rows, block_m), b * num_kv_heads, splits)
    pdl = use_pdl(q)
    if splits == 1:
        part, ml = o, o
    else:
        part = torch.empty((b, t, num_heads, splits, head_dim), dtype=torch.float32, device=q.device)
        ml = torch.empty((b, t, num_heads, splits, 2), dtype=torch.float32, device=q.device)
    _attention_kernel[grid](
        q, kc, vc, part, ml, pos, float(scale),
        q.stride(0), q.stride(1), o.stride(0), o.stride(1), kc.stride(0), kc.stride(1), kc.stride(2),
        t, int(window), HKV=num_kv_heads, GROUP=group, D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        CAUSAL=bool(causal),
        SPLITS=splits, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 stays fp32, not TF32
        KEYS_PER_SPLIT=KEYS_PER_SPLIT, HAS_WINDOW=bool(window), num_warps=ATTENTION_WARPS, num_stages=ATTENTION_STAGES,
        PDL=pdl, **launch_options(pdl),
    )
    if splits > 1:
        _merge_kernel[(b * t * num_heads,)](part, ml, o, o.stride(0), o.stride(1), t, H=num_heads, D=head_dim,
                                            SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits), PDL=pdl,
                                            **launch_options(pdl))
    return o
