"""The fast target engine (domino_graft/fast) against Hugging Face's own forward, on tiny
random fp32 models: logits, hidden states, the static cache with per-row positions and
rollback, and greedy decoding. CPU by default; DOMINO_FAST_DEVICE=cuda runs the same tests
through CUDA graphs."""

from __future__ import annotations

import os

import pytest
import torch
import transformers

from domino_graft.fast import FastLM, GraphRunner, StaticKVCache, UnsupportedModel

DEVICE = torch.device(os.environ.get("DOMINO_FAST_DEVICE", "cpu"))
TOL = 1e-4 if DEVICE.type == "cpu" else 1e-3  # fp32; CUDA picks other attention/GEMM kernels
V = 97

SHAPES = dict(vocab_size=V, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=96, max_position_embeddings=256, rms_norm_eps=1e-6)
KINDS = {
    "llama_tied": (transformers.LlamaConfig, dict(tie_word_embeddings=True, rope_theta=10000.0)),
    "llama_untied": (transformers.LlamaConfig, dict(tie_word_embeddings=False, rope_theta=500000.0)),
    "llama3_rope": (transformers.LlamaConfig, dict(tie_word_embeddings=False, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32, "rope_theta": 500000.0})),
    "qwen3_tied": (transformers.Qwen3Config, dict(tie_word_embeddings=True)),
    "qwen3_untied": (transformers.Qwen3Config, dict(tie_word_embeddings=False)),
    "qwen2_bias": (transformers.Qwen2Config, dict(tie_word_embeddings=False)),
}


def build(kind: str, seed: int = 0):
    cls, extra = KINDS[kind]
    cfg = cls(**SHAPES, **extra)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms away from 1 and real biases, so every weight matters
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn_like(p))
    return model.eval().to(DEVICE)


def hf_logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def close(a, b, tol=TOL):
    diff = (a.float() - b.float()).abs().max().item()
    assert diff <= tol, f"max abs diff {diff} > {tol}"


@pytest.fixture(scope="module", params=["llama_tied", "llama_untied", "llama3_rope", "qwen3_tied", "qwen3_untied",
                                        "qwen2_bias"])
def model(request):
    return build(request.param)


def ids_of(b, t, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (b, t), generator=g).to(DEVICE)


def test_logits_and_hidden_states_equal_hf(model):
    ids = ids_of(2, 9)
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True)
    fl = FastLM.from_hf(model, max_batch=2, max_len=32)
    n = fl.cfg.num_layers
    logits, hidden = fl(ids, 0, capture=(*range(n), -1))
    close(logits, ref.logits)
    # hidden_states = [embeddings, layer 0, ..., layer n-2, final post-norm]
    for lid in range(n - 1):
        close(hidden[lid], ref.hidden_states[lid + 1])
    close(hidden[-1], ref.hidden_states[-1])
    # the last decoder layer's output (pre-norm), against a hook on that layer
    got = {}
    h = model.model.layers[n - 1].register_forward_hook(lambda _m, _i, o: got.setdefault("x", o[0] if isinstance(o, tuple) else o))
    try:
        hf_logits(model, ids)
    finally:
        h.remove()
    close(hidden[n - 1], got["x"])


def test_weights_are_shared_not_copied(model):
    fl = FastLM.from_hf(model, 1, 16)
    layer = model.model.layers[0]
    a, m = layer.self_attn, layer.mlp
    # q/k/v and gate/up: the HF parameters became slices of the fast path's fused weights
    wqkv, wgu = fl.layers[0][1], fl.layers[0][8]
    for fused, parts in ((wqkv, (a.q_proj, a.k_proj, a.v_proj)), (wgu, (m.gate_proj, m.up_proj))):
        start = fused.data_ptr()
        for mod in parts:
            assert mod.weight.data_ptr() == start and isinstance(mod.weight, torch.nn.Parameter)
            start += mod.weight.numel() * mod.weight.element_size()
        assert start == fused.data_ptr() + fused.numel() * fused.element_size()
    assert fl.embed.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert fl.lm_head.data_ptr() == model.lm_head.weight.data_ptr()
    assert fl.cfg.tie_word_embeddings == (model.lm_head.weight is model.model.embed_tokens.weight)
    # a second engine over the same model reuses the fused tensors (no new copy)
    again = FastLM.from_hf(model, 1, 16)
    assert again.layers[0][1].data_ptr() == wqkv.data_ptr() and again.layers[0][8].data_ptr() == wgu.data_ptr()
    # an in-place change through the HF module is what the fast path reads
    ids = ids_of(1, 5)
    with torch.no_grad():
        a.k_proj.weight.mul_(1.5)
    close(fl(ids, 0)[0], hf_logits(model, ids))


