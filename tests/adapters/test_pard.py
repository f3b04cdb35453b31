"""PARD adapter: drafting input, own embeddings, verified-only KV cache, sources, strict loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from domino_graft.adapters.pard import adapter as pard
from domino_graft.artifacts.files import CheckpointError
from domino_graft.artifacts.tensors import save_tensors
from domino_graft.graft import build_head
from domino_graft.recipe import RecipeError, load_recipe, parse_recipe
from domino_graft.target import load_target

REPO = Path(__file__).resolve().parents[2]
TINY_TARGET = {"random": {"architecture": "qwen3", "vocab_size": 97, "hidden_size": 32, "num_layers": 4,
                          "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 64}}


def _tiny(overrides=None):
    recipe = load_recipe(REPO / "recipes" / "tiny_pard.yaml", overrides)
    target = load_target(recipe.target)
    adapter, head_tensors = pard.build(recipe.drafter, target)
    return recipe, target, adapter, build_head(recipe, adapter, head_tensors)


def _full_forward_hidden(adapter, ids):
    """The drafter's last hidden states over `ids`, no cache: the reference for propose()."""
    return adapter.model.model(input_ids=ids).last_hidden_state


def test_propose_is_context_plus_anchor_plus_pard_tokens_and_the_cache_keeps_only_context():
    _, _, adapter, _ = _tiny()
    k = adapter.num_slots
    ids = torch.randint(2, 90, (2, 30), generator=torch.Generator().manual_seed(0))
    adapter.reset(2)
    for start, a in ((0, 9), (9, 14), (14, 22)):  # three rounds: observe verified tokens, propose
        adapter.observe(None, torch.arange(start, a), ids=ids[:, start:a])
        block = adapter.propose(ids[:, a], a)
        assert adapter.context_length() == a  # the block's k positions were cropped away
        inp = torch.cat([ids[:, : a + 1], torch.full((2, k - 1), adapter.pard_token_id)], dim=1)
        ref = _full_forward_hidden(adapter, inp)[:, -k:]
        torch.testing.assert_close(block.hidden, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(block.base_logits, adapter.model.lm_head(ref), rtol=1e-5, atol=1e-5)


def test_gru_reads_the_drafters_own_embeddings():
    _, target, adapter, head = _tiny()
    assert adapter.emb_dim == adapter.hidden_dim == 24 != target.shape.hidden_size
    assert head.spec.emb_dim == 24 and head.prefix_gru.weight_ih_l0.shape[1] == 24
    ids = torch.tensor([[3, 5, 7]])
    assert torch.equal(adapter.embed(ids), adapter.model.get_input_embeddings()(ids))


def test_observe_without_ids_is_refused_with_the_reason():
    _, _, adapter, _ = _tiny()
    adapter.reset(1)
    with pytest.raises(ValueError, match="token ids are required.*observe\\(features, positions, ids=...\\)"):
        adapter.observe(None, torch.arange(3))
    adapter.observe(None, torch.arange(3), ids=torch.tensor([[4, 5, 6]]))
    with pytest.raises(RuntimeError, match="has seen positions 0..2"):
        adapter.propose(torch.tensor([7]), 5)


def test_copy_of_the_whole_target_drafts_slot_one_exactly_like_the_target():
    """Warm start = the target's first layers; with all of them, slot 1 is the target's next token."""
    recipe = parse_recipe({"target": TINY_TARGET, "drafter": {"family": "pard", "num_layers": 4, "num_slots": 3}})
    target = load_target(recipe.target)
    adapter, _ = pard.build(recipe.drafter, target)
    ids = torch.randint(2, 90, (1, 12), generator=torch.Generator().manual_seed(1))
    logits, _ = target(ids)
    adapter.reset(1)
    adapter.observe(None, torch.arange(11), ids=ids[:, :11])
    block = adapter.propose(ids[:, 11], 11)
    torch.testing.assert_close(block.base_logits[:, 0], logits[:, 11], rtol=1e-5, atol=1e-5)
    assert adapter.pard_token_id == 96  # default: the last vocabulary row

    cut = parse_recipe({"target": TINY_TARGET, "drafter": {"family": "pard", "num_layers": 2}})
    small, _ = pard.build(cut.drafter, target)
    assert small.model.config.num_hidden_layers == 2
    theirs = target.model.state_dict()
    for k, v in small.backbone_state_dict().items():
        assert torch.equal(v, theirs[k]), k


def _hf_folder(tmp_path, adapter, **cfg_update):
    folder = tmp_path / "pard"
    folder.mkdir(exist_ok=True)
    cfg = adapter.native_config()
    cfg.update(cfg_update)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_tensors(folder / "model.safetensors", adapter.backbone_state_dict())
    return folder


def test_hf_pard_checkpoint_loads_strictly(tmp_path):
    _, target, adapter, _ = _tiny()
    folder = _hf_folder(tmp_path, adapter, pard_token=90)
    d = parse_recipe({"target": TINY_TARGET, "drafter": {"family": "pard", "path": str(folder), "num_slots": 5}}).drafter
    loaded, head_tensors = pard.build(d, target)
    assert head_tensors == {} and loaded.pard_token_id == 90
    for k, v in adapter.backbone_state_dict().items():
        assert torch.equal(loaded.backbone_state_dict()[k], v), k
    # the folder is a plain HF causal LM (what vLLM and the PARD repo load)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder))
    assert hf.config.pard_token == 90

    # k travels with the drafter (pard_num_slots): a bundle's drafter/ folder rebuilds the same block
    bare = parse_recipe({"target": TINY_TARGET, "drafter": {"family": "pard", "path": str(folder)}}).drafter
    assert pard.build(bare, target)[0].num_slots == 5
    three = parse_recipe({"target": TINY_TARGET, "drafter": {"family": "pard", "path": str(folder), "num_slots": 3}})
    with pytest.raises(ValueError, match="drafter.num_slots: 3 conflicts with the checkpoint's pard_num_slots 5"):
        pard.build(three.drafter, target)

    conflict = d.model_copy(update={"pard_token_id": 12})
    with pytest.raises(ValueError, match="drafter.pard_token_id: 12 conflicts with the checkpoint's pard_token 90"):
        pard.build(conflict, target)

    state = adapter.backbone_state_dict()
    del state["model.layers.0.mlp.up_proj.weight"]
    save_tensors(folder / "model.safetensors", state)
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.0\.mlp\.up_proj\.weight'"):
        pard.build(d, target)


@pytest.mark.parametrize("drafter_vocab", [128, 90])
def test_a_differently_padded_drafter_vocabulary_maps_onto_the_targets(drafter_vocab):
    """PARD-Qwen2.5-0.5B pads to 151936 rows, Qwen2.5-7B to 152064: logits live in the target's
    rows (extra drafter rows dropped, missing ones never proposed), and decoding stays exact."""
    from domino_graft.decoding import Engine

    recipe = parse_recipe({"target": TINY_TARGET, "drafter": {"family": "pard", "num_slots": 3, "random": {
        "vocab_size": drafter_vocab, "hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
        "head_dim": 8, "intermediate_size": 32}}})
    target = load_target(recipe.target)
    adapter, _ = pard.build(recipe.drafter, target)
    assert adapter.vocab_size == 97 and adapter.drafter_vocab_size == drafter_vocab
    assert adapter.pard_token_id == drafter_vocab - 1
    adapter.reset(1)
    adapter.observe(None, torch.arange(4), ids=torch.tensor([[5, 6, 7, 8]]))
    block = adapter.propose(torch.tensor([9]), 4)
    raw = adapter.model.lm_head(block.hidden)
    assert block.base_logits.shape[-1] == 97
    shared = min(drafter_vocab, 97)
    assert torch.equal(block.base_logits[..., :shared], raw[..., :shared])
    if drafter_vocab < 97:
        assert (block.base_logits[..., drafter_vocab:] == torch.finfo(raw.dtype).min).all()
    if drafter_vocab < 97:  # target ids the drafter lacks read as its pard token, not an index error
        assert adapter.known(torch.tensor([5, 95])).tolist() == [5, adapter.pard_token_id]
        torch.testing.assert_close(adapter.embed(torch.tensor([95])), adapter.embed(torch.tensor([89])))
    head = build_head(recipe, adapter)
    engine = Engine(target, adapter, head)
    prompt = [3, 14, 95, 9, 96] if drafter_vocab < 97 else [3, 14, 15, 9, 26]
    assert engine.speculative(prompt, max_new_tokens=12).tokens == engine.target_only(prompt, max_new_tokens=12).tokens


def test_recipe_sources_are_exclusive_and_layers_bounded():
    with pytest.raises(RecipeError, match="give at most one of path, random"):
        parse_recipe({"target": TINY_TARGET, "drafter": {"family": "pard", "path": "/x", "random": {}}})
    recipe = parse_recipe({"target": TINY_TARGET, "drafter": {"family": "pard", "num_layers": 9}})
    target = load_target(recipe.target)
    with pytest.raises(ValueError, match="drafter.num_layers: 9 is more than the target's 4 layers"):
        pard.build(recipe.drafter, target)


def test_run_dir_round_trip(tmp_path):
    from domino_graft.apply import apply_recipe
    from domino_graft.loading import load_run

    out = tmp_path / "run"
    apply_recipe(str(REPO / "recipes" / "tiny_pard.yaml"), str(out), echo=lambda *_: None)
    assert json.loads((out / "drafter" / "config.json").read_text())["pard_token"] == 96
    run = load_run(out)
    _, _, adapter, _ = _tiny()
    assert run.adapter.pard_token_id == 96 and run.adapter.num_slots == 5
    for k, v in adapter.backbone_state_dict().items():
        assert torch.equal(run.adapter.backbone_state_dict()[k], v), k
