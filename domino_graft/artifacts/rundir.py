"""Run directories: what `apply` writes and `train` / `export` / `bench` read.

    RUN/recipe.yaml            the recipe, verbatim
    RUN/recipe.resolved.json   the validated recipe, paths absolute, defaults filled in
    RUN/plan.json              the graft plan
    RUN/manifest.json          versions, git sha, target and drafter identity, file checksums
    RUN/head.safetensors       the Domino head (native tensor names)
    RUN/drafter/               drafter weights + config in the family's native format (always a
                               copy: training rewrites them)
    RUN/checkpoints/step-N/    training checkpoints (atomic), RUN/metrics.jsonl
    RUN/train.lock             held while a process trains in the run (artifacts/lock.py)

Reading a run is strict: every JSON file must parse (the error names it), the resolved recipe
must agree with the manifest on what the weights were made for (target, drafter, head), and
every tensor must be finite.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from ..recipe import Recipe, apply_overrides, load_recipe_text, parse_recipe, recipe_to_dict
from .destination import check_destination
from .files import CheckpointError, atomic_dir, atomic_write_json, atomic_write_text, read_json, sha256_file
from .lock import held_by
from .provenance import git_sha, now, versions
from .tensors import check_finite, save_tensors

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


RUN_KIND = "domino-graft run"
# what a run dir holds at each name, when it holds it
RUN_LAYOUT = {"manifest.json": "file", "recipe.resolved.json": "file", "head.safetensors": "file",
              "metrics.jsonl": "file", "drafter": "folder", "checkpoints": "folder", "features": "folder",
              "tensorboard": "folder"}


def check_run_destination(out, *, force: bool = False, option: str = "-o") -> bool:
    """`apply` may write a run dir at `out`: nothing there, an empty folder, or (with --force)
    a run that no process is training. Returns whether a run is being replaced."""

    return check_destination(out, kind="run", option=option, force=force,
                             locked=lambda p: (f"trained by {held_by(p)}" if held_by(p) else None))


READ_LAYOUT = ("manifest.json", "recipe.resolved.json", "head.safetensors", "drafter")


def check_run_layout(run_dir, *, writing: bool = False) -> None:
    """Each entry of the run dir that exists is the kind of thing it must be (checkpoints/ a
    folder, not a file, ...): what loading reads, and with writing=True (training) every
    entry, and the run dir must take new files."""
    import tempfile

    run_dir = Path(run_dir)
    for name, kind in RUN_LAYOUT.items():
        if not writing and name not in READ_LAYOUT:
            continue
        p = run_dir / name
        if p.exists() and (p.is_dir() if kind == "file" else not p.is_dir()):
            raise CheckpointError(f"{p}: is {'a folder' if p.is_dir() else 'a file'}, but a run dir keeps a {kind} "
                                  f"there; move it away")
    if writing:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=run_dir))
        except OSError as e:
            raise OSError(e.errno, f"{e.strerror}; the run dir must be writable to train in it", str(run_dir)) from None


def read_run_manifest(run_dir) -> dict:
    """RUN/manifest.json, checked: valid JSON, a run's, with the sections readers use."""
    f = Path(run_dir) / "manifest.json"
    m = read_json(f, missing="no manifest.json; not a run directory written by `domino-graft apply`")
    if m.get("kind") != RUN_KIND:
        raise CheckpointError(f"{f}: kind is {m.get('kind')!r}, expected {RUN_KIND!r}")
    for key in ("target", "drafter", "head"):
        if not isinstance(m.get(key), dict):
            raise CheckpointError(f"{f}: field {key!r} is " + ("missing" if key not in m else f"{m[key]!r}, not an object")
                                  + "; the manifest is damaged")
    if not m["target"].get("config_hash"):
        raise CheckpointError(f"{f}: field 'target.config_hash' is missing; the manifest is damaged")
    return m


