"""Export and import: native/hf bundles, round trips, strict rejection of damaged bundles."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from domino_graft.adapters.dflash import adapter as dflash, bundle as dflash_bundle
from domino_graft.adapters.dflash.model import DFlashBackbone
from domino_graft.apply import apply_recipe
from domino_graft.artifacts.files import CheckpointError
from domino_graft.artifacts.tensors import load_tensors, save_tensors
from domino_graft.export.model_card import model_card
from domino_graft.export.plan import plan_bundle
from domino_graft.export.run import _bench_results, export_run
from domino_graft.export.self_check import ExportError, _greedy, rounded_weights
from domino_graft.graft import build_head
from domino_graft.head import HEAD_TENSOR_NAMES, DominoHead, HeadSpec
from domino_graft.loading import load_bundle, load_run
from domino_graft.recipe import load_recipe, parse_recipe
from domino_graft.target import TargetShape, target_config_dict
from tests.conftest import randomize_head

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "tiny_dflash.yaml"
QWEN = REPO / "recipes" / "dflash_qwen3_8b.yaml"
ANCHORS = (5, 11, 17, 23)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A tiny run whose head is randomised (W2 != 0), so a lost or mis-mapped head shows."""
    out = tmp_path_factory.mktemp("runs") / "tiny"
    apply_recipe(str(TINY), str(out), echo=lambda *_: None)
    state = load_tensors(out / "head.safetensors")
    spec = load_run(out).head.spec
    head = DominoHead(spec)
    head.load_state_dict(state)
    randomize_head(head, seed=1, scale=2.0)
    save_tensors(out / "head.safetensors", head.state_dict())
    return out


