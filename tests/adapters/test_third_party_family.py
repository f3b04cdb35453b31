"""A drafter family from outside the repository: pip-install examples/third_party_family, then
its tiny recipe goes validate -> apply -> train -> bench (identical to the target) -> export
through the real CLI, the family found only through its `domino_graft.families` entry point.

The package is installed into a temporary folder put on PYTHONPATH (the entry point is read
from its dist-info there), so the project's own environment is left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "third_party_family"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(site), str(EXAMPLE)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return env


def cli(env, cwd, *args):
    r = subprocess.run([sys.executable, "-m", "domino_graft", *args], cwd=cwd, env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, f"domino-graft {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_without_the_package_the_family_is_unknown(tmp_path):
    recipe = EXAMPLE / "tiny_toyheads.yaml"
    r = subprocess.run([sys.executable, "-m", "domino_graft", "validate", str(recipe)], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "drafter.family: 'toyheads' is not a drafter family; valid: dflash, dspark, medusa, pard" in r.stderr


def test_installed_family_runs_the_whole_pipeline(installed, tmp_path):
    recipe = EXAMPLE / "tiny_toyheads.yaml"
    env = installed
    assert "toyheads" in cli(env, tmp_path, "families")
    assert "ok" in cli(env, tmp_path, "validate", str(recipe))
    plan = cli(env, tmp_path, "apply", str(recipe), "-o", "runs/toy")
    assert "ToyHeads 4 slots, hidden 32" in plan and "wrote run dir runs/toy" in plan
    cli(env, tmp_path, "train", "runs/toy", "--max-steps", "30")
    cli(env, tmp_path, "bench", "runs/toy", "--limit", "3", "--json", "runs/toy/bench.json")
    report = json.loads((tmp_path / "runs/toy/bench.json").read_text())
    assert report["identical_to_target"] is True, report
    out = cli(env, tmp_path, "export", "runs/toy", "-o", "bundles/toy", "--dtype", "fp32")
    assert "self-check passed" in out
    bundle = tmp_path / "bundles/toy"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["layout"] == "drafter+head" and manifest["drafter"]["family"] == "toyheads"
    assert {"drafter/model.safetensors", "drafter/config.json", "head.safetensors"} <= set(manifest["files"])
    # the bundle decodes by itself too, through the same registry
    cli(env, tmp_path, "bench", "bundles/toy", "--limit", "2", "--json", "bundle_bench.json")
    assert json.loads((tmp_path / "bundle_bench.json").read_text())["identical_to_target"] is True
