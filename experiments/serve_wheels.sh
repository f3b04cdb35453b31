#!/usr/bin/env bash
# The `serve` extra's wheels for the GPU image, which has no package registry and lacks them (FastAPI,
# uvicorn, prometheus-client, and httpx2 for bench/serve_sweep.py's client), downloaded into .whl/ beside
# the wheels ../shared/gpu/prepare.sh builds; experiments/gpu_env.sh installs everything in .whl/ there.
# The versions are this checkout's .venv's (the ones the serving tests ran with); truststore and
# opentelemetry-api are imported by httpcore2 and fastapi on the image's Python 3.12.
set -euo pipefail
cd "$(dirname "$0")/.."
NAMES='fastapi|starlette|uvicorn|h11|prometheus[-_]client|anyio|sniffio|click|annotated[-_]doc|typing[-_]inspection'
NAMES+='|typing[-_]extensions|httpx2|httpcore2|certifi|idna|truststore|opentelemetry[-_]api|importlib[-_]metadata|zipp'
mapfile -t PINS < <(.venv/bin/python -m pip freeze | grep -iE "^(${NAMES})==")
for extra in truststore opentelemetry-api; do  # not in every .venv: the newest then
  printf '%s\n' "${PINS[@]}" | grep -qi "^${extra/-/[-_]}==" || PINS+=("$extra")
done
mkdir -p .whl
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 -d .whl "${PINS[@]}"
echo "serve wheels in .whl/: ${#PINS[@]} packages"
