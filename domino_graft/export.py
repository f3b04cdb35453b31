"""`domino-graft export`: a run dir -> a deployable bundle, verified before it is final.

What a bundle holds is the drafter family's bundle layout (adapters/family.py; docs/design.md
§3): the serving engines' own format where one exists (weights + config.json, optionally
transformers remote code), else the drafter's own checkpoint under drafter/ and the head in
head.safetensors. Every bundle
also has manifest.json (provenance, recipe, target identity, per-tensor sha256, self-check
result) and README.md (model card).

The bundle is written to a temporary sibling, reloaded through `bundle.load_bundle` (the
same strict loader `generate`/`bench` use) and through any reload check of the format's
own (hf: transformers), and its draft logits are compared with the in-memory model. Only
then is it renamed into place; on a mismatch nothing is left behind.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .checkpoint import (
    atomic_dir,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    dtype_name,
    save_tensors,
    sha256_file,
    tensor_sha256,
)
from .registry import get_family

DTYPES = ("bf16", "fp16", "fp32")
# Fidelity: the reloaded bundle vs the model in memory (unrounded), max |Δlogit| / max |logit|.
# Rounding every weight to bf16 (8 mantissa bits) moves logits by ~1% on the tiny and 8B
# shapes; 5% still fails a transposed or swapped tensor by orders of magnitude.
FIDELITY_TOL = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}
# Exactness: the reloaded bundle vs the in-memory weights rounded to the export dtype — the
# same numbers through the same code, so only a mapping/config error can move them.
EXACT_TOL = {"fp32": 1e-5, "fp16": 1e-3, "bf16": 1e-3}  # keyed by the *compute* dtype


class ExportError(RuntimeError):
    """The bundle failed its self-check; nothing was written."""


# ------------------------------------------------------------------------------ format
def _check_choice(name: str, value: str, valid: tuple) -> None:
    if value not in valid:
        raise ValueError(f"export.{name}: {value!r} is not valid; valid: {', '.join(valid)}")


def _check_format(family, format: str, dtype: str, spec=None) -> None:
    _check_choice("dtype", dtype, DTYPES)
    if format not in family.export_formats and (spec is None or format != spec.format):
        raise ValueError(f"export.format: {format!r} is not available for {family.name} drafters; valid: "
                         f"{', '.join(family.export_formats)}")


def resolve_format(family, recipe, *, format: Optional[str], engine: Optional[str], dtype: Optional[str]):
    """-> (format, dtype, EngineSpec or None). `--engine` picks the format that engine reads
    (an explicit `--format` must agree with it); without one, `--format` or the recipe's."""
    from .engines import ENGINE_NAMES, engine_spec

    spec = None
    if engine is not None:
        spec = engine_spec(family, engine)
        if engine == "vllm" and recipe.target.random is not None and getattr(family, "names_verifier", False):
            raise ValueError(f"export --engine vllm: the recipe's target is random (target.random, seed "
                             f"{recipe.target.random.seed}), so the {family.display_name} drafter's "
                             "speculators_config.verifier.name_or_path is null and vLLM cannot load its verifier; "
                             "valid: a run whose target.path names a model folder or hub checkpoint")
        if spec.refused:
            raise ValueError(f"export --engine {engine}: {ENGINE_NAMES[engine]} cannot serve {family.display_name} "
                             f"drafters: {spec.refused}")
        if format is not None and format != spec.format:
            raise ValueError(f"export: --format {format} contradicts --engine {engine}, which writes the "
                             f"{spec.format!r} format; give one of them")
        format = spec.format
    format, dtype = format or recipe.export.format, dtype or recipe.export.dtype
    _check_format(family, format, dtype, spec)
    return format, dtype, spec


