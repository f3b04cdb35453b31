"""No serving engine runs a Domino head on DSpark drafters (domino_graft/export/engine_rules.py): every engine
refuses the family by name, saying why; `inspect` reads speculators DSpark folders and bundles."""

from __future__ import annotations

from domino_graft.export.engine_rules import describe_plain, refusals

REFUSED = {
    "sglang": "SGLang's DSPARK algorithm runs DSpark's own Markov head, not a Domino head (SGLang's Domino runtime is a "
              "sub-mode of DFLASH only: sglang speculative/dflash_utils.py); the native bundle's drafter/ is a "
              "speculators 0.9.0 DSpark checkpoint, untested with SGLang's loader",
    "vllm": "vLLM 0.33 serves DSpark but has no Domino runtime (RFC vllm-project/vllm#46707); the native bundle's "
            "drafter/ is a speculators 0.9.0 DSpark checkpoint that vLLM's DSpark loader loads as the base drafter, "
            "without the head (docs/dspark.md)",
    "hf": "there is no transformers remote code for DSpark drafters; `--format native` writes drafter/ (a speculators "
          "DSpark checkpoint) + head.safetensors for domino-graft's own decoder",
}

engine_spec = refusals(REFUSED)


def _facts(cfg: dict) -> list[tuple[str, str]]:
    layer = cfg.get("transformer_layer_config") or {}
    verifier = (cfg.get("speculators_config") or {}).get("verifier") or {}
    return [("drafter", f"DSpark, {layer.get('num_hidden_layers')} layer(s), hidden {layer.get('hidden_size')}, block "
                        f"{cfg.get('block_size')}, aux layers {cfg.get('aux_hidden_state_layer_ids')}"),
            ("markov head", f"rank {cfg.get('markov_rank')}, {cfg.get('markov_head_type')}"),
            ("verifier", str(verifier.get("name_or_path")))]


def describe(folder):
    return describe_plain(folder, family="dspark", layout="speculators 0.9.0 DSpark (config.json + model.safetensors)",
                          recognise=lambda cfg: cfg.get("speculators_model_type") == "dspark", facts=_facts,
                          weights=("model.safetensors",))
