"""DSpark (speculators 0.9.0, served by vLLM 0.33): a DFlash backbone plus a sequential low-rank
Markov head and a confidence head; the Domino head grafted in place of the Markov head or on top
of it (`drafter.graft`). Facts and sources: docs/dspark.md.

The drafter is adapters/dspark/model.py (it reuses adapters/dflash/model.py's backbone) and its
adapter (plan, build) adapters/dspark/adapter.py,
imported on first use: this module stays torch-free so that `validate` never loads torch.
The bundle is the default layout: `drafter/` is a speculators DSpark checkpoint (config.json +
model.safetensors, Markov and confidence tensors included) and `head.safetensors` the Domino head.
"""

from __future__ import annotations

from ..family import Family
from .schema import DSparkDrafter


class DSparkFamily(Family):
    name = "dspark"
    display_name = "DSpark"
    names_verifier = True  # adapters/speculators.py
    schema = DSparkDrafter
    model_module = f"{__name__}.adapter"

    def drafter_summary(self, adapter):
        cfg, m = adapter.cfg, adapter.mcfg
        return {"block_size": cfg.block_size, "sample_from_anchor": m.sample_from_anchor,
                "target_layer_ids": list(cfg.target_layer_ids), "markov_rank": m.markov_rank,
                "markov_head_type": m.markov_head_type, "graft": adapter.graft}


FAMILY = DSparkFamily()
