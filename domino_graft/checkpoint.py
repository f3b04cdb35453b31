"""Atomic file I/O: atomic writes, safetensors read and written with strict checks, checksums,
and the destinations commands write to.

Everything domino-graft writes goes to a temporary sibling first and is renamed into
place, so an interrupted command never leaves a half-written file or folder behind.
Nothing non-finite is written or read: `save_tensors` refuses a NaN/Inf tensor and
`load_tensors` names the first one a file holds. `check_destination` keeps an output from
replacing what is already there (another kind of thing: never; its own kind: with --force).
(Training checkpoints, and resuming from them, are domino_graft/training/resume.py, which
writes its files through this module.)
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
from typing import Callable, Iterator, Mapping, Optional


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
                raise FileExistsError(_errno.EEXIST, "appeared while it was being written; nothing replaced",
                                      str(final))
            trash = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, trash)
            try:
                os.replace(tmp, final)
            except BaseException:
                os.replace(trash, final)
                raise
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise _in_final(with_path(e, final), tmp, final) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise


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


# ------------------------------------------------------------------------ finite tensors
def nonfinite_count(t) -> int:
    """How many NaN/Inf values a tensor holds (0 for integer and bool tensors). Chunked: no
    full-size temporary for the largest embedding matrices."""
    import torch

    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return 0
    flat = t.detach().reshape(-1)
    chunk = 1 << 24
    if flat.numel() <= chunk:
        return 0 if bool(torch.isfinite(flat).all()) else int((~torch.isfinite(flat)).sum())
    bad = 0
    for s in range(0, flat.numel(), chunk):
        part = flat[s : s + chunk]
        if not bool(torch.isfinite(part).all()):
            bad += int((~torch.isfinite(part)).sum())
    return bad


def first_nonfinite(tensors: Mapping) -> Optional[tuple[str, int, int]]:
    """(name, non-finite count, numel) of the first tensor holding NaN/Inf, or None."""
    for name, t in tensors.items():
        n = nonfinite_count(t)
        if n:
            return name, n, t.numel()
    return None


def check_finite(tensors: Mapping, *, source: str, hint: str = "") -> None:
    bad = first_nonfinite(tensors)
    if bad:
        name, n, total = bad
        raise CheckpointError(f"{source}: tensor {name!r} holds {n} non-finite value(s) (NaN/Inf) of {total}"
                              + (f"; {hint}" if hint else ""))


def tensors_bytes(tensors: Mapping, metadata: dict | None = None, *, source: str = "tensors") -> bytes:
    """safetensors bytes of `tensors`; refuses NaN/Inf (nothing non-finite is ever saved)."""
    from safetensors.torch import save

    clean = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    check_finite(clean, source=f"{source}: not saved")
    meta = {k: str(v) for k, v in (metadata or {}).items()}
    return save(clean, metadata=meta)


def save_tensors(path: str | os.PathLike, tensors: Mapping, metadata: dict | None = None) -> None:
    data = tensors_bytes(tensors, metadata, source=str(path))
    try:
        atomic_write_bytes(path, data)
    except OSError as e:
        raise with_path(e, path) from None


def load_tensors(path: str | os.PathLike, device: str = "cpu", *, finite: bool = True) -> dict:
    """A safetensors file, strictly: readable, and (finite=True) every tensor finite."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        tensors = load_file(str(path), device=device)
    except Exception as e:  # safetensors raises several types for corrupt headers
        raise CheckpointError(f"{path}: not a readable safetensors file ({_first_line(e)})") from None
    if finite:
        check_finite(tensors, source=str(path), hint="the weights are damaged (a diverged training run?)")
    return tensors


def torch_load(path: str | os.PathLike):
    """A torch file of a checkpoint (weights_only), or a CheckpointError naming it."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:  # weights_only: a .pt from the internet must never run code on load
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch / pickle raise many types for damaged files
        text = " ".join(str(e).split())
        if "Weights only load failed" in text:  # torch's own text would advise weights_only=False: never
            why = text.split("WeightsUnpickler error:", 1)[-1].split(" Check the documentation", 1)[0].strip()
            raise CheckpointError(f"{path}: not a readable torch file of plain tensors (the weights-only unpickler "
                                  f"stopped: {why[:120]}); nothing in it was run; valid: a safetensors file or a "
                                  "torch file of plain tensors") from None
        raise CheckpointError(f"{path}: not a readable torch file ({type(e).__name__}: {_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line if len(line) <= 160 else line[:157] + "..."


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ----------------------------------------------------------------------------- dtypes
# The rule (docs/design.md §3): only floating-point tensors take a run's or bundle's dtype;
# integer and bool tensors (P-EAGLE's d2t/t2d vocabulary maps) keep theirs bit for bit, in
# every file written and every file read. Names as manifests and messages write them.
SAFETENSORS_DTYPES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "F64": "fp64", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
FLOAT_DTYPE_NAMES = frozenset({"bf16", "fp16", "fp32", "fp64"})
_TORCH_FLOAT_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def dtype_name(dtype) -> str:
    """A torch dtype (or a safetensors header's dtype string) -> "fp32", "bf16", "int64", "bool", ..."""
    if isinstance(dtype, str):
        return SAFETENSORS_DTYPES.get(dtype, dtype.lower())
    name = str(dtype).removeprefix("torch.")
    return _TORCH_FLOAT_NAMES.get(name, name)


def cast_floating(tensors: Mapping, dtype) -> dict:
    """`tensors` detached and contiguous, the floating-point ones cast to `dtype`; integer and
    bool tensors are left exactly as they are (casting an int64 map to bf16 rounds it above 256)."""
    return {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous()
            for k, v in tensors.items()}


def check_dtypes(tensors: Mapping, expected: Mapping[str, str], *, source: str, float_from: str = "") -> None:
    """Each tensor's dtype (a torch tensor or a safetensors header) is the one `expected` names,
    or one CheckpointError line naming the tensor, the dtype found and the dtype expected
    (`float_from`: where a floating-point tensor's expected dtype comes from, for the message)."""
    wrong = []
    for name, want in expected.items():
        if name in tensors:
            got = dtype_name(tensors[name].dtype)
            if got != want:
                why = (" (integer and bool tensors keep their dtype exactly)" if want not in FLOAT_DTYPE_NAMES
                       else f" ({float_from})" if float_from else "")
                wrong.append(f"tensor {name!r} is {got}, expected {want}{why}")
    if wrong:
        raise CheckpointError(f"{source}: " + "; ".join(wrong))


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
