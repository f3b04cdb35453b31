#!/usr/bin/env bash
# `serve --target-only` under 8 and 32 requests in flight with the worker's deltas handed to the event loop one
# by one (DOMINO_GRAFT_SERVE_MAILBOX=0, as before 8c01e8c) and through the mailbox (serving/mailbox.py), in one
# warm machine. Staged like `h200.sh e2e` (models/ out for calls 1-2): call 1 `bash experiments/h200.sh stage`
# (carry .stage/a), call 2 `bash experiments/h200.sh setup` (carry .stage/b, .whl with experiments/serve_wheels.sh's
# wheels), then, models/ back, call 3 (carry .whl): DG_GIT_SHA=$(git rev-parse --short HEAD) bash
# experiments/serve_handover_check.sh -> $OUT/serve_handover_<off|on>.json. The graft is `apply smollm2_graft`
# untrained: the target-only server reads only its target.
set -euo pipefail
GRAFT_RUN=/tmp/ab_run
source experiments/untrained_graft.sh
for sw in 0 1; do
  name=$([ "$sw" = 0 ] && echo off || echo on)
  (cd /tmp && DOMINO_GRAFT_SERVE_MAILBOX=$sw timeout "${AB_S:-200}" python3 "$HERE/bench/serve_sweep.py" \
    --run /tmp/ab_run --prompts "$DOMINO_GRAFT_CACHE/assets/gsm8k/prompts.jsonl" --modes target --rates "" \
    --concurrency 8,32 --num-prompts 48 --max-tokens 192 --max-batch 32 --out "$OUT/serve_handover_$name.json" \
    2>&1 | grep -v "Loading weights" | tail -4)
done
