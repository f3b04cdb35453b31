"""Medusa-1 heads (FasterDecoding) on the frozen target.

Facts of the family (docs/design.md §2-§3), kept in this one module:

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

from ..base import DraftBlock, DrafterAdapter, TrainingBlocks, checkpoint_conflicts, read_config_json, slot_targets

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


# ------------------------------------------------------------------------------ adapter
class MedusaAdapter(DrafterAdapter):
    family = "medusa"
    one_pass = True  # all K heads read one hidden state: one (tiny) backbone forward
    ragged_batch = True

    def __init__(self, cfg: MedusaConfig, target):
        super().__init__()
        ts = target.shape
        if cfg.hidden_size != ts.hidden_size:
            raise ValueError(
                f"Medusa hidden_size {cfg.hidden_size} != target hidden_size {ts.hidden_size}: "
                "the heads read the target's final hidden state, so they must match"
            )
        if cfg.vocab_size != ts.vocab_size:
            raise ValueError(f"Medusa vocab_size {cfg.vocab_size} != target vocab_size {ts.vocab_size}")
        self.cfg = cfg
        # `backbone`: the name trainers and exporters use for a family's own trainable weights
        self.backbone = MedusaHeads(cfg)
        object.__setattr__(self, "target", target)  # shared, not owned: out of our state_dict
        self.topology = "tree" if cfg.tree else "chain"
        self.num_slots = cfg.num_heads
        self.hidden_dim = cfg.hidden_size
        self.emb_dim = ts.hidden_size
        self.vocab_size = cfg.vocab_size
        self._last: Optional[torch.Tensor] = None  # [B, H]: h of the last observed position
        self._last_pos = -1
        self._seen = 0

    @property
    def heads(self) -> MedusaHeads:
        return self.backbone

    @property
    def tree(self) -> Optional[list[list[int]]]:
        """Medusa choices for tree decoding (domino_graft.decoding.tree), or None (chain)."""
        return self.cfg.tree

    def capture_layers(self) -> tuple[int, ...]:
        return (-1,)

    # ---- hook points
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(ids)

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., K, H] -> [..., K, V] (the slot axis says which LM head)."""
        return self.heads.logits(hidden)

    def slot_base_logits(self, hidden: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Flattened rows: hidden [N, H], slots [N] (0-based slot of each row) -> [N, V].
        Trainers chunk [blocks·K] rows; each row must go through its own head's LM head."""
        rows, parts = [], []
        for i, head in enumerate(self.heads):
            sel = (slots == i).nonzero().flatten()
            rows.append(sel)
            parts.append(F.linear(hidden[sel], head[-1].weight))  # autocast may pick the dtype here
        order = torch.cat(rows)
        return torch.cat(parts)[torch.argsort(order)]  # back to the rows' own order

    def draft(self, h: torch.Tensor) -> DraftBlock:
        """h [B, H] = the target's final hidden state at t -> the K slots for x_0 at t+1."""
        hidden = self.heads.hidden(h.to(self.heads[0][-1].weight.dtype))
        return DraftBlock(hidden=hidden, base_logits=self.heads.logits(hidden))

    # ---- decoding
    def reset(self, batch_size: int) -> None:
        self._last, self._last_pos, self._seen = None, -1, 0

    def observe(self, features: torch.Tensor, positions: torch.Tensor, ids: Optional[torch.Tensor] = None) -> None:
        if features is None or features.shape[1] == 0:
            return
        # Only the newest state is ever read: Medusa has no context beyond h_t.
        if positions.ndim == 2:  # a ragged batch: each row's last real (non-negative) position
            at = positions.argmax(-1)
            rows = torch.arange(positions.shape[0], device=positions.device)
            last, last_pos = features[rows, at], positions[rows, at]
            if torch.is_tensor(self._last_pos):  # a row given padding only keeps its state
                real = last_pos >= 0
                last = torch.where(real[:, None], last, self._last)
                last_pos = torch.where(real, last_pos, self._last_pos)
            self._last, self._last_pos = last, last_pos
            self._seen += int((positions >= 0).sum())
            return
        self._last = features[:, -1]
        self._last_pos = int(positions[-1])
        self._seen += int(positions.numel())

    def context_length(self) -> int:
        return self._seen

    def static_drafter(self, max_len: int):
        """The graphed propose (fast.py) for chains, kept between decodes (its captured graphs are
        reused) while the heads' device and dtype are unchanged; None for a tree (decoded
        dynamically) or a subclass that changes propose."""
        if self.topology != "chain" or type(self).propose is not MedusaAdapter.propose:
            return None
        from .fast import StaticMedusaDrafter

        w = self.heads[0][-1].weight
        cur = getattr(self, "_static_drafter", None)
        if cur is None or (cur.device, cur.dtype) != (w.device, w.dtype):
            cur = StaticMedusaDrafter(self, max_len)
            object.__setattr__(self, "_static_drafter", cur)  # not a submodule: no state_dict entry
        cur.max_len = max(cur.max_len, int(max_len))  # no context tensors: nothing grows
        return cur

    def propose(self, anchor: torch.Tensor, position: int) -> DraftBlock:
        if self._last is None:
            raise RuntimeError("Medusa propose() before any observe(): the heads need the target's hidden state")
        off = self._last_pos != position - 1  # a [B] tensor in a ragged batch
        if bool(off.any() if torch.is_tensor(off) else off):
            raise RuntimeError(
                f"Medusa propose(anchor at position {position}): the heads read the hidden state at "
                f"{position - 1}, but the last observed position is {self._last_pos}"
            )
        return self.draft(self._last)

    # ---- training
    def training_blocks(self, features, input_ids, loss_mask, anchors) -> TrainingBlocks:
        """features [B, L, H] (target final post-norm over whole sequences), input_ids /
        loss_mask [B, L], anchors [B, nb] = positions a of x_0. The heads read h_{a-1};
        slot j predicts x_{a+j} (labels x_{a+1..a+K}), the GRU reads x_a .. x_{a+K-1}."""
        b, length = input_ids.shape
        k, dev = self.num_slots, input_ids.device
        a = anchors.reshape(-1, 1)  # [N, 1]
        rows = torch.arange(b, device=dev).repeat_interleave(anchors.shape[1])[:, None]
        h = features[rows[:, 0], (a[:, 0] - 1).clamp(min=0)]  # [N, H]
        hidden = self.heads.hidden(h.to(self.heads[0][-1].weight.dtype))
        labels, prev = slot_targets(input_ids, loss_mask, anchors, k)
        # a == 0 has no h_{a-1}: such a block teaches nothing
        labels = torch.where(a >= 1, labels, torch.full_like(labels, -100))
        return TrainingBlocks(
            hidden=hidden,
            prev_emb=self.embed(prev),
            labels=labels,
            base_logits_fn=self.base_logits,  # [n, K, H] -> [n, K, V]; flattened rows: slot_base_logits
        )

    def backbone_parameters(self) -> list[nn.Parameter]:
        return list(self.heads.parameters())

    # ---- persistence
    def backbone_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.heads.state_dict())

    def native_config(self) -> dict:
        return self.cfg.to_native()


