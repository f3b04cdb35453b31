"""The fast engine's attention kernels (kernels/engine/decode_attention.py) against their torch math
(domino_graft.fast.llama: rope_qkv_reference, attention_reference), and the FastLM forward
with kernels "triton" against the default per-layer math.

CPU (default): Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported), fp32,
small awkward shapes: GQA groups 1 / 3, head dims 16 / 32, per-row positions across key tiles,
causal and block (non-causal) masks, 1 to 4 key splits. GPU (`-m gpu`): bf16 at Qwen3-8B's
head layout, and greedy decoding through CUDA graphs.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from domino_graft.fast import FastLM, GraphRunner  # noqa: E402
from domino_graft.fast.llama_split import attention_reference, rope_qkv_reference  # noqa: E402

from ..fast.test_static_engine import build, ids_of  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="CPU kernel tests run in Triton's interpreter")
ATOL = 2e-5  # fp32 with another summation order


def _kernels():
    from domino_graft.kernels.engine import decode_attention as k

    return k


def _close(a, b, atol=ATOL, what=""):
    err = (a.double() - b.double()).abs().max().item()
    assert err <= atol, f"{what}: max abs err {err:.3g} > {atol}"


def _cache(b, hkv, s, d, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator(device).manual_seed(seed)
    return [torch.randn((b, hkv, s, d), generator=g, device=device).to(dtype) for _ in range(2)]


# (B, T, H, Hkv, D, with q/k norms)
ROPE_SHAPES = [(1, 1, 4, 2, 16, True), (2, 5, 6, 2, 32, False), (3, 3, 3, 1, 16, True)]


@needs_interpreter
@pytest.mark.parametrize("b,t,h,hkv,d,norm", ROPE_SHAPES)
def test_norm_rope_cache_equals_reference(b, t, h, hkv, d, norm):
    k = _kernels()
    g = torch.Generator().manual_seed(b * 100 + t)
    qkv = torch.randn((b, t, (h + 2 * hkv) * d), generator=g)
    pos = torch.tensor([7, 0, 130][:b])
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    qn = 1.0 + 0.1 * torch.randn(d, generator=g) if norm else None
    kn = 1.0 + 0.1 * torch.randn(d, generator=g) if norm else None
    kc1, vc1 = _cache(b, hkv, 160, d, seed=3)
    kc2, vc2 = kc1.clone(), vc1.clone()
    q1 = k.norm_rope_cache(qkv, kc1, vc1, pos, inv_freq, 1.25, qn, kn, 1e-6, h, hkv, d)
    q2 = rope_qkv_reference(qkv, kc2, vc2, pos, inv_freq, 1.25, qn, kn, 1e-6, h, hkv, d)
    _close(q1, q2, what="q")
    _close(kc1, kc2, what="k cache (written positions, and untouched elsewhere)")
    _close(vc1, vc2, what="v cache")


# (B, T, H, Hkv, D, positions, causal, splits)
ATTN_CASES = [
    (1, 1, 4, 2, 16, [0], True, 1),
    (1, 1, 4, 4, 32, [200], True, 1),
    (2, 5, 6, 2, 16, [3, 140], True, 1),
    (2, 5, 6, 2, 16, [3, 140], True, 2),
    (1, 16, 8, 2, 32, [70], True, 4),
    (1, 2, 4, 2, 16, [600], True, 2),  # keys in two 512-position splits
    (1, 1, 4, 2, 16, [600], True, 1),  # fewer splits than the keys need: the last one reads the rest
    (2, 8, 6, 2, 16, [0, 77], False, 1),
    (2, 8, 6, 2, 16, [9, 150], False, 2),
]


@needs_interpreter
@pytest.mark.parametrize("b,t,h,hkv,d,positions,causal,splits", ATTN_CASES)
def test_decode_attention_equals_reference(b, t, h, hkv, d, positions, causal, splits):
    k = _kernels()
    g = torch.Generator().manual_seed(sum(positions) + t)
    q = torch.randn((b, t, h * d), generator=g)
    kc, vc = _cache(b, hkv, 640 if max(positions) > 200 else 256, d, seed=5)
    pos = torch.tensor(positions)
    out = k.decode_attention(q, kc, vc, pos, num_heads=h, num_kv_heads=hkv, head_dim=d, causal=causal, splits=splits)
    ref = attention_reference(q, kc, vc, pos, num_heads=h, num_kv_heads=hkv, head_dim=d, causal=causal)
    _close(out, ref, what=f"attention (causal={causal}, splits={splits})")


# (B, T, H, Hkv, D, positions, q/k norms, causal): the composition the engine calls
FUSED_CASES = [
    (1, 1, 4, 2, 16, [0], True, True),
    (2, 16, 6, 2, 32, [5, 90], True, True),
    (2, 4, 3, 3, 16, [70, 1], False, True),
    (1, 8, 4, 1, 16, [33], True, False),
    (2, 20, 4, 2, 16, [0, 40], True, True),
]


@needs_interpreter
@pytest.mark.parametrize("b,t,h,hkv,d,positions,norm,causal", FUSED_CASES)
def test_rope_attention_equals_reference(b, t, h, hkv, d, positions, norm, causal):
    k = _kernels()
    g = torch.Generator().manual_seed(sum(positions) * 7 + t)
    qkv = torch.randn((b, t, (h + 2 * hkv) * d), generator=g)
    pos = torch.tensor(positions)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2).float() / d))
    qn = 1.0 + 0.1 * torch.randn(d, generator=g) if norm else None
    kn = 1.0 + 0.1 * torch.randn(d, generator=g) if norm else None
    kc1, vc1 = _cache(b, hkv, 160, d, seed=11)
    kc2, vc2 = kc1.clone(), vc1.clone()
    out = k.rope_attention(qkv, kc1, vc1, pos, inv_freq, 1.0, qn, kn, 1e-6, h, hkv, d, causal=causal)
    q = rope_qkv_reference(qkv, kc2, vc2, pos, inv_freq, 1.0, qn, kn, 1e-6, h, hkv, d)
    ref = attention_reference(q, kc2, vc2, pos, num_heads=h, num_kv_heads=hkv, head_dim=d, causal=causal)
    _close(out, ref, what=f"rope + attention (T={t}, causal={causal})")
    _close(kc1, kc2, what="k cache")
    _close(vc1, vc2, what="v cache")


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("h,hkv,d", [(32, 8, 128), (9, 3, 64)])  # Qwen3-8B's and SmolLM2's heads
def test_gpu_a_rows_bits_do_not_depend_on_t_or_the_split_count(h, hkv, d):
    """bf16: the 1-token step at position p + j gives the bits of row j of the 16-token verify at
    p, with one key split or three (greedy speculative decoding relies on it). GPU only: the
    CPU interpreter's numpy matmul rounds a row differently by its place in the tile."""
    k = _kernels()
    dev = torch.device("cuda")
    kw = dict(num_heads=h, num_kv_heads=hkv, head_dim=d)
    for p0 in (100, 590, 1100):
        q = torch.randn((1, 16, h * d), device=dev, dtype=torch.bfloat16)
        kc, vc = _cache(1, hkv, 1536, d, seed=p0, dtype=torch.bfloat16, device=dev)
        base = k.attention_splits(p0 + 16)
        full = k.decode_attention(q, kc, vc, torch.tensor([p0], device=dev), splits=base, **kw)
        for j in (0, 5, 15):
            for splits in {k.attention_splits(p0 + j + 1), base + 1}:
                one = k.decode_attention(q[:, j:j + 1], kc, vc, torch.tensor([p0 + j], device=dev), splits=splits,
                                         **kw)
                assert torch.equal(one[0, 0], full[0, j]), f"p {p0}, row {j}, {splits} splits: not the verify's bits"


