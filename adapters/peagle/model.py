"""P-EAGLE (speculators 0.9.0 `peagle`): parallel EAGLE-3. Facts and their sources: docs/peagle.md.

* Entries. EAGLE pairs the target's captured features at position q, g_q = concat(target layer
  outputs), with the *next* token x_{q+1} (speculators `shift_batch`), at rotary position q. Every
  verified pair is a "depth 0" entry; the drafter attends causally over them.
* Block. With x_0 = x_a the anchor, the block is the depth-0 entry (x_0, g_{a-1}) at position a-1,
  then K-1 entries (mask_token_id, mask_hidden) at positions a-1+d, d = 1..K-1, each attending to
  every verified entry, the anchor entry and the earlier mask entries (speculators
  `create_peagle_mask_mod`: depth-0 entries up to its anchor, its own rollout in depth order). The
  entry at depth d predicts x_{a+1+d}: slot j = d+1, K = speculative_tokens.
* Layer 0 reads [input_layernorm(embed(token)); hidden_norm(fc(g))] (2H wide q/k/v) with residual
  fc(g) (hidden_norm(fc(g)) with norm_before_residual); later layers are plain decoder layers; the
  output is norm(h) -> lm_head over the draft vocabulary. `mask_hidden` replaces g before the
  optional input_norm / fc_norm and fc, as in speculators.
* Vocabulary. lm_head has draft_vocab_size rows; draft id i is target id i + d2t[i]; t2d marks
  the target ids the draft vocabulary holds. Logits go to the target vocabulary by scattering the
  draft logits onto their target ids over a fill of logsumexp(draft logits) - FILL_MARGIN: the
  argmax (and ties: the map is increasing) is P-EAGLE's mapped draft, exactly; softmax mass off the
  draft vocabulary is below e^-30·V; and the CE of a label outside it has no gradient through the
  backbone (docs/peagle.md says why this and not -inf).
* Hook points: H_j = the drafter's final-norm output of slot j (what lm_head reads), the mapped
  logits, and P-EAGLE's own (trainable) embed_tokens for the GRU.
* Native names (speculators PEagleDraftModel state dict, verifier_* excluded): embed_tokens.weight,
  fc.weight, [input_norm.weight | fc_norm.{i}.weight], layers.{i}.self_attn.{q,k,v,o}_proj.weight
  (+ .bias with attention_bias; q_norm/k_norm for qwen3 layers), layers.{i}.mlp.{gate,up,down}_proj.
  weight, layers.{i}.{input,post_attention}_layernorm.weight, layers.0.hidden_norm.weight,
  norm.weight, lm_head.weight [draft_vocab, H], mask_hidden [1, 1, n·H], and d2t [draft_vocab]
  (int64) / t2d [V] (bool) when draft_vocab_size < V.
* Layer ids: eagle_aux_hidden_state_layer_ids index the target's hidden states (0 = embedding
  output, L = the last layer's output), so they are this project's 0-based layer outputs + 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..base import (DraftBlock, DrafterAdapter, TrainingBlocks, checkpoint_conflicts,
                    placeholder_token_problems, read_config_json, slot_targets)
from ..dflash.model import RMSNorm, _rows, apply_rope, rope_cos_sin
from ..speculators import verifier_entry
from .schema import CHECKPOINT_FIELDS

ARCHITECTURE = "PEagleSpeculator"
MODEL_TYPE = "peagle"
SPECULATORS_VERSION = "0.9.0"
LAYER_TYPES = ("llama", "qwen3")  # speculators' eagle3 model_classes with a first-layer override
DEFAULT_NUM_SLOTS = 8  # speculators' num_depths default
# tensors speculators fills from the verifier and never saves; ignored if a checkpoint has them
VERIFIER_KEYS = ("verifier_lm_head.weight", "verifier_norm.weight")
# fill of target ids outside the draft vocabulary, below logsumexp(draft logits): e^-30 is ~1e-13
FILL_MARGIN = 30.0


@dataclass
class PEagleConfig:
    layer_type: str  # "llama" | "qwen3": the draft decoder layers
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's (verifier's) vocabulary
    draft_vocab_size: int
    target_layer_ids: list[int]  # 0-based outputs (speculators ids - 1)
    mask_token_id: int
    num_slots: int = DEFAULT_NUM_SLOTS
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    extra: dict = field(default_factory=dict)  # top-level config.json keys carried through
    layer_extra: dict = field(default_factory=dict)  # transformer_layer_config keys carried through
    spec: dict = field(default_factory=dict)  # speculators_config carried through

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size


# ------------------------------------------------------------------ speculators config.json
KNOWN_TOP = {"architectures", "speculators_model_type", "speculators_version", "transformer_layer_config",
             "draft_vocab_size", "norm_before_residual", "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
             "norm_before_fc", "fc_norm", "norm_output", "mask_token_id", "speculators_config"}
LAYER_KEYS = {"model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta", "rope_parameters",
              "rope_scaling", "max_position_embeddings", "attention_bias", "mlp_bias", "hidden_act",
              "attention_dropout", "tie_word_embeddings", "layer_types", "sliding_window", "use_sliding_window",
              "max_window_layers", "torch_dtype", "dtype"}


def _bool(raw: dict, key: str, problems: list) -> bool:
    v = raw.get(key, False)
    if not isinstance(v, bool):
        problems.append(f"{key} {v!r} is invalid; valid: true or false")
        return False
    return v


def from_native(raw: dict, source: str) -> PEagleConfig:
    """A speculators P-EAGLE config.json -> PEagleConfig. Missing transformer_layer_config keys take
    transformers' Llama/Qwen3 defaults (speculators writes it with `to_diff_dict`). Speculators'
    default layer ids need the target: `target_layer_ids` is [] when the config leaves them out.
    Every problem is reported, on one line."""
    kind = raw.get("speculators_model_type")
    if kind != MODEL_TYPE:
        hint = " (EAGLE-3 drafts sequentially; it is not a parallel family)" if kind == "eagle3" else ""
        raise ValueError(f"{source}: speculators_model_type is {kind!r}{hint}; valid: 'peagle' (a speculators "
                         "P-EAGLE checkpoint)")
    problems: list[str] = []
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{source}: transformer_layer_config is {type(layer).__name__}; valid: an object (the draft "
                         "decoder's llama or qwen3 config)")
    ltype = layer.get("model_type", "llama")
    if ltype not in LAYER_TYPES:
        raise ValueError(f"{source}: transformer_layer_config.model_type {ltype!r} is not supported; valid: "
                         f"{', '.join(map(repr, LAYER_TYPES))} (speculators' P-EAGLE first-layer classes)")
    from transformers import LlamaConfig, Qwen3Config

    cls = LlamaConfig if ltype == "llama" else Qwen3Config
    full = cls(**{k: v for k, v in layer.items() if k != "model_type"}).to_dict()
    rope = full.get("rope_parameters") or full.get("rope_scaling") or {}
    rtype = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "?"
    if rtype not in (None, "default"):
        problems.append(f"transformer_layer_config rope_type {rtype!r} is not supported; valid: 'default'")
    if full.get("hidden_act", "silu") != "silu":
        problems.append(f"transformer_layer_config.hidden_act {full['hidden_act']!r} is not supported; valid: 'silu'")
    if any(t != "full_attention" for t in (full.get("layer_types") or [])):
        problems.append("transformer_layer_config.layer_types has sliding_attention layers; valid: full_attention only")
    vocab = int(full["vocab_size"])
    dvocab = raw.get("draft_vocab_size", 32000)  # speculators' default
    if isinstance(dvocab, bool) or not isinstance(dvocab, int) or not 2 <= dvocab <= vocab:
        problems.append(f"draft_vocab_size {dvocab!r} is invalid; valid: an integer in 2..{vocab} "
                        "(transformer_layer_config.vocab_size, the target's)")
        dvocab = vocab
    if raw.get("target_hidden_size") not in (None, full["hidden_size"]):
        problems.append(f"target_hidden_size {raw['target_hidden_size']} != hidden_size {full['hidden_size']}; "
                        "valid: null or the draft's hidden size (speculators' fc assumes them equal)")
    aux = raw.get("eagle_aux_hidden_state_layer_ids")
    if aux is not None and (not isinstance(aux, list) or not aux
                            or any(isinstance(i, bool) or not isinstance(i, int) or i < 1 for i in aux)):
        problems.append(f"eagle_aux_hidden_state_layer_ids {aux!r} is invalid; valid: distinct speculators layer "
                        "ids >= 1 (hidden_states indices; 0, the embedding output, is not supported), or null")
        aux = None
    mask = raw.get("mask_token_id")
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < vocab:
        problems.append(f"mask_token_id {mask!r} is invalid; valid: a token id in 0..{vocab - 1} (P-EAGLE drafts "
                        "from it; speculators leaves it null only before training)")
        mask = vocab - 1
    flags = {k: _bool(raw, k, problems) for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")}
    if flags["norm_before_fc"] and flags["fc_norm"]:
        problems.append("norm_before_fc and fc_norm are both true; valid: at most one")
    spec = raw.get("speculators_config") or {}
    k = DEFAULT_NUM_SLOTS
    methods = spec.get("proposal_methods") or []
    chosen = [m for m in methods if isinstance(m, dict) and m.get("proposal_type") == spec.get("default_proposal_method",
                                                                                              "greedy")]
    if chosen:
        k = chosen[0].get("speculative_tokens", 5)  # GreedyTokenProposalConfig's default
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            problems.append(f"speculators_config.proposal_methods[].speculative_tokens {k!r} is invalid; valid: an "
                            "integer >= 2 (tokens drafted per forward)")
            k = DEFAULT_NUM_SLOTS
    if problems:
        raise ValueError(f"{source}: " + "; ".join(problems))
    rope_theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or full.get("rope_theta") or 10000.0
    heads = int(full["num_attention_heads"])
    return PEagleConfig(
        layer_type=ltype, hidden_size=int(full["hidden_size"]), num_hidden_layers=int(full["num_hidden_layers"]),
        num_attention_heads=heads, num_key_value_heads=int(full.get("num_key_value_heads") or heads),
        head_dim=int(full.get("head_dim") or full["hidden_size"] // heads),
        intermediate_size=int(full["intermediate_size"]), vocab_size=vocab, draft_vocab_size=int(dvocab),
        target_layer_ids=[i - 1 for i in aux] if aux else [], mask_token_id=int(mask), num_slots=int(k),
        rms_norm_eps=float(full.get("rms_norm_eps", 1e-6)), rope_theta=float(rope_theta),
        max_position_embeddings=int(full.get("max_position_embeddings", 4096)),
        attention_bias=bool(full.get("attention_bias", False)), mlp_bias=bool(full.get("mlp_bias", False)),
        **flags,
        extra={k2: v for k2, v in raw.items() if k2 not in KNOWN_TOP},
        layer_extra={k2: v for k2, v in layer.items() if k2 not in LAYER_KEYS},
        spec=spec,
    )


def to_native(cfg: PEagleConfig, architecture: str = "?", target=None) -> dict:
    """config.json in the speculators 0.9.0 P-EAGLE layout (`PEagleSpeculatorConfig`)."""
    layer = dict(cfg.layer_extra)
    layer.update(
        model_type=cfg.layer_type, hidden_act="silu", attention_bias=cfg.attention_bias, attention_dropout=0.0,
        hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        rope_parameters={"rope_theta": cfg.rope_theta, "rope_type": "default"},
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=False,
    )
    if cfg.layer_type == "llama":
        layer["mlp_bias"] = cfg.mlp_bias
    spec = dict(cfg.spec)
    methods = [m for m in spec.get("proposal_methods") or [] if isinstance(m, dict) and m.get("proposal_type") == "greedy"]
    greedy = {**(methods[0] if methods else {}), "proposal_type": "greedy", "speculative_tokens": cfg.num_slots}
    out = dict(cfg.extra)
    out.update(
        architectures=[ARCHITECTURE],
        speculators_model_type=MODEL_TYPE,
        speculators_version=out.get("speculators_version", SPECULATORS_VERSION),
        transformer_layer_config=layer,
        draft_vocab_size=cfg.draft_vocab_size,
        norm_before_residual=cfg.norm_before_residual,
        target_hidden_size=None,
        eagle_aux_hidden_state_layer_ids=[i + 1 for i in cfg.target_layer_ids],
        norm_before_fc=cfg.norm_before_fc,
        fc_norm=cfg.fc_norm,
        norm_output=cfg.norm_output,
        embed_requires_grad=True,  # PEagleSpeculatorConfig's default: P-EAGLE trains its embeddings
        mask_token_id=cfg.mask_token_id,
        speculators_config={
            **spec,
            "algorithm": MODEL_TYPE,
            "proposal_methods": [greedy],
            "default_proposal_method": "greedy",
            "verifier": verifier_entry(spec, target, architecture),  # adapters/speculators.py: why
        },
    )
    return out


def tensor_shapes(cfg: PEagleConfig) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors (what `backbone_state_dict` holds), from the config alone."""
    h, hd, n = cfg.hidden_size, cfg.head_dim, len(cfg.target_layer_ids)
    qo, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    out: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (cfg.vocab_size, h), "fc.weight": (h, n * h)}
    if cfg.norm_before_fc:
        out["input_norm.weight"] = (n * h,)
    if cfg.fc_norm:
        out.update({f"fc_norm.{i}.weight": (h,) for i in range(n)})
    for i in range(cfg.num_hidden_layers):
        p, width = f"layers.{i}.", 2 * h if i == 0 else h
        for name, shape in (("q_proj", (qo, width)), ("k_proj", (kv, width)), ("v_proj", (kv, width)),
                            ("o_proj", (h, qo))):
            out[f"{p}self_attn.{name}.weight"] = shape
            if cfg.attention_bias:
                out[f"{p}self_attn.{name}.bias"] = (shape[0],)
        if cfg.layer_type == "qwen3":
            out[f"{p}self_attn.q_norm.weight"] = (hd,)
            out[f"{p}self_attn.k_norm.weight"] = (hd,)
        for name, shape in (("gate_proj", (cfg.intermediate_size, h)), ("up_proj", (cfg.intermediate_size, h)),
                            ("down_proj", (h, cfg.intermediate_size))):
            out[f"{p}mlp.{name}.weight"] = shape
            if cfg.mlp_bias:
                out[f"{p}mlp.{name}.bias"] = (shape[0],)
        out[f"{p}input_layernorm.weight"] = (h,)
        out[f"{p}post_attention_layernorm.weight"] = (h,)
        if i == 0:
            out[f"{p}hidden_norm.weight"] = (h,)
    out["norm.weight"] = (h,)
    out["lm_head.weight"] = (cfg.draft_vocab_size, h)
    out["mask_hidden"] = (1, 1, n * h)
    if cfg.reduced_vocab:
        out["d2t"] = (cfg.draft_vocab_size,)
        out["t2d"] = (cfg.vocab_size,)
    return out


