"""Loading what `apply`, `train` and `export` wrote back into a model: a run dir or a bundle ->
LoadedRun (target, drafter adapter, Domino head), every weight strictly checked.

The formats themselves (the run dir's layout and manifest, the bundle's manifest, headers and
checksums) are domino_graft/artifacts/; this module rebuilds the model they describe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from .artifacts.bundle import bundle_family, read_manifest, verify_bundle
from .artifacts.files import CheckpointError, read_json
from .artifacts.provenance import config_hash
from .artifacts.rundir import (check_model_finite, check_recipe_matches_manifest, check_run_layout, read_run_manifest,
                               resolve_run, run_recipe)
from .artifacts.tensors import check_tensors, load_tensors
from .graft import build_head, effective_recipe
from .recipe import Recipe, Target, parse_recipe, recipe_to_dict
from .registry import get_family


@dataclass
class LoadedRun:
    path: Path
    recipe: Recipe
    manifest: dict
    target: object  # TargetModel
    adapter: object  # DrafterAdapter
    head: object  # DominoHead

def load_run(run_dir: str | os.PathLike, *, device: str = "cpu", head_file: Optional[str] = None) -> LoadedRun:
    """Rebuild target, drafter and head from a run dir (the weights it holds, strictly checked)."""
    from .target import load_target  # torch

    run_dir = Path(run_dir)
    check_run_layout(run_dir)
    recipe = run_recipe(run_dir)
    manifest = read_run_manifest(run_dir)
    check_recipe_matches_manifest(recipe_to_dict(recipe), manifest, recipe_source=f"{run_dir}/recipe.resolved.json",
                                  manifest_source="manifest.json")
    target = load_target(recipe.target, device=device)
    if target.identity.get("config_hash") != manifest["target"].get("config_hash"):
        raise ValueError(
            f"{run_dir}: target.config_hash: the target now loaded (config {target.identity.get('config_hash')}) is "
            f"not the one this run was grafted for (config {manifest['target'].get('config_hash')}, manifest.json)"
        )
    drafter_recipe = recipe.drafter.model_copy(update={"path": str(run_dir / "drafter")})
    try:
        adapter, _ = get_family(recipe.drafter.family).build(drafter_recipe, target)
    except CheckpointError:
        raise
    except ValueError as e:  # a drafter field of the resolved recipe that the run's drafter/ contradicts
        raise CheckpointError(f"{run_dir}/recipe.resolved.json against {run_dir}/drafter/: {e}") from None
    head = build_head(recipe, adapter)
    state = load_tensors(head_file or run_dir / "head.safetensors")
    check_tensors(state, head.spec.tensor_shapes(), source=str(head_file or run_dir / "head.safetensors"))
    head.load_state_dict(state, strict=True)
    check_model_finite(adapter, head, source=str(run_dir))
    got = head.spec.to_dict()
    wrong = [k for k, v in manifest["head"].items() if k in got and got[k] != v]
    if wrong:
        k = wrong[0]
        raise CheckpointError(f"{run_dir}: head.{k}: the head built from the run is {got[k]!r}, but manifest.json "
                              f"has {manifest['head'][k]!r}")
    head.to(device)
    adapter.to(device)
    return LoadedRun(run_dir, recipe, manifest, target, adapter, head)


def _load_target_for(recipe, target, device):
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
    path = Path(path).resolve()
    manifest = verify_bundle(path)[0] if verify else read_manifest(path)
    source = f"{path}/manifest.json"
    if manifest.get("head_in_bundle") is False:
        raise CheckpointError(
            f"{path}: a bundle without its Domino head (format {manifest.get('format')!r}, for an engine that cannot "
            "run one); domino-graft loads bundles with their head: use the run's native bundle, or point a recipe's "
            "drafter.path at this folder to graft a new head onto its drafter"
        )
    family = bundle_family(manifest, source)
    if not isinstance(manifest.get("recipe"), dict):
        raise CheckpointError(f"{source}: field 'recipe' is missing or not an object; the manifest is damaged")
    check_recipe_matches_manifest(manifest["recipe"], manifest, recipe_source=f"{source}: recipe",
                                  manifest_source="its target/drafter/head identity")
    recipe = family.bundle_recipe(parse_recipe(manifest["recipe"], source=source), path)

    tgt = _load_target_for(recipe, target, device)
    want = (manifest.get("target") or {}).get("config_hash")
    got = tgt.identity.get("config_hash") or config_hash(tgt.model.config.to_dict())
    if want != got:
        raise ValueError(
            f"{path}: this bundle was exported for target config {want} ({_describe(manifest.get('target') or {})}), "
            f"but the target given has config {got} ({_describe(tgt.identity)}); load it with the target it was "
            "trained for"
        )
    adapter, head_tensors = family.build(recipe.drafter, tgt)
    head = build_head(recipe, adapter, head_tensors)
    head_file = family.bundle_head_file()
    if head_file is not None:
        state = load_tensors(path / head_file)
        check_tensors(state, head.spec.tensor_shapes(), source=str(path / head_file))
        head.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    check_model_finite(adapter, head, source=str(path))
    head.to(device)
    adapter.to(device)
    return LoadedRun(path, effective_recipe(recipe, head.spec), manifest, tgt, adapter, head)


def load_run_or_bundle(path: str | None, *, device: str = "cpu", **kw):
    """A run dir (from `apply`/`train`) or an exported bundle -> LoadedRun.

    `path=None` means the most recent run."""
    if path is not None and (Path(path) / "manifest.json").is_file():
        kind = read_json(Path(path) / "manifest.json").get("kind", "")
        if kind == "domino-graft bundle":
            return load_bundle(path, device=device, **kw)
    return load_run(resolve_run(path), device=device)
