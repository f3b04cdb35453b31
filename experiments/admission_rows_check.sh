#!/usr/bin/env bash
# Admissions in place with the whole batch's prefill (DOMINO_GRAFT_ADMIT_ROWS=0) and with the admitted rows alone
# at the front of the cache (decoding/session.py `admission_rows`, the default): bench/rollouts.py on this CPU, the
# real SmolLM2 and an untrained graft of the shipped drafter, 32 GSM8K prompts through 8 rows refilled as they end,
# greedy, every block verifying all K (--verify-budget full: the rows end at scattered blocks), one timed pass.
#   RUN=/tmp/sg bash experiments/admission_rows_check.sh   (RUN: domino-graft apply smollm2_graft -o RUN
#   drafter.path=models/smollm2-135m-dflash) -> bench/results/admission_rows_cpu/{whole,rows}.json
set -euo pipefail
OUT=${OUT:-bench/results/admission_rows_cpu}
mkdir -p "$OUT"
for mode in whole rows; do
  flag=1; [ "$mode" = whole ] && flag=0
  DOMINO_GRAFT_ADMIT_ROWS=$flag .venv/bin/python bench/rollouts.py --run "${RUN:?}" \
    --prompts ~/.cache/domino-graft/assets/gsm8k/prompts.jsonl --num-prompts 32 --concurrency 8 --temperatures 0 \
    --max-new-tokens 64 --rounds 1 --verify-budget full --dtype fp32 --device cpu --out "$OUT/$mode.json" 2>&1 \
    | grep -v "Loading weights" | tail -1
done
