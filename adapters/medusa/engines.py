"""No serving engine runs a Domino head on Medusa-1 heads (domino_graft/export/engine_rules.py): every
engine refuses the family by name, saying why; `inspect` reads FasterDecoding folders."""

from __future__ import annotations

from domino_graft.export.engine_rules import describe_plain, refusals

SGLANG_ALGORITHMS = "EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK, UNO"
REFUSED = {
    "sglang": f"SGLang has no Medusa algorithm (--speculative-algorithm builtins: {SGLANG_ALGORITHMS}; sglang "
              "srt/arg_groups/fields/spec.py)",
    "vllm": "vLLM has no Domino runtime, and its Medusa loader (vllm model_executor/models/medusa.py) reads "
            "blocks.{i}.layers.{l}.* / lm_heads.{i}.*, not FasterDecoding's {i}.{l}.linear.* of drafter/: no vLLM "
            "Medusa layout is written here",
    "hf": "there is no transformers remote code for Medusa-1 drafters; `--format native` writes drafter/ (FasterDecoding) "
          "+ head.safetensors for domino-graft's own decoder",
}

engine_spec = refusals(REFUSED)


def _facts(cfg: dict) -> list[tuple[str, str]]:
    tree = cfg.get("medusa_choices")
    return [("drafter", f"{cfg.get('medusa_num_heads')} heads x {cfg.get('medusa_num_layers')} ResBlock(s), hidden "
                        f"{cfg.get('hidden_size', '?')}, vocab {cfg.get('vocab_size', '?')}"),
            ("base model", str(cfg.get("base_model_name_or_path"))),
            ("tree", f"{len(tree)} nodes (medusa_choices)" if tree else "chain (no medusa_choices)")]


def describe(folder):
    from .model import WEIGHT_FILES

    return describe_plain(folder, family="medusa", layout="FasterDecoding Medusa-1",
                          recognise=lambda cfg: "medusa_num_heads" in cfg, facts=_facts, weights=WEIGHT_FILES)
