#!/usr/bin/env bash
# Creates .venv (if missing) and installs domino-graft with its test extras.
# torch is installed first and pinned to the CPU build this project tests on: letting pip
# resolve a bare "torch" would pull a multi-GB CUDA build onto CPU-only machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[dev]"
echo "domino-graft installed in $(pwd)/.venv ($(.venv/bin/domino-graft --version))"
