"""bench/greedy_replay.py: a replay's greedy decodes compared with the device's, per set and drafter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import greedy_replay  # noqa: E402
from tests.eval_records import write_eval_records  # noqa: E402


def _device(folder: Path) -> Path:
    return write_eval_records(folder, "greedy", [
        ("gsm8k", 0, "target", 96, 95), ("gsm8k", 0, "dflash_base", 95, 39, True),
        ("gsm8k", 0, "dflash_domino", 100, 31, True), ("gsm8k", 1, "dflash_base", 85, 23, True),
        ("gsm8k", 1, "dflash_domino", 86, 18, True), ("gsm8k", 0, "medusa_base", 90, 50, True)])


def test_counts_equal_and_differing_decodes(tmp_path):
    device = greedy_replay.decodes(_device(tmp_path / "dev"), "dflash")
    replay = greedy_replay.decodes(write_eval_records(tmp_path / "rep", "greedy", [
        ("gsm8k", 0, "dflash_base", 95, 39, True), ("gsm8k", 0, "dflash_domino", 100, 32, True),
        ("gsm8k", 1, "dflash_domino", 86, 18, True)]), "dflash")
    out = greedy_replay.compare(device, replay)["gsm8k"]
    assert set(out) == {"base", "domino"}  # the target's own decodes and other families are not drafters here
    assert out["base"]["decodes"] == 1 and out["base"]["same_forwards"] == 1
    dom = out["domino"]
    assert dom["decodes"] == 2 and dom["same_forwards"] == 1 and dom["max_abs_forward_difference"] == 1
    assert dom["identical_to_target_device"] and dom["identical_to_target_replay"]
    assert dom["forwards"] == [{"idx": 0, "device": 31, "replay": 32}, {"idx": 1, "device": 18, "replay": 18}]


def test_a_non_identical_replay_is_reported(tmp_path):
    device = greedy_replay.decodes(_device(tmp_path / "dev"), "dflash")
    replay = greedy_replay.decodes(write_eval_records(tmp_path / "rep", "greedy", [
        ("gsm8k", 1, "dflash_base", 85, 23, False)]), "dflash")
    row = greedy_replay.compare(device, replay)["gsm8k"]["base"]
    assert row["identical_to_target_device"] and not row["identical_to_target_replay"]


def test_decodes_the_device_never_made_are_refused(tmp_path):
    device = greedy_replay.decodes(_device(tmp_path / "dev"), "dflash")
    replay = greedy_replay.decodes(write_eval_records(tmp_path / "rep", "greedy", [
        ("humaneval", 3, "dflash_base", 85, 23, True)]), "dflash")
    with pytest.raises(ValueError, match="decodes the device records lack.*humaneval"):
        greedy_replay.compare(device, replay)
    with pytest.raises(ValueError, match="no greedy records of family 'pard'"):
        greedy_replay.decodes(tmp_path / "dev", "pard")
