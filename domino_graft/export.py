"""`domino-graft export`: a run dir -> a deployable bundle, verified before it is final.

DFlash (the engines' DFlash+Domino format, DESIGN §3):

    BUNDLE/model.safetensors     drafter backbone + Domino head, native names, export dtype
    BUNDLE/config.json           native: SGLang DFLASH / vLLM layout
                                 hf: DominoDraftModel + auto_map (transformers remote code)
    BUNDLE/configuration_domino.py, modeling_domino.py    (hf only)

Other families (no engine reads a Domino head on them yet):

    BUNDLE/drafter/              the family's own checkpoint format (Medusa: FasterDecoding)
    BUNDLE/head.safetensors      the Domino head, native names

Every bundle: manifest.json (provenance, recipe, target identity, per-tensor sha256,
self-check result) and README.md (model card).

The bundle is written to a temporary sibling, reloaded through `bundle.load_bundle` (the
same strict loader `generate`/`bench` use) and, for hf, through transformers, and its draft
logits are compared with the in-memory model. Only then is it renamed into place; on a
mismatch nothing is left behind.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .bundle import HEAD_FILE
from .checkpoint import (
    atomic_dir,
    atomic_write_json,
    atomic_write_text,
    check_tensors,
    save_tensors,
    sha256_file,
    tensor_sha256,
)

FORMATS = ("native", "hf")
DTYPES = ("bf16", "fp16", "fp32")
TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
HF_CODE_FILES = ("configuration_domino.py", "modeling_domino.py")
HF_CODE_DIR = Path(__file__).resolve().parent / "hf_modeling"
HF_AUTO_MAP = {
    "AutoConfig": "configuration_domino.DominoDFlashConfig",
    "AutoModel": "modeling_domino.DominoDraftModel",
}
# Other families: the drafter's own checkpoint goes to BUNDLE/drafter/ under the file name
# its ecosystem expects (each family's build() reads it back from there).
DRAFTER_WEIGHTS = {"medusa": "medusa_lm_head.safetensors"}
FAMILY_NAMES = {"dflash": "DFlash", "medusa": "Medusa-1", "pard": "PARD"}
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


def _check_format(family: str, format: str, dtype: str) -> None:
    _check_choice("format", format, FORMATS)
    _check_choice("dtype", dtype, DTYPES)
    if family != "dflash" and format != "native":
        raise ValueError(f"export.format: {format!r} is only available for dflash drafters; valid for {family}: native")


def planned_tensor_shapes(drafter_cfg, spec) -> dict[str, tuple[int, ...]]:
    """Every tensor a DFlash+Domino bundle holds, in file order: backbone, then the head."""
    from .adapters.dflash import backbone_tensor_shapes

    return {**backbone_tensor_shapes(drafter_cfg), **spec.tensor_shapes()}


def bundle_tensors(backbone_state: dict, head_state: dict, expected: dict, *, dtype: str) -> dict:
    """Native names -> tensors cast to the export dtype, checked against the plan (so an
    adapter whose state_dict drifts from the native names cannot write a bundle)."""
    from .target import TORCH_DTYPES

    state = {**backbone_state, **head_state}
    check_tensors(state, expected, source="export (in-memory drafter + head)")
    return {k: state[k].detach().to(TORCH_DTYPES[dtype]).contiguous() for k in expected}


def bundle_config(drafter_cfg, spec, *, format: str, dtype: str) -> dict:
    from .adapters.dflash import domino_native_config

    cfg = domino_native_config(drafter_cfg, spec)
    cfg["torch_dtype"] = TORCH_NAMES[dtype]
    if format == "hf":
        # Same tensors and Domino keys; only the class transformers instantiates differs.
        cfg.update(architectures=["DominoDraftModel"], model_type="domino_dflash", auto_map=dict(HF_AUTO_MAP))
    return cfg


@dataclass
class BundlePlan:
    """What `export` would write, from configs alone (no weights read)."""

    format: str
    dtype: str
    config: Optional[dict]
    tensors: dict[str, tuple[int, ...]]
    files: list[str] = field(default_factory=list)

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
            lines.append(f"  config: architectures {self.config['architectures']}, "
                         f"dflash_config {self.config['dflash_config']}")
        for name, shape in self.tensors.items():
            lines.append(f"    {name:<44} {list(shape)}")
        return "\n".join(lines)


def _files(family: str, format: str) -> list[str]:
    if family != "dflash":
        weights = DRAFTER_WEIGHTS.get(family, "model.safetensors")
        return [f"drafter/{weights}", "drafter/config.json", HEAD_FILE, "manifest.json", "README.md"]
    return ["model.safetensors", "config.json", *(HF_CODE_FILES if format == "hf" else ()), "manifest.json", "README.md"]


def plan_bundle(recipe, *, format: Optional[str] = None, dtype: Optional[str] = None) -> BundlePlan:
    """Bundle tensors and config from the recipe's configs (the path `export --dry-run` takes)."""
    from .adapters import family_module
    from .graft import head_spec_for
    from .target import TargetShape, target_config_dict

    family = recipe.drafter.family
    format, dtype = format or recipe.export.format, dtype or recipe.export.dtype
    _check_format(family, format, dtype)
    module = family_module(family)
    tshape = TargetShape.from_config_dict(target_config_dict(recipe.target))
    fam_plan = module.plan(recipe.drafter, tshape)
    declared = getattr(module, "checkpoint_head_fields", lambda _d: {})(recipe.drafter)
    spec = head_spec_for(recipe, fam_plan, declared)
    if family != "dflash":
        return BundlePlan(format, dtype, None, {**fam_plan.backbone_tensors, **spec.tensor_shapes()},
                          _files(family, format))
    drafter_cfg = module.config_from_recipe(recipe.drafter, tshape)
    return BundlePlan(
        format=format,
        dtype=dtype,
        config=bundle_config(drafter_cfg, spec, format=format, dtype=dtype),
        tensors=planned_tensor_shapes(drafter_cfg, spec),
        files=_files(family, format),
    )


