#!/usr/bin/env bash
# Admissions in cohorts (serving/cohorts.py) off and on, forced (DOMINO_GRAFT_COHORTS=0/1; off by default), on
# this CPU: bench/rollouts.py with the real SmolLM2 and an untrained graft of the shipped drafter, 32 GSM8K prompts
# through 8 rows refilled as they end, greedy, every block verifying all K (--verify-budget full:
# the rows end at scattered blocks), one timed pass; admission_rows_check.sh's setting.
#   RUN=/tmp/sg bash experiments/cohorts_cpu_check.sh   (RUN: domino-graft apply smollm2_graft -o RUN
#   drafter.path=models/smollm2-135m-dflash) -> bench/results/cohorts_cpu/{off,on}.json
set -euo pipefail
OUT=${OUT:-bench/results/cohorts_cpu}
mkdir -p "$OUT"
for mode in off on; do
  flag=1; [ "$mode" = off ] && flag=0
  DOMINO_GRAFT_COHORTS=$flag .venv/bin/python bench/rollouts.py --run "${RUN:?}" \
    --prompts ~/.cache/domino-graft/assets/gsm8k/prompts.jsonl --num-prompts 32 --concurrency 8 --temperatures 0 \
    --max-new-tokens 64 --rounds 1 --verify-budget full --dtype fp32 --device cpu --out "$OUT/$mode.json" 2>&1 \
    | grep -v "Loading weights" | tail -1
done
