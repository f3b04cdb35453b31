"""The fast engine's Gemma-3 forward (domino_graft/fast/gemma3.py) against Hugging Face's
Gemma3ForCausalLM on a tiny random fp32 model whose sliding window (8) is shorter than the
prompts and decodes, so every test crosses the window's edge: logits and hidden states, the
static cache with per-row positions and rollback, greedy decoding, the kernel split ("reference"
on the CPU; "triton" in Triton's interpreter when it is installed). CPU by default;
DOMINO_FAST_DEVICE=cuda runs the same tests on a GPU; `-m gpu` adds graph replay."""

from __future__ import annotations

import os

import pytest
import torch
import transformers

if not torch.cuda.is_available():  # the Triton kernels run in the interpreter (as tests/kernels do)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from domino_graft.fast import FastLM, GraphRunner, UnsupportedModel
from domino_graft.fast.gemma3 import Gemma3LM

DEVICE = torch.device(os.environ.get("DOMINO_FAST_DEVICE", "cpu"))
TOL = 1e-4 if DEVICE.type == "cpu" else 1e-3
V = 97
WINDOW = 8
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]


def gemma_config(**extra):
    kw = dict(vocab_size=V, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=96, max_position_embeddings=256, rms_norm_eps=1e-6,
              sliding_window=WINDOW, layer_types=LAYER_TYPES, query_pre_attn_scalar=24, tie_word_embeddings=True,
              # two RoPEs that differ: a linearly scaled global one, a short-based local one
              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})
    kw.update(extra)
    cfg = transformers.Gemma3TextConfig(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def build(seed: int = 0, **extra):
    torch.manual_seed(seed)
    model = transformers.Gemma3ForCausalLM(gemma_config(**extra))
    with torch.no_grad():  # norm weights away from 0 (Gemma scales by 1 + w), so every weight matters
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(0.2 * torch.randn_like(p))
    return model.eval().to(DEVICE)


@pytest.fixture(scope="module")
def model():
    return build()


def ids_of(b, t, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (b, t), generator=g).to(DEVICE)


def hf_logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def close(a, b, tol=TOL):
    diff = (a.float() - b.float()).abs().max().item()
    assert diff <= tol, f"max abs diff {diff} > {tol}"


def test_dispatch_and_layer_kinds(model):
    fl = FastLM.from_hf(model, 1, 32)
    assert isinstance(fl, Gemma3LM) and fl.kinds == (1, 0, 1, 1) and fl.window == WINDOW
    rot = model.model.rotary_emb
    # each kind's RoPE is HF's own buffer (5.x names), not a recomputation
    assert fl.ropes[0][0] is rot.full_attention_inv_freq and fl.ropes[1][0] is rot.sliding_attention_inv_freq
    assert not torch.equal(fl.ropes[0][0], fl.ropes[1][0])
    assert fl.attn_scale == 24 ** -0.5


def test_the_window_matters(model):
    """Guard against a vacuous test: without its window the model's logits past it differ."""
    ids = ids_of(1, 20)
    fl = FastLM.from_hf(model, 1, 32)
    fl.window = 0
    full, _ = fl(ids, 0)
    ref = hf_logits(model, ids)
    close(full[:, :WINDOW], ref[:, :WINDOW])
    assert (full[:, WINDOW:] - ref[:, WINDOW:]).abs().max() > 1e-2


def test_logits_and_hidden_states_equal_hf(model):
    ids = ids_of(2, 20)
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True)
    fl = FastLM.from_hf(model, max_batch=2, max_len=32)
    n = fl.cfg.num_layers
    logits, hidden = fl(ids, 0, capture=(*range(n), -1))
    close(logits, ref.logits)
    # hidden_states = [scaled embeddings, layer 0, ..., layer n-2, final post-norm]
    for lid in range(n - 1):
        close(hidden[lid], ref.hidden_states[lid + 1])
    close(hidden[-1], ref.hidden_states[-1])


@pytest.mark.parametrize("layer_types", [["sliding_attention"] * 3, ["full_attention"] * 2])
def test_one_layer_kind_only(layer_types):
    """HF builds the RoPE of the kinds in use only (the project's random 4-layer Gemma-3 is all
    sliding layers); a model of one kind still loads and equals HF."""
    model = build(seed=5, num_hidden_layers=len(layer_types), layer_types=layer_types)
    ids = ids_of(1, 19)
    close(FastLM.from_hf(model, 1, 32)(ids, 0)[0], hf_logits(model, ids))