@dataclass
class BundlePlan:
    """What `export` would write, from configs alone (no weights read)."""

    format: str
    dtype: str
    config: Optional[dict]
    tensors: dict[str, tuple[int, ...]]
    files: list[str] = field(default_factory=list)
    target_vocab: Optional[int] = None
    engine_report: Optional[object] = None  # engines.EngineReport of `--engine`, from the plan
    exact_dtypes: dict[str, str] = field(default_factory=dict)  # integer/bool tensors: their own dtype

    def tensor_dtype(self, name: str) -> str:
        return self.exact_dtypes.get(name, self.dtype)

    def view(self):
        """The planned bundle as an engine checklist reads it (None: no config.json planned)."""
        from .engines import CheckpointView

        if self.config is None:
            return None
        tensors = {n: (tuple(s), self.tensor_dtype(n)) for n, s in self.tensors.items()}
        return CheckpointView(None, self.config, tensors, frozenset(self.files), self.target_vocab)

    @property
    def num_parameters(self) -> int:
        return sum(math.prod(s) for s in self.tensors.values())

    def format_text(self) -> str:
        bytes_per = {"bf16": 2, "fp16": 2, "fp32": 4}[self.dtype]
        lines = [
            f"Bundle plan: format {self.format}, dtype {self.dtype}, {len(self.tensors)} tensors, "
            f"{self.num_parameters:,} parameters (~{self.num_parameters * bytes_per / 2**30:.2f} GiB)",
            "  files: " + ", ".join(self.files),
        ]
        if self.config:
            lines.append(f"  config: architectures {self.config.get('architectures')}")
        for name, shape in self.tensors.items():
            own = f" {self.exact_dtypes[name]}" if name in self.exact_dtypes else ""
            lines.append(f"    {name:<44} {list(shape)}{own}")
        r = self.engine_report
        if r is not None:
            lines.append(f"  engine checklist (from the plan): {r.summary()}")
            lines += [f"    {p}" for p in r.problems()]
        return "\n".join(lines)


def plan_bundle(recipe, *, format: Optional[str] = None, dtype: Optional[str] = None,
                engine: Optional[str] = None) -> BundlePlan:
    """Bundle tensors and config from the recipe's configs (the path `export --dry-run` takes);
    with `engine`, also that engine's checklist run on the planned config and shapes."""
    from .engines import check
    from .graft import head_spec_for
    from .target import TargetShape, target_config_dict

    family = get_family(recipe.drafter.family)
    format, dtype, _ = resolve_format(family, recipe, format=format, engine=engine, dtype=dtype)
    tshape = TargetShape.from_config_dict(target_config_dict(recipe.target))
    fam_plan = family.plan(recipe.drafter, tshape)
    spec = head_spec_for(recipe, fam_plan, family.checkpoint_head_fields(recipe.drafter))
    config, tensors = family.plan_bundle(recipe.drafter, tshape, fam_plan, spec, format=format, dtype=dtype)
    plan = BundlePlan(format, dtype, config, tensors, [*family.bundle_files(format), "manifest.json", "README.md"],
                      target_vocab=tshape.vocab_size,
                      exact_dtypes={n: d for n, d in family.exact_dtypes.items() if n in tensors})
    view = plan.view()
    if engine is not None and view is not None:
        plan.engine_report = check(family, engine, view)
    return plan


# --------------------------------------------------------------------------- self-check
def _greedy(adapter, head, block, anchor):
    """Proposals d_1..d_K (docs/design.md §2): the GRU reads E(x_0), then each realised proposal."""
    import torch

    state = head.init_state(anchor.shape[0], device=block.hidden.device)
    prev, out = anchor, []
    for j in range(block.hidden.shape[1]):
        logits, state = head.step(state, adapter.embed(prev), block.hidden[:, j], block.base_logits[:, j])
        prev = logits.argmax(-1)
        out.append(prev)
    return torch.stack(out, dim=1)


