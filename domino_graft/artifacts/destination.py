"""The destinations commands write to: `check_destination` keeps an output from replacing what
is already there (another kind of thing: never; its own kind: with --force)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

from .files import DestinationError


# --------------------------------------------------------------------------- destinations
ARTIFACT_KINDS = {"run": "domino-graft run", "bundle": "domino-graft bundle"}


def _describe(p: Path) -> str:
    """What is at `p`, in a few words, for a refusal message."""
    if p.is_symlink() and not p.exists():
        return "a dangling symlink"
    if p.is_dir():
        try:
            names = sorted(x.name for x in p.iterdir())
        except OSError as e:
            return f"a folder that cannot be read ({e.strerror})"
        shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
        kind = None
        if (p / "manifest.json").is_file():
            with contextlib.suppress(Exception):
                kind = json.loads((p / "manifest.json").read_text()).get("kind")
        what = f"a {kind}" if isinstance(kind, str) and kind else "a folder"
        return f"{what} holding {len(names)} entr{'y' if len(names) == 1 else 'ies'} ({shown})"
    if p.is_file():
        return f"a file of {p.stat().st_size:,} bytes"
    return "not a regular file or folder"


def check_output_path(path: str | os.PathLike, *, option: str) -> None:
    """`path` can be created: its nearest existing ancestor is a folder that takes new entries
    (not a file, not /proc, not read-only). Probed with an empty temp folder, removed at once."""
    path = Path(path)
    anc = path.parent
    while not (anc.exists() or anc.is_symlink()) and anc != anc.parent:
        anc = anc.parent
    if anc.exists() and not anc.is_dir():
        raise DestinationError(f"{option}: cannot write {path}: {anc} is {_describe(anc)}, not a folder")
    try:
        probe = tempfile.mkdtemp(prefix=".domino-graft-probe-", dir=anc)
    except OSError as e:
        raise DestinationError(f"{option}: cannot write {path}: cannot create anything under {anc} "
                               f"({e.strerror or e})") from None
    os.rmdir(probe)


def check_destination(path: str | os.PathLike, *, kind: str, option: str, force: bool = False,
                      is_kind: Optional[Callable[[Path], bool]] = None, locked: Optional[Callable[[Path], Optional[str]]] = None) -> bool:
    """May this command write its `kind` of artifact at `path`? Returns whether something of
    that kind is there (to be replaced: force was given). Refuses, naming the path and what it
    holds, anything else that is not empty, and its own kind without --force.

    kind: "run" / "bundle" (a folder whose manifest.json says so), or a file kind with
    `is_kind(path) -> bool` ("bench report", ...). locked(path): a reason it is in use, or None."""
    path = Path(path)
    label = ARTIFACT_KINDS.get(kind, kind)
    folder_kind = kind in ARTIFACT_KINDS
    if not (path.exists() or path.is_symlink()):
        check_output_path(path, option=option)
        return False
    if folder_kind:
        if path.is_dir() and not path.is_symlink():
            try:
                empty = not any(path.iterdir())
            except OSError as e:
                raise DestinationError(f"{option}: {path}: cannot be read ({e.strerror})") from None
            if empty:
                check_output_path(path, option=option)
                return False
        own = path.is_dir() and _manifest_kind(path) == label
    else:
        if path.is_file() and path.stat().st_size == 0:
            return False
        own = path.is_file() and bool(is_kind and is_kind(path))
    if not own:
        raise DestinationError(
            f"{option}: {path} already exists and is not a {label}: it is {_describe(path)}; refusing to write "
            "over it (--force replaces only a " + label + "): choose another path, or move it away")
    if locked is not None:
        reason = locked(path)
        if reason:
            raise DestinationError(f"{option}: {path} is a {label} in use ({reason}); not replacing it")
    if not force:
        raise DestinationError(f"{option}: {path} is an existing {label}{_summary(path, kind)}; "
                               "pass --force to replace it, or choose another path")
    return True


def _summary(path: Path, kind: str) -> str:
    """A few words on an artifact about to be refused: what --force would throw away."""
    try:
        if kind == "run":
            m = json.loads((path / "manifest.json").read_text())
            steps = (m.get("training") or {}).get("steps")
            ckpts = len(list((path / "checkpoints").glob("step-*"))) if (path / "checkpoints").is_dir() else 0
            return (f" (trained {steps} steps" if steps else " (not trained") + f", {ckpts} checkpoint(s))"
        if kind == "bundle":
            m = json.loads((path / "manifest.json").read_text())
            return f" ({m.get('format')}, {m.get('dtype')})"
        return f" ({path.stat().st_size:,} bytes)"
    except (OSError, ValueError, AttributeError):
        return ""


def _manifest_kind(folder: Path) -> Optional[str]:
    try:
        data = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return data.get("kind") if isinstance(data, dict) else None