# --------------------------------------------------------------------------- self-check
def _greedy(adapter, head, block, anchor):
    """Proposals d_1..d_K (DESIGN §2): the GRU reads E(x_0), then each realised proposal."""
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
    # ids 0, 1 and the last row are often special (bos/eos, DFlash mask, PARD token): avoid them
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


def _rel_diff(a_list, b_list) -> float:
    worst = 0.0
    for (a, _), (b, _) in zip(a_list, b_list):
        scale = max(1.0, float(a.abs().max()))
        worst = max(worst, float((a - b).abs().max()) / scale)
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


def _hf_logits(bundle_dir: Path, target, ids, feats, anchors, prev_tokens):
    """The same probe through transformers' AutoModel + the shipped remote code."""
    import torch
    import transformers

    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a bar per tiny reload is noise in `export` output
    try:
        model = transformers.AutoModel.from_pretrained(
            str(bundle_dir), trust_remote_code=True, local_files_only=True, dtype=target.dtype
        ).to(target.device).eval()
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    # domino-graft runs the head in fp32 whatever the backbone's dtype (graft.build_head); do the
    # same here so this compares the files and the code, not bf16-vs-fp32 head arithmetic (~1%
    # of max |logit| on an H200 in bf16).
    model.prefix_gru.float().flatten_parameters()
    model.embed_proj.float()
    out = []
    bs = model.block_size
    for i, a in enumerate(anchors):
        anchor = ids[:, a]
        block_ids = torch.full((ids.shape[0], bs), model.mask_token_id, dtype=torch.long, device=ids.device)
        block_ids[:, 0] = anchor
        pos = torch.arange(a + bs, device=ids.device)[None]
        hidden = model.proposal_hidden(model(target.embed(block_ids), feats[:, :a], pos))
        base = target.lm_head(hidden)
        prev = torch.cat([anchor[:, None], prev_tokens[i][:, :-1]], dim=1)
        out.append((model.domino_logits(hidden, base, target.embed(prev)).float(), None))
    return out


