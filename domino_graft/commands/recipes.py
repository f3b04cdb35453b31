"""`domino-graft recipes` — the shipped recipes, by name (`domino-graft apply NAME` takes one)."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("--path", metavar="NAME", help="print the path of one shipped recipe (to copy and edit it)")


def _title(text: str) -> str:
    """A recipe's first header line: what it is for."""
    for line in text.splitlines():
        if line.startswith("#") and line.lstrip("# ").strip():
            return line.lstrip("# ").strip()
    return ""


def run(args) -> int:
    from ..recipe import find_recipe, shipped_recipes

    if args.path:
        print(find_recipe(args.path))
        return 0
    shipped = shipped_recipes()
    width = max(map(len, shipped), default=0)
    for name, path in shipped.items():
        print(f"{name:<{width}}  {_title(path.read_text())}")
    return 0
