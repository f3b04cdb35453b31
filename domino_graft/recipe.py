"""The recipe schema: one strict, typed description of a graft.

This module must not import torch: `domino-graft validate` runs on machines (and in
CI steps) where loading torch is slow or impossible.

Conventions fixed here:
* layer ids are 0-based decoder-layer *outputs*; -1 means the final post-norm state;
* relative paths resolve against the recipe file's folder;
* unknown keys are errors, and every problem is reported at once, one line each,
  as `dotted.path: bad value -> what would be valid` (bad values cut to a short repr);
* recipe files are UTF-8 text of at most MAX_RECIPE_BYTES; their YAML may not repeat a key,
  use anchors or aliases (`&a` / `*a`), or nest deeper than MAX_YAML_DEPTH;
* an override's relative path (`target.path=models/x`) resolves against the current directory.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model, field_validator, model_validator

from .registry import broken_plugins, families, family_names
from .schema import (  # noqa: F401  (re-exported)
    DTYPES,
    MAX_VOCAB,
    MAX_WIDTH,
    Dtype,
    RandomModel,
    Strict,
    path_fields,
    seed_field,
)


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
    gru_hidden_dim: int = Field(1024, ge=1, le=MAX_WIDTH)
    rank: int = Field(256, ge=1, le=MAX_WIDTH)
    # Slots 1..pure_prefix_len keep the plain base proposal (Domino checkpoints: 1).
    pure_prefix_len: int = Field(1, ge=0)
    # W2 starts at zero so the fresh graft reproduces the base drafter bit for bit.
    zero_init_w2: bool = True
    seed: int = seed_field()


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
    # 10^8 steps is years of training at any rate a drafter trains; more is a typo
    max_steps: int = Field(100, ge=1, le=100_000_000)
    # sequences per optimizer step over all ranks and micro-steps (so a run's numbers do not
    # depend on the GPU count); must divide by grad_accum × world size
    batch_size: int = Field(4, ge=1, le=65_536)
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
    # frozen with no drafter.path trains a head on a fresh (untrained) drafter: refused unless
    # this says it is meant (a test, an ablation), since a recipe once did it silently
    allow_frozen_fresh: bool = False
    backbone_only_steps: int = Field(0, ge=0)  # warm-up: train only the backbone
    lora_rank: int = Field(16, ge=1)
    lora_alpha: float = Field(32.0, gt=0)  # LoRA scaling = lora_alpha / lora_rank
    loss_chunk: int = Field(1024, ge=1)  # rows of [blocks·K, V] logits at a time
    # recompute each chunk's logits in backward (least memory); false keeps them until backward
    # and skips the recompute: the same numbers, faster, ~2 × blocks·K × V × 4 bytes more memory
    loss_checkpoint: bool = True
    lr_schedule: Literal["constant", "linear", "cosine"] = "cosine"  # after warmup_steps, towards 0
    max_grad_norm: float = Field(1.0, ge=0)  # 0 disables clipping
    # online: target forward inside each step; offline: cache the target's captured features on
    # disk once (RUN/features/), then train without the target's decoder layers.
    features: Literal["online", "offline"] = "online"
    save_every: int = Field(0, ge=0)  # 0: checkpoint only at the end
    keep_last: int = Field(2, ge=1)
    seed: int = seed_field()
    data: Data = Data()

    @model_validator(mode="after")
    def _batch_splits(self):
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size: {self.batch_size} is not a multiple of train.grad_accum {self.grad_accum}; "
                             f"valid: a multiple of grad_accum × the number of GPUs")
        # more anchors than positions only pads with invalid ones, and each one costs a [K, V] block
        if self.anchors_per_seq > self.data.max_length:
            raise ValueError(f"anchors_per_seq: {self.anchors_per_seq} is more than train.data.max_length "
                             f"{self.data.max_length}; valid: 1..{self.data.max_length} (one anchor per position at most)")
        return self

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
    seed: int = seed_field()
    # Domino-head rollout implementation (domino_graft.kernels.make_rollout): "torch" is the
    # eager reference; "triton" fuses W2-GEMV + base add + argmax over the full vocabulary
    # (exact); "triton_pool" scores only the top-`pool_size` base candidates (draft may
    # change, verification stays exact, so decoding stays lossless). Non-CUDA devices fall
    # back to "torch".
    head_kernel: Literal["torch", "triton", "triton_pool"] = "torch"
    pool_size: int = Field(2048, ge=0, le=MAX_VOCAB)  # 0 = full vocabulary; 2048 = SGLang's merged default
    # triton_pool's candidates (kernels.KernelConfig.pool_select): "topk" = the exact top-k;
    # "bucket" = the max of each of pool_size contiguous vocabulary buckets (one launch,
    # approximate; not faster end to end on the H200, see bench/results/head_latency_h200.json);
    # "radix" = a Triton radix select (exact top-k on bf16/fp16 logits, lowest ids on boundary ties);
    # "block_shared" = SGLang's rule: one pool for the whole block, the top-k of each token's max over the
    # corrected slots (bench/export --engine sglang choose it, so their τ is the one SGLang drafts for)
    pool_select: Literal["topk", "bucket", "radix", "block_shared"] = "topk"

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

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v):
        """The name titles the plan, the card and the manifest, and tools make folder names of it."""
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", v) or v and ".." in v:
            raise ValueError(f"{_short(v)} is not a plain name; valid: 1-128 letters, digits, '.', '_', '+', '-' "
                             "(no '/', no '..', no spaces)")
        return v


@functools.lru_cache(maxsize=None)
def _recipe_model(names: tuple[str, ...]) -> type[Recipe]:
    sections = tuple(families()[n].schema for n in names)
    drafter = Annotated[Union[sections], Field(discriminator="family")] if len(sections) > 1 else sections[0]
    return create_model("Recipe", __base__=Recipe, drafter=(drafter, ...))


def recipe_model() -> type[Recipe]:
    """The recipe schema with every registered family's drafter section."""
    return _recipe_model(family_names())


