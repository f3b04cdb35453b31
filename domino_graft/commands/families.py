"""`domino-graft families` — the drafter families this installation knows (built-in and installed)."""

from __future__ import annotations


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    from ..registry import families

    found = families()
    width = max(map(len, found), default=0)
    for name, family in found.items():
        formats = ", ".join(family.export_formats)
        print(f"{name:<{width}}  {family.display_name}: export {formats}; from {type(family).__module__}")
    return 0