def recipe_manifest_mismatches(recipe: dict, manifest: dict) -> list[tuple[str, object, object]]:
    """(field, recipe's value, manifest's value) wherever a recipe (as recipe_to_dict writes it)
    contradicts the identity a manifest records for the weights: target (kind, seed), drafter
    (family, source), head (G, r, pure prefix)."""
    out = []
    t, mt = recipe.get("target") or {}, manifest.get("target") or {}
    random = t.get("random")
    if mt.get("kind") == "random":
        if not isinstance(random, dict):
            out.append(("target", "a model from " + str(t.get("path") or t.get("asset")), "a random model"))
        elif random.get("seed") != mt.get("seed"):
            out.append(("target.random.seed", random.get("seed"), mt.get("seed")))
    elif mt.get("kind") == "hf" and isinstance(random, dict):
        out.append(("target", "a random model", f"the model at {mt.get('path')}"))
    d, md = recipe.get("drafter") or {}, manifest.get("drafter") or {}
    if "family" in md and d.get("family") != md["family"]:
        out.append(("drafter.family", d.get("family"), md["family"]))
    if "source" in md and (d.get("path") or "fresh") != md["source"]:
        out.append(("drafter.path", d.get("path") or "fresh", md["source"]))
    h, mh = recipe.get("head") or {}, manifest.get("head") or {}
    for k in ("gru_hidden_dim", "rank", "pure_prefix_len"):
        if k in mh and h.get(k) != mh[k]:
            out.append((f"head.{k}", h.get(k), mh[k]))
    return out


def check_recipe_matches_manifest(recipe: dict, manifest: dict, *, recipe_source: str, manifest_source: str) -> None:
    bad = recipe_manifest_mismatches(recipe, manifest)
    if bad:
        field, mine, theirs = bad[0]
        more = f" (and {len(bad) - 1} more: {', '.join(b[0] for b in bad[1:])})" if len(bad) > 1 else ""
        raise CheckpointError(
            f"{recipe_source}: {field} is {mine!r}, but {manifest_source} has {theirs!r} (what the weights were made "
            f"for){more}; one of the two was edited: restore it, or make a new run with `domino-graft apply`")


def check_model_finite(adapter, head, *, source: str) -> None:
    """Every drafter and head tensor finite (whatever file format the family read them from)."""
    check_finite(adapter.backbone_state_dict(), source=f"{source}: drafter weights",
                 hint="the weights are damaged (a diverged training run?)")
    check_finite(head.state_dict(), source=f"{source}: Domino head", hint="the weights are damaged")


def write_run_dir(
    out: Path,
    *,
    recipe_path: str,
    recipe: Recipe,
    plan: dict,
    adapter,
    head,
    target_identity: dict,
    force: bool = False,
) -> Path:
    text, _ = load_recipe_text(recipe_path)
    check_model_finite(adapter, head, source=str(out))
    with atomic_dir(out, overwrite=force) as tmp:
        atomic_write_text(tmp / "recipe.yaml", text)
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


def _check_family(run_dir, data: dict) -> None:
    """The drafter family first, before the schema reads the section as that family's (one
    line naming both, not a list of unknown keys)."""
    f = Path(run_dir) / "manifest.json"
    if not f.is_file():
        return
    manifest = read_run_manifest(run_dir)
    family = (data.get("drafter") or {}).get("family") if isinstance(data.get("drafter"), dict) else None
    want = manifest["drafter"].get("family")
    if want is not None and family != want:
        raise CheckpointError(f"{run_dir}/recipe.resolved.json: drafter.family is {family!r}, but manifest.json has "
                              f"{want!r} (what the weights were made for); one of the two was edited: restore it, "
                              "or make a new run with `domino-graft apply`")


def run_recipe(run_dir: Path, overrides: list[str] | None = None) -> Recipe:
    """The run's resolved recipe, optionally with KEY=VALUE overrides (re-validated)."""
    data = read_json(Path(run_dir) / "recipe.resolved.json", missing="file not found; not a run directory written "
                     "by `domino-graft apply`")
    _check_family(run_dir, data)
    if overrides:
        data = apply_overrides(data, overrides, source="overrides")
    return parse_recipe(data, source=f"{run_dir}/recipe.resolved.json")
