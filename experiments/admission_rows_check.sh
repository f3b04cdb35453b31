#!/usr/bin/env bash
# Admissions in place with the whole batch's prefill (DOMINO_GRAFT_ADMIT_ROWS=0) and with the admitted rows alone at
# the front of the cache (decoding/session.py `admission_rows`, opt-in since ff78d75): bench/rollouts.py on this CPU,
# the real SmolLM2 and an untrained graft of the shipped drafter, 32 GSM8K prompts through 8 rows refilled as they end,
# greedy, every block verifying all K (--verify-budget full), one timed pass (experiments/rollouts_switch_cpu.sh).
#   RUN=/tmp/sg bash experiments/admission_rows_check.sh   (RUN: domino-graft apply smollm2_graft -o RUN
#   drafter.path=models/smollm2-135m-dflash) -> bench/results/admission_rows_cpu/{whole,rows}.json
set -euo pipefail
OUT=${OUT:-bench/results/admission_rows_cpu} SWITCH=DOMINO_GRAFT_ADMIT_ROWS \
  exec bash experiments/rollouts_switch_cpu.sh whole=0 rows=1
