#!/usr/bin/env bash
# Would DFlash gain from the head correcting slot 1 too (head.pure_prefix_len 0), as Medusa did?
# A CPU proxy, not the benchmark: two head-only grafts onto the device run's trained DFlash base
# drafter (backbone frozen, λ = 0, the same seed, data, steps and batch), differing only in
# pure_prefix_len, then `bench/acceptance_probe.py` (exact replay of greedy decoding) on held-out
# responses of the first 40 GSM8K / HumanEval prompts and on 40 training responses.
#
#   bash bench/dflash_slot1_probe.sh WORK EVAL_DIR OUT_DIR
#     WORK      the unpacked device run (python bench/pack_runs.py unpack DFLASH_RUNS WORK): its
#               dflash_base drafter and train.regen.jsonl
#     EVAL_DIR  gsm8k40.regen.jsonl, he40.regen.jsonl (the README's acceptance-probe commands) and
#               train_code40.jsonl (the first 40 code records of WORK/train.regen.jsonl)
#     OUT_DIR   run dirs, logs and slot1_probe.json
# Data: 600 code + 200 math responses drawn (seed 0) from WORK/train.regen.jsonl, skipping the
# first 40 of each kind (the probe's training sets). 300 steps x 8 sequences, ~4 s per step on 2 cores
# with the target's features cached once (~10 min, 3 GB) and shared by both runs.
set -euo pipefail
WORK=${1:?WORK}; EVAL=${2:?EVAL_DIR}; OUT=${3:?OUT_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
. "$ROOT/bench/proxy_graft.sh"
mkdir -p "$OUT"
"$PY" "$ROOT/bench/proxy_train_sample.py" "$WORK/train.regen.jsonl" "$OUT/train_sub.jsonl"
for P in 1 0; do
  R=$OUT/ppl$P
  [ -d "$R" ] || "$PY" -m domino_graft apply "$ROOT/recipes/smollm2_dflash.yaml" -o "$R" \
      drafter.path="$WORK/dflash_base/drafter" head.pure_prefix_len=$P device=cpu
  # the target's features do not depend on the head: compute them once
  if [ "$P" = 0 ] && [ -d "$OUT/ppl1/features" ] && [ ! -d "$R/features" ]; then cp -r "$OUT/ppl1/features" "$R/features"; fi
  proxy_train "$R" "$OUT/train_sub.jsonl" "$OUT/train_ppl$P.log"
done
"$PY" "$ROOT/bench/acceptance_probe.py" --runs "$OUT/ppl1,$OUT/ppl0" --limit 40 \
    --data gsm8k="$EVAL/gsm8k40.regen.jsonl" --data humaneval="$EVAL/he40.regen.jsonl" \
    --data train_code="$EVAL/train_code40.jsonl" --out "$OUT/slot1_probe.json"
