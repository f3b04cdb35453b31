"""transformers remote code that `export --format hf` copies into a bundle (the files must stand
alone there: they import torch and transformers only; rollout_domino.py also imports the shipped
triton_rollout_domino.py, domino-graft's kernels/head/triton_rollout.py, when triton is installed)."""
