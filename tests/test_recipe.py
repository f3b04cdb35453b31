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
