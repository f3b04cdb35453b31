"""Plan a graft from configs alone, then attach a Domino head to a drafter adapter.

The graft owns only the head's weights. It never edits the drafter: the head reads the
adapter's hook points (per-slot hidden, base logits, previous-token embeddings), so
removing the graft gives back the untouched drafter, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .recipe import Recipe


@dataclass
class GraftPlan:
    name: str
    target: dict  # TargetShape fields
    target_source: str
    drafter: "object"  # adapters.plan.FamilyPlan
    head_spec: dict
    head_tensors: dict[str, tuple[int, ...]]

    @property
    def head_parameters(self) -> int:
        from .adapters.plan import count_parameters

        return count_parameters(self.head_tensors)

    @property
    def share_of_backbone(self) -> float:
        return self.head_parameters / max(1, self.drafter.backbone_parameters)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        d = self.drafter
        return {
            "name": self.name,
            "target": self.target,
            "target_source": self.target_source,
            "drafter": {
                "family": d.family,
                "summary": d.summary,
                "source": d.source,
                "num_slots": d.num_slots,
                "capture_layers": d.capture_layers,
                "backbone_parameters": d.backbone_parameters,
                "hooks": [asdict(h) for h in d.hooks],
            },
            "head": {
                "spec": self.head_spec,
                "tensors": {k: list(v) for k, v in self.head_tensors.items()},
                "parameters": self.head_parameters,
                "share_of_backbone": self.share_of_backbone,
            },
        }

    def format(self) -> str:
        d = self.drafter
        t = self.target
        lines = [
            f"Graft plan: {self.name}",
            f"  target   {t['architecture']}: hidden {t['hidden_size']}, {t['num_layers']} layers, "
            f"vocab {t['vocab_size']}  ({self.target_source})",
            f"  drafter  {d.summary}",
            # slots numbered as train and bench number them: 1..K after the anchor (docs/design.md §2)
            f"           source: {d.source}; {d.num_slots} proposals per block (slots 1..{d.num_slots} after "
            f"the anchor); backbone {d.backbone_parameters:,} parameters",
            "  hook points",
        ]
        for h in d.hooks:
            lines.append(f"    {h.name:<12} {h.shape:<22} {h.source}")
        lines.append("  Domino head tensors")
        for name, shape in self.head_tensors.items():
            lines.append(f"    {name:<26} {str(list(shape)):<16} {math.prod(shape):>14,}")
        lines.append(
            f"  head parameters {self.head_parameters:,} "
            f"(+{100 * self.share_of_backbone:.2f}% of the backbone's {d.backbone_parameters:,})"
        )
        return "\n".join(lines)


HEAD_CHECKPOINT_FIELDS = ("gru_hidden_dim", "rank", "pure_prefix_len")


def resolve_head_fields(recipe: Recipe, checkpoint: dict | None, source: str = "the drafter checkpoint") -> dict:
    """G, r and the pure prefix: the checkpoint's where it declares a head, else the recipe's.

    A value the recipe sets explicitly and the checkpoint contradicts is an error naming both:
    silently preferring either would train or serve a head of the wrong shape."""
    out = {k: getattr(recipe.head, k) for k in HEAD_CHECKPOINT_FIELDS}
    conflicts = []
    for k, v in (checkpoint or {}).items():
        if k in recipe.head.model_fields_set and getattr(recipe.head, k) != v:
            conflicts.append(f"head.{k}: the recipe sets {getattr(recipe.head, k)!r} but {source} has {v!r}")
        out[k] = v
    if conflicts:
        raise ValueError("; ".join(conflicts) + " (remove the recipe value to use the checkpoint's)")
    return out


def effective_recipe(recipe: Recipe, spec) -> Recipe:
    """The recipe with the head fields the head was actually built with (a run dir must
    record the checkpoint's G/r/pure prefix, not the schema defaults it replaced), and the
    drafter fields its checkpoint decided (a family's `recipe_values`): a run's resolved
    recipe lists every field, and reloading the run must not find the schema's default for
    a value the user never set contradicting the checkpoint it was built from."""
    head = recipe.head.model_copy(update={k: getattr(spec, k) for k in HEAD_CHECKPOINT_FIELDS})
    update = {"head": head}
    values = _drafter_values(recipe)
    if values:
        update["drafter"] = recipe.drafter.model_copy(update=values)
    return recipe.model_copy(update=update)


def _drafter_values(recipe: Recipe) -> dict:
    """{drafter field: value the drafter is built with} for the fields its checkpoint decides."""
    from .registry import get_family
    from .target import TargetShape, target_config_dict

    family = get_family(recipe.drafter.family)
    model_module = getattr(family, "model_module", None)
    if not model_module:
        return {}
    import importlib

    values_of = getattr(importlib.import_module(model_module), "recipe_values", None)
    if values_of is None:
        return {}
    tshape = TargetShape.from_config_dict(target_config_dict(recipe.target))
    return {k: v for k, v in values_of(recipe.drafter, tshape).items() if k in type(recipe.drafter).model_fields}


def head_spec_for(recipe: Recipe, fam_plan, checkpoint: dict | None = None) -> "HeadSpec":
    from .head import HeadSpec

    return HeadSpec(
        hidden_dim=fam_plan.hidden_dim,
        emb_dim=fam_plan.emb_dim,
        vocab_size=fam_plan.vocab_size,
        **resolve_head_fields(recipe, checkpoint),
    )


def plan_graft(recipe: Recipe, *, name: str = "recipe") -> GraftPlan:
    """Pure data from configs: no weights are read. Checks that need the target's or the
    drafter's config (layer ids, token ids, slots, positions) fail here, every problem at once,
    one line each, as a RecipeError."""
    from dataclasses import asdict

    from .recipe import RecipeError
    from .registry import get_family
    from .target import TargetShape, target_config_dict

    tshape = TargetShape.from_config_dict(target_config_dict(recipe.target))
    family = get_family(recipe.drafter.family)
    problems = _target_checks(recipe, tshape)
    try:
        fam = family.plan(recipe.drafter, tshape)
        spec = head_spec_for(recipe, fam, family.checkpoint_head_fields(recipe.drafter))
    except ValueError as e:
        if type(e) is not ValueError and not problems:  # a checkpoint's or recipe's own error, as it is
            raise
        raise RecipeError(recipe.name or name, [*str(e).splitlines(), *problems]) from None
    k = fam.num_slots
    if spec.pure_prefix_len >= k:
        came = "" if "pure_prefix_len" in recipe.head.model_fields_set else " (the drafter checkpoint's)"
        problems.append(f"head.pure_prefix_len: {spec.pure_prefix_len}{came} is invalid; valid: 0..{k - 1} (the "
                        f"drafter makes {k} proposal(s) per block; slots 1..pure_prefix_len stay uncorrected)")
    if problems:
        raise RecipeError(recipe.name or name, problems)
    t = recipe.target
    source = "random (seed %d)" % t.random.seed if t.random else (t.path or f"asset {t.asset}")
    return GraftPlan(
        name=recipe.name or name,
        target=asdict(tshape),
        target_source=source,
        drafter=fam,
        head_spec=spec.to_dict(),
        head_tensors=spec.tensor_shapes(),
    )


def _target_checks(recipe: Recipe, tshape) -> list[str]:
    """Recipe values that must fit the target's config: sequence lengths in positions."""
    problems = []
    positions = tshape.max_position_embeddings
    if recipe.bench.max_new_tokens >= positions:
        problems.append(f"bench.max_new_tokens: {recipe.bench.max_new_tokens} is invalid; valid: 1..{positions - 1} "
                        f"(the target has {positions:,} positions, max_position_embeddings, and a prompt needs one)")
    if recipe.train.data.max_length > positions:
        problems.append(f"train.data.max_length: {recipe.train.data.max_length} is invalid; valid: 8..{positions} "
                        f"(the target has {positions:,} positions, max_position_embeddings)")
    return problems


class Graft:
    """A drafter adapter with a Domino head attached at its hook points."""

    def __init__(self, adapter, head):
        spec = head.spec
        if (spec.hidden_dim, spec.emb_dim, spec.vocab_size) != (adapter.hidden_dim, adapter.emb_dim, adapter.vocab_size):
            raise ValueError(
                f"head spec (hidden {spec.hidden_dim}, emb {spec.emb_dim}, vocab {spec.vocab_size}) does not fit the "
                f"drafter (hidden {adapter.hidden_dim}, emb {adapter.emb_dim}, vocab {adapter.vocab_size})"
            )
        self.adapter = adapter
        self.head = head

    def block_logits(self, block, prev_ids):
        """Teacher-forced final logits for a proposed block: prev_ids [B, K] = x_0..x_{K-1}."""
        return self.head.block(block.hidden, block.base_logits, self.adapter.embed(prev_ids))

    def detach(self):
        """Remove the graft: the drafter as it was (the graft never modified it)."""
        adapter, self.adapter, self.head = self.adapter, None, None
        return adapter


def build_head(recipe: Recipe, adapter, head_tensors: dict | None = None):
    """A fresh (seeded) head, or the one found in the drafter's checkpoint (checked strictly)."""
    import torch

    from .artifacts.tensors import check_tensors
    from .head import DominoHead, HeadSpec

    # A checkpoint whose config declares a Domino head (adapters set checkpoint_head_fields)
    # must supply all of it: a missing head never degrades to a fresh one (SpecForge's
    # substring-tolerant loader lets a bundle without `embed_proj.*` load silently).
    declared = getattr(adapter, "checkpoint_head_fields", None) or {}
    spec = HeadSpec(
        hidden_dim=adapter.hidden_dim,
        emb_dim=adapter.emb_dim,
        vocab_size=adapter.vocab_size,
        **resolve_head_fields(recipe, declared),
    )
    torch.manual_seed(recipe.head.seed)
    head = DominoHead(spec, zero_init_w2=recipe.head.zero_init_w2)
    if head_tensors or declared:
        head_tensors = head_tensors or {}
        check_tensors(head_tensors, spec.tensor_shapes(), source="drafter checkpoint (Domino head)")
        head.load_state_dict({k: v.float() for k, v in head_tensors.items()}, strict=True)
    return head
