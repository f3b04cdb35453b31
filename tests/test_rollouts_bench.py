"""bench/rollouts.py at tiny scale on the CPU: more prompts than rows, each mode through serve's worker
(rows refilled as they end), the report's keys, and every greedy prompt's tokens under + Domino equal to
the target alone's."""

from __future__ import annotations

import json
import random

from tests.test_concurrency_bench import load_module


def test_rollouts_bench_smoke(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setenv("DG_GIT_SHA", "abc123")
    rng = random.Random(1)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [rng.randrange(2, 95) for _ in range(n)]}) + "\n"
                               for n in (3, 17, 1, 9, 6, 4, 12)))
    out = tmp_path / "rollouts.json"
    script = load_module("rollouts")
    assert script.main(["--run", str(tiny_run), "--prompts", str(prompts), "--num-prompts", "7", "--concurrency",
                        "1,3", "--temperatures", "0,1", "--max-new-tokens", "10", "--rounds", "1",
                        "--verify-budget", "full", "--dtype", "fp32", "--device", "cpu", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["commit"] == "abc123" and "--concurrency 1,3" in rep["command"]
    rows = rep["by_concurrency"]
    assert [(r["concurrency"], r["temperature"]) for r in rows] == [(1, 0.0), (3, 0.0), (1, 1.0), (3, 1.0)]
    for r in rows:
        assert r["num_prompts"] == 7 and r["target_tokens_per_s"] > 0 and r["domino_tokens_per_s"] > 0
        assert 7 <= r["target_tokens"] <= 70 and 7 <= r["domino_tokens"] <= 70
        assert len(r["walls_s"]["target"]) == len(r["walls_s"]["domino"]) == 1
        for mode in ("target", "domino"):  # the timed pass's admissions: calls, and seconds only where calls ran
            calls, secs = r[f"{mode}_timed_admissions"], r[f"{mode}_timed_admission_s"]
            assert 0 <= calls <= r[f"{mode}_admitted_in_place"] and (secs > 0) == (calls > 0)
            assert (r[f"{mode}_timed_rebuild_s"] > 0) == (r["concurrency"] > 1)  # each pass starts a batch (B > 1)
        (k, blocks), = r["domino_blocks_by_k"].items()  # --verify-budget full: every timed block verifies all K
        assert r["target_untimed_passes"] == r["domino_untimed_passes"] == 1  # (measured arms settle on CUDA only)
        assert r.get("domino_outcomes") is None  # no windows off CUDA (and no auto budget here): nothing measured
        assert int(k) > 0 and blocks > 0 and 0 <= r["domino_accepted_per_row_step"] <= int(k)
        if r["temperature"] == 0:
            assert r["identical_to_target"] is True and r["not_identical"] == 0
            assert r["domino_tokens"] == r["target_tokens"]
        else:
            assert "identical_to_target" not in r
    # 7 prompts through 3 rows: the later prompts joined a batch in flight or a rebuilt one
    three = rows[1]
    assert three["domino_rebuilds"] + three["domino_admitted_in_place"] >= 3