def test_weights_are_shared_not_copied(model):
    fl = FastLM.from_hf(model, 1, 16)
    a, m = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert a.q_proj.weight.data_ptr() == fl.layers[0][1].data_ptr()
    assert m.gate_proj.weight.data_ptr() == fl.layers[0][10].data_ptr()
    assert fl.embed.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = ids_of(1, 12)
    with torch.no_grad():
        model.model.layers[2].pre_feedforward_layernorm.weight.add_(0.5)
    try:
        close(fl(ids, 0)[0], hf_logits(model, ids))
    finally:
        with torch.no_grad():
            model.model.layers[2].pre_feedforward_layernorm.weight.sub_(0.5)


@pytest.mark.parametrize("through_runner", [False, True])
def test_incremental_decode_equals_full_forward(model, through_runner):
    ids = ids_of(1, 24, seed=2)
    ref = hf_logits(model, ids)
    fl = FastLM.from_hf(model, 1, 64)
    step = GraphRunner(fl, kv_block=16) if through_runner else fl
    logits, _ = fl(ids[:, :6], 0)  # a prefill shorter than the window
    close(logits, ref[:, :6])
    for i in range(6, 12):  # T=1 steps across the window edge (position 8)
        logits, _ = step(ids[:, i:i + 1])
        close(logits[:, -1], ref[:, i])
    logits, _ = step(ids[:, 12:17], 12)  # a T=5 verify step
    close(logits, ref[:, 12:17])
    logits, _ = step(ids[:, 17:24])  # one longer than the window's reach
    close(logits, ref[:, 17:24])
    assert fl.cache.lengths.tolist() == [24]


def test_rollback_then_redecode_equals_fresh_decode(model):
    ids = ids_of(1, 22, seed=3)
    ref = hf_logits(model, ids)
    fl = FastLM.from_hf(model, 1, 64)
    run = GraphRunner(fl, kv_block=16)
    fl(ids[:, :7], 0)
    junk = (ids[:, 7:12] + 5) % V  # a rejected block of 5 drafts straddling the window edge
    run(junk, 7)
    fl.cache.set_lengths(7)
    logits, _ = run(ids[:, 7:12])
    close(logits, ref[:, 7:12])
    # full acceptance, then a rejection right after it
    run(torch.cat([ids[:, 12:16], junk[:, :1]], 1), 12)
    fl.cache.set_lengths(torch.tensor([16], device=DEVICE))
    logits, _ = run(ids[:, 16:17])
    close(logits[:, -1], ref[:, 16])
    logits, _ = run(ids[:, 17:22])
    close(logits, ref[:, 17:22])


def test_per_row_positions(model):
    a, b = ids_of(1, 20, seed=4), ids_of(1, 20, seed=5)
    ref_a, ref_b = hf_logits(model, a), hf_logits(model, b)
    fl = FastLM.from_hf(model, 2, 32)
    run = GraphRunner(fl, kv_block=8)
    fl(torch.cat([a[:, :11], b[:, :11]]), 0)
    fl.cache.set_lengths([11, 5])  # row 1 rejected its last 6
    logits, _ = run(torch.cat([a[:, 11:14], b[:, 5:8]]))
    close(logits[0], ref_a[0, 11:14])
    close(logits[1], ref_b[0, 5:8])
    logits, _ = run(torch.cat([a[:, 14:20], b[:, 8:14]]), [14, 8])
    close(logits[0], ref_a[0, 14:20])
    close(logits[1], ref_b[0, 8:14])
    assert fl.cache.lengths.tolist() == [20, 14]


