"""DSpark (speculators 0.9.0 `dspark`): a DFlash backbone plus a sequential Markov logit bias and a
confidence head. The backbone is adapters/dflash/model.py's, imported, not copied. Facts and their
sources: docs/dspark.md. This module is the drafter (config, native config, modules); adapter.py
attaches it to a target.

* Block and slots: DFlash's. `sample_from_anchor: true` (DSpark's default) is DFlash's
  `shift_label: true` with every block position proposing: block position k predicts x_{a+1+k},
  slot j = k + 1, K = block_size. `false`: position k predicts x_{a+k}, K = block_size - 1.
* Markov head (speculators `MarkovHead`): slot j's bias is markov_w2(m_j), m_j a rank-r feature of
  the previous block token x_{j-1} (slot 1: the anchor x_0): vanilla m = W1[x_{j-1}]; gated
  m = sigmoid(gate_proj([H_j; W1[x_{j-1}]])) * W1[x_{j-1}]; rnn m = tanh(out_j) of a recurrent
  state over the block. L_dspark_j = lm_head(H_j) + markov_w2(m_j).
* Which previous token: DSpark drafts its chain greedily, x_{j-1} = its own draft at slot j-1.
  `propose` runs that chain inside the adapter (one backbone forward, then K cheap Markov steps),
  and `training_blocks` runs the same chain from the same logits, so a block is the same in
  training and decoding (the conformance kit). The chain is DSpark's greedy drafting exactly; at
  T > 0, and when an on-top Domino head changes a draft, later Markov biases still follow
  DSpark's greedy chain (lossless either way; docs/dspark.md says what a core hook would change).
* Hook points (graft `on_top`): H'_j = [H_j ; m_j] (dim H + r), base logits = L_dspark_j, so the
  Domino residual is added after DSpark's correction and its W1 also reads m_j. Graft `in_place`:
  H_j and lm_head(H_j), the Markov head unused (kept, exported untouched).
* Native names (speculators `DSparkDraftModel` state dict, verifier-owned tensors excluded):
  DFlash's `layers.*`, `norm.weight`, `fc.weight`, `hidden_norm.weight`; `markov_head.markov_w1.weight`
  [V, r], `markov_head.markov_w2.weight` [V, r], gated `markov_head.gate_proj.{weight [r, H+r], bias
  [r]}`, rnn `markov_head.joint_proj.{weight [3r, 2r+H], bias [3r]}`; `confidence_head.proj.{weight
  [1, H(+r)], bias [1]}`.
* Layer ids: speculators' `aux_hidden_state_layer_ids` index hidden_states (0 = the embedding
  output), so they are the project's 0-based layer outputs + 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from ..dflash import model as dflash
from ..dflash.model import DFlashConfig
from ..speculators import verifier_entry

ARCHITECTURE = "DSparkSpeculator"
MODEL_TYPE = "dspark"
SPECULATORS_VERSION = "0.9.0"
# tensors speculators fills from the verifier; a self-contained checkpoint may hold them (ignored:
# the target's own are used, as DFlash does)
VERIFIER_KEYS = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight")
TRANSFORMER_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "intermediate_size", "vocab_size", "rms_norm_eps", "max_position_embeddings", "layer_types",
                    "sliding_window", "rope_parameters", "rope_theta")


@dataclass
class DSparkConfig:
    """The DSpark fields on top of the DFlash backbone's config."""

    sample_from_anchor: bool = True
    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    extra: dict = field(default_factory=dict)  # top-level keys carried through untouched
    layer_extra: dict = field(default_factory=dict)  # transformer_layer_config keys carried through

    @property
    def confidence_input(self) -> int:
        return self.markov_rank if self.confidence_head_with_markov else 0


