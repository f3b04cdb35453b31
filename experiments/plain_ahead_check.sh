#!/usr/bin/env bash
# One GPU call (run tool, carry .whl; pass DG_GIT_SHA: the device copy's own HEAD is not the tree it runs):
# the target alone's loop reading each step before the next (default) against a step ahead
# (DOMINO_GRAFT_PLAIN_AHEAD=1), SmolLM2 shape with random weights, by batch size (bench/batched_overhead.py's
# "target" row: Engine.target_only_batch), then the -m gpu tests of decoding/ with the switch on.
set -u
source experiments/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
# AHEAD_ORDER="1 0" AHEAD_TAG=_rev AHEAD_TESTS=0: the two arms the other way round, no tests (the order check)
for a in ${AHEAD_ORDER:-0 1}; do
  DOMINO_GRAFT_PLAIN_AHEAD=$a timeout "${AHEAD_S:-150}" python3 bench/batched_overhead.py --batches 1,16,64 \
    --max-new-tokens 96 --no-cprofile --out "$OUT/plain_ahead${AHEAD_TAG:-}_$a.json" \
    > "$OUT/plain_ahead${AHEAD_TAG:-}_$a.log" 2>&1
  echo "ahead=$a rc $?"
done
grep -h "target:" "$OUT"/plain_ahead*_*.log
[ "${AHEAD_TESTS:-1}" = 1 ] || exit 0
cp -r tests recipes pyproject.toml models /tmp/dg/ && rm -rf /tmp/dg/tests/serving  # (the image lacks httpx2)
(cd /tmp/dg && DOMINO_GRAFT_PLAIN_AHEAD=1 timeout "${TESTS_S:-200}" python3 -m pytest -m "gpu or not gpu" -q \
  -p no:cacheprovider tests/decoding/test_plain_ahead.py tests/decoding/test_batched.py \
  > "$OUT/gpu_tests_plain_ahead.log" 2>&1; echo "tests rc $?")
tail -3 "$OUT/gpu_tests_plain_ahead.log"
