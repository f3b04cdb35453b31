"""The toyheads adapter: the drafter contract of domino_graft.adapters.base, nothing more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from domino_graft.adapters.base import DraftBlock, DrafterAdapter, TrainingBlocks
from domino_graft.adapters.plan import FamilyPlan, HookPoint

WEIGHT = "slots"  # [K, H, 2H]: slot j's residual reads [h; E(x_0)]


def tensor_shapes(num_slots: int, hidden: int) -> dict[str, tuple[int, ...]]:
    return {WEIGHT: (num_slots, hidden, 2 * hidden)}


class ToyHeads(nn.Module):
    """The family's own weights (the contract's `backbone`); the target stays shared."""

    def __init__(self, num_slots: int, hidden: int):
        super().__init__()
        # zero: every slot starts as the target's own next-token guess from h (a weak but sane draft)
        self.slots = nn.Parameter(torch.zeros(num_slots, hidden, 2 * hidden))


class ToyHeadsAdapter(DrafterAdapter):
    family = "toyheads"

    def __init__(self, num_slots: int, target):
        super().__init__()
        h = target.shape.hidden_size
        self.backbone = ToyHeads(num_slots, h)
        object.__setattr__(self, "target", target)  # shared, not owned: out of our state_dict
        self.num_slots, self.hidden_dim, self.emb_dim = num_slots, h, h
        self.vocab_size = target.shape.vocab_size
        self._last: Optional[torch.Tensor] = None
        self._last_pos, self._seen = -1, 0

    def capture_layers(self) -> tuple[int, ...]:
        return (-1,)  # the target's final post-norm hidden state

    def _hidden(self, h: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """h [N, H], x0 [N] -> H_j for every slot [N, K, H]."""
        inp = torch.cat([h, self.embed(x0)], dim=-1).to(self.backbone.slots.dtype)
        return h[:, None].to(self.backbone.slots.dtype) + F.silu(torch.einsum("khi,ni->nkh", self.backbone.slots, inp))

    # ---- hook points
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(ids)

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(hidden)

    # ---- decoding
    def reset(self, batch_size: int) -> None:
        self._last, self._last_pos, self._seen = None, -1, 0

    def observe(self, features, positions, ids=None) -> None:
        if features is None or features.shape[1] == 0:
            return
        self._last, self._last_pos = features[:, -1], int(positions[-1])
        self._seen += int(positions.numel())

    def context_length(self) -> int:
        return self._seen

    def propose(self, anchor: torch.Tensor, position: int) -> DraftBlock:
        if self._last is None or self._last_pos != position - 1:
            raise RuntimeError(f"toyheads propose(anchor at {position}): needs the target state at {position - 1}, "
                               f"last observed {self._last_pos}")
        hidden = self._hidden(self._last, anchor)
        return DraftBlock(hidden=hidden, base_logits=self.base_logits(hidden))

    # ---- training
    def training_blocks(self, features, input_ids, loss_mask, anchors) -> TrainingBlocks:
        """Anchor a = the position of x_0: heads read h_{a-1} and x_a; slot j predicts x_{a+j}."""
        b, length = input_ids.shape
        k, dev = self.num_slots, input_ids.device
        a = anchors.reshape(-1, 1)
        rows = torch.arange(b, device=dev).repeat_interleave(anchors.shape[1])[:, None]
        hidden = self._hidden(features[rows[:, 0], (a[:, 0] - 1).clamp(min=0)], input_ids[rows[:, 0], a[:, 0]])
        lab_pos = (a + torch.arange(1, k + 1, device=dev)).clamp(max=length - 1)
        raw = a + torch.arange(1, k + 1, device=dev)
        keep = (raw < length) & loss_mask[rows, lab_pos].bool() & (a >= 1)
        labels = torch.where(keep, input_ids[rows, lab_pos], torch.full_like(lab_pos, -100))
        prev = input_ids[rows, (a + torch.arange(0, k, device=dev)).clamp(max=length - 1)]
        return TrainingBlocks(hidden=hidden, prev_emb=self.embed(prev), labels=labels,
                              base_logits_fn=self.base_logits)

    def backbone_parameters(self) -> list[nn.Parameter]:
        return list(self.backbone.parameters())

    # ---- persistence (the run dir's drafter/ and a bundle's drafter/ hold these)
    def backbone_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.backbone.state_dict())

    def native_config(self) -> dict:
        return {"architectures": ["ToyHeadsDrafter"], "num_slots": self.num_slots, "hidden_size": self.hidden_dim}


def _num_slots(d) -> int:
    if d.path is None:
        return d.num_slots
    cfg = json.loads((Path(d.path) / "config.json").read_text())
    return int(cfg["num_slots"])


def plan(d, tshape) -> FamilyPlan:
    k, h, v = _num_slots(d), tshape.hidden_size, tshape.vocab_size
    return FamilyPlan(
        family="toyheads", summary=f"ToyHeads {k} slots, hidden {h}", num_slots=k, hidden_dim=h, emb_dim=h,
        vocab_size=v, capture_layers=[-1], backbone_tensors=tensor_shapes(k, h),
        hooks=[HookPoint("hidden", "h + SiLU(W_j [h; E(x_0)])", f"[B, {k}, {h}]"),
               HookPoint("base_logits", "target lm_head(hidden)", f"[B, {k}, {v}]"),
               HookPoint("embed", "target input embeddings", f"[B, {k}, {h}]")],
        source=d.path or f"fresh (seed {d.seed})",
    )


def build(d, target):
    from domino_graft.artifacts.tensors import check_tensors, load_tensors

    adapter = ToyHeadsAdapter(_num_slots(d), target)
    if d.path is not None:
        state = load_tensors(Path(d.path) / "model.safetensors")
        check_tensors(state, tensor_shapes(adapter.num_slots, adapter.hidden_dim), source=f"{d.path}/model.safetensors")
        adapter.backbone.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    adapter.to(device=target.device, dtype=target.dtype)
    return adapter, {}
