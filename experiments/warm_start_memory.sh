#!/usr/bin/env bash
# experiments/warm_start_memory.py on the GPU: the memory serve's warm start holds, random weights, one process a
# setting (memory is per process). Needs no staged model: one call, carry .whl (../shared/gpu/prepare.sh).
#   bash experiments/warm_start_memory.sh  -> $OUT/warm_start_memory_<shape>_<setting>.json
# WSM_RUNS: "shape:setting" pairs (setting: shared, private (every prefill graph a pool of its own), eager (the
# drafter's prefills eager); default: Qwen3-8B shared, private); WSM_ARGS adds arguments (default: 32 rows, 512
# positions: SmolLM2's warm start at 32 rows and 368 positions took 59 s on the H200, serve_sweep_h200.json);
# WSM_S caps each run (seconds; two runs fit one 10-minute call).
set -euo pipefail
HERE=$(pwd)
source experiments/gpu_env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for run in ${WSM_RUNS:-qwen3_8b:shared qwen3_8b:private}; do
  shape=${run%%:*} setting=${run#*:}
  case $setting in
    shared) flags="--prefill-pools shared" ;;
    private) flags="--prefill-pools private" ;;
    eager) flags="--pad-prefills off" ;;
    *) echo "WSM_RUNS: setting '$setting' of '$run'; valid: shared, private, eager" >&2; exit 2 ;;
  esac
  (cd /tmp && timeout "${WSM_S:-270}" python3 "$HERE/experiments/warm_start_memory.py" --shape "$shape" $flags \
    ${WSM_ARGS:---max-batch 32 --positions 512} --out "$OUT/warm_start_memory_${shape}_${setting}.json" 2>&1 \
    | grep -v "Loading weights" | tail -4) || true
done
