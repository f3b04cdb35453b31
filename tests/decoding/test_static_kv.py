"""The opt-in static-cache path of the decoding engine (`Engine(kv="static")`): the fast
target engine (domino_graft/fast) with its static KV cache, in target-alone and chain
decoding. Greedy: token for token the same as target-alone decoding on either cache, with
rejections right after full acceptances (the chi-square test at T > 0 runs on both caches in
test_sampling.py); unsupported targets fall back to the dynamic path and say so.
CPU, eager (the graph runner's CPU path)."""

from __future__ import annotations

import random

import pytest
import torch

from domino_graft.decoding import Engine, Sampling
from domino_graft.graft import build_head
from domino_graft.recipe import load_recipe
from domino_graft.registry import get_family
from domino_graft.target import load_target
from tests.conftest import REPO, randomize_head
from tests.decoding.test_decoding import Oracle  # vocab=...: misses pushed to a wrong token

FAMILIES = ["dflash", "medusa", "pard"]
# DSpark (a DFlash subclass with its Markov chain) and P-EAGLE on one architecture each: the suite's time
GRAFTS = [(f, a) for f in FAMILIES for a in ("llama", "qwen3")] + [("dspark", "qwen3"), ("peagle", "llama")]
PROMPTS = [[3, 4, 5], [7, 11, 2, 9, 13, 17], [5], [20, 30, 40, 50, 60, 70, 80, 2, 3, 4, 5]]


def graft(family: str, arch: str, *, vocab: int | None = None, seed: int = 0, extra: tuple[str, ...] = ()):
    overrides = [f"target.random.architecture={arch}", f"target.random.seed={seed}", *extra]
    if family == "medusa":
        overrides.append("drafter.tree=null")  # chain verification (trees stay on the dynamic path)
    recipe = load_recipe(REPO / "recipes" / f"tiny_{family}.yaml", overrides)
    target = load_target(recipe.target)
    adapter, head_tensors = get_family(family).build(recipe.drafter, target)
    head = build_head(recipe, adapter, head_tensors)
    randomize_head(head, seed + 1, 0.5)  # W2 != 0: the head changes drafts, most of them rejected
    return target, adapter, head


@pytest.fixture(scope="module", params=GRAFTS,
                ids=lambda p: f"{p[0]}-{p[1]}")
def grafted(request):
    family, arch = request.param
    return graft(family, arch)


def test_greedy_static_equals_target_alone_and_dynamic(grafted):
    target, adapter, head = grafted
    assert adapter.topology == "chain"
    static = Engine(target, adapter, head, kv="static")
    dynamic = Engine(target, adapter, head)
    assert static.kv_path == "static" and dynamic.kv_path == "dynamic"
    full_then_reject = 0
    for i, prompt in enumerate(PROMPTS):
        n_new = 24
        ref = static.target_only(prompt, max_new_tokens=n_new)
        assert ref.kv_path == "static"
        dyn_ref = dynamic.target_only(prompt, max_new_tokens=n_new)
        assert dyn_ref.kv_path == "dynamic"
        assert ref.tokens == dyn_ref.tokens, f"prompt {i}: static target-alone != dynamic target-alone"
        # an oracle nudges random slots toward the target's continuation: full acceptances,
        # partial ones and rejections right after them, all rolled back by a length
        reference = list(prompt) + ref.tokens
        for use_head in (True, False):
            for hit in (0.0, 0.8, 1.0):
                v = target.shape.vocab_size
                static.adapter = Oracle(adapter, reference, hit, seed=31 * i + int(hit * 10), vocab=v)
                dynamic.adapter = Oracle(adapter, reference, hit, seed=31 * i + int(hit * 10), vocab=v)
                s = static.speculative(prompt, max_new_tokens=n_new, use_head=use_head)
                d = dynamic.speculative(prompt, max_new_tokens=n_new, use_head=use_head)
                assert s.kv_path == "static" and d.kv_path == "dynamic"
                assert s.tokens == ref.tokens, f"prompt {i} hit {hit}: static speculative != target alone"
                assert d.tokens == ref.tokens, f"prompt {i} hit {hit}: dynamic speculative != target alone"
                assert s.accepted == d.accepted, f"prompt {i} hit {hit}: acceptance differs between caches"
                k = adapter.num_slots
                full_then_reject += sum(a == k and b < k for a, b in zip(s.accepted, s.accepted[1:]))
        static.adapter = dynamic.adapter = adapter
    assert full_then_reject > 0, "no rejection right after a full acceptance was exercised"


