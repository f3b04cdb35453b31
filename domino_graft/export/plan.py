"""What `export` will write, from configs alone: the format and dtype (`--engine` picks the format that
engine reads), the bundle's tensors, shapes and files, and the engine rules run on that plan
(`export --dry-run`; `export --engine` checks it before any weight is loaded)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from ..graft import head_spec_for
from ..registry import get_family
from .engine_rules import ENGINE_NAMES, CheckpointView, check, engine_spec

DTYPES = ("bf16", "fp16", "fp32")


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
    from ..target import TargetShape, target_config_dict  # torch

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
