"""experiments/combine_smollm2.py: the results table (bench/results/smollm2_h200.json) is a copy of each
family's source report (the mean of its seed repeats where it has several), and sources that
trained on different data, or "seed repeats" that differ in more than their seeds, cannot share it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import combine_smollm2 as comb  # noqa: E402


FIXTURES = REPO / "tests" / "fixtures" / "bench_records"
# the table's sources, by run folder -> the families its report covers (their --families)
RUNS = {"smollm2_h200_gpu_block16_long2": "dflash", "smollm2_h200_gpu_block16": "dflash",
        "smollm2_h200_gpu_block16_seed1": "dflash", "smollm2_h200_gpu_puzzles": "dflash,medusa",
        "smollm2_h200_pard": "pard"}


@pytest.fixture
def fixture_reports(tmp_path):
    """The table's five source reports, built by the pipeline's report stage from two prompts per
    set of each committed run's records (tests/fixtures/bench_records/), under the file names
    TABLE and BESIDE give them."""
    import smollm2_pipeline as sp

    saved = list(sp.FAMILIES)
    try:
        for run, fams in RUNS.items():
            sp.set_families(fams.split(","))
            sp.stage_report(FIXTURES / run, tmp_path / f"{run}.json", max_new_tokens=96, command=f"report {run}")
    finally:
        sp.set_families(saved)
    return tmp_path


def test_the_table_copies_each_family_from_its_source_and_averages_the_seeds_beside(fixture_reports, monkeypatch):
    table = comb.combine(comb.TABLE, fixture_reports, comb.BESIDE)
    src = {run: json.loads((fixture_reports / f"{run}.json").read_text()) for run in RUNS}
    # one source per family: its section copied, its provenance beside it
    for fam, name in comb.TABLE.items():
        rep = src[name.removesuffix(".json")]
        assert table[fam] == rep[fam]
        assert table["combined_from"][fam]["git_sha"] == rep["git_sha"]
        assert table["combined_from"][fam]["command"] == rep["command"]
    assert table["combined_from"]["dflash"]["git_sha"] == "d8f89d44aaaf7492d0fd2ca3d232479d1966d4b0"
    assert table["combined_from"]["medusa"]["git_sha"] == "1488a3594c36c02ccd84c6188d65068c6ad1cff0"
    assert table["dflash"] != src["smollm2_h200_gpu_puzzles"]["dflash"]  # that run's block-8 DFlash is not a row
    # beside DFlash's rows: the mean of the two 1,500-step seeds, each seed's own numbers kept
    beside, seeds = table["beside"]["dflash"], [src["smollm2_h200_gpu_block16"], src["smollm2_h200_gpu_block16_seed1"]]
    assert beside["what"] == comb.BESIDE["dflash"][0]
    for s in ("gsm8k", "humaneval"):
        for v in ("base", "domino", "headonly"):
            assert beside[s][f"tau_{v}"] == pytest.approx(sum(r["dflash"][s][f"tau_{v}"] for r in seeds) / 2)
        assert beside[s]["tau_ratio_domino_over_base"] == pytest.approx(beside[s]["tau_domino"] / beside[s]["tau_base"])
        assert [p["tau_domino"] for p in beside[s]["per_seed"]] == [r["dflash"][s]["tau_domino"] for r in seeds]
        assert beside[s]["num_seeds"] == 2 and beside[s]["identical_to_target"] is True
        assert table["dflash"][s]["tau_domino"] != beside[s]["tau_domino"]
    assert [c["git_sha"][:7] for c in beside["combined_from"]] == ["b68470c", "6e26e82"]
    assert table["data"]["sha256"].startswith("e5ea6289")
    # and the CLI writes what --check then accepts (the fixtures rebuild the table's sources only:
    # the families on another regeneration are checked against the committed files below)
    monkeypatch.setattr(comb, "OTHER_REGEN", {})
    out = fixture_reports / "table.json"
    assert comb.main(["--results", str(fixture_reports), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == table
    assert comb.main(["--results", str(fixture_reports), "--out", str(out), "--check"]) == 0


def _seed_source(tmp_path: Path, name: str, seed: int, taus: tuple, slots: list, prompts: int = 10,
                 extra: tuple = ()) -> None:
    work = f"/runs/seed{seed}"  # each run in its own folder, as experiments/reproduce_smollm2_table.sh runs them
    overrides = ["head.rank=8", f"train.data.path={work}/train.regen.jsonl", f"drafter.path={work}/base", *extra] + \
        ([f"drafter.seed={seed}", f"train.seed={seed}"] if seed else [])
    row = {"tau_base": taus[0], "tau_domino": taus[1], "identical_to_target": True, "num_prompts_greedy": prompts,
           "speedup_base": 1.5, "speedup_domino": 1.5 + seed, "num_prompts_timing": 2,
           "per_slot_acceptance": {"base": slots, "domino": slots}}
    (tmp_path / name).write_text(json.dumps({
        "what": "w", "dflash": {"gsm8k": row, "training_budget": {"base": {"steps": 4, "step_seconds": 1.0,
                                                                           "overrides": overrides}}},
        "data": {"sha256": "d"}, "target": {"config_hash": "c", "asset_payload_sha256": "p"}, "eval": {"sets": {}},
        "git_sha": f"g{seed}", "command": "cmd", "recipes": {"dflash": "recipes/dflash.yaml"}, "rollout": "triton",
        "hardware": {}, "versions": {}}))


def test_seed_repeats_are_averaged_with_each_seed_beside_the_mean(tmp_path):
    _seed_source(tmp_path, "s0.json", 0, (2.0, 2.2), [0.5, None, None])
    _seed_source(tmp_path, "s1.json", 1, (2.2, 2.6), [0.7, 0.4, None])
    out = comb.combine({"dflash": ["s0.json", "s1.json"]}, tmp_path)
    row = out["dflash"]["gsm8k"]
    assert row["tau_base"] == pytest.approx(2.1) and row["tau_domino"] == pytest.approx(2.4)
    assert row["tau_ratio_domino_over_base"] == pytest.approx(2.4 / 2.1)  # the ratio of the means
    assert row["speedup_domino"] == pytest.approx(2.0) and row["num_prompts_timing"] == 2 and row["num_seeds"] == 2
    assert row["per_slot_acceptance"]["base"][:2] == pytest.approx([0.6, 0.4])  # slot 2: seed 1's alone
    assert row["per_slot_acceptance"]["base"][2] is None
    assert [p["tau_base"] for p in row["per_seed"]] == [2.0, 2.2]
    assert [c["git_sha"] for c in out["combined_from"]["dflash"]] == ["g0", "g1"]
    assert out["dflash"]["averaged_over"] == [str((tmp_path / n).resolve()) for n in ("s0.json", "s1.json")]


def test_seed_repeats_that_differ_in_more_than_seeds_are_refused(tmp_path):
    _seed_source(tmp_path, "s0.json", 0, (2.0, 2.2), [0.5])
    _seed_source(tmp_path, "s1.json", 1, (2.2, 2.6), [0.7], extra=("train.gamma=7",))
    with pytest.raises(ValueError, match=r"\S*/s1.json's base training differs from \S*/s0.json's in more than its"):
        comb.combine({"dflash": ["s0.json", "s1.json"]}, tmp_path)
    with pytest.raises(ValueError, match=r"\S*/s0.json and \S*/s0.json trained with the same seeds"):
        comb.combine({"dflash": ["s0.json", "s0.json"]}, tmp_path)
    _seed_source(tmp_path, "s1.json", 1, (2.2, 2.6), [0.7], prompts=9)
    with pytest.raises(ValueError, match=r"\S*/s1.json decoded 9 gsm8k prompts, \S*/s0.json 10"):
        comb.combine({"dflash": ["s0.json", "s1.json"]}, tmp_path)


def _source(tmp_path: Path, name: str, fam: str, data_sha: str) -> None:
    (tmp_path / name).write_text(json.dumps({
        "what": "w", fam: {"gsm8k": {"tau_base": 2.0}}, "data": {"sha256": data_sha},
        "target": {"config_hash": "c", "asset_payload_sha256": "p"}, "eval": {"sets": {}},
        "git_sha": "abc", "command": "cmd", "recipes": {fam: f"recipes/{fam}.yaml"}, "rollout": "triton",
        "hardware": {}, "versions": {}}))


def test_sources_with_different_training_data_are_refused(tmp_path):
    _source(tmp_path, "a.json", "dflash", "sha-one")
    _source(tmp_path, "b.json", "medusa", "sha-two")
    with pytest.raises(ValueError, match=r"medusa: \S*/b.json differs from \S*/a.json \(dflash\) in data.sha256"):
        comb.combine({"dflash": "a.json", "medusa": "b.json"}, tmp_path)
    _source(tmp_path, "b.json", "medusa", "sha-one")
    out = comb.combine({"dflash": "a.json", "medusa": "b.json"}, tmp_path)
    assert out["medusa"] == {"gsm8k": {"tau_base": 2.0}} and out["combined_from"]["dflash"]["file"] == str((tmp_path / "a.json").resolve())


def test_a_source_without_the_family_names_what_it_has(tmp_path):
    _source(tmp_path, "a.json", "dflash", "s")
    with pytest.raises(ValueError, match=r"pard: a.json has no 'pard' section \(it has: dflash\)"):
        comb.combine({"pard": "a.json"}, tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.json does not exist"):
        comb.combine({"pard": "missing.json"}, tmp_path)


def test_the_cli_combines_the_sources_it_is_given(tmp_path):
    _seed_source(tmp_path, "s0.json", 0, (2.0, 2.2), [0.5])
    _seed_source(tmp_path, "s1.json", 1, (2.2, 2.6), [0.7])
    out = tmp_path / "table.json"
    assert comb.main(["--results", str(tmp_path), "--source", "dflash=s0.json,s1.json", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["dflash"]["gsm8k"]["tau_domino"] == pytest.approx(2.4)
    assert comb.main(["--results", str(tmp_path), "--source", "dflash=s0.json,s1.json", "--out", str(out),
                      "--check"]) == 0
    with pytest.raises(SystemExit):
        comb.main(["--source", "eagle=s0.json"])


def test_beside_rows_are_shown_next_to_the_table_rows_not_instead(tmp_path):
    _seed_source(tmp_path, "s0.json", 0, (2.0, 2.2), [0.5])
    _seed_source(tmp_path, "s1.json", 1, (2.2, 2.6), [0.7])
    _seed_source(tmp_path, "long.json", 0, (2.5, 3.0), [0.8])
    out = tmp_path / "table.json"
    assert comb.main(["--results", str(tmp_path), "--source", "dflash=long.json",
                      "--beside", "dflash=s0.json,s1.json", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["dflash"]["gsm8k"]["tau_domino"] == pytest.approx(3.0)
    assert table["beside"]["dflash"]["gsm8k"]["tau_domino"] == pytest.approx(2.4)
    assert [c["git_sha"] for c in table["beside"]["dflash"]["combined_from"]] == ["g0", "g1"]
    with pytest.raises(SystemExit):  # BESIDE has no Medusa entry
        comb.main(["--results", str(tmp_path), "--source", "dflash=long.json", "--beside", "medusa=s0.json"])
    with pytest.raises(SystemExit):  # --beside replaces BESIDE only together with --source
        comb.main(["--results", str(tmp_path), "--beside", "dflash=s0.json"])


def _regen_source(tmp_path: Path, name: str, fam: str, data: dict) -> None:
    (tmp_path / name).write_text(json.dumps({
        "what": "w", fam: {"gsm8k": {"tau_base": 2.0}}, "data": data,
        "target": {"config_hash": "c", "asset_payload_sha256": "p"}, "eval": {"sets": {}},
        "git_sha": "abc", "command": "cmd", "recipes": {fam: f"recipes/{fam}.yaml"}, "rollout": "triton",
        "hardware": {}, "versions": {}}))


def test_a_family_on_another_regeneration_carries_its_data_and_the_same_data_dflash(tmp_path):
    prompts = {"sequences": 4, "by_source": {"gsm": 4}, "code_sources": {}, "target": "t", "regen_max_new_tokens": 8}
    _regen_source(tmp_path, "table.json", "dflash", {**prompts, "sha256": "table-data"})
    _regen_source(tmp_path, "fam.json", "dspark", {**prompts, "sha256": "shipped-data"})
    (tmp_path / "shipped_drafter_h200").mkdir()
    (tmp_path / comb.SHIPPED_DATA).write_text(json.dumps({"sha256": "shipped-data"}))
    rows = {s: {"tau_base": 2.4, "tau_domino": 2.7, "identical_to_target": True} for s in ("gsm8k", "humaneval")}
    (tmp_path / comb.DFLASH_SAME_DATA).write_text(json.dumps({"git_sha": "e2e", "dtypes": {"bf16": {"dflash": rows}}}))
    out = comb.combine({"dflash": "table.json"}, tmp_path, other_regen={"dspark": "fam.json"})
    sec = out["dspark"]
    assert sec["gsm8k"] == {"tau_base": 2.0} and sec["data"]["sha256"] == "shipped-data"
    assert "table-data"[:12] in sec["data_note"] and out["data"]["sha256"] == "table-data"
    assert sec["dflash_same_data"]["gsm8k"] == {"tau_base": 2.4, "tau_headonly": 2.7, "identical_to_target": True}
    assert out["combined_from"]["dspark"]["file"].endswith("fam.json")
    # other prompts are not a regeneration of the table's
    _regen_source(tmp_path, "fam.json", "dspark", {**prompts, "by_source": {"gsm": 3}, "sha256": "shipped-data"})
    with pytest.raises(ValueError, match=r"dspark: \S*/fam.json differs from \S*/table.json in data.by_source"):
        comb.combine({"dflash": "table.json"}, tmp_path, other_regen={"dspark": "fam.json"})
    # and responses other than the shipped drafter's leave its DFlash comparison without ground
    _regen_source(tmp_path, "fam.json", "dspark", {**prompts, "sha256": "third-data"})
    with pytest.raises(ValueError, match=r"dspark: \S*/fam.json trained on data third-data\.\.\., not the shipped"):
        comb.combine({"dflash": "table.json"}, tmp_path, other_regen={"dspark": "fam.json"})