# (B, T, H, Hkv, D, positions, window, splits): sliding layers (Gemma-3), keys in (p - W, p]
WINDOW_CASES = [
    (1, 1, 4, 2, 16, [200], 8, 1),  # the key tiles before the window are skipped
    (1, 1, 4, 2, 16, [200], 1, 1),  # a query sees only itself
    (2, 5, 6, 2, 16, [3, 140], 64, 2),  # row 0 inside its window, row 1 across a tile edge
    (1, 16, 8, 2, 32, [560], 100, 2),  # the window straddles the 512-position split edge
    (1, 2, 4, 2, 16, [600], 700, 2),  # a window longer than the context: plain causal
    (2, 8, 6, 2, 16, [0, 77], 5, 1),
]


@needs_interpreter
@pytest.mark.parametrize("b,t,h,hkv,d,positions,window,splits", WINDOW_CASES)
def test_decode_attention_window_equals_reference(b, t, h, hkv, d, positions, window, splits):
    k = _kernels()
    g = torch.Generator().manual_seed(sum(positions) + t + window)
    q = torch.randn((b, t, h * d), generator=g)
    kc, vc = _cache(b, hkv, 640 if max(positions) > 200 else 256, d, seed=5)
    pos = torch.tensor(positions)
    kw = dict(num_heads=h, num_kv_heads=hkv, head_dim=d, scale=0.3)
    out = k.decode_attention(q, kc, vc, pos, splits=splits, window=window, **kw)
    ref = attention_reference(q, kc, vc, pos, window=window, **kw)
    _close(out, ref, what=f"attention (window={window}, splits={splits})")
    if window < max(positions):  # the window matters here
        assert (ref - attention_reference(q, kc, vc, pos, **kw)).abs().max() > 1e-3


