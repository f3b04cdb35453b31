"""`export --engine sglang|vllm|hf`: every engine rule fails on its own broken field (one line
naming it) and passes on a good bundle; a refused export writes nothing; the manifest records
the checklists; the vLLM bundle is the base drafter alone, in the layout vLLM's loader reads."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from domino_graft.apply import apply_recipe
from domino_graft.artifacts.files import CheckpointError
from domino_graft.export import engine_rules as engines
from domino_graft.export.plan import plan_bundle, resolve_format
from domino_graft.export.run import export_run
from domino_graft.head import HEAD_TENSOR_NAMES
from domino_graft.loading import load_bundle
from domino_graft.recipe import load_recipe
from domino_graft.registry import get_family
from tests.conftest import REPO, TINY_RECIPE

Z_LAB = ["drafter.shift_label=false"]  # the convention vLLM's DFlash reads
QUIET = {"echo": lambda *_: None, "device": "cpu"}


# ------------------------------------------------------------------ rules, one by one
def _plan_view(engine: str):
    plan = plan_bundle(load_recipe(TINY_RECIPE, Z_LAB), engine=engine)
    return plan.view()


def _set(key, value, nested=True, top=True):
    def edit(view):
        if nested:
            view.config["dflash_config"][key] = value
        if top and (not nested or key in view.config):
            view.config[key] = value
    return edit


def _top(key, value):
    return lambda view: view.config.__setitem__(key, value)


def _tensor(name, shape=None, dtype=None, drop=False):
    def edit(view):
        if drop:
            view.tensors.pop(name)
            return
        old_shape, old_dtype = view.tensors.get(name, ((1,), "bf16"))
        view.tensors[name] = (shape or old_shape, dtype or old_dtype)
    return edit


# field -> (mutation, a text the failing line shows); per-engine entries override the shared ones
BREAK = {
    "architectures": (_top("architectures", ["LlamaForCausalLM"]), "LlamaForCausalLM"),
    "model_type": (_top("model_type", "llama"), "'llama'"),
    "dflash_config.gru_hidden_dim": (_set("gru_hidden_dim", 0), "0"),
    "emb_dim": (_top("emb_dim", 9), "!= top-level emb_dim 9"),
    "dflash_config.shift_label": (_set("shift_label", "yes"), "'yes'"),
    "dflash_config.pure_draft_prefix_len": (_set("pure_draft_prefix_len", -1), "-1"),
    "block_size": (_top("block_size", 1), "1"),
    "num_target_layers": (_top("num_target_layers", "4"), "'4'"),
    "num_hidden_layers": (_top("num_hidden_layers", 0), "0"),
    "dflash_config.target_layer_ids": (_set("target_layer_ids", [0, 9]), "9 is outside 0..3"),
    "dflash_config.mask_token_id": (_set("mask_token_id", -1), "-1"),
    "layer_types": (_top("layer_types", ["mamba"]), "'mamba'"),
    "hidden_act / intermediate_size": (_top("hidden_act", "gelu"), "'gelu'"),
    "model.safetensors": (_tensor("model.embed_tokens.weight", (97, 32)), "unexpected 'model.embed_tokens.weight'"),
    "model.safetensors dtype": (_tensor("norm.weight", dtype="fp32"), "fp32 (1 of"),
    "vocab_size": (lambda view: setattr(view, "target_vocab", 98), "the target's is 98"),
    "prefix_gru.weight_ih_l0": (_tensor("prefix_gru.weight_ih_l0", (72, 33)), "[72, 33]"),
    "prefix_gru.weight_hh_l0": (_tensor("prefix_gru.weight_hh_l0", drop=True), "missing"),
    "embed_proj.0.weight": (_tensor("embed_proj.0.weight", (8, 32)), "config.json implies [8, 56]"),
    "embed_proj.2.weight": (_tensor("embed_proj.2.weight", (96, 8)), "[96, 8]"),
    "auto_map": (lambda view: view.config["auto_map"].pop("AutoModel"), "DominoDFlashConfig"),
    "remote code": (lambda view: setattr(view, "files", view.files - {"modeling_domino.py"}), "['modeling_domino.py']"),
    "dflash_config.projector_type": (_set("projector_type", "dflash"), "'dflash'"),
    "prefix_gru.* / embed_proj.*": (_tensor("prefix_gru.weight_ih_l0", (72, 32)), "['prefix_gru.weight_ih_l0'] present"),
    "dflash_config.sample_from_anchor": (_set("sample_from_anchor", True, top=False), "True"),
    "eagle_aux_hidden_state_layer_ids": (_top("eagle_aux_hidden_state_layer_ids", [0, 2]), "[0, 2]"),
}
BREAK_FOR = {
    "vllm": {
        "dflash_config.projector_type": (_set("projector_type", "domino", top=False), "'domino'"),
        "dflash_config.shift_label": (_set("shift_label", True, top=False), "true (trained with position k"),
    },
}
CASES = [(e, r.field) for e in engines.ENGINES for r in engines.engine_spec(get_family("dflash"), e).rules]


@pytest.fixture(scope="module")
def views():
    return {e: _plan_view(e) for e in engines.ENGINES}


@pytest.mark.parametrize("engine", engines.ENGINES)
def test_a_good_bundle_passes_every_rule(views, engine):
    report = engines.check(get_family("dflash"), engine, views[engine])
    assert report.passed and not report.unchecked(), report.problems() + report.unchecked()
    assert len(report.results) == len(engines.engine_spec(get_family("dflash"), engine).rules) >= 14


@pytest.mark.parametrize("engine,field", CASES, ids=[f"{e}:{f}" for e, f in CASES])
def test_each_rule_fails_on_its_field_in_one_line(views, engine, field):
    edit, shown = {**BREAK, **BREAK_FOR.get(engine, {})}[field]  # a KeyError here: a rule without a failing case
    view = copy.deepcopy(views[engine])
    edit(view)
    report = engines.check(get_family("dflash"), engine, view)
    lines = [p for p in report.problems() if p.startswith(f"{field}: ")]
    assert len(lines) == 1, (field, report.problems())
    name = engines.ENGINE_NAMES[engine]
    assert shown in lines[0] and f"; {name} requires " in lines[0] and "\n" not in lines[0], lines[0]
    assert lines[0].rstrip().endswith("]")  # [the engine source the rule was read from]


def test_other_families_are_refused_by_every_engine_by_name():
    for name, display in (("medusa", "Medusa"), ("pard", "PARD")):
        recipe = load_recipe(REPO / "recipes" / f"tiny_{name}.yaml")
        for engine in engines.ENGINES:
            with pytest.raises(ValueError, match=rf"export --engine {engine}: .* cannot serve {display}") as e:
                resolve_format(get_family(name), recipe, format=None, engine=engine, dtype=None)
            assert engines.ENGINE_NAMES[engine] in str(e.value)


def test_format_and_engine_must_agree():
    recipe = load_recipe(TINY_RECIPE)
    family = get_family("dflash")
    assert resolve_format(family, recipe, format=None, engine="hf", dtype=None)[:2] == ("hf", "bf16")
    assert resolve_format(family, recipe, format=None, engine="vllm", dtype="fp32")[:2] == ("vllm", "fp32")
    with pytest.raises(ValueError, match="--format hf contradicts --engine sglang, which writes the 'native'"):
        resolve_format(family, recipe, format="hf", engine="sglang", dtype=None)


# -------------------------------------------------------------------------- exports
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("engine-runs")
    made = {}
    for name, overrides in (("z", Z_LAB), ("shift", []), ("p0", ["head.pure_prefix_len=0"])):
        apply_recipe(str(TINY_RECIPE), str(root / name), overrides=overrides, echo=lambda *_: None)
        made[name] = root / name
    return made


def _nothing_written(out: Path):
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-")]


def test_sglang_export_passes_records_the_checklists_and_prints_the_flags(runs, tmp_path):
    printed = []
    out = export_run(str(runs["z"]), str(tmp_path / "sgl"), engine="sglang", echo=printed.append, device="cpu")
    m = json.loads((out / "manifest.json").read_text())
    assert (m["engine"], m["format"], m["dtype"], m["head_in_bundle"]) == ("sglang", "native", "bf16", True)
    assert m["engines"]["sglang"] == {"passed": True, "rules": 20, "failed": [], "not_checked": []}
    assert m["engines"]["vllm"]["passed"] is False and m["engines"]["hf"]["passed"] is False
    text = "\n".join(printed)
    for flag in ("--speculative-algorithm DFLASH", f"--speculative-draft-model-path {out}",
                 "--speculative-domino-candidate-pool-size 2048", "--speculative-num-draft-tokens 8", "Greedy only"):
        assert flag in text
    assert "SGLang: passes 20 rules" in text and "SGLang: passes" in (out / "README.md").read_text()
    # a bench of the bundle drafts from SGLang's candidates (one pool per block), not a top-k per slot
    assert m["kernel"] == {"bench.head_kernel": "triton_pool", "bench.pool_size": 2048,
                           "bench.pool_select": "block_shared"}
    assert m["recipe"]["bench"]["pool_select"] == "block_shared"


def test_sglang_refuses_pure_prefix_0_and_writes_nothing(runs, tmp_path, capsys):
    from domino_graft.cli import main

    out = tmp_path / "never"
    assert main(["export", str(runs["p0"]), "-o", str(out), "--engine", "sglang", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    err = err[next(i for i, line in enumerate(err) if line.startswith("error:")):]
    assert err[0].startswith("error: export --engine sglang:") and "nothing written" in err[0]
    assert err[1:] == ["  dflash_config.pure_draft_prefix_len: 0 (the recipe's head.pure_prefix_len); SGLang requires 1 "
                       "[sglang srt/speculative/dflash_utils.py parse_dflash_draft_config]"]
    _nothing_written(out)
    # fp32 weights, one line naming the dtype
    assert main(["export", str(runs["z"]), "-o", str(out), "--engine", "sglang", "--dtype", "fp32"]) == 1
    err = capsys.readouterr().err
    assert "model.safetensors dtype: fp32 (18 of 18 tensors" in err and "SGLang requires bf16 weights" in err
    _nothing_written(out)


def test_the_checklist_runs_on_the_written_bundle_before_the_rename(runs, tmp_path, monkeypatch):
    """A bundle whose files break a rule the plan did not (here: one fp32 tensor) is refused too."""
    from domino_graft.adapters.dflash import bundle as dflash_bundle

    real = dflash_bundle.bundle_contents

    def one_fp32(adapter, head, *, format, dtype):
        files, configs = real(adapter, head, format=format, dtype=dtype)
        files["model.safetensors"]["norm.weight"] = files["model.safetensors"]["norm.weight"].float()
        return files, configs

    monkeypatch.setattr(dflash_bundle, "bundle_contents", one_fp32)
    out = tmp_path / "never"
    with pytest.raises(engines.EngineCheckError, match="breaks SGLang's loader rules; nothing written") as e:
        export_run(str(runs["z"]), str(out), engine="sglang", **QUIET)
    assert e.value.problems[0].startswith("model.safetensors dtype: fp32 (1 of 18 tensors, e.g. 'norm.weight'")
    _nothing_written(out)


def test_vllm_export_is_the_base_drafter_in_the_layout_vllm_reads(runs, tmp_path):
    printed = []
    native = export_run(str(runs["z"]), str(tmp_path / "native"), **QUIET)
    out = export_run(str(runs["z"]), str(tmp_path / "vllm"), engine="vllm", echo=printed.append, device="cpu")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "manifest.json", "model.safetensors"]
    weights, full = load_file(str(out / "model.safetensors")), load_file(str(native / "model.safetensors"))
    assert not set(weights) & set(HEAD_TENSOR_NAMES) and set(weights) == set(full) - set(HEAD_TENSOR_NAMES)
    assert all(torch.equal(weights[k], full[k]) for k in weights)  # the same backbone, bit for bit
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3" and cfg["hidden_act"] == "silu"
    assert cfg["dflash_config"] == {"mask_token_id": 96, "target_layer_ids": [0, 2], "shift_label": False}
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3]  # vLLM counts layer inputs
    assert not {"projector_type", "gru_hidden_dim", "emb_dim", "pure_draft_prefix_len"} & set(cfg)
    m = json.loads((out / "manifest.json").read_text())
    assert (m["format"], m["engine"], m["head_in_bundle"]) == ("vllm", "vllm", False)
    assert m["engines"]["vllm"]["passed"] and not m["engines"]["sglang"]["passed"]
    assert m["self_check"]["passed"] and m["self_check"]["exact_max_rel_diff"] <= m["self_check"]["exact_tolerance"]
    text = "\n".join(printed)
    assert "The Domino head was dropped" in text and '"method": "dflash"' in text and '"num_speculative_tokens": 7' in text
    assert "dropped" in (out / "README.md").read_text()
    with pytest.raises(CheckpointError, match="without its Domino head"):
        load_bundle(out)
    # the folder reads as a z-lab drafter: a recipe can graft a new head onto it
    _, run = apply_recipe(str(TINY_RECIPE), str(tmp_path / "regraft"), overrides=[f"drafter.path={out}", *Z_LAB],
                          echo=lambda *_: None)
    assert run is not None and (run / "head.safetensors").is_file()


def test_vllm_refuses_a_shift_label_drafter_naming_the_field(runs, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(engines.EngineCheckError) as e:
        export_run(str(runs["shift"]), str(out), engine="vllm", **QUIET)
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith("dflash_config.shift_label: true")
    assert "vLLM requires false or absent" in e.value.problems[0]
    _nothing_written(out)


def test_a_plain_format_export_records_every_checklist_without_requiring_one(runs, tmp_path, capsys):
    from domino_graft.cli import main

    out = tmp_path / "plain"
    assert main(["export", str(runs["p0"]), "-o", str(out), "--format", "native", "--device", "cpu"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["engine"] is None and m["engines"]["sglang"]["passed"] is False
    assert m["engines"]["sglang"]["failed"][0].startswith("dflash_config.pure_draft_prefix_len: 0")
    assert main(["export", str(runs["p0"]), "--dry-run", "--engine", "sglang"]) == 0
    printed = capsys.readouterr().out
    assert "engine checklist (from the plan): SGLang: fails 1 of 20 rules" in printed
    assert "dflash_config.pure_draft_prefix_len: 0" in printed