# --------------------------------------------------------------------------- loading
MAX_RECIPE_BYTES = 1 << 20  # a recipe is a few kB; anything near this is not one
MAX_YAML_DEPTH = 32  # nesting levels; recipes use four


class _Refused(Exception):
    """A YAML construct recipes do not accept (alias, anchor, excessive nesting)."""


class _RecipeLoader(yaml.SafeLoader):
    """yaml.SafeLoader without anchors and aliases (`&a` / `*a`: an alias bomb of a few hundred
    bytes expands to gigabytes, and recipes have no use for them) and with a nesting limit
    (deep `[[[[...` would exhaust Python's recursion)."""

    _depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark else "?"
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(f"line {line}: YAML alias *{_short_text(event.anchor)} refused: recipes take no anchors or "
                           "aliases (&name / *name); write the value out in full")
        if getattr(event, "anchor", None) is not None:
            raise _Refused(f"line {line}: YAML anchor &{_short_text(event.anchor)} refused: recipes take no anchors or "
                           "aliases (&name / *name); write the value out in full")
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(f"line {line}: nested more than {MAX_YAML_DEPTH} levels deep; recipes nest a few levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _short_text(s: str, limit: int = 40) -> str:
    return s if len(s) <= limit else s[:limit] + "..."


def _duplicate_keys(node, path: str = "") -> list[str]:
    """Every key given twice in one mapping (YAML would silently keep the last), with both lines."""
    problems = []
    if isinstance(node, yaml.MappingNode):
        first: dict = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            shown = None if name is None else _short_text(name)
            here = f"{path}.{shown}" if path and shown is not None else (shown or path or "<recipe>")
            if name is not None:
                if (key.tag, name) in first:
                    problems.append(f"{here}: duplicate key {_short(name)} at line {key.start_mark.line + 1} "
                                    f"(first given at line {first[(key.tag, name)]}); valid: each key once per section")
                else:
                    first[(key.tag, name)] = key.start_mark.line + 1
            problems += _duplicate_keys(value, here)
    elif isinstance(node, yaml.SequenceNode):
        for n, item in enumerate(node.value):
            problems += _duplicate_keys(item, f"{path}[{n}]")
    return problems


def _yaml_problem(e: Exception) -> str:
    """One line for a YAML error (PyYAML's own message spans lines, with a caret)."""
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "")