def test_features_match_target_capture(grafted):
    """The drafter observes the same features on either path (concatenation order, -1 = post-norm)."""
    from domino_graft.decoding.session import StaticSession

    target, adapter, _ = grafted
    capture = tuple(adapter.capture_layers()) or (0, -1)
    st, why = StaticSession.create(target, 1, 32)
    assert st is not None, why
    ids = torch.tensor([[3, 9, 4, 17, 5, 6, 8]])
    with torch.inference_mode():
        ref_logits, ref_feats = target(ids, capture=capture)
        last, feats, _, _ = st.prefill([ids[0, :4]], capture)
        l2, f2 = st.step(ids[:, 4:], None, capture, [4])
    torch.testing.assert_close(last, ref_logits[:, 3], atol=1e-4, rtol=0)
    torch.testing.assert_close(l2, ref_logits[:, 4:], atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.cat([feats, f2], 1), ref_feats, atol=1e-4, rtol=0)
    for order in (capture, tuple(reversed(capture)) + (-1,)):
        with torch.inference_mode():
            _, f, _, _ = st.prefill([ids[0]], order)
            _, r = target(ids, capture=order)
        torch.testing.assert_close(f, r, atol=1e-4, rtol=0)


def test_sampling_target_alone_static_same_draws_as_dynamic():
    """Same seed, same settings: target-alone sampling draws the same tokens on either cache
    (the logits agree to rounding; at these temperatures no draw sits on a boundary)."""
    target, adapter, head = graft("dflash", "qwen3", seed=2)
    s = Sampling(temperature=1.0, top_k=8, seed=5)
    a = Engine(target, adapter, head, kv="static").target_only([3, 4, 5], max_new_tokens=16, sampling=s)
    b = Engine(target, adapter, head).target_only([3, 4, 5], max_new_tokens=16, sampling=s)
    assert a.kv_path == "static" and b.kv_path == "dynamic"
    assert a.tokens == b.tokens


def test_gemma3_sliding_windows_run_static_and_equal_dynamic():
    target, adapter, head = graft("dflash", "gemma3")
    engine = Engine(target, adapter, head, kv="static")
    assert engine.kv_path == "static"
    prompt = list(range(3, 80))  # longer than the random Gemma-3's window (64): the window edge is crossed
    ref = Engine(target, adapter, head).target_only(prompt, max_new_tokens=20)
    alone = engine.target_only(prompt, max_new_tokens=20)
    spec = engine.speculative(prompt, max_new_tokens=20)
    assert alone.kv_path == spec.kv_path == "static" and ref.kv_path == "dynamic"
    assert alone.tokens == spec.tokens == ref.tokens


def test_unsupported_target_falls_back_to_dynamic():
    target, adapter, head = graft("dflash", "gemma3")
    target.model.config.final_logit_softcapping = 30.0  # the fast engine refuses softcapping
    engine = Engine(target, adapter, head, kv="static")
    assert engine.kv_path == "dynamic" and "softcapping" in (engine.kv_note or "")
    ref = Engine(target, adapter, head).target_only([3, 4, 5], max_new_tokens=10)
    alone = engine.target_only([3, 4, 5], max_new_tokens=10)
    spec = engine.speculative([3, 4, 5], max_new_tokens=10)
    assert alone.kv_path == spec.kv_path == "dynamic"
    assert alone.tokens == spec.tokens == ref.tokens


