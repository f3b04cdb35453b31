"""What SGLang, vLLM and transformers require of a DFlash bundle (domino_graft/export/engine_rules.py).

Each rule names the engine file it was read from (sgl-project/sglang and vllm-project/vllm,
read 2026-12; docs/serving.md lists them). In short:

* sglang: the native layout with its Domino head; `parse_dflash_draft_config` (config),
  `validate_domino_runtime` (bf16, vocabularies, head shapes), `models/dflash.py` (weights).
* vllm: vLLM has no Domino runtime (vllm-project/vllm#46707), so the export writes the base
  DFlash drafter alone (z-lab layout). Its DFlash speculator drafts from the N mask positions
  after the anchor, the z-lab convention: a `shift_label: true` drafter would serve one
  position off (τ ≈ 1), so it is refused.
* hf: the remote-code bundle, read by this project's own hf_modeling/.
"""

from __future__ import annotations

import json
from typing import Optional

from domino_graft.export.engine_rules import CheckpointView, Description, EngineSpec, Rule, Unknown
from domino_graft.head import HEAD_TENSOR_NAMES

from .bundle import AUX_IDS_KEY, HF_AUTO_MAP, hf_shipped_files

SGL_PARSE = "sglang srt/speculative/dflash_utils.py parse_dflash_draft_config"
SGL_RUNTIME = "sglang srt/speculative/domino_utils.py validate_domino_runtime"
SGL_MODEL = "sglang srt/models/dflash.py DFlashDraftModel"
VLLM_MODEL = "vllm model_executor/models/qwen3_dflash.py"
VLLM_SPEC = "vllm v1/worker/gpu/spec_decode/dflash/speculator.py DFlashSpeculator"
VLLM_AUX = "vllm v1/worker/gpu/spec_decode/eagle/eagle3_utils.py get_eagle3_aux_layers_from_config"
VLLM_MASK = "vllm v1/worker/gpu/spec_decode/utils.py get_parallel_drafting_token_id"
HF_CODE = "domino-graft adapters/dflash/hf_modeling (transformers trust_remote_code)"
ARCH = "DFlashDraftModel"


# ----------------------------------------------------------------------- reading config
def _get(view: CheckpointView, key: str):
    """dflash_config's value, else the top level's (both SGLang's and vLLM's lookup order)."""
    nested = view.config.get("dflash_config") or {}
    return nested[key] if nested.get(key) is not None else view.config.get(key)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_at_least(key: str, low: int, where: str = "dflash_config"):
    def check(view):
        v = _get(view, key) if where == "dflash_config" else view.config.get(key)
        return None if _is_int(v) and v >= low else repr(v)
    return check


def _equals(key: str, want, hint: str = "", where: str = "dflash_config"):
    def check(view):
        v = _get(view, key) if where == "dflash_config" else view.config.get(key)
        return None if type(v) is type(want) and v == want else f"{v!r}{hint if v is not None else ''}"
    return check


def _architecture(want: str):
    def check(view):
        a = view.config.get("architectures")
        return None if isinstance(a, list) and want in a else repr(a)
    return check


def _emb_dim_twice(view):
    nested, top = (view.config.get("dflash_config") or {}).get("emb_dim"), view.config.get("emb_dim")
    if nested is None and top is None:
        return "absent in both places"
    if nested is not None and top is not None and nested != top:
        return f"dflash_config.emb_dim {nested!r} != top-level emb_dim {top!r}"
    return None


def _shift_label_bool(view):
    v = _get(view, "shift_label")
    return None if isinstance(v, bool) else repr(v)


def _target_layer_ids(view):
    ids, n = _get(view, "target_layer_ids"), view.config.get("num_target_layers")
    if not isinstance(ids, list) or not ids or not all(_is_int(i) for i in ids):
        return repr(ids)
    if not _is_int(n):
        raise Unknown("num_target_layers is not an integer")
    bad = [i for i in ids if not 0 <= i < n]
    return f"{ids} ({bad[0]} is outside 0..{n - 1} for num_target_layers {n})" if bad else None


