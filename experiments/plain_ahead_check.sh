#!/usr/bin/env bash
# One GPU call (run tool, carry .whl; pass DG_GIT_SHA: the device copy's own HEAD is not the tree it runs):
# the target alone's loop reading each step before the next (default) against a step ahead
# (DOMINO_GRAFT_PLAIN_AHEAD=1), SmolLM2 shape with random weights, by batch size (bench/batched_overhead.py's
# "target" row: Engine.target_only_batch), then the -m gpu tests of decoding/ with the switch on.
set -u
source experiments/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
for a in 0 1; do
  DOMINO_GRAFT_PLAIN_AHEAD=$a timeout "${AHEAD_S:-150}" python3 bench/batched_overhead.py --batches 1,16,64 \
    --max-new-tokens 96 --no-cprofile --out "$OUT/plain_ahead_$a.json" > "$OUT/plain_ahead_$a.log" 2>&1
  echo "ahead=$a rc $?"
done
cp -r tests recipes pyproject.toml models /tmp/dg/ && rm -rf /tmp/dg/tests/serving  # (the image lacks httpx2)
(cd /tmp/dg && DOMINO_GRAFT_PLAIN_AHEAD=1 timeout "${TESTS_S:-200}" python3 -m pytest -m "gpu or not gpu" -q \
  -p no:cacheprovider tests/decoding/test_plain_ahead.py tests/decoding/test_batched.py \
  > "$OUT/gpu_tests_plain_ahead.log" 2>&1; echo "tests rc $?")
tail -3 "$OUT/gpu_tests_plain_ahead.log"
grep -h "target:" "$OUT"/plain_ahead_*.log
