"""The run's weights after training: the trained tensors gathered, LoRA merged, RUN/ updated.

    RUN/head.safetensors               the trained Domino head
    RUN/drafter/model.safetensors      the drafter backbone, when it trained (LoRA merged in)
    RUN/manifest.json                  checksums and the `training` entry, written last
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

from ..artifacts.files import json_bytes, read_json, sha256_file, staged_writes
from ..artifacts.provenance import now
from ..artifacts.tensors import cast_floating, check_tensors, tensors_bytes
from .resume import state_dict_options

HEAD_PREFIX = "head."
BACKBONE_PREFIX = "adapter.backbone."


def merge_lora(state: dict, scaling: float) -> dict:
    """PEFT-injected names -> native names, with W + scaling · B @ A folded into each weight."""
    out = {}
    for name, t in state.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        if name.endswith(".base_layer.weight"):
            stem = name.removesuffix(".base_layer.weight")
            a = state[f"{stem}.lora_A.default.weight"].float()
            b = state[f"{stem}.lora_B.default.weight"].float()
            out[f"{stem}.weight"] = (t.float() + scaling * (b @ a)).to(t.dtype)
        else:  # untouched tensors, including a wrapped layer's bias (`x.base_layer.bias`)
            out[name.replace(".base_layer.", ".")] = t
    return out


def final_tensors(module, info, *, lora_scaling: float | None) -> tuple[dict, dict] | None:
    """(head tensors, native backbone tensors) on rank 0; None elsewhere. Collective."""
    msd, _ = get_state_dict(module, [], options=state_dict_options(info, trainable_only=False))
    if not info.main:
        return None
    head = {k.removeprefix(HEAD_PREFIX): v for k, v in msd.items() if k.startswith(HEAD_PREFIX)}
    backbone = {k.removeprefix(BACKBONE_PREFIX): v for k, v in msd.items() if k.startswith(BACKBONE_PREFIX)}
    if lora_scaling is not None:
        backbone = merge_lora(backbone, lora_scaling)
    return head, backbone


def update_run_weights(run_dir: Path, *, head_tensors: dict, head_spec: dict, backbone: dict | None,
                       backbone_shapes: dict, drafter_dtype: torch.dtype, native_config: dict,
                       training: dict) -> None:
    """Replace RUN/head.safetensors (and RUN/drafter/ when the backbone trained), then the
    manifest's checksums and `training` entry. Every file is written to a temp sibling first
    (NaN/Inf refused) and all are renamed into place only once all are written, the manifest
    last: a full disk leaves the run exactly as it was."""
    run_dir = Path(run_dir)
    manifest = read_json(run_dir / "manifest.json")
    head_file = run_dir / "head.safetensors"
    # floating tensors take the run's dtype; integer/bool ones (vocabulary maps) stay bit for bit
    head_bytes = tensors_bytes(cast_floating(head_tensors, torch.float32),
                               {"format": "domino-head", "spec": json.dumps(head_spec)}, source=str(head_file))
    files = dict(manifest.get("files", {}))
    files["head.safetensors"] = hashlib.sha256(head_bytes).hexdigest()
    drafter_file = run_dir / "drafter" / "model.safetensors"
    drafter_bytes = None
    if backbone is not None:
        check_tensors(backbone, backbone_shapes, source="trained drafter backbone")
        drafter_bytes = tensors_bytes(cast_floating(backbone, drafter_dtype), {"format": "pt"},
                                      source=str(drafter_file))
        files["drafter/model.safetensors"] = hashlib.sha256(drafter_bytes).hexdigest()
    elif drafter_file.is_file():
        files["drafter/model.safetensors"] = sha256_file(drafter_file)
    manifest["files"] = files
    manifest["training"] = training
    manifest["updated_at"] = now()
    with staged_writes() as stage:
        stage(head_file, head_bytes)
        if drafter_bytes is not None:
            stage(drafter_file, drafter_bytes)
            stage(run_dir / "drafter" / "config.json", json_bytes(native_config))
        stage(run_dir / "manifest.json", json_bytes(manifest))
