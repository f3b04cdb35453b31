#!/usr/bin/env bash
# One GPU call (run tool, carry .whl): the projection tiers at the SmolLM2 shape (experiments/linear_tiers.py),
# the shipped drafter's batched propose with its projections on cuBLAS (default) or small_linear
# (bench/engine_batch.py --drafter-linears), the batched chain's phases under the default tiers and with cuBLAS
# rows off, then the -m gpu tests of the verify budget and the row sampler. Everything lands in $OUT.
set -u
source experiments/gpu_env.sh
# DG_GIT_SHA: pass it (the device copy's own HEAD is not the tree it runs)
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
timeout "${TIERS_S:-170}" python3 experiments/linear_tiers.py --out "$OUT/linear_tiers.json" > "$OUT/linear_tiers.log" 2>&1
echo "tiers rc $?"
for v in cublas triton; do
  flag=""; [ "$v" = triton ] && flag="--drafter-linears"
  timeout "${PROPOSE_S:-60}" python3 bench/engine_batch.py --shapes smollm2_135m --batches 1,16,64 --tokens 4 \
    --iters 15 $flag --out "$OUT/propose_$v.json" > "$OUT/propose_$v.log" 2>&1
  echo "propose $v rc $?"
done
for v in default nocublas; do
  cublas=1; [ "$v" = nocublas ] && cublas=0
  DOMINO_GRAFT_CUBLAS_ROWS=$cublas timeout "${PHASES_S:-70}" python3 bench/batched_overhead.py --batches 16,64 \
    --max-new-tokens 64 --phases 0,3 --no-cprofile --out "$OUT/phases_$v.json" > "$OUT/phases_$v.log" 2>&1
  echo "phases $v rc $?"
done
cp -r tests recipes pyproject.toml models /tmp/dg/ && rm -rf /tmp/dg/tests/serving  # (the image lacks httpx2)
(cd /tmp/dg && timeout "${TESTS_S:-100}" python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/decoding/test_verify_budget.py tests/kernels/test_sample_rows.py > "$OUT/gpu_tests.log" 2>&1; echo "tests rc $?")
tail -3 "$OUT/gpu_tests.log"
grep -h "^{'B'" "$OUT/linear_tiers.log" | head -20
grep -h "propose B=" "$OUT"/propose_*.log