def _layer_types(view):
    types, n = view.config.get("layer_types"), view.config.get("num_hidden_layers")
    if types is None:
        return None  # both engines default to full attention
    if not isinstance(types, list) or len(types) != n:
        return f"{types!r} ({len(types) if isinstance(types, list) else 'no'} entries for {n} layers)"
    odd = [t for t in types if t not in ("full_attention", "sliding_attention")]
    if odd:
        return f"{odd[0]!r} in {types}"
    if "sliding_attention" in types and not _is_int(view.config.get("sliding_window")):
        return f"sliding_attention layers with sliding_window {view.config.get('sliding_window')!r}"
    return None


def _mlp(view):
    act, inter = view.config.get("hidden_act", "silu"), view.config.get("intermediate_size")
    if act != "silu":
        return f"hidden_act {act!r}"
    return None if _is_int(inter) and inter > 0 else f"intermediate_size {inter!r}"


def _all_dtype(want: str):
    def check(view):
        wrong = sorted(n for n, (_, d) in view.tensors.items() if d != want)
        if not wrong:
            return None
        dtypes = sorted({view.tensors[n][1] for n in wrong})
        return f"{'/'.join(dtypes)} ({len(wrong)} of {len(view.tensors)} tensors, e.g. {wrong[0]!r}; export with --dtype {want})"
    return check


def _vocab(view):
    if view.target_vocab is None:
        raise Unknown("the target's vocabulary size is not known here")
    v = view.config.get("vocab_size")
    return None if v == view.target_vocab else f"{v!r} (the target's is {view.target_vocab})"


# ------------------------------------------------------------------------- tensors
def _head_dims(view) -> tuple[int, int, int, int]:
    if _get(view, "projector_type") != "domino":
        raise Unknown("no Domino head declared")
    g, r, h, v = _get(view, "gru_hidden_dim"), _get(view, "emb_dim"), view.config.get("hidden_size"), view.config.get("vocab_size")
    if not all(_is_int(x) and x > 0 for x in (g, r, h, v)):
        raise Unknown("gru_hidden_dim, emb_dim, hidden_size or vocab_size is invalid")
    return g, r, h, v


def _head_shapes(view) -> dict[str, tuple[int, ...]]:
    g, r, h, v = _head_dims(view)
    # SGLang builds nn.GRU(hidden_size, G) and Linear(hidden + G, emb_dim), Linear(emb_dim, vocab)
    return {"prefix_gru.weight_ih_l0": (3 * g, h), "prefix_gru.weight_hh_l0": (3 * g, g),
            "embed_proj.0.weight": (r, h + g), "embed_proj.2.weight": (v, r)}


def _head_tensor(name: str):
    def check(view):
        want, got = _head_shapes(view)[name], view.shape(name)
        if got is None:
            return "missing"
        return None if tuple(got) == want else f"{list(got)} (config.json implies {list(want)})"
    return check


def _no_head(view):
    found = sorted(n for n in view.tensors if n.removeprefix("model.").startswith(("prefix_gru.", "embed_proj.")))
    return f"{found} present" if found else None


def _backbone(view):
    """Every backbone tensor config.json implies, by name and shape; nothing else but the head."""
    from .model import DFlashConfig, backbone_tensor_shapes

    try:
        want = backbone_tensor_shapes(DFlashConfig.from_native(view.config))
    except (ValueError, KeyError, TypeError) as e:
        return f"config.json is not a DFlash config ({e})"
    have = {n: s for n, (s, _) in view.tensors.items() if n not in HEAD_TENSOR_NAMES}
    bad = [f"missing {n!r}" for n in want if n not in have]
    bad += [f"{n!r} is {list(have[n])}, config.json implies {list(s)}" for n, s in want.items()
            if n in have and tuple(have[n]) != s]
    bad += [f"unexpected {n!r}" for n in have if n not in want]
    if not bad:
        return None
    return "; ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")


