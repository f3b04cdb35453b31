"""Atomic file I/O: atomic writes, safetensors read and written with strict checks, checksums.

Everything domino-graft writes goes to a temporary sibling first and is renamed into
place, so an interrupted command never leaves a half-written file or folder behind.
(Training checkpoints, and resuming from them, are domino_graft/training/resume.py, which
writes its files through this module.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Mapping


class CheckpointError(ValueError):
    """A checkpoint does not match what it must be; the message names the tensor."""


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temp folder next to `final`; on success it replaces `final` in one rename."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp makes 0700; a run dir or bundle is meant to be shared
        if final.exists():
            if not overwrite:
                raise FileExistsError(f"{final} exists")
            trash = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: str | os.PathLike, *, missing: str = "file not found") -> dict:
    """A JSON file of an artifact: FileNotFoundError / CheckpointError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {missing}")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def save_tensors(path: str | os.PathLike, tensors: Mapping, metadata: dict | None = None) -> None:
    from safetensors.torch import save

    clean = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    meta = {k: str(v) for k, v in (metadata or {}).items()}
    atomic_write_bytes(path, save(clean, metadata=meta))


def load_tensors(path: str | os.PathLike, device: str = "cpu") -> dict:
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        return load_file(str(path), device=device)
    except Exception as e:  # safetensors raises several types for corrupt headers
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def tensor_sha256(t) -> str:
    import torch

    raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def check_tensors(
    tensors: Mapping,
    expected: Mapping[str, tuple[int, ...]],
    *,
    source: str,
    dtype=None,
) -> None:
    """Exact key and shape match, or one error listing every offending tensor by name.

    No substring tolerance: a missing `embed_proj.*` is as fatal as a missing layer.
    """
    problems = []
    for name, shape in expected.items():
        if name not in tensors:
            problems.append(f"missing tensor {name!r} (expected shape {list(shape)})")
        elif tuple(tensors[name].shape) != tuple(shape):
            problems.append(
                f"tensor {name!r} has shape {list(tensors[name].shape)}, expected {list(shape)}"
            )
        elif dtype is not None and tensors[name].dtype != dtype:
            problems.append(f"tensor {name!r} has dtype {tensors[name].dtype}, expected {dtype}")
    for name in tensors:
        if name not in expected:
            problems.append(f"unexpected tensor {name!r} (shape {list(tensors[name].shape)})")
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))
