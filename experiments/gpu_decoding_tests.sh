#!/usr/bin/env bash
# One GPU call (run tool, carry .whl): the -m gpu tests of decoding/ and fast/ with the engine's defaults (since
# 21dd2d4 the target alone's loop a step ahead), the log in $OUT/gpu_tests_decoding_fast.log.
set -u
source experiments/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
cp -r tests recipes pyproject.toml models /tmp/dg/ && rm -rf /tmp/dg/tests/serving  # (the image lacks httpx2)
(cd /tmp/dg && timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/decoding tests/fast \
  > "$OUT/gpu_tests_decoding_fast.log" 2>&1; echo "tests rc $?")
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests_decoding_fast.log" | tail -12
