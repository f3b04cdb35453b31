"""bench/tau_bootstrap.py: the paired prompt bootstrap of the table's τ ratios reproduces the table's
ratio exactly, brackets it, and refuses folders that did not decode the same prompts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import tau_bootstrap as tb  # noqa: E402
from tests.eval_records import write_eval_records  # noqa: E402


def _records(folder: Path, rows: list[tuple]) -> Path:
    return write_eval_records(folder, "greedy", rows)


def test_committed_bootstrap_reproduces_the_committed_table_ratios():
    boot = json.loads((REPO / "bench" / "results" / "tau_bootstrap_smollm2_h200.json").read_text())
    table = json.loads((REPO / "bench" / "results" / "smollm2_h200.json").read_text())
    rows = [(table[fam], res) for fam, res in boot["families"].items()] + \
        [(table["beside"][fam], res) for fam, res in boot["beside"].items()]
    assert len(rows) == len(table["combined_from"]) + len(table["beside"])
    for section, res in rows:
        for s, row in res["sets"].items():
            want = section[s]["tau_domino"] / section[s]["tau_base"]
            assert row["ratio"] == pytest.approx(want, rel=1e-12)
            lo, hi = row["bootstrap_ratio_95"]
            assert lo < row["ratio"] < hi


def test_ratio_is_the_mean_of_folders_and_the_bootstrap_brackets_it(tmp_path):
    a = _records(tmp_path / "a", [("x", 0, "dflash_base", 20, 10), ("x", 0, "dflash_domino", 30, 10),
                                  ("x", 1, "dflash_base", 10, 10), ("x", 1, "dflash_domino", 12, 10)])
    b = _records(tmp_path / "b", [("x", 0, "dflash_base", 22, 10), ("x", 0, "dflash_domino", 28, 10),
                                  ("x", 1, "dflash_base", 12, 10), ("x", 1, "dflash_domino", 16, 10)])
    tok, steps = tb.load([a, b], "dflash", "domino", "base")["x"]
    # pooled τ per folder: a 1.5 -> 2.1, b 1.7 -> 2.2; the table's ratio: mean 2.15 over mean 1.6
    assert float(tb.ratio_of_means(tok, steps)) == pytest.approx(2.15 / 1.6)
    boots = tb.bootstrap(tok, steps, 2000, seed=0)
    assert boots.min() <= 2.15 / 1.6 <= boots.max() and boots.min() < boots.max()
    same = tb.bootstrap(tok[..., [0, 0]], steps[..., [0, 0]], 200, seed=0)
    np.testing.assert_allclose(same, 1.0)  # a drafter against itself: every resample gives 1


def test_folders_with_different_prompts_or_missing_records_are_refused(tmp_path):
    a = _records(tmp_path / "a", [("x", 0, "dflash_base", 20, 10), ("x", 0, "dflash_domino", 30, 10)])
    b = _records(tmp_path / "b", [("x", 1, "dflash_base", 20, 10), ("x", 1, "dflash_domino", 30, 10)])
    with pytest.raises(ValueError, match="decoded different prompts"):
        tb.load([a, b], "dflash", "domino", "base")
    c = _records(tmp_path / "c", [("x", 0, "dflash_base", 20, 10)])
    with pytest.raises(ValueError, match="has no dflash_domino record of prompt 0"):
        tb.load([c], "dflash", "domino", "base")
    with pytest.raises(FileNotFoundError, match="no eval/greedy_"):
        tb.load([tmp_path], "dflash", "domino", "base")
