"""Recipe schema: strictness, error reporting, path resolution, overrides, no torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from domino_graft.recipe import RecipeError, load_recipe, parse_recipe

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "recipes").glob("*.yaml"))


def _cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "domino_graft", *args], cwd=cwd, capture_output=True, text=True)


def test_every_shipped_recipe_validates():
    assert SHIPPED, "no recipes shipped"
    r = _cli("validate", *map(str, SHIPPED))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(": ok") == len(SHIPPED)


def test_every_shipped_recipe_opens_with_a_header():
    for path in SHIPPED:
        head = path.read_text().splitlines()[:12]
        text = "\n".join(head).lower()
        assert head[0].startswith("#"), path
        for word in ("purpose", "hardware", "commands"):
            assert word in text, f"{path.name}: header lacks {word!r}"


def test_bad_recipe_names_all_three_problems_at_once(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("""
        target: {random: {seed: 1}}
        drafter: {family: eagle9}
        head: {rank: "wide", gru_hidden_dim: 16}
        trian: {max_steps: 3}
    """))
    r = _cli("validate", str(bad))
    assert r.returncode != 0
    err = r.stderr
    assert "trian: unknown key" in err and "valid keys here:" in err and "train" in err
    assert "head.rank: 'wide'" in err
    assert "drafter.family: 'eagle9'" in err and "dflash" in err and "medusa" in err
    # one line per problem
    assert len([line for line in err.splitlines() if line.startswith("  ")]) == 3


def test_validate_does_not_import_torch(tmp_path):
    code = (
        "import sys; from domino_graft.cli import main; "
        f"rc = main(['validate', {str(REPO / 'recipes' / 'tiny_dflash.yaml')!r}]); "
        "assert 'torch' not in sys.modules, 'validate imported torch'; sys.exit(rc)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_unknown_nested_key_lists_valid_keys():
    with pytest.raises(RecipeError) as e:
        parse_recipe({"target": {"random": {"hiden_size": 8}}, "drafter": {"family": "dflash"}})
    (line,) = e.value.problems
    assert line.startswith("target.random.hiden_size: unknown key")
    assert "hidden_size" in line


def test_target_needs_exactly_one_source():
    with pytest.raises(RecipeError) as e:
        parse_recipe({"target": {"path": "/x", "asset": "y"}, "drafter": {"family": "dflash"}})
    assert e.value.problems[0].startswith("target:")
    assert "exactly one of path, asset, random" in e.value.problems[0]


def test_relative_paths_resolve_against_the_recipe_folder(tmp_path):
    sub = tmp_path / "nested"
    sub.mkdir()
    (sub / "r.yaml").write_text("target: {path: ../models/t, config: cfg.json}\ndrafter: {family: dflash, path: d}\n")
    r = load_recipe(sub / "r.yaml")
    assert Path(r.target.path) == sub / "../models/t"
    assert Path(r.target.config) == sub / "cfg.json"
    assert Path(r.drafter.path) == sub / "d"


def test_overrides_are_revalidated(tmp_path):
    rec = REPO / "recipes" / "tiny_dflash.yaml"
    r = load_recipe(rec, ["head.rank=4", "train.lr=0.01"])
    assert r.head.rank == 4 and r.train.lr == 0.01
    with pytest.raises(RecipeError) as e:
        load_recipe(rec, ["train.backbone=bogus"])
    assert any(p.startswith("train.backbone: 'bogus'") and "frozen" in p for p in e.value.problems)


def test_wrong_type_is_not_coerced():
    # strict: a quoted number is a string, not an int
    with pytest.raises(RecipeError) as e:
        parse_recipe({"target": {"random": {}}, "drafter": {"family": "dflash", "block_size": "16"}})
    assert e.value.problems[0].startswith("drafter.block_size: '16'")


# ------------------------------------------------- frozen backbone on a fresh drafter (issue #25)
@pytest.mark.parametrize("family", ["dflash", "medusa", "pard"])
def test_frozen_backbone_without_a_drafter_path_is_refused_in_one_line(family):
    """A head trained on a random frozen drafter measures nothing: refused, naming the fields."""
    with pytest.raises(RecipeError) as e:
        parse_recipe({"target": {"random": {}}, "drafter": {"family": family}, "train": {"backbone": "frozen"}})
    (line,) = e.value.problems
    assert line.startswith("train.backbone: 'frozen' with drafter.path unset")
    for valid in ("set drafter.path to a trained drafter", "train.backbone: full", "train.allow_frozen_fresh: true"):
        assert valid in line, line


@pytest.mark.parametrize("train", [
    {"backbone": "frozen", "allow_frozen_fresh": True},  # on purpose (a test, an ablation)
    {"backbone": "full"},
    {"backbone": "lora"},
])
def test_a_fresh_drafter_trains_unless_frozen_by_accident(train):
    r = parse_recipe({"target": {"random": {}}, "drafter": {"family": "dflash"}, "train": train})
    assert r.train.backbone == train["backbone"] and r.train.allow_frozen_fresh is train.get("allow_frozen_fresh", False)


def test_frozen_backbone_on_a_drafter_checkpoint_is_the_cheap_port(tmp_path):
    r = parse_recipe({"target": {"random": {}}, "drafter": {"family": "dflash", "path": str(tmp_path)},
                      "train": {"backbone": "frozen"}})
    assert r.train.backbone == "frozen" and r.drafter.path == str(tmp_path)


def test_frozen_override_at_train_time_is_refused_before_loading(tiny_run, tmp_path, capsys):
    import shutil

    from domino_graft.cli import main

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    assert main(["train", str(run), "train.backbone=frozen"]) == 1
    errors = [x for x in capsys.readouterr().err.splitlines() if "train.backbone: 'frozen'" in x]
    assert len(errors) == 1 and "train.allow_frozen_fresh: true" in errors[0]
    assert not (run / "metrics.jsonl").exists()  # nothing trained
