"""Adapter conformance kit: what every drafter family must satisfy to carry a Domino head.

One suite, parametrised over the families and their tiny recipes (recipes/tiny_<family>.yaml).
A new family passes by adding its name to FAMILIES and shipping its tiny recipe; see
docs/adding_a_family.md. Each test states the property it guards:

* a fresh graft (W2 = 0) changes nothing: final logits == base logits, bit for bit;
* the head's teacher-forced block == its incremental steps on the family's real blocks;
* training blocks == decoding blocks at the same anchor (slot/label/GRU-input conventions:
  the off-by-one that collapses τ in other ports);
* greedy decoding replayed from training blocks (domino_graft.replay) accepts exactly what the
  engine accepts, block for block;
* greedy speculative decoding reproduces the target token for token (head on and off);
* speculative sampling keeps the target's distribution with the Domino-corrected q;
* apply -> run dir -> reload, and export -> bundle -> reload, give the same drafts;
* a short training run lowers the loss.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from domino_graft.adapters.base import DraftBlock
from domino_graft.graft import Graft, build_head
from domino_graft.recipe import load_recipe
from domino_graft.registry import get_family
from domino_graft.target import load_target
from tests.conftest import randomize_head

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ["dflash", "medusa", "pard", "dspark", "peagle"]

pytestmark = pytest.mark.parametrize("family", FAMILIES)


def recipe_path(family: str) -> Path:
    return REPO / "recipes" / f"tiny_{family}.yaml"


def graft(family: str, overrides=None, *, head_seed: int | None = None, head_scale: float = 0.5):
    recipe = load_recipe(recipe_path(family), overrides)
    target = load_target(recipe.target)
    adapter, head_tensors = get_family(family).build(recipe.drafter, target)
    head = build_head(recipe, adapter, head_tensors)
    if head_seed is not None:
        randomize_head(head, head_seed, head_scale)  # W2 != 0: the head really changes drafts
    return recipe, target, adapter, head


def context(target, adapter, length: int = 24, batch: int = 2, seed: int = 0):
    """Random token sequences and what the adapter needs of the target over them."""
    ids = torch.randint(2, target.shape.vocab_size - 1, (batch, length), generator=torch.Generator().manual_seed(seed))
    _, feats = target(ids, capture=adapter.capture_layers())
    return ids, feats


def observe(adapter, ids, feats, start: int, end: int):
    adapter.observe(None if feats is None else feats[:, start:end], torch.arange(start, end), ids=ids[:, start:end])


def proposals(adapter, head, block, anchor):
    """Greedy Domino rollout (the engine's reference), the tokens the GRU read."""
    from domino_graft.decoding import rollout

    drafts, _ = rollout(head, block, anchor, adapter.embed)
    return drafts


# ---------------------------------------------------------------------------------- graft
def test_fresh_graft_is_bit_identical_to_the_bare_drafter(family):
    _, target, adapter, head = graft(family)
    assert head.is_identity()
    before = {k: v.clone() for k, v in adapter.state_dict().items()}
    ids, feats = context(target, adapter)
    a = 15
    adapter.reset(2)
    observe(adapter, ids, feats, 0, a)
    block = adapter.propose(ids[:, a], a)
    g = Graft(adapter, head)
    base_drafts = block.base_logits.argmax(-1)
    prev = torch.cat([ids[:, a : a + 1], base_drafts[:, :-1]], dim=1)
    assert torch.equal(g.block_logits(block, prev), block.base_logits)
    assert torch.equal(proposals(adapter, head, block, ids[:, a]), base_drafts)
    restored = g.detach()
    after = restored.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_head_block_matches_incremental_steps_on_real_blocks(family):
    _, target, adapter, head = graft(family, head_seed=1)
    ids, feats = context(target, adapter, seed=1)
    a = 12
    adapter.reset(2)
    observe(adapter, ids, feats, 0, a)
    block = adapter.propose(ids[:, a], a)
    k = adapter.num_slots
    prev = torch.cat([ids[:, a : a + 1], torch.randint(2, 90, (2, k - 1))], dim=1)
    emb = adapter.embed(prev)
    full = head.block(block.hidden, block.base_logits, emb)
    state = head.init_state(2)
    for j in range(k):
        step, state = head.step(state, emb[:, j], block.hidden[:, j], block.base_logits[:, j])
        torch.testing.assert_close(step, full[:, j], rtol=1e-5, atol=1e-5)
    assert not torch.equal(full, block.base_logits)  # the randomised head does correct


def test_training_blocks_match_decoding_blocks(family):
    """Slot j of the block proposed for anchor x_0 = x_a must be the training block at anchor
    a: same hidden H_j, same base logits, label x_{a+j}, GRU input x_{a+j-1}."""
    _, target, adapter, _ = graft(family)
    ids, feats = context(target, adapter, length=30)
    anchors = torch.tensor([[17, 5], [17, 9]])
    tb = adapter.training_blocks(feats, ids, torch.ones_like(ids), anchors)
    k = adapter.num_slots
    assert tb.hidden.shape[:2] == tb.labels.shape and tb.labels.shape[1] >= k
    adapter.reset(2)
    observe(adapter, ids, feats, 0, 9)
    adapter.propose(ids[:, 9], 9)  # an earlier block must leave no trace in the context
    observe(adapter, ids, feats, 9, 17)
    block = adapter.propose(ids[:, 17], 17)
    rows = [0, 2]  # anchor 17 of each sequence
    torch.testing.assert_close(block.hidden, tb.hidden[rows, :k], rtol=1e-5, atol=1e-5)
    slots = torch.arange(k).repeat(2)
    base = adapter.slot_base_logits(tb.hidden[rows, :k].reshape(2 * k, -1), slots).view(2, k, -1)
    torch.testing.assert_close(block.base_logits, base, rtol=1e-5, atol=1e-5)
    assert torch.equal(tb.labels[rows, :k], ids[:, 18 : 18 + k])
    torch.testing.assert_close(tb.prev_emb[rows, :k], adapter.embed(ids[:, 17 : 17 + k]))


# ------------------------------------------------------------------------------- decoding
def test_greedy_speculative_decoding_is_lossless(family):
    from domino_graft.decoding import Engine

    _, target, adapter, head = graft(family, head_seed=2)
    engine = Engine(target, adapter, head)
    for seed in range(2):
        prompt = torch.randint(2, 90, (10,), generator=torch.Generator().manual_seed(seed)).tolist()
        ref = engine.target_only(prompt, max_new_tokens=24)
        for use_head in (True, False):
            out = engine.speculative(prompt, max_new_tokens=24, use_head=use_head)
            assert out.tokens == ref.tokens, (seed, use_head)
            assert out.target_forwards <= ref.target_forwards


# An 11-token vocabulary (the family's placeholder token moved to its last row): random tiny
# drafters then accept drafts, so block boundaries are exercised.
SMALL_VOCAB = {"dflash": ["target.random.vocab_size=11", "drafter.mask_token_id=10"],
               "medusa": ["target.random.vocab_size=11"],
               "pard": ["target.random.vocab_size=11", "drafter.random.vocab_size=11", "drafter.pard_token_id=10"],
               "dspark": ["target.random.vocab_size=11", "drafter.mask_token_id=10"],
               "peagle": ["target.random.vocab_size=11", "drafter.mask_token_id=10", "drafter.draft_vocab_size=10",
                          "drafter.seed=1"]}


def test_replayed_training_blocks_accept_what_decoding_accepts(family):
    from domino_graft.decoding import Engine
    from domino_graft.replay import leading_matches, walk
    from domino_graft.training.data import Example

    _, target, adapter, head = graft(family, SMALL_VOCAB[family] + ["target.random.seed=1"], head_seed=1)
    engine = Engine(target, adapter, head, stop_ids=[])
    prompt = [3, 5, 7, 2, 4]
    ref = engine.target_only(prompt, max_new_tokens=40)
    example = Example(prompt + ref.tokens, [0] * len(prompt) + [1] * len(ref.tokens))
    lead_base, lead_final = leading_matches(target, adapter, head, example, max_anchors=len(ref.tokens))
    for use_head, lead in ((True, lead_final), (False, lead_base)):
        out = engine.speculative(prompt, max_new_tokens=40, use_head=use_head)
        assert sum(out.accepted) > 0, "the case must accept drafts to test anything"
        # the last block is cut by max_new_tokens in decoding, by the response's end in the replay
        assert walk(lead)[: len(out.accepted) - 1] == out.accepted[:-1], use_head


def test_speculative_sampling_keeps_the_target_distribution(family):
    """N independent speculative steps from one context, batched (the decoding suite's
    design, tests/decoding/test_sampling.py, on each family's real hidden states, embeddings and
    rollout): the joint law of the first two emitted tokens must be p(y1)·p(y2 | y1), with
    slots 1 and 2 Domino-corrected (pure_prefix_len 0). y2 comes from the same step when
    d_1 was accepted, else from the exact target distribution (standing in for the next
    step). The control passes the *uncorrected* q to the verifier: the same chi-square
    test must reject it, or the test could not see a wrong q at all.

    Random tiny models have near-flat logits that rarely agree, so slots 1-2 of the block get
    the target's own logits as base (slot 2: after the target's argmax v) and W2 is scaled
    so that the correction moves them about as much as they spread."""
    from domino_graft.decoding import rollout, sample, verify_sampling, warp
    from tests.decoding.test_sampling import ALPHA, chi_square_pvalue

    _, target, adapter, head = graft(family, ["head.pure_prefix_len=0"], head_seed=3, head_scale=1.0)
    ids, feats = context(target, adapter, length=12, batch=1, seed=3)
    a, n, k, vocab = 11, 6000, adapter.num_slots, target.shape.vocab_size
    warp_ = dict(temperature=0.05, top_k=4)
    with torch.inference_mode():
        adapter.reset(1)
        observe(adapter, ids, feats, 0, a)
        block = adapter.propose(ids[:, a], a)
        # exact: every continuation (x_0, y1) of the context in one forward
        every = torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)
        logits, _ = target(every)
        p1, p2 = warp(logits[0, a], **warp_), warp(logits[:, a + 1], **warp_)  # [V], [V, V]
        joint = p1[:, None] * p2
        v = logits[0, a].argmax()
        base = block.base_logits.clone()
        base[0, 0], base[0, 1] = logits[0, a], logits[v, a + 1]
        prev = torch.cat([ids[:, a : a + 1], v.view(1, 1), ids[:, : k - 2]], dim=1)
        delta = head.block(block.hidden, base, adapter.embed(prev)) - base
        head.embed_proj[2].weight.mul_(0.5 * logits[0, a].std() / delta[0, :2].std())

        many = DraftBlock(block.hidden.expand(n, -1, -1), base.expand(n, -1, -1))
        anchor = ids[:, a].expand(n)
        drafts, q = rollout(head, many, anchor, adapter.embed, generator=torch.Generator().manual_seed(0), **warp_)
        out, _ = target(torch.cat([ids[:, :a].expand(n, -1), anchor[:, None], drafts], dim=1))
        p = warp(out[:, a:], **warp_)  # [N, K+1, V]: after x_0, d_1, .., d_K
        q_base = warp(many.base_logits, **warp_)
        results = {}
        for name, q_given in (("right", q), ("wrong", q_base)):
            g = torch.Generator().manual_seed(100)
            n_acc, nxt = verify_sampling(p, q_given, drafts, g)
            y1 = torch.where(n_acc >= 1, drafts[:, 0], nxt)
            y2 = torch.where(n_acc >= 2, drafts[:, 1], torch.where(n_acc == 1, nxt, sample(p2[y1], g)))
            results[name] = chi_square_pvalue(torch.bincount(y1 * vocab + y2, minlength=vocab * vocab), joint)
            if name == "right":
                assert (n_acc >= 1).float().mean() > 0.2, "too few accepted drafts for the test to mean anything"
    print(family, results)
    assert results["right"][1] > ALPHA, f"speculative sampling deviates from the target: {results}"
    assert results["wrong"][1] < ALPHA, f"the test cannot tell a wrong q from the right one: {results}"


