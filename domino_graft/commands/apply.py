"""`domino-graft apply RECIPE [-o RUN_DIR] [--dry-run] [KEY=VALUE ...]`."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument("-o", "--out", metavar="RUN_DIR", help="run directory (default: runs/<recipe stem>)")
    p.add_argument("--dry-run", action="store_true", help="print the plan from configs alone; load nothing")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, re-validated")


def run(args) -> int:
    from ..apply import apply_recipe

    apply_recipe(args.recipe, args.out, dry_run=args.dry_run, overrides=args.overrides)
    return 0
