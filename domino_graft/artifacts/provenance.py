"""Where a result came from: code and tool versions, the machine, the time, and the identity of
the model it was made with. Manifests, bench reports, checkpoints and fetched assets record
these; nothing here imports torch or transformers at module level.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Iterable, Optional

VERSIONED_PACKAGES = ("domino-graft", "torch", "transformers", "safetensors", "peft", "triton")


# ------------------------------------------------------------------------ code and tools
def package_versions(packages: Iterable[str]) -> dict:
    """{package: installed version, or None when it is not installed}."""
    import importlib.metadata as md

    out = {}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def versions() -> dict:
    """Python and the packages a run's numbers depend on."""
    return {"python": platform.python_version(), **package_versions(VERSIONED_PACKAGES)}


def git_sha() -> Optional[str]:
    """The code's commit. DG_GIT_SHA, when set, names it for code that runs outside its checkout
    (a snapshot, or a copy on a GPU machine whose .git may be absent or older than the files)."""
    if os.environ.get("DG_GIT_SHA"):
        return os.environ["DG_GIT_SHA"]
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if sha.returncode != 0:
        return None
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def hardware() -> dict:
    import torch

    info = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "device": "cpu"}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def now() -> str:
    """UTC, to the second (ISO 8601)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------ model identity
def config_hash(cfg: dict) -> str:
    """Stable identity of a model's architecture (shapes, vocab, rope): sha256 of sorted JSON."""
    keep = {k: v for k, v in cfg.items() if k not in ("transformers_version", "_name_or_path", "torch_dtype", "dtype")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def asset_provenance(folder: str) -> dict:
    """What a fetched asset was built from (its asset.json): the registry files and the payload,
    by sha256, so a manifest names the exact weights, not just the asset's name."""
    path = Path(folder) / "asset.json"
    if not path.is_file():
        return {}
    info = json.loads(path.read_text())
    out = {"asset_sources": [{"file": w.get("file"), "sha256": w.get("sha256")} for w in info.get("wheels", [])]}
    if (info.get("payload") or {}).get("sha256"):
        out["asset_payload_sha256"] = info["payload"]["sha256"]
    return out


def random_model_identity(seed: int, config: dict) -> dict:
    """A model built from a seed: the seed and its architecture are all there is to name."""
    return {"kind": "random", "seed": seed, "config_hash": config_hash(config)}


def hf_model_identity(folder: str, config, *, asset: Optional[str] = None) -> dict:
    """A Hugging Face model loaded from `folder` (config: its transformers config), and, for a
    fetched asset, the exact files it was built from."""
    identity = {
        "kind": "hf",
        "path": folder,
        "name_or_path": getattr(config, "_name_or_path", folder),
        "architecture": (config.architectures or ["?"])[0],
        "config_hash": config_hash(config.to_dict()),
    }
    if asset:
        identity["asset"] = asset
        identity.update(asset_provenance(folder))
    return identity
