"""bench/serve_sweep.py at tiny scale on the CPU: two real servers (target alone, then speculation
under a fixed verify budget) driven over HTTP at one Poisson rate and one concurrency; the report's
points, the greedy identity between the two servers and across points, and both servers drained
(exit 0)."""

from __future__ import annotations

import json
import random

from tests.test_concurrency_bench import load_module


def test_serve_sweep_smoke(tiny_run, tmp_path):
    rng = random.Random(0)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [rng.randrange(2, 95) for _ in range(n)]}) + "\n"
                               for n in (3, 17, 1, 9)))
    out = tmp_path / "serve.json"
    script = load_module("serve_sweep")
    assert script.main(["--run", str(tiny_run), "--prompts", str(prompts), "--num-prompts", "4", "--max-tokens", "8",
                        "--rates", "50", "--concurrency", "2", "--max-batch", "2", "--dtype", "",
                        "--verify-budget", "2", "--rollout", "torch", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert [(p["mode"], p["kind"]) for p in rep["points"]] == [("target", "rate"), ("target", "concurrency"),
                                                                ("domino", "rate"), ("domino", "concurrency")]
    for p in rep["points"]:
        assert p["requests"] == 4 and p["errors"] == 0 and p["output_tokens"] > 4
        assert p["output_tokens_per_s"] > 0 and p["ttft_ms_p99"] >= p["ttft_ms_p50"] > 0
    assert rep["target_rows_equal_across_points"] is True
    assert [c["identical_to_target"] for c in rep["comparison"]] == [True, True]
    assert all(s["exit_code"] == 0 and s["health"]["status"] == "ok" for s in rep["servers"].values())
    assert rep["servers"]["domino"]["health"]["verify_budget"] == "2"
    assert rep["max_model_len"] == 17 + 8  # the longest prompt + max_tokens: what the warm start covers
    for s in rep["servers"].values():
        assert s["server_warm_start_s"] >= 0 and s["health"]["warm_start"]["positions"] == 25
        assert s["after_points"]["cache_kept"] is True
        # every request joined a built batch or a freed row of one
        assert s["batches"]["rebuilds"] >= 1 and s["batches"]["admitted_in_place"] >= 0
