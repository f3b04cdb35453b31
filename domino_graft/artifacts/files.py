"""Atomic file I/O: every file and folder domino-graft writes goes to a temporary sibling first and
is renamed into place, so an interrupted command never leaves a half-written file or folder behind;
JSON files of artifacts are read strictly (size, depth, an object), and checksummed.

Tensors (safetensors read and written with strict checks, dtypes) are artifacts/tensors.py; the
destinations commands write to, artifacts/destination.py. (Training checkpoints, and resuming from
them, are domino_graft/training/resume.py, which writes its files through these modules.)
"""

from __future__ import annotations

import contextlib
import errno as _errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator


class CheckpointError(ValueError):
    """A checkpoint does not match what it must be; the message names the tensor."""


class DestinationError(ValueError):
    """An output path that must not be written: it holds something else, or needs --force."""


def with_path(e: OSError, path) -> OSError:
    """The same OSError, naming `path` when it names no file (a failed write() names none)."""
    if getattr(e, "filename", None) is not None or e.errno is None:
        return e
    out = type(e)(e.errno, e.strerror or os.strerror(e.errno), str(path))
    out.__cause__ = e
    return out


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temp folder next to `final`; on success it replaces `final` in one rename.

    overwrite=False: an existing `final` (other than an empty folder) is left alone and the
    write fails. A failed replace puts the old `final` back."""
    final = Path(final)
    created = _missing_parents(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as e:
        _remove_empty(created)
        raise with_path(e, final.parent) from None
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp makes 0700; a run dir or bundle is meant to be shared
        if final.is_dir() and not final.is_symlink() and not any(final.iterdir()):
            final.rmdir()  # an empty folder holds nothing to lose
        if final.exists() or final.is_symlink():
            if not overwrite:
                raise _appeared(final)
            trash = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, trash)
            try:
                os.replace(tmp, final)
            except BaseException:
                os.replace(trash, final)
                raise
            shutil.rmtree(trash, ignore_errors=True)
        else:
            try:
                os.replace(tmp, final)
            except OSError as e:  # another writer's folder landed between the check above and this rename
                if overwrite or e.errno not in (_errno.ENOTEMPTY, _errno.EEXIST):
                    raise
                raise _appeared(final) from None
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise _in_final(with_path(e, final), tmp, final) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise


def _appeared(final: Path) -> FileExistsError:
    """`final` exists now though it did not when the write began (overwrite=False): nothing is replaced."""
    return FileExistsError(_errno.EEXIST, "appeared while it was being written; nothing replaced", str(final))


def _missing_parents(final: Path) -> list[Path]:
    """The folders above `final` that do not exist yet, deepest first."""
    out, p = [], final.parent
    while not (p.exists() or p.is_symlink()) and p != p.parent:
        out.append(p)
        p = p.parent
    return out


def _remove_empty(folders: list[Path]) -> None:
    """A failed write leaves no folder it created behind (deepest first; only if empty)."""
    for p in folders:
        with contextlib.suppress(OSError):
            p.rmdir()


def _in_final(e: OSError, tmp: Path, final: Path) -> OSError:
    """An error about a file inside the temp folder names it where it was going (the temp
    folder is gone by the time anyone reads the message)."""
    name = e.filename
    if isinstance(name, (str, os.PathLike)) and str(name).startswith(str(tmp)):
        out = type(e)(e.errno, e.strerror, str(final) + str(name)[len(str(tmp)):])
        out.__cause__ = e
        return out
    return e


def _write_temp(path: Path, data: bytes) -> str:
    """`data` in a new temp sibling of `path` (synced); its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    try:
        os.replace(_write_temp(path, data), path)
    except OSError as e:
        raise with_path(e, path) from None


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    try:
        atomic_write_bytes(path, text.encode())
    except OSError as e:
        raise with_path(e, path) from None


def json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode()


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    try:
        atomic_write_bytes(path, json_bytes(obj))
    except OSError as e:
        raise with_path(e, path) from None


@contextlib.contextmanager
def staged_writes() -> Iterator[Callable[[str | os.PathLike, bytes], None]]:
    """Several files replaced together: `stage(path, data)` writes each to a temp sibling, and
    only when every one is written are they renamed into place, in order. A failure (a full
    disk) while writing removes the temps and leaves every file as it was."""
    staged: list[tuple[str, Path]] = []

    def stage(path, data: bytes) -> None:
        path = Path(path)
        try:
            staged.append((_write_temp(path, data), path))
        except OSError as e:
            raise with_path(e, path) from None

    try:
        yield stage
        for tmp, final in staged:
            try:
                os.replace(tmp, final)
            except OSError as e:
                raise with_path(e, final) from None
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


# A config.json, manifest.json or resolved recipe is kilobytes (a 1,000-tensor manifest: ~300 KB);
# a bigger one is not one of them, and parsing it would cost seconds and memory for nothing.
MAX_JSON_BYTES = 16 * 2**20


def read_json(path: str | os.PathLike, *, missing: str = "file not found", what: str = "JSON object") -> dict:
    """A JSON file of an artifact: FileNotFoundError / CheckpointError naming the file."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder, expected a JSON file")
    if not path.is_file():
        if path.is_symlink():  # a dangling link or a loop (ELOOP): say so, not "not found"
            path.stat()  # raises the OSError that names the path and the reason
        raise FileNotFoundError(f"{path}: {missing}")
    return parse_json_file(path, what=what)


def parse_json_file(path: Path, *, what: str = "JSON object") -> dict:
    """An existing regular file's JSON object, size- and depth-checked; CheckpointError naming it."""
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise CheckpointError(f"{path}: {size:,} bytes; valid: a JSON {what.removeprefix('JSON ')} of at most "
                                  f"{MAX_JSON_BYTES:,} bytes")
        text = path.read_bytes().decode()
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON (not UTF-8 text: {e.reason} at byte {e.start})") from None
    except OSError as e:
        raise with_path(e, path) from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:  # "[[[[...": Python's parser gives up; no config nests that deep
        raise CheckpointError(f"{path}: JSON nested too deeply to read; valid: a {what}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a {what}, got {type(data).__name__}")
    return data




def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
