"""bench/undecoded_prompts.py: for a run that never decoded some prompts, the prompts it missed,
like-for-like ratios of complete comparison runs, and the extra target forwards the missing
prompts would need to pull the whole set's ratio below a threshold (checked by plugging back)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import undecoded_prompts as up  # noqa: E402
from tests.eval_records import write_eval_records  # noqa: E402

# (idx, base forwards, + Domino forwards), 20 accepted tokens per prompt under both drafters
CUT = [(0, 10, 8), (1, 10, 9)]
FULL = [(0, 10, 9), (1, 10, 10), (2, 10, 5)]


def _folder(path: Path, rows) -> Path:
    return write_eval_records(path, "greedy", [("x", i, f"dflash_{v}", 20, n)
                                               for i, b, d in rows for v, n in (("base", b), ("domino", d))])


def test_the_missing_prompts_and_like_for_like_ratios(tmp_path):
    out = up.analyse(_folder(tmp_path / "cut", CUT), [_folder(tmp_path / "full", FULL)], "dflash")
    x = out["sets"]["x"]
    assert x["undecoded"] == [2] and x["decoded"] == 2
    assert x["ratio_decoded"]["ratio"] == pytest.approx((40 / 17) / (40 / 20))
    (full,) = x["comparison_ratio_on_the_same_prompts"].values()
    assert full["on_the_same_prompts"]["ratio"] == pytest.approx((40 / 19) / (40 / 20))  # prompts 0 and 1 only
    assert full["on_all_its_prompts"]["ratio"] == pytest.approx((60 / 24) / (60 / 30))
    assert x["per_prompt_extra_forwards"]["decoded_min"] == -2 and x["per_prompt_extra_forwards"]["decoded_max"] == -1
    assert list(x["per_prompt_extra_forwards"]["undecoded_in_comparison_runs"].values()) == [{2: -5}]


def test_the_extra_forwards_put_the_whole_set_exactly_at_the_threshold(tmp_path):
    rows = up.per_prompt(_folder(tmp_path / "cut", CUT), "dflash")["x"]
    extra = up.extra_forwards_to_fall_below(rows, 1, 1.05, 2.0)
    # the missing prompt: 20 tokens, base 10 forwards (tau 2.0), + Domino 10 + extra
    whole = ((40 + 20) / (17 + 10 + extra)) / ((40 + 20) / (20 + 10))
    assert whole == pytest.approx(1.05)


def test_a_comparison_run_must_cover_what_the_run_decoded(tmp_path):
    with pytest.raises(ValueError, match="did not decode every prompt"):
        up.analyse(_folder(tmp_path / "full", FULL), [_folder(tmp_path / "cut", CUT)], "dflash")