def _probe_inputs(target, adapter, *, seed: int, batch: int = 2):
    """Random token sequences, the target's captured features, and anchors spread over them."""
    import torch

    k = adapter.num_slots
    length = max(24, 3 * (k + 1))
    g = torch.Generator().manual_seed(seed)
    # ids 0, 1 and the last row are often special (bos/eos, a drafter's placeholder token): avoid them
    ids = torch.randint(2, target.shape.vocab_size - 1, (batch, length), generator=g).to(target.device)
    _, feats = target(ids, capture=adapter.capture_layers())
    anchors = sorted({max(1, length // 4), length // 2, length - 1})
    return ids, feats, anchors


def _draft_logits(adapter, head, ids, feats, anchors, prev_tokens=None, greedy=True):
    """Per anchor: (final logits [B, K, V] teacher-forced on `prev_tokens` or on the model's
    own greedy proposals, those proposals [B, K] or None when greedy=False)."""
    import torch

    out = []
    for i, a in enumerate(anchors):
        adapter.reset(ids.shape[0])
        adapter.observe(None if feats is None else feats[:, :a], torch.arange(a, device=ids.device), ids=ids[:, :a])
        anchor = ids[:, a]
        block = adapter.propose(anchor, a)
        tokens = _greedy(adapter, head, block, anchor) if greedy or prev_tokens is None else None
        forced = tokens if prev_tokens is None else prev_tokens[i]
        prev = torch.cat([anchor[:, None], forced[:, :-1]], dim=1)
        out.append((head.block(block.hidden, block.base_logits, adapter.embed(prev)).float(), tokens))
    return out


def max_rel_diff(a_list, b_list) -> float:
    """max |a - b| / max(1, max |a|) over the blocks; NaN as soon as either side holds a
    non-finite value (Python's max(0.0, nan) is 0.0: a NaN must never read as a match)."""
    worst = 0.0
    for (a, _), (b, _) in zip(a_list, b_list):
        if a.shape != b.shape:
            return math.inf
        if a.numel() == 0:
            continue
        if not (bool(a.isfinite().all()) and bool(b.isfinite().all())):
            return math.nan
        scale = max(1.0, float(a.abs().max()))
        d = float((a - b).abs().max()) / scale
        if not d <= worst:  # also takes a NaN
            worst = d
    return worst


@contextlib.contextmanager
def rounded_weights(adapter, head, dtype: str):
    """Inside: the drafter's own weights and the head's rounded to `dtype` (and back to their
    compute dtype), as a bundle of that dtype holds them. Restored on exit. Works for every
    family: only `backbone_parameters()` (the contract's own-weights list) are touched, never
    the shared target."""
    import torch

    from .target import TORCH_DTYPES

    params = list(adapter.backbone_parameters()) + list(head.parameters())
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p in params:
                p.copy_(p.to(TORCH_DTYPES[dtype]).to(p.dtype))
        yield adapter, head
    finally:
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)


def _base_logits(adapter, ids, feats, anchors):
    """Per anchor: (the drafter's own base logits [B, K, V], their argmax): what a bundle
    without the Domino head drafts from."""
    import torch

    out = []
    for a in anchors:
        adapter.reset(ids.shape[0])
        adapter.observe(None if feats is None else feats[:, :a], torch.arange(a, device=ids.device), ids=ids[:, :a])
        logits = adapter.propose(ids[:, a], a).base_logits.float()
        out.append((logits, logits.argmax(-1)))
    return out


def _reload_headless(bundle_dir: Path, *, recipe, family, target, device):
    """A bundle written without the head, rebuilt the way any checkpoint of the family is read."""
    from .bundle import verify_bundle
    from .checkpoint import CheckpointError

    verify_bundle(bundle_dir)
    drafter = family.bundle_recipe(recipe, bundle_dir).drafter
    adapter, head_tensors = family.build(drafter, target)
    if head_tensors:
        raise CheckpointError(f"{bundle_dir}: holds head tensors {sorted(head_tensors)} though its format drops the head")
    return adapter.to(device)


def self_check(bundle_dir: Path, *, target, adapter, head, dtype: str, format: str, family, seed: int = 0,
               device="cpu", recipe=None, head_in_bundle: bool = True) -> dict:
    """Reload the bundle through the project's loader and compare draft logits; raise ExportError.
    head_in_bundle=False: the format drops the head, so the drafter's base logits are compared."""
    import torch

    from .bundle import load_bundle

    with torch.no_grad():
        ids, feats, anchors = _probe_inputs(target, adapter, seed=seed)

        def draft(a, h, prev_tokens=None, greedy=True):
            if not head_in_bundle:
                return _base_logits(a, ids, feats, anchors)
            return _draft_logits(a, h, ids, feats, anchors, prev_tokens, greedy)

        mem = draft(adapter, head)
        if not all(bool(x.isfinite().all()) for x, _ in mem):
            raise ExportError("export self-check failed, no bundle written: the model's own draft logits are not "
                              "finite (NaN/Inf weights or activations); it is not exportable")
        tokens = [t for _, t in mem]
        # fp32 export: rounding is the identity, the in-memory pass is the rounded reference
        if dtype == "fp32":
            rounded = mem
        else:
            with rounded_weights(adapter, head, dtype):
                rounded = draft(adapter, head, tokens, greedy=False)
        if head_in_bundle:
            loaded = load_bundle(bundle_dir, device=device, target=target)
            # teacher-forced on the in-memory proposals (comparable logits), plus its own greedy ones
            reloaded = draft(loaded.adapter, loaded.head, tokens)
        else:
            reloaded = draft(_reload_headless(bundle_dir, recipe=recipe, family=family, target=target,
                                              device=device), None)
        compute = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[target.dtype]
        result = {
            "blocks": len(anchors) * ids.shape[0],
            "anchors": anchors,
            "exact_max_rel_diff": max_rel_diff(rounded, reloaded),
            "exact_tolerance": EXACT_TOL[compute],
            "fidelity_max_rel_diff": max_rel_diff(mem, reloaded),
            # in bf16/fp16 compute any weight perturbation flips activation roundings: ~1% seen on
            # an H200 for an fp16 export of a bf16 model, so the compute dtype bounds it from below
            "fidelity_tolerance": max(FIDELITY_TOL[dtype], FIDELITY_TOL[compute]),
            "greedy_tokens_equal": sum(int(torch.equal(a, b)) for (_, a), (_, b) in zip(mem, reloaded)),
        }
        problems = []
        if not result["exact_max_rel_diff"] <= result["exact_tolerance"]:
            problems.append(
                f"reloaded bundle vs the in-memory weights rounded to {dtype}: max |Δlogit|/max|logit| = "
                f"{result['exact_max_rel_diff']:.3g} > {result['exact_tolerance']:g} (a tensor or config field "
                "was written wrongly)"
            )
        if not result["fidelity_max_rel_diff"] <= result["fidelity_tolerance"]:
            problems.append(
                f"reloaded {dtype} bundle vs the trained model: max |Δlogit|/max|logit| = "
                f"{result['fidelity_max_rel_diff']:.3g} > {result['fidelity_tolerance']:g} (weights do not survive "
                f"{dtype}; export with --dtype fp32)"
            )
        if dtype == "fp32" and result["greedy_tokens_equal"] != len(anchors):
            problems.append("greedy draft tokens of the reloaded fp32 bundle differ from the in-memory model's")
        extra, extra_problems = family.bundle_extra_check(bundle_dir, format=format, probe={
            "target": target, "ids": ids, "feats": feats, "anchors": anchors, "tokens": tokens,
            "reference": rounded, "compute": compute, "dtype": dtype})
        result.update(extra)
        problems += extra_problems
    if problems:
        raise ExportError("export self-check failed, no bundle written: " + "; ".join(problems))
    result["passed"] = True
    return result


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
    from .training.lock import RunLockedError, held_by

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


def random_target_rebuild(manifest: dict, bundle: str) -> list[str]:
    """The card's lines rebuilding a random target without domino_graft (transformers + torch)."""
    t = manifest["target"]
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(
        ((manifest.get("recipe") or {}).get("target") or {}).get("dtype"), "float32")
    return [
        f"The target is a random test model (seed {t.get('seed')}), which `domino_graft.bundle.load_bundle` rebuilds "
        "from its seed. Without domino_graft, with the transformers and torch versions in manifest.json's `versions`:",
        "",
        "```python",
        "import json, torch, transformers",
        f"t = json.load(open({(bundle + '/manifest.json')!r}))[\"target\"]",
        "config = transformers.AutoConfig.for_model(**t[\"hf_config\"])",
        "torch.manual_seed(t[\"seed\"])",
        f"target = transformers.AutoModelForCausalLM.from_config(config).to(torch.{dtype})",
        "```",
        "",
        f"(its config hash, sha256 of the sorted config JSON without its version and path keys: `{t.get('config_hash')}`).",
        "The serving commands below show the shape of a real deployment.",
        "",
    ]


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
    from .engines import CheckpointView, check_all

    view = CheckpointView.read(folder, weights=list(files), config=next(iter(configs)), target_vocab=target_vocab)
    return check_all(family, view)


def export_run(run: Optional[str] = None, out: Optional[str] = None, *, format: Optional[str] = None,
               dtype: Optional[str] = None, device: Optional[str] = None, echo=print, force: bool = False,
               engine: Optional[str] = None) -> Path:
    """Export RUN (default: the most recent) to a verified bundle; returns its path.

    engine: write the format that engine reads and refuse (nothing written) a bundle that
    breaks one of its loader rules (domino_graft/engines.py). force: replace an existing
    bundle at the destination (never anything else)."""
    from .checkpoint import check_destination
    from .device import pick_device
    from .engines import ENGINE_NAMES, require
    from .head import HEAD_TENSOR_NAMES
    from .provenance import git_sha, now, versions
    from .recipe import recipe_to_dict
    from .rundir import check_recipe_matches_manifest, load_run, read_run_manifest, resolve_run, run_recipe

    run_dir = resolve_run(run)
    _check_not_training(run_dir)
    recipe = run_recipe(run_dir)
    # the manifest and the recipe the bundle will record must describe the same weights
    check_recipe_matches_manifest(recipe_to_dict(recipe), read_run_manifest(run_dir),
                                  recipe_source=f"{run_dir}/recipe.resolved.json", manifest_source="manifest.json")
    family = get_family(recipe.drafter.family)
    format, dtype, spec = resolve_format(family, recipe, format=format, engine=engine, dtype=dtype)
    if engine == "sglang":  # a bench of this bundle drafts from SGLang's candidates (kernels/reference.py)
        recipe = recipe.model_copy(update={"bench": recipe.bench.model_copy(
            update={"head_kernel": "triton_pool", "pool_select": "block_shared"})})
    out_dir = Path(out) if out else default_bundle_dir(run_dir, format, dtype)
    option = "-o" if out else "-o (default bundles/<run>-<format>-<dtype>)"
    replacing = check_destination(out_dir, kind="bundle", option=option, force=force)  # before loading
    if engine is not None:  # the planned config and shapes first: a broken rule fails before any weights load
        planned = plan_bundle(recipe, format=format, dtype=dtype, engine=engine).engine_report
        if planned is not None:
            require(planned, what=f"the planned bundle {out_dir}")
    device = device or pick_device(recipe)
    loaded = load_run(run_dir, device=device)
    adapter, head, target = loaded.adapter, loaded.head, loaded.target

    files, configs = family.bundle_contents(adapter, head, format=format, dtype=dtype)
    main_config = next(iter(configs.values()))
    head_in_bundle = set(HEAD_TENSOR_NAMES) <= {n for tensors in files.values() for n in tensors}
    run_manifest = loaded.manifest
    manifest = {
        "kind": "domino-graft bundle",
        "format": format,
        "dtype": dtype,
        "layout": family.bundle_layout,
        "engine": engine,  # the engine whose checklist this export was required to pass
        "head_in_bundle": head_in_bundle,
        "created_at": now(),
        "versions": versions(),
        "git_sha": git_sha(),
        "source_run": {
            "path": str(run_dir.resolve()),
            "created_at": run_manifest.get("created_at"),
            "git_sha": run_manifest.get("git_sha"),
            "training": run_manifest.get("training"),
        },
        "recipe": recipe_to_dict(recipe),
        "target": {**run_manifest["target"], "architecture": target.shape.architecture,
                   "vocab_size": target.shape.vocab_size, "hidden_size": target.shape.hidden_size,
                   **_random_target_config(run_manifest["target"], target)},
        "drafter": _drafter_summary(family, adapter, main_config),
        "head": head.spec.to_dict(),
        "kernel": _kernel_choice(recipe_to_dict(recipe)),
        # per tensor the dtype it is stored in: the export dtype, or an integer/bool tensor's own
        "tensors": {name: {"file": f, "shape": list(v.shape), "dtype": dtype_name(v.dtype),
                           "sha256": tensor_sha256(v)}
                    for f, tensors in files.items() for name, v in tensors.items()},
        "files": {},
        "bench": _bench_results(run_dir),
    }
    n_tensors = len(manifest["tensors"])
    with atomic_dir(out_dir, overwrite=replacing) as tmp:
        for f, tensors in files.items():
            (tmp / f).parent.mkdir(parents=True, exist_ok=True)
            save_tensors(tmp / f, tensors, {"format": "pt"})
        for f, cfg in configs.items():
            atomic_write_json(tmp / f, cfg)
        for name, source in family.bundle_code_files(format).items():
            atomic_write_bytes(tmp / name, Path(source).read_bytes())
        reports = _engine_checks(family, tmp, files, configs, target.shape.vocab_size)
        if engine is not None:
            require(reports[engine], what=f"bundle {out_dir}")
        _check_bundle_dtypes(files, adapter, dtype)  # after the engine's own rules, whose message is theirs
        manifest["engines"] = {e: r.to_dict() for e, r in reports.items()}
        manifest["files"] = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        atomic_write_json(tmp / "manifest.json", manifest)
        echo(f"self-check: reloading {n_tensors} tensors ({dtype}) and comparing draft logits ...")
        manifest["self_check"] = self_check(tmp, target=target, adapter=adapter, head=head, dtype=dtype,
                                            format=format, family=family, seed=recipe.bench.seed, device=device,
                                            recipe=recipe, head_in_bundle=head_in_bundle)
        atomic_write_json(tmp / "manifest.json", manifest)
        atomic_write_text(tmp / "README.md", model_card(manifest, main_config, bundle=str(out_dir)))
        if replacing:  # the same refusals as before loading, should anything have changed there since
            check_destination(out_dir, kind="bundle", option=option, force=force)
    sc = manifest["self_check"]
    echo(
        ("replaced" if replacing else "wrote") + f" bundle {out_dir} ({format}, {dtype}, {n_tensors} tensors); self-check passed: "
        f"exact {sc['exact_max_rel_diff']:.2g} <= {sc['exact_tolerance']:g}, "
        f"fidelity {sc['fidelity_max_rel_diff']:.2g} <= {sc['fidelity_tolerance']:g}"
    )
    echo("engine checklists: " + "; ".join(r.summary() for r in reports.values())
         + f" (`domino-graft inspect {out_dir}` says why)")
    if spec is not None and spec.serve is not None:
        echo(f"\nServe it ({ENGINE_NAMES[engine]}):\n")
        lines = spec.serve(manifest, str(out_dir), target_reference(manifest))
        echo("\n".join(line for line in lines if not line.startswith("```")))  # markdown fences: the card's
    return out_dir


# -------------------------------------------------------------------------- model card
def _fmt_value(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def target_reference(manifest: dict) -> str:
    """The target as a serving command names it (TARGET for a random test target)."""
    t = manifest["target"]
    return "TARGET" if t.get("kind") == "random" else (t.get("path") or t.get("name_or_path") or "TARGET")


def model_card(manifest: dict, config: dict, *, bundle: str = "BUNDLE") -> str:
    t = manifest["target"]
    h = manifest["head"]
    d = manifest["drafter"]
    fmt, dtype = manifest["format"], manifest["dtype"]
    family = get_family(d.get("family") or manifest["recipe"]["drafter"]["family"])
    name = family.display_name
    drafter_row, format_row = family.card_rows(manifest, config)
    random_target = t.get("kind") == "random"
    target_ref = target_reference(manifest)
    target_desc = f"random {t.get('architecture')}, seed {t.get('seed')}" if random_target else f"`{target_ref}`"
    n_params = sum(math.prod(v["shape"]) for v in manifest["tensors"].values())
    head_params = sum(math.prod(v["shape"]) for k, v in manifest["tensors"].items()
                      if k.startswith(("prefix_gru.", "embed_proj.")))
    lines = [
        f"# {manifest['recipe'].get('name') or 'domino-graft'} — {name} drafter + Domino head ({fmt}, {dtype})",
        "",
        f"A parallel {name} drafter with a Domino head (arXiv 2605.29707) for speculative decoding: one",
        "backbone forward drafts a block, and a bias-free GRU over the drafted prefix adds a low-rank",
        "logit correction, `L_final = L_base + W2·SiLU(W1·[H; S])`. Verification by the target keeps",
        "the output distribution exactly the target's.",
        "",
        "| | |",
        "|---|---|",
        f"| target | {target_desc} ({t.get('architecture')}, hidden {t.get('hidden_size')}, vocab {t.get('vocab_size')}, "
        f"config hash `{t.get('config_hash')}`) |",
        drafter_row,
        f"| head | GRU {h['gru_hidden_dim']}, rank {h['rank']}, pure prefix {h['pure_prefix_len']}: "
        + (f"{head_params:,} parameters |" if manifest.get("head_in_bundle", True) else
           "**dropped** from this bundle (the engine has no Domino runtime); the native bundle carries it |"),
        f"| tensors | {len(manifest['tensors'])}, {n_params:,} parameters, {dtype} |",
        format_row,
        "",
        "## Measured",
        "",
    ]
    bench = [b for b in manifest.get("bench") or [] if b["values"]]
    if bench:
        for b in bench:
            vals = ", ".join(f"`{k}` = {_fmt_value(v)}" for k, v in b["values"].items())
            where = f" on {b['device']}" if b.get("device") else ""
            lines.append(f"- `{b['file']}` (`domino-graft bench` of `{b.get('measured_on') or 'the source run'}`"
                         f"{where}, weights before rounding to {dtype}): {vals}")
    else:
        lines.append("τ (mean accepted tokens per target forward): **not measured** — no `bench*.json` in the source "
                     "run. Run `domino-graft bench` and re-export to record it here.")
    sc = manifest.get("self_check") or {}
    if sc:
        lines += [
            "",
            f"Export self-check ({sc['blocks']} random blocks): reloaded draft logits vs the weights rounded to {dtype}: "
            f"{sc['exact_max_rel_diff']:.2g} (≤ {sc['exact_tolerance']:g}); vs the trained model: "
            f"{sc['fidelity_max_rel_diff']:.2g} (≤ {sc['fidelity_tolerance']:g}), relative to max |logit|."
            + (f" transformers remote code: {sc['hf_max_rel_diff']:.2g}." if "hf_max_rel_diff" in sc else ""),
        ]
    engines = manifest.get("engines") or {}
    if engines:
        from .engines import ENGINE_NAMES

        lines += ["", "## Engine checklists", ""]
        lines += [f"- {ENGINE_NAMES[e]}: " + ("passes" if r["passed"] else f"refused: {r['refused']}" if r.get("refused")
                  else f"fails {len(r['failed'])} of {r['rules']} rules") for e, r in engines.items()]
        lines.append(f"\n`domino-graft inspect {bundle}` lists every rule and its source.")
    lines += ["", "## Serve", ""]
    if random_target:
        lines += random_target_rebuild(manifest, bundle)
        if getattr(family, "names_verifier", False):
            lines += [f"This {name} drafter's `speculators_config.verifier.name_or_path` is null: a random target has "
                      "no folder or hub name, so no engine can load its verifier by name (`export --engine vllm` "
                      "refuses it).", ""]
    lines += family.card_serve_lines(manifest, bundle=bundle, target_ref=target_ref)
    lines += ["", "## How it was made", ""]
    training = (manifest.get("source_run") or {}).get("training")
    if isinstance(training, dict) and training:
        lines.append("Training (from the source run's manifest):")
        lines.append("")
        for k, v in training.items():
            lines.append(f"- `{k}`: {json.dumps(v, default=str) if isinstance(v, (dict, list)) else _fmt_value(v)}")
    else:
        lines.append("No training entry in the source run's manifest: the head is as grafted (W2 = 0 means the "
                     f"bundle drafts exactly like the base {name} drafter) or was loaded from a checkpoint.")
    tr = manifest["recipe"].get("train") or {}
    lines += [
        "",
        f"Recipe (full text in manifest.json): backbone `{tr.get('backbone')}`, λ {tr.get('lambda_start')} → 0 over "
        f"{tr.get('decay_ratio')} of {tr.get('max_steps')} steps, γ {tr.get('gamma')}, lr {tr.get('lr')}.",
        f"domino-graft {manifest['versions'].get('domino-graft')} (git {manifest.get('git_sha')}), "
        f"torch {manifest['versions'].get('torch')}, transformers {manifest['versions'].get('transformers')}; "
        f"exported {manifest['created_at']} from `{manifest['source_run']['path']}`.",
        "",
        f"Reload strictly (checksums, target identity): `domino_graft.bundle.load_bundle({bundle!r})`.",
        "",
    ]
    return "\n".join(lines)