@pytest.mark.parametrize("through_runner", [False, True])
def test_incremental_decode_equals_full_forward(model, through_runner):
    ids = ids_of(1, 16, seed=2)
    ref = hf_logits(model, ids)
    fl = FastLM.from_hf(model, 1, 64)
    step = GraphRunner(fl, kv_block=16) if through_runner else fl
    logits, _ = fl(ids[:, :8], 0)  # prefill
    close(logits, ref[:, :8])
    for i in range(8, 11):  # T=1 steps at the cache's length (pos=None)
        logits, _ = step(ids[:, i:i + 1])
        close(logits[:, -1], ref[:, i])
    assert fl.cache.lengths.tolist() == [11] and fl.cache.host_lengths == [11]
    logits, _ = step(ids[:, 11:16], 11)  # a T=5 verify step
    close(logits, ref[:, 11:16])
    assert fl.cache.lengths.tolist() == [16]


def test_rollback_then_redecode_equals_fresh_decode(model):
    ids = ids_of(1, 14, seed=3)
    ref = hf_logits(model, ids)
    fl = FastLM.from_hf(model, 1, 64)
    run = GraphRunner(fl, kv_block=16)
    fl(ids[:, :8], 0)
    junk = (ids[:, 8:13] + 5) % V  # a rejected block of 5 drafts
    run(junk, 8)
    assert fl.cache.lengths.tolist() == [13]
    fl.cache.set_lengths(9 - 1)  # reject everything: keep the 8 prompt positions
    assert fl.cache.lengths.tolist() == [8] and fl.cache.host_lengths == [8]
    logits, _ = run(ids[:, 8:12])  # pos from the rolled-back length
    close(logits, ref[:, 8:12])
    # a block [right, wrong] at 12..13, rolled back by a tensor (on a GPU, no host sync): keep 13
    run(torch.cat([ids[:, 12:13], junk[:, :1]], 1), 12)
    fl.cache.set_lengths(torch.tensor([13], device=DEVICE))
    assert fl.cache.host_lengths == ([13] if DEVICE.type == "cpu" else None)
    logits, _ = run(ids[:, 13:14])
    close(logits[:, -1], ref[:, 13])


def test_per_row_positions(model):
    """Rows of one batch at different positions (ragged lengths after different rollbacks)."""
    a, b = ids_of(1, 12, seed=4), ids_of(1, 12, seed=5)
    ref_a, ref_b = hf_logits(model, a), hf_logits(model, b)
    fl = FastLM.from_hf(model, 2, 32)
    run = GraphRunner(fl, kv_block=8)
    fl(torch.cat([a[:, :7], b[:, :7]]), 0)
    fl.cache.set_lengths([7, 4])  # row 1 rejected its last 3
    logits, _ = run(torch.cat([a[:, 7:10], b[:, 4:7]]))  # pos from the lengths: [7, 4]
    close(logits[0], ref_a[0, 7:10])
    close(logits[1], ref_b[0, 4:7])
    logits, _ = run(torch.cat([a[:, 10:12], b[:, 7:9]]), [10, 7])
    close(logits[0], ref_a[0, 10:12])
    close(logits[1], ref_b[0, 7:9])
    assert fl.cache.lengths.tolist() == [12, 9]


