#!/usr/bin/env bash
# One environment switch of serve's worker, A/B on this CPU: bench/rollouts.py with the real SmolLM2 and an untrained
# graft of the shipped drafter, 32 GSM8K prompts through 8 rows refilled as they end, greedy, 64 new tokens, every
# block verifying all K (--verify-budget full: the rows end at scattered blocks), one timed pass, once per mode.
#   RUN=/tmp/sg SWITCH=DOMINO_GRAFT_X OUT=dir bash experiments/rollouts_switch_cpu.sh off=0 on=1
# -> OUT/off.json (SWITCH=0), OUT/on.json (SWITCH=1). RUN: domino-graft apply smollm2_graft -o RUN
# drafter.path=models/smollm2-135m-dflash. Its callers: admission_rows_check.sh, cohorts_cpu_check.sh.
set -euo pipefail
mkdir -p "${OUT:?}"
for pair in "$@"; do
  mode=${pair%%=*}
  env "${SWITCH:?}=${pair#*=}" .venv/bin/python bench/rollouts.py --run "${RUN:?}" \
    --prompts ~/.cache/domino-graft/assets/gsm8k/prompts.jsonl --num-prompts 32 --concurrency 8 --temperatures 0 \
    --max-new-tokens 64 --rounds 1 --verify-budget full --dtype fp32 --device cpu --out "$OUT/$mode.json" 2>&1 \
    | grep -v "Loading weights" | tail -1
done
