"""`domino-graft export`: a run dir -> a deployable bundle, verified before it is final.

What a bundle holds is the drafter family's bundle layout (adapters/family.py; docs/design.md
§3): the serving engines' own format where one exists (weights + config.json, optionally
transformers remote code), else the drafter's own checkpoint under drafter/ and the head in
head.safetensors. Every bundle
also has manifest.json (provenance, recipe, target identity, per-tensor sha256, self-check
result) and README.md (model card).

The bundle is written to a temporary sibling, reloaded through `loading.load_bundle` (the
same strict loader `generate`/`bench` use) and through any reload check of the format's
own (hf: transformers), and its draft logits are compared with the in-memory model. Only
then is it renamed into place; on a mismatch nothing is left behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..artifacts.destination import check_destination
from ..artifacts.files import atomic_dir, atomic_write_bytes, atomic_write_json, atomic_write_text, sha256_file
from ..artifacts.lock import RunLockedError, held_by
from ..artifacts.provenance import git_sha, now, versions
from ..artifacts.rundir import check_recipe_matches_manifest, read_run_manifest, resolve_run, run_recipe
from ..artifacts.tensors import dtype_name, save_tensors, tensor_sha256
from ..device import pick_device
from ..loading import load_run
from ..recipe import recipe_to_dict
from ..registry import get_family
from .engine_rules import ENGINE_NAMES, CheckpointView, check_all, require
from .model_card import model_card, target_reference
from .plan import plan_bundle, resolve_format
from .self_check import ExportError, self_check

# ------------------------------------------------------------------------------ export
def default_bundle_dir(run_dir: Path, format: str, dtype: str) -> Path:
    return Path("bundles") / f"{Path(run_dir).resolve().name}-{format}-{dtype}"


def _kernel_choice(recipe_dict: dict) -> Optional[dict]:
    """Kernel settings wherever the recipe keeps them (bench.head_kernel / pool_size / pool_select today)."""
    found = {}
    for section, values in recipe_dict.items():
        if isinstance(values, dict):
            for k, v in values.items():
                if "kernel" in k or k in ("pool_size", "pool_select"):
                    found[f"{section}.{k}"] = v
    return found or None


def _check_not_training(run_dir: Path) -> None:
    """A run being trained rewrites its drafter and head files when training ends, one file after
    the other: an export reading them then could pair a new head with an old drafter, and would
    self-check that pair against itself. Read-only: the lock is looked at, not taken."""
    owner = held_by(run_dir)
    if owner:
        raise RunLockedError(f"export: {run_dir} is being trained ({owner}); its weights are rewritten when "
                             "training ends; export it after that")


def _random_target_config(identity: dict, target) -> dict:
    """{"hf_config": ...} for a random target: its transformers config, so the card can say how to
    rebuild it from its seed with transformers alone (a random target exists nowhere else)."""
    if identity.get("kind") != "random":
        return {}
    drop = ("transformers_version", "_name_or_path", "dtype", "torch_dtype")  # the card casts explicitly
    return {"hf_config": {k: v for k, v in target.model.config.to_dict().items() if k not in drop}}


def _bench_results(run_dir: Path) -> list[dict]:
    """τ-like numbers from RUN/bench*.json, with the key path they came from (no guessing)."""
    keys = ("tau", "mean_accepted_length", "acceptance_length", "speedup", "tokens_per_s", "target_tokens_per_s",
            "temperature", "num_prompts", "max_new_tokens")
    found = []

    def walk(obj, path, depth):
        if depth > 3 or not isinstance(obj, dict):
            return
        for k, v in obj.items():
            p = f"{path}.{k}" if path else k
            if k in keys and isinstance(v, (int, float)) and not isinstance(v, bool):
                found.append((p, v))
            else:
                walk(v, p, depth + 1)

    out = []
    for f in sorted(run_dir.glob("bench*.json")):
        try:
            data = json.loads(f.read_text())
        except ValueError:
            continue
        found.clear()
        walk(data, "", 0)
        run_info = data.get("run") if isinstance(data.get("run"), dict) else {}
        hw = data.get("hardware") if isinstance(data.get("hardware"), dict) else {}
        out.append({"file": f.name, "sha256": sha256_file(f), "values": dict(found),
                    "measured_on": run_info.get("path"), "device": hw.get("device")})
    return out


def _drafter_summary(family, adapter, config: dict) -> dict:
    return {"family": family.name, "architecture": (config.get("architectures") or [None])[0],
            "num_slots": adapter.num_slots, "topology": getattr(adapter, "topology", "chain"),
            **family.drafter_summary(adapter)}


def _check_bundle_dtypes(files: dict, adapter, dtype: str) -> None:
    """The rule every family's `bundle_contents` must keep (docs/design.md §3): floating-point
    tensors in the export dtype, integer and bool tensors in the dtype the drafter holds them in."""
    own = {k: dtype_name(v.dtype) for k, v in adapter.backbone_state_dict().items() if not v.is_floating_point()}
    for f, tensors in files.items():
        for name, v in tensors.items():
            got, want = dtype_name(v.dtype), own.get(name, dtype)
            if got != want:
                raise ExportError(f"export: {f}: tensor {name!r} would be written as {got}, expected {want} "
                                  "(floating-point tensors take the export dtype; integer and bool tensors keep "
                                  "their own); nothing written")


def _engine_checks(family, folder: Path, files: dict, configs: dict, target_vocab: int) -> dict:
    """Every engine's checklist on the written bundle (config.json and weights headers)."""
    view = CheckpointView.read(folder, weights=list(files), config=next(iter(configs)), target_vocab=target_vocab)
    return check_all(family, view)


