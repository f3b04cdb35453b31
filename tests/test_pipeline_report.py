"""experiments/smollm2_pipeline.py's report: a drafter whose training never finished (no
training_<drafter>.json) is neither evaluated nor reported, even when eval records of its
untrained bundle exist — an untrained Domino head is the identity and would pass for a result. A
drafter without timing records (a head-only graft decoded in a later session) gets no speedup and
takes none from the others."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import smollm2_pipeline as sp  # noqa: E402

# (mode, step tokens, target forwards) per prompt: tau = step tokens / forwards
MODES = (("target", 10, 10), ("dflash_base", 10, 5), ("dflash_domino", 10, 4), ("dflash_headonly", 10, 5))


def _work(tmp_path: Path, trained: tuple[str, ...]) -> Path:
    work = tmp_path / "work"
    (work / "eval").mkdir(parents=True)
    lines = [json.dumps({"kind": "greedy", "set": s, "idx": i, "mode": m, "tokens": t, "seconds": 1.0,
                         "decode_steps": n, "step_tokens": t, "reached": [n], "accepted": [n - 1],
                         "identical": True})
             for s in sp.EVAL_SETS for i in range(3) for m, t, n in MODES]
    (work / "eval" / "greedy_0of1.jsonl").write_text("\n".join(lines) + "\n")
    for name in trained:
        (work / f"training_{name}.json").write_text(json.dumps({"steps": 10}))
    return work


@pytest.fixture(autouse=True)
def _dflash_only():
    saved = list(sp.FAMILIES)
    sp.set_families(["dflash"])
    yield
    sp.set_families(saved)


def test_an_unfinished_drafter_is_left_out_of_the_report(tmp_path):
    work = _work(tmp_path, ("dflash_base", "dflash_domino"))
    assert sp.trained(work, "dflash_base") and not sp.trained(work, "dflash_headonly")
    report = sp.stage_report(work, tmp_path / "r.json", max_new_tokens=96, command="test")
    for s in sp.EVAL_SETS:
        entry = report["dflash"][s]
        assert entry["tau_base"] == pytest.approx(2.0) and entry["tau_domino"] == pytest.approx(2.5)
        assert entry["tau_ratio_domino_over_base"] == pytest.approx(1.25)
        assert not any("headonly" in k for k in entry)
        assert set(entry["per_slot_acceptance"]) == {"base", "domino"}
    assert set(report["dflash"]["not_trained"]) == {"dflash_headonly"}
    assert set(report["dflash"]["training_budget"]) == {"base", "domino"}


def test_every_finished_drafter_is_reported(tmp_path):
    work = _work(tmp_path, ("dflash_base", "dflash_domino", "dflash_headonly"))
    report = sp.stage_report(work, tmp_path / "r.json", max_new_tokens=96, command="test")
    assert report["dflash"]["gsm8k"]["tau_headonly"] == pytest.approx(2.0)
    assert "not_trained" not in report["dflash"]


def _add_timing(work: Path, modes: tuple[str, ...]) -> None:
    """Timing records (tokens / seconds per prompt) of the given modes: target 10 tok/s, base 20, domino 30."""
    rate = {"target": 10.0, "dflash_base": 20.0, "dflash_domino": 30.0, "dflash_headonly": 25.0}
    lines = [json.dumps({"kind": "timing", "set": s, "idx": i, "mode": m, "tokens": 10, "seconds": 10 / rate[m],
                         "decode_steps": 5, "step_tokens": 10, "reached": [5], "accepted": [4]})
             for s in sp.EVAL_SETS for i in range(2) for m in modes]
    (work / "eval" / "timing_0of1.jsonl").write_text("\n".join(lines) + "\n")


def test_a_drafter_without_timing_records_gets_no_speedup_and_takes_none_from_the_others(tmp_path):
    # a head-only drafter grafted in a later session is decoded, not timed
    work = _work(tmp_path, ("dflash_base", "dflash_domino", "dflash_headonly"))
    _add_timing(work, ("target", "dflash_base", "dflash_domino"))
    entry = sp.stage_report(work, tmp_path / "r.json", max_new_tokens=96, command="test")["dflash"]["gsm8k"]
    assert entry["speedup_base"] == pytest.approx(2.0) and entry["speedup_domino"] == pytest.approx(3.0)
    assert "speedup_headonly" not in entry and set(entry["tokens_per_s"]) == {"base", "domino"}
    assert entry["tau_headonly"] == pytest.approx(2.0)
    _add_timing(work, ("target", "dflash_base", "dflash_domino", "dflash_headonly"))  # timed: reported
    entry = sp.stage_report(work, tmp_path / "r.json", max_new_tokens=96, command="test")["dflash"]["gsm8k"]
    assert entry["speedup_headonly"] == pytest.approx(2.5)
    _add_timing(work, ("target", "dflash_base"))  # + Domino untimed: no speedups at all
    entry = sp.stage_report(work, tmp_path / "r.json", max_new_tokens=96, command="test")["dflash"]["gsm8k"]
    assert not any(k.startswith("speedup_") for k in entry)


def test_a_family_without_its_base_or_domino_run_has_no_rows(tmp_path):
    work = _work(tmp_path, ("dflash_base",))
    report = sp.stage_report(work, tmp_path / "r.json", max_new_tokens=96, command="test")
    assert set(report["dflash"]) == {"not_trained"}
    assert set(report["dflash"]["not_trained"]) == {"dflash_domino", "dflash_headonly"}


FIXTURES = REPO / "tests" / "fixtures" / "bench_records"


def _pooled(recs: list[dict], kind: str, eval_set: str, mode: str) -> dict:
    """What the report must say of one (kind, set, mode), recomputed here from the raw records:
    tau = tokens the verify steps produced / target forwards, tokens/s pooled over prompts."""
    mine = [r for r in recs if (r["kind"], r["set"], r["mode"]) == (kind, eval_set, mode)]
    return {"tau": sum(r["step_tokens"] for r in mine) / sum(r["decode_steps"] for r in mine),
            "tokens_per_s": sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine), "n": len(mine)}


def _fixture_records(run: str) -> list[dict]:
    return [json.loads(line) for path in sorted((FIXTURES / run / "eval").glob("*.jsonl"))
            for line in path.read_text().splitlines()]


def test_the_report_of_real_device_records(tmp_path):
    """Two prompts per set of the table's DFlash run (tests/fixtures/bench_records/, cut from
    bench/results/smollm2_h200_gpu_block16_long2): its head-only drafter was grafted a session
    later and decoded without timing, so it has a tau and no speedup."""
    run = "smollm2_h200_gpu_block16_long2"
    recs = _fixture_records(run)
    report = sp.stage_report(FIXTURES / run, tmp_path / "r.json", max_new_tokens=96, command="test")
    for s in sp.EVAL_SETS:
        entry = report["dflash"][s]
        for v in ("base", "domino", "headonly"):
            assert entry[f"tau_{v}"] == pytest.approx(_pooled(recs, "greedy", s, f"dflash_{v}")["tau"])
            assert entry["t1"][f"tau_{v}"] == pytest.approx(_pooled(recs, "t1", s, f"dflash_{v}")["tau"])
        assert entry["tau_ratio_domino_over_base"] == pytest.approx(entry["tau_domino"] / entry["tau_base"])
        assert entry["tau_domino"] > entry["tau_base"] > 1.0
        target = _pooled(recs, "timing", s, "target")["tokens_per_s"]
        assert entry["target_tokens_per_s"] == pytest.approx(target)
        for v in ("base", "domino"):
            assert entry[f"speedup_{v}"] == pytest.approx(_pooled(recs, "timing", s, f"dflash_{v}")["tokens_per_s"] / target)
        assert "speedup_headonly" not in entry and set(entry["tokens_per_s"]) == {"base", "domino"}
        assert entry["identical_to_target"] is True
        assert entry["num_prompts_greedy"] == 2 and entry["num_prompts_timing"] == 2 and entry["t1"]["num_prompts"] == 2
        assert entry["domino_over_base_tokens_per_s_per_prompt"]["n"] == 2
        assert len(entry["per_slot_acceptance"]["domino"]) == 15  # block 16
    assert report["dflash"]["training_budget"]["base"]["steps"] == report["dflash"]["training_budget"]["domino"]["steps"] == 3000
    assert report["git_sha"] == "d8f89d44aaaf7492d0fd2ca3d232479d1966d4b0"  # environment.json, copied
    assert report["eval"]["sets"]["gsm8k"] == "100 GSM8K test questions (chat template)"


def test_a_base_model_report_describes_plain_text_prompts(tmp_path, monkeypatch):
    """Gemma-3-270M (--target gemma3): no chat template, and a head-only drafter whose training the
    device call cut off is left out with its reason."""
    monkeypatch.setenv("DOMINO_GRAFT_CACHE", str(tmp_path / "no-assets"))  # needs none
    saved = sp.TARGET
    sp.set_target("gemma3")
    try:
        report = sp.stage_report(FIXTURES / "gemma3_h200", tmp_path / "r.json", max_new_tokens=96, command="test")
    finally:
        sp.set_target(saved)
    recs = _fixture_records("gemma3_h200")
    assert "chat template" not in json.dumps(report["eval"]["sets"])
    assert report["recipes"] == {"dflash": "recipes/gemma3_dflash.yaml"}
    assert set(report["dflash"]["not_trained"]) == {"dflash_headonly"}
    for s in sp.EVAL_SETS:
        entry = report["dflash"][s]
        assert entry["tau_domino"] == pytest.approx(_pooled(recs, "greedy", s, "dflash_domino")["tau"])
        assert entry["identical_to_target"] is True and "t1" not in entry  # no T = 1 records
        assert not any("headonly" in k for k in entry)


def test_git_sha_names_the_commit_given_for_code_outside_its_checkout(monkeypatch):
    from domino_graft.artifacts.provenance import git_sha

    monkeypatch.setenv("DG_GIT_SHA", "621adf70df93733ee9fa122cbaaaf955fe1c86c7")
    assert git_sha() == "621adf70df93733ee9fa122cbaaaf955fe1c86c7"
    monkeypatch.delenv("DG_GIT_SHA")
    assert git_sha() != "621adf70df93733ee9fa122cbaaaf955fe1c86c7"  # from git (or None without one)


def test_the_families_report_keeps_both_dspark_graft_modes(tmp_path):
    """The report of issue #29's run (DSpark with both graft modes, P-EAGLE), built from two prompts
    per set of its records (tests/fixtures/bench_records/smollm2_h200_families): the better DSpark
    graft mode is the Domino row, both modes kept. That the committed report is its full records'
    report is `python experiments/check_results.py`'s job (it reads bench/results; tests do not)."""
    saved = list(sp.FAMILIES)
    try:
        sp.set_families(["dspark", "peagle"])
        report = sp.stage_report(FIXTURES / "smollm2_h200_families", tmp_path / "r.json", max_new_tokens=96,
                                 command="test")
    finally:
        sp.set_families(saved)
    recs = _fixture_records("smollm2_h200_families")
    for s in sp.EVAL_SETS:
        entry = report["dspark"][s]
        taus = {v: _pooled(recs, "greedy", s, f"dspark_{v}")["tau"] for v in ("base", "domino", "domino-inplace")}
        best = max(("domino", "domino-inplace"), key=taus.get)
        assert entry["best_domino_variant"] == best and entry["tau_best_domino"] == pytest.approx(taus[best])
        assert entry["tau_ratio_best_domino_over_base"] == pytest.approx(taus[best] / taus["base"])
        for fam in ("dspark", "peagle"):
            assert report[fam][s]["num_prompts_greedy"] == report[fam][s]["t1"]["num_prompts"] == 2
            assert report[fam][s]["identical_to_target"] is True