def safe_yaml(text: str) -> tuple[Any, list[str]]:
    """Parse YAML the recipe way: -> (data, problems). Problems name the line; anchors, aliases,
    duplicate keys and deep nesting are refused; nothing is expanded before it is refused."""
    loader = _RecipeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except _Refused as e:
            return None, [f"<yaml>: {e}"]
        except RecursionError:
            return None, [f"<yaml>: nested too deeply; recipes nest a few levels"]
        except yaml.YAMLError as e:
            return None, [f"<yaml>: not valid YAML: {_yaml_problem(e)}"]
        if node is None:
            return None, []
        dups = _duplicate_keys(node)
        if dups:
            return None, dups
        try:
            return loader.construct_document(node), []
        except yaml.YAMLError as e:
            return None, [f"<yaml>: not valid YAML: {_yaml_problem(e)}"]
        except (ValueError, TypeError, OverflowError, RecursionError) as e:  # e.g. an integer of 10,000 digits
            return None, [f"<yaml>: a value cannot be read: {_short_text(str(e), 120)}"]
    finally:
        loader.dispose()


def _short(value: Any) -> str:
    from .inputs import short

    return short(value)


def _format_error(err: dict, data: Any) -> list[str]:
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
        return [f"{path}: unknown key (value {_short(value)}); valid keys here: {', '.join(valid)}"]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tag_path = f"{path}.family" if not path.endswith("family") else path
        got = ctx.get("tag", value.get("family") if isinstance(value, dict) else value)
        why = broken_plugins().get(got) if isinstance(got, str) else None
        if why is not None:
            return [f"{tag_path}: {_short(got)} is an installed plug-in that failed to load: {why}"]
        return [f"{tag_path}: {_short(got)} is not a drafter family; valid: {', '.join(family_names())}"]
    if kind == "literal_error":
        return [f"{path}: {_short(value)} is not valid; valid: {ctx.get('expected')}"]
    if kind == "missing":
        return [f"{path}: required field is missing"]
    if kind == "value_error":
        # Validators of a section raise "field: bad value; valid: ..." (several lines for several
        # problems): the line gets the field's full dotted path.
        msg = str(err["msg"]).removeprefix("Value error, ")
        fields = set(_valid_keys(loc, data))
        lines = []
        for line in msg.splitlines() or [msg]:
            head = line.split(":", 1)[0]
            name = head.split("[", 1)[0]
            if ":" in line and name in fields and " " not in head:
                lines.append(f"{path}.{line}" if loc else line)
            else:
                lines.append(f"{path}: {line}")
        return lines
    shown = _short(value) if not isinstance(value, dict) else "{...}"
    if kind in ("less_than_equal", "greater_than_equal", "less_than", "greater_than"):
        return [f"{path}: {shown} is invalid; valid: {_bounds(loc, data) or err['msg']}"]
    return [f"{path}: {shown} is invalid: {err['msg']}"]


def _bounds(loc: list[str], data: Any) -> Optional[str]:
    """A numeric field's range as 'lo..hi', '>= lo' or '> lo' (from its Field(ge=, le=, gt=))."""
    model = _section_model(loc[:-1], data) if loc else None
    field = getattr(model, "model_fields", {}).get(loc[-1]) if loc else None
    if field is None:
        return None
    found = {k: getattr(m, k) for m in field.metadata for k in ("ge", "gt", "le", "lt") if hasattr(m, k)}
    lo = f"{found['ge']:,}" if "ge" in found else None
    hi = f"{found['le']:,}" if "le" in found else None
    if lo is not None and hi is not None:
        return f"{lo}..{hi}"
    parts = [f">= {lo}" if lo else "", f"> {found['gt']:,}" if "gt" in found else "", f"<= {hi}" if hi else "",
             f"< {found['lt']:,}" if "lt" in found else ""]
    return " and ".join(p for p in parts if p) or None


