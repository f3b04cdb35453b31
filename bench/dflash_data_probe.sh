#!/usr/bin/env bash
# Does HumanEval-like training code move DFlash's head on HumanEval more than its share of the
# data suggests? A CPU proxy, not the benchmark, in the setting of bench/dflash_rank_probe.sh:
# head-only grafts (rank 256) onto the gpu-puzzles run's trained DFlash base drafter (backbone
# frozen, λ = 0, the same seed, steps and batch), differing only in where the 600 code responses
# of their 800 come from: all code in file order (85 puzzles) or puzzles only. Then
# `bench/acceptance_probe.py` (exact replay of greedy decoding) on held-out responses of the first
# 40 GSM8K / HumanEval prompts and on the first 40 math, puzzle and library training responses,
# which neither draw contains; the device run's own head-only graft is replayed alongside.
#
#   bash bench/dflash_data_probe.sh WORK EVAL_DIR OUT_DIR
#     WORK      the unpacked gpu-puzzles run (python bench/pack_runs.py unpack DFLASH_RUNS WORK)
#     EVAL_DIR  gsm8k40.regen.jsonl, he40.regen.jsonl (the README's acceptance-probe commands)
#     OUT_DIR   draws, run dirs, logs and data_probe.json
# ~10 min of target features and ~25 min of training per graft on 2 cores.
set -euo pipefail
WORK=${1:?WORK}; EVAL=${2:?EVAL_DIR}; OUT=${3:?OUT_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
. "$ROOT/bench/proxy_graft.sh"
mkdir -p "$OUT"
"$PY" "$ROOT/bench/proxy_train_sample.py" "$WORK/train.regen.jsonl" "$OUT/train_mixed.jsonl" --held-out "$OUT"
"$PY" "$ROOT/bench/proxy_train_sample.py" "$WORK/train.regen.jsonl" "$OUT/train_puzzle.jsonl" --code puzzle
for DRAW in mixed puzzle; do
  R=$OUT/$DRAW
  [ -d "$R" ] || "$PY" -m domino_graft apply "$ROOT/recipes/smollm2_dflash.yaml" -o "$R" \
      drafter.path="$WORK/dflash_base/drafter" head.rank=256 device=cpu
  if [ ! -f "$R/train.done" ]; then
    proxy_train "$R" "$OUT/train_$DRAW.jsonl" "$OUT/train_$DRAW.log"
    rm -rf "$R/features"   # ~3 GB each; the draw file regenerates them
    touch "$R/train.done"
  fi
done
"$PY" "$ROOT/bench/acceptance_probe.py" --runs "$OUT/mixed,$OUT/puzzle,$WORK/dflash_headonly" --limit 40 \
    --data gsm8k="$EVAL/gsm8k40.regen.jsonl" --data humaneval="$EVAL/he40.regen.jsonl" \
    --data train_math="$OUT/train_math40.jsonl" --data train_puzzle="$OUT/train_puzzle40.jsonl" \
    --data train_library="$OUT/train_library40.jsonl" --out "$OUT/data_probe.json"