@needs_interpreter
def test_keys_before_the_window_are_never_read():
    """A sliding layer's keys at or before pos - window are never read: NaN there changes nothing."""
    k = _kernels()
    q = torch.randn((1, 3, 4 * 16))
    kc, vc = _cache(1, 2, 256, 16, seed=8)
    kw = dict(num_heads=4, num_kv_heads=2, head_dim=16, window=10)
    ref = attention_reference(q, kc, vc, torch.tensor([150]), **kw)
    kc[:, :, :141], vc[:, :, :141] = float("nan"), float("nan")  # query 150 sees 141..150
    out = k.decode_attention(q, kc, vc, torch.tensor([150]), splits=1, **kw)
    _close(out, ref, what="windowed attention with NaN before the window")


@needs_interpreter
@pytest.mark.parametrize("b,t,h,hkv,d,norm", [s for s in ROPE_SHAPES if s[-1]])
def test_norm_rope_cache_plus_one_equals_reference(b, t, h, hkv, d, norm):
    """Gemma's q/k norm in the kernel (plus_one: (normed * (1 + w)) in fp32) against gemma_norm."""
    from domino_graft.fast.gemma3 import gemma_norm

    k = _kernels()
    g = torch.Generator().manual_seed(b * 10 + t)
    qkv = torch.randn((b, t, (h + 2 * hkv) * d), generator=g)
    pos = torch.tensor([7, 0, 130][:b])
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, d, 2).float() / d))
    qn, kn = 0.2 * torch.randn(d, generator=g), 0.2 * torch.randn(d, generator=g)
    kc1, vc1 = _cache(b, hkv, 160, d, seed=3)
    kc2, vc2 = kc1.clone(), vc1.clone()
    q1 = k.norm_rope_cache(qkv, kc1, vc1, pos, inv_freq, 1.0, qn, kn, 1e-6, h, hkv, d, plus_one=True)
    q2 = rope_qkv_reference(qkv, kc2, vc2, pos, inv_freq, 1.0, qn, kn, 1e-6, h, hkv, d, norm=gemma_norm)
    _close(q1, q2, what="q")
    _close(kc1, kc2, what="k cache")
    _close(vc1, vc2, what="v cache")


def _token_bits_do_not_depend_on_the_batch(h, hkv, d, norm, plus_one, dtype, device, b=3, t=5):
    """Token (b - 2, t - 2) of a [b, t] call against the same token alone (B=1, T=1), and its k / v
    alone in kv_only mode: the same bits of q and of the k / v cache entries."""
    k = _kernels()
    g = torch.Generator(device).manual_seed(h * 10 + hkv)
    qkv = torch.randn((b, t, (h + 2 * hkv) * d), generator=g, device=device).to(dtype)
    pos = (torch.arange(b, device=device) * 37 + 7) % 101
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=device).float() / d))
    qn = (1.0 + 0.1 * torch.randn(d, generator=g, device=device)).to(dtype) if norm else None
    kn = (1.0 + 0.1 * torch.randn(d, generator=g, device=device)).to(dtype) if norm else None
    args = (inv_freq, 1.25, qn, kn, 1e-6, h, hkv, d)
    kc, vc = _cache(b, hkv, 160, d, seed=4, dtype=dtype, device=device)
    q = k.norm_rope_cache(qkv, kc, vc, pos, *args, plus_one=plus_one)
    bi, ti = b - 2, t - 2
    p = int(pos[bi]) + ti
    for kv_only in (False, True):
        kc1, vc1 = _cache(1, hkv, 160, d, seed=5, dtype=dtype, device=device)
        q1 = k.norm_rope_cache(qkv[bi:bi + 1, ti:ti + 1], kc1, vc1, pos[bi:bi + 1] + ti, *args, kv_only=kv_only,
                               plus_one=plus_one)
        if not kv_only:
            assert torch.equal(q1[0, 0], q[bi, ti]), "q: not the batched call's bits"
        assert torch.equal(kc1[0, :, p], kc[bi, :, p]), f"k cache (kv_only={kv_only}): not the batched call's bits"
        assert torch.equal(vc1[0, :, p], vc[bi, :, p]), f"v cache (kv_only={kv_only}): not the batched call's bits"


