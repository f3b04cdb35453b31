"""DSpark family (adapters/dspark/, docs/dspark.md): the speculators 0.9.0 layout, DSpark's own
sequential Markov drafting, and both graft modes. The conformance kit (test_conformance.py) runs
recipes/tiny_dspark.yaml (on_top, vanilla); this file covers the other modes and head types."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from domino_graft.graft import build_head
from domino_graft.recipe import load_recipe
from domino_graft.registry import get_family
from domino_graft.target import load_target
from tests.conftest import randomize_head

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "tiny_dspark.yaml"
MODES = [  # (graft, markov_head_type, sample_from_anchor)
    ("on_top", "vanilla", True), ("on_top", "gated", True), ("on_top", "rnn", True), ("on_top", "vanilla", False),
    ("in_place", "vanilla", True), ("in_place", "rnn", True),
]


def build(overrides=(), *, markov_scale: float = 0.0, head_seed=None):
    recipe = load_recipe(RECIPE, list(overrides))
    target = load_target(recipe.target)
    adapter, found = get_family("dspark").build(recipe.drafter, target)
    if markov_scale and adapter.markov_head is not None:  # make the Markov bias move drafts
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in adapter.markov_head.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * markov_scale)
    head = build_head(recipe, adapter, found)
    if head_seed is not None:
        randomize_head(head, head_seed)
    return recipe, target, adapter, head


def mode_overrides(graft, htype, sfa):
    return [f"drafter.graft={graft}", f"drafter.markov_head_type={htype}", f"drafter.sample_from_anchor={str(sfa).lower()}"]


def context(target, adapter, length=30, batch=2, seed=0):
    ids = torch.randint(2, target.shape.vocab_size - 1, (batch, length), generator=torch.Generator().manual_seed(seed))
    _, feats = target(ids, capture=adapter.capture_layers())
    return ids, feats


def speculators_block_bias(mh, prev, hidden):
    """speculators 0.9.0 MarkovHead.block_bias (models/dspark/model_definitions.py), transcribed."""
    e = mh.markov_w1(prev)
    if mh.head_type == "vanilla":
        return mh.markov_w2(e)
    if mh.head_type == "gated":
        return mh.markov_w2(torch.sigmoid(mh.gate_proj(torch.cat([hidden, e], dim=-1))) * e)
    state, outs = e.new_zeros(e.shape[0], mh.rank), []
    for k in range(e.shape[1]):
        gate_raw, cand_raw, out_raw = mh.joint_proj(torch.cat([state, e[:, k], hidden[:, k]], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate_raw)
        state = gate * state + (1.0 - gate) * torch.tanh(cand_raw)
        outs.append(mh.markov_w2(torch.tanh(out_raw)))
    return torch.stack(outs, dim=1)


@pytest.mark.parametrize("htype", ["vanilla", "gated", "rnn"])
def test_markov_features_match_speculators_block_bias(htype):
    _, _, adapter, _ = build([f"drafter.markov_head_type={htype}"], markov_scale=0.3)
    mh = adapter.markov_head
    prev, hidden = torch.randint(0, 97, (3, 8)), torch.randn(3, 8, 32)
    torch.testing.assert_close(mh.markov_w2(mh.features(prev, hidden)), speculators_block_bias(mh, prev, hidden))


def test_native_layout_names_and_layer_ids():
    from domino_graft.adapters.dspark.model import from_native

    _, _, adapter, _ = build(["drafter.markov_head_type=gated"])
    cfg = adapter.native_config()
    assert cfg["speculators_model_type"] == "dspark" and cfg["architectures"] == ["DSparkSpeculator"]
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3]  # the recipe's 0-based outputs [0, 2], + 1
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 8  # sample_from_anchor: K = B
    names = set(adapter.backbone_state_dict())
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "markov_head.gate_proj.weight",
            "markov_head.gate_proj.bias", "confidence_head.proj.weight", "confidence_head.proj.bias",
            "fc.weight", "hidden_norm.weight", "norm.weight"} <= names
    assert adapter.backbone_state_dict()["confidence_head.proj.weight"].shape == (1, 32 + 8)
    back, mcfg = from_native(json.loads(json.dumps(cfg)), "x")
    assert back.target_layer_ids == [0, 2] and back.block_size == 8 and back.mask_token_id == 96
    assert (mcfg.markov_rank, mcfg.markov_head_type, mcfg.sample_from_anchor) == (8, "gated", True)


def test_imports_a_speculators_checkpoint(tmp_path):
    """A folder as speculators saves it: diff-style transformer_layer_config, a `model.` prefix-free
    state dict, plus verifier-owned tensors a self-contained checkpoint may hold (ignored)."""
    from domino_graft.artifacts.tensors import save_tensors

    _, target, src, _ = build(markov_scale=0.2)
    folder = tmp_path / "dspark"
    folder.mkdir()
    cfg = src.native_config()
    cfg["transformer_layer_config"] = {k: v for k, v in cfg["transformer_layer_config"].items()
                                       if k not in ("attention_dropout", "hidden_act", "rope_parameters")}
    (folder / "config.json").write_text(json.dumps(cfg))
    state = dict(src.backbone_state_dict())
    state["embed_tokens.weight"] = target.embed(torch.arange(97)).detach()
    save_tensors(folder / "model.safetensors", {k: v.contiguous() for k, v in state.items()}, {"format": "pt"})
    _, _, imported, _ = build([f"drafter.path={folder}"])
    ids, feats = context(target, src)
    for a in (src, imported):
        a.reset(2)
        a.observe(feats[:, :17], torch.arange(17))
    b1, b2 = src.propose(ids[:, 17], 17), imported.propose(ids[:, 17], 17)
    assert torch.equal(b1.base_logits, b2.base_logits)
    with pytest.raises(ValueError, match="block_size: 4 conflicts with the checkpoint's 8"):
        build([f"drafter.path={folder}", "drafter.block_size=4"])
    cfg["draft_vocab_size"] = 32
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="reduced draft vocabulary"):
        build([f"drafter.path={folder}"])


def test_base_drafts_are_dspark_sequential_greedy_drafts():
    """The base drafter is DSpark's own: d_j = argmax(lm_head(H_j) + markov_w2(m(d_{j-1}))), d_0 = x_0."""
    from domino_graft.decoding import rollout

    _, target, adapter, head = build(markov_scale=0.5)
    ids, feats = context(target, adapter)
    adapter.reset(2)
    adapter.observe(feats[:, :17], torch.arange(17))
    block = adapter.propose(ids[:, 17], 17)
    drafts, _ = rollout(head, block, ids[:, 17], adapter.embed, use_head=False)
    h = block.hidden[..., :32]
    prev = torch.cat([ids[:, 17:18], drafts[:, :-1]], dim=1)
    ref = target.lm_head(h) + speculators_block_bias(adapter.markov_head, prev, h)
    torch.testing.assert_close(block.base_logits, ref)
    assert torch.equal(drafts, ref.argmax(-1))
    assert not torch.equal(drafts, target.lm_head(h).argmax(-1)), "the Markov bias must change drafts here"