# ---------------------------------------------------------------------------- persistence
def _drafts_of(target, adapter, head, seed=4):
    ids, feats = context(target, adapter, seed=seed)
    out = []
    for a in (9, 17):
        adapter.reset(2)
        observe(adapter, ids, feats, 0, a)
        block = adapter.propose(ids[:, a], a)
        out.append((block, proposals(adapter, head, block, ids[:, a])))
    return out


def test_run_dir_round_trip(family, tmp_path):
    from domino_graft.apply import apply_recipe
    from domino_graft.loading import load_run

    out = tmp_path / "run"
    apply_recipe(str(recipe_path(family)), str(out), echo=lambda *_: None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["drafter"]["family"] == family
    run = load_run(out)
    _, target, adapter, head = graft(family)
    for (b1, d1), (b2, d2) in zip(_drafts_of(target, adapter, head), _drafts_of(run.target, run.adapter, run.head)):
        assert torch.equal(b1.base_logits, b2.base_logits) and torch.equal(d1, d2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """family -> (run dir, metrics) after a short training run (shared by the last two tests)."""
    cache = {}

    def get(family):
        if family not in cache:
            from domino_graft.apply import apply_recipe
            from domino_graft.training.loop import train

            out = tmp_path_factory.mktemp(f"trained-{family}") / "run"
            apply_recipe(str(recipe_path(family)), str(out), echo=lambda *_: None)
            train(str(out), ["train.lr=1e-2"], max_steps=16, echo=lambda *_: None, progress=False)
            metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            cache[family] = (out, metrics)
        return cache[family]

    return get


@pytest.mark.skipif(importlib.util.find_spec("domino_graft.training") is None, reason="no training package")
def test_short_training_lowers_the_loss(family, trained):
    out, metrics = trained(family)
    assert len(metrics) == 16
    first = sum(m["loss"] for m in metrics[:3]) / 3
    last = sum(m["loss"] for m in metrics[-3:]) / 3
    assert last < first - 0.1, (first, last)
    from domino_graft.loading import load_run

    run = load_run(out)  # the trained weights reload strictly, and the head is no longer identity
    assert not run.head.is_identity()


@pytest.mark.skipif(importlib.util.find_spec("domino_graft.export") is None, reason="no export module")
def test_export_import_round_trip(family, trained, tmp_path):
    from domino_graft.export.run import export_run
    from domino_graft.loading import load_run, load_run_or_bundle

    out, _ = trained(family)
    bundle = export_run(str(out), str(tmp_path / "bundle"), dtype="fp32", device="cpu", echo=lambda *_: None)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["kind"] == "domino-graft bundle" and manifest["drafter"]["family"] == family
    run = load_run(out)
    loaded = load_run_or_bundle(str(bundle))
    for (b1, d1), (b2, d2) in zip(_drafts_of(run.target, run.adapter, run.head),
                                  _drafts_of(loaded.target, loaded.adapter, loaded.head)):
        torch.testing.assert_close(b1.base_logits, b2.base_logits, rtol=0, atol=0)
        assert torch.equal(d1, d2)
