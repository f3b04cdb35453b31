"""DSpark and P-EAGLE bundles name their target (issue #43): `speculators_config.verifier.name_or_path`
is the target's folder whenever the recipe has one, so speculators' plain `from_pretrained` loads
the drafter without the Hub; a random target leaves it null, the card says so and shows how to
rebuild that target with transformers alone, and `export --engine vllm` refuses it by name.

The speculators check runs where `speculators` is importable. `pip install speculators` (0.9.0)
is not in the dev extra: it pulls a CUDA torch 2.14 and transformers 5.19 over the project's
CPU torch; scripts/setup.sh installs it beside the project with `--no-deps` plus its pure-Python
imports (loguru, pydantic-settings, python-dotenv, hs-connectors; openai comes with the dev extra),
so the default suite runs it (it skips where that install failed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO

QUIET = dict(echo=lambda *_: None, device="cpu")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    """The tiny random target saved as a folder; DSpark and P-EAGLE runs on it, exported in fp32."""
    from domino_graft.apply import apply_recipe
    from domino_graft.export.run import export_run
    from domino_graft.recipe import load_recipe
    from domino_graft.target import load_target

    root = tmp_path_factory.mktemp("speculators")
    target = root / "target"
    load_target(load_recipe(REPO / "recipes" / "tiny_dflash.yaml").target).model.save_pretrained(target)
    out = {"target": target}
    for fam in ("dspark", "peagle"):
        run = root / f"run-{fam}"
        apply_recipe(str(REPO / "recipes" / f"tiny_{fam}.yaml"), str(run), echo=lambda *_: None,
                     overrides=["target.random=null", f"target.path={target}"])
        out[fam] = export_run(str(run), str(root / f"bundle-{fam}"), dtype="fp32", **QUIET)
    return out


@pytest.mark.parametrize("family", ["dspark", "peagle"])
def test_the_drafter_config_names_its_target(family, bundles):
    cfg = json.loads((bundles[family] / "drafter" / "config.json").read_text())
    verifier = cfg["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": str(bundles["target"]), "architectures": ["Qwen3ForCausalLM"]}


@pytest.mark.parametrize("family", ["dspark", "peagle"])
def test_speculators_from_pretrained_loads_the_drafter(family, bundles, monkeypatch):
    pytest.importorskip("speculators")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the verifier must come from the folder, never the Hub
    from speculators.models.dspark import DSparkDraftModel
    from speculators.models.peagle import PEagleDraftModel

    cls = {"dspark": DSparkDraftModel, "peagle": PEagleDraftModel}[family]
    state = cls.from_pretrained(str(bundles[family] / "drafter")).state_dict()
    floats = {n: t for n, t in state.items() if t.is_floating_point()}
    assert floats and all(bool(torch.isfinite(t).all()) for t in floats.values()), \
        [n for n, t in floats.items() if not torch.isfinite(t).all()]
    if "embed_tokens.weight" in state:  # DSpark fills it from the verifier: the target's, not uninitialised
        from safetensors.torch import load_file

        assert torch.equal(state["embed_tokens.weight"], load_file(bundles["target"] / "model.safetensors")[
            "model.embed_tokens.weight"].to(state["embed_tokens.weight"].dtype))


def test_a_random_target_is_named_in_the_card_and_rebuilds_without_domino_graft(tmp_path):
    """The card's snippet (transformers + torch only) rebuilds the random target bit for bit;
    the DSpark card says its verifier name is null; `--engine vllm` refuses the run by name."""
    from domino_graft.apply import apply_recipe
    from domino_graft.artifacts.provenance import config_hash
    from domino_graft.cli import main
    from domino_graft.export.run import export_run
    from domino_graft.recipe import load_recipe
    from domino_graft.target import load_target

    run = tmp_path / "run"
    apply_recipe(str(REPO / "recipes" / "tiny_dspark.yaml"), str(run), echo=lambda *_: None)
    bundle = export_run(str(run), str(tmp_path / "b"), dtype="fp32", **QUIET)
    card = (bundle / "README.md").read_text()
    assert "`speculators_config.verifier.name_or_path` is null" in card
    code = card.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(code, scope)  # the card's own lines, as a reader would paste them
    rebuilt = scope["target"]
    assert config_hash(rebuilt.config.to_dict()) == json.loads((bundle / "manifest.json").read_text())[
        "target"]["config_hash"]
    want = load_target(load_recipe(REPO / "recipes" / "tiny_dspark.yaml").target).model.state_dict()
    got = rebuilt.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert main(["export", str(run), "-o", str(tmp_path / "v"), "--engine", "vllm"]) == 1
    assert not Path(tmp_path / "v").exists()
