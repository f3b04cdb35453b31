"""P-EAGLE (speculators 0.9.0 `peagle`): parallel EAGLE-3. Facts and their sources: docs/peagle.md.
This module is the drafter (config, vocabulary maps, modules); adapter.py attaches it to a target.

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

from ..layers import RMSNorm, apply_rope, position_rows, rope_cos_sin
from ..speculators import verifier_entry

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
        cos, sin = rope_cos_sin(position_rows(positions), self.cfg.head_dim, self.cfg.rope_theta, h.dtype)
        kvs = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, emb, cos, sin, None if past is None else past[i], mask[:, None])
            kvs.append(kv)
        return self.norm(h), kvs


def num_parameters(cfg: PEagleConfig) -> int:
    return sum(math.prod(s) for n, s in tensor_shapes(cfg).items() if n not in ("d2t", "t2d"))
