"""P-EAGLE (speculators 0.9.0 `peagle`, served by vLLM 0.33): parallel EAGLE-3, K tokens per forward
after a mask token, with its own embeddings and an LM head over a draft vocabulary (`d2t`/`t2d`
maps); the Domino head grafted on its per-slot hidden states. Facts and sources: docs/peagle.md.

The drafter is adapters/peagle/model.py and its adapter (plan, build) adapters/peagle/adapter.py,
imported on first use: this module stays torch-free so that `validate` never loads torch. The bundle is the default layout: `drafter/` is a speculators
P-EAGLE checkpoint (config.json + model.safetensors, d2t/t2d included as speculators writes them:
int64 / bool, whatever the export dtype) and `head.safetensors` the Domino head.
"""

from __future__ import annotations

from ..family import Family
from .schema import PEagleDrafter


class PEagleFamily(Family):
    name = "peagle"
    display_name = "P-EAGLE"
    names_verifier = True  # adapters/speculators.py
    schema = PEagleDrafter
    model_module = f"{__name__}.adapter"
    # speculators' own dtypes, kept bit for bit in runs and bundles of any export dtype (the core
    # casts only floating-point tensors); present when draft_vocab_size < the target's vocabulary
    exact_dtypes = {"d2t": "int64", "t2d": "bool"}

    def drafter_summary(self, adapter):
        cfg = adapter.cfg
        return {"num_layers": cfg.num_hidden_layers, "target_layer_ids": list(cfg.target_layer_ids),
                "mask_token_id": cfg.mask_token_id, "draft_vocab_size": cfg.draft_vocab_size,
                "vocab_maps": cfg.draft_vocab_size != cfg.vocab_size}


FAMILY = PEagleFamily()
