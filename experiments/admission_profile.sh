#!/usr/bin/env bash
# experiments/admission_profile.py on the GPU: where an admission in place goes at 32 rows (96 GSM8K prompts,
# greedy), the target alone and + Domino, on the shipped drafter with an untrained graft
# (experiments/untrained_graft.sh). Staged like served_rollouts_check.sh (models/ out for calls 1-2:
# `h200.sh stage`, `h200.sh setup`), then, models/ back, call 3 (carry .whl):
#   DG_GIT_SHA=$(git rev-parse --short HEAD) bash experiments/admission_profile.sh  -> $OUT/admission_profile.json
# AP_ARGS replaces the profile's arguments.
set -euo pipefail
GRAFT_RUN=/tmp/ap_run
source experiments/untrained_graft.sh
ARGS=${AP_ARGS:---num-prompts 96 --concurrency 32}
(cd /tmp && timeout "${AP_S:-400}" python3 "$HERE/experiments/admission_profile.py" --run /tmp/ap_run \
  --prompts "$DOMINO_GRAFT_CACHE/assets/gsm8k/prompts.jsonl" $ARGS --out "$OUT/admission_profile.json" 2>&1 \
  | grep -v "Loading weights" | tail -8)
