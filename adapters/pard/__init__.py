"""PARD: a small causal LM drafting k tokens in one forward (its own embedding and LM head).

The drafter is adapters/pard/model.py and its adapter (plan, build) adapters/pard/adapter.py
(imported on first use: this module stays torch-free so that `validate` never loads torch)."""

from __future__ import annotations

from ..family import Family
from .schema import PardDrafter


class PardFamily(Family):
    name = "pard"
    display_name = "PARD"
    schema = PardDrafter
    # drafter/ of a bundle is a plain HF causal-LM folder with `pard_token` in its config.json
    model_module = f"{__name__}.adapter"


FAMILY = PardFamily()
