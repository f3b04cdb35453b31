#!/usr/bin/env bash
# Which head change lifts DFlash's first corrected slots on HumanEval? On the device, DFlash x
# HumanEval misses x1.15 because the head's slot 2 accepts ~0.53 there (0.67 on GSM8K); by the
# measured per-slot rates, slot 2 at ~0.60 would reach x1.15. A CPU proxy, not the benchmark, in
# the setting of bench/dflash_data_probe.sh (whose `mixed` graft is the baseline: GRU width 256,
# gamma 4): head-only grafts onto the gpu-puzzles run's trained DFlash base drafter (backbone
# frozen, lambda = 0, the same seed, draw, steps and batch), each differing from the baseline in ONE
# recipe field:
#   g512    head.gru_hidden_dim=512   (a wider GRU: more in-block context per slot)
#   gamma2  train.gamma=2.0           (per-slot loss weights exp(-(k-1)/gamma) leaning harder on
#                                      the early slots, where the chain's acceptance is decided)
# then `bench/acceptance_probe.py` (exact replay of greedy decoding) on held-out responses of the
# first 40 GSM8K / HumanEval prompts and on the data probe's held-out training responses.
#
#   bash bench/dflash_head_shape_probe.sh WORK EVAL_DIR DATA_PROBE_DIR OUT_DIR
#     WORK            the unpacked gpu-puzzles run (python bench/pack_runs.py unpack DFLASH_RUNS WORK)
#     EVAL_DIR        gsm8k40.regen.jsonl, he40.regen.jsonl (the README's acceptance-probe commands)
#     DATA_PROBE_DIR  bench/dflash_data_probe.sh's OUT_DIR: train_mixed.jsonl, the held-out
#                     train_*40.jsonl files and the trained `mixed` baseline
# The two grafts train in parallel, one thread each (~10 min of target features + ~25 min of
# training each on 2 cores).
set -euo pipefail
WORK=${1:?WORK}; EVAL=${2:?EVAL_DIR}; DP=${3:?DATA_PROBE_DIR}; OUT=${4:?OUT_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
. "$ROOT/bench/proxy_graft.sh"
mkdir -p "$OUT"
graft() {  # NAME OVERRIDE
  local R=$OUT/$1
  [ -d "$R" ] || "$PY" -m domino_graft apply "$ROOT/recipes/smollm2_dflash.yaml" -o "$R" \
      drafter.path="$WORK/dflash_base/drafter" head.rank=256 device=cpu "$2"
  if [ ! -f "$R/train.done" ]; then
    # the variant's field is in the run's recipe since apply; one thread per graft (two run at once)
    OMP_NUM_THREADS=1 proxy_train "$R" "$DP/train_mixed.jsonl" "$OUT/train_$1.log"
    rm -rf "$R/features"   # ~3 GB; the draw file regenerates them
    touch "$R/train.done"
  fi
}
graft g512 head.gru_hidden_dim=512 &
graft gamma2 train.gamma=2.0 &
wait
"$PY" "$ROOT/bench/acceptance_probe.py" --runs "$DP/mixed,$OUT/g512,$OUT/gamma2" --limit 40 \
    --data gsm8k="$EVAL/gsm8k40.regen.jsonl" --data humaneval="$EVAL/he40.regen.jsonl" \
    --data train_math="$DP/train_math40.jsonl" --data train_puzzle="$DP/train_puzzle40.jsonl" \
    --data train_library="$DP/train_library40.jsonl" --out "$OUT/head_shape_probe.json"
