"""No serving engine runs a Domino head on PARD drafters (domino_graft/export/engine_rules.py): every
engine refuses the family by name, saying why; `inspect` reads PARD folders."""

from __future__ import annotations

from domino_graft.export.engine_rules import describe_plain, refusals

from ..medusa.engines import SGLANG_ALGORITHMS

REFUSED = {
    "sglang": f"SGLang has no PARD algorithm (--speculative-algorithm builtins: {SGLANG_ALGORITHMS}; sglang "
              "srt/arg_groups/fields/spec.py)",
    "vllm": "vLLM has no Domino runtime; it reads a draft model's `pard_token` for parallel drafting (vllm "
            "v1/worker/gpu/spec_decode/utils.py get_parallel_drafting_token_id), but no vLLM PARD layout is written or "
            "checked here: the native bundle's drafter/ is the plain HF causal LM (with pard_token) to try there, "
            "without the head",
    "hf": "there is no transformers remote code for PARD drafters; `--format native` writes drafter/ (an HF causal LM) "
          "+ head.safetensors for domino-graft's own decoder",
}

engine_spec = refusals(REFUSED)


def _facts(cfg: dict) -> list[tuple[str, str]]:
    return [("drafter", f"{cfg.get('model_type')} causal LM, {cfg.get('num_hidden_layers')} layer(s), hidden "
                        f"{cfg.get('hidden_size')}, vocab {cfg.get('vocab_size')}"),
            ("parallel draft", f"pard_token {cfg.get('pard_token', cfg.get('pard_token_id'))}, "
                               f"{cfg.get('pard_num_slots', '?')} slots")]


def describe(folder):
    return describe_plain(folder, family="pard", layout="PARD (HF causal LM with pard_token)",
                          recognise=lambda cfg: "pard_token" in cfg or "pard_token_id" in cfg, facts=_facts,
                          weights=("model.safetensors",))