# ------------------------------------------------------------------ speculators config.json
def from_native(raw: dict, source: str) -> tuple[DFlashConfig, DSparkConfig]:
    """A speculators DSpark config.json -> (backbone config, DSpark fields). Missing
    transformer_layer_config keys take transformers' Qwen3Config defaults (speculators writes
    it with `to_diff_dict`, which leaves defaults out)."""
    problems = []
    kind = raw.get("speculators_model_type")
    if kind != MODEL_TYPE:
        raise ValueError(f"{source}: speculators_model_type is {kind!r}; valid: 'dspark' (a speculators DSpark "
                         "checkpoint; convert a z-lab DFlash one with family dflash)")
    layer = raw.get("transformer_layer_config") or {}
    if not isinstance(layer, dict):
        raise ValueError(f"{source}: transformer_layer_config must be an object")
    if layer.get("model_type", "qwen3") != "qwen3":
        problems.append(f"transformer_layer_config.model_type {layer.get('model_type')!r} is not supported; "
                        "valid: 'qwen3' (DSpark's draft layers)")
    from transformers import Qwen3Config

    full = {k: v for k, v in Qwen3Config(**{k: v for k, v in layer.items() if k != "model_type"}).to_dict().items()
            if k in TRANSFORMER_KEYS and v is not None}
    vocab = full["vocab_size"]
    draft_vocab = raw.get("draft_vocab_size", vocab)
    if draft_vocab != vocab:
        problems.append(f"draft_vocab_size {draft_vocab} != vocab_size {vocab}: a reduced draft vocabulary "
                        "(t2d/d2t maps) is not supported yet")
    if raw.get("target_hidden_size") not in (None, full["hidden_size"]):
        problems.append(f"target_hidden_size {raw['target_hidden_size']} != hidden_size {full['hidden_size']}: "
                        "not supported")
    if raw.get("sliding_window_non_causal"):
        problems.append("sliding_window_non_causal: true is not supported (DFlash's sliding layers are causal-window)")
    aux = raw.get("aux_hidden_state_layer_ids")
    if not aux or any((not isinstance(i, int)) or i < 1 for i in aux):
        problems.append(f"aux_hidden_state_layer_ids {aux!r} is invalid; valid: speculators layer ids >= 1 "
                        "(hidden_states indices; 0, the embedding output, is not supported)")
        aux = [1]
    mask = raw.get("mask_token_id")
    if mask is None:
        problems.append("mask_token_id is missing; a DSpark config must give it")
        mask = vocab - 1
    rank = raw.get("markov_rank", 256)
    htype = raw.get("markov_head_type", "vanilla")
    sfa = raw.get("sample_from_anchor", True)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        problems.append(f"markov_rank {rank!r} is invalid; valid: an integer >= 0")
    if htype not in ("vanilla", "gated", "rnn"):
        problems.append(f"markov_head_type {htype!r} is invalid; valid: 'vanilla', 'gated', 'rnn'")
    if htype == "rnn" and not sfa:
        problems.append("markov_head_type 'rnn' with sample_from_anchor false is not supported")
    conf, conf_m = bool(raw.get("enable_confidence_head", True)), bool(raw.get("confidence_head_with_markov", True))
    if conf and conf_m and rank == 0:
        problems.append("confidence_head_with_markov true needs markov_rank > 0")
    if problems:
        raise ValueError(f"{source}: " + "; ".join(problems))
    zlab = {**full, "block_size": int(raw.get("block_size", 8)),
            "dflash_config": {"mask_token_id": int(mask), "target_layer_ids": [i - 1 for i in aux],
                              "shift_label": bool(sfa)}}
    cfg = DFlashConfig.from_native(zlab)
    cfg.extra = {}
    known = {"transformer_layer_config", "draft_vocab_size", "block_size", "target_hidden_size",
             "aux_hidden_state_layer_ids", "mask_token_id", "sliding_window_non_causal", "sample_from_anchor",
             "markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov",
             "speculators_model_type", "architectures"}
    mcfg = DSparkConfig(sample_from_anchor=bool(sfa), markov_rank=int(rank), markov_head_type=htype,
                        enable_confidence_head=conf, confidence_head_with_markov=conf_m,
                        extra={k: v for k, v in raw.items() if k not in known},
                        layer_extra={k: v for k, v in layer.items() if k not in TRANSFORMER_KEYS})
    return cfg, mcfg


def to_native(cfg: DFlashConfig, mcfg: DSparkConfig, architecture: str = "?", target=None) -> dict:
    """config.json in the speculators 0.9.0 DSpark layout (`DSparkSpeculatorConfig`)."""
    k = cfg.block_size if mcfg.sample_from_anchor else cfg.block_size - 1
    layer = dict(mcfg.layer_extra)
    layer.update(
        model_type="qwen3", hidden_act="silu", attention_bias=False, attention_dropout=0.0,
        hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        rope_parameters={"rope_theta": cfg.rope_theta, "rope_type": "default"},
        max_position_embeddings=cfg.max_position_embeddings, layer_types=list(cfg.layer_types),
        sliding_window=cfg.sliding_window, tie_word_embeddings=False,
    )
    out = dict(mcfg.extra)
    spec = out.get("speculators_config") or {}
    out.update(
        architectures=[ARCHITECTURE],
        speculators_model_type=MODEL_TYPE,
        speculators_version=out.get("speculators_version", SPECULATORS_VERSION),
        transformer_layer_config=layer,
        draft_vocab_size=cfg.vocab_size,
        block_size=cfg.block_size,
        target_hidden_size=None,
        aux_hidden_state_layer_ids=[i + 1 for i in cfg.target_layer_ids],
        mask_token_id=cfg.mask_token_id,
        sliding_window_non_causal=False,
        sample_from_anchor=mcfg.sample_from_anchor,
        markov_rank=mcfg.markov_rank,
        markov_head_type=mcfg.markov_head_type,
        enable_confidence_head=mcfg.enable_confidence_head,
        confidence_head_with_markov=mcfg.confidence_head_with_markov,
        speculators_config={
            **spec,
            "algorithm": MODEL_TYPE,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
            "default_proposal_method": "greedy",
            "verifier": verifier_entry(spec, target, architecture),  # adapters/speculators.py: why
        },
    )
    return out


