"""How each engine serves a DFlash bundle (the lines `export` prints and model cards show),
and `inspect`'s reading of a DFlash folder: ours, z-lab's, or a Domino checkpoint.

Flag names are SGLang's own (srt/arg_groups/fields/spec.py: --speculative-algorithm,
--speculative-draft-model-path, --speculative-num-draft-tokens,
--speculative-domino-candidate-pool-size) and vLLM's (config/speculative.py: method
"dflash", num_speculative_tokens, attention_backend).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

HEAD_KEYS = ("projector_type", "gru_hidden_dim", "emb_dim", "pure_draft_prefix_len", "shift_label")


def _block(manifest: dict) -> int:
    return int(manifest["drafter"]["block_size"])


def sglang_lines(manifest: dict, bundle: str, target_ref: str) -> list[str]:
    return [
        "SGLang: Domino is a sub-mode of the DFLASH algorithm, chosen by config.json's "
        "dflash_config.projector_type \"domino\" (there is no DOMINO algorithm):",
        "",
        "```bash",
        "python -m sglang.launch_server \\",
        f"    --model-path {target_ref} --dtype bfloat16 \\",
        "    --speculative-algorithm DFLASH \\",
        f"    --speculative-draft-model-path {bundle} \\",
        f"    --speculative-num-draft-tokens {_block(manifest)} \\",
        "    --speculative-domino-candidate-pool-size 2048",
        "```",
        "",
        "- `--speculative-num-draft-tokens`: the block size (SGLang infers it from config.json when omitted).",
        "- `--speculative-domino-candidate-pool-size`: 2048 is SGLang's default; 0 scores the full vocabulary.",
        "- Greedy only: SGLang's Domino rollout drafts greedily (srt/speculative/domino_utils.py "
        "`domino_greedy_rollout`); send temperature 0. A check refusing temperature > 0 was not found in its source.",
        "- CUDA only, bf16 target and head (`validate_domino_runtime`).",
    ]


def _measured_tau(manifest: dict) -> str:
    taus = [f"`{k}` = {v:.3g}" for b in manifest.get("bench") or [] for k, v in b["values"].items() if k.endswith("tau")]
    return f" (the source run's bench: {', '.join(taus)})" if taus else ""


def head_dropped_lines(manifest: dict) -> list[str]:
    return [
        "**The Domino head was dropped.** vLLM has no Domino runtime (vllm-project/vllm#46707): this bundle is the "
        f"base DFlash drafter alone, so τ in vLLM is the base drafter's, not Domino's{_measured_tau(manifest)}.",
        "The head stays in the native bundle (`domino-graft export RUN --engine sglang`): its four tensors "
        "(prefix_gru.*, embed_proj.*) and the dflash_config keys " + ", ".join(HEAD_KEYS) + " (repeated at the top "
        "level) are where a vLLM Domino runtime would read them.",
    ]


def vllm_lines(manifest: dict, bundle: str, target_ref: str) -> list[str]:
    k = _block(manifest) - 1
    return [
        *head_dropped_lines(manifest),
        "",
        "```bash",
        f"vllm serve {target_ref} \\",
        f"    --speculative-config '{{\"method\": \"dflash\", \"model\": \"{bundle}\", \"num_speculative_tokens\": {k}}}'",
        "```",
        "",
        f"- `num_speculative_tokens`: block_size - 1 = {k} (one bonus token and {k} mask positions per step; vLLM does "
        "not read block_size).",
        "- The draft's attention is non-causal: vLLM needs a backend that supports it, e.g. FLASH_ATTN "
        "(`\"attention_backend\"` in the speculative config).",
    ]


def hf_lines(manifest: dict, bundle: str, target_ref: str) -> list[str]:
    return [
        "transformers (remote code shipped in this folder; the drafter reuses the target's "
        "embeddings and LM head):",
        "",
        "```python",
        "from transformers import AutoModel, AutoModelForCausalLM",
        f"drafter = AutoModel.from_pretrained({bundle!r}, trust_remote_code=True)",
        f"target = AutoModelForCausalLM.from_pretrained({target_ref!r})",
        "# lossless speculative decoding (greedy = target.generate; T > 0 by speculative sampling)",
        "out = drafter.spec_generate(target, input_ids, max_new_tokens=128, temperature=0.0)",
        "```",
        "",
        "For SGLang export `--engine sglang`; for vLLM `--engine vllm` (the base drafter, without the head).",
    ]


# ---------------------------------------------------------------------- inspect
def _layout(cfg: dict, manifest: Optional[dict], head: Optional[dict]) -> str:
    if manifest is not None:
        return f"domino-graft bundle, format {manifest.get('format')!r}"
    if "DominoDraftModel" in (cfg.get("architectures") or []):
        return "DFlash+Domino, transformers remote code"
    if head is not None:
        return "DFlash+Domino native (the SGLang / Huang2020 Domino-checkpoint layout)"
    return "z-lab DFlash (no Domino head)"


def describe(folder: Path):
    """A DFlash folder -> engines.Description, or None when it is not one."""
    from domino_graft.export.engine_rules import CheckpointView, Description, read_json_object, tensors_fact
    from domino_graft.head import HEAD_TENSOR_NAMES

    from .model import ARCHITECTURE, DFlashConfig, domino_head_fields

    cfg = read_json_object(folder / "config.json")
    if cfg is None or not ({ARCHITECTURE, "DominoDraftModel"} & set(cfg.get("architectures") or [])
                           or "dflash_config" in cfg):
        return None
    manifest = read_json_object(folder / "manifest.json")
    target_vocab = ((manifest or {}).get("target") or {}).get("vocab_size")
    weights = [f for f in ("model.safetensors",) if (folder / f).is_file()]
    view = CheckpointView.read(folder, weights=weights, target_vocab=target_vocab)
    facts = [("architectures", f"{cfg.get('architectures')}, model_type {cfg.get('model_type')!r}, "
                               f"torch_dtype {cfg.get('torch_dtype')!r}")]
    try:
        c = DFlashConfig.from_native(cfg)
        facts += [
            ("drafter", f"{c.num_hidden_layers} layer(s), hidden {c.hidden_size}, {c.num_attention_heads} heads "
                        f"({c.num_key_value_heads} kv, head_dim {c.head_dim}), intermediate {c.intermediate_size}, "
                        f"vocab {c.vocab_size}"),
            ("block", f"{c.block_size} ({c.block_size - 1} proposals), shift_label {json.dumps(c.shift_label)}, "
                      f"mask id {c.mask_token_id}"),
            ("target", f"{c.num_target_layers or '?'} layers; captures outputs {c.target_layer_ids}"),
        ]
    except (ValueError, KeyError, TypeError) as e:
        facts.append(("config", f"not a readable DFlash config: {e}"))
    head = None
    try:
        fields = domino_head_fields(cfg, str(folder / "config.json"))
    except ValueError as e:
        facts.append(("head", f"invalid declaration: {e}"))
        fields = {}
    if fields:
        shapes = {n: list(view.shape(n)) if view.shape(n) else None for n in HEAD_TENSOR_NAMES}
        head = {**fields, "tensors": shapes}
        n = sum(math.prod(s) for s in shapes.values() if s)
        facts.append(("head", f"GRU {fields['gru_hidden_dim']}, rank {fields['rank']}, pure prefix "
                              f"{fields['pure_prefix_len']}: {n:,} parameters"
                              + ("" if all(shapes.values()) else " (tensors missing)")))
    elif "head" not in dict(facts):
        facts.append(("head", "none"))
    facts.append(("tensors", tensors_fact(view, weights)))
    return Description("dflash", _layout(cfg, manifest, head), facts, head, view)
