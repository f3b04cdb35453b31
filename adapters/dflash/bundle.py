"""The DFlash+Domino bundle: the format SGLang (PR #36899 or later) and the Domino checkpoints
use (docs/design.md §3), and its transformers remote-code variant.

    BUNDLE/model.safetensors     drafter backbone + Domino head, native names, export dtype
                                 (vllm: the backbone alone; vLLM has no Domino runtime)
    BUNDLE/config.json           native: SGLang's DFLASH layout with the Domino keys
                                 hf: DominoDraftModel + auto_map (transformers remote code)
                                 vllm: the z-lab layout (no Domino keys) + vLLM's aux layer ids
    BUNDLE/configuration_domino.py, modeling_domino.py, rollout_domino.py    (hf only: torch +
                                 transformers; rollout_domino.py holds spec_generate)
    BUNDLE/triton_rollout_domino.py    (hf only: domino-graft's kernels/head/triton_rollout.py verbatim,
                                 the fused rollout's Triton kernels, imported only when triton is)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .model import DFlashConfig, backbone_tensor_shapes, domino_head_fields, domino_native_config

TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
HF_CODE_FILES = ("configuration_domino.py", "modeling_domino.py", "rollout_domino.py")  # torch + transformers only
HF_CODE_DIR = Path(__file__).resolve().parent / "hf_modeling"
# Shipped beside the remote code, imported (inside a try) by rollout_domino.py: needs triton
HF_KERNEL_FILES = {"triton_rollout_domino.py": "head/triton_rollout.py"}  # bundle name -> file in kernels/
HF_AUTO_MAP = {
    "AutoConfig": "configuration_domino.DominoDFlashConfig",
    "AutoModel": "modeling_domino.DominoDraftModel",
}
WEIGHTS = "model.safetensors"
HEADLESS = ("vllm",)  # formats written without the Domino head
# vLLM's aux hidden-state ids count layer *inputs*: DFlash's output id i is its i + 1
AUX_IDS_KEY = "eagle_aux_hidden_state_layer_ids"


def hf_shipped_files() -> tuple[str, ...]:
    """Every code file an hf bundle carries: the remote code, then the Triton kernels."""
    return (*HF_CODE_FILES, *HF_KERNEL_FILES)


def bundle_files(format: str) -> list[str]:
    return [WEIGHTS, "config.json", *(hf_shipped_files() if format == "hf" else ())]


def _kernels_dir() -> Path:
    import domino_graft.kernels as kernels  # torch only; triton is not imported

    return Path(kernels.__file__).resolve().parent


def code_files(format: str) -> dict[str, Path]:
    if format != "hf":
        return {}
    kernels = _kernels_dir()
    return {**{name: HF_CODE_DIR / name for name in HF_CODE_FILES},
            **{name: kernels / source for name, source in HF_KERNEL_FILES.items()}}


def planned_tensor_shapes(drafter_cfg, spec, format: str = "native") -> dict[str, tuple[int, ...]]:
    """Every tensor a DFlash+Domino bundle holds, in file order: backbone, then the head."""
    return {**backbone_tensor_shapes(drafter_cfg), **({} if format in HEADLESS else spec.tensor_shapes())}


def vllm_config(drafter_cfg) -> dict:
    """The z-lab DFlash config.json (no Domino keys) vLLM's DFlash loader reads, with the aux
    layer ids vLLM counts as layer inputs (output id i -> i + 1), which older vLLM needs.
    dflash_config.shift_label stays: vLLM ignores it, and its checklist refuses `true`."""
    cfg = drafter_cfg.to_native()
    cfg[AUX_IDS_KEY] = [i + 1 for i in drafter_cfg.target_layer_ids]
    return cfg


def bundle_config(drafter_cfg, spec, *, format: str, dtype: str) -> dict:
    cfg = vllm_config(drafter_cfg) if format in HEADLESS else domino_native_config(drafter_cfg, spec)
    cfg["torch_dtype"] = TORCH_NAMES[dtype]
    if format == "hf":
        # Same tensors and Domino keys; only the class transformers instantiates differs.
        cfg.update(architectures=["DominoDraftModel"], model_type="domino_dflash", auto_map=dict(HF_AUTO_MAP))
    return cfg


def plan_bundle(drafter, tshape, spec, *, format: str, dtype: str):
    from .adapter import config_from_recipe

    drafter_cfg = config_from_recipe(drafter, tshape)
    return (bundle_config(drafter_cfg, spec, format=format, dtype=dtype),
            planned_tensor_shapes(drafter_cfg, spec, format))


def bundle_tensors(backbone_state: dict, head_state: dict, expected: dict, *, dtype: str) -> dict:
    """Native names -> tensors cast to the export dtype, checked against the plan (so an
    adapter whose state_dict drifts from the native names cannot write a bundle)."""
    from domino_graft.artifacts.tensors import check_tensors
    from domino_graft.target import TORCH_DTYPES

    state = {**backbone_state, **head_state}
    check_tensors(state, expected, source="export (in-memory drafter + head)")
    return {k: state[k].detach().to(TORCH_DTYPES[dtype]).contiguous() for k in expected}


def bundle_contents(adapter, head, *, format: str, dtype: str):
    expected = planned_tensor_shapes(adapter.cfg, head.spec, format)
    head_state = {} if format in HEADLESS else head.state_dict()
    tensors = bundle_tensors(adapter.backbone_state_dict(), head_state, expected, dtype=dtype)
    return {WEIGHTS: tensors}, {"config.json": bundle_config(adapter.cfg, head.spec, format=format, dtype=dtype)}


def implied_tensor_shapes(config: dict, *, source: str, headless: bool = False) -> dict[str, tuple[int, ...]]:
    """What a DFlash+Domino config.json implies the weights must be, name by name (headless:
    a bundle whose manifest says the head was dropped, and whose config declares none)."""
    from domino_graft.artifacts.files import CheckpointError
    from domino_graft.head import HeadSpec

    cfg = DFlashConfig.from_native(config)
    fields = domino_head_fields(config, source)
    if not fields and headless:
        return backbone_tensor_shapes(cfg)
    if not fields:
        raise CheckpointError(
            f"{source}: declares no Domino head (dflash_config.projector_type is not 'domino'); "
            "a domino-graft bundle always carries one"
        )
    # DFlash reuses the target's embeddings, so the GRU reads vectors of the drafter's hidden size.
    spec = HeadSpec(hidden_dim=cfg.hidden_size, emb_dim=cfg.hidden_size, vocab_size=cfg.vocab_size, **fields)
    return {**backbone_tensor_shapes(cfg), **spec.tensor_shapes()}


def implied_tensors(bundle_dir: Path, manifest: Optional[dict] = None) -> tuple[dict, dict]:
    """(config.json, {weights file: what config.json implies it holds})."""
    from domino_graft.artifacts.files import read_json

    f = bundle_dir / "config.json"
    config = read_json(f, missing="file not found; the bundle is incomplete")
    if manifest is None:
        manifest = read_json(bundle_dir / "manifest.json", missing="file not found; the bundle is incomplete")
    headless = manifest.get("head_in_bundle") is False
    return config, {WEIGHTS: implied_tensor_shapes(config, source=str(f), headless=headless)}


# ------------------------------------------------------------- transformers check
def _hf_logits(bundle_dir: Path, target, ids, feats, anchors, prev_tokens):
    """The export self-check's probe through transformers' AutoModel + the shipped remote code."""
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


def transformers_check(bundle_dir: Path, *, format: str, probe: dict) -> tuple[dict, list[str]]:
    """An hf bundle is also reloaded through transformers and its remote code."""
    if format != "hf":
        return {}, []
    from domino_graft.export.self_check import EXACT_TOL, max_rel_diff

    p = probe
    hf = _hf_logits(bundle_dir, p["target"], p["ids"], p["feats"], p["anchors"], p["tokens"])
    # an independent implementation: same ops, but allow float reassociation
    result = {"hf_max_rel_diff": max_rel_diff(p["reference"], hf), "hf_tolerance": max(EXACT_TOL[p["compute"]], 1e-4)}
    problems = []
    if not result["hf_max_rel_diff"] <= result["hf_tolerance"]:
        problems.append(
            f"transformers AutoModel (remote code) vs the in-memory weights rounded to {p['dtype']}: "
            f"{result['hf_max_rel_diff']:.3g} > {result['hf_tolerance']:g}"
        )
    return result, problems


# ------------------------------------------------------------------- model card
def card_rows(manifest: dict, config: dict) -> tuple[str, str]:
    d = manifest["drafter"]
    return (f"| drafter | DFlash, block {d['block_size']} ({d['num_slots']} proposals), shift_label "
            f"{json.dumps(d['shift_label'])}, target layers {d['target_layer_ids']} |",
            f"| format | `{manifest['format']}`: architectures {config.get('architectures')} |")


def serve_lines(manifest: dict, *, bundle: str, target_ref: str) -> list[str]:
    from . import serving

    fmt = manifest["format"]
    if fmt == "hf":
        return serving.hf_lines(manifest, bundle, target_ref)
    if fmt in HEADLESS:
        return serving.vllm_lines(manifest, bundle, target_ref)
    k = manifest["drafter"]["num_slots"]
    return [
        *serving.sglang_lines(manifest, bundle, target_ref),
        "",
        "vLLM cannot load this bundle: it has no Domino runtime (vllm-project/vllm#46707) and its DFlash loader "
        "refuses the head's tensors. `domino-graft export RUN --engine vllm` writes the base drafter without the head, "
        f"served with `vllm serve {target_ref} --speculative-config '{{\"method\": \"dflash\", \"model\": "
        f"\"BUNDLE-vllm\", \"num_speculative_tokens\": {k}}}'` (vLLM reads only shift_label: false drafters).",
        "",
        f"domino-graft: `domino-graft generate {bundle} ...` / `domino-graft bench {bundle}` "
        "(the target is rebuilt from the recipe in manifest.json).",
    ]
