"""The SmolLM2 benchmark pipeline (experiments/smollm2_pipeline.py) end to end at its smoke scale:
real SmolLM2 target, every stage, on the CPU (opt-in: fetches assets, ~4 minutes)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_smollm2_pipeline_smoke(tmp_path):
    out = tmp_path / "report.json"
    pipe = [sys.executable, str(REPO / "experiments" / "smollm2_pipeline.py"), "--work", str(tmp_path / "work"),
            "--scale", "smoke"]
    # the data stage as the GPU script runs it: the prompts, two regeneration shards, a merge
    subprocess.run(pipe + ["--stages", "prompts"], check=True, cwd=REPO, timeout=1200)
    for shard in ("0/2", "1/2"):
        subprocess.run(pipe + ["--stages", "data", "--shard", shard], check=True, cwd=REPO, timeout=1200)
    cmd = pipe + ["--stages", "data,train,eval,report", "--max-per-set", "1", "--timing-prompts", "1",
                  "--t1-prompts", "1", "--max-new-tokens", "10", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=REPO, timeout=1200)
    report = json.loads(out.read_text())
    for fam in ("dflash", "medusa"):
        for s in ("humaneval", "gsm8k"):
            entry = report[fam][s]
            # greedy speculation reproduces the target token for token, for every drafter variant
            assert entry["identical_to_target"] is True
            assert entry["num_prompts_greedy"] == 1 and entry["t1"]["num_prompts"] == 1
            assert all(entry[f"tau_{v}"] >= 1.0 for v in ("base", "domino", "headonly"))
            assert entry["speedup_base"] > 0 and entry["target_tokens_per_s"] > 0
        budgets = report[fam]["training_budget"]
        assert budgets["base"]["steps"] == budgets["domino"]["steps"], "base and Domino must get the same budget"
    assert report["data"]["by_source"] == {"gsm8k-symbolic": 6, "code": 6}
    assert report["data"]["regen_shards"] == 2
    # responses already in the work dir (an earlier call's, or an earlier run's copied in) are kept
    regen = tmp_path / "work" / "train.regen.jsonl"
    assert report["data"]["sha256"] == hashlib.sha256(regen.read_bytes()).hexdigest()
    stamp = regen.stat().st_mtime_ns
    subprocess.run(pipe + ["--stages", "data"], check=True, cwd=REPO, timeout=1200)
    assert regen.stat().st_mtime_ns == stamp, "the data stage regenerated over existing responses"
    # the merged file keeps the prompt file's order, one response per prompt
    work = tmp_path / "work"
    prompt_ids = [json.loads(line)["id"] for line in (work / "train_prompts.jsonl").open()]
    assert [json.loads(line)["id"] for line in (work / "train.regen.jsonl").open()] == prompt_ids


@pytest.mark.slow
def test_profile_train_reports_step_times_and_ops(tmp_path):
    """bench/training.py at the smoke scale on the CPU: a pipeline drafter applied and stepped,
    its step times, its busiest ops and the profiler's table written (opt-in: the real target)."""
    work = tmp_path / "work"
    work.mkdir()
    rows = [json.dumps({"messages": [{"role": "user", "content": f"Count from {i}."},
                                     {"role": "assistant", "content": " ".join(str(i + j) for j in range(40))}]})
            for i in range(12)]
    (work / "train.regen.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "prof.json"
    subprocess.run([sys.executable, str(REPO / "bench" / "training.py"), "--work", str(work), "--scale", "smoke",
                    "--names", "peagle_base", "--warmup", "0", "--steps", "2", "--profile", "1", "--out", str(out)],
                   check=True, cwd=REPO, timeout=900)
    d = json.loads(out.read_text())["drafters"]["peagle_base"]
    assert len(d["step_s"]) == 2 and all(t > 0 for t in d["step_s"])
    assert d["top_ops"] and d["top_ops"][0]["self_ms_per_step"] > 0 and d["time_kind"] == "self_cpu_time_total"
    assert "aten::" in (work / "peagle_base.profile.txt").read_text()