# ------------------------------------------------------------------ recipe -> drafter
def config_from_recipe(d, tshape) -> MedusaConfig:
    """From the checkpoint (drafter.path / drafter.config) or fresh from the recipe. Recipe
    settings that contradict a checkpoint are errors, never silently overridden; values the
    recipe did not set yield to the checkpoint's. Every problem is one line of the ValueError."""
    source = d.path or d.config
    problems = []
    if source is not None:
        field_name = "drafter.path" if d.path else "drafter.config"
        cfg = MedusaConfig.from_native(read_config_json(source, field_name), tshape, field_name)
        problems += checkpoint_conflicts(d, {"num_heads": cfg.num_heads, "num_layers": cfg.num_layers})
        for name, ours, target in (("hidden_size", cfg.hidden_size, tshape.hidden_size),
                                   ("vocab_size", cfg.vocab_size, tshape.vocab_size)):
            if ours != target:
                problems.append(f"{field_name}: the checkpoint's {name} {ours} != the target's {target}; Medusa heads "
                                "read the target's hidden state and share its vocabulary (heads for another target?)")
        if cfg.num_heads < 1 or cfg.num_layers < 1:
            problems.append(f"{field_name}: medusa_num_heads {cfg.num_heads}, medusa_num_layers {cfg.num_layers}; "
                            "valid: both >= 1")
    else:
        cfg = MedusaConfig(hidden_size=tshape.hidden_size, vocab_size=tshape.vocab_size,
                           num_heads=d.num_heads, num_layers=d.num_layers)
    if d.tree:  # the recipe's tree wins over one stored with the heads
        cfg.tree = [list(p) for p in d.tree]
    if cfg.tree:
        deepest = max(range(len(cfg.tree)), key=lambda n: len(cfg.tree[n]))
        if len(cfg.tree[deepest]) > cfg.num_heads:
            problems.append(f"drafter.tree[{deepest}]: {cfg.tree[deepest]} is {len(cfg.tree[deepest])} deep; valid: "
                            f"at most {cfg.num_heads} (one level per head: the drafter's num_heads)")
        widest = max(range(len(cfg.tree)), key=lambda n: max(cfg.tree[n], default=0))
        if max(cfg.tree[widest], default=0) >= cfg.vocab_size:
            problems.append(f"drafter.tree[{widest}]: rank {max(cfg.tree[widest])} is beyond the vocabulary; valid: "
                            f"ranks 0..{cfg.vocab_size - 1}")
    if problems:
        raise ValueError("\n".join(problems))
    return cfg


