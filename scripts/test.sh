#!/usr/bin/env bash
# Sets up the environment (scripts/setup.sh) and runs the default test suite on CPU.
# GPU tests (-m gpu) and real-model tests (-m slow) are opt-in.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
