"""bench/combine_smollm2.py: the README table's results file is a pure copy of each family's
source report, and sources that trained on different data cannot share it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import combine_smollm2 as comb  # noqa: E402


def test_committed_table_is_a_rebuild_of_its_sources():
    committed = json.loads((comb.RESULTS / "smollm2_h200.json").read_text())
    assert committed == comb.combine()
    for fam, name in comb.TABLE.items():
        source = json.loads((comb.RESULTS / name).read_text())
        assert committed[fam] == source[fam]
        assert committed["combined_from"][fam]["git_sha"] == source["git_sha"]


def _source(tmp_path: Path, name: str, fam: str, data_sha: str) -> None:
    (tmp_path / name).write_text(json.dumps({
        "what": "w", fam: {"gsm8k": {"tau_base": 2.0}}, "data": {"sha256": data_sha},
        "target": {"config_hash": "c", "asset_payload_sha256": "p"}, "eval": {"sets": {}},
        "git_sha": "abc", "command": "cmd", "recipes": {fam: f"recipes/{fam}.yaml"}, "rollout": "triton",
        "hardware": {}, "versions": {}}))


def test_sources_with_different_training_data_are_refused(tmp_path):
    _source(tmp_path, "a.json", "dflash", "sha-one")
    _source(tmp_path, "b.json", "medusa", "sha-two")
    with pytest.raises(ValueError, match=r"medusa: b.json differs from a.json \(dflash\) in data.sha256"):
        comb.combine({"dflash": "a.json", "medusa": "b.json"}, tmp_path)
    _source(tmp_path, "b.json", "medusa", "sha-one")
    out = comb.combine({"dflash": "a.json", "medusa": "b.json"}, tmp_path)
    assert out["medusa"] == {"gsm8k": {"tau_base": 2.0}} and out["combined_from"]["dflash"]["file"] == "bench/results/a.json"


def test_a_source_without_the_family_names_what_it_has(tmp_path):
    _source(tmp_path, "a.json", "dflash", "s")
    with pytest.raises(ValueError, match=r"pard: a.json has no 'pard' section \(it has: dflash\)"):
        comb.combine({"pard": "a.json"}, tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.json does not exist"):
        comb.combine({"pard": "missing.json"}, tmp_path)