# ------------------------------------------------------------------------ vocabulary maps
def check_vocab_maps(d2t, t2d, cfg: PEagleConfig, source: str) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (d2t int64, t2d bool), or a ValueError naming the tensor. The maps are stored as
    speculators writes them (int64 / bool). Floating maps are read only from runs and bundles this
    project wrote before integer tensors kept their dtype (the core then cast every tensor to one
    float dtype): t2d (0/1) is exact in any float dtype, and d2t is rebuilt from it (speculators'
    maps are increasing) and must agree with the stored value at that precision."""
    vd, v = cfg.draft_vocab_size, cfg.vocab_size
    for name, t, n in (("d2t", d2t, vd), ("t2d", t2d, v)):
        if t is None:
            raise ValueError(f"{source}: tensor {name!r} is missing; draft_vocab_size {vd} < the target vocabulary "
                             f"{v} needs d2t (draft id -> target id offsets) and t2d (the target ids it holds): "
                             "without them draft ids read as target ids and τ collapses silently; valid: the "
                             "checkpoint's own d2t and t2d, or draft_vocab_size equal to the target's")
        if tuple(t.shape) != (n,):
            raise ValueError(f"{source}: tensor {name!r} has shape {list(t.shape)}; valid: [{n}]")
    if t2d.is_floating_point() and not bool(((t2d == 0) | (t2d == 1)).all()):
        raise ValueError(f"{source}: tensor 't2d' holds values other than 0 and 1; valid: a bool mask over the "
                         "target vocabulary")
    t2d = t2d != 0
    if int(t2d.sum()) != vd:
        raise ValueError(f"{source}: tensor 't2d' marks {int(t2d.sum())} target ids; valid: exactly draft_vocab_size "
                         f"= {vd}")
    if d2t.is_floating_point():
        rebuilt = torch.nonzero(t2d).flatten() - torch.arange(vd, device=t2d.device)
        if not torch.equal(rebuilt.to(d2t.dtype), d2t):
            raise ValueError(f"{source}: tensor 'd2t' ({d2t.dtype}) does not match the offsets t2d implies; valid: the "
                             "int64 d2t speculators writes (a float d2t is read back only from this project's older "
                             "files, rebuilt from t2d; re-export to store it as int64)")
        return rebuilt, t2d
    if d2t.dtype == torch.bool:
        raise ValueError(f"{source}: tensor 'd2t' is bool; valid: int64 offsets (target id = draft id + d2t)")
    d2t = d2t.long()
    ids = torch.arange(vd, device=d2t.device) + d2t
    bad = ((ids < 0) | (ids >= v)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"{source}: tensor 'd2t' maps draft id {i} to target id {int(ids[i])}; valid: target ids "
                         f"0..{v - 1}")
    if ids.unique().numel() != vd:
        raise ValueError(f"{source}: tensor 'd2t' maps two draft ids to one target id; valid: a one-to-one map")
    if not bool(t2d[ids].all()):
        i = int((~t2d[ids]).nonzero()[0])
        raise ValueError(f"{source}: tensor 'd2t' maps draft id {i} to target id {int(ids[i])}, which t2d does not "
                         "mark; valid: d2t and t2d of the same draft vocabulary")
    return d2t, t2d


def random_vocab_maps(cfg: PEagleConfig, seed: int, keep: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random draft vocabulary (tests and dry runs), holding `keep` (eos ids) when it can."""
    g = torch.Generator().manual_seed(seed)
    v, vd = cfg.vocab_size, cfg.draft_vocab_size
    keep = [i for i in dict.fromkeys(keep) if 0 <= i < v and i != cfg.mask_token_id][:vd]
    rest = [i for i in torch.randperm(v, generator=g).tolist() if i not in keep and i != cfg.mask_token_id]
    ids = torch.tensor(sorted(keep + rest[: vd - len(keep)]), dtype=torch.long)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(vd), t2d


