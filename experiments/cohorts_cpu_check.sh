#!/usr/bin/env bash
# Admissions in cohorts (serving/cohorts.py) off and on, forced (DOMINO_GRAFT_COHORTS=0/1; off by default), on
# this CPU: bench/rollouts.py with the real SmolLM2 and an untrained graft of the shipped drafter, 32 GSM8K prompts
# through 8 rows refilled as they end, greedy, every block verifying all K (--verify-budget full:
# the rows end at scattered blocks), one timed pass (experiments/rollouts_switch_cpu.sh).
#   RUN=/tmp/sg bash experiments/cohorts_cpu_check.sh   (RUN: domino-graft apply smollm2_graft -o RUN
#   drafter.path=models/smollm2-135m-dflash) -> bench/results/cohorts_cpu/{off,on}.json
set -euo pipefail
OUT=${OUT:-bench/results/cohorts_cpu} SWITCH=DOMINO_GRAFT_COHORTS exec bash experiments/rollouts_switch_cpu.sh \
  off=0 on=1
