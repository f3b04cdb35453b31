"""One entry point for commands that accept RUN_OR_BUNDLE."""

from __future__ import annotations

import json
from pathlib import Path


def load_run_or_bundle(path: str | None, *, device: str = "cpu", **kw):
    """A run dir (from `apply`/`train`) or an exported bundle -> LoadedRun.

    `path=None` means the most recent run."""
    from .rundir import load_run, resolve_run

    if path is not None and (Path(path) / "manifest.json").is_file():
        kind = json.loads((Path(path) / "manifest.json").read_text()).get("kind", "")
        if kind == "domino-graft bundle":
            from .bundle import load_bundle  # provided by the export/import module

            return load_bundle(path, device=device, **kw)
    return load_run(resolve_run(path), device=device)
