#!/usr/bin/env bash
# Session 31's GPU check (issue #39), not run yet (the session's device time ran out): a sampled rollout slot in
# two launches (kernels/head/sample_logits.py, the rollout's default) against the torch slot and against session 30's draw alone
# (kernels/head/sample_rows.py, DOMINO_GRAFT_SAMPLE_ROWS=1), then the kernels' -m gpu tests (test_pdl's
# first clean GPU run: its 45d49fd run drew two KV caches; test_verify_budget's committed tail that compacts without a capture). One device call, random weights, no model
# staging; carry .whl:
#   DG_GIT_SHA=$(git rev-parse --short HEAD) bash experiments/sampled_slot_check.sh
# $OUT: kernels_sampling.json (bench/kernels.py sample_logits sample_rows), batched_overhead_t1_{torch,
# sample_logits,sample_rows}.json (bench/batched_overhead.py at T = 1, B = 1, 16, 64: ms per step by mode,
# with a torch.profiler table for sample_logits; 64 new tokens), logs.tgz (every log; gpu_tests.log the -m gpu tests).
set -uo pipefail
source experiments/gpu_env.sh
O=${OUT:-/tmp/out}
L=/tmp/sampled_slot_logs
mkdir -p "$L"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 bench/kernels.py sample_logits sample_rows --out "$O/kernels_sampling.json" 2>&1 | tail -3
for mode in torch sample_logits sample_rows; do
  case $mode in
    torch) env=(DOMINO_GRAFT_SAMPLE_LOGITS=0) ;;
    sample_logits) env=(DOMINO_GRAFT_SAMPLE_LOGITS=1) ;;
    sample_rows) env=(DOMINO_GRAFT_SAMPLE_LOGITS=0 DOMINO_GRAFT_SAMPLE_ROWS=1) ;;
  esac
  prof=(); [ "$mode" = sample_logits ] && prof=(--kernel-profile)
  env "${env[@]}" python3 bench/batched_overhead.py --batches 1,16,64 --temperature 1 "${prof[@]}" \
    --max-new-tokens 64 --out "$O/batched_overhead_t1_$mode.json" > "$L/batched_overhead_t1_$mode.log" 2>&1
  echo "== $mode"; grep "ms/step" "$L/batched_overhead_t1_$mode.log"
done
# from the mirrored package (the checkout's own domino_graft/ would shadow it on sys.path)
cp -r tests recipes pyproject.toml /tmp/dg/
(cd /tmp/dg && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_pdl.py \
  tests/kernels/test_sample_logits.py tests/kernels/test_sample_rows.py tests/decoding/test_verify_budget.py \
  > "$L/gpu_tests.log" 2>&1)
tail -3 "$L/gpu_tests.log"
tar czf "$O/logs.tgz" -C "$L" .