@pytest.fixture(scope="module")
def bundles(trained_run, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bundles")
    made = {}
    for fmt, dtype in (("native", "fp32"), ("native", "bf16"), ("hf", "fp32")):
        made[fmt, dtype] = export_run(str(trained_run), str(root / f"{fmt}-{dtype}"), format=fmt, dtype=dtype,
                                         device="cpu", echo=lambda *_: None)
    return made


def _probe(target, adapter, seed=0):
    ids = torch.randint(2, 96, (2, 24), generator=torch.Generator().manual_seed(seed))
    _, feats = target(ids, capture=adapter.capture_layers())
    return ids, feats


@torch.no_grad()
def _draft(adapter, head, ids, feats):
    """Greedy draft tokens (propose + Domino rollout) and the plain base argmax, per anchor."""
    tokens, base = [], []
    for a in ANCHORS:
        adapter.reset(ids.shape[0])
        adapter.observe(feats[:, :a], torch.arange(a))
        block = adapter.propose(ids[:, a], a)
        tokens.append(_greedy(adapter, head, block, ids[:, a]))
        base.append(block.base_logits.argmax(-1))
    return torch.stack(tokens), torch.stack(base)


# ------------------------------------------------------------------------ round trips
def test_bundle_files_manifest_and_native_config(bundles):
    b = bundles["native", "bf16"]
    assert sorted(p.name for p in b.iterdir()) == ["README.md", "config.json", "manifest.json", "model.safetensors"]
    assert not [p for p in b.parent.iterdir() if ".tmp-" in p.name]
    cfg = json.loads((b / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and "auto_map" not in cfg
    dc = cfg["dflash_config"]
    assert dc == {"mask_token_id": 96, "target_layer_ids": [0, 2], "shift_label": True, "projector_type": "domino",
                  "gru_hidden_dim": 24, "emb_dim": 8, "pure_draft_prefix_len": 1}
    for k, v in dc.items():  # the vLLM speculators layout repeats them at the top level
        assert cfg[k] == v
    assert cfg["block_size"] == 8 and cfg["num_target_layers"] == 4 and cfg["layer_types"] == ["full_attention"]
    weights = load_file(str(b / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in weights.values())
    assert not [k for k in weights if k.startswith("model.") or "embed_tokens" in k or "lm_head" in k or "rotary" in k]
    m = json.loads((b / "manifest.json").read_text())
    assert m["kind"] == "domino-graft bundle" and (m["format"], m["dtype"]) == ("native", "bf16")
    assert m["versions"]["torch"] and m["versions"]["transformers"] and "git_sha" in m
    assert m["target"]["config_hash"] == json.loads((bundles["native", "fp32"] / "manifest.json").read_text())["target"]["config_hash"]
    assert set(m["tensors"]) == set(weights) and all(len(t["sha256"]) == 64 for t in m["tensors"].values())
    assert m["recipe"]["head"]["rank"] == 8 and m["kernel"] is not None
    assert m["self_check"]["passed"] and m["self_check"]["exact_max_rel_diff"] <= m["self_check"]["exact_tolerance"]
    card = (b / "README.md").read_text()
    assert "not measured" in card and "--speculative-algorithm DFLASH" in card and '"method": "dflash"' in card


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_round_trip_gives_identical_draft_tokens(trained_run, bundles, dtype, tmp_path):
    bundle = bundles["native", dtype]
    run = load_run(trained_run)
    ids, feats = _probe(run.target, run.adapter)
    # reference: the trained model, with weights rounded to the export dtype (identity for fp32)
    with rounded_weights(run.adapter, run.head, dtype):
        want, base = _draft(run.adapter, run.head, ids, feats)
    assert not torch.equal(want[:, :, 1:], base[:, :, 1:])  # the head changes proposals: it matters
    if dtype == "fp32":
        assert torch.equal(_draft(run.adapter, run.head, ids, feats)[0], want)

    via_bundle = load_bundle(bundle)
    assert via_bundle.head.spec == run.head.spec
    assert torch.equal(_draft(via_bundle.adapter, via_bundle.head, ids, feats)[0], want)

    # drafter.path: the ordinary recipe route (apply reads the bundle like a z-lab checkpoint)
    out = tmp_path / "from_bundle"
    apply_recipe(str(TINY), str(out), overrides=[f"drafter.path={bundle}"], echo=lambda *_: None)
    via_path = load_run(out)
    assert torch.equal(_draft(via_path.adapter, via_path.head, ids, feats)[0], want)


def test_head_spec_comes_from_the_bundle_and_conflicts_name_both(bundles):
    bundle = bundles["native", "fp32"]
    data = {"target": load_recipe(TINY).model_dump(mode="json")["target"],
            "drafter": {"family": "dflash", "path": str(bundle)}}
    recipe = parse_recipe(data)  # no head section: G, r, pure prefix from the bundle's config
    target = load_bundle(bundle).target
    adapter, tensors = dflash.build(recipe.drafter, target)
    head = build_head(recipe, adapter, tensors)
    assert (head.spec.gru_hidden_dim, head.spec.rank, head.spec.pure_prefix_len) == (24, 8, 1)
    assert recipe.head.gru_hidden_dim == 1024  # the schema default the bundle overrode

    clash = parse_recipe({**data, "head": {"rank": 16}})
    with pytest.raises(ValueError, match=r"head\.rank: the recipe sets 16 but .* has 8"):
        build_head(clash, adapter, tensors)


def test_load_bundle_refuses_another_target(bundles):
    from domino_graft.recipe import Target

    other = Target.model_validate({"random": {"vocab_size": 101, "hidden_size": 32, "head_dim": 8, "seed": 0}})
    want = json.loads((bundles["native", "fp32"] / "manifest.json").read_text())["target"]["config_hash"]
    with pytest.raises(ValueError, match="exported for target config") as e:
        load_bundle(bundles["native", "fp32"], target=other)
    assert want in str(e.value) and str(e.value).count("config ") >= 2


# ------------------------------------------------------------------ Qwen3-8B shapes
def test_qwen3_8b_bundle_has_the_62_native_tensors_and_config_keys():
    recipe = load_recipe(QWEN)  # target.path absent: planned from configs/qwen3-8b.json
    plan = plan_bundle(recipe)
    assert (plan.format, plan.dtype) == ("native", "bf16")
    assert len(plan.tensors) == 62
    t = plan.tensors
    assert t["layers.0.self_attn.q_proj.weight"] == (4096, 4096)
    assert t["layers.4.self_attn.k_proj.weight"] == (1024, 4096)
    assert t["layers.4.mlp.down_proj.weight"] == (4096, 12288)
    assert t["layers.0.self_attn.q_norm.weight"] == (128,)
    assert t["fc.weight"] == (4096, 5 * 4096) and t["hidden_norm.weight"] == (4096,) and t["norm.weight"] == (4096,)
    assert t["prefix_gru.weight_ih_l0"] == (3072, 4096) and t["prefix_gru.weight_hh_l0"] == (3072, 1024)
    assert t["embed_proj.0.weight"] == (256, 5120) and t["embed_proj.2.weight"] == (151936, 256)
    assert sum(1 for k in t if k.startswith("layers.")) == 55

    cfg = plan.config
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 16
    assert cfg["num_target_layers"] == 36 and cfg["num_hidden_layers"] == 5 and len(cfg["layer_types"]) == 5
    assert cfg["dflash_config"] == {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33],
                                    "shift_label": True, "projector_type": "domino", "gru_hidden_dim": 1024,
                                    "emb_dim": 256, "pure_draft_prefix_len": 1}
    assert cfg["emb_dim"] == 256 and cfg["projector_type"] == "domino" and cfg["pure_draft_prefix_len"] == 1
    assert cfg["target_layer_ids"] == [1, 9, 17, 25, 33] and cfg["mask_token_id"] == 151669
    # the reader's view of that config implies exactly the tensors the writer plans
    assert dflash_bundle.implied_tensor_shapes(cfg, source="plan") == t

    # the exporter's tensor path on real (meta) modules, no weights allocated
    tshape = TargetShape.from_config_dict(target_config_dict(recipe.target))
    drafter_cfg = dflash.config_from_recipe(recipe.drafter, tshape)
    spec = HeadSpec(hidden_dim=4096, emb_dim=4096, gru_hidden_dim=1024, rank=256, vocab_size=151936)
    with torch.device("meta"):
        backbone = DFlashBackbone(drafter_cfg)
        head = DominoHead(spec)
    tensors = dflash_bundle.bundle_tensors(backbone.state_dict(), head.state_dict(),
                                          dflash_bundle.planned_tensor_shapes(drafter_cfg, spec), dtype="bf16")
    assert {k: tuple(v.shape) for k, v in tensors.items()} == t
    assert list(tensors)[-4:] == list(HEAD_TENSOR_NAMES)
    assert all(v.dtype == torch.bfloat16 for v in tensors.values())


# --------------------------------------------------------------------- strict loading
def _damaged(bundle: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / f"damaged-{bundle.name}"
    shutil.copytree(bundle, out)
    state = load_file(str(out / "model.safetensors"))
    edit(state)
    save_file(state, str(out / "model.safetensors"))
    return out


def _wrong_vocab(s):
    w = s["embed_proj.2.weight"]
    s["embed_proj.2.weight"] = torch.cat([w, w[:1]])


DAMAGE = {
    "deleted": (lambda s: s.pop("prefix_gru.weight_hh_l0"), ["'prefix_gru.weight_hh_l0'", "[72, 24]"]),
    "wrong_vocab": (_wrong_vocab, ["'embed_proj.2.weight'", "[98, 8]", "[97, 8]"]),
    "renamed": (lambda s: s.__setitem__("embed_proj.1.weight", s.pop("embed_proj.0.weight")),
                ["'embed_proj.0.weight'", "'embed_proj.1.weight'"]),
    # SpecForge's loaders tolerate missing keys containing "embed": a headless bundle loads there.
    "headless": (lambda s: [s.pop(k) for k in HEAD_TENSOR_NAMES], ["'embed_proj.0.weight'", "'embed_proj.2.weight'"]),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_bundles_are_rejected_naming_the_tensor(bundles, tmp_path, kind):
    edit, needles = DAMAGE[kind]
    bad = _damaged(bundles["native", "fp32"], tmp_path, edit)
    with pytest.raises(CheckpointError) as e:
        load_bundle(bad)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))
    # the drafter.path route is just as strict
    target = load_run(json.loads((bad / "manifest.json").read_text())["source_run"]["path"]).target
    with pytest.raises(CheckpointError) as e:
        recipe = load_recipe(TINY, [f"drafter.path={bad}"])
        adapter, tensors = dflash.build(recipe.drafter, target)
        build_head(recipe, adapter, tensors)
    assert needles[0] in str(e.value)


def test_modified_tensor_values_fail_the_checksum(bundles, tmp_path):
    bad = _damaged(bundles["native", "fp32"], tmp_path, lambda s: s["norm.weight"].mul_(1.01))
    with pytest.raises(CheckpointError, match=r"'norm\.weight' has sha256"):
        load_bundle(bad)


def test_failed_self_check_leaves_no_bundle(trained_run, tmp_path, monkeypatch):
    real = dflash_bundle.domino_native_config

    def wrong_mask(cfg, spec):  # a config bug: the bundle would draft from the wrong mask row
        out = real(cfg, spec)
        out["dflash_config"]["mask_token_id"] = out["mask_token_id"] = 95
        return out

    monkeypatch.setattr(dflash_bundle, "domino_native_config", wrong_mask)
    out = tmp_path / "never"
    with pytest.raises(ExportError, match="self-check failed"):
        export_run(str(trained_run), str(out), dtype="fp32", device="cpu", echo=lambda *_: None)
    assert not out.exists() and not list(tmp_path.iterdir())


# ------------------------------------------------------------------------- hf format
def test_hf_bundle_loads_with_automodel_and_matches(trained_run, bundles, monkeypatch):
    import transformers

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    b = bundles["hf", "fp32"]
    cfg = json.loads((b / "config.json").read_text())
    assert cfg["architectures"] == ["DominoDraftModel"] and cfg["model_type"] == "domino_dflash"
    assert set(cfg["auto_map"].values()) == {"configuration_domino.DominoDFlashConfig", "modeling_domino.DominoDraftModel"}
    for f in dflash_bundle.HF_CODE_FILES:  # shipped code must stand alone: torch + transformers only
        imports = re.findall(r"^\s*(?:from|import)\s+([\w.]+)", (b / f).read_text(), re.M)
        assert {i.split(".")[0] for i in imports} <= {"__future__", "typing", "torch", "transformers", ""}, imports
    model = transformers.AutoModel.from_pretrained(str(b), trust_remote_code=True, local_files_only=True,
                                                   dtype=torch.float32)
    assert type(model).__name__ == "DominoDraftModel"

    run = load_run(trained_run)
    t, adapter, head = run.target, run.adapter, run.head
    ids, feats = _probe(t, adapter, seed=3)
    want, _ = _draft(adapter, head, ids, feats)
    with torch.no_grad():
        for i, a in enumerate(ANCHORS):
            adapter.reset(2)
            adapter.observe(feats[:, :a], torch.arange(a))
            block = adapter.propose(ids[:, a], a)
            prev = torch.cat([ids[:, a : a + 1], want[i][:, :-1]], dim=1)
            ours = head.block(block.hidden, block.base_logits, adapter.embed(prev))

            blk = torch.full((2, model.block_size), model.mask_token_id)
            blk[:, 0] = ids[:, a]
            hidden = model.proposal_hidden(model(t.embed(blk), feats[:, :a], torch.arange(a + model.block_size)[None]))
            base = t.lm_head(hidden)
            theirs = model.domino_logits(hidden, base, t.embed(prev))
            torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
            assert torch.equal(model.draft_greedy(hidden, base, ids[:, a], t.model.get_input_embeddings()), want[i])

    # the shipped loader is strict too (transformers itself would only warn)
    bad = b.parent / "hf-headless"
    shutil.copytree(b, bad)
    state = load_file(str(bad / "model.safetensors"))
    del state["embed_proj.2.weight"]
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match="embed_proj.2.weight"):
        transformers.AutoModel.from_pretrained(str(bad), trust_remote_code=True, local_files_only=True)


def test_model_card_reports_measured_tau_only_from_a_bench_report(bundles, tmp_path):
    manifest = json.loads((bundles["native", "bf16"] / "manifest.json").read_text())
    config = json.loads((bundles["native", "bf16"] / "config.json").read_text())
    assert "not measured" in model_card(manifest, config) and "τ" in model_card(manifest, config)
    report = {"tau": 3.25, "speedup": 2.1, "base": {"tau": 2.5}, "per_prompt": [{"tau": 9.0}],
              "run": {"path": "/runs/x"}, "hardware": {"device": "NVIDIA H200"}}
    (tmp_path / "bench.json").write_text(json.dumps(report))
    manifest["bench"] = _bench_results(tmp_path)
    card = model_card(manifest, config, bundle="out/b")
    assert "not measured" not in card
    assert "`tau` = 3.25" in card and "`base.tau` = 2.5" in card and "`speedup` = 2.1" in card
    assert "9.0" not in card and "NVIDIA H200" in card  # lists are per-prompt detail, not headline numbers
    assert "--speculative-draft-model-path out/b" in card


# ------------------------------------------------------------------------------- CLI
def test_cli_export_and_dry_run(trained_run, tmp_path, capsys):
    from domino_graft.cli import main

    assert main(["export", str(trained_run), "--dry-run", "--format", "hf"]) == 0
    printed = capsys.readouterr().out
    assert "format hf, dtype bf16, 18 tensors" in printed and "embed_proj.2.weight" in printed

    out = tmp_path / "cli-bundle"
    assert main(["export", str(trained_run), "-o", str(out), "--dtype", "fp32", "--device", "cpu"]) == 0
    assert json.loads((out / "manifest.json").read_text())["dtype"] == "fp32"
    assert main(["export", str(tmp_path / "nope")]) == 1
    assert "not a run directory" in capsys.readouterr().err
