"""Medusa-1 heads (FasterDecoding) on the frozen target.

Facts of the family (docs/design.md §2-§3), kept in this module (the config, the modules, the weights'
files); adapter.py attaches them to a target:

* Head i (0-based) = `num_layers` ResBlocks (x + SiLU(W x + b)) then its own LM head
  (no bias). Every head reads the same tensor: the target's final post-norm hidden state
  h_t of the last verified token t (capture layer -1).
* The target's own LM head at t gave the anchor x_0 (position t+1). Head i predicts
  x_{i+1}, the token t+2+i: slot j = i+1, K = num_heads. H_j = head i's ResBlock output,
  base logits = head i's own LM head, the GRU reads the target's input embeddings of
  x_0 .. x_{j-1}. So at `propose(x_0, a)` the heads read h_{a-1}; the training anchor a is
  the position of x_0 there too (the same convention as every family), hidden from a-1.
* FasterDecoding layout: `config.json` {medusa_num_heads, medusa_num_layers,
  base_model_name_or_path}; `medusa_lm_head.safetensors` (or `.pt`), keys
  `{i}.{l}.linear.weight` [H, H], `{i}.{l}.linear.bias` [H], `{i}.{num_layers}.weight` [V, H].
  Medusa-2 stores the same tensors as `medusa_head.{i}.*` inside a full model: that
  prefix is stripped on import.
* Fresh heads start like Medusa's: ResBlock weights zero (each block is x + SiLU(b)),
  biases at nn.Linear's default init, every LM head a copy of the target's.
* Training: the base-logit CE term of the Domino curriculum (λ·CE(base), per-slot
  weights exp(-(j-1)/γ)) *is* Medusa's head loss (Medusa: CE per head, weights 0.8^i);
  `TrainingBlocks.extra_loss` stays None, so no head is counted twice.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "model.safetensors")
MEDUSA2_PREFIX = "medusa_head."
CHOICES_KEY = "medusa_choices"  # the static tree, kept next to the heads (FasterDecoding ignores it)


@dataclass
class MedusaConfig:
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_layers: int
    base_model_name_or_path: Optional[str] = None
    tree: Optional[list[list[int]]] = None  # Medusa choices; decoding setting, not a weight
    extra: dict = field(default_factory=dict)  # FasterDecoding config keys we carry through

    @classmethod
    def from_native(cls, cfg: dict, tshape, source: str) -> "MedusaConfig":
        """FasterDecoding config.json (hidden/vocab default to the target's: Medusa's own
        configs omit them)."""
        missing = [k for k in ("medusa_num_heads", "medusa_num_layers") if k not in cfg]
        if tshape is None:
            missing += [k for k in ("hidden_size", "vocab_size") if k not in cfg]
        if missing:
            raise ValueError(f"{source}: config.json lacks {', '.join(missing)}: not a FasterDecoding Medusa config")
        # read here or rewritten on export: carried in `extra`, they would go stale
        known = {"medusa_num_heads", "medusa_num_layers", "base_model_name_or_path", "hidden_size", "vocab_size",
                 CHOICES_KEY, "torch_dtype"}
        choices = cfg.get(CHOICES_KEY)
        return cls(
            hidden_size=int(cfg.get("hidden_size") or tshape.hidden_size),
            vocab_size=int(cfg.get("vocab_size") or tshape.vocab_size),
            num_heads=int(cfg["medusa_num_heads"]),
            num_layers=int(cfg["medusa_num_layers"]),
            base_model_name_or_path=cfg.get("base_model_name_or_path"),
            tree=[list(c) for c in choices] if choices else None,
            extra={k: v for k, v in cfg.items() if k not in known},
        )

    def to_native(self) -> dict:
        """config.json in the FasterDecoding layout (hidden/vocab added: its loader ignores them)."""
        out = dict(self.extra)
        out.update(
            medusa_num_heads=self.num_heads,
            medusa_num_layers=self.num_layers,
            base_model_name_or_path=self.base_model_name_or_path,
            hidden_size=self.hidden_size,
            vocab_size=self.vocab_size,
        )
        if self.tree:
            out[CHOICES_KEY] = [list(c) for c in self.tree]
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def tensor_shapes(cfg: MedusaConfig) -> dict[str, tuple[int, ...]]:
    h, v, n = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    out: dict[str, tuple[int, ...]] = {}
    for i in range(cfg.num_heads):
        for layer in range(n):
            out[f"{i}.{layer}.linear.weight"] = (h, h)
            out[f"{i}.{layer}.linear.bias"] = (h,)
        out[f"{i}.{n}.weight"] = (v, h)
    return out


# ------------------------------------------------------------------------------ modules
class ResBlock(nn.Module):
    """Medusa's ResBlock: x + SiLU(W x + b)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        # Medusa's init: the block starts near the identity, the head near the target's LM head.
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.ModuleList):
    """A ModuleList of Sequential(ResBlock × L, Linear(H, V)): its state_dict keys are
    exactly FasterDecoding's (`{i}.{l}.linear.weight`, `{i}.{L}.weight`)."""

    def __init__(self, cfg: MedusaConfig):
        super().__init__(
            nn.Sequential(*[ResBlock(cfg.hidden_size) for _ in range(cfg.num_layers)],
                          nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
            for _ in range(cfg.num_heads)
        )

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] (one state for every head) -> per-slot H_j [..., K, H]."""
        return torch.stack([head[:-1](h) for head in self], dim=-2)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., K, H] -> base logits [..., K, V]: slot j through head j-1's LM head."""
        k = len(self)
        if hidden.ndim < 2 or hidden.shape[-2] != k:
            raise ValueError(
                f"Medusa base logits: hidden has shape {list(hidden.shape)}; expected [..., {k}, H] "
                f"(one LM head per slot, so the slot axis must be kept; do not flatten slots into rows)"
            )
        # One GEMM per head: stacking K [V, H] weights would copy them on every call.
        return torch.stack([F.linear(hidden[..., i, :], self[i][-1].weight) for i in range(k)], dim=-2)


def load_native_weights(folder: str | Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The heads' tensors from a FasterDecoding folder (Medusa-2 `medusa_head.` prefix stripped)."""
    from domino_graft.artifacts.files import CheckpointError
    from domino_graft.artifacts.tensors import load_tensors, torch_load

    folder = Path(folder)
    for name in WEIGHT_FILES:
        f = folder / name
        if not f.is_file():
            continue
        if f.suffix == ".pt":
            state = torch_load(f)  # weights_only: a .pt from the internet must not run code on load
            if not isinstance(state, dict):
                raise CheckpointError(f"{f}: holds a {type(state).__name__}, expected a state dict")
        else:
            state = load_tensors(f)
        if any(k.startswith(MEDUSA2_PREFIX) for k in state):
            state = {k[len(MEDUSA2_PREFIX):]: v for k, v in state.items() if k.startswith(MEDUSA2_PREFIX)}
        return state, f
    raise FileNotFoundError(f"drafter.path: {str(folder)!r} holds none of {', '.join(WEIGHT_FILES)}")


def backbone_num_parameters(cfg: MedusaConfig) -> int:
    return sum(math.prod(s) for s in tensor_shapes(cfg).values())
