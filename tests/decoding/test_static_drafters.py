"""Static (graphed) drafters of Medusa and PARD (adapters/{medusa,pard}/fast.py), beside DFlash's
(test_static_kv.py). CPU, fp32, eager (CapturedCall's CPU path).

- blocks: the static drafter, fed all K+1 verified features/ids of every block and the position,
  proposes the blocks the dynamic adapter does when fed only the accepted ones, over ragged
  accepts (0..K, a rejection right after a full acceptance);
- decoding: ``Engine(kv="static")`` greedy equals target-alone, with the static drafter path
  asserted taken (its proposal counter moves);
- GPU (opt-in): graph replay equals eager over ~20 blocks.
"""

from __future__ import annotations

import random

import pytest
import torch

from domino_graft.decoding import Engine
from tests.decoding.test_decoding import Oracle
from tests.decoding.test_static_kv import graft

ACCEPTS = [0, "k", 1, "k", "k-1", 0, "k", "k", 2, 0]  # full acceptances, then rejections right after


def accepts(k: int, n: int) -> list[int]:
    vals = [k if a == "k" else k - 1 if a == "k-1" else min(int(a), k) for a in ACCEPTS]
    return [vals[i % len(vals)] for i in range(n)]


def _close(got, want):
    torch.testing.assert_close(got.hidden, want.hidden, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got.base_logits, want.base_logits, atol=2e-5, rtol=1e-4)


def feed_blocks(family: str, arch: str, steps: int = 14, extra: tuple[str, ...] = ()):
    """Dynamic adapter vs static drafter over `steps` ragged blocks: (target, adapter, fast)."""
    target, adapter, _ = graft(family, arch, seed=3, extra=extra)
    k, v = adapter.num_slots, target.shape.vocab_size
    g = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    n = 11
    fast = adapter.static_drafter(n + steps * (k + 1) + 1)
    assert fast is not None
    h = target.shape.hidden_size
    with torch.inference_mode():
        prompt_ids = torch.randint(2, v - 1, (1, n), generator=g)
        prompt_feats = torch.randn(1, n, h, generator=g)
        feats_of = (lambda x: None) if family == "pard" else (lambda x: x)
        adapter.reset(1)
        adapter.observe(feats_of(prompt_feats), torch.arange(n), ids=prompt_ids)
        fast.prefill(feats_of(prompt_feats), n, ids=prompt_ids) if family == "pard" else fast.prefill(prompt_feats, n)
        pos = n
        for a in accepts(k, steps):
            anchor = torch.tensor([rng.randrange(2, v - 1)])
            want, got = adapter.propose(anchor, pos), fast.propose(anchor, pos)
            _close(got, want)
            ids = torch.cat([anchor, torch.randint(2, v - 1, (k,), generator=g)])[None]
            verified = torch.randn(1, k + 1, h, generator=g)
            adapter.observe(feats_of(verified[:, : a + 1]), torch.arange(pos, pos + a + 1), ids=ids[:, : a + 1])
            fast.observe_block(feats_of(verified), pos, ids=ids)
            pos += a + 1
    return target, adapter, fast


