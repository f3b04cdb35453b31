#!/usr/bin/env bash
# The fused sampled accept rule (kernels/head/verify_sampled.py) on a GPU, in one call (~3 min):
# its tests on CUDA, its bench entry beside sample_logits', and a sampled batched-chain step split into phases
# with the torch rule (DOMINO_GRAFT_VERIFY_SAMPLED=0) and the fused one (=1; the default since 3c73677), same shapes.
#   run: bash experiments/verify_sampled_check.sh   (carry .whl; results under $OUT)
#   BATCHES=1,16 PHASES=3,15: fewer batch sizes / K' (defaults 1,16,64 and 3,7,15)
set -uo pipefail
source experiments/gpu_env.sh
O=${OUT:-/tmp/out}; mkdir -p "$O"
nvidia-smi --query-gpu=name --format=csv,noheader
cp -r tests recipes pyproject.toml /tmp/dg/
(cd /tmp/dg && timeout 150 python3 -m pytest -q -rA -p no:cacheprovider -m "gpu or not gpu" \
  tests/kernels/test_verify_sampled.py > "$O/gpu_tests.log" 2>&1); tail -3 "$O/gpu_tests.log"
python3 bench/kernels.py verify_sampled sample_logits --out "$O/kernels.json" 2>&1 | tail -2
for mode in torch fused; do
  flag=$([ "$mode" = torch ] && echo 0 || echo 1)
  DOMINO_GRAFT_VERIFY_SAMPLED=$flag python3 bench/batched_overhead.py --batches "${BATCHES:-1,16,64}" \
    --temperature 1 --max-new-tokens 64 --phases "${PHASES:-3,7,15}" --no-cprofile --out "$O/phases_t1_$mode.json" > "$O/phases_t1_$mode.log" 2>&1
  echo "== $mode"; grep -E "ms/step|phases" "$O/phases_t1_$mode.log"
done
