"""PARD (AMD): a small causal LM that drafts k tokens in one forward.

Facts of the family (docs/design.md §3), kept in this module (the config, the modules, the weights'
files); adapter.py attaches them to a target:

* The drafter is an ordinary Hugging Face causal LM with its own embedding and LM head;
  its config.json carries `pard_token` (the id vLLM and the PARD repo read).
* Drafting input: verified context, x_0, then pard_token × (k-1), causal attention. The
  position of x_0 predicts x_1, the i-th pard token predicts x_{1+i}: slot j's hidden is
  the drafter's last (post-norm) hidden state at block position j-1, base logits its LM
  head. K = num_slots = k.
* The GRU reads the *drafter's* input embeddings (HeadSpec.emb_dim = its embedding dim,
  which need not be the target's hidden size).
* A tied LM head is untied at build time (bit-identical until trained): training
  checkpoints and safetensors keep one name per tensor, and the run's config says
  tie_word_embeddings = false, so transformers and vLLM read both tensors back.
* The drafter needs token ids, not target features: capture_layers() is empty and
  `observe(..., ids=...)` is required. Its KV cache holds verified context only: the k
  block positions are cropped right after each propose, so a rejection needs no rollback.
* Training (the PARD objective): for each anchor a (the position of x_0), k-1 pard tokens
  at positions a+1..a+k-1 that see the sequence up to a and the earlier pard tokens of
  their own block; slot j predicts x_{a+j}. All anchors of a batch run in one forward with
  a 4D mask. The base-logit CE of the Domino curriculum is PARD's loss
  (`TrainingBlocks.extra_loss` stays None).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch
from torch import nn

from ..base import placeholder_token_problems, read_config_json

CONFIG_TOKEN_KEYS = ("pard_token", "pard_token_id")
SLOTS_KEY = "pard_num_slots"  # k this drafter (and its Domino head) was trained for


# ---------------------------------------------------------------------------- configs
def _hf_config_from_dict(cfg: dict, source: str):
    from transformers import CONFIG_MAPPING

    cfg = dict(cfg)
    model_type = cfg.pop("model_type", None)
    if model_type not in CONFIG_MAPPING:
        raise ValueError(
            f"{source}: model_type {model_type!r} is not a transformers architecture; "
            "PARD drafters are plain Hugging Face causal LMs (llama, qwen2, qwen3, ...)"
        )
    return CONFIG_MAPPING[model_type].from_dict(cfg)


def _config_from_target_shape(tshape, num_layers: int):
    """The target's architecture at `num_layers` layers, rebuilt from its shape (planning)."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    by_class = {v: k for k, v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()}
    model_type = by_class.get(tshape.architecture, tshape.architecture)
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"target architecture {tshape.architecture!r} is unknown to transformers; give drafter.path")
    return CONFIG_MAPPING[model_type](
        vocab_size=tshape.vocab_size, hidden_size=tshape.hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=tshape.num_heads, num_key_value_heads=tshape.num_kv_heads, head_dim=tshape.head_dim,
        intermediate_size=tshape.intermediate_size, tie_word_embeddings=tshape.tie_word_embeddings,
    )


def _cut_config(cfg, num_layers: int):
    """A copy of an HF config with its first `num_layers` decoder layers."""
    cfg = copy.deepcopy(cfg)
    have = cfg.num_hidden_layers
    if num_layers > have:
        raise ValueError(f"drafter.num_layers: {num_layers} is more than the target's {have} layers; valid: 1..{have}")
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types)[:num_layers]
    return cfg


