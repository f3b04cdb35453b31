"""Engine checklists: a bundle checked against a serving engine's own loader rules.

`export --engine E` picks the format engine E reads and runs E's checklist on the bundle
in its temporary folder, before the atomic rename. A broken rule fails the export with
one line per rule: the field, its bad value, the engine's requirement and the engine
source the rule was read from; nothing is written. Every export records every engine's
result in manifest.json (`engines`), and `domino-graft inspect` runs them on any folder.

The rules are family facts, so they live in the family's package: the module
`<package of the Family>.engines` exposes `engine_spec(engine) -> EngineSpec` and
`describe(folder) -> Optional[Description]`. A family without one is refused by every
engine, by name. Checks read config.json and safetensors headers only (no weights).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..artifacts.bundle import read_header
from ..artifacts.files import CheckpointError, parse_json_file, read_json
from ..artifacts.tensors import SAFETENSORS_DTYPES
from ..recipe import RecipeError

ENGINES = ("sglang", "vllm", "hf")
ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "hf": "transformers"}


class Unknown(Exception):
    """A rule the folder cannot decide (e.g. it needs the target's vocabulary size)."""


class EngineCheckError(RecipeError):
    """A bundle breaks engine rules: a header line and one line per broken rule."""


@dataclass
class CheckpointView:
    """What a checklist reads: config.json and the tensors' names, shapes and dtypes."""

    path: Optional[Path]
    config: dict
    tensors: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, "bf16" | "fp16" | "fp32" | ...)
    files: frozenset[str] = frozenset()
    target_vocab: Optional[int] = None  # the target's vocabulary size, where known

    @classmethod
    def read(cls, folder, *, weights: Optional[list[str]] = None, target_vocab: Optional[int] = None,
             config: str = "config.json") -> "CheckpointView":
        """A folder's config and the headers of `weights` (default: its top-level *.safetensors)."""
        folder = Path(folder)
        cfg = read_json(folder / config, missing="file not found; not a checkpoint folder")
        names = weights if weights is not None else sorted(p.name for p in folder.glob("*.safetensors"))
        tensors = {}
        for w in names:
            for name, h in read_header(folder / w).items():
                tensors[name] = (h.shape, SAFETENSORS_DTYPES.get(h.dtype, h.dtype.lower()))
        files = frozenset(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        return cls(folder, cfg, tensors, files, target_vocab)

    def shape(self, name: str) -> Optional[tuple[int, ...]]:
        return self.tensors[name][0] if name in self.tensors else None


@dataclass(frozen=True)
class Rule:
    """One loader rule: `check(view)` returns the bad value as text, None when the rule is
    met, or raises Unknown when the folder cannot tell."""

    field: str
    requirement: str
    source: str  # the engine file (and function) the rule was read from
    check: Callable[[CheckpointView], Optional[str]]


@dataclass(frozen=True)
class EngineSpec:
    """What an engine reads of one family: the export format, the rules, or a refusal."""

    engine: str
    format: Optional[str] = None  # the export format written for this engine
    rules: tuple[Rule, ...] = ()
    refused: Optional[str] = None  # why this engine cannot serve the family at all
    head_in_bundle: bool = True  # False: the format drops the Domino head (the engine cannot run it)
    # (manifest, bundle path, target reference) -> the lines printed after an export
    serve: Optional[Callable[[dict, str, str], list[str]]] = None


@dataclass
class EngineReport:
    engine: str
    family: str
    refused: Optional[str] = None
    results: list[tuple[Rule, Optional[str], Optional[str]]] = field(default_factory=list)  # (rule, bad, unknown)

    @property
    def passed(self) -> bool:
        return self.refused is None and not any(bad for _, bad, _ in self.results)

    def problems(self) -> list[str]:
        name = ENGINE_NAMES[self.engine]
        if self.refused:
            return [self.refused]
        return [f"{r.field}: {bad}; {name} requires {r.requirement} [{r.source}]" for r, bad, _ in self.results if bad]

    def unchecked(self) -> list[str]:
        return [f"{r.field}: not checked ({why})" for r, _, why in self.results if why]

    def summary(self) -> str:
        name = ENGINE_NAMES[self.engine]
        if self.refused:
            return f"{name}: refused"
        n, bad, unknown = len(self.results), len(self.problems()), len(self.unchecked())
        verdict = "passes" if not bad else f"fails {bad} of"
        return f"{name}: {verdict} {n} rules" + (f" ({unknown} not checked)" if unknown else "")

    def to_dict(self) -> dict:
        if self.refused:
            return {"passed": False, "refused": self.refused}
        return {"passed": self.passed, "rules": len(self.results), "failed": self.problems(),
                "not_checked": self.unchecked()}


# ------------------------------------------------------------------- the family's module
def family_module(family):
    """The family's engines module, or None when it has none."""
    name = getattr(family, "engines_module", None) or f"{type(family).__module__}.engines"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise  # the module exists but imports something missing: a real error
        return None


def engine_spec(family, engine: str) -> EngineSpec:
    if engine not in ENGINES:
        raise ValueError(f"export.engine: {engine!r} is not valid; valid: {', '.join(ENGINES)}")
    module = family_module(family)
    spec = module.engine_spec(engine) if module is not None else None
    if spec is None:
        return EngineSpec(engine, refused=f"the {family.name} family declares no {ENGINE_NAMES[engine]} loader "
                                          f"rules (no {type(family).__module__}.engines module, or no entry there)")
    return spec


def refusals(reasons: dict[str, str]) -> Callable[[str], Optional[EngineSpec]]:
    """The `engine_spec` of a family that every engine in `reasons` refuses, each for its reason."""
    return lambda engine: EngineSpec(engine, refused=reasons[engine]) if engine in reasons else None


def check(family, engine: str, view: CheckpointView) -> EngineReport:
    spec = engine_spec(family, engine)
    report = EngineReport(engine, family.name, refused=spec.refused)
    if spec.refused:
        return report
    for rule in spec.rules:
        try:
            report.results.append((rule, rule.check(view), None))
        except Unknown as e:
            report.results.append((rule, None, str(e)))
    return report


def check_all(family, view: CheckpointView) -> dict[str, EngineReport]:
    return {engine: check(family, engine, view) for engine in ENGINES}


def require(report: EngineReport, *, what: str) -> None:
    """Raise EngineCheckError listing every broken rule of `report`."""
    if report.passed:
        return
    name = ENGINE_NAMES[report.engine]
    raise EngineCheckError(f"export --engine {report.engine}: {what} breaks {name}'s loader rules; nothing written",
                           report.problems())


# ------------------------------------------------------------------ reading a checkpoint
@dataclass
class Description:
    """A family's reading of a folder: what `inspect` prints, and what its checklists check."""

    family: str
    layout: str  # e.g. "native bundle", a third-party layout's name
    facts: list[tuple[str, str]]  # ordered (label, value)
    head: Optional[dict]  # the Domino head it declares (G, r, pure prefix, tensor shapes), or None
    view: Optional[CheckpointView]  # what the engine rules read (None: nothing they can read)


def describe(folder, families) -> Optional[tuple[object, Description]]:
    """The first family that recognises `folder`, with its description."""
    for family in families:
        module = family_module(family)
        found = module.describe(Path(folder)) if module is not None and hasattr(module, "describe") else None
        if found is not None:
            return family, found
    return None


def read_json_object(path: Path) -> Optional[dict]:
    """A JSON object file, or None when it is missing or not one (recognising a folder). A file
    no config can be (too big, nested too deeply, a symlink loop) is refused by name instead:
    "no family recognises it" would hide the reason."""
    path = Path(path)
    if not path.is_file() and not path.is_symlink():
        return None
    try:
        return parse_json_file(path)
    except CheckpointError as e:
        if "not valid JSON (" in str(e) or "expected a JSON object" in str(e):
            return None
        raise


def tensors_fact(view: CheckpointView, files: list[str]) -> str:
    """'N in FILES, P parameters, dtype D' for inspect."""
    import math

    if not view.tensors:
        return f"none read ({', '.join(files) or 'no weights file'}; only safetensors headers are read)"
    params = sum(math.prod(s) for s, _ in view.tensors.values())
    dtypes = "/".join(sorted({d for _, d in view.tensors.values()}))
    return f"{len(view.tensors)} in {', '.join(files)}, {params:,} parameters, dtype {dtypes}"


def describe_plain(folder: Path, *, family: str, layout: str, recognise: Callable[[dict], bool],
                   facts: Callable[[dict], list[tuple[str, str]]], weights: tuple[str, ...]) -> Optional[Description]:
    """A family whose own checkpoint is a plain folder (config.json + weights) and whose bundles
    are that folder under drafter/ beside head.safetensors (the default layout of
    adapters/family.py): its description, or None when `recognise(config)` says it is not one."""
    import math

    from ..head import HEAD_TENSOR_NAMES  # torch

    manifest = read_json_object(folder / "manifest.json")
    bundle = manifest is not None and (folder / "drafter" / "config.json").is_file()
    root = folder / "drafter" if bundle else folder
    cfg = read_json_object(root / "config.json")
    if cfg is None or not recognise(cfg):
        return None
    found = [w for w in weights if (root / w).is_file()]
    view = CheckpointView.read(root, weights=[w for w in found if w.endswith(".safetensors")][:1])
    rows = facts(cfg)
    rows.append(("tensors", tensors_fact(view, found)))
    head = None
    if bundle and (folder / "head.safetensors").is_file():
        shapes = {n: list(h.shape) for n, h in read_header(folder / "head.safetensors").items()}
        h = (manifest or {}).get("head") or {}
        head = {"gru_hidden_dim": h.get("gru_hidden_dim"), "rank": h.get("rank"),
                "pure_prefix_len": h.get("pure_prefix_len"), "tensors": shapes}
        complete = set(HEAD_TENSOR_NAMES) <= set(shapes)
        rows.append(("head", f"GRU {head['gru_hidden_dim']}, rank {head['rank']}, pure prefix "
                             f"{head['pure_prefix_len']}: {sum(math.prod(s) for s in shapes.values()):,} parameters "
                             f"in head.safetensors" + ("" if complete else " (tensors missing)")))
    else:
        rows.append(("head", "none (this format has no place for a Domino head)"))
    if bundle:
        layout = f"domino-graft bundle, format {manifest.get('format')!r}: drafter/ + head.safetensors"
    return Description(family, layout, rows, head, view)
