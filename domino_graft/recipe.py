"""The recipe schema: one strict, typed description of a graft.

This module must not import torch: `domino-graft validate` runs on machines (and in
CI steps) where loading torch is slow or impossible.

Conventions fixed here:
* layer ids are 0-based decoder-layer *outputs*; -1 means the final post-norm state;
* relative paths resolve against the recipe file's folder;
* unknown keys are errors, and every problem is reported at once, one line each,
  as `dotted.path: bad value -> what would be valid`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model, model_validator

from .registry import families, family_names
from .schema import DTYPES, Dtype, RandomModel, Strict, path_fields  # noqa: F401  (re-exported)


class RecipeError(ValueError):
    """A recipe (or override) failed validation; `problems` holds one line per issue."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(f"  {p}" for p in problems))


# ----------------------------------------------------------------------------- target
class Target(Strict):
    """The model whose output speculative decoding must reproduce exactly."""

    path: Optional[str] = None  # a Hugging Face causal-LM folder
    asset: Optional[str] = None  # a name `domino-graft fetch` knows (resolved in its cache)
    random: Optional[RandomModel] = None
    config: Optional[str] = None  # a config.json used for planning when weights are absent
    gguf_file: Optional[str] = None  # load this GGUF inside `path` (dequantised)
    dtype: Dtype = "fp32"
    chat: bool = True  # apply the target's chat template to prompts

    _resolve_paths = path_fields("path", "config")

    @model_validator(mode="after")
    def _exactly_one_source(self):
        given = [k for k in ("path", "asset", "random") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of path, asset, random (got {', '.join(given) or 'none'})")
        return self


# ---------------------------------------------------------------------------- drafters
# The `drafter:` section belongs to its family (adapters/<family>/schema.py, or an installed
# family package): the schema below is assembled from the registry, discriminated by `family`.


# -------------------------------------------------------------------------------- head
class Head(Strict):
    gru_hidden_dim: int = Field(1024, ge=1)
    rank: int = Field(256, ge=1)
    # Slots 1..pure_prefix_len keep the plain base proposal (Domino checkpoints: 1).
    pure_prefix_len: int = Field(1, ge=0)
    # W2 starts at zero so the fresh graft reproduces the base drafter bit for bit.
    zero_init_w2: bool = True
    seed: int = 0


# ------------------------------------------------------------------------------- train
class Data(Strict):
    # Exactly one source at train time. No silent default: a real recipe that forgot its data
    # must fail, not train on a toy task.
    path: Optional[str] = None  # jsonl / parquet / a saved datasets folder
    synthetic: Optional[Literal["copy", "arith"]] = None  # learnable toy tasks for tests
    max_length: int = Field(256, ge=8)
    num_samples: Optional[int] = Field(None, ge=1)

    _resolve_paths = path_fields("path")

    @model_validator(mode="after")
    def _one_source(self):
        if self.path is not None and self.synthetic is not None:
            raise ValueError(
                f"give one of train.data.path ({self.path!r}) or train.data.synthetic "
                f"({self.synthetic!r}), not both; set the other to null"
            )
        return self


class Train(Strict):
    max_steps: int = Field(100, ge=1)
    # sequences per optimizer step over all ranks and micro-steps (so a run's numbers do not
    # depend on the GPU count); must divide by grad_accum × world size
    batch_size: int = Field(4, ge=1)
    grad_accum: int = Field(1, ge=1)
    lr: float = Field(3e-4, gt=0)
    head_lr: Optional[float] = Field(None, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    # base-anchored curriculum: loss = (1-λ)·CE(final) + λ·CE(base), λ linear lambda_start -> 0
    lambda_start: float = Field(1.0, ge=0, le=1)
    decay_ratio: float = Field(1.0, gt=0, le=1)
    gamma: float = Field(7.0, gt=0)  # per-slot weight exp(-(k-1)/γ)
    anchors_per_seq: int = Field(16, ge=1)
    backbone: Literal["frozen", "full", "lora"] = "full"
    backbone_only_steps: int = Field(0, ge=0)  # warm-up: train only the backbone
    lora_rank: int = Field(16, ge=1)
    lora_alpha: float = Field(32.0, gt=0)  # LoRA scaling = lora_alpha / lora_rank
    loss_chunk: int = Field(1024, ge=1)  # rows of [blocks·K, V] logits at a time
    lr_schedule: Literal["constant", "linear", "cosine"] = "cosine"  # after warmup_steps, towards 0
    max_grad_norm: float = Field(1.0, ge=0)  # 0 disables clipping
    # online: target forward inside each step; offline: cache the target's captured features on
    # disk once (RUN/features/), then train without the target's decoder layers.
    features: Literal["online", "offline"] = "online"
    save_every: int = Field(0, ge=0)  # 0: checkpoint only at the end
    keep_last: int = Field(2, ge=1)
    seed: int = 0
    data: Data = Data()

    @model_validator(mode="after")
    def _warmup_needs_backbone(self):
        if self.backbone_only_steps and self.backbone == "frozen":
            raise ValueError(
                f"train.backbone_only_steps={self.backbone_only_steps} trains only the backbone, but "
                "train.backbone is 'frozen': nothing would train; valid: train.backbone full or lora, "
                "or train.backbone_only_steps=0"
            )
        return self


class Export(Strict):
    format: Literal["native", "hf"] = "native"
    dtype: Dtype = "bf16"


class Bench(Strict):
    prompts: Optional[str] = None
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(0.0, ge=0)
    seed: int = 0
    # Domino-head rollout implementation (domino_graft.kernels.make_rollout): "torch" is the
    # eager reference; "triton" fuses W2-GEMV + base add + argmax over the full vocabulary
    # (exact); "triton_pool" scores only the top-`pool_size` base candidates (draft may
    # change, verification stays exact, so decoding stays lossless). Non-CUDA devices fall
    # back to "torch".
    head_kernel: Literal["torch", "triton", "triton_pool"] = "torch"
    pool_size: int = Field(2048, ge=0)  # 0 = full vocabulary; 2048 = SGLang's merged default
    # triton_pool's candidates (kernels.KernelConfig.pool_select): "topk" = the exact top-k;
    # "bucket" = the max of each of pool_size contiguous vocabulary buckets (one launch,
    # approximate; not faster end to end on the H200, see bench/results/head_latency_h200.json);
    # "radix" = a Triton radix select (exact top-k on bf16/fp16 logits, lowest ids on boundary ties)
    pool_select: Literal["topk", "bucket", "radix"] = "topk"

    _resolve_paths = path_fields("prompts")


class Recipe(Strict):
    """A parsed recipe. `drafter` is the family's own section (validated by recipe_model(),
    which is this class with the registry's union of drafter sections in place of BaseModel)."""

    name: Optional[str] = None
    target: Target
    drafter: BaseModel
    head: Head = Head()
    train: Train = Train()
    export: Export = Export()
    bench: Bench = Bench()
    device: Literal["auto", "cpu", "cuda"] = "auto"


@functools.lru_cache(maxsize=None)
def _recipe_model(names: tuple[str, ...]) -> type[Recipe]:
    sections = tuple(families()[n].schema for n in names)
    drafter = Annotated[Union[sections], Field(discriminator="family")] if len(sections) > 1 else sections[0]
    return create_model("Recipe", __base__=Recipe, drafter=(drafter, ...))


def recipe_model() -> type[Recipe]:
    """The recipe schema with every registered family's drafter section."""
    return _recipe_model(family_names())


# --------------------------------------------------------------------------- loading


def _format_error(err: dict, data: Any) -> str:
    loc = [str(p) for p in err["loc"]]
    # Tagged unions put the tag into the path (drafter.<family>.x): drop it.
    if len(loc) >= 2 and loc[0] == "drafter" and loc[1] in family_names():
        loc = [loc[0]] + loc[2:]
    path = ".".join(loc) or "<recipe>"
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        valid = _valid_keys(loc[:-1], data)
        return f"{path}: unknown key (value {value!r}); valid keys here: {', '.join(valid)}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tag_path = f"{path}.family" if not path.endswith("family") else path
        got = ctx.get("tag", value.get("family") if isinstance(value, dict) else value)
        return f"{tag_path}: {got!r} is not a drafter family; valid: {', '.join(family_names())}"
    if kind == "literal_error":
        return f"{path}: {value!r} is not valid; valid: {ctx.get('expected')}"
    if kind == "missing":
        return f"{path}: required field is missing"
    shown = value if not isinstance(value, dict) else "{...}"
    return f"{path}: {shown!r} is invalid: {err['msg']}"


def _valid_keys(loc: list[str], data: Any) -> list[str]:
    model: Any = Recipe
    for part in loc:
        if part == "drafter":
            section = data.get("drafter") if isinstance(data, dict) else None
            fam = section.get("family") if isinstance(section, dict) else None
            known = families()
            model = known[fam].schema if fam in known else next(iter(known.values())).schema
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        for cand in getattr(ann, "__args__", (ann,)):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                model = cand
                break
    return sorted(getattr(model, "model_fields", {}))


def parse_recipe(data: Any, *, source: str = "<recipe>", base_dir: Optional[str] = None) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(source, [f"<recipe>: expected a mapping at the top level, got {type(data).__name__}"])
    try:
        return recipe_model().model_validate(data, context={"base_dir": base_dir})
    except ValidationError as e:
        raise RecipeError(source, [_format_error(err, data) for err in e.errors()]) from None


def shipped_recipes() -> dict[str, Path]:
    """name -> path of every recipe shipped with the package."""
    from .schema import shipped_recipes_dir

    return {p.stem: p for p in sorted(shipped_recipes_dir().glob("*.yaml"))}


def find_recipe(name_or_path: str | os.PathLike) -> Path:
    """A recipe file: the path given, or a shipped recipe's name (`tiny_dflash`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = shipped_recipes()
    name = path.name.removesuffix(".yaml").removesuffix(".yml")
    if str(name_or_path) in (name, f"{name}.yaml", f"recipes/{name}.yaml") and name in shipped:
        return shipped[name]
    raise RecipeError(str(path), [f"<file>: {str(path)!r} is neither a file nor a shipped recipe; shipped: "
                                  f"{', '.join(shipped)} (`domino-graft recipes` lists them)"])


def load_recipe_text(path: str | os.PathLike) -> tuple[str, dict]:
    path = find_recipe(path)
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RecipeError(str(path), [f"<yaml>: not valid YAML: {e}"]) from None
    return text, data


def load_recipe(path: str | os.PathLike, overrides: list[str] | None = None) -> Recipe:
    path = find_recipe(path)
    text, data = load_recipe_text(path)
    if overrides:
        data = apply_overrides(data, overrides, source=str(path))
    return parse_recipe(data, source=str(path), base_dir=str(Path(path).resolve().parent))


def apply_overrides(data: dict, overrides: list[str], *, source: str = "<overrides>") -> dict:
    """`train.lr=1e-4 head.rank=64` -> a new nested dict; values parsed as YAML scalars."""
    import copy

    data = copy.deepcopy(data)
    problems = []
    for item in overrides:
        if "=" not in item:
            problems.append(f"{item}: override must look like dotted.key=value")
            continue
        key, raw = item.split("=", 1)
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            if node.get(p) is None:
                node[p] = {}
            node = node[p]
            if not isinstance(node, dict):
                problems.append(f"{key}: {p!r} is not a section")
                break
        else:
            node[parts[-1]] = _scalar(raw)
    if problems:
        raise RecipeError(source, problems)
    return data


def _scalar(raw: str) -> Any:
    """A YAML scalar, except that `1e-4` is a float: PyYAML follows YAML 1.1, which reads
    exponent notation without a dot (`1e-4`, `3E5`) as a string."""
    import re

    value = yaml.safe_load(raw)
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value.strip()):
        return float(value)
    return value


def recipe_to_dict(recipe: Recipe) -> dict:
    return recipe.model_dump(mode="json", exclude_none=False)