def _files(*names: str):
    def check(view):
        missing = [n for n in names if n not in view.files]
        return f"{missing} missing" if missing else None
    return check


# ---------------------------------------------------------------------------- rules
def _shared(config_src: str, ids_src: str, mask_src: str, weights_src: str) -> list[Rule]:
    """Rules every DFlash loader applies to the backbone; the sources say whose file each is from."""
    return [
        Rule("num_hidden_layers", "an integer >= 1", config_src, _int_at_least("num_hidden_layers", 1, "top")),
        Rule("dflash_config.target_layer_ids", "a non-empty list of 0-based target layer ids below num_target_layers",
             ids_src, _target_layer_ids),
        Rule("dflash_config.mask_token_id", "a non-negative integer", mask_src, _int_at_least("mask_token_id", 0)),
        Rule("layer_types", "one of full_attention / sliding_attention per layer (sliding ones need sliding_window)",
             weights_src, _layer_types),
        Rule("hidden_act / intermediate_size", "silu and a positive intermediate_size", weights_src, _mlp),
        Rule("model.safetensors", "exactly the backbone tensors config.json implies (no `model.` prefix, no "
             "embed_tokens / lm_head: the target's are used)", weights_src, _backbone),
    ]


def _domino(src: str) -> list[Rule]:
    """The Domino declaration and the head's tensors (SGLang; also this project's remote code)."""
    return [
        Rule("dflash_config.projector_type", "'domino'", src, _equals("projector_type", "domino")),
        Rule("dflash_config.gru_hidden_dim", "an integer >= 1", src, _int_at_least("gru_hidden_dim", 1)),
        Rule("emb_dim", "present (dflash_config or top level), equal where given twice", src, _emb_dim_twice),
        Rule("dflash_config.shift_label", "a bool", src, _shift_label_bool),
    ]


def _head_rules(src: str) -> list[Rule]:
    return [
        Rule("prefix_gru.weight_ih_l0", "[3·gru_hidden_dim, hidden_size] (GRU input = hidden size)", src,
             _head_tensor("prefix_gru.weight_ih_l0")),
        Rule("prefix_gru.weight_hh_l0", "[3·gru_hidden_dim, gru_hidden_dim]", src, _head_tensor("prefix_gru.weight_hh_l0")),
        Rule("embed_proj.0.weight", "[emb_dim, hidden_size + gru_hidden_dim]", src, _head_tensor("embed_proj.0.weight")),
        Rule("embed_proj.2.weight", "[vocab_size, emb_dim] (output = the vocabulary)", src,
             _head_tensor("embed_proj.2.weight")),
    ]


def sglang_rules() -> list[Rule]:
    return [
        Rule("architectures", f"[{ARCH!r}]", SGL_MODEL, _architecture(ARCH)),
        *_domino(SGL_PARSE),
        Rule("dflash_config.pure_draft_prefix_len", "1", SGL_PARSE,
             _equals("pure_draft_prefix_len", 1, " (the recipe's head.pure_prefix_len)")),
        Rule("block_size", "an integer > 1", SGL_PARSE, _int_at_least("block_size", 2)),
        Rule("num_target_layers", "an integer >= 1", SGL_PARSE, _int_at_least("num_target_layers", 1)),
        *_shared(SGL_PARSE, SGL_PARSE, SGL_PARSE, SGL_MODEL),
        Rule("model.safetensors dtype", "bf16 weights", SGL_RUNTIME, _all_dtype("bf16")),
        Rule("vocab_size", "the target's vocabulary size (target and draft vocabularies equal)", SGL_RUNTIME, _vocab),
        *_head_rules(SGL_RUNTIME),
    ]


def _not_domino(view):
    v = _get(view, "projector_type")
    return None if v in (None, "dflash") else repr(v)


