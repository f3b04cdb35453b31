#!/usr/bin/env bash
# bench/rollouts.py (GSM8K prompts, B rows at a time refilled as they end, through serve's worker) with serve's
# steps ahead of their reads on (serving/batch.py "Drafted ahead", "A plain step ahead") and off
# (DOMINO_GRAFT_SPEC_AHEAD=0 DOMINO_GRAFT_PLAIN_AHEAD=0), in one warm machine, on the shipped drafter with an
# untrained graft (`apply smollm2_graft`: the head's residual is zero-initialised, so its drafts are the drafter's;
# no ~3 min graft). Staged like `h200.sh e2e` (models/ out for calls 1-2): call 1 `bash experiments/h200.sh stage`
# (carry .stage/a, .whl), call 2 `bash experiments/h200.sh setup` (carry .stage/b, .whl), then, models/ back,
# call 3 (carry .whl): DG_GIT_SHA=$(git rev-parse --short HEAD) bash experiments/rollouts_ahead_check.sh
# -> $OUT/rollouts_ahead_<on|off>.json. RA_ARGS replaces the rollouts arguments, RA_S caps each run (seconds).
set -euo pipefail
GRAFT_RUN=/tmp/ra_run
source experiments/untrained_graft.sh
ARGS=${RA_ARGS:---num-prompts 128 --concurrency 16,32,64 --temperatures 0 --rounds 2}
for sw in 1 0; do
  name=$([ "$sw" = 1 ] && echo on || echo off)
  (cd /tmp && DOMINO_GRAFT_SPEC_AHEAD=$sw DOMINO_GRAFT_PLAIN_AHEAD=$sw timeout "${RA_S:-240}" python3 \
    "$HERE/bench/rollouts.py" --run /tmp/ra_run --prompts "$DOMINO_GRAFT_CACHE/assets/gsm8k/prompts.jsonl" \
    $ARGS --out "$OUT/rollouts_ahead_$name.json" 2>&1 | grep -v "Loading weights" | tail -6) || true
done
