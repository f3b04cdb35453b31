"""`domino-graft inspect`: what a bundle or a checkpoint folder holds, and which serving
engines would load it.

Works on this project's bundles (family from manifest.json, every sha256 verified) and on
third-party checkpoints, which each registered family may recognise (its `engines.describe`).
Reads config.json and safetensors headers; only a bundle's checksum pass reads the weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..artifacts.bundle import BUNDLE_KIND, bundle_family, verify_bundle
from ..artifacts.files import CheckpointError
from ..registry import families
from .engine_rules import ENGINE_NAMES, Description, EngineReport, check_all, describe, family_module, read_json_object


@dataclass
class Inspection:
    path: Path
    family: str
    description: Description
    checksums: str  # the sha256 status, one line
    reports: dict[str, EngineReport] = field(default_factory=dict)
    recorded: Optional[dict] = None  # the engines entry manifest.json recorded at export

    def format_text(self) -> str:
        d = self.description
        lines = [f"{self.path}: {self.family} drafter, {d.layout}"]
        width = max([len(k) for k, _ in d.facts] + [len("sha256")])
        lines += [f"  {k:<{width}}  {v}" for k, v in d.facts]
        lines.append(f"  {'sha256':<{width}}  {self.checksums}")
        if self.recorded:
            passed = [ENGINE_NAMES[e] for e, r in self.recorded.items() if r.get("passed")]
            lines.append(f"  {'exported':<{width}}  checklists passed then: {', '.join(passed) or 'none'}")
        lines.append("engines:")
        if not self.reports:
            lines.append("  nothing an engine checklist can read in this folder")
        for r in self.reports.values():
            lines.append(f"  {r.summary()}")
            lines += [f"    {p}" for p in r.problems() + r.unchecked()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = self.description
        return {"path": str(self.path), "family": self.family, "layout": d.layout, "facts": dict(d.facts),
                "head": d.head, "sha256": self.checksums, "recorded_engines": self.recorded,
                "engines": {e: r.to_dict() for e, r in self.reports.items()}}


def _target_vocab(target: Optional[str]) -> Optional[int]:
    """The vocabulary size in a target folder's config.json (or a config.json itself)."""
    if target is None:
        return None
    p = Path(target)
    cfg = read_json_object(p / "config.json" if p.is_dir() else p)
    if cfg is None:
        raise ValueError(f"inspect --target: no readable config.json at {str(p)!r}")
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int):
        raise ValueError(f"inspect --target: {str(p)!r} gives no vocab_size")
    return vocab


def _checksums(folder: Path) -> str:
    try:
        manifest, _ = verify_bundle(folder)
    except CheckpointError as e:
        return f"FAILED: {e}"
    return f"ok: {len(manifest.get('tensors') or {})} tensors and {len(manifest.get('files') or {})} files match manifest.json"


def inspect_path(path, *, target: Optional[str] = None) -> Inspection:
    """A bundle or checkpoint folder (or its config.json) -> Inspection; ValueError when no
    registered family recognises it."""
    folder = Path(path)
    if folder.is_file() and folder.name in ("config.json", "manifest.json"):
        folder = folder.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"inspect: {str(folder)!r} is not a folder (give a bundle or checkpoint folder)")
    manifest = read_json_object(folder / "manifest.json")
    vocab = _target_vocab(target)
    if manifest is not None and manifest.get("kind") == BUNDLE_KIND:
        family = bundle_family(manifest, str(folder / "manifest.json"))
        module = family_module(family)
        found = module.describe(folder) if module is not None and hasattr(module, "describe") else None
        if found is None:
            raise ValueError(f"inspect: {folder} is a {family.name} bundle, but that family cannot describe it")
        checksums, recorded = _checksums(folder), manifest.get("engines")
    else:
        hit = describe(folder, families().values())
        if hit is None:
            raise ValueError(f"inspect: no registered drafter family recognises {folder} (families: "
                             f"{', '.join(families())}; `domino-graft families`)")
        family, found = hit
        checksums, recorded = "no manifest.json: not exported by domino-graft, no recorded checksums to verify", None
    if vocab is not None and found.view is not None:
        found.view.target_vocab = vocab
    reports = check_all(family, found.view) if found.view is not None else {}
    return Inspection(folder, family.name, found, checksums, reports, recorded)
