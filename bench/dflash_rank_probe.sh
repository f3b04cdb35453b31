#!/usr/bin/env bash
# Would DFlash's head generalise better to HumanEval at rank 256 than at the recipe's 64?
# A CPU proxy, not the benchmark, in the setting of bench/dflash_slot1_probe.sh: head-only grafts
# onto the device run's trained DFlash base drafter (backbone frozen, λ = 0, the same seed, data,
# steps and batch), differing only in head.rank, then `bench/acceptance_probe.py` (exact replay of
# greedy decoding) on held-out responses of the first 40 GSM8K / HumanEval prompts and on 40
# training-distribution code responses the grafts never saw.
#
#   bash bench/dflash_rank_probe.sh WORK EVAL_DIR OUT_DIR
#     WORK, EVAL_DIR  as in bench/dflash_slot1_probe.sh (its train_sub.jsonl draw is reused when
#                     OUT_DIR already holds it; its ppl1 run IS the rank-64 run here)
# ~5 s per step at rank 256 on 2 cores (~25 min), features cached once and shared.
set -euo pipefail
WORK=${1:?WORK}; EVAL=${2:?EVAL_DIR}; OUT=${3:?OUT_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
. "$ROOT/bench/proxy_graft.sh"
mkdir -p "$OUT"
[ -f "$OUT/train_sub.jsonl" ] || "$PY" "$ROOT/bench/proxy_train_sample.py" "$WORK/train.regen.jsonl" "$OUT/train_sub.jsonl"
for RANK in 64 256; do
  R=$OUT/rank$RANK
  [ "$RANK" = 64 ] && [ -d "$OUT/ppl1" ] && [ ! -e "$R" ] && ln -s ppl1 "$R"   # dflash_slot1_probe's run
  [ -d "$R" ] || "$PY" -m domino_graft apply "$ROOT/recipes/smollm2_dflash.yaml" -o "$R" \
      drafter.path="$WORK/dflash_base/drafter" head.rank=$RANK device=cpu
  # the target's features do not depend on the head: compute them once
  for F in "$OUT"/rank*/features; do
    [ -d "$F" ] && [ ! -d "$R/features" ] && cp -r "$F" "$R/features"
  done
  if [ ! -f "$R/train.done" ]; then
    proxy_train "$R" "$OUT/train_sub.jsonl" "$OUT/train_rank$RANK.log"
    touch "$R/train.done"
  fi
done
"$PY" "$ROOT/bench/acceptance_probe.py" --runs "$OUT/rank64,$OUT/rank256" --limit 40 \
    --data gsm8k="$EVAL/gsm8k40.regen.jsonl" --data humaneval="$EVAL/he40.regen.jsonl" \
    --data train_code="$EVAL/train_code40.jsonl" --out "$OUT/rank_probe.json"
