"""The benchmark suite's harness (bench/harness.py) and its per-kernel entries (bench/kernels.py) on
the CPU: spread and timing, gzipped reports, the results index built from a folder of reports,
two kernel entries end to end. Nothing here reads bench/results."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import harness  # noqa: E402


def test_spread_and_time_cuda():
    s = harness.spread([3.0, 1.0, 2.0, 10.0])
    assert s["ms"] == 2.5 and s["min_ms"] == 1.0 and s["max_ms"] == 10.0 and s["n"] == 4
    assert s["p25_ms"] <= s["ms"] <= s["p75_ms"]
    calls = []
    t = harness.time_cuda(lambda: calls.append(1), iters=4, warmup=2)
    assert len(calls) == 6 and t["n"] == 4 and t["ms"] >= 0


def test_environment_names_where_a_number_was_measured(monkeypatch):
    monkeypatch.setenv("DG_GIT_SHA", "abc1234")
    env = harness.environment("python bench/x.py --out y")
    assert env["commit"] == "abc1234" and env["command"] == "python bench/x.py --out y"
    assert {"gpu", "torch", "triton", "date"} <= set(env)


def test_reports_read_plain_or_gzipped_and_the_index(tmp_path):
    report = {"git_sha": "d735f8a", "command": "python bench/a.py", "hardware": {"device": "NVIDIA H200"},
              "section": {"date": "not the file's", "command": "nor this"}}
    (tmp_path / "a_h200.json").write_text(json.dumps(report))
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(json.dumps({"n": 1}).encode()))
    (tmp_path / "r.jsonl.gz").write_bytes(gzip.compress(b'{"i": 0}\n{"i": 1}\n'))
    assert harness.read_json(tmp_path / "a_h200.json") == report
    assert harness.read_json(tmp_path / "b.json.gz") == {"n": 1}
    assert harness.read_jsonl(tmp_path / "r.jsonl.gz") == [{"i": 0}, {"i": 1}]
    (tmp_path / "index.json").write_text("{}")  # the index itself is not a row
    rows = harness.index_rows(tmp_path, root=tmp_path.parent)
    assert [r for r in rows if r["file"].endswith("a_h200.json")] == [{"file": f"{tmp_path.name}/a_h200.json", "gpu": "NVIDIA H200", "commit": "d735f8a",
                     "date": None, "command": "python bench/a.py"}]


def test_kernel_entries_on_the_cpu(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "k.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "kernels.py"), "row_norm", "head_ce", "--smoke",
                        "--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert [row["kernel"] for row in rep["rows"]] == ["row_norm", "head_ce"] and rep["command"].endswith(str(out))
    assert all(row["kernel_ms"]["n"] == 2 for row in rep["rows"])
    r = subprocess.run([sys.executable, str(REPO / "bench" / "kernels.py"), "cublas", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown kernel(s) cublas; valid: small_linear" in r.stderr
