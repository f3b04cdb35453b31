#!/usr/bin/env bash
# Session 30's GPU check (issue #39): programmatic dependent launch for the engine's kernels
# (kernels/engine/pdl.py) and a sampled slot's draw (reference.inverse_cdf against kernels/head/sample_rows.py;
# at 45d49fd inverse_cdf was a two-level torch search, reverted after this check).
# One device call, random weights, no model staging; carry .whl:
#   bash experiments/pdl_sampling_check.sh
# $OUT: engine_b1_pdl_{off,on}.json (bench/engine_batch.py at B = 1, T = 1 and 16, Qwen3-8B and
# SmolLM2 shapes, PDL off then on), batched_overhead_t{0,1}.json (bench/batched_overhead.py: ms per
# step by B, with a torch.profiler table), batched_overhead_t1_sample_rows.json (the same at T = 1 with
# DOMINO_GRAFT_SAMPLE_ROWS=1: each sampled slot drawn by kernels/head/sample_rows.py), kernels_sample_rows.json
# (bench/kernels.py sample_rows pdl), logs.tgz (every log, gpu_tests.log the kernels' -m gpu tests: eight files
# come back from a call at most, and 45d49fd's lost its test log that way).
# (45d49fd's call ran before sample_rows existed: the last two passes and its tests are for the next one.)
set -uo pipefail
source experiments/gpu_env.sh
O=${OUT:-/tmp/out}
L=/tmp/pdl_check_logs  # the logs, returned as one archive
mkdir -p "$L"
nvidia-smi --query-gpu=name --format=csv,noheader
for mode in off on; do
  flag=1; [ "$mode" = off ] && flag=0
  DOMINO_GRAFT_PDL=$flag python3 bench/engine_batch.py --batches 1 --tokens 1,16 --no-propose --iters 25 \
    --git-sha "${DG_GIT_SHA:-unknown}" --out "$O/engine_b1_pdl_$mode.json" > "$L/engine_b1_pdl_$mode.log" 2>&1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(sys.argv[2], s, r['B'], r['T'], r['default_ms'], r['cublas_ms']) for s, v in d['rows'].items() for r in v['by_batch']]" "$O/engine_b1_pdl_$mode.json" "$mode"
done
python3 bench/batched_overhead.py --batches 1,16,64 --temperature 1 --kernel-profile --max-new-tokens 96 \
  --out "$O/batched_overhead_t1.json" > "$L/batched_overhead_t1.log" 2>&1
python3 bench/batched_overhead.py --batches 16,64 --kernel-profile --max-new-tokens 96 \
  --out "$O/batched_overhead_t0.json" > "$L/batched_overhead_t0.log" 2>&1
DOMINO_GRAFT_SAMPLE_ROWS=1 python3 bench/batched_overhead.py --batches 1,16,64 --temperature 1 --kernel-profile \
  --max-new-tokens 96 --out "$O/batched_overhead_t1_sample_rows.json" > "$L/batched_overhead_t1_sample_rows.log" 2>&1
python3 bench/kernels.py sample_rows pdl --out "$O/kernels_sample_rows.json" 2>&1 | tail -3
grep -H "ms/step" "$L"/batched_overhead_t*.log
# from the mirrored package (the checkout's own domino_graft/ would shadow it on sys.path; at 45d49fd
# this ran from the checkout and stopped at collection)
cp -r tests recipes pyproject.toml /tmp/dg/
(cd /tmp/dg && python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_pdl.py tests/kernels/test_small_linear.py \
  tests/kernels/test_decode_attention.py tests/kernels/test_row_norm.py tests/kernels/test_reference.py tests/kernels/test_sample_rows.py \
  > "$L/gpu_tests.log" 2>&1)
tail -3 "$L/gpu_tests.log"
tar czf "$O/logs.tgz" -C "$L" .
