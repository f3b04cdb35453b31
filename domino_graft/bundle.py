"""Reading bundles written by `domino-graft export`, strictly.

A bundle holds the drafter and its head, never the target. `load_bundle` rebuilds the
target from the recipe recorded in manifest.json (a random target from its seed, an HF or
asset target from its path), or takes an explicit one, and refuses a target whose config
hash differs from the one the bundle was exported for.

Checks, in the order that gives the most useful message first: every tensor name and
shape against what config.json implies (header only, no data read), the dtype the
manifest declares, then each tensor's sha256 and config.json's against the manifest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Union

from .checkpoint import CheckpointError, check_tensors, sha256_file

BUNDLE_KIND = "domino-graft bundle"
SAFETENSORS_DTYPES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}
HEAD_FILE = "head.safetensors"  # the Domino head, for families whose drafter format has no place for it


def read_manifest(path: Union[str, os.PathLike]) -> dict:
    path = Path(path)
    f = path / "manifest.json"
    if not f.is_file():
        raise FileNotFoundError(f"{path}: no manifest.json; not a bundle written by `domino-graft export`")
    try:
        manifest = json.loads(f.read_text())
    except ValueError as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from None
    if manifest.get("kind") != BUNDLE_KIND:
        raise CheckpointError(f"{f}: kind is {manifest.get('kind')!r}, expected {BUNDLE_KIND!r}")
    return manifest


def expected_tensor_shapes(config: dict, *, source: str) -> dict[str, tuple[int, ...]]:
    """What a DFlash+Domino config.json implies the weights must be, name by name."""
    from .adapters.dflash import DFlashConfig, backbone_tensor_shapes, domino_head_fields
    from .head import HeadSpec

    cfg = DFlashConfig.from_native(config)
    fields = domino_head_fields(config, source)
    if not fields:
        raise CheckpointError(
            f"{source}: declares no Domino head (dflash_config.projector_type is not 'domino'); "
            "a domino-graft bundle always carries one"
        )
    # DFlash reuses the target's embeddings, so the GRU reads vectors of the drafter's hidden size.
    spec = HeadSpec(hidden_dim=cfg.hidden_size, emb_dim=cfg.hidden_size, vocab_size=cfg.vocab_size, **fields)
    return {**backbone_tensor_shapes(cfg), **spec.tensor_shapes()}


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


def _read_json(f: Path) -> dict:
    if not f.is_file():
        raise FileNotFoundError(f"{f}: file not found; the bundle is incomplete")
    try:
        return json.loads(f.read_text())
    except ValueError as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from None


def verify_bundle(path: Union[str, os.PathLike]) -> tuple[dict, dict]:
    """Strict structural and checksum verification; returns (manifest, drafter config)."""
    from safetensors import safe_open

    from .checkpoint import tensor_sha256
    from .head import HeadSpec

    path = Path(path)
    manifest = read_manifest(path)
    dtype = manifest.get("dtype")
    recorded = manifest.get("tensors") or {}
    by_file: dict[str, dict] = {}
    for name, info in recorded.items():
        by_file.setdefault(info.get("file", "model.safetensors"), {})[name] = info
    if manifest.get("layout", "dflash") == "dflash":
        config = _read_json(path / "config.json")
        # what config.json implies, name by name: the most useful message for a damaged bundle
        implied = {"model.safetensors": expected_tensor_shapes(config, source=str(path / "config.json"))}
    else:
        config = _read_json(path / "drafter" / "config.json")
        implied = {HEAD_FILE: HeadSpec(**manifest["head"]).tensor_shapes()}  # the family's build() checks drafter/
    bad = []
    for f in sorted(set(by_file) | set(implied)):
        weights = path / f
        header = read_header(weights)
        if f in implied:
            check_tensors(header, implied[f], source=str(weights))
        check_tensors(header, {n: tuple(i["shape"]) for n, i in by_file.get(f, {}).items()},
                      source=f"{weights} (against manifest.json)")
        wrong = [f"tensor {k!r} is {SAFETENSORS_DTYPES.get(h.dtype, h.dtype)}" for k, h in header.items()
                 if SAFETENSORS_DTYPES.get(h.dtype, h.dtype) != dtype]
        if wrong:
            raise CheckpointError(f"{weights}: the manifest declares dtype {dtype!r} but " + "; ".join(wrong))
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
    if bad:
        raise CheckpointError(f"{path}: modified after export: " + "; ".join(bad) + "; re-export the run")
    return manifest, config


def _load_target_for(recipe, target, device):
    from .recipe import Target
    from .target import TargetModel, load_target

    if target is None:
        return load_target(recipe.target, device=device)
    if isinstance(target, TargetModel):
        return target
    if isinstance(target, Target):
        return load_target(target, device=device)
    if isinstance(target, (str, os.PathLike)):
        spec = Target.model_validate({"path": str(target), "dtype": recipe.target.dtype, "chat": recipe.target.chat})
        return load_target(spec, device=device)
    raise TypeError(f"load_bundle(target=...): expected a TargetModel, a recipe Target or a model folder, got {type(target).__name__}")


def _describe(identity: dict) -> str:
    if identity.get("kind") == "random":
        return f"random target, seed {identity.get('seed')}"
    return identity.get("path") or identity.get("name_or_path") or identity.get("kind") or "?"


def load_bundle(path: Union[str, os.PathLike], *, device: str = "cpu", target=None, verify: bool = True):
    """A bundle -> LoadedRun (target, drafter adapter, Domino head), checked strictly.

    target: None (rebuild from the manifest's recipe), a loaded TargetModel, a recipe
    `Target`, or a Hugging Face model folder. It must be the target the bundle was exported
    for (same config hash). verify=False skips the checksum pass (the shape checks stay)."""
    from .adapters import family_module
    from .checkpoint import load_tensors
    from .graft import build_head, effective_recipe
    from .recipe import parse_recipe
    from .rundir import LoadedRun
    from .target import config_hash

    path = Path(path).resolve()
    manifest = verify_bundle(path)[0] if verify else read_manifest(path)
    source = f"{path}/manifest.json"
    data = dict(manifest["recipe"])
    family = data["drafter"]["family"]
    dflash_layout = manifest.get("layout", "dflash") == "dflash"
    if dflash_layout:
        # Everything about the drafter and head comes from the bundle's config.json; only the
        # seeds and the target are taken from the recipe.
        data["drafter"] = {"family": family, "path": str(path)}
        data["head"] = {k: v for k, v in (data.get("head") or {}).items() if k in ("seed", "zero_init_w2")}
    recipe = parse_recipe(data, source=source)
    if not dflash_layout:  # as load_run does: the recipe's drafter, its weights from drafter/
        recipe = recipe.model_copy(update={"drafter": recipe.drafter.model_copy(update={"path": str(path / "drafter")})})

    tgt = _load_target_for(recipe, target, device)
    want = (manifest.get("target") or {}).get("config_hash")
    got = tgt.identity.get("config_hash") or config_hash(tgt.model.config.to_dict())
    if want != got:
        raise ValueError(
            f"{path}: this bundle was exported for target config {want} ({_describe(manifest.get('target') or {})}), "
            f"but the target given has config {got} ({_describe(tgt.identity)}); load it with the target it was "
            "trained for"
        )
    adapter, head_tensors = family_module(family).build(recipe.drafter, tgt)
    head = build_head(recipe, adapter, head_tensors)
    if not dflash_layout:
        state = load_tensors(path / HEAD_FILE)
        check_tensors(state, head.spec.tensor_shapes(), source=str(path / HEAD_FILE))
        head.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    head.to(device)
    adapter.to(device)
    return LoadedRun(path, effective_recipe(recipe, head.spec), manifest, tgt, adapter, head)
