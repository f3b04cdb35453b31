#!/usr/bin/env bash
# One GPU call (run tool, carry .whl): small_linear's -m gpu tests (a row's bits at every M through the engine's
# path, SmolLM2's four projections included: correctness first, should the call be cut short), then SmolLM2's
# graphed forward under the engine's tier rules against the rules before 64 x 16 tiles and
# CUBLAS_MIN_WEIGHT_BYTES (experiments/linear_tiers.py).
set -u
source experiments/gpu_env.sh
# DG_GIT_SHA: pass it (the device copy's own HEAD is not the tree it runs)
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
cp -r tests recipes pyproject.toml models /tmp/dg/ && rm -rf /tmp/dg/tests/serving  # (the image lacks httpx2)
(cd /tmp/dg && timeout "${TESTS_S:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/kernels/test_small_linear.py > "$OUT/gpu_tests_small_linear.log" 2>&1; echo "tests rc $?")
tail -3 "$OUT/gpu_tests_small_linear.log"
timeout "${TIERS_S:-150}" python3 experiments/linear_tiers.py --variants default,before --rounds 3 --profile "" \
  --out "$OUT/linear_tiers_policy.json" > "$OUT/linear_tiers_policy.log" 2>&1
echo "tiers rc $?"
grep -h "^{'B'" "$OUT/linear_tiers_policy.log"
