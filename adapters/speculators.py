"""What the speculators checkpoint layout (DSpark, P-EAGLE) says about the target it drafts for.

speculators' `from_pretrained` reads `speculators_config.verifier.name_or_path` to load the
verifier's config (and, for DSpark, its embeddings and LM head): a null name sends it to the
Hub, where it fails or, worse, leaves those tensors uninitialised. So the drafter's config names
the target it was built on whenever the recipe has one (a model folder or a fetched asset's
folder); only a random target, which exists nowhere but in domino-graft's seed, leaves it null.
"""

from __future__ import annotations

from typing import Optional


def target_name_or_path(target) -> Optional[str]:
    """The folder (or hub name) the target was loaded from; None for a random target."""
    identity = getattr(target, "identity", None) or {}
    if identity.get("kind") == "random":
        return None
    return identity.get("path") or identity.get("name_or_path")


def verifier_entry(spec: dict, target, architecture: str) -> dict:
    """speculators_config.verifier: a checkpoint's own named verifier is kept; otherwise the target's."""
    given = dict(spec.get("verifier") or {})
    if given.get("name_or_path"):
        return given
    given["name_or_path"] = target_name_or_path(target)
    given.setdefault("architectures", [architecture])
    return given
