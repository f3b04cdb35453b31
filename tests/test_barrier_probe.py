"""bench/barrier_probe.py's smoke mode (the grid-barrier variants under Triton's interpreter) and
the barrier-name validation of the persistent pool rollout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_kernels import K, make_head  # sets TRITON_INTERPRET=1 without CUDA, before triton is imported

REPO = Path(__file__).resolve().parents[1]


def test_barrier_probe_smoke(tmp_path):
    out = tmp_path / "bp.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=".")
    proc = subprocess.run([sys.executable, "bench/barrier_probe.py", "--smoke", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["smoke"] and res["errors"] == []
    rows = {r["variant"]: r for r in res["micro"]}
    assert set(rows) == {"rmw", "volatile", "ld_acquire"}
    assert "interpreter" in rows["ld_acquire"]["skipped"]
    for variant in ("rmw", "volatile"):
        row = rows[variant]
        assert row["nprog"] == 1 and row["error_flag"] == 0, row
        assert row["counter_after"] == {"0": 0, "4": 4}, row  # N x NPROG arrivals per launch
        # unreachable targets: the launch ends, with the flag set and every arrival still counted
        assert row["timeout_check"] == dict(error_flag=1, counter_after=2, ok=True), row


def test_pool_rollout_persistent_barrier_name():
    pytest.importorskip("triton")
    from domino_graft.kernels import triton_persistent as tp

    assert tuple(tp.BARRIERS) == K.domino_rollout.PERSISTENT_BARRIERS  # the triton-free copy of the names
    none = dict.fromkeys(["toks", "table", "whh", "w1b", "w2", "ids", "vals", "zacc", "states", "pval", "pidx",
                          "draft", "bar", "err", "pure", "block_g"])
    with pytest.raises(ValueError, match="valid: rmw, volatile, ld_acquire"):
        tp.pool_rollout_persistent(**none, barrier="bogus")


def test_kernel_config_persistent_barrier():
    head = make_head(16, 20, 8, 97)
    with pytest.raises(ValueError, match="pool_persistent_barrier 'bogus': valid: rmw, volatile, ld_acquire"):
        K.make_rollout("triton_pool", head, pool_size=64, config=K.KernelConfig(pool_persistent_barrier="bogus"))
    roll = K.make_rollout("triton_pool", head, pool_size=64, config=K.KernelConfig(pool_persistent_barrier="volatile"))
    assert roll.config.pool_persistent_barrier == "volatile"
