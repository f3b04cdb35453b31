#!/usr/bin/env bash
# One GPU call (run tool, carry .whl; pass DG_GIT_SHA: the device copy's own HEAD is not the tree it runs):
# small_linear's -m gpu bit tests (a row's bits at every M through the engine's path, SmolLM2's four
# projections and the small weights kept off cuBLAS included), then a batched chain step's phases at
# B = 16 and 64 (bench/batched_overhead.py --phases: K' = 0 and 3; SmolLM2 shape, random weights) on this
# tree's tiles and host bookkeeping, against experiments/linear_tiers' and 2db8afa's phase files.
set -u
source experiments/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
cp -r tests recipes pyproject.toml models /tmp/dg/ && rm -rf /tmp/dg/tests/serving  # (the image lacks httpx2)
(cd /tmp/dg && timeout "${TESTS_S:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/kernels/test_small_linear.py > "$OUT/gpu_tests_small_linear.log" 2>&1; echo "tests rc $?")
tail -3 "$OUT/gpu_tests_small_linear.log"
timeout "${PHASES_S:-200}" python3 bench/batched_overhead.py --batches 16,64 --max-new-tokens 64 --phases 0,3,7 \
  --no-cprofile --out "$OUT/${DG_GIT_SHA:-unknown}_phases_t0.json" > "$OUT/phases_t0.log" 2>&1
echo "phases rc $?"
tail -12 "$OUT/phases_t0.log"