def load_npy_maps(d, cfg: PEagleConfig) -> tuple[torch.Tensor, torch.Tensor]:
    import numpy as np

    out = []
    for name, path in (("d2t", d.d2t_path), ("t2d", d.t2d_path)):
        try:
            out.append(torch.from_numpy(np.load(path)))
        except (OSError, ValueError) as e:
            raise ValueError(f"drafter.{name}_path: cannot read {path!r} as a .npy array ({e}); valid: speculators' "
                             f"{name}-N.npy") from None
    return check_vocab_maps(out[0], out[1], cfg, f"drafter.d2t_path/t2d_path ({d.d2t_path}, {d.t2d_path})")


# ------------------------------------------------------------------------------ modules
class Attention(nn.Module):
    def __init__(self, cfg: PEagleConfig, in_dim: int):
        super().__init__()
        self.cfg = cfg
        hd, b = cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(in_dim, cfg.num_attention_heads * hd, bias=b)
        self.k_proj = nn.Linear(in_dim, cfg.num_key_value_heads * hd, bias=b)
        self.v_proj = nn.Linear(in_dim, cfg.num_key_value_heads * hd, bias=b)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=b)
        if cfg.layer_type == "qwen3":  # Qwen3Attention: per-head RMSNorm on q and k before rope
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, cos, sin, past: Optional[tuple], mask):
        """x [B, T, in]; past (k, v) [B, kvh, C, hd] or None; mask bool [B, 1, T, C+T] -> (out, (k, v) of x)."""
        b, t, _ = x.shape
        hd = self.cfg.head_dim
        q, k = self.q_proj(x).view(b, t, -1, hd), self.k_proj(x).view(b, t, -1, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, t, -1, hd).transpose(1, 2)
        ka, va = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        if rep > 1:
            ka, va = ka.repeat_interleave(rep, dim=1), va.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, ka, va, attn_mask=mask, scale=hd**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: PEagleConfig):
        super().__init__()
        h, i, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=b)
        self.up_proj = nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """A decoder layer; layer 0 is EAGLE-3's first layer (speculators Eagle3FirstLayerMixin)."""

    def __init__(self, cfg: PEagleConfig, idx: int):
        super().__init__()
        h = cfg.hidden_size
        self.first, self.norm_before_residual = idx == 0, cfg.norm_before_residual
        self.self_attn = Attention(cfg, 2 * h if self.first else h)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        if self.first:
            self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)

    def forward(self, h, emb, cos, sin, past, mask):
        if self.first:  # [embeds ; hidden], the residual is the hidden half
            hid = self.hidden_norm(h)
            x = torch.cat([self.input_layernorm(emb), hid], dim=-1)
            residual = hid if self.norm_before_residual else h
        else:
            x, residual = self.input_layernorm(h), h
        a, kv = self.self_attn(x, cos, sin, past, mask)
        h = residual + a
        return h + self.mlp(self.post_attention_layernorm(h)), kv


