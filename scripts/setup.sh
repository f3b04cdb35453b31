#!/usr/bin/env bash
# Creates .venv (if missing) and installs domino-graft with its test extras.
# torch is installed first, pinned to the version this project tests on (TORCH_VERSION), and
# only when the venv has none: install torch for your platform into .venv first (README:
# Install) and setup.sh keeps it. Our CI machines' pip configuration serves the CPU wheel.
# The install is editable, so code changes need no reinstall: a second run with the same
# pyproject.toml (and the same interpreter) only prints the line saying it is installed.
# pip's own output goes to .venv/setup.log; it is shown only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG=.venv/setup.log
STAMP=.venv/.domino-graft-installed

quiet() {  # run a step with its output in the log; on failure show the log's tail and stop
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup failed: $* (last lines of $LOG below)" >&2
    tail -n 20 "$LOG" >&2
    exit 1
  fi
}

if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $(.venv/bin/python -c 'import sys; print(sys.version)' | head -n1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && .venv/bin/python -c "import torch, domino_graft" >/dev/null 2>&1; then
  echo "domino-graft already installed in $(pwd)/.venv ($(.venv/bin/domino-graft --version)); pyproject.toml unchanged"
  exit 0
fi
: >"$LOG"
.venv/bin/python -m pip install --upgrade pip >>"$LOG" 2>&1 || true  # an old pip still works
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  quiet .venv/bin/python -m pip install "torch==${TORCH_VERSION:-2.13.0}"
fi
quiet .venv/bin/python -m pip install -e ".[dev]"
# speculators' own loader for tests/test_speculators_load.py, without its dependencies (it pins a CUDA
# torch and a newer transformers), beside its pure-Python imports; best effort: without it that check skips
.venv/bin/python -m pip install --no-deps "speculators==0.9.0" loguru pydantic-settings python-dotenv \
  hs-connectors >>"$LOG" 2>&1 || echo "note: speculators not installed; tests/test_speculators_load.py skips its loader check"
echo "$want" >"$STAMP"
echo "domino-graft installed in $(pwd)/.venv ($(.venv/bin/domino-graft --version))"