@needs_interpreter
@pytest.mark.parametrize("norm,plus_one", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("h,hkv", [(4, 2), (6, 1), (5, 1), (9, 3)])  # 8, 8, 7, 15 head slots
def test_norm_rope_cache_token_bits_do_not_depend_on_the_batch(h, hkv, norm, plus_one):
    """A token's q and k / v cache entries are the same bits computed alone (B=1, T=1), inside a
    [3, 5] call, or in kv_only mode: the heads a program holds never depend on B·T; slot counts
    below, at and past one block of NORM_ROPE_HEADS (the tail block masked)."""
    _token_bits_do_not_depend_on_the_batch(h, hkv, 16, norm, plus_one, torch.float32, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("h,hkv,d", [(32, 8, 128), (9, 3, 64)])  # Qwen3-8B's and SmolLM2's heads
def test_gpu_norm_rope_cache_token_bits_do_not_depend_on_the_batch(h, hkv, d):
    """bf16: a token's bits at B=1, T=1 are its bits in a 32 x 16 verify (and in kv_only mode)."""
    for norm, plus_one in ((False, False), (True, False), (True, True)):
        _token_bits_do_not_depend_on_the_batch(h, hkv, d, norm, plus_one, torch.bfloat16, "cuda", b=32, t=16)


@needs_interpreter
def test_keys_past_the_position_are_never_read():
    """The kernel's bound is pos + T read on the device: garbage (NaN) after it changes nothing."""
    k = _kernels()
    q = torch.randn((1, 2, 4 * 16))
    kc, vc = _cache(1, 2, 128, 16, seed=7)
    ref = attention_reference(q, kc, vc, torch.tensor([40]), num_heads=4, num_kv_heads=2, head_dim=16)
    kc[:, :, 42:], vc[:, :, 42:] = float("nan"), float("nan")
    out = k.decode_attention(q, kc, vc, torch.tensor([40]), num_heads=4, num_kv_heads=2, head_dim=16)
    _close(out, ref, what="attention with NaN past pos + T")


@needs_interpreter
@pytest.mark.parametrize("kind", ["llama_untied", "qwen3_tied", "qwen2_bias"])
def test_fastlm_triton_kernels_equal_default_math(kind):
    """Prefill, per-row steps and hidden captures: kernels "triton" (and "reference") give the
    default forward's logits and hidden states."""
    model = build(kind)
    outs = {}
    for name in ("torch", "reference", "triton"):
        lm = FastLM.from_hf(model, max_batch=2, max_len=64).use_kernels(name)
        ids = ids_of(2, 7)
        first = lm.forward(ids, 0, capture=(0, 2, -1))
        second = lm.forward(ids[:, :3], [7, 5], capture=(1, -1))
        outs[name] = (first, second)
    for name in ("reference", "triton"):
        for (la, ha), (lb, hb) in zip(outs["torch"], outs[name]):
            _close(lb, la, atol=1e-5, what=f"{kind} {name} logits")
            assert ha.keys() == hb.keys()
            for lid in ha:
                _close(hb[lid], ha[lid], atol=1e-5, what=f"{kind} {name} hidden {lid}")


def test_unknown_kernels_and_unsupported_heads_are_refused():
    from domino_graft.fast import UnsupportedModel

    model = build("llama_tied")  # head_dim 16
    lm = FastLM.from_hf(model, max_len=32)
    with pytest.raises(ValueError, match="attention kernels 'cuda'; valid: torch, triton, reference"):
        lm.use_kernels("cuda")
    lm.cfg = dataclasses.replace(lm.cfg, head_dim=24)
    with pytest.raises(UnsupportedModel, match="head_dim 24; valid: a power of two >= 16"):
        lm.use_kernels("triton")


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_bf16_kernels_and_graph_greedy():
    """bf16 at Qwen3-8B's head layout (32 q / 8 kv heads, D 128): kernels within bf16 error of the
    torch math; greedy decoding through CUDA graphs equal to the same engine without graphs."""
    k = _kernels()
    dev = torch.device("cuda")
    h, hkv, d = 32, 8, 128
    for t, pos, causal, splits in ((1, [700], True, 1), (16, [300], True, 1), (16, [1500], True, 4),
                                   (16, [200], False, 1)):
        q = torch.randn((1, t, h * d), device=dev, dtype=torch.bfloat16)
        kc, vc = _cache(1, hkv, 2048, d, seed=1, dtype=torch.bfloat16, device=dev)
        p = torch.tensor(pos, device=dev)
        out = k.decode_attention(q, kc, vc, p, num_heads=h, num_kv_heads=hkv, head_dim=d, causal=causal,
                                 splits=splits)
        ref = attention_reference(q.float(), kc.float(), vc.float(), p, num_heads=h, num_kv_heads=hkv, head_dim=d,
                                  causal=causal)
        _close(out, ref, atol=2e-2, what=f"bf16 attention t={t} pos={pos}")
    model = build("qwen3_untied").to(dev)
    prompt = ids_of(1, 9).to(dev)
    lm = FastLM.from_hf(model, max_len=512).use_kernels("triton")
    eager = lm.greedy(prompt, 40)
    lm2 = FastLM.from_hf(model, max_len=512).use_kernels("triton").compile()
    runner = GraphRunner(lm2)
    assert lm2.greedy(prompt, 40, step=runner) == eager
    assert runner.captures >= 1



@needs_interpreter
@pytest.mark.parametrize("kernels,linears", [("reference", None), ("triton", None), ("reference", "reference"),
                                             ("triton", "triton")])
def test_static_dflash_drafter_with_kernels_equals_default(kernels, linears):
    """DFlash's static drafter with use_kernels (one q/k/v matmul over context + block rows, the
    block's keys written over the rejected drafts' slots, attention bounded on the device), and
    with use_linears on top (every norm and projection a kernel), proposes the default static
    drafter's blocks, across accept counts 0..K."""
    import random

    from domino_graft.adapters.dflash.fast import StaticDFlashDrafter

    from ..decoding.test_static_kv import graft

    target, adapter, _ = graft("dflash", "qwen3", seed=3, extra=("target.random.head_dim=16",))
    k, f = adapter.num_slots, adapter.cfg.hidden_size * len(adapter.cfg.target_layer_ids)
    g = torch.Generator().manual_seed(0)
    n = 40
    default = StaticDFlashDrafter(adapter, 256)
    fused = StaticDFlashDrafter(adapter, 256).use_kernels(kernels)
    if linears:
        fused.use_linears(linears).compile()  # compile() leaves the kernels' pieces as they are
        assert fused._split["linears"] == linears
    prompt_feats = torch.randn(1, n, f, generator=g)
    with torch.inference_mode():
        default.prefill(prompt_feats, n)
        fused.prefill(prompt_feats, n)
        pos, rng = n, random.Random(0)
        for step in range(8):
            anchor = torch.tensor([rng.randrange(target.shape.vocab_size)])
            want, got = default.propose(anchor, pos), fused.propose(anchor, pos)
            _close(got.hidden, want.hidden, atol=2e-5, what=f"block {step} hidden")
            _close(got.base_logits, want.base_logits, atol=2e-5, what=f"block {step} logits")
            a = [0, k, 1, k, k - 1, 0][step % 6]
            verified = torch.randn(1, k + 1, f, generator=g)
            default.observe_block(verified, pos)
            fused.observe_block(verified, pos)
            pos += a + 1


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_dflash_drafter_kernels_graphed_equal_default():
    """fp32 on the GPU: the graphed, compiled kernel drafter proposes the eager default drafter's
    blocks across accepts and a kv bucket."""
    from domino_graft.adapters.dflash.fast import StaticDFlashDrafter

    from ..decoding.test_static_kv import graft

    # the tiny recipe's head_dim 8 is below tl.dot's 16
    target, adapter, _ = graft("dflash", "qwen3", seed=1, extra=("target.random.head_dim=16",))
    for module in (target.model, adapter):
        module.to("cuda")
    f = adapter.cfg.hidden_size * len(adapter.cfg.target_layer_ids)
    k = adapter.num_slots
    with torch.inference_mode():
        fused = StaticDFlashDrafter(adapter, 1024).use_kernels("triton").compile()
        eager = StaticDFlashDrafter(adapter, 1024)
        eager.use_graphs = False
        g = torch.Generator(device="cuda").manual_seed(0)
        n = 250
        feats = torch.randn(1, n, f, device="cuda", generator=g)
        fused.prefill(feats, n)
        eager.prefill(feats, n)
        pos = n
        for step in range(30):
            anchor = torch.randint(0, target.shape.vocab_size, (1,), device="cuda", generator=g)
            a_blk, b_blk = fused.propose(anchor, pos), eager.propose(anchor, pos)
            torch.testing.assert_close(a_blk.base_logits, b_blk.base_logits, atol=1e-4, rtol=1e-4)
            verified = torch.randn(1, k + 1, f, device="cuda", generator=g)
            fused.observe_block(verified, pos)
            eager.observe_block(verified, pos)
            pos += [k, 0, k, 1][step % 4] + 1
        assert pos > 256 and all(c.graph is not None for c in fused._calls.values())