class PEagleBackbone(nn.Module):
    """The drafter's own weights, state_dict keys = speculators' names (d2t/t2d are buffers)."""

    def __init__(self, cfg: PEagleConfig):
        super().__init__()
        self.cfg = cfg
        h, n = cfg.hidden_size, len(cfg.target_layer_ids)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.fc = nn.Linear(n * h, h, bias=False)
        self.input_norm = RMSNorm(n * h, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc_norm = nn.ModuleList([RMSNorm(h, cfg.rms_norm_eps) for _ in range(n)]) if cfg.fc_norm else None
        self.layers = nn.ModuleList([Layer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.mask_hidden = nn.Parameter(torch.zeros(1, 1, n * h))
        if cfg.reduced_vocab:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        else:
            self.d2t = self.t2d = None

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        """speculators' fresh model: Linear N(0, std), norms 1, biases 0, mask_hidden N(0, 1)
        (torch.randn). embed_tokens and lm_head are the target's, copied by `build`."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name == "mask_hidden":
                    p.copy_(torch.randn(p.shape, generator=g))
                elif name.endswith("bias"):
                    p.zero_()
                elif p.ndim == 2:
                    p.copy_(torch.randn(p.shape, generator=g) * std)
                else:
                    p.fill_(1.0)

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        """g [.., n·H] (target features or mask_hidden) -> fc input norms -> fc -> [.., H]."""
        x = feats.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:
            x = torch.cat([norm(c) for norm, c in zip(self.fc_norm, x.chunk(len(self.fc_norm), dim=-1))], dim=-1)
        return self.fc(x)

    def forward(self, ids, feats, positions, past: Optional[list], mask):
        """ids [B, T], feats [B, T, n·H] at positions [T] or [B, T]; past per-layer (k, v) of cached
        entries; mask bool [B, T, C+T] (True = may attend) -> (norm output [B, T, H], per-layer (k, v))."""
        emb = self.embed_tokens(ids).to(self.fc.weight.dtype)
        h = self.project(feats)
        cos, sin = rope_cos_sin(_rows(positions), self.cfg.head_dim, self.cfg.rope_theta, h.dtype)
        kvs = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, emb, cos, sin, None if past is None else past[i], mask[:, None])
            kvs.append(kv)
        return self.norm(h), kvs


# ------------------------------------------------------------------------------ adapter
class PEagleAdapter(DrafterAdapter):
    family = "peagle"
    topology = "chain"
    one_pass = True

    def __init__(self, cfg: PEagleConfig, target):
        super().__init__()
        if cfg.hidden_size != target.shape.hidden_size:
            raise ValueError(f"drafter hidden_size {cfg.hidden_size} != target hidden_size {target.shape.hidden_size}: "
                             "P-EAGLE's fc reads the target's features at its own width")
        self.cfg = cfg
        self.backbone = PEagleBackbone(cfg)
        object.__setattr__(self, "target", target)  # shared, not owned
        self.num_slots = cfg.num_slots
        self.hidden_dim = cfg.hidden_size
        self.emb_dim = cfg.hidden_size  # the GRU reads P-EAGLE's own embed_tokens
        self.vocab_size = cfg.vocab_size
        self.reset(1)

    def reserved_token_ids(self) -> frozenset[int]:
        return frozenset({self.cfg.mask_token_id})

    def capture_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.target_layer_ids)

    def vocab_maps(self) -> dict[str, torch.Tensor]:
        """{"d2t", "t2d"} of a reduced draft vocabulary, or {} (the target's vocabulary)."""
        if not self.cfg.reduced_vocab:
            return {}
        return {"d2t": self.backbone.d2t, "t2d": self.backbone.t2d}

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (speculators: target = draft + d2t[draft])."""
        if not self.cfg.reduced_vocab:
            return draft_ids
        return draft_ids + self.backbone.d2t[draft_ids]

    # ---- hook points
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.backbone.embed_tokens(ids)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """P-EAGLE's own logits over the draft vocabulary [.., draft_vocab_size]."""
        return self.backbone.lm_head(hidden)

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[.., H] -> [.., V]: the draft logits on their target ids, the rest at logsumexp - FILL_MARGIN
        (module docstring). Not detached: the fill's gradient cancels the CE gradient of a label
        outside the draft vocabulary, and leaves P-EAGLE's own draft-vocabulary CE for the others."""
        logits = self.draft_logits(hidden)
        if not self.cfg.reduced_vocab:
            return logits
        fill = (torch.logsumexp(logits.float(), dim=-1, keepdim=True) - FILL_MARGIN).to(logits.dtype)
        ids = torch.arange(self.cfg.draft_vocab_size, device=logits.device) + self.backbone.d2t
        out = fill.expand(*logits.shape[:-1], self.cfg.vocab_size)
        return out.index_copy(-1, ids, logits)

    # ---- decoding
    def reset(self, batch_size: int) -> None:
        self._past: Optional[list] = None  # per-layer (k, v) of committed depth-0 entries
        self._todo: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (ids, feats, positions)
        self._last: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # g of the last position, awaiting its token
        self._seen = 0  # positions observed: 0.._seen-1

    def observe(self, features, positions: torch.Tensor, ids: Optional[torch.Tensor] = None) -> None:
        """Entries pair g_q with x_{q+1}: each observed position completes the previous one's entry,
        and the last position's g waits for its token (the next observe's first id, or the anchor)."""
        if ids is None:
            raise ValueError("P-EAGLE observe(): token ids are required (an entry pairs the target's features with "
                             "the next token); the engine must call adapter.observe(features, positions, ids=...)")
        n = positions.numel()
        if n == 0:
            return
        if int(positions[0]) != self._seen or features is None or features.shape[1] != n or ids.shape[1] != n:
            raise RuntimeError(f"P-EAGLE observe(): positions {int(positions[0])}..{int(positions[-1])} with "
                               f"{None if features is None else features.shape[1]} feature rows and {ids.shape[1]} ids; "
                               f"expected consecutive positions from {self._seen}, one feature row and id each")
        feats, pos = features[:, :-1], positions[:-1]
        if self._last is not None:
            feats, pos = torch.cat([self._last[0], feats], 1), torch.cat([self._last[1], pos])
            toks = ids
        else:
            toks = ids[:, 1:]
        if pos.numel():
            self._todo.append((toks, feats, pos))
        self._last = (features[:, -1:], positions[-1:])
        self._seen = int(positions[-1]) + 1

    def context_length(self) -> int:
        return self._seen

    def propose(self, anchor: torch.Tensor, position: int) -> DraftBlock:
        if self._last is None or position != self._seen:
            raise RuntimeError(f"P-EAGLE propose(anchor at position {position}): the drafter has seen positions "
                               f"0..{self._seen - 1}; it needs every verified position before the anchor")
        b, k, dev = anchor.shape[0], self.num_slots, anchor.device
        mask_id = torch.full((b, k - 1), self.cfg.mask_token_id, dtype=torch.long, device=dev)
        blk_ids = torch.cat([anchor[:, None].long(), mask_id], 1)
        g = self._last[0].to(self.backbone.mask_hidden.dtype)
        blk_feats = torch.cat([g, self.backbone.mask_hidden.expand(b, k - 1, -1)], 1)
        blk_pos = torch.arange(k, device=dev) + (position - 1)
        ids = torch.cat([t for t, _, _ in self._todo] + [blk_ids], 1)
        feats = torch.cat([f.to(g.dtype) for _, f, _ in self._todo] + [blk_feats], 1)
        pos = torch.cat([p.to(dev) for _, _, p in self._todo] + [blk_pos])
        past_len = 0 if self._past is None else self._past[0][0].shape[2]
        t = ids.shape[1]
        # plain causal over [committed entries, new context entries, anchor entry, masks]: the
        # block sees all verified entries, and its masks see the earlier ones (depth order)
        q = torch.arange(t, device=dev)[:, None] + past_len
        mask = (torch.arange(past_len + t, device=dev)[None, :] <= q).expand(b, -1, -1)
        hidden, kvs = self.backbone(ids, feats, pos, self._past, mask)
        n_ctx = t - k  # commit the verified context entries only: the block never enters the cache
        if n_ctx:
            new = [(kk[:, :, :n_ctx], vv[:, :, :n_ctx]) for kk, vv in kvs]
            self._past = new if self._past is None else [
                (torch.cat([pk, nk], 2), torch.cat([pv, nv], 2)) for (pk, pv), (nk, nv) in zip(self._past, new)]
        self._todo = []
        slots = hidden[:, n_ctx:]
        return DraftBlock(hidden=slots, base_logits=self.base_logits(slots))

    # ---- training
    def training_blocks(self, features, input_ids, loss_mask, anchors) -> TrainingBlocks:
        """One forward over [depth-0 entries (x_{q+1}, g_q) at q = 0..L-2, causal; every block's K-1
        mask entries]. The mask entry of depth d for anchor a (position a-1+d) sees entries q <= a-1
        and its block's depths 1..d (speculators' P-EAGLE mask). Slot 1 is entry a-1's output."""
        b, length = input_ids.shape
        nb, k, dev = anchors.shape[1], self.num_slots, input_ids.device
        m, c = k - 1, length - 1
        offs = torch.arange(1, k, device=dev)
        blk_pos = (anchors[:, :, None] - 1 + offs).reshape(b, nb * m)
        ids = torch.cat([input_ids[:, 1:], torch.full((b, nb * m), self.cfg.mask_token_id, dtype=torch.long,
                                                      device=dev)], 1)
        mh = self.backbone.mask_hidden
        feats = torch.cat([features[:, :c].to(mh.dtype), mh.expand(b, nb * m, -1)], 1)
        pos = torch.cat([torch.arange(c, device=dev).expand(b, -1), blk_pos], 1)
        hidden_all, _ = self.backbone(ids, feats, pos, None, training_mask(anchors, c, k))

        rows = torch.arange(b, device=dev).repeat_interleave(nb)
        a = anchors.reshape(-1)
        first = hidden_all[rows, a - 1]
        hidden = torch.cat([first[:, None], hidden_all[:, c:].reshape(b * nb, m, -1)], 1)  # [N, K, H]
        labels, prev = slot_targets(input_ids, loss_mask, anchors, k)
        return TrainingBlocks(hidden=hidden, prev_emb=self.embed(prev), labels=labels, base_logits_fn=self.base_logits)

    def backbone_parameters(self) -> list[nn.Parameter]:
        return list(self.backbone.parameters())

    # ---- persistence
    def backbone_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.backbone.state_dict())

    def native_config(self) -> dict:
        return to_native(self.cfg, self.target.shape.architecture, self.target)


def training_mask(anchors: torch.Tensor, num_ctx: int, k: int) -> torch.Tensor:
    """bool [B, C + nb·(K-1), C + nb·(K-1)], True = may attend, over [C depth-0 entries; every
    block's mask entries]: depth-0 entries causal; the depth-d entry of anchor a sees entries
    q <= a-1 and its block's depths 1..d (tests compare it with speculators' mask_mod)."""
    b, nb = anchors.shape
    m, dev = k - 1, anchors.device
    qc = torch.arange(num_ctx, device=dev)
    ctx_ctx = (qc[None, :] <= qc[:, None]).expand(b, -1, -1)
    ctx_blk = torch.zeros(b, num_ctx, nb * m, dtype=torch.bool, device=dev)
    blk_ctx = qc[None, None, :] <= (anchors - 1).repeat_interleave(m, dim=1)[:, :, None]
    blk_id, blk_off = torch.arange(nb, device=dev).repeat_interleave(m), torch.arange(1, k, device=dev).repeat(nb)
    blk_blk = ((blk_id[:, None] == blk_id[None, :]) & (blk_off[None, :] <= blk_off[:, None])).expand(b, -1, -1)
    return torch.cat([torch.cat([ctx_ctx, ctx_blk], 2), torch.cat([blk_ctx, blk_blk], 2)], 1)


# ------------------------------------------------------------------ recipe -> drafter
def default_target_layer_ids(num_target_layers: int) -> list[int]:
    """speculators' default [2, L//2, L-3] (hidden_states indices), as 0-based layer outputs."""
    return [i - 1 for i in (2, num_target_layers // 2, num_target_layers - 3)]


def _values(cfg: PEagleConfig) -> dict:
    return {"num_layers": cfg.num_hidden_layers, "num_slots": cfg.num_slots,
            "target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
            "draft_vocab_size": cfg.draft_vocab_size, "norm_before_residual": cfg.norm_before_residual,
            "norm_before_fc": cfg.norm_before_fc, "fc_norm": cfg.fc_norm, "norm_output": cfg.norm_output,
            "layer_type": cfg.layer_type}


def config_from_recipe(d, tshape) -> PEagleConfig:
    """From the checkpoint (drafter.path / drafter.config) or fresh from the recipe and the target's
    shape; a recipe value that contradicts the checkpoint is an error naming both, and every
    problem is one line of the ValueError."""
    source = d.path or d.config
    problems: list[str] = []
    if source is not None:
        field_name = "drafter.path" if d.path else "drafter.config"
        cfg = from_native(read_config_json(source, field_name), f"{source}/config.json")
        ids_given = bool(cfg.target_layer_ids)
        if not ids_given:  # speculators resolves a null list against the verifier
            cfg.target_layer_ids = default_target_layer_ids(tshape.num_layers)
        theirs = _values(cfg)
        problems += checkpoint_conflicts(d, {n: theirs[n] for n in CHECKPOINT_FIELDS
                                             if n != "target_layer_ids" or ids_given})
        for name, mine, target in (("hidden_size", cfg.hidden_size, tshape.hidden_size),
                                   ("vocab_size", cfg.vocab_size, tshape.vocab_size)):
            if mine != target:
                problems.append(f"{field_name}: the checkpoint's {name} {mine} != the target's {target}; P-EAGLE reads "
                                "the target's features and drafts its vocabulary (a drafter for another target?)")
        ids_from = " (from the checkpoint's eagle_aux_hidden_state_layer_ids, minus one)"
    else:
        ids = list(d.target_layer_ids) if d.target_layer_ids else default_target_layer_ids(tshape.num_layers)
        v = tshape.vocab_size
        cfg = PEagleConfig(
            layer_type=d.layer_type or "llama", hidden_size=tshape.hidden_size, num_hidden_layers=d.num_layers,
            num_attention_heads=tshape.num_heads, num_key_value_heads=tshape.num_kv_heads, head_dim=tshape.head_dim,
            intermediate_size=d.intermediate_size or tshape.intermediate_size, vocab_size=v,
            draft_vocab_size=d.draft_vocab_size or v, target_layer_ids=ids,
            mask_token_id=d.mask_token_id if d.mask_token_id is not None else v - 1, num_slots=d.num_slots,
            rms_norm_eps=tshape.rms_norm_eps, rope_theta=tshape.rope_theta,
            max_position_embeddings=tshape.max_position_embeddings, norm_before_residual=d.norm_before_residual,
            norm_before_fc=d.norm_before_fc, fc_norm=d.fc_norm, norm_output=d.norm_output,
        )
        if cfg.draft_vocab_size > v:
            problems.append(f"drafter.draft_vocab_size: {cfg.draft_vocab_size} is more than the target's {v} tokens; "
                            f"valid: 2..{v}")
        if d.d2t_path is not None and not cfg.reduced_vocab:
            problems.append(f"drafter.d2t_path: given, but draft_vocab_size is the target's {v}; valid: set "
                            "drafter.draft_vocab_size to the maps' size, or drop d2t_path/t2d_path")
        ids_from = "" if d.target_layer_ids else " (speculators' default [2, L//2, L-3], minus one; set " \
                                                "drafter.target_layer_ids)"
    n = tshape.num_layers
    ids = cfg.target_layer_ids
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        problems.append(f"drafter.target_layer_ids: {bad[0]} in {ids} is out of range{ids_from}; valid: 0..{n - 1} "
                        f"(0-based outputs of the target's {n} decoder layers)")
    elif len(set(ids)) != len(ids):
        problems.append(f"drafter.target_layer_ids: {ids} lists a layer twice{ids_from}; valid: distinct ids in "
                        f"0..{n - 1}")
    problems += placeholder_token_problems("mask_token_id", cfg.mask_token_id, tshape.vocab_size, tshape.eos_token_ids)
    if problems:
        raise ValueError("\n".join(problems))
    return cfg


def recipe_values(d, tshape) -> dict:
    """The drafter fields a checkpoint decided, as built (recorded in a run's resolved recipe)."""
    if d.path is None and d.config is None:
        return {}
    return _values(config_from_recipe(d, tshape))


def plan(d, tshape):
    from ..plan import FamilyPlan, HookPoint

    cfg = config_from_recipe(d, tshape)
    k, h, v = cfg.num_slots, cfg.hidden_size, cfg.vocab_size
    vocab = (f"draft vocabulary {cfg.draft_vocab_size} of {v} (d2t/t2d)" if cfg.reduced_vocab
             else f"vocabulary {v} (no d2t/t2d)")
    return FamilyPlan(
        family="peagle",
        summary=(f"P-EAGLE {cfg.num_hidden_layers} {cfg.layer_type} layer(s), hidden {h}, K = {k} (x_0 + mask id "
                 f"{cfg.mask_token_id} x {k - 1}), capture {cfg.target_layer_ids}, {vocab}"),
        num_slots=k,
        hidden_dim=h,
        emb_dim=h,
        vocab_size=v,
        capture_layers=list(cfg.target_layer_ids),
        backbone_tensors=tensor_shapes(cfg),
        hooks=[
            HookPoint("hidden", "drafter norm output at the anchor entry and the K-1 mask entries", f"[B, {k}, {h}]"),
            HookPoint("base_logits", "drafter lm_head over the draft vocabulary, scattered onto target ids by d2t"
                      if cfg.reduced_vocab else "drafter lm_head(hidden)", f"[B, {k}, {v}]"),
            HookPoint("embed", "P-EAGLE's own embed_tokens of x_0..x_{K-1}", f"[B, {k}, {h}]"),
        ],
        source=d.path or f"fresh (seed {d.seed})",
    )


def build(d, target):
    """-> (adapter, {}): a P-EAGLE checkpoint holds no Domino head (bundles keep it in head.safetensors).
    Weights are checked strictly; like speculators' load_verifier_weights, a checkpoint without
    embed_tokens or lm_head gets the target's (lm_head: its rows t2d marks)."""
    from pathlib import Path

    from domino_graft.artifacts.tensors import check_tensors, load_tensors

    cfg = config_from_recipe(d, target.shape)
    adapter = PEagleAdapter(cfg, target)
    bb = adapter.backbone
    t_embed = target.model.get_input_embeddings().weight.detach()
    t_head = target.model.get_output_embeddings().weight.detach()
    if d.path is not None:
        weights = Path(d.path) / "model.safetensors"
        state = {k.removeprefix("model."): v for k, v in load_tensors(weights).items()}
        state = {k: v for k, v in state.items() if k not in VERIFIER_KEYS}
        if cfg.reduced_vocab:
            d2t, t2d = check_vocab_maps(state.pop("d2t", None), state.pop("t2d", None), cfg, str(weights))
            if d.d2t_path is not None:  # a run reloading its own drafter: the maps must be the same
                f_d2t, f_t2d = load_npy_maps(d, cfg)
                if not (torch.equal(f_d2t, d2t) and torch.equal(f_t2d, t2d)):
                    raise ValueError(f"drafter.d2t_path/t2d_path: the maps differ from the checkpoint's d2t/t2d in "
                                     f"{weights}; valid: drop d2t_path/t2d_path to use the checkpoint's")
            state["d2t"], state["t2d"] = d2t, t2d
        else:
            for name in ("d2t", "t2d"):  # speculators ignores identity maps of a full vocabulary
                state.pop(name, None)
        state.setdefault("embed_tokens.weight", t_embed)
        if "lm_head.weight" not in state:
            state["lm_head.weight"] = t_head[state["t2d"]] if cfg.reduced_vocab else t_head
        check_tensors(state, tensor_shapes(cfg), source=str(weights))
        ints = sorted(k for k, v in state.items() if k not in ("d2t", "t2d") and not v.is_floating_point())
        if ints:  # a weight must not be read as a float from integers
            raise ValueError(f"{weights}: tensor {ints[0]!r} is {str(state[ints[0]].dtype).removeprefix('torch.')}; "
                             "valid: a floating-point weight (only d2t and t2d are integer / bool)")
        bb.load_state_dict({k: v if k in ("d2t", "t2d") else v.float() for k, v in state.items()}, strict=True)
    else:
        bb.init_weights(d.seed)
        with torch.no_grad():
            if cfg.reduced_vocab:
                d2t, t2d = (load_npy_maps(d, cfg) if d.d2t_path is not None
                            else random_vocab_maps(cfg, d.seed, target.shape.eos_token_ids))
                bb.d2t.copy_(d2t)
                bb.t2d.copy_(t2d)
                bb.lm_head.weight.copy_(t_head[t2d].float())
            else:
                bb.lm_head.weight.copy_(t_head.float())
            bb.embed_tokens.weight.copy_(t_embed.float())
    bb.to(device=target.device, dtype=target.dtype)  # floating tensors only: d2t/t2d keep int64/bool
    return adapter, {}


def num_parameters(cfg: PEagleConfig) -> int:
    return sum(math.prod(s) for n, s in tensor_shapes(cfg).items() if n not in ("d2t", "t2d"))