def recipe_values(d, tshape) -> dict:
    """The drafter fields a checkpoint decided, as built (recorded in a run's resolved recipe)."""
    if d.path is None and d.config is None:
        return {}
    cfg = config_from_recipe(d, tshape)
    return {"num_heads": cfg.num_heads, "num_layers": cfg.num_layers}


def plan(d, tshape):
    from ..plan import FamilyPlan, HookPoint

    cfg = config_from_recipe(d, tshape)
    k, h, v = cfg.num_heads, cfg.hidden_size, cfg.vocab_size
    tree = f", tree of {len(cfg.tree)} nodes (depth {max(map(len, cfg.tree))})" if cfg.tree else ", chain"
    return FamilyPlan(
        family="medusa",
        summary=f"Medusa-1 {k} heads × {cfg.num_layers} ResBlock(s), hidden {h}, vocab {v}{tree}",
        num_slots=k,
        hidden_dim=h,
        emb_dim=tshape.hidden_size,
        vocab_size=v,
        capture_layers=[-1],
        backbone_tensors=tensor_shapes(cfg),
        hooks=[
            HookPoint("hidden", "head i's ResBlock output on the target's final hidden state h_t", f"[B, {k}, {h}]"),
            HookPoint("base_logits", "head i's own LM head (slot j = i+1 predicts token t+2+i)", f"[B, {k}, {v}]"),
            HookPoint("embed", "target input embeddings of x_0..x_{K-1}", f"[B, {k}, {tshape.hidden_size}]"),
        ],
        source=d.path or f"fresh (seed {d.seed}; LM heads copied from the target)",
    )


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


def build(d, target):
    """-> (adapter, {}): Medusa checkpoints carry no Domino head (bundles keep it beside the
    drafter folder, domino_graft.export). Weights checked strictly."""
    from domino_graft.artifacts.tensors import check_tensors

    cfg = config_from_recipe(d, target.shape)
    if cfg.base_model_name_or_path is None:
        cfg.base_model_name_or_path = target.identity.get("name_or_path") or target.identity.get("path")
    torch.manual_seed(d.seed)  # the ResBlock biases keep nn.Linear's (seeded) default init
    adapter = MedusaAdapter(cfg, target)
    if d.path is not None:
        state, f = load_native_weights(d.path)
        check_tensors(state, tensor_shapes(cfg), source=str(f))
        adapter.heads.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    else:
        lm = target.model.get_output_embeddings().weight
        with torch.no_grad():
            for head in adapter.heads:
                head[-1].weight.copy_(lm)
    adapter.heads.to(device=target.device, dtype=target.dtype)
    return adapter, {}


def export_faster_decoding(adapter: MedusaAdapter, out_dir: str | Path, *, dtype: Optional[torch.dtype] = None) -> Path:
    """The heads alone in the FasterDecoding layout: config.json + medusa_lm_head.safetensors."""
    from domino_graft.artifacts.files import atomic_dir, atomic_write_json
    from domino_graft.artifacts.tensors import save_tensors

    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        state = {k: (v.to(dtype) if dtype is not None else v) for k, v in adapter.backbone_state_dict().items()}
        save_tensors(tmp / "medusa_lm_head.safetensors", state, {"format": "pt"})
        atomic_write_json(tmp / "config.json", adapter.native_config())
    return out_dir


def backbone_num_parameters(cfg: MedusaConfig) -> int:
    return sum(math.prod(s) for s in tensor_shapes(cfg).values())