@pytest.mark.parametrize("graft,htype,sfa", MODES)
def test_training_blocks_match_decoding_blocks(graft, htype, sfa):
    _, target, adapter, _ = build(mode_overrides(graft, htype, sfa), markov_scale=0.3)
    k = adapter.num_slots
    assert k == (8 if sfa else 7)
    assert adapter.hidden_dim == (40 if graft == "on_top" else 32)
    ids, feats = context(target, adapter)
    tb = adapter.training_blocks(feats, ids, torch.ones_like(ids), torch.tensor([[17, 5], [17, 9]]))
    adapter.reset(2)
    adapter.observe(feats[:, :17], torch.arange(17))
    block = adapter.propose(ids[:, 17], 17)
    rows = [0, 2]
    torch.testing.assert_close(block.hidden, tb.hidden[rows, :k], rtol=1e-5, atol=1e-5)
    base = adapter.slot_base_logits(tb.hidden[rows, :k].reshape(2 * k, -1), torch.arange(k).repeat(2)).view(2, k, -1)
    torch.testing.assert_close(block.base_logits, base, rtol=1e-5, atol=1e-5)
    assert torch.equal(tb.labels[rows, :k], ids[:, 18 : 18 + k])
    if graft == "in_place":  # the Markov head is not used: plain DFlash logits
        torch.testing.assert_close(block.base_logits, target.lm_head(block.hidden))


@pytest.mark.parametrize("graft,htype,sfa", MODES)
def test_greedy_decoding_is_lossless(graft, htype, sfa):
    from domino_graft.decoding import Engine

    _, target, adapter, head = build(mode_overrides(graft, htype, sfa) + ["target.random.vocab_size=11",
                                                                          "drafter.mask_token_id=10"],
                                     markov_scale=0.3, head_seed=2)
    engine = Engine(target, adapter, head, stop_ids=[])
    prompt = [3, 5, 7, 2, 4]
    ref = engine.target_only(prompt, max_new_tokens=30)
    for use_head in (True, False):
        out = engine.speculative(prompt, max_new_tokens=30, use_head=use_head)
        assert out.tokens == ref.tokens, use_head


def test_in_place_keeps_the_markov_tensors():
    _, _, adapter, _ = build(["drafter.graft=in_place"])
    assert adapter.hidden_dim == 32 and not adapter.uses_markov
    assert "markov_head.markov_w2.weight" in adapter.backbone_state_dict()


def test_batched_greedy_decoding_is_lossless():
    from domino_graft.decoding import Engine

    _, target, adapter, head = build(["target.random.vocab_size=11", "drafter.mask_token_id=10"],
                                     markov_scale=0.3, head_seed=2)
    engine = Engine(target, adapter, head, stop_ids=[])
    prompts = [[3, 5, 7, 2, 4], [6, 2], [9, 8, 7, 1, 3, 5, 2]]
    refs = [engine.target_only(p, max_new_tokens=20).tokens for p in prompts]
    for use_head in (True, False):
        outs = engine.speculative_batch(prompts, max_new_tokens=20, use_head=use_head)
        assert [o.tokens for o in outs] == refs, use_head


@pytest.mark.parametrize("graft", ["in_place", "on_top"])
def test_export_round_trip_keeps_the_dspark_layout(graft, tmp_path):
    from domino_graft.apply import apply_recipe
    from domino_graft.export.run import export_run
    from domino_graft.loading import load_run, load_run_or_bundle

    out = tmp_path / "run"
    apply_recipe(str(RECIPE), str(out), overrides=[f"drafter.graft={graft}"], echo=lambda *_: None)
    bundle = export_run(str(out), str(tmp_path / "bundle"), dtype="fp32", device="cpu", echo=lambda *_: None)
    cfg = json.loads((bundle / "drafter" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark" and (bundle / "head.safetensors").is_file()
    run, loaded = load_run(out), load_run_or_bundle(str(bundle))
    assert loaded.adapter.graft == graft
    ids, feats = context(run.target, run.adapter)
    blocks = []
    for a in (run.adapter, loaded.adapter):
        a.reset(2)
        a.observe(feats[:, :17], torch.arange(17))
        blocks.append(a.propose(ids[:, 17], 17))
    assert torch.equal(blocks[0].base_logits, blocks[1].base_logits)
