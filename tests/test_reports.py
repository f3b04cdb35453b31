"""What the reports say (issue #25): bench rates with the counts behind them, timings of toy
models or on a CPU marked as not results, slots numbered 1..K in the plan, train and bench."""

from __future__ import annotations

import json

import pytest
import torch

from domino_graft.benchmark import format_report, timing_note
from tests.decoding.test_decoding import run_command


def _report(**over) -> dict:
    """A bench report as run_bench writes it (the keys format_report reads)."""
    rep = {
        "recipe": {"name": "r"}, "num_prompts": 5, "max_new_tokens": 64, "temperature": 0.0, "device": "cuda:0",
        "hardware": {"device": "NVIDIA H200"}, "target_tokens_per_s": 42.0, "timing_note": None,
        "tau": 2.5, "tokens_per_s": 90.0, "speedup": 2.14, "identical_to_target": True,
        "per_slot_acceptance": [311 / 510, 0.5, None], "slot_accepted": [311, 100, 0], "slot_reached": [510, 200, 0],
        "base": {"tau": 2.0, "tokens_per_s": 80.0, "speedup": 1.9, "identical_to_target": True,
                 "per_slot_acceptance": [1.0, 0.0, None]},
        "base_slot_accepted": [1, 0, 0], "base_slot_reached": [1, 1, 0],
        "notes": [],
    }
    rep.update(over)
    return rep


def test_acceptance_rows_show_the_counts_behind_each_rate():
    text = format_report(_report())
    rows = {int(x.split()[0]): x for x in text.splitlines() if x.startswith("    ") and x.split()[0].isdigit()}
    assert sorted(rows) == [1, 2, 3]  # slot j = 1..K
    assert "1.00 (1/1)" in rows[1] and "0.61 (311/510)" in rows[1]  # a 1.00 from 1 of 1 says so
    assert "0.00 (0/1)" in rows[2] and "0.50 (100/200)" in rows[2]
    assert "- (0/0)" in rows[3]
    assert "proposal j of 3 after the anchor" in text
    assert "NOT meaningful" not in text and "tokens/s*" not in text  # a real target on a GPU: timings stand


def test_a_timing_note_marks_the_speed_columns():
    note = timing_note(_FakeTarget(10, "random"), "cpu")
    text = format_report(_report(timing_note=note, device="cpu"))
    header = next(x for x in text.splitlines() if "tau" in x and "identical" in x)
    assert "tokens/s*" in header and "speedup*" in header
    flat = " ".join(x.strip() for x in text.splitlines())
    assert "* tokens/s and speedup are NOT meaningful here" in flat and "docs/results.md" in flat


class _FakeTarget(torch.nn.Module):
    """Only what timing_note reads: parameters (on the meta device: no memory) and identity."""

    def __init__(self, millions: int, kind: str):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(millions, 1_000_000, device="meta"))
        self.identity = {"kind": kind}


def test_timing_note_names_toy_targets_and_cpus_and_nothing_else():
    assert timing_note(_FakeTarget(135, "hf"), "cuda:0") is None  # SmolLM2-sized, on a GPU
    cpu = timing_note(_FakeTarget(135, "hf"), "cpu")
    assert "on a CPU speculation cannot make decoding faster" in cpu and "toy" not in cpu
    assert "docs/results.md" in cpu
    toy = timing_note(_FakeTarget(1, "hf"), "cuda:0")
    assert "a toy-sized model (1,000,000 parameters)" in toy and "CPU" not in toy
    assert "a random toy model" in timing_note(_FakeTarget(135, "random"), "cuda:0")


def test_bench_json_and_printout_carry_counts_and_the_cpu_note(tiny_run, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert run_command("bench", [str(tiny_run), "--limit", "2", "--max-new-tokens", "8", "--json", str(out),
                                 "--no-progress"]) == 0
    rep = json.loads(out.read_text())
    for prefix, d in (("", rep), ("base_", rep["base"])):
        reached, accepted = rep[f"{prefix}slot_reached"], rep[f"{prefix}slot_accepted"]
        assert len(reached) == len(accepted) == rep["num_slots"] == 7
        assert reached[0] > 0  # every verify step reaches slot 1
        assert d["per_slot_acceptance"] == [a / n if n else None for a, n in zip(accepted, reached)]
    assert rep["device"] == "cpu"
    assert "random toy model" in rep["timing_note"] and "on a CPU" in rep["timing_note"]
    text = capsys.readouterr().out
    assert f"({rep['slot_accepted'][0]}/{rep['slot_reached'][0]})" in text
    assert "NOT meaningful" in text and "tokens/s*" in text


def test_the_plan_numbers_slots_like_train_and_bench():
    from domino_graft.graft import plan_graft
    from domino_graft.recipe import load_recipe

    plan = plan_graft(load_recipe("tiny_dflash"))
    assert "7 proposals per block (slots 1..7 after the anchor)" in plan.format()


@pytest.mark.parametrize("with_k", [True, False])
def test_train_summary_lists_slots_1_to_k(with_k):
    from domino_graft.training.loop import format_summary

    s = {"steps_pooled": 10, "last_step": 30, "acc_base": [0.5, 0.4, 0.3, 0.2], "acc_final": [0.5, 0.45, None, 0.1],
         "tau_base": 1.5, "tau_final": 1.6}
    if with_k:
        s["num_slots"] = 3
    text = format_summary(s)
    table = text.split("slot   base    final\n", 1)[1].splitlines()
    slots = [int(x.split()[0]) for x in table if x.split()[0].isdigit()]
    if with_k:  # the extra trained position is reported apart, not as "slot 4"
        assert slots == [1, 2, 3]
        assert "the block's last position, which decoding never proposes: base / final 0.200 / 0.100" in text
    else:  # a summary written before num_slots was recorded: every trained position, as before
        assert slots == [1, 2, 3, 4] and "never proposes" not in text