@dataclass
class _Job:
    """One export, as the checks before any weight is loaded settle it."""

    run_dir: Path
    recipe: object  # Recipe
    family: object  # Family
    format: str
    dtype: str
    engine: Optional[str]
    spec: object  # EngineSpec of `engine`, or None
    out_dir: Path
    option: str  # the -o option as messages name it
    replacing: bool  # an existing bundle at out_dir is replaced (--force)


def _prepare(run, out, *, format, dtype, engine, force) -> _Job:
    """Everything that can refuse the export from configs alone, in the order whose message helps
    most: the run (not being trained, recipe and manifest agreeing), the format, the destination,
    and with `engine` that engine's rules on the planned bundle."""
    run_dir = resolve_run(run)
    _check_not_training(run_dir)
    recipe = run_recipe(run_dir)
    # the manifest and the recipe the bundle will record must describe the same weights
    check_recipe_matches_manifest(recipe_to_dict(recipe), read_run_manifest(run_dir),
                                  recipe_source=f"{run_dir}/recipe.resolved.json", manifest_source="manifest.json")
    family = get_family(recipe.drafter.family)
    format, dtype, spec = resolve_format(family, recipe, format=format, engine=engine, dtype=dtype)
    if engine == "sglang":  # a bench of this bundle drafts from SGLang's candidates (kernels/head/reference.py)
        recipe = recipe.model_copy(update={"bench": recipe.bench.model_copy(
            update={"head_kernel": "triton_pool", "pool_select": "block_shared"})})
    out_dir = Path(out) if out else default_bundle_dir(run_dir, format, dtype)
    option = "-o" if out else "-o (default bundles/<run>-<format>-<dtype>)"
    replacing = check_destination(out_dir, kind="bundle", option=option, force=force)  # before loading
    if engine is not None:  # the planned config and shapes first: a broken rule fails before any weights load
        planned = plan_bundle(recipe, format=format, dtype=dtype, engine=engine).engine_report
        if planned is not None:
            require(planned, what=f"the planned bundle {out_dir}")
    return _Job(run_dir, recipe, family, format, dtype, engine, spec, out_dir, option, replacing)


def _bundle_manifest(job: _Job, loaded, files: dict, main_config: dict, head_in_bundle: bool) -> dict:
    """manifest.json before the files' checksums, the engine reports and the self-check are added."""
    adapter, head, target, run_manifest = loaded.adapter, loaded.head, loaded.target, loaded.manifest
    return {
        "kind": "domino-graft bundle",
        "format": job.format,
        "dtype": job.dtype,
        "layout": job.family.bundle_layout,
        "engine": job.engine,  # the engine whose checklist this export was required to pass
        "head_in_bundle": head_in_bundle,
        "created_at": now(),
        "versions": versions(),
        "git_sha": git_sha(),
        "source_run": {
            "path": str(job.run_dir.resolve()),
            "created_at": run_manifest.get("created_at"),
            "git_sha": run_manifest.get("git_sha"),
            "training": run_manifest.get("training"),
        },
        "recipe": recipe_to_dict(job.recipe),
        "target": {**run_manifest["target"], "architecture": target.shape.architecture,
                   "vocab_size": target.shape.vocab_size, "hidden_size": target.shape.hidden_size,
                   **_random_target_config(run_manifest["target"], target)},
        "drafter": _drafter_summary(job.family, adapter, main_config),
        "head": head.spec.to_dict(),
        "kernel": _kernel_choice(recipe_to_dict(job.recipe)),
        # per tensor the dtype it is stored in: the export dtype, or an integer/bool tensor's own
        "tensors": {name: {"file": f, "shape": list(v.shape), "dtype": dtype_name(v.dtype),
                           "sha256": tensor_sha256(v)}
                    for f, tensors in files.items() for name, v in tensors.items()},
        "files": {},
        "bench": _bench_results(job.run_dir),
    }


