"""Drafter families. One module per family; this registry maps recipe names to them.

Installed as `domino_graft.adapters` (the bare name `adapters` is taken on PyPI).
Each family module provides:

    config_from_recipe(drafter_recipe, target_shape) -> family config (from configs alone)
    plan(drafter_recipe, target_shape) -> FamilyPlan
    build(drafter_recipe, target) -> (DrafterAdapter, head tensors found in the checkpoint or {})
"""

from __future__ import annotations

import importlib

FAMILY_MODULES = {
    "dflash": "domino_graft.adapters.dflash",
    "medusa": "domino_graft.adapters.medusa",
    "pard": "domino_graft.adapters.pard",
}


def family_module(name: str):
    if name not in FAMILY_MODULES:
        raise ValueError(
            f"drafter.family: {name!r} has no adapter in this version; available: {', '.join(FAMILY_MODULES)}"
        )
    return importlib.import_module(FAMILY_MODULES[name])
