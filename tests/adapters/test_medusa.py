"""Medusa-1 adapter: FasterDecoding import/export, slot convention, strict loading, recipes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from domino_graft.adapters.medusa import adapter as medusa
from domino_graft.artifacts.files import CheckpointError
from domino_graft.artifacts.tensors import save_tensors
from domino_graft.graft import build_head
from domino_graft.recipe import RecipeError, load_recipe, parse_recipe
from domino_graft.target import load_target

REPO = Path(__file__).resolve().parents[2]


def _tiny(overrides=None):
    recipe = load_recipe(REPO / "recipes" / "tiny_medusa.yaml", overrides)
    target = load_target(recipe.target)
    adapter, head_tensors = medusa.build(recipe.drafter, target)
    return recipe, target, adapter, build_head(recipe, adapter, head_tensors)


def _randomize(adapter, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter.heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def _faster_decoding_folder(tmp_path, adapter, *, pt=False, prefix="", cfg_extra=None):
    folder = tmp_path / "medusa"
    folder.mkdir(exist_ok=True)
    cfg = {"medusa_num_heads": adapter.cfg.num_heads, "medusa_num_layers": adapter.cfg.num_layers,
           "base_model_name_or_path": "lmsys/vicuna-7b-v1.3", **(cfg_extra or {})}
    (folder / "config.json").write_text(json.dumps(cfg))
    state = {prefix + k: v.clone() for k, v in adapter.backbone_state_dict().items()}
    if pt:
        torch.save(state, folder / "medusa_lm_head.pt")
    else:
        save_tensors(folder / "medusa_lm_head.safetensors", state)
    return folder


def test_slot_convention_matches_the_medusa_formula():
    """Head i on h_t: H = h + SiLU(W_i h + b_i), logits = LM_i H; slot j = i+1 is read at
    propose(x_0 at t+1), and training labels slot j with token t+1+j = a+j."""
    _, target, adapter, _ = _tiny()
    _randomize(adapter)
    ids = torch.randint(2, 96, (1, 20), generator=torch.Generator().manual_seed(0))
    _, feats = target(ids, capture=(-1,))
    t = 11
    adapter.reset(1)
    adapter.observe(feats[:, : t + 1], torch.arange(t + 1))
    block = adapter.propose(ids[:, t + 1], t + 1)
    h = feats[0, t]
    for i, head in enumerate(adapter.heads):
        lin = head[0].linear
        hid = h + F.silu(h @ lin.weight.T + lin.bias)
        torch.testing.assert_close(block.hidden[0, i], hid)
        torch.testing.assert_close(block.base_logits[0, i], hid @ head[1].weight.T)
    tb = adapter.training_blocks(feats, ids, torch.ones_like(ids), torch.tensor([[t + 1]]))
    assert tb.labels[0].tolist() == ids[0, t + 2 : t + 2 + adapter.num_slots].tolist()
    torch.testing.assert_close(tb.hidden[0], block.hidden[0])
    torch.testing.assert_close(tb.prev_emb[0], target.embed(ids[0, t + 1 : t + 1 + adapter.num_slots]))


def test_propose_refuses_a_stale_hidden_state():
    _, target, adapter, _ = _tiny()
    ids = torch.randint(2, 96, (1, 10))
    _, feats = target(ids, capture=(-1,))
    adapter.reset(1)
    adapter.observe(feats, torch.arange(10))
    with pytest.raises(RuntimeError, match="read the hidden state at 11, but the last observed position is 9"):
        adapter.propose(ids[:, 0], 12)


def test_fresh_heads_start_like_medusa():
    _, target, adapter, _ = _tiny()
    lm = target.model.get_output_embeddings().weight
    for head in adapter.heads:
        assert torch.equal(head[-1].weight, lm)
        assert torch.count_nonzero(head[0].linear.weight) == 0
        assert torch.count_nonzero(head[0].linear.bias) > 0  # nn.Linear's default init, as in Medusa


@pytest.mark.parametrize("fmt", ["safetensors", "pt", "medusa2"])
def test_faster_decoding_checkpoint_loads_exactly(tmp_path, fmt):
    recipe, target, adapter, _ = _tiny()
    _randomize(adapter)
    folder = _faster_decoding_folder(tmp_path, adapter, pt=fmt == "pt", prefix="medusa_head." if fmt == "medusa2" else "")
    d = parse_recipe({"target": {"random": {}}, "drafter": {"family": "medusa", "path": str(folder)}}).drafter
    loaded, head_tensors = medusa.build(d, target)
    assert head_tensors == {}
    assert loaded.num_slots == 4 and loaded.cfg.base_model_name_or_path == "lmsys/vicuna-7b-v1.3"
    for k, v in adapter.backbone_state_dict().items():
        assert torch.equal(loaded.backbone_state_dict()[k], v), k


def test_missing_or_misshapen_medusa_tensor_is_named(tmp_path):
    _, target, adapter, _ = _tiny()
    folder = _faster_decoding_folder(tmp_path, adapter)
    state = dict(adapter.backbone_state_dict())
    del state["2.0.linear.bias"]
    state["1.1.weight"] = state["1.1.weight"][:, :8]
    save_tensors(folder / "medusa_lm_head.safetensors", state)
    d = parse_recipe({"target": {"random": {}}, "drafter": {"family": "medusa", "path": str(folder)}}).drafter
    with pytest.raises(CheckpointError) as e:
        medusa.build(d, target)
    msg = str(e.value)
    assert "missing tensor '2.0.linear.bias' (expected shape [32])" in msg
    assert "tensor '1.1.weight' has shape [97, 8], expected [97, 32]" in msg


def test_recipe_that_contradicts_the_checkpoint_is_an_error(tmp_path):
    _, target, adapter, _ = _tiny()
    folder = _faster_decoding_folder(tmp_path, adapter)
    d = parse_recipe({"target": {"random": {}},
                      "drafter": {"family": "medusa", "path": str(folder), "num_heads": 5}}).drafter
    with pytest.raises(ValueError, match="drafter.num_heads: 5 conflicts with the checkpoint's 4"):
        medusa.build(d, target)
    (folder / "config.json").write_text(json.dumps({"base_model_name_or_path": "x"}))
    with pytest.raises(ValueError, match="lacks medusa_num_heads, medusa_num_layers"):
        medusa.build(parse_recipe({"target": {"random": {}}, "drafter": {"family": "medusa", "path": str(folder)}}).drafter,
                     target)


def test_export_faster_decoding_round_trip(tmp_path):
    _, target, adapter, _ = _tiny()
    _randomize(adapter, seed=3)
    out = medusa.export_faster_decoding(adapter, tmp_path / "fd")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 4 and cfg["medusa_num_layers"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "medusa_lm_head.safetensors"]
    d = parse_recipe({"target": {"random": {}}, "drafter": {"family": "medusa", "path": str(out)}}).drafter
    loaded, _ = medusa.build(d, target)
    for k, v in adapter.backbone_state_dict().items():
        assert torch.equal(loaded.backbone_state_dict()[k], v), k


def test_slot_base_logits_routes_each_row_through_its_own_head():
    _, _, adapter, _ = _tiny()
    _randomize(adapter)
    hidden = torch.randn(3, 4, 32)
    full = adapter.base_logits(hidden)
    slots = torch.arange(4).repeat(3)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    rows = adapter.slot_base_logits(hidden.reshape(12, 32)[perm], slots[perm])
    torch.testing.assert_close(rows, full.reshape(12, -1)[perm])
    with pytest.raises(ValueError, match=r"expected \[\.\.\., 4, H\]"):
        adapter.base_logits(hidden.reshape(12, 32))


def test_run_dir_round_trip(tmp_path):
    from domino_graft.apply import apply_recipe
    from domino_graft.loading import load_run

    out = tmp_path / "run"
    apply_recipe(str(REPO / "recipes" / "tiny_medusa.yaml"), str(out), echo=lambda *_: None)
    cfg = json.loads((out / "drafter" / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 4
    run = load_run(out)
    _, _, adapter, _ = _tiny()
    for k, v in adapter.backbone_state_dict().items():
        assert torch.equal(run.adapter.backbone_state_dict()[k], v), k


def test_vicuna_7b_dry_run_offline():
    r = subprocess.run([sys.executable, "-m", "domino_graft", "apply", "recipes/medusa_vicuna_7b.yaml", "--dry-run"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "hidden 4096, 32 layers, vocab 32000" in r.stdout
    # 5 heads × (4096² + 4096 + 32000·4096) and the G=1024, r=256 head on them
    assert "backbone 739,266,560 parameters" in r.stdout
    assert "head parameters 25,231,360" in r.stdout
    assert "tree of 63 nodes" in r.stdout


def test_tree_choices_are_validated():
    base = {"target": {"random": {}}, "drafter": {"family": "medusa", "num_heads": 2}}
    with pytest.raises(RecipeError) as e:
        parse_recipe({**base, "drafter": {**base["drafter"], "tree": [[0], [0, 0, 0], [1, 2], [0], [-1]]}})
    lines = e.value.problems  # every problem at once, one line each, with its dotted path
    assert "drafter.tree[1]: [0, 0, 0] is 3 deep; valid: at most num_heads = 2" in lines
    assert "drafter.tree[2]: [1, 2] has no parent [1] in the tree; add it" in lines
    assert "drafter.tree[3]: [0] appears twice" in lines
    assert "drafter.tree[4]: [-1] has a negative rank; valid ranks are 0, 1, 2, ..." in lines
    assert all(line.startswith("drafter.tree[") for line in lines)
    ok = parse_recipe({**base, "drafter": {**base["drafter"], "tree": [[0], [1], [0, 0]]}})
    assert ok.drafter.tree == [[0], [1], [0, 0]]


def test_tree_travels_with_the_heads(tmp_path):
    """medusa_choices in config.json: a drafter folder alone (a run's drafter/, a bundle's)
    rebuilds the tree; a recipe tree, when given, wins."""
    _, target, adapter, _ = _tiny(["drafter.tree=[[0],[1],[0,0]]"])
    assert adapter.topology == "tree"
    out = medusa.export_faster_decoding(adapter, tmp_path / "fd")
    assert json.loads((out / "config.json").read_text())["medusa_choices"] == [[0], [1], [0, 0]]
    d = parse_recipe({"target": {"random": {}}, "drafter": {"family": "medusa", "path": str(out)}}).drafter
    loaded, _ = medusa.build(d, target)
    assert loaded.tree == [[0], [1], [0, 0]] and loaded.topology == "tree"
    d2 = d.model_copy(update={"tree": [[0]]})
    assert medusa.build(d2, target)[0].tree == [[0]]


def test_faster_decoding_folder_named_by_a_recipe_is_grafted_and_decodes_losslessly(tmp_path):
    """Issue 7: `drafter.path` -> a FasterDecoding Medusa-1 folder; greedy speculation == the target."""
    from domino_graft.apply import apply_recipe
    from domino_graft.decoding import Engine, stop_token_ids
    from domino_graft.loading import load_run
    from tests.conftest import randomize_head

    _, _, adapter, _ = _tiny()
    _randomize(adapter, seed=3)
    folder = _faster_decoding_folder(tmp_path, adapter)
    _, run_dir = apply_recipe(str(REPO / "recipes" / "tiny_medusa.yaml"), str(tmp_path / "run"),
                              overrides=[f"drafter.path={folder}"], echo=lambda *_: None)
    run = load_run(run_dir)
    for k, v in adapter.backbone_state_dict().items():  # the imported heads, not fresh ones
        assert torch.equal(run.adapter.backbone_state_dict()[k], v), k
    randomize_head(run.head, seed=5)
    engine = Engine(run.target, run.adapter, run.head, stop_ids=stop_token_ids(run.target))
    for seed in range(3):
        prompt = torch.randint(2, run.target.shape.vocab_size - 1, (7 + seed,),
                               generator=torch.Generator().manual_seed(seed)).tolist()
        ref = engine.target_only(prompt, max_new_tokens=24)
        for use_head in (True, False):
            assert engine.speculative(prompt, max_new_tokens=24, use_head=use_head).tokens == ref.tokens
