#!/usr/bin/env bash
# bench/rollouts.py (GSM8K prompts, B rows refilled as they end, through serve's worker) three ways in one warm
# machine, on the shipped drafter with an untrained graft (experiments/untrained_graft.sh): the defaults at 2db0b62
# (measured arms, serving/windows.py; admissions of the admitted rows alone, decoding/session.py `admission_rows`), then
# admissions of the whole batch (DOMINO_GRAFT_ADMIT_ROWS=0), then the served step model alone
# (DOMINO_GRAFT_SERVE_ARMS=0). Staged like rollouts_ahead_check.sh (models/ out for calls 1-2: `h200.sh stage`,
# `h200.sh setup`), then, models/ back, call 3 (carry .whl):
#   DG_GIT_SHA=$(git rev-parse --short HEAD) bash experiments/served_rollouts_check.sh
# -> $OUT/rollouts_{default,whole_admissions,step_model}.json. SR_ARGS replaces the rollouts arguments, SR_S caps
# each run (seconds).
set -euo pipefail
GRAFT_RUN=/tmp/sr_run
source experiments/untrained_graft.sh
ARGS=${SR_ARGS:---num-prompts 96 --concurrency 32 --temperatures 0 --rounds 2}
for mode in default whole_admissions step_model; do
  env_args=()
  [ "$mode" = whole_admissions ] && env_args=(DOMINO_GRAFT_ADMIT_ROWS=0)
  [ "$mode" = step_model ] && env_args=(DOMINO_GRAFT_SERVE_ARMS=0)
  (cd /tmp && env "${env_args[@]}" timeout "${SR_S:-170}" python3 \
    "$HERE/bench/rollouts.py" --run /tmp/sr_run --prompts "$DOMINO_GRAFT_CACHE/assets/gsm8k/prompts.jsonl" \
    $ARGS --out "$OUT/rollouts_$mode.json" 2>&1 | grep -v "Loading weights" | tail -4) || true
done