def _section_model(loc: list[str], data: Any):
    """The pydantic model of the section at `loc` (None if there is none)."""
    model: Any = Recipe
    for part in loc:
        if part == "drafter" and model is Recipe:
            section = data.get("drafter") if isinstance(data, dict) else None
            fam = section.get("family") if isinstance(section, dict) else None
            known = families()
            model = known[fam].schema if fam in known else next(iter(known.values())).schema
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        for cand in getattr(ann, "__args__", (ann,)):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                model = cand
                break
        else:
            return None
    return model


def _valid_keys(loc: list[str], data: Any) -> list[str]:
    return sorted(getattr(_section_model(loc, data), "model_fields", {}))


def _is_path_field(loc: list[str], data: Any) -> bool:
    """Whether recipe field `loc` is a path (declared with schema.path_fields)."""
    from .schema import resolve_path

    if not loc:
        return False
    model = _section_model(loc[:-1], data)
    decorators = getattr(model, "__pydantic_decorators__", None)
    if decorators is None:
        return False
    return any(d.func is resolve_path and loc[-1] in d.info.fields for d in decorators.field_validators.values())


def _cross_checks(recipe: Recipe) -> list[str]:
    """Checks across sections that need no target config (the rest are the plan's, graft.plan_graft)."""
    problems = []
    slots_of = getattr(recipe.drafter, "declared_num_slots", None)
    slots = slots_of() if callable(slots_of) else None
    ppl = recipe.head.pure_prefix_len
    if slots is not None and ppl >= slots:
        problems.append(f"head.pure_prefix_len: {ppl} is invalid; valid: 0..{slots - 1} (the drafter makes {slots} "
                        f"proposal(s) per block, and slots 1..pure_prefix_len are left uncorrected)")
    problem = _frozen_fresh_drafter(recipe)
    if problem:
        problems.append(problem)
    return problems


def _frozen_fresh_drafter(recipe: Recipe) -> Optional[str]:
    """A frozen backbone is the cheap port onto a *trained* drafter. Without drafter.path the
    drafter is fresh (random, or target layers never trained to draft), and freezing it trains a
    head on top of a drafter that never learns: a run that looks fine and measures nothing (a
    shipped Qwen3-8B recipe did this, with its drafter.path commented out)."""
    t = recipe.train
    # A family whose section has no `path` has no checkpoint to point at, so nothing to refuse here.
    if t.backbone != "frozen" or t.allow_frozen_fresh or "path" not in type(recipe.drafter).model_fields:
        return None
    if getattr(recipe.drafter, "path", None) is not None:
        return None
    return ("train.backbone: 'frozen' with drafter.path unset trains a head on a fresh, untrained drafter; valid: "
            "set drafter.path to a trained drafter, or train.backbone: full (or lora) to train the drafter too, or "
            "train.allow_frozen_fresh: true to do it on purpose")


def parse_recipe(data: Any, *, source: str = "<recipe>", base_dir: Optional[str] = None) -> Recipe:
    if data is None:  # an empty file: report what is missing, like any other incomplete recipe
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(source, [f"<recipe>: expected a mapping (key: value lines) at the top level, got "
                                   f"{type(data).__name__} {_short(data)}"])
    try:
        recipe = recipe_model().model_validate(data, context={"base_dir": base_dir})
    except ValidationError as e:
        raise RecipeError(source, [line for err in e.errors() for line in _format_error(err, data)]) from None
    problems = _cross_checks(recipe)
    if problems:
        raise RecipeError(source, problems)
    return recipe


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
    raise RecipeError(str(path), [f"<file>: {_short(str(path))} is neither a file nor a shipped recipe; shipped: "
                                  f"{', '.join(shipped)} (`domino-graft recipes` lists them)"])


