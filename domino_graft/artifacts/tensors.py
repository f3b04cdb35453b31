"""Tensors of artifacts: safetensors read and written with strict checks, dtypes, checksums.

Nothing non-finite is written or read: `save_tensors` refuses a NaN/Inf tensor and
`load_tensors` names the first one a file holds. `check_tensors` holds a state dict against
the names, shapes and dtypes it must have. torch and safetensors load on first use.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Mapping, Optional

from .files import CheckpointError, atomic_write_bytes, with_path


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
