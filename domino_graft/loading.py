"""One entry point for commands that accept RUN_OR_BUNDLE."""

from __future__ import annotations

from pathlib import Path


def load_run_or_bundle(path: str | None, *, device: str = "cpu", **kw):
    """A run dir (from `apply`/`train`) or an exported bundle -> LoadedRun.

    `path=None` means the most recent run."""
    from .checkpoint import read_json
    from .rundir import load_run, resolve_run

    if path is not None and (Path(path) / "manifest.json").is_file():
        kind = read_json(Path(path) / "manifest.json").get("kind", "")
        if kind == "domino-graft bundle":
            from .bundle import load_bundle

            return load_bundle(path, device=device, **kw)
    return load_run(resolve_run(path), device=device)