def self_check(bundle_dir: Path, *, target, adapter, head, dtype: str, format: str, seed: int = 0,
               device="cpu") -> dict:
    """Reload the bundle through the project's loader and compare draft logits; raise ExportError."""
    import torch

    from .bundle import load_bundle

    with torch.no_grad():
        ids, feats, anchors = _probe_inputs(target, adapter, seed=seed)
        mem = _draft_logits(adapter, head, ids, feats, anchors)
        tokens = [t for _, t in mem]
        # fp32 export: rounding is the identity, the in-memory pass is the rounded reference
        if dtype == "fp32":
            rounded = mem
        else:
            with rounded_weights(adapter, head, dtype):
                rounded = _draft_logits(adapter, head, ids, feats, anchors, tokens, greedy=False)
        loaded = load_bundle(bundle_dir, device=device, target=target)
        # teacher-forced on the in-memory proposals (comparable logits), plus its own greedy ones
        reloaded = _draft_logits(loaded.adapter, loaded.head, ids, feats, anchors, tokens)
        compute = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[target.dtype]
        result = {
            "blocks": len(anchors) * ids.shape[0],
            "anchors": anchors,
            "exact_max_rel_diff": _rel_diff(rounded, reloaded),
            "exact_tolerance": EXACT_TOL[compute],
            "fidelity_max_rel_diff": _rel_diff(mem, reloaded),
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
        if format == "hf":
            hf = _hf_logits(bundle_dir, target, ids, feats, anchors, tokens)
            result["hf_max_rel_diff"] = _rel_diff(rounded, hf)
            # an independent implementation: same ops, but allow float reassociation
            result["hf_tolerance"] = max(EXACT_TOL[compute], 1e-4)
            if not result["hf_max_rel_diff"] <= result["hf_tolerance"]:
                problems.append(
                    f"transformers AutoModel (remote code) vs the in-memory weights rounded to {dtype}: "
                    f"{result['hf_max_rel_diff']:.3g} > {result['hf_tolerance']:g}"
                )
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


def _weights_and_config(adapter, head, *, family: str, format: str, dtype: str):
    """{file: {name: tensor}} (cast, checked) and the config.json each layout writes."""
    from .target import TORCH_DTYPES

    if family == "dflash":
        expected = planned_tensor_shapes(adapter.cfg, head.spec)
        tensors = bundle_tensors(adapter.backbone_state_dict(), head.state_dict(), expected, dtype=dtype)
        return {"model.safetensors": tensors}, {"config.json": bundle_config(adapter.cfg, head.spec, format=format,
                                                                               dtype=dtype)}
    t = TORCH_DTYPES[dtype]
    head_state = head.state_dict()
    check_tensors(head_state, head.spec.tensor_shapes(), source="export (in-memory Domino head)")
    drafter = {k: v.detach().to(t).contiguous() for k, v in adapter.backbone_state_dict().items()}
    clash = sorted(set(drafter) & set(head_state))
    if clash:  # the manifest keys tensors by name across both files
        raise ValueError(f"export: drafter tensor names {clash} collide with the Domino head's")
    weights = f"drafter/{DRAFTER_WEIGHTS.get(family, 'model.safetensors')}"
    return ({weights: drafter, HEAD_FILE: {k: v.detach().to(t).contiguous() for k, v in head_state.items()}},
            {"drafter/config.json": adapter.native_config()})


def _drafter_summary(adapter, config: dict, family: str) -> dict:
    out = {"family": family, "architecture": (config.get("architectures") or [None])[0],
           "num_slots": adapter.num_slots, "topology": getattr(adapter, "topology", "chain")}
    cfg = getattr(adapter, "cfg", None)
    if family == "dflash":
        out.update(block_size=cfg.block_size, shift_label=cfg.shift_label, target_layer_ids=list(cfg.target_layer_ids))
    return out


def export_run(run: Optional[str] = None, out: Optional[str] = None, *, format: Optional[str] = None,
               dtype: Optional[str] = None, device: Optional[str] = None, echo=print) -> Path:
    """Export RUN (default: the most recent) to a verified bundle; returns its path."""
    from .apply import pick_device
    from .recipe import recipe_to_dict
    from .rundir import git_sha, load_run, now, resolve_run, run_recipe, versions

    run_dir = resolve_run(run)
    recipe = run_recipe(run_dir)
    family = recipe.drafter.family
    format, dtype = format or recipe.export.format, dtype or recipe.export.dtype
    _check_format(family, format, dtype)
    device = device or pick_device(recipe)
    loaded = load_run(run_dir, device=device)
    adapter, head, target = loaded.adapter, loaded.head, loaded.target
    out_dir = Path(out) if out else default_bundle_dir(run_dir, format, dtype)

    files, configs = _weights_and_config(adapter, head, family=family, format=format, dtype=dtype)
    main_config = next(iter(configs.values()))
    run_manifest = loaded.manifest
    manifest = {
        "kind": "domino-graft bundle",
        "format": format,
        "dtype": dtype,
        "layout": "dflash" if family == "dflash" else "drafter+head",
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
                   "vocab_size": target.shape.vocab_size, "hidden_size": target.shape.hidden_size},
        "drafter": _drafter_summary(adapter, main_config, family),
        "head": head.spec.to_dict(),
        "kernel": _kernel_choice(recipe_to_dict(recipe)),
        "tensors": {name: {"file": f, "shape": list(v.shape), "dtype": dtype, "sha256": tensor_sha256(v)}
                    for f, tensors in files.items() for name, v in tensors.items()},
        "files": {},
        "bench": _bench_results(run_dir),
    }
    n_tensors = len(manifest["tensors"])
    with atomic_dir(out_dir) as tmp:
        for f, tensors in files.items():
            (tmp / f).parent.mkdir(parents=True, exist_ok=True)
            save_tensors(tmp / f, tensors, {"format": "pt"})
        for f, cfg in configs.items():
            atomic_write_json(tmp / f, cfg)
        if format == "hf":
            for name in HF_CODE_FILES:
                shutil.copyfile(HF_CODE_DIR / name, tmp / name)
        manifest["files"] = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        atomic_write_json(tmp / "manifest.json", manifest)
        echo(f"self-check: reloading {n_tensors} tensors ({dtype}) and comparing draft logits ...")
        manifest["self_check"] = self_check(tmp, target=target, adapter=adapter, head=head, dtype=dtype,
                                            format=format, seed=recipe.bench.seed, device=device)
        atomic_write_json(tmp / "manifest.json", manifest)
        atomic_write_text(tmp / "README.md", model_card(manifest, main_config, bundle=str(out_dir)))
    sc = manifest["self_check"]
    echo(
        f"wrote bundle {out_dir} ({format}, {dtype}, {n_tensors} tensors); self-check passed: "
        f"exact {sc['exact_max_rel_diff']:.2g} <= {sc['exact_tolerance']:g}, "
        f"fidelity {sc['fidelity_max_rel_diff']:.2g} <= {sc['fidelity_tolerance']:g}"
    )
    return out_dir


