"""No serving engine runs a Domino head on P-EAGLE drafters (domino_graft/export/engine_rules.py): every engine
refuses the family by name, saying why; `inspect` reads speculators P-EAGLE folders and bundles."""

from __future__ import annotations

from domino_graft.export.engine_rules import describe_plain, refusals

from ..medusa.engines import SGLANG_ALGORITHMS

REFUSED = {
    "sglang": f"SGLang has no P-EAGLE algorithm (--speculative-algorithm builtins: {SGLANG_ALGORITHMS}; sglang "
              "srt/arg_groups/fields/spec.py)",
    "vllm": "vLLM 0.33 serves P-EAGLE but has no Domino runtime (RFC vllm-project/vllm#46707); the native bundle's "
            "drafter/ is a speculators 0.9.0 `peagle` checkpoint that vLLM's P-EAGLE loader loads as the base "
            "drafter, without the head (its d2t/t2d are stored as speculators writes them, int64/bool, in any export "
            "dtype; docs/peagle.md)",
    "hf": "there is no transformers remote code for P-EAGLE drafters; `--format native` writes drafter/ (a speculators "
          "P-EAGLE checkpoint) + head.safetensors for domino-graft's own decoder",
}

engine_spec = refusals(REFUSED)


def _facts(cfg: dict) -> list[tuple[str, str]]:
    layer = cfg.get("transformer_layer_config") or {}
    spec = cfg.get("speculators_config") or {}
    k = next((m.get("speculative_tokens") for m in spec.get("proposal_methods") or [] if isinstance(m, dict)), "?")
    vocab, draft = layer.get("vocab_size"), cfg.get("draft_vocab_size")
    maps = "d2t/t2d maps" if draft != vocab else "no maps"
    return [("drafter", f"P-EAGLE, {layer.get('num_hidden_layers')} {layer.get('model_type')} layer(s), hidden "
                        f"{layer.get('hidden_size')}, aux layers {cfg.get('eagle_aux_hidden_state_layer_ids')}"),
            ("parallel draft", f"mask_token_id {cfg.get('mask_token_id')}, {k} tokens per forward"),
            ("vocabulary", f"draft {draft} of {vocab} ({maps})")]


def describe(folder):
    return describe_plain(folder, family="peagle", layout="speculators 0.9.0 P-EAGLE (config.json + model.safetensors)",
                          recognise=lambda cfg: cfg.get("speculators_model_type") == "peagle", facts=_facts,
                          weights=("model.safetensors",))
