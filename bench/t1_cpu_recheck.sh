#!/usr/bin/env bash
# Temperature 1 again, on a CPU, for a run's three DFlash drafters: more sampled prompts than the
# device's 30 per set, to tell a real gap between drafters from sampling noise (bench/t1_paired.py).
#
#   bash bench/t1_cpu_recheck.sh SHARDS_DIR WORK PROMPTS_PER_SET [SCALE]
#
# SHARDS_DIR: every weights.N.safetensors + runs_meta.tar.gz a device run returned (PACK_SHARDS);
# WORK: a scratch folder (the unpacked runs; its eval/ gets the records). Two processes, one per
# core: shard 0 takes GSM8K's prompts, shard 1 HumanEval's (the pipeline deals prompt n to shard
# n % 2). The unpacked weights are the bf16 shards read back as fp32, the precision bundles ship in;
# the device evaluated the fp32 weights it trained, so the sampled tokens differ from the device's
# even on the same prompts: the records are new samples, not a replay. ~80 s per prompt and shard
# on 2 busy cores (3 drafters, 96 new tokens). Interrupting it keeps every finished prompt.
# The committed re-run: SHARDS_DIR = the gpu-block16 run's 10 shards, 60 prompts per set (2,633 s);
# WORK/eval/t1_*.jsonl and WORK/eval_t1_*.log copied to bench/results/t1_cpu_block16/, then
#   python bench/t1_paired.py bench/results/smollm2_h200_gpu_block16 bench/results/t1_cpu_block16 \
#       --family dflash --out bench/results/t1_paired_dflash_block16.json
# KIND=greedy runs the greedy eval instead (the first PROMPTS_PER_SET prompts of each set): a
# replay of the device's greedy decodes from the returned bf16 weights, compared with the
# device's records by bench/greedy_replay.py. The committed replay (gpu-block16-long2's shards,
# 8 prompts per set): WORK/eval/greedy_*.jsonl and WORK/eval_greedy_*.log copied to
# bench/results/greedy_cpu_block16_long2/, then
#   python bench/greedy_replay.py bench/results/smollm2_h200_gpu_block16_long2 \
#       bench/results/greedy_cpu_block16_long2 --out bench/results/greedy_replay_dflash_block16_long2.json
# The grafted head-only drafter of gpu-block16-long2 (bench/smollm2_h200.sh graft) was replayed the same
# way by hand: its returned head shards (as weights.5-6) beside its base drafter's (weights.0-4)
# and its runs_meta.tar.gz, `pack_runs.py unpack` into WORK, WORK/training_dflash_base.json removed
# (so only the head-only drafter is decoded), then per shard i in 0 1:
#   smollm2_pipeline.py --work WORK --scale cpu --families dflash --stages eval --kind greedy
#       --max-per-set 32 --t1-prompts 32 --max-new-tokens 96 --shard i/2
# (8 prompts per set, then 32: about 13 s per prompt and shard); records in
# bench/results/greedy_cpu_headonly_long2/, compared by bench/greedy_replay.py into
# bench/results/greedy_replay_dflash_headonly_long2.json.
set -euo pipefail
SHARDS=${1:?usage: t1_cpu_recheck.sh SHARDS_DIR WORK PROMPTS_PER_SET [SCALE]}
WORK=${2:?}
N=${3:?}
SRC=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$SRC/.venv/bin/python}
KIND=${KIND:-t1}
case "$KIND" in t1|greedy) ;; *) echo "KIND=$KIND: valid: t1, greedy" >&2; exit 2 ;; esac
[ -d "$WORK/dflash_domino" ] || "$PY" "$SRC/bench/pack_runs.py" unpack "$SHARDS" "$WORK"
pids=()
for i in 0 1; do
  OMP_NUM_THREADS=1 "$PY" "$SRC/bench/smollm2_pipeline.py" --work "$WORK" --scale "${4:-cpu}" --families dflash \
      --stages eval --kind "$KIND" --max-per-set "$N" --t1-prompts "$N" --max-new-tokens 96 --shard "$i/2" \
      >> "$WORK/eval_${KIND}_$i.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do  # a bare `wait` returns 0 whatever the shards did: fail loudly, naming the log
  wait "${pids[$i]}" || { echo "$KIND shard $i/2 failed: see $WORK/eval_${KIND}_$i.log" >&2; exit 1; }
done
