"""Medusa-1 heads attached to the target (MedusaAdapter, the adapter contract of adapters/base.py), and the
recipe's drafter section turned into them: the config (from a checkpoint or fresh), the plan from
configs alone, `build`, and the FasterDecoding export. The heads themselves are model.py."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..base import DraftBlock, DrafterAdapter, TrainingBlocks, checkpoint_conflicts, read_config_json, slot_targets
from .model import MedusaConfig, MedusaHeads, load_native_weights, tensor_shapes


# ------------------------------------------------------------------------------ adapter
class MedusaAdapter(DrafterAdapter):
    family = "medusa"
    one_pass = True  # all K heads read one hidden state: one (tiny) backbone forward
    ragged_batch = True
    admits_rows = True  # observe_prompts: only the newest state is read, so a prompt's replaces a row's

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

    def observe_prompts(self, features, positions: torch.Tensor, ids: Optional[torch.Tensor], rows: list[int]) -> None:
        """(adapters/base.py) Medusa reads a row's newest state only: the prompts' last states replace the
        rows' (a ragged observe keeps every row given padding only)."""
        self.observe(features, positions, ids)

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
        # one row: the heads must read h_{position-1}. A ragged batch is not checked: its rows that do not
        # decode (ended, or a prompt still coming in chunks: serving/batch.py) keep a stale state by design,
        # and the check would cost a device->host sync a step
        if not torch.is_tensor(position) and self._last_pos != position - 1:
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
