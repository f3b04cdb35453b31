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

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

DTYPES = ("fp32", "bf16", "fp16")
Dtype = Literal["fp32", "bf16", "fp16"]


class RecipeError(ValueError):
    """A recipe (or override) failed validation; `problems` holds one line per issue."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(f"  {p}" for p in problems))


def _resolve(value: Optional[str], info: ValidationInfo) -> Optional[str]:
    if value is None:
        return None
    base = (info.context or {}).get("base_dir")
    p = Path(os.path.expanduser(value))
    if not p.is_absolute() and base is not None:
        p = Path(base) / p
    return str(p)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# ----------------------------------------------------------------------------- target
class RandomModel(Strict):
    """A small randomly initialised HF causal LM, built in memory from a seed."""

    architecture: Literal["llama", "qwen3", "gemma3"] = "qwen3"
    vocab_size: int = Field(256, ge=8)
    hidden_size: int = Field(64, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    head_dim: int = Field(16, ge=4)
    intermediate_size: int = Field(128, ge=8)
    tie_word_embeddings: bool = True
    eos_token_id: int = Field(1, ge=0)
    seed: int = 0


class Target(Strict):
    """The model whose output speculative decoding must reproduce exactly."""

    path: Optional[str] = None  # a Hugging Face causal-LM folder
    asset: Optional[str] = None  # a name `domino-graft fetch` knows (resolved in its cache)
    random: Optional[RandomModel] = None
    config: Optional[str] = None  # a config.json used for planning when weights are absent
    gguf_file: Optional[str] = None  # load this GGUF inside `path` (dequantised)
    dtype: Dtype = "fp32"
    chat: bool = True  # apply the target's chat template to prompts

    _resolve_paths = field_validator("path", "config")(_resolve)

    @model_validator(mode="after")
    def _exactly_one_source(self):
        given = [k for k in ("path", "asset", "random") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of path, asset, random (got {', '.join(given) or 'none'})")
        return self


# ---------------------------------------------------------------------------- drafters
class DFlashDrafter(Strict):
    """DFlash block-diffusion drafter (z-lab format), reading target hidden states."""

    family: Literal["dflash"]
    path: Optional[str] = None  # existing z-lab DFlash (or DFlash+Domino) checkpoint folder
    config: Optional[str] = None  # drafter config.json for planning without weights
    block_size: int = Field(16, ge=2)
    num_layers: int = Field(1, ge=1)
    # 0-based decoder-layer outputs of the target; default: spread over the target's depth
    target_layer_ids: Optional[list[int]] = None
    mask_token_id: Optional[int] = Field(None, ge=0)
    # true: block position k predicts x_{a+1+k} (Domino checkpoints); false: position k predicts x_{a+k}
    shift_label: bool = True
    intermediate_size: Optional[int] = Field(None, ge=8)  # default: the target's
    seed: int = 0

    _resolve_paths = field_validator("path", "config")(_resolve)


class MedusaDrafter(Strict):
    """Medusa-1 heads on the frozen target (FasterDecoding layout).

    Head i (0-based) reads the target's final post-norm hidden state of the last verified
    token t and predicts token t+2+i (the target's own LM head gives t+1, the anchor):
    slot j = i+1, K = num_heads."""

    family: Literal["medusa"]
    path: Optional[str] = None  # FasterDecoding folder: config.json + medusa_lm_head.safetensors (or .pt)
    config: Optional[str] = None  # a Medusa config.json, for planning when the weights are not there
    num_heads: int = Field(4, ge=1)
    num_layers: int = Field(1, ge=1)  # ResBlocks per head
    # Static tree in Medusa's "choices" notation: each path lists, per depth, the rank of the
    # chosen token among its parent's (Domino-corrected) top-k, e.g. [[0], [0, 0], [1]].
    # Every prefix of a path must itself be a path. None = chain decoding (top-1 per slot).
    tree: Optional[list[list[int]]] = None
    seed: int = 0

    _resolve_paths = field_validator("path", "config")(_resolve)

    @field_validator("tree")
    @classmethod
    def _tree_is_a_tree(cls, tree, info: ValidationInfo):
        if tree is None:
            return tree
        depth = info.data.get("num_heads", 4)
        problems = []
        if not tree:
            problems.append("tree: [] has no nodes; give at least [[0]] or leave tree out for chain decoding")
        seen = set()
        for n, path in enumerate(tree):
            key = tuple(path)
            if not path:
                problems.append(f"tree[{n}]: [] is empty; every path names at least one rank")
            elif any(r < 0 for r in path):
                problems.append(f"tree[{n}]: {path} has a negative rank; valid ranks are 0, 1, 2, ...")
            elif len(path) > depth:
                problems.append(f"tree[{n}]: {path} is {len(path)} deep; valid: at most num_heads = {depth}")
            elif key in seen:
                problems.append(f"tree[{n}]: {path} appears twice")
            seen.add(key)
        for n, path in enumerate(tree):
            if len(path) > 1 and tuple(path[:-1]) not in seen:
                problems.append(f"tree[{n}]: {path} has no parent {path[:-1]} in the tree; add it")
        if problems:
            raise ValueError("; ".join(problems))
        return tree


class PardDrafter(Strict):
    """PARD: a small causal LM drafting k tokens in one pass, from
    [verified context, x_0, pard_token x (k-1)]; its own embedding and LM head.

    Sources (at most one of path / random): `path`, an HF causal-LM folder (PARD checkpoints
    carry `pard_token` in config.json); `random`, a fresh random LM of its own shape (its
    vocabulary must be the target's); neither: a copy of the target's first `num_layers`
    decoder layers with its embeddings, final norm and LM head (a warm start)."""

    family: Literal["pard"]
    path: Optional[str] = None
    random: Optional[RandomModel] = None
    num_layers: int = Field(2, ge=1)  # only for the copy-of-the-target start
    num_slots: int = Field(8, ge=2)  # k proposals per forward
    # default: the checkpoint's `pard_token`, else the last vocabulary row
    pard_token_id: Optional[int] = Field(None, ge=0)
    seed: int = 0

    _resolve_paths = field_validator("path")(_resolve)

    @model_validator(mode="after")
    def _one_source(self):
        if self.path is not None and self.random is not None:
            raise ValueError("give at most one of path, random (neither = copy the target's first num_layers layers)")
        return self


Drafter = Annotated[Union[DFlashDrafter, MedusaDrafter, PardDrafter], Field(discriminator="family")]
DRAFTER_FAMILIES = ("dflash", "medusa", "pard")


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

    _resolve_paths = field_validator("path")(_resolve)

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

    _resolve_paths = field_validator("prompts")(_resolve)


class Recipe(Strict):
    name: Optional[str] = None
    target: Target
    drafter: Drafter
    head: Head = Head()
    train: Train = Train()
    export: Export = Export()
    bench: Bench = Bench()
    device: Literal["auto", "cpu", "cuda"] = "auto"


# --------------------------------------------------------------------------- loading


def _format_error(err: dict, data: Any) -> str:
    loc = [str(p) for p in err["loc"]]
    # Tagged unions put the tag into the path (drafter.dflash.x): drop it.
    if len(loc) >= 2 and loc[0] == "drafter" and loc[1] in DRAFTER_FAMILIES:
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
        return f"{tag_path}: {got!r} is not a drafter family; valid: {', '.join(DRAFTER_FAMILIES)}"
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
            fam = data.get("drafter", {}).get("family") if isinstance(data, dict) else None
            model = {"dflash": DFlashDrafter, "medusa": MedusaDrafter, "pard": PardDrafter}.get(fam, DFlashDrafter)
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
        return Recipe.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as e:
        raise RecipeError(source, [_format_error(err, data) for err in e.errors()]) from None


def load_recipe_text(path: str | os.PathLike) -> tuple[str, dict]:
    path = Path(path)
    if not path.is_file():
        raise RecipeError(str(path), [f"<file>: {str(path)!r} does not exist or is not a file"])
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RecipeError(str(path), [f"<yaml>: not valid YAML: {e}"]) from None
    return text, data


def load_recipe(path: str | os.PathLike, overrides: list[str] | None = None) -> Recipe:
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