@pytest.mark.parametrize("family", ["medusa", "pard"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_static_blocks_equal_dynamic_adapter(family, arch):
    _, _, fast = feed_blocks(family, arch)
    assert fast.proposals == 14


def test_static_pard_blocks_qwen3_drafter_smaller_vocabulary():
    """q/k norms in the drafter, and a drafter vocabulary short of the target's (ids it lacks read
    as the pard token; its logits padded onto the target's rows)."""
    _, adapter, fast = feed_blocks("pard", "llama", extra=("drafter.random.architecture=qwen3",
                                                          "drafter.random.vocab_size=90",
                                                          "drafter.pard_token_id=89"))
    assert adapter.drafter_vocab_size == 90 and fast.lm.cfg.model_type == "qwen3"


def test_medusa_static_propose_checks_the_anchor():
    target, adapter, _ = graft("medusa", "qwen3")
    fast = adapter.static_drafter(64)
    k, h = adapter.num_slots, target.shape.hidden_size
    with torch.inference_mode():
        fast.prefill(torch.randn(1, 5, h), 5)
        with pytest.raises(RuntimeError, match="hidden state at 5"):
            fast.propose(torch.tensor([3]), 6)
        fast.propose(torch.tensor([3]), 5)
        fast.observe_block(torch.randn(1, k + 1, h), 5)
        with pytest.raises(RuntimeError, match="cover 5"):
            fast.propose(torch.tensor([3]), 5 + k + 2)  # past the verified block


def test_medusa_tree_has_no_static_drafter():
    from domino_graft.recipe import load_recipe
    from domino_graft.registry import get_family
    from domino_graft.target import load_target
    from tests.conftest import REPO

    recipe = load_recipe(REPO / "recipes" / "tiny_medusa.yaml", ["drafter.tree=[[0],[1],[0,0]]"])
    adapter, _ = get_family("medusa").build(recipe.drafter, load_target(recipe.target))
    assert adapter.static_drafter(64) is None


def test_pard_static_drafter_is_kept_and_rebuilt_when_the_weights_change():
    _, adapter, _ = graft("pard", "qwen3")
    first = adapter.static_drafter(40)
    assert adapter.static_drafter(100) is first  # both fit its 256 slots: kept, graphs and all
    with torch.no_grad():
        next(adapter.model.parameters()).add_(0.01)  # a training step: the fused copy is stale
    second = adapter.static_drafter(40)
    assert second is not first and adapter.static_drafter(40) is second
    w = next(adapter.model.parameters())
    assert w.data_ptr() not in {t.data_ptr() for layer in second.lm.layers for t in layer if t is not None}


def test_pard_drafter_outside_the_fast_engine_proposes_eagerly():
    target, adapter, head = graft("pard", "qwen3", extra=("drafter.random.architecture=gemma3",))
    assert adapter.static_drafter(64) is None and adapter.static_drafter(64) is None  # asked once, remembered
    engine = Engine(target, adapter, head, kv="static")
    ref = engine.target_only([3, 4, 5], max_new_tokens=12)
    res = engine.speculative([3, 4, 5], max_new_tokens=12)
    assert ref.kv_path == res.kv_path == "static" and res.tokens == ref.tokens


def test_static_drafter_protocol_checks_positions():
    target, adapter, _ = graft("pard", "qwen3")
    fast = adapter.static_drafter(64)
    k = adapter.num_slots
    with torch.inference_mode():
        fast.prefill(None, 4, ids=torch.tensor([[3, 4, 5, 6]]))
        with pytest.raises(RuntimeError, match="0..3"):
            fast.propose(torch.tensor([7]), 5)
        fast.propose(torch.tensor([7]), 4)
        with pytest.raises(ValueError, match="ids are required"):
            fast.observe_block(None, 4)
        fast.observe_block(None, 4, ids=torch.tensor([[7] + [8] * k]))
        with pytest.raises(RuntimeError, match="covers 4"):
            fast.propose(torch.tensor([7]), 4 + k + 2)


PROMPTS = [[3, 4, 5], [7, 11, 2, 9, 13, 17], [5]]


@pytest.mark.parametrize("family", ["medusa", "pard"])
def test_static_engine_greedy_equals_target_alone(family):
    target, adapter, head = graft(family, "qwen3", seed=1)
    engine = Engine(target, adapter, head, kv="static")
    fast = adapter.static_drafter(64)
    before, full_then_reject, v, k = fast.proposals, 0, target.shape.vocab_size, adapter.num_slots
    for i, prompt in enumerate(PROMPTS):
        ref = engine.target_only(prompt, max_new_tokens=24)
        assert ref.kv_path == "static"
        for hit in (0.0, 0.8, 1.0):
            engine.adapter = Oracle(adapter, list(prompt) + ref.tokens, hit, seed=7 * i + int(10 * hit), vocab=v)
            res = engine.speculative(prompt, max_new_tokens=24)
            assert res.kv_path == "static"
            assert res.tokens == ref.tokens, f"prompt {i} hit {hit}: static {family} speculative != target alone"
            full_then_reject += sum(a == k and b < k for a, b in zip(res.accepted, res.accepted[1:]))
        engine.adapter = adapter
    assert adapter.static_drafter(64) is fast and fast.proposals > before  # the static path was taken
    assert full_then_reject > 0


# ------------------------------------------------------------------------------ GPU (opt-in)
def _graph_vs_eager(family: str, make_eager, dev: str = "cuda"):
    target, adapter, _ = graft(family, "qwen3", seed=3)
    target.model.to(dev)
    adapter.to(dev)
    k, v, h = adapter.num_slots, target.shape.vocab_size, target.shape.hidden_size
    g = torch.Generator(device=dev).manual_seed(0)
    with torch.inference_mode():
        graphed = adapter.static_drafter(512)
        eager = make_eager(adapter, graphed.max_len)
        eager.use_graphs = False
        n = 40
        ids = torch.randint(2, v - 1, (1, n), device=dev, generator=g)
        feats = torch.randn(1, n, h, device=dev, generator=g)
        for d in (graphed, eager):
            d.prefill(feats, n, ids=ids) if family == "pard" else d.prefill(feats, n)
        pos = n
        for a in accepts(k, 20):
            anchor = torch.randint(2, v - 1, (1,), device=dev, generator=g)
            got = graphed.propose(anchor, pos)
            got = type(got)(got.hidden.clone(), got.base_logits.clone())
            _close(got, eager.propose(anchor, pos))
            blk = torch.cat([anchor, torch.randint(2, v - 1, (k,), device=dev, generator=g)])[None]
            verified = torch.randn(1, k + 1, h, device=dev, generator=g)
            for d in (graphed, eager):
                d.observe_block(verified, pos, ids=blk) if family == "pard" else d.observe_block(verified, pos)
            pos += a + 1
    assert graphed._calls and all(c.graph is not None or dev == "cpu" for c in graphed._calls.values())


@pytest.mark.gpu
def test_static_medusa_graph_equals_eager_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from domino_graft.adapters.medusa.fast import StaticMedusaDrafter

    _graph_vs_eager("medusa", StaticMedusaDrafter)


@pytest.mark.gpu
def test_static_pard_graph_equals_eager_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from domino_graft.adapters.pard.fast import StaticPardDrafter

    _graph_vs_eager("pard", StaticPardDrafter)
