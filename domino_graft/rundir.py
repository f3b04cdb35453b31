"""Run directories: what `apply` writes and `train` / `export` / `bench` read.

    RUN/recipe.yaml            the recipe, verbatim
    RUN/recipe.resolved.json   the validated recipe, paths absolute, defaults filled in
    RUN/plan.json              the graft plan
    RUN/manifest.json          versions, git sha, target and drafter identity, file checksums
    RUN/head.safetensors       the Domino head (native tensor names)
    RUN/drafter/               drafter weights + config in the family's native format (always a
                               copy: training rewrites them)
    RUN/checkpoints/step-N/    training checkpoints (atomic), RUN/metrics.jsonl
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .checkpoint import atomic_dir, atomic_write_json, atomic_write_text, save_tensors, sha256_file
from .provenance import git_sha, now, versions
from .recipe import Recipe, load_recipe_text, parse_recipe

LATEST_POINTER = Path("runs") / ".latest"


def default_run_dir(recipe_path: str) -> Path:
    return Path("runs") / Path(recipe_path).stem


def set_latest(run_dir: Path) -> None:
    atomic_write_text(LATEST_POINTER, str(Path(run_dir).resolve()) + "\n")


def resolve_run(run: Optional[str]) -> Path:
    """An explicit run dir, or the most recent one `apply` wrote."""
    if run:
        p = Path(run)
        if not (p / "manifest.json").is_file():
            raise FileNotFoundError(f"RUN: {run!r} is not a run directory (no manifest.json); create one with `domino-graft apply`")
        return p
    if LATEST_POINTER.is_file():
        p = Path(LATEST_POINTER.read_text().strip())
        if (p / "manifest.json").is_file():
            return p
    found = sorted(Path("runs").glob("*/manifest.json"), key=lambda f: f.stat().st_mtime)
    if not found:
        raise FileNotFoundError("RUN: no run given and none found under ./runs; run `domino-graft apply RECIPE` first")
    return found[-1].parent


def write_run_dir(
    out: Path,
    *,
    recipe_path: str,
    recipe: Recipe,
    plan: dict,
    adapter,
    head,
    target_identity: dict,
) -> Path:
    from .recipe import recipe_to_dict

    text, _ = load_recipe_text(recipe_path)
    with atomic_dir(out) as tmp:
        (tmp / "recipe.yaml").write_text(text)
        atomic_write_json(tmp / "recipe.resolved.json", recipe_to_dict(recipe))
        atomic_write_json(tmp / "plan.json", plan)
        save_tensors(tmp / "head.safetensors", head.state_dict(), {"format": "domino-head", "spec": json.dumps(head.spec.to_dict())})
        files = {"head.safetensors": sha256_file(tmp / "head.safetensors")}
        # the drafter is always copied in: training rewrites it, and a run must not depend on
        # a checkpoint folder elsewhere staying unchanged
        (tmp / "drafter").mkdir()
        save_tensors(tmp / "drafter" / "model.safetensors", adapter.backbone_state_dict(), {"format": "pt"})
        atomic_write_json(tmp / "drafter" / "config.json", adapter.native_config())
        files["drafter/model.safetensors"] = sha256_file(tmp / "drafter" / "model.safetensors")
        manifest = {
            "kind": "domino-graft run",
            "created_at": now(),
            "recipe_source": str(Path(recipe_path).resolve()),
            "versions": versions(),
            "git_sha": git_sha(),
            "target": target_identity,
            "drafter": {
                "family": recipe.drafter.family,
                "weights": "drafter/",
                "source": recipe.drafter.path or "fresh",
            },
            "head": head.spec.to_dict(),
            "files": files,
        }
        atomic_write_json(tmp / "manifest.json", manifest)
    set_latest(out)
    return out


@dataclass
class LoadedRun:
    path: Path
    recipe: Recipe
    manifest: dict
    target: object  # TargetModel
    adapter: object  # DrafterAdapter
    head: object  # DominoHead


def run_recipe(run_dir: Path, overrides: list[str] | None = None) -> Recipe:
    """The run's resolved recipe, optionally with KEY=VALUE overrides (re-validated)."""
    from .recipe import apply_overrides

    data = json.loads((Path(run_dir) / "recipe.resolved.json").read_text())
    if overrides:
        data = apply_overrides(data, overrides, source="overrides")
    return parse_recipe(data, source=f"{run_dir}/recipe.resolved.json")


def load_run(run_dir: str | os.PathLike, *, device: str = "cpu", head_file: Optional[str] = None) -> LoadedRun:
    """Rebuild target, drafter and head from a run dir (the weights it holds, strictly checked)."""
    from .registry import get_family
    from .checkpoint import check_tensors, load_tensors
    from .graft import build_head
    from .target import load_target

    run_dir = Path(run_dir)
    recipe = run_recipe(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    target = load_target(recipe.target, device=device)
    if target.identity.get("config_hash") != manifest["target"].get("config_hash"):
        raise ValueError(
            f"{run_dir}: the target now loaded (config {target.identity.get('config_hash')}) is not the one this run "
            f"was grafted for (config {manifest['target'].get('config_hash')})"
        )
    drafter_recipe = recipe.drafter.model_copy(update={"path": str(run_dir / "drafter")})
    adapter, _ = get_family(recipe.drafter.family).build(drafter_recipe, target)
    head = build_head(recipe, adapter)
    state = load_tensors(head_file or run_dir / "head.safetensors")
    check_tensors(state, head.spec.tensor_shapes(), source=str(head_file or run_dir / "head.safetensors"))
    head.load_state_dict(state, strict=True)
    head.to(device)
    adapter.to(device)
    return LoadedRun(run_dir, recipe, manifest, target, adapter, head)