def markov_tensor_shapes(cfg: DFlashConfig, mcfg: DSparkConfig) -> dict[str, tuple[int, ...]]:
    h, v, r = cfg.hidden_size, cfg.vocab_size, mcfg.markov_rank
    out: dict[str, tuple[int, ...]] = {}
    if r > 0:
        out["markov_head.markov_w1.weight"] = (v, r)
        out["markov_head.markov_w2.weight"] = (v, r)
        if mcfg.markov_head_type == "gated":
            out["markov_head.gate_proj.weight"] = (r, h + r)
            out["markov_head.gate_proj.bias"] = (r,)
        elif mcfg.markov_head_type == "rnn":
            out["markov_head.joint_proj.weight"] = (3 * r, 2 * r + h)
            out["markov_head.joint_proj.bias"] = (3 * r,)
    if mcfg.enable_confidence_head:
        out["confidence_head.proj.weight"] = (1, h + mcfg.confidence_input)
        out["confidence_head.proj.bias"] = (1,)
    return out


def tensor_shapes(cfg: DFlashConfig, mcfg: DSparkConfig) -> dict[str, tuple[int, ...]]:
    return {**dflash.backbone_tensor_shapes(cfg), **markov_tensor_shapes(cfg, mcfg)}


# ------------------------------------------------------------------------------ modules
class MarkovHead(nn.Module):
    """speculators `MarkovHead`, split into the rank-r feature m_j and its projection markov_w2."""

    def __init__(self, vocab: int, rank: int, hidden: int, head_type: str):
        super().__init__()
        self.rank, self.head_type = rank, head_type
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)
        if head_type == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif head_type == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def init_weights(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                else:  # speculators: W1 ~ N(0, 0.01); the rest as the backbone's
                    p.copy_(torch.randn(p.shape, generator=g) * (0.01 if "markov_w1" in name else 0.02))

    def init_state(self, rows: int, like: torch.Tensor) -> Optional[torch.Tensor]:
        return like.new_zeros(rows, self.rank) if self.head_type == "rnn" else None

    def feature(self, prev: torch.Tensor, hidden: torch.Tensor, state):
        """One slot: prev ids [N], hidden [N, H] -> (m [N, r], next state)."""
        e = self.markov_w1(prev.long()).to(self.markov_w2.weight.dtype)
        if self.head_type == "vanilla":
            return e, state
        h = hidden.to(e.dtype)
        if self.head_type == "gated":
            return torch.sigmoid(self.gate_proj(torch.cat([h, e], dim=-1))) * e, state
        gate, cand, out = self.joint_proj(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        return torch.tanh(out), gate * state + (1.0 - gate) * torch.tanh(cand)

    def features(self, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Every slot, given the previous tokens: prev [N, K], hidden [N, K, H] -> m [N, K, r]."""
        if self.head_type != "rnn":
            e = self.markov_w1(prev.long()).to(self.markov_w2.weight.dtype)
            if self.head_type == "vanilla":
                return e
            return torch.sigmoid(self.gate_proj(torch.cat([hidden.to(e.dtype), e], dim=-1))) * e
        state = self.init_state(prev.shape[0], self.markov_w2.weight)
        out = []
        for j in range(prev.shape[1]):
            m, state = self.feature(prev[:, j], hidden[:, j], state)
            out.append(m)
        return torch.stack(out, dim=1)


class ConfidenceHead(nn.Module):
    """speculators `ConfidenceHead`: a per-position acceptance logit. Kept and exported; DSpark
    uses it to size draft lengths, which chain verification here does not."""

    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1)

    def init_weights(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(self.proj.weight.shape, generator=g) * 0.02)
            self.proj.bias.zero_()


class DSparkBackbone(dflash.DFlashBackbone):
    """DFlash's backbone plus the Markov and confidence heads: the drafter's own weights, one module
    (the trainer trains and saves `adapter.backbone`), state_dict keys = speculators' names."""

    def __init__(self, cfg: DFlashConfig, mcfg: DSparkConfig):
        super().__init__(cfg)
        h, r = cfg.hidden_size, mcfg.markov_rank
        self.markov_head = MarkovHead(cfg.vocab_size, r, h, mcfg.markov_head_type) if r > 0 else None
        self.confidence_head = ConfidenceHead(h + mcfg.confidence_input) if mcfg.enable_confidence_head else None

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        g = torch.Generator().manual_seed(seed)  # DFlash's init for the DFlash tensors
        with torch.no_grad():
            for name, p in self.named_parameters():
                if not name.startswith(("markov_head.", "confidence_head.")):
                    p.copy_(torch.randn(p.shape, generator=g) * std) if p.ndim == 2 else p.fill_(1.0)
        for i, module in enumerate((self.markov_head, self.confidence_head)):
            if module is not None:
                module.init_weights(seed + 1 + i)


def num_parameters(cfg: DFlashConfig, mcfg: DSparkConfig) -> int:
    return sum(math.prod(s) for s in tensor_shapes(cfg, mcfg).values())