def _z_lab_convention(view):
    v = _get(view, "shift_label")
    if v is True:
        return ("true (trained with position k predicting x_{a+1+k}; vLLM would read every draft one position "
                "off and accept almost nothing)")
    return None if v in (None, False) else repr(v)


def _not_from_anchor(view):
    v = (view.config.get("dflash_config") or {}).get("sample_from_anchor", False)
    return None if v is False else repr(v)


def _aux_ids(view):
    aux, ids = view.config.get(AUX_IDS_KEY), _get(view, "target_layer_ids")
    if aux is None:
        return None  # vLLM then takes dflash_config.target_layer_ids + 1
    if not isinstance(ids, list) or aux != [i + 1 for i in ids]:
        return f"{aux!r} with target_layer_ids {ids!r}"
    return None


def vllm_rules() -> list[Rule]:
    return [
        Rule("architectures", f"[{ARCH!r}]", "vllm model_executor/models/registry.py", _architecture(ARCH)),
        Rule("model_type", "'qwen3' (the draft config is a transformers Qwen3Config)", VLLM_MODEL,
             _equals("model_type", "qwen3", where="top")),
        Rule("dflash_config.projector_type", "absent or 'dflash' (vLLM has no Domino runtime)",
             "vllm-project/vllm#46707", _not_domino),
        Rule("prefix_gru.* / embed_proj.*", "absent (a tensor without a module fails AutoWeightsLoader)",
             f"{VLLM_MODEL} DFlashQwen3ForCausalLM.load_weights", _no_head),
        Rule("dflash_config.shift_label", "false or absent: the anchor is the bonus token and mask position k "
             "drafts x_{a+k} (the z-lab convention)", VLLM_SPEC, _z_lab_convention),
        Rule("dflash_config.sample_from_anchor", "absent or false", VLLM_SPEC, _not_from_anchor),
        Rule(AUX_IDS_KEY, "absent, or target_layer_ids + 1 each", VLLM_AUX, _aux_ids),
        *_shared(VLLM_MODEL, VLLM_AUX, VLLM_MASK, VLLM_MODEL),
        Rule("vocab_size", "the target's vocabulary size (else vLLM expects a draft-to-target d2t map)",
             f"{VLLM_MODEL} DFlashQwen3ForCausalLM", _vocab),
    ]


def hf_rules() -> list[Rule]:
    def auto_map(view):
        got = view.config.get("auto_map")
        return None if got == HF_AUTO_MAP else json.dumps(got)

    return [
        Rule("architectures", "['DominoDraftModel']", HF_CODE, _architecture("DominoDraftModel")),
        Rule("model_type", "'domino_dflash'", HF_CODE, _equals("model_type", "domino_dflash", where="top")),
        Rule("auto_map", json.dumps(HF_AUTO_MAP), HF_CODE, auto_map),
        Rule("remote code", f"{list(hf_shipped_files())} in the folder (the model, spec_generate and its Triton "
             "kernels)", HF_CODE, _files(*hf_shipped_files())),
        *_domino(HF_CODE),
        Rule("dflash_config.pure_draft_prefix_len", "an integer >= 0", HF_CODE, _int_at_least("pure_draft_prefix_len", 0)),
        *_shared(HF_CODE, HF_CODE, HF_CODE, HF_CODE),
        *_head_rules(HF_CODE),
    ]


# ------------------------------------------------------------------------ the specs
def engine_spec(engine: str) -> Optional[EngineSpec]:
    from . import serving

    if engine == "sglang":
        return EngineSpec("sglang", "native", tuple(sglang_rules()), serve=serving.sglang_lines)
    if engine == "vllm":
        return EngineSpec("vllm", "vllm", tuple(vllm_rules()), head_in_bundle=False, serve=serving.vllm_lines)
    if engine == "hf":
        return EngineSpec("hf", "hf", tuple(hf_rules()), serve=serving.hf_lines)
    return None


def describe(folder) -> Optional[Description]:
    from .serving import describe as read

    return read(folder)
