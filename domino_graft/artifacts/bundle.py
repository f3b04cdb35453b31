"""Reading bundles written by `domino-graft export`, strictly.

A bundle holds the drafter and its head, never the target. `load_bundle` (domino_graft/loading.py,
after the checks here) rebuilds the target from the recipe recorded in manifest.json (a random
target from its seed, an HF or asset target from its path), or takes an explicit one, and
refuses a target whose config hash differs from the one the bundle was exported for.

Checks, in the order that gives the most useful message first: every tensor name and
shape against what config.json implies (header only, no data read), each tensor's dtype
(floating-point tensors in the manifest's dtype, integer and bool tensors in the exact dtype
the manifest records for them; docs/design.md §3), then each tensor's sha256 and
config.json's against the manifest; the manifest's recipe against the identity it records (target seed, drafter family, head spec);
and, as the weights are read, that every tensor is finite (a re-signed manifest does not
make NaN weights loadable).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

from ..registry import get_family
from .files import CheckpointError, read_json, sha256_file
from .tensors import FLOAT_DTYPE_NAMES, check_dtypes, check_tensors, tensor_sha256

BUNDLE_KIND = "domino-graft bundle"


def read_manifest(path: Union[str, os.PathLike]) -> dict:
    f = Path(path) / "manifest.json"
    manifest = read_json(f, missing="no manifest.json; not a bundle written by `domino-graft export`")
    if manifest.get("kind") != BUNDLE_KIND:
        raise CheckpointError(f"{f}: kind is {manifest.get('kind')!r}, expected {BUNDLE_KIND!r}")
    return manifest


class _Header:
    """Shape and dtype of a tensor as the safetensors header states them (no data read)."""

    def __init__(self, shape, dtype: str):
        self.shape = tuple(shape)
        self.dtype = dtype


def read_header(weights: Path) -> dict[str, _Header]:
    from safetensors import safe_open

    if not weights.is_file():
        raise CheckpointError(f"{weights}: file not found")
    try:
        with safe_open(str(weights), framework="pt") as f:
            return {k: _Header(f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()}
    except Exception as e:  # safetensors raises several types for corrupt headers
        raise CheckpointError(f"{weights}: not a readable safetensors file ({e})") from None


def bundle_family(manifest: dict, source: str):
    """The drafter family a manifest's recipe names (its bundle layout comes with it)."""
    try:
        name = manifest["recipe"]["drafter"]["family"]
    except (KeyError, TypeError):
        raise CheckpointError(f"{source}: recipe.drafter.family is missing; not a bundle written by "
                              "`domino-graft export`") from None
    return get_family(name)


def expected_dtypes(recorded: dict, dtype, *, source: str) -> dict[str, str]:
    """{tensor: the dtype it must have} from a file's manifest entries. A floating-point tensor
    must be in the bundle's `dtype`; an integer or bool one in the dtype the manifest records
    (bit for bit what the run held). Bundles written before integer tensors kept their dtype
    record every tensor in `dtype`, so they read as before."""
    out = {}
    for name, info in recorded.items():
        want = info.get("dtype", dtype)
        if want in FLOAT_DTYPE_NAMES and want != dtype:
            raise CheckpointError(f"{source}: tensor {name!r} is recorded as {want}, but the manifest's dtype is "
                                  f"{dtype!r} (every floating-point tensor of a bundle has that dtype); the manifest "
                                  "is damaged: re-export the run")
        out[name] = want
    return out


def verify_bundle(path: Union[str, os.PathLike]) -> tuple[dict, dict]:
    """Strict structural and checksum verification; returns (manifest, drafter config)."""
    from safetensors import safe_open

    path = Path(path)
    manifest = read_manifest(path)
    family = bundle_family(manifest, str(path / "manifest.json"))
    dtype = manifest.get("dtype")
    recorded = manifest.get("tensors") or {}
    by_file: dict[str, dict] = {}
    for name, info in recorded.items():
        by_file.setdefault(info.get("file", "model.safetensors"), {})[name] = info
    # what the config implies, name by name: the most useful message for a damaged bundle
    config, implied = family.bundle_implied_tensors(path, manifest)
    bad = []
    for f in sorted(set(by_file) | set(implied)):
        weights = path / f
        header = read_header(weights)
        if f in implied:
            check_tensors(header, implied[f], source=str(weights))
        check_tensors(header, {n: tuple(i["shape"]) for n, i in by_file.get(f, {}).items()},
                      source=f"{weights} (against manifest.json)")
        check_dtypes(header, expected_dtypes(by_file.get(f, {}), dtype, source=str(path / "manifest.json")),
                     source=f"{weights} (against manifest.json)", float_from="the manifest's dtype")
        with safe_open(str(weights), framework="pt") as fh:
            for name in header:
                got = tensor_sha256(fh.get_tensor(name))
                want = by_file[f][name]["sha256"]
                if got != want:
                    bad.append(f"tensor {name!r} has sha256 {got[:12]}…, the manifest records {want[:12]}…")
    for f, want in (manifest.get("files") or {}).items():
        if f.endswith((".json", ".py")) and f != "manifest.json":  # weights: checked tensor by tensor above
            got = sha256_file(path / f) if (path / f).is_file() else "missing"
            if got != want:
                bad.append(f"{f} has sha256 {got[:12]}…, the manifest records {want[:12]}…")
    bad += _foreign_code(path, family.bundle_code_files(manifest.get("format")))
    if bad:
        raise CheckpointError(f"{path}: modified after export: " + "; ".join(bad) + "; re-export the run")
    return manifest, config


def _foreign_code(path: Path, shipped: dict) -> list[str]:
    """Python files transformers would run (trust_remote_code) that are not the code this
    domino-graft ships: a re-signed manifest makes a swapped file pass the checksums, so each
    .py is compared with its source instead. Nothing here imports or runs the file."""
    bad = []
    for f in sorted(p.name for p in path.glob("*.py")):
        src = shipped.get(f)
        if src is None:
            bad.append(f"{f} is Python code domino-graft never writes (it writes: {', '.join(shipped) or 'none'})")
        elif sha256_file(path / f) != sha256_file(src):
            bad.append(f"{f} differs from the remote code this domino-graft ships ({src.name}); transformers would run it")
    return bad
