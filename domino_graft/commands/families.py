"""`domino-graft families` — the drafter families this installation knows (built-in and installed)."""

from __future__ import annotations


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    import sys

    from ..registry import broken_plugins, families

    found = families()
    width = max(map(len, found), default=0)
    for name, family in found.items():
        formats = ", ".join(family.export_formats)
        print(f"{name:<{width}}  {family.display_name}: export {formats}; from {type(family).__module__}")
    broken = broken_plugins()
    if broken:  # each was warned about, with its reason, at the scan; this is the command's answer
        print(f"error: {len(broken)} installed plug-in(s) ignored: {', '.join(map(repr, broken))} (reasons above)",
              file=sys.stderr)
    return 1 if broken else 0
