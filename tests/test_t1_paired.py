"""bench/t1_paired.py: pooled τ as the report computes it, and per-prompt paired differences."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import t1_paired  # noqa: E402
from tests.eval_records import write_eval_records  # noqa: E402


def _records(folder: Path, rows: list[tuple]) -> None:
    write_eval_records(folder, "t1", rows + [("gsm8k", 0, "medusa_base", 1, 1)])  # another family: ignored


def test_pooled_tau_and_paired_differences(tmp_path):
    # prompt 0: base 20/10 = 2.0, domino 30/10 = 3.0; prompt 1: base 10/10 = 1.0, domino 15/10 = 1.5
    _records(tmp_path / "a", [("gsm8k", 0, "dflash_base", 20, 10), ("gsm8k", 0, "dflash_domino", 30, 10),
                              ("gsm8k", 1, "dflash_base", 10, 10), ("gsm8k", 1, "dflash_domino", 15, 10)])
    out = t1_paired.summarize(t1_paired.load([tmp_path / "a"], "dflash"))["gsm8k"]
    assert out["prompts"] == {"base": 2, "domino": 2}
    assert out["tau_pooled"] == {"base": 1.5, "domino": 2.25}
    diff = out["per_prompt_tau_difference"]["domino_minus_base"]
    assert diff["n"] == 2 and diff["mean"] == pytest.approx(0.75) and diff["stderr"] == pytest.approx(0.25)
    assert "domino_minus_headonly" not in out["per_prompt_tau_difference"]


def test_two_folders_are_independent_prompts(tmp_path):
    _records(tmp_path / "a", [("humaneval", 0, "dflash_base", 10, 10), ("humaneval", 0, "dflash_headonly", 20, 10)])
    _records(tmp_path / "b", [("humaneval", 0, "dflash_base", 10, 10), ("humaneval", 0, "dflash_headonly", 10, 10)])
    out = t1_paired.summarize(t1_paired.load([tmp_path / "a", tmp_path / "b"], "dflash"))["humaneval"]
    assert out["per_prompt_tau_difference"]["headonly_minus_base"]["n"] == 2
    assert out["per_prompt_tau_difference"]["headonly_minus_base"]["mean"] == pytest.approx(0.5)


def test_missing_records_are_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no eval/t1_"):
        t1_paired.load([tmp_path / "empty"], "dflash")
    _records(tmp_path / "a", [("gsm8k", 0, "dflash_base", 10, 10)])
    with pytest.raises(ValueError, match="no t1 records of family 'pard'"):
        t1_paired.load([tmp_path / "a"], "pard")