def _write_files(tmp: Path, job: _Job, files: dict, configs: dict) -> None:
    """The weights, configs and code files of the bundle's format."""
    for f, tensors in files.items():
        (tmp / f).parent.mkdir(parents=True, exist_ok=True)
        save_tensors(tmp / f, tensors, {"format": "pt"})
    for f, cfg in configs.items():
        atomic_write_json(tmp / f, cfg)
    for name, source in job.family.bundle_code_files(job.format).items():
        atomic_write_bytes(tmp / name, Path(source).read_bytes())


def _report(echo, job: _Job, manifest: dict, reports: dict) -> None:
    """What `export` prints once the bundle is in place: the self-check, the engine checklists and,
    with `--engine`, how to serve it."""
    sc = manifest["self_check"]
    echo(
        ("replaced" if job.replacing else "wrote") + f" bundle {job.out_dir} ({job.format}, {job.dtype}, "
        f"{len(manifest['tensors'])} tensors); self-check passed: "
        f"exact {sc['exact_max_rel_diff']:.2g} <= {sc['exact_tolerance']:g}, "
        f"fidelity {sc['fidelity_max_rel_diff']:.2g} <= {sc['fidelity_tolerance']:g}"
    )
    echo("engine checklists: " + "; ".join(r.summary() for r in reports.values())
         + f" (`domino-graft inspect {job.out_dir}` says why)")
    if job.spec is not None and job.spec.serve is not None:
        echo(f"\nServe it ({ENGINE_NAMES[job.engine]}):\n")
        lines = job.spec.serve(manifest, str(job.out_dir), target_reference(manifest))
        echo("\n".join(line for line in lines if not line.startswith("```")))  # markdown fences: the card's


def export_run(run: Optional[str] = None, out: Optional[str] = None, *, format: Optional[str] = None,
               dtype: Optional[str] = None, device: Optional[str] = None, echo=print, force: bool = False,
               engine: Optional[str] = None) -> Path:
    """Export RUN (default: the most recent) to a verified bundle; returns its path.

    engine: write the format that engine reads and refuse (nothing written) a bundle that
    breaks one of its loader rules (domino_graft/export/engine_rules.py). force: replace an
    existing bundle at the destination (never anything else)."""
    from ..head import HEAD_TENSOR_NAMES  # torch

    job = _prepare(run, out, format=format, dtype=dtype, engine=engine, force=force)
    device = device or pick_device(job.recipe)
    loaded = load_run(job.run_dir, device=device)
    adapter, head, target = loaded.adapter, loaded.head, loaded.target

    files, configs = job.family.bundle_contents(adapter, head, format=job.format, dtype=job.dtype)
    main_config = next(iter(configs.values()))
    head_in_bundle = set(HEAD_TENSOR_NAMES) <= {n for tensors in files.values() for n in tensors}
    manifest = _bundle_manifest(job, loaded, files, main_config, head_in_bundle)
    with atomic_dir(job.out_dir, overwrite=job.replacing) as tmp:
        _write_files(tmp, job, files, configs)
        reports = _engine_checks(job.family, tmp, files, configs, target.shape.vocab_size)
        if engine is not None:
            require(reports[engine], what=f"bundle {job.out_dir}")
        _check_bundle_dtypes(files, adapter, job.dtype)  # after the engine's own rules, whose message is theirs
        manifest["engines"] = {e: r.to_dict() for e, r in reports.items()}
        manifest["files"] = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        atomic_write_json(tmp / "manifest.json", manifest)
        echo(f"self-check: reloading {len(manifest['tensors'])} tensors ({job.dtype}) and comparing draft logits ...")
        manifest["self_check"] = self_check(tmp, target=target, adapter=adapter, head=head, dtype=job.dtype,
                                            format=job.format, family=job.family, seed=job.recipe.bench.seed,
                                            device=device, recipe=job.recipe, head_in_bundle=head_in_bundle)
        atomic_write_json(tmp / "manifest.json", manifest)
        atomic_write_text(tmp / "README.md", model_card(manifest, main_config, bundle=str(job.out_dir)))
        if job.replacing:  # the same refusals as before loading, should anything have changed there since
            check_destination(job.out_dir, kind="bundle", option=job.option, force=force)
    _report(echo, job, manifest, reports)
    return job.out_dir
