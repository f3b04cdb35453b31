"""experiments/code_prompts.py: every function of the `first` file (the python-puzzles asset) comes
before the shuffled stdlib and library functions, and HumanEval's names stay out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_puzzles_come_first_and_eval_names_stay_out(tmp_path):
    sys.path.insert(0, str(REPO / "experiments"))
    from code_prompts import code_prompts

    puzzles = tmp_path / "puzzles.jsonl"
    rows = [{"package": "algorithms", "module": f"algorithms.m{i}", "signature": f"def puzzle_{i}(xs: list) -> int:",
             "doc": f"Puzzle number {i}."} for i in range(5)]
    rows.append({"package": "algorithms", "module": "algorithms.x", "signature": "def has_close_elements(xs):",
                 "doc": "A HumanEval entry point's name."})
    puzzles.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = code_prompts(12, first=puzzles, exclude_names=frozenset({"has_close_elements"}))
    ids = [r["id"] for r in out]
    assert len(out) == 12
    assert sorted(ids[:5]) == sorted(f"puzzle/algorithms.m{i}/puzzle_{i}" for i in range(5))
    assert all(i.startswith("stdlib/") for i in ids[5:])  # then the shuffled rest
    assert not any("has_close_elements" in i for i in ids)
