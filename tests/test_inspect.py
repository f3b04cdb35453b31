"""`domino-graft inspect`: our bundles (native, hf, vllm), a damaged one, the shipped z-lab
drafter and a FasterDecoding Medusa folder: family, shapes, head, sha256, engine checklists."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from domino_graft.apply import apply_recipe
from domino_graft.export.inspect import inspect_path
from domino_graft.export.run import export_run
from tests.conftest import REPO, TINY_RECIPE

SHIPPED = REPO / "models" / "smollm2-135m-dflash"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("inspect")
    run = root / "run"
    apply_recipe(str(TINY_RECIPE), str(run), overrides=["drafter.shift_label=false"], echo=lambda *_: None)
    quiet = {"echo": lambda *_: None, "device": "cpu"}
    return {"run": run,
            "native": export_run(str(run), str(root / "native"), engine="sglang", **quiet),
            "hf": export_run(str(run), str(root / "hf"), engine="hf", dtype="fp32", **quiet),
            "vllm": export_run(str(run), str(root / "vllm"), engine="vllm", **quiet)}


def test_native_bundle(bundles):
    r = inspect_path(bundles["native"])
    facts = dict(r.description.facts)
    assert (r.family, r.description.layout) == ("dflash", "domino-graft bundle, format 'native'")
    assert facts["head"] == "GRU 24, rank 8, pure prefix 1: 5,256 parameters"
    assert facts["block"] == "8 (7 proposals), shift_label false, mask id 96"
    assert facts["tensors"] == "18 in model.safetensors, 16,664 parameters, dtype bf16"
    assert r.checksums == "ok: 18 tensors and 2 files match manifest.json"
    assert r.reports["sglang"].passed and not r.reports["vllm"].passed and not r.reports["hf"].passed
    assert r.description.head["tensors"]["embed_proj.2.weight"] == [97, 8]
    text = r.format_text()
    assert "SGLang: passes 20 rules" in text and "checklists passed then: SGLang" in text
    assert "prefix_gru.* / embed_proj.*: ['embed_proj.0.weight'" in text  # why vLLM would not load it


def test_hf_and_vllm_bundles(bundles):
    hf = inspect_path(bundles["hf"])
    assert hf.reports["hf"].passed and dict(hf.description.facts)["tensors"].endswith("dtype fp32")
    assert "transformers remote code" not in hf.description.layout  # ours: the manifest names the format
    v = inspect_path(bundles["vllm"])
    assert v.reports["vllm"].passed and v.description.head is None and dict(v.description.facts)["head"] == "none"
    assert v.checksums.startswith("ok: 14 tensors")


def test_a_modified_bundle_fails_its_checksums(bundles, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(bundles["native"], bad)
    state = load_file(str(bad / "model.safetensors"))
    state["norm.weight"] = state["norm.weight"] * 2
    save_file(state, str(bad / "model.safetensors"))
    r = inspect_path(bad)
    assert r.checksums.startswith("FAILED: ") and "'norm.weight' has sha256" in r.checksums


def test_the_shipped_z_lab_drafter(tmp_path):
    r = inspect_path(SHIPPED)
    facts = dict(r.description.facts)
    assert (r.family, r.description.layout) == ("dflash", "z-lab DFlash (no Domino head)")
    assert facts["drafter"].startswith("4 layer(s), hidden 576") and facts["head"] == "none"
    assert facts["tensors"] == "47 in model.safetensors, 15,820,928 parameters, dtype bf16"
    assert r.checksums.startswith("no manifest.json")
    sgl, vllm = r.reports["sglang"], r.reports["vllm"]
    assert sgl.problems()[0].startswith("dflash_config.projector_type: None; SGLang requires 'domino'")
    assert [p.split(":")[0] for p in vllm.problems()] == ["dflash_config.shift_label"]  # trained shift_label: true
    assert "vocab_size: not checked (the target's vocabulary size is not known here)" in vllm.unchecked()
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 49152}))
    with_target = inspect_path(SHIPPED / "config.json", target=str(tmp_path))
    assert not with_target.reports["vllm"].unchecked()


def test_a_fasterdecoding_medusa_folder_and_cli(tmp_path, capsys):
    from domino_graft.cli import main

    run = tmp_path / "medusa"
    apply_recipe(str(REPO / "recipes" / "tiny_medusa.yaml"), str(run), echo=lambda *_: None)
    r = inspect_path(run / "drafter")
    assert (r.family, r.description.layout) == ("medusa", "FasterDecoding Medusa-1")
    assert all(rep.refused for rep in r.reports.values())
    assert "SGLang has no Medusa algorithm" in r.reports["sglang"].refused
    assert main(["inspect", str(run / "drafter"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["family"] == "medusa" and data["engines"]["vllm"]["passed"] is False
    assert main(["inspect", str(tmp_path)]) == 1
    assert "no registered drafter family recognises" in capsys.readouterr().err
