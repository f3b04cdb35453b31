#!/usr/bin/env bash
# One GPU call (run tool, carry .whl; ~4 min on a fresh H100, ~1.5 min warm): speculative steps drafted ahead
# (decoding/batched.py "Drafted ahead") off / on by B and K' (bench/batched_overhead.py --ahead: the SmolLM2 shape,
# random weights), then the -m gpu tests that run it (tests/decoding/test_spec_ahead.py, test_batched_static.py).
# Session 43 ran these steps by hand at 306e71b (two calls: B = 1,16,64 with K' = 3,7, then B = 2,4,8 with
# K' = 3,7,15): bench/results/drafted_ahead_h100.json and drafted_ahead_h100/.
set -u
source experiments/gpu_env.sh
export DG_GIT_SHA=${DG_GIT_SHA:-unknown}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout "${AHEAD_S:-300}" python3 bench/batched_overhead.py --batches "${BATCHES:-1,2,4,8,16,64}" \
  --ahead "${KS:-3,7,15}" --max-new-tokens 96 --no-cprofile --out "$OUT/drafted_ahead.json" 2>&1 \
  | grep -v -i warn | tail -24
cp -r tests recipes pyproject.toml models /tmp/dg/
(cd /tmp/dg && timeout "${TESTS_S:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/decoding/test_spec_ahead.py tests/decoding/test_batched_static.py > "$OUT/gpu_tests_spec_ahead.log" 2>&1
  echo "tests rc $?")
tail -2 "$OUT/gpu_tests_spec_ahead.log"
