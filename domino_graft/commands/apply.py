"""`domino-graft apply RECIPE [-o RUN_DIR] [--dry-run] [KEY=VALUE ...]`."""

from __future__ import annotations


def add_arguments(p) -> None:
    from .train import allow_intermixed

    allow_intermixed(p)  # `apply R -o X k=v` as well as `apply R k=v -o X`
    p.add_argument("-o", "--out", metavar="RUN_DIR", help="run directory (default: runs/<recipe stem>)")
    p.add_argument("--dry-run", action="store_true", help="print the plan from configs alone; load nothing")
    p.add_argument("--force", action="store_true", help="replace an existing run dir at RUN_DIR (its trained weights "
                   "and checkpoints are lost); anything else there is never replaced")
    p.add_argument("items", nargs="+", metavar="RECIPE [KEY=VALUE ...]", help="the recipe (a YAML file or a shipped recipe's name, see `domino-graft recipes`), "
                   "then overrides, re-validated (a relative path in an override is taken from the current directory)")


def run(args) -> int:
    from ..apply import apply_recipe
    from .train import split_run_and_overrides

    recipe, overrides = split_run_and_overrides(args.items, "RECIPE")
    if recipe is None:
        raise ValueError("RECIPE: missing; give a recipe YAML file or a shipped recipe's name, e.g. tiny_dflash")
    apply_recipe(recipe, args.out, dry_run=args.dry_run, overrides=overrides, force=args.force)
    return 0
