"""bench/concurrency.py at tiny scale on the CPU: the report's keys, every row identical to the
target alone, the path each batch size took, and --deadline-s leaving a report behind."""

from __future__ import annotations

import importlib.util
import itertools
import json
import random

import pytest

from tests.conftest import REPO

ROW_KEYS = ("target_tokens_per_s", "base_tokens_per_s", "domino_tokens_per_s", "target_per_request_tokens_per_s",
            "base_per_request_tokens_per_s", "domino_per_request_tokens_per_s", "tau_base", "tau_domino",
            "identical_to_target", "identical_to_batch_target", "path", "kv_path", "complete",
            "speedup_domino_median_batch")


def load_module(name: str, folder: str = "bench"):
    spec = importlib.util.spec_from_file_location(f"{name}_bench", REPO / folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_script():
    return load_module("concurrency")


def run_bench(tiny_run, tmp_path, prompt_ids: list[list[int]], *extra: str):
    """bench/concurrency.py over these prompts on the CPU (fp32): (script, its args, the report)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": ids}) + "\n" for ids in prompt_ids))
    out = tmp_path / "concurrency.json"
    args = ["--run", str(tiny_run), "--prompts", str(prompts), "--num-prompts", str(len(prompt_ids)), *extra,
            "--dtype", "fp32", "--device", "cpu", "--out", str(out)]
    script = load_script()
    assert script.main(args) == 0
    return script, args, json.loads(out.read_text())


def test_concurrency_bench_smoke(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setenv("DG_GIT_SHA", "abc123")
    rng = random.Random(0)
    script, args, rep = run_bench(tiny_run, tmp_path, [[rng.randrange(2, 95) for _ in range(n)] for n in (3, 17, 1, 9, 6)],
                                  "--batch-sizes", "1,2", "--temperatures", "0,1", "--max-new-tokens", "10")
    out = tmp_path / "concurrency.json"
    assert rep["git_sha"] == "abc123" and rep["dtype"] == "fp32" and rep["device"] == "cpu"
    assert rep["torch"] and "--batch-sizes 1,2" in rep["command"] and rep["num_prompts"] == 5
    assert set(rep["rows"]) == {"1", "2", "1@T1", "2@T1"}
    # the flat table: greedy rows with their identity, sampled rows (T = 1) without one
    assert [(r["B"], r["temperature"]) for r in rep["by_batch"]] == [(1, 0.0), (2, 0.0), (1, 1.0), (2, 1.0)]
    for r in rep["by_batch"]:
        assert r["target_tokens_per_s"] > 0 and r["drafter_tokens_per_s"] > 0 and r["domino_tokens_per_s"] > 0
        assert r["identical_to_target"] is (True if r["temperature"] == 0 else None)
    for key in ("1@T1", "2@T1"):
        sampled = rep["rows"].pop(key)
        assert sampled["complete"] and sampled["num_prompts"] == 5 and sampled["tau_domino"] >= 1.0
    for key, row in rep["rows"].items():
        for k in ROW_KEYS:
            assert row[k] is not None, (key, k)
        assert row["identical_to_target"] is True and row["complete"] is True, row
        assert row["identical_to_batch_target"] is True and row["not_identical_to_batch_target"] == {"base": 0,
                                                                                                   "domino": 0}
        assert row["num_prompts"] == 5 and row["tau_base"] >= 1.0 and row["domino_tokens_per_s"] > 0
    assert rep["rows"]["1"]["path"]["decoder"].startswith("solo")
    assert rep["rows"]["2"]["path"]["decoder"].startswith("batched")
    assert rep["rows"]["2"]["kv_path"]["domino"] == ["static"] and rep["rows"]["2"]["num_batches"] == 3
    batches = rep["rows"]["2"]["batches"]  # each batch's walls, the modes in the six orders by turns
    assert [b["order"] for b in batches] == script.ORDERS[:3] and [b["start"] for b in batches] == [0, 2, 4]
    pairs = [(o[i], o[i + 1]) for o in script.ORDERS for i in range(2)]  # each mode follows each other twice
    assert len(script.ORDERS) == 6 and all(pairs.count(p) == 2 for p in set(pairs)) and len(set(pairs)) == 6
    for n in range(2, 17, 2):  # any even count of batches: each mode before each other as often as after it
        before = [sum(o.index(a) < o.index(b) for o in itertools.islice(itertools.cycle(script.ORDERS), n))
                  for a, b in itertools.permutations(script.MODES, 2)]
        assert before == [n // 2] * 6, (n, before)
    assert all(set(b["wall_s"]) == {"target", "base", "domino"} and min(b["wall_s"].values()) > 0 for b in batches)
    ratios = sorted((b["tokens"]["domino"] / b["wall_s"]["domino"]) / (b["tokens"]["target"] / b["wall_s"]["target"])
                    for b in batches)
    assert rep["rows"]["2"]["speedup_domino_median_batch"] == pytest.approx(ratios[1])  # the median of three
    assert rep["rows"]["2"]["path"]["drafter"] == "static over the ragged batch, eager"

    plot = load_module("plot_concurrency", "experiments")
    pts = plot.speedups(rep)
    assert [p[0] for p in pts] == [1, 2] and all(p[3] > 0 for p in pts)
    plot.main(str(out), str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").stat().st_size > 1000

    late = tmp_path / "late.json"
    assert script.main(args[:-1] + [str(late), "--deadline-s", "0"]) == 0
    rep = json.loads(late.read_text())
    assert rep["rows"] == {} and rep["stopped"].startswith("deadline")


def test_concurrency_bench_with_a_verify_budget(tiny_run, tmp_path):
    """--verify-budget N: the batched rows verify N drafts a step (the K' histogram in the row) and
    stay identical to the target alone; at B = 1 the speculative modes take the batched chain one
    row at a time (where the budget lives), the target alone its solo path; a bad budget is refused
    by name before any decode."""
    script, args, rep = run_bench(tiny_run, tmp_path, [list(range(2, 2 + n)) for n in (5, 11, 3)],
                                  "--batch-sizes", "1,3", "--max-new-tokens", "8", "--verify-budget", "1")
    assert rep["verify_budget"] == "1"
    for key in ("1", "3"):
        row = rep["rows"][key]
        assert row["identical_to_target"] is True, key
        assert set(row["verify_budget_k"]["domino"]) == {"1"} and row["verify_budget_k"]["domino"]["1"] > 0
    assert "batched chain one row at a time" in rep["rows"]["1"]["path"]["decoder"]
    # auto over a cost table (CPU): the warm-up also runs each shorter K', the rows stay identical
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"step_ms": {"1": {"1": 1.0, "8": 1.1}, "3": {"1": 1.0, "8": 1.3}},
                                 "propose_ms": {"1": 0.1, "3": 0.2}}))
    _, _, rep = run_bench(tiny_run, tmp_path, [list(range(2, 2 + n)) for n in (5, 11, 3)], "--batch-sizes", "1,3",
                          "--max-new-tokens", "8", "--verify-budget", "auto", "--verify-costs", str(costs))
    assert all(rep["rows"][key]["identical_to_target"] is True for key in ("1", "3"))
    assert rep["rows"]["3"]["verify_budget_k"]["domino"] and rep["rows"]["3"]["verify_budget_last"]["domino"]
    batch = rep["rows"]["3"]["batches"][0]  # the batch's own budget record beside its walls
    assert set(batch["domino"]) == {"starts_committed", "arm", "k_hist"} and batch["domino"]["k_hist"]
    assert batch["domino"]["arm"] is None  # off CUDA no whole decode is measured: the step model decides
    assert rep["rows"]["3"]["verify_budget_outcomes"] == {"base": None, "domino": None}
    assert batch["graphs_captured"] == {"target": 0, "base": 0, "domino": 0}  # a CPU captures none
    with pytest.raises(SystemExit):
        script.main(args + ["--verify-budget", "-2"])


def test_resume_keeps_the_earlier_calls_rows_and_measures_the_rest(tiny_run, tmp_path):
    """--resume: a second call (the first cut short by its time limit) keeps the complete rows of the
    earlier report, measures only the others, and records both calls."""
    rng = random.Random(1)
    prompts = [[rng.randrange(2, 95) for _ in range(n)] for n in (4, 9, 2)]
    script, args, first = run_bench(tiny_run, tmp_path, prompts, "--batch-sizes", "2", "--max-new-tokens", "6")
    earlier = tmp_path / "earlier.json"
    (tmp_path / "concurrency.json").rename(earlier)
    measured = []
    real = script.measure
    script.measure = lambda engine, items, b, *a, **kw: measured.append(b) or real(engine, items, b, *a, **kw)
    assert script.main(args[:args.index("--batch-sizes")] + ["--batch-sizes", "1,2"]
                       + args[args.index("--batch-sizes") + 2:] + ["--resume", str(earlier)]) == 0
    rep = json.loads((tmp_path / "concurrency.json").read_text())
    assert measured == [1] and set(rep["rows"]) == {"1", "2"}
    assert rep["rows"]["2"] == first["rows"]["2"] and rep["rows"]["1"]["identical_to_target"] is True
    assert len(rep["calls"]) == 2 and "--resume" in rep["calls"][1]["command"]


def test_rounds_time_every_batch_again(tiny_run, tmp_path):
    """--rounds 2: every batch decoded and timed twice, each time equal to the target alone."""
    rng = random.Random(2)
    prompts = [[rng.randrange(2, 95) for _ in range(n)] for n in (5, 3, 8)]
    _, _, rep = run_bench(tiny_run, tmp_path, prompts, "--batch-sizes", "2", "--max-new-tokens", "5", "--rounds", "2")
    row = rep["rows"]["2"]
    assert row["rounds"] == 2 and row["num_prompts"] == 6 and row["num_batches"] == 4 and row["complete"]
    assert row["identical_to_target"] is True


def test_min_batches_adds_rounds_only_where_batches_are_few():
    """--min-batches M: a B with fewer than M batches a round decodes its prompts again; others once."""
    from concurrency import rounds_for

    assert [rounds_for(b, 64, 1, 4) for b in (1, 8, 16, 32, 64)] == [1, 1, 1, 2, 4]
    assert rounds_for(64, 64, 3, 2) == 3 and rounds_for(3, 5, 1, 5) == 3  # 2 batches a round -> 3 rounds


def _batch(target_s: float, domino_s: float, tokens: int = 100) -> dict:
    return {"wall_s": {"target": target_s, "domino": domino_s}, "tokens": {"target": tokens, "domino": tokens}}


def test_the_speedup_interval_is_a_paired_bootstrap_over_the_batches(tmp_path, capsys):
    """speedup_interval: + Domino's tokens/s over the target's in resampled batches; identical walls give
    [1, 1], a constant 2x gives [2, 2], batches that scatter give an interval around the total's ratio, and
    --summarize prints it beside each row (a file that is not a report: one line, exit 2)."""
    script = load_script()
    assert script.speedup_interval({"batches": [_batch(0.1, 0.1)] * 8}) == [1.0, 1.0]
    assert script.speedup_interval({"batches": [_batch(0.1, 0.05)] * 8}) == [2.0, 2.0]
    assert script.speedup_interval({"batches": [_batch(0.1, 0.1)]}) is None  # one batch: no spread to resample
    rng = random.Random(3)
    scattered = [_batch(0.1, 0.1 * rng.uniform(0.8, 1.2)) for _ in range(32)]
    lo, hi = script.speedup_interval({"batches": scattered})
    total = sum(b["wall_s"]["target"] for b in scattered) / sum(b["wall_s"]["domino"] for b in scattered)
    assert lo < total < hi and hi - lo < 0.2
    row = {"batch_size": 4, "temperature": 1.0, "target_tokens_per_s": 1000.0, "base_tokens_per_s": 900.0,
           "domino_tokens_per_s": 1010.0, "speedup_domino_median_batch": 1.0, "identical_to_target": None,
           "complete": True, "batches": scattered}
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"rows": {"4@T1": row}}))
    assert script.main(["--summarize", str(report)]) == 0
    line = capsys.readouterr().out.splitlines()[-1].split("\t")
    assert line[:5] == ["4", "1", "1000", "1010", "1.010"] and line[-1] == f"{lo:.3f}-{hi:.3f}"
    assert script.main(["--summarize", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "missing.json: not a concurrency report" in err and "Traceback" not in err and len(err.splitlines()) == 1