def hf_greedy(model, prompt, n):
    ids = prompt
    for _ in range(n):
        nxt = hf_logits(model, ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids[0, prompt.shape[1]:].tolist()


def test_greedy_equals_hf_greedy():
    model = build(seed=7, tie_word_embeddings=False)
    fl = FastLM.from_hf(model, 1, 64)
    assert not fl.cfg.tie_word_embeddings
    run = GraphRunner(fl, kv_block=16)
    for seed in range(2):
        prompt = ids_of(1, 4 + 5 * seed, seed=10 + seed)
        want = hf_greedy(model, prompt, 16)
        assert fl.greedy(prompt, 16, step=run) == want
        assert fl.greedy(prompt, 16) == want


def test_additive_mask_equals_boolean_mask(model):
    ids = ids_of(1, 20)
    outs = []
    for float_mask in (False, True):
        fl = FastLM.from_hf(model, 1, 32)
        fl.float_mask = float_mask
        fl(ids[:, :11], 0)
        outs.append(fl(ids[:, 11:], 11, kv_len=24)[0])
    close(outs[0], outs[1], 1e-5)


@pytest.mark.parametrize("scope,kernels", [("layer", "torch"), ("layer", "reference")])  # the CUDA setups
def test_compiled_forward_equals_eager(model, scope, kernels):
    """torch.compile (inductor on the CPU here) of the per-layer math (one compiled layer for
    sliding and full layers) and of the pieces around the attention kernels: the eager math's
    logits, hiddens and cache."""
    eager = FastLM.from_hf(model, 1, 32)
    comp = FastLM.from_hf(model, 1, 32).use_kernels(kernels)
    comp.float_mask = True  # as prepare_for_cuda_decoding sets it without the Triton kernels
    comp.compile(scope)
    ids = ids_of(1, 14)
    for lm in (eager, comp):
        lm.forward(ids[:, :10], 0, use_compiled=False)
    a, ha = eager(ids[:, 10:], 10, capture=(1, -1))
    b, hb = comp(ids[:, 10:], 10, capture=(1, -1))
    close(a, b, 1e-5)
    for lid in (1, -1):
        close(ha[lid], hb[lid], 1e-5)
    close(eager.cache.k[3][:, :, :14], comp.cache.k[3][:, :, :14], 1e-5)


def _kernel_names():
    names = ["reference"]
    try:
        import triton  # noqa: F401
    except ImportError:
        return names
    if DEVICE.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        names.append("triton")
    return names


@pytest.mark.parametrize("kernels", _kernel_names())
def test_kernel_split_equals_default_math(model, kernels):
    """The forward split around the attention kernels (Gemma's norms, each kind's RoPE and window)
    gives the default per-layer math's logits and hidden states: a prefill past the window, then
    per-row steps on either side of it."""
    outs = {}
    for name in ("torch", kernels):
        lm = FastLM.from_hf(model, max_batch=2, max_len=64).use_kernels(name)
        ids = ids_of(2, 13)
        first = lm.forward(ids, 0, capture=(0, 2, -1))
        second = lm.forward(ids[:, :3], [13, 6], capture=(1, -1))
        outs[name] = (first, second)
    for (la, ha), (lb, hb) in zip(outs["torch"], outs[kernels]):
        close(lb, la, 1e-5)
        assert ha.keys() == hb.keys()
        for lid in ha:
            close(hb[lid], ha[lid], 1e-5)


def test_refuses_what_it_does_not_support():
    for extra, why in ((dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
                       (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
                       (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
                       (dict(hidden_activation="silu"), "hidden_activation 'silu'")):
        model = transformers.Gemma3ForCausalLM(gemma_config(**extra))
        with pytest.raises(UnsupportedModel, match=why):
            FastLM.from_hf(model, 1, 32)
    cfg = gemma_config(rope_parameters={"full_attention": {"rope_type": "dynamic", "factor": 2.0,
                                                           "rope_theta": 1e4},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})
    with pytest.raises(UnsupportedModel, match="RoPE type 'dynamic'"):
        FastLM.from_hf(transformers.Gemma3ForCausalLM(cfg), 1, 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_gpu_graph_replay_with_rollback_across_the_window_edge_equals_eager(kernels):
    """fp32 on a GPU: the compiled engine replayed through CUDA graphs (the engine's CUDA setup
    for kernels "triton") gives the eager engine's logits over decode steps and verify blocks
    that cross a sliding layer's window edge, with a rejection right after a full acceptance."""
    model = build(seed=3).to("cuda")
    ids = ids_of(1, 40, seed=9).to("cuda")
    eager = FastLM.from_hf(model, 1, 64)
    graphed = FastLM.from_hf(model, 1, 64).use_kernels(kernels).compile()
    run = GraphRunner(graphed, kv_block=16)
    for lm in (eager, graphed):
        lm.forward(ids[:, :5], 0, use_compiled=False)
    pos = 5
    # (block length, accepted): accept all, reject right after, partial, across 8, 16, 24, 32
    for t, keep in ((5, 5), (5, 0), (1, 1), (4, 2), (5, 5), (5, 1), (1, 1), (5, 3), (5, 5), (1, 1)):
        block = ids[:, pos:pos + t]
        want, _ = eager(block, pos)
        got, _ = run(block, pos)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        pos += keep
        for lm in (eager, graphed):
            lm.cache.set_lengths(pos)
    assert pos > 3 * WINDOW and run.captures == len(run.graphs)