def resolve(d, tshape, target_config=None):
    """-> (HF config of the drafter, pard token id, k, how it starts). `target_config` (the
    loaded target's HF config) makes the copy-of-the-target start exact; planning passes
    None and rebuilds the architecture from the target's shape."""
    problems = []
    if d.path is not None:
        raw = read_config_json(d.path, "drafter.path", "; PARD needs a Hugging Face causal-LM folder")
        cfg = _hf_config_from_dict(raw, "drafter.path")
        start = f"checkpoint {d.path}"
        theirs = next((raw[k] for k in CONFIG_TOKEN_KEYS if raw.get(k) is not None), None)
        if d.pard_token_id is not None and theirs is not None and d.pard_token_id != theirs:
            problems.append(f"drafter.pard_token_id: {d.pard_token_id} conflicts with the checkpoint's pard_token {theirs}")
        # (a run dir reloads its drafter with `path` added to the recipe it was built from)
        if d.random is not None:
            for name, ours, saved in (("num_layers", d.random.num_layers, cfg.num_hidden_layers),
                                      ("hidden_size", d.random.hidden_size, cfg.hidden_size)):
                if ours != saved:
                    problems.append(f"drafter.random.{name}: {ours} conflicts with the checkpoint's {saved}")
        elif "num_layers" in d.model_fields_set and d.num_layers != cfg.num_hidden_layers:
            problems.append(f"drafter.num_layers: {d.num_layers} conflicts with the checkpoint's {cfg.num_hidden_layers} "
                            "(remove it from the recipe to use the checkpoint's)")
        token = d.pard_token_id if d.pard_token_id is not None else theirs
        k = raw.get(SLOTS_KEY)
        if k is not None and "num_slots" in d.model_fields_set and d.num_slots != k:
            problems.append(f"drafter.num_slots: {d.num_slots} conflicts with the checkpoint's {SLOTS_KEY} {k} "
                            "(remove it from the recipe to use the checkpoint's)")
        num_slots = int(k) if k is not None and "num_slots" not in d.model_fields_set else d.num_slots
    elif d.random is not None:
        from domino_graft.target import random_hf_config

        cfg = random_hf_config(d.random)
        start = f"random {d.random.architecture} (seed {d.random.seed})"
        token, num_slots = d.pard_token_id, d.num_slots
    else:
        cfg = _cut_config(target_config, d.num_layers) if target_config is not None else \
            _config_from_target_shape(tshape, d.num_layers)
        if d.num_layers > tshape.num_layers:
            problems.append(f"drafter.num_layers: {d.num_layers} is more than the target's {tshape.num_layers} layers")
        start = f"copy of the target's first {d.num_layers} layer(s)"
        token, num_slots = d.pard_token_id, d.num_slots
    # A drafter may pad its vocabulary differently from its target (PARD-Qwen2.5-0.5B: 151936
    # rows, Qwen2.5-7B: 152064; both tokenizers have 151665 tokens): base_logits() maps its
    # logits onto the target's rows. Its real tokens must be the target's.
    vocab = cfg.get_text_config().vocab_size
    if token is None:
        token = vocab - 1  # like DFlash's mask default: the last row, unused by most tokenizers
    problems += placeholder_token_problems("pard_token_id", token, vocab, tshape.eos_token_ids, vocab_name="drafter")
    if num_slots < 2:
        problems.append(f"drafter.num_slots: {num_slots} (the checkpoint's {SLOTS_KEY}) is invalid; valid: >= 2")
    if problems:
        raise ValueError("\n".join(problems))
    return cfg, int(token), num_slots, start


def tensor_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Tensors of the drafter as a run holds it (untied), from its config alone (meta device)."""
    model = untie(_meta_model(copy.deepcopy(cfg)))
    skip = tied_aliases(model)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in skip}


def _meta_model(cfg):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def untie(model: nn.Module) -> nn.Module:
    """Give a tied LM head its own copy of the embedding (bit-identical until trained).

    Trainers, checkpoints and safetensors all handle one name per tensor; a tied pair would
    need alias bookkeeping at every save and load. The untied drafter drafts exactly as the
    tied one did, and its config says so (tie_word_embeddings = false), so every loader
    (transformers, vLLM) reads both tensors back."""
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out_emb is not None and out_emb.weight is in_emb.weight:
        out_emb.weight = nn.Parameter(in_emb.weight.detach().clone())
    for c in {id(model.config): model.config, id(model.config.get_text_config()): model.config.get_text_config()}.values():
        c.tie_word_embeddings = False
    return model


def tied_aliases(model: nn.Module) -> set[str]:
    """Parameter names that are a second name for another parameter (a tied LM head)."""
    every = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    return every - {n for n, _ in model.named_parameters()}


def load_folder_state(folder: Path) -> tuple[dict, str]:
    from domino_graft.artifacts.tensors import load_tensors

    single = folder / "model.safetensors"
    if single.is_file():
        return load_tensors(single), str(single)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict = {}
        for s in shards:
            state.update(load_tensors(folder / s))
        return state, str(index)
    raise FileNotFoundError(f"drafter.path: {str(folder)!r} holds no model.safetensors (or .index.json)")


def backbone_num_parameters(cfg) -> int:
    return sum(math.prod(s) for s in tensor_shapes(cfg).values())
