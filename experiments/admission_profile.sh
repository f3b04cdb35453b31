#!/usr/bin/env bash
# experiments/admission_profile.py on the GPU: where an admission in place goes at 32 rows (96 GSM8K prompts,
# greedy), the target alone and + Domino, on the shipped drafter with an untrained graft
# (experiments/untrained_graft.sh). Staged like served_rollouts_check.sh (models/ out for calls 1-2:
# `h200.sh stage`, `h200.sh setup`), then, models/ back, call 3 (carry .whl):
#   DG_GIT_SHA=$(git rev-parse --short HEAD) bash experiments/admission_profile.sh  -> $OUT/admission_profile.json
# AP_ARGS replaces the profile's arguments. AP_PADS runs it once per setting of the static drafter's padded, graphed
# prefills (auto, on, off: adapters/dflash/fast.py), e.g. AP_PADS="on off" AP_ARGS="... --modes domino"
# -> $OUT/admission_profile_on.json, …_off.json (auto: admission_profile.json); AP_S caps each run (seconds).
set -euo pipefail
GRAFT_RUN=/tmp/ap_run
source experiments/untrained_graft.sh
ARGS=${AP_ARGS:---num-prompts 96 --concurrency 32}
for pad in ${AP_PADS:-auto}; do
  name=admission_profile$([ "$pad" = auto ] || echo "_$pad").json
  (cd /tmp && timeout "${AP_S:-400}" python3 "$HERE/experiments/admission_profile.py" --run /tmp/ap_run \
    --prompts "$DOMINO_GRAFT_CACHE/assets/gsm8k/prompts.jsonl" $ARGS --pad-prefills "$pad" --out "$OUT/$name" 2>&1 \
    | grep -v "Loading weights" | tail -8) || true
done