def load_recipe_text(path: str | os.PathLike) -> tuple[str, dict]:
    """The recipe file's text and its parsed YAML; a file over MAX_RECIPE_BYTES, binary or not
    UTF-8, or YAML that is invalid, aliased or has duplicate keys is a RecipeError naming it."""
    from .inputs import read_text

    path = find_recipe(path)
    try:
        text = read_text(path, "<file>", max_bytes=MAX_RECIPE_BYTES)
    except ValueError as e:
        raise RecipeError(str(path), [str(e).replace(f"<file>: {path}: ", "<file>: ", 1)]) from None
    data, problems = safe_yaml(text)
    if problems:
        raise RecipeError(str(path), problems)
    return text, data


def load_recipe(path: str | os.PathLike, overrides: list[str] | None = None) -> Recipe:
    path = find_recipe(path)
    text, data = load_recipe_text(path)
    if overrides:
        data = apply_overrides({} if data is None else data, overrides, source=str(path))
    return parse_recipe(data, source=str(path), base_dir=str(Path(path).resolve().parent))


OVERRIDE_SYNTAX = ("section.key=VALUE, the value in YAML: head.rank=64, train.lr=1e-4, "
                   "drafter.target_layer_ids=[1,2], target.path=models/x")


def apply_overrides(data: dict, overrides: list[str], *, source: str = "<overrides>") -> dict:
    """`train.lr=1e-4 head.rank=64` -> a new nested dict; values parsed as YAML (scalars or flow
    lists). A relative path given for a path field resolves against the current directory (where
    the user typed it), not the recipe's folder."""
    import copy

    if not isinstance(data, dict):  # parse_recipe reports the top level
        return data
    data = copy.deepcopy(data)
    problems = []
    for item in overrides:
        if "=" not in item:
            problems.append(f"override {_short(item)}: no '='; valid: {OVERRIDE_SYNTAX}")
            continue
        key, raw = item.split("=", 1)
        parts = key.split(".")
        if not key or any(not p or not p.replace("_", "").isalnum() for p in parts):
            problems.append(f"override {_short(item)}: {_short(key)} is not a dotted key; valid: {OVERRIDE_SYNTAX}")
            continue
        try:
            value = _scalar(raw)
        except ValueError as e:
            problems.append(f"override {_short(item)}: the value {_short(raw)} is not valid YAML ({e}); "
                            f"valid: {OVERRIDE_SYNTAX} (quote text with ':' or '#', e.g. name='a: b')")
            continue
        if isinstance(value, str) and _is_path_field(parts, data):
            value = _cwd_path(value)
        node = data
        for depth, p in enumerate(parts[:-1]):
            if node.get(p) is None:
                node[p] = {}
            node = node[p]
            if not isinstance(node, dict):
                where = ".".join(parts[: depth + 1])
                problems.append(f"override {_short(item)}: {where} is {_short(node)}, not a section; valid: "
                                f"{where}=VALUE")
                break
        else:
            node[parts[-1]] = value
    if problems:
        raise RecipeError(source, problems)
    return data


def _cwd_path(value: str) -> str:
    """An override's relative path, against the current directory (a shipped config such as
    configs/qwen3-8b.json, found there only, is left for the schema to resolve)."""
    from .schema import shipped_recipes_dir

    p = Path(os.path.expanduser(value))
    if p.is_absolute() or not value:
        return str(p) if value else value
    here = Path.cwd() / p
    if not here.exists() and (shipped_recipes_dir() / p).exists():
        return value
    return str(here)


def _scalar(raw: str) -> Any:
    """An override value as YAML, except that `1e-4` is a float: PyYAML follows YAML 1.1, which reads
    exponent notation without a dot (`1e-4`, `3E5`) as a string. Raises ValueError with one line."""
    import re

    value, problems = safe_yaml(raw)
    if problems:
        raise ValueError(problems[0].removeprefix("<yaml>: ").removeprefix("not valid YAML: "))
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value.strip()):
        return float(value)
    return value


def recipe_to_dict(recipe: Recipe) -> dict:
    return recipe.model_dump(mode="json", exclude_none=False)
