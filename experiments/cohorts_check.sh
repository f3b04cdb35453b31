#!/usr/bin/env bash
# Admissions in cohorts (serving/cohorts.py) on and off: bench/rollouts.py (96 GSM8K prompts, 32 rows refilled as
# they end, through serve's worker, greedy) on the shipped drafter with an untrained graft
# (experiments/untrained_graft.sh). CC_MODES picks the runs, in order, each with its own target alone:
#   on             the defaults (measured arms), cohorts on (DOMINO_GRAFT_COHORTS=1; off by default until measured)
#   off            the same, DOMINO_GRAFT_COHORTS=0
#   step_model_on  the served step model alone (DOMINO_GRAFT_SERVE_ARMS=0), cohorts on
#   step_model_off the same, cohorts off
# Staged like served_rollouts_check.sh (models/ out for calls 1-2: `h200.sh stage`, `h200.sh setup`), then,
# models/ back, call 3 (carry .whl):
#   DG_GIT_SHA=$(git rev-parse --short HEAD) CC_MODES="on off" bash experiments/cohorts_check.sh
# -> $OUT/cohorts_<mode>.json. CC_ARGS replaces the rollouts arguments, CC_S caps each run (seconds).
set -euo pipefail
GRAFT_RUN=/tmp/cc_run
source experiments/untrained_graft.sh
ARGS=${CC_ARGS:---num-prompts 96 --concurrency 32 --temperatures 0 --rounds 2}
for mode in ${CC_MODES:-on off}; do
  env_args=(DOMINO_GRAFT_COHORTS=1)
  case "$mode" in
    off) env_args=(DOMINO_GRAFT_COHORTS=0) ;;
    step_model_on) env_args=(DOMINO_GRAFT_COHORTS=1 DOMINO_GRAFT_SERVE_ARMS=0) ;;
    step_model_off) env_args=(DOMINO_GRAFT_COHORTS=0 DOMINO_GRAFT_SERVE_ARMS=0) ;;
  esac
  (cd /tmp && env "${env_args[@]}" timeout "${CC_S:-170}" python3 \
    "$HERE/bench/rollouts.py" --run /tmp/cc_run --prompts "$DOMINO_GRAFT_CACHE/assets/gsm8k/prompts.jsonl" \
    $ARGS --out "$OUT/cohorts_$mode.json" 2>&1 | grep -v "Loading weights" | tail -4) || true
done