def test_tree_stays_dynamic():
    recipe = load_recipe(REPO / "recipes" / "tiny_medusa.yaml", ["drafter.tree=[[0],[1],[0,0],[0,1],[0,0,0]]"])
    target = load_target(recipe.target)
    adapter, tensors = get_family("medusa").build(recipe.drafter, target)
    head = build_head(recipe, adapter, tensors)
    assert adapter.topology == "tree"
    engine = Engine(target, adapter, head, kv="static")
    ref = engine.target_only([3, 4, 5], max_new_tokens=12)
    res = engine.speculative([3, 4, 5], max_new_tokens=12)
    assert ref.kv_path == "static" and res.kv_path == "dynamic"
    assert res.tokens == ref.tokens


def test_kv_choice_is_checked():
    target, adapter, head = graft("dflash", "qwen3")
    with pytest.raises(ValueError, match="kv"):
        Engine(target, adapter, head, kv="paged")


def test_longer_decode_grows_the_static_cache():
    target, adapter, head = graft("dflash", "llama", seed=3)
    engine = Engine(target, adapter, head, kv="static")
    prompt = [random.Random(0).randrange(2, 90) for _ in range(250)]
    res = engine.target_only(prompt, max_new_tokens=20)
    assert res.kv_path == "static" and engine._static.lm.max_len >= 271
    ref = Engine(target, adapter, head).target_only(prompt, max_new_tokens=20)
    assert res.tokens == ref.tokens


@pytest.mark.parametrize("kv", ["static", "dynamic"])
def test_bench_records_kv_path(tiny_run, tmp_path, kv, capsys):
    import json

    from tests.decoding.test_decoding import run_command

    out = tmp_path / "bench.json"
    rc = run_command("bench", [str(tiny_run), "--temperature", "0", "--max-new-tokens", "12", "--limit", "2",
                               "--json", str(out), "--kv", kv])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["kv_path"] == rep["base_kv_path"] == rep["target_kv_path"] == kv
    assert rep["kv"]["requested"] == kv and rep["kv"]["target"] == kv
    assert rep["identical_to_target"] is True and rep["base"]["identical_to_target"] is True
    capsys.readouterr()
    assert run_command("generate", [str(tiny_run), "--prompt-ids", "5,6,7", "--max-new-tokens", "6", "--kv", kv]) == 0
    assert f"kv {kv}" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_static_dflash_drafter_blocks_equal_dynamic_adapter(arch):
    """DFlash's static drafter (context in fixed slots, all K+1 verified features written, the
    rejected ones masked by the next anchor) proposes the blocks the dynamic adapter does, whose
    context holds only the accepted tokens; across accept counts 0..K and kv buckets."""
    from domino_graft.fast import KV_BLOCK

    target, adapter, _ = graft("dflash", arch, seed=3)
    k, f = adapter.num_slots, adapter.cfg.hidden_size * len(adapter.cfg.target_layer_ids)
    g = torch.Generator().manual_seed(0)
    n = KV_BLOCK - 9  # the blocks cross into the second attention bucket
    fast = adapter.static_drafter(n + 12 * (k + 1) + 1)
    prompt_feats = torch.randn(1, n, f, generator=g)
    with torch.inference_mode():
        adapter.reset(1)
        adapter.observe(prompt_feats, torch.arange(n))
        fast.prefill(prompt_feats, n)
        pos, rng = n, random.Random(0)
        for step in range(12):
            anchor = torch.tensor([rng.randrange(target.shape.vocab_size)])
            want, got = adapter.propose(anchor, pos), fast.propose(anchor, pos)
            torch.testing.assert_close(got.hidden, want.hidden, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(got.base_logits, want.base_logits, atol=2e-5, rtol=1e-4)
            a = [0, k, 1, k, k - 1, 0][step % 6]  # a full acceptance then a rejection, etc.
            verified = torch.randn(1, k + 1, f, generator=g)
            adapter.observe(verified[:, : a + 1], torch.arange(pos, pos + a + 1))
            fast.observe_block(verified, pos)
            pos += a + 1
    assert pos > KV_BLOCK
