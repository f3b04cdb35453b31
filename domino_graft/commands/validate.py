"""`domino-graft validate RECIPE...` — schema check of recipes; never imports torch."""

from __future__ import annotations

import sys


def add_arguments(p) -> None:
    p.add_argument("recipes", nargs="+", metavar="RECIPE", help="recipe YAML files or shipped recipes' names")


def run(args) -> int:
    from ..recipe import RecipeError, load_recipe

    bad = 0
    for path in args.recipes:
        try:
            load_recipe(path)
        except RecipeError as e:
            bad += 1
            print(str(e), file=sys.stderr)
        else:
            print(f"{path}: ok")
    return 1 if bad else 0
