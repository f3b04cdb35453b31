"""Medusa-1 heads (FasterDecoding layout) on the frozen target; static trees.

The drafter is adapters/medusa/model.py and its adapter (plan, build) adapters/medusa/adapter.py
(imported on first use: this module stays torch-free so that `validate` never loads torch)."""

from __future__ import annotations

from ..family import Family
from .schema import MedusaDrafter


class MedusaFamily(Family):
    name = "medusa"
    display_name = "Medusa-1"
    schema = MedusaDrafter
    # drafter/ of a bundle is a FasterDecoding folder: config.json + medusa_lm_head.safetensors
    drafter_weights_file = "medusa_lm_head.safetensors"
    model_module = f"{__name__}.adapter"


FAMILY = MedusaFamily()