# -------------------------------------------------------------------------- model card
def _fmt_value(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def model_card(manifest: dict, config: dict, *, bundle: str = "BUNDLE") -> str:
    t = manifest["target"]
    h = manifest["head"]
    d = manifest["drafter"]
    fmt, dtype = manifest["format"], manifest["dtype"]
    family = d.get("family", "dflash")
    name = FAMILY_NAMES.get(family, family)
    random_target = t.get("kind") == "random"
    target_ref = "TARGET" if random_target else (t.get("path") or t.get("name_or_path") or "TARGET")
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
        (f"| drafter | DFlash, block {d['block_size']} ({d['num_slots']} proposals), shift_label "
         f"{json.dumps(d['shift_label'])}, target layers {d['target_layer_ids']} |" if family == "dflash" else
         f"| drafter | {name}, {d['num_slots']} proposals per step, {d.get('topology', 'chain')} verification |"),
        f"| head | GRU {h['gru_hidden_dim']}, rank {h['rank']}, pure prefix {h['pure_prefix_len']}: "
        f"{head_params:,} parameters |",
        f"| tensors | {len(manifest['tensors'])}, {n_params:,} parameters, {dtype} |",
        (f"| format | `{fmt}`: architectures {config.get('architectures')} |" if family == "dflash" else
         f"| format | `drafter/`: a plain {name} checkpoint; `{HEAD_FILE}`: the Domino head |"),
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
    lines += ["", "## Serve", ""]
    if random_target:
        lines += ["The target is a random test model (rebuilt from its seed by `load_bundle`): the commands below "
                  "show the shape of a real deployment.", ""]
    if family != "dflash":
        lines += [
            f"No serving engine runs a Domino head on {name} drafters yet. `drafter/` is a plain {name} checkpoint "
            "(serve it as the base drafter); the corrected drafter runs in domino-graft:",
            "",
            "```bash",
            f"domino-graft generate {bundle} ...",
            f"domino-graft bench {bundle}",
            "```",
        ]
    elif fmt == "native":
        lines += [
            "SGLang (DFlash V2 with Domino, PR #36899 or later):",
            "",
            "```bash",
            "python -m sglang.launch_server \\",
            f"    --model-path {target_ref} \\",
            "    --speculative-algorithm DFLASH \\",
            f"    --speculative-draft-model-path {bundle} \\",
            "    --speculative-domino-candidate-pool-size 2048   # 0 = full-vocabulary correction",
            "```",
            "",
            "vLLM (the `dflash` method; the Domino head needs a vLLM build that reads "
            "`dflash_config.projector_type: domino` — see vllm-project/vllm#46707):",
            "",
            "```bash",
            f"vllm serve {target_ref} \\",
            f"    --speculative-config '{{\"method\": \"dflash\", \"model\": \"{bundle}\", "
            f"\"num_speculative_tokens\": {d['num_slots']}}}'",
            "```",
            "",
            f"domino-graft: `domino-graft generate {bundle} ...` / `domino-graft bench {bundle}` "
            "(the target is rebuilt from the recipe in manifest.json).",
        ]
    else:
        lines += [
            "transformers (remote code shipped in this folder; the drafter reuses the target's "
            "embeddings and LM head):",
            "",
            "```python",
            "from transformers import AutoModel",
            f"drafter = AutoModel.from_pretrained({bundle!r}, trust_remote_code=True)",
            "hidden = drafter.proposal_hidden(drafter(noise_embedding, target_hidden, position_ids))",
            "tokens = drafter.draft_greedy(hidden, target_lm_head(hidden), anchor_ids, target_embed_tokens)",
            "```",
            "",
            "For SGLang / vLLM export the `native` format (`domino-graft export --format native`).",
        ]
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
