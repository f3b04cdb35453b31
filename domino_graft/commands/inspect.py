"""`domino-graft inspect BUNDLE_OR_CHECKPOINT [--target DIR] [--json]`: family, shapes, dtype,
head, the sha256 status and every engine checklist, for a bundle or a third-party folder
(domino_graft/export/inspect.py)."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("path", metavar="BUNDLE_OR_CHECKPOINT", help="a bundle from `domino-graft export`, or a checkpoint "
                   "folder in a layout a registered family reads (`domino-graft families`), e.g. a third-party drafter")
    p.add_argument("--target", metavar="DIR", help="the target's folder (or its config.json), for the rules that need "
                   "its vocabulary size; a bundle's manifest already records it")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    import json

    from ..export.inspect import inspect_path

    report = inspect_path(args.path, target=args.target)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format_text())
    return 0