def hf_greedy(model, prompt, n):
    ids = prompt
    for _ in range(n):
        nxt = hf_logits(model, ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize("kind", ["llama_untied", "qwen3_tied"])
def test_greedy_equals_hf_greedy(kind):
    model = build(kind, seed=7)
    fl = FastLM.from_hf(model, 1, 64)
    run = GraphRunner(fl, kv_block=16)
    for seed in range(3):
        prompt = ids_of(1, 5 + 3 * seed, seed=10 + seed)
        want = hf_greedy(model, prompt, 12)
        assert fl.greedy(prompt, 12, step=run) == want
        assert fl.greedy(prompt, 12) == want
    if run.use_graphs:  # one graph per (shape, bucket), replayed at every position
        assert run.captures == len(run.graphs) <= 3


def test_static_cache_write_and_lengths():
    c = StaticKVCache(2, 2, 3, 10, 4, dtype=torch.float32, device=DEVICE)
    k = torch.randn(2, 3, 2, 4, device=DEVICE)
    v = torch.randn(2, 3, 2, 4, device=DEVICE)
    idx = torch.tensor([[0, 1], [5, 6]], device=DEVICE)
    c.write(1, k, v, idx)
    assert torch.equal(c.k[1][0, :, 0:2], k[0]) and torch.equal(c.v[1][1, :, 5:7], v[1])
    assert c.k[0].abs().sum() == 0
    c.set_lengths([2, 7])
    assert c.lengths.tolist() == [2, 7] and c.host_lengths == [2, 7]
    c.set_lengths(1, rows=1)
    assert c.host_lengths == [1, 7]
    with pytest.raises(ValueError):
        c.set_lengths(11)
    c.reset()
    assert c.lengths.tolist() == [0, 0]


def test_refuses_what_it_does_not_support():
    cfg = transformers.MistralConfig(**SHAPES, sliding_window=8)
    with pytest.raises(UnsupportedModel, match="sliding-window"):
        FastLM.from_hf(transformers.AutoModelForCausalLM.from_config(cfg), 1, 32)
    cfg = transformers.LlamaConfig(**SHAPES, rope_scaling={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(UnsupportedModel, match="RoPE type 'dynamic'"):
        FastLM.from_hf(transformers.AutoModelForCausalLM.from_config(cfg), 1, 32)
    cfg = transformers.LlamaConfig(**SHAPES, hidden_act="gelu")
    with pytest.raises(UnsupportedModel, match="hidden_act"):
        FastLM.from_hf(transformers.AutoModelForCausalLM.from_config(cfg), 1, 32)
    # a window at least max_len long is plain causal attention: accepted
    cfg = transformers.MistralConfig(**SHAPES, sliding_window=64)
    FastLM.from_hf(transformers.AutoModelForCausalLM.from_config(cfg), 1, 32)


def test_positions_outside_the_cache_are_refused():
    fl = FastLM.from_hf(build("llama_tied"), 1, 16)
    with pytest.raises(ValueError, match="outside the cache"):
        fl(ids_of(1, 4), 14)
    with pytest.raises(ValueError, match="outside the cache"):
        GraphRunner(fl)(ids_of(1, 1), 16)


@pytest.mark.parametrize("scope", ["model", "layer"])
def test_compiled_forward_equals_eager(scope):
    """torch.compile of the whole forward (the CUDA default) and of its per-layer pieces gives
    the eager math's logits, hidden states and cache writes (inductor on the CPU here)."""
    model = build("qwen2_bias")
    eager, comp = FastLM.from_hf(model, 1, 32), FastLM.from_hf(model, 1, 32).compile(scope)
    assert comp.compiled == scope
    ids = ids_of(1, 7)
    for lm in (eager, comp):
        lm.forward(ids[:, :5], 0, use_compiled=False)
    a, ha = eager(ids[:, 5:], 5, capture=(1, -1))
    b, hb = comp(ids[:, 5:], 5, capture=(1, -1))
    close(a, b, 1e-5)
    for lid in (1, -1):
        close(ha[lid], hb[lid], 1e-5)
    close(eager.cache.k[2][:, :, :7], comp.cache.k[2][:, :, :7], 1e-5)
    assert comp.cache.host_lengths[0] == 7


def test_additive_mask_equals_boolean_mask(model):
    """The CUDA default's additive 0 / -inf attention mask (float_mask) gives the boolean mask's
    logits, over a prefill and a verify-sized step at an offset."""
    ids = ids_of(1, 12)
    outs = []
    for float_mask in (False, True):
        fl = FastLM.from_hf(model, 1, 32)
        fl.float_mask = float_mask
        fl(ids[:, :7], 0)
        outs.append(fl(ids[:, 7:], 7, kv_len=16)[0])
    close(outs[0], outs[1], 1e-5)
