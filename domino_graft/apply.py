"""`domino-graft apply`: recipe -> plan -> (load, attach) -> run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .device import pick_device
from .graft import GraftPlan, plan_graft
from .memory import check_fits
from .recipe import load_recipe


def apply_recipe(recipe_path: str, out: Optional[str] = None, *, dry_run: bool = False,
                 overrides: list[str] | None = None, echo=print, force: bool = False) -> tuple[GraftPlan, Optional[Path]]:
    """force: replace an existing run dir at `out` (never anything else, never a run in training)."""
    from .artifacts.rundir import check_run_destination, default_run_dir, write_run_dir

    recipe = load_recipe(recipe_path, overrides)
    plan = plan_graft(recipe, name=Path(recipe_path).stem)
    out_dir = Path(out) if out else default_run_dir(recipe_path)
    if not dry_run:
        # before the plan and minutes of loading; an existing run is work, replaced only on request
        replacing = check_run_destination(out_dir, force=force, option="-o" if out else "-o (default runs/<recipe>)")
        check_fits(plan, random_target=recipe.target.random is not None)  # before gigabytes are asked for
    echo(plan.format())
    if dry_run:
        return plan, None

    # the plan took a fraction of a second; importing torch and loading the models take seconds
    echo("loading torch, the target and the drafter …")
    from .graft import Graft, build_head, effective_recipe
    from .registry import get_family
    from .target import load_target

    device = pick_device(recipe.device)
    target = load_target(recipe.target, device=device)
    adapter, head_tensors = get_family(recipe.drafter.family).build(recipe.drafter, target)
    head = build_head(recipe, adapter, head_tensors).to(device)
    graft = Graft(adapter, head)  # checks the head fits the drafter's hook points
    # record the head actually built (a bundle's G / r / pure prefix), not schema defaults
    recipe = effective_recipe(recipe, head.spec)
    if replacing:  # again: a train may have started on it meanwhile
        check_run_destination(out_dir, force=force)
    write_run_dir(
        out_dir,
        recipe_path=recipe_path,
        recipe=recipe,
        plan=plan.to_dict(),
        adapter=graft.adapter,
        head=graft.head,
        target_identity=target.identity,
        force=replacing,
    )
    echo(("replaced" if replacing else "wrote") + f" run dir {out_dir}" + (" (head loaded from the drafter checkpoint)" if head_tensors else ""))
    return plan, out_dir
