"""transformers remote code that `export --format hf` copies into a bundle (the files must stand
alone there: they import torch and transformers only)."""
