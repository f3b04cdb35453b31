"""The DSpark drafter attached to a target (DSparkAdapter: DFlash's adapter with the Markov chain
drafted inside `propose`), and the recipe's drafter section turned into one: the config (from a
checkpoint or fresh), the plan from configs alone, and `build`. The drafter itself is model.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from ..base import DraftBlock, TrainingBlocks, checkpoint_conflicts, read_config_json
from ..dflash import adapter as dflash
from ..dflash.adapter import DFlashAdapter
from ..dflash.model import DFlashConfig
from .model import (VERIFIER_KEYS, ConfidenceHead, DSparkBackbone, DSparkConfig, MarkovHead, from_native, tensor_shapes,
                    to_native)
from .schema import CHECKPOINT_FIELDS


# ------------------------------------------------------------------------------ adapter
class DSparkAdapter(DFlashAdapter):
    family = "dspark"

    def __init__(self, cfg: DFlashConfig, mcfg: DSparkConfig, target, graft: str = "on_top"):
        super().__init__(cfg, target)
        self.mcfg, self.graft = mcfg, graft
        self.num_slots = cfg.block_size if mcfg.sample_from_anchor else cfg.block_size - 1
        h, r = cfg.hidden_size, mcfg.markov_rank
        self.backbone = DSparkBackbone(cfg, mcfg)
        # on_top: DSpark's own corrected logits are the base, its Markov feature part of H'_j
        self.uses_markov = self.markov_head is not None and graft == "on_top"
        self.hidden_dim = h + r if self.uses_markov else h

    @property
    def markov_head(self) -> Optional[MarkovHead]:
        return self.backbone.markov_head

    @property
    def confidence_head(self) -> Optional[ConfidenceHead]:
        return self.backbone.confidence_head

    # ---- hook points
    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[.., H] -> the DFlash logits; [.., H + r] = [H_j ; m_j] -> DSpark's, lm_head(H_j) + markov_w2(m_j)."""
        h = self.cfg.hidden_size
        if hidden.shape[-1] == h:
            return self.target.lm_head(hidden)
        return self.target.lm_head(hidden[..., :h]) + self.markov_head.markov_w2(hidden[..., h:])

    def markov_chain(self, hidden: torch.Tensor, anchor: torch.Tensor, logits: Optional[torch.Tensor] = None):
        """DSpark's greedy drafting over a block: hidden [N, K, H] (+ its DFlash logits [N, K, V],
        else computed slot by slot), anchor [N] = x_0 -> (H' [N, K, H + r], base logits [N, K, V],
        drafts [N, K]). Slot j's Markov feature reads the draft of slot j-1 (slot 1: x_0)."""
        mh = self.markov_head
        state = mh.init_state(hidden.shape[0], mh.markov_w2.weight)
        prev, feats, out, drafts = anchor, [], [], []
        for j in range(hidden.shape[1]):
            m, state = mh.feature(prev, hidden[:, j], state)
            lj = self.target.lm_head(hidden[:, j]) if logits is None else logits[:, j]
            lj = lj + mh.markov_w2(m).to(lj.dtype)
            prev = lj.argmax(-1)
            feats.append(m)
            out.append(lj)
            drafts.append(prev)
        return (torch.cat([hidden, torch.stack(feats, 1).to(hidden.dtype)], dim=-1), torch.stack(out, 1),
                torch.stack(drafts, 1))

    # ---- decoding
    def static_drafter(self, max_len: int):
        return None  # DFlash's graphed drafter knows no Markov head: propose eagerly

    def propose(self, anchor: torch.Tensor, position) -> DraftBlock:
        block = super().propose(anchor, position)  # H_j and lm_head(H_j) (base_logits above, at dim H)
        if not self.uses_markov:
            return block
        hidden, base, _ = self.markov_chain(block.hidden, anchor, block.base_logits)
        return DraftBlock(hidden=hidden, base_logits=base)

    # ---- training
    def training_blocks(self, features, input_ids, loss_mask, anchors) -> TrainingBlocks:
        tb = super().training_blocks(features, input_ids, loss_mask, anchors)
        if not self.uses_markov:
            return tb
        hidden = tb.hidden
        x0 = torch.gather(input_ids, 1, anchors).reshape(-1)
        with torch.no_grad():  # the chain decoding would draft from these blocks (docstring above)
            _, _, drafts = self.markov_chain(hidden.detach(), x0)
        prev = torch.cat([x0[:, None], drafts[:, :-1]], dim=1)
        m = self.markov_head.features(prev, hidden)
        tb.hidden = torch.cat([hidden, m.to(hidden.dtype)], dim=-1)
        return tb

    # backbone_parameters / backbone_state_dict: DFlash's, over DSparkBackbone (Markov and confidence
    # heads included). The confidence head gets no gradient here (DSpark trains it with a BCE on the
    # acceptance rate, not a per-slot CE), and in_place leaves the Markov head without one.

    def native_config(self) -> dict:
        return to_native(self.cfg, self.mcfg, self.target.shape.architecture, self.target)


# ------------------------------------------------------------------ recipe -> drafter
def config_from_recipe(d, tshape) -> tuple[DFlashConfig, DSparkConfig]:
    """From the checkpoint (drafter.path / drafter.config) or fresh from the recipe; a recipe value
    that contradicts the checkpoint is an error naming both (every problem one line)."""
    source = d.path or d.config
    if source is None:
        shim = SimpleNamespace(path=None, config=None, block_size=d.block_size, num_layers=d.num_layers,
                               target_layer_ids=d.target_layer_ids, mask_token_id=d.mask_token_id,
                               shift_label=d.sample_from_anchor, intermediate_size=d.intermediate_size,
                               model_fields_set=set())
        cfg = dflash.config_from_recipe(shim, tshape)  # DFlash's checks: layer ids, mask id
        mcfg = DSparkConfig(sample_from_anchor=d.sample_from_anchor, markov_rank=d.markov_rank,
                            markov_head_type=d.markov_head_type, enable_confidence_head=d.enable_confidence_head,
                            confidence_head_with_markov=d.confidence_head_with_markov)
        return cfg, mcfg
    field_name = "drafter.path" if d.path else "drafter.config"
    cfg, mcfg = from_native(read_config_json(source, field_name), f"{source}/config.json")
    cfg.num_target_layers = tshape.num_layers
    ours = _values(cfg, mcfg)
    problems = []
    problems += checkpoint_conflicts(d, {name: ours[name] for name in CHECKPOINT_FIELDS})
    for name, mine, theirs in (("hidden_size", cfg.hidden_size, tshape.hidden_size),
                               ("vocab_size", cfg.vocab_size, tshape.vocab_size)):
        if mine != theirs:
            problems.append(f"{field_name}: the checkpoint's {name} {mine} != the target's {theirs}; DSpark reuses "
                            "the target's embeddings and LM head, so they must match (a drafter for another target?)")
    n = tshape.num_layers
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < n]
    if bad:
        problems.append(f"{field_name}: aux_hidden_state_layer_ids {[i + 1 for i in cfg.target_layer_ids]} name "
                        f"layer output {bad[0]}, outside the target's {n} layers; valid ids: 1..{n}")
    if not 0 <= cfg.mask_token_id < tshape.vocab_size:
        problems.append(f"{field_name}: mask_token_id {cfg.mask_token_id} is outside the target vocabulary "
                        f"(0..{tshape.vocab_size - 1})")
    if problems:
        raise ValueError("\n".join(problems))
    return cfg, mcfg


def _values(cfg: DFlashConfig, mcfg: DSparkConfig) -> dict:
    return {"block_size": cfg.block_size, "num_layers": cfg.num_hidden_layers,
            "target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
            "sample_from_anchor": mcfg.sample_from_anchor, "markov_rank": mcfg.markov_rank,
            "markov_head_type": mcfg.markov_head_type, "enable_confidence_head": mcfg.enable_confidence_head,
            "confidence_head_with_markov": mcfg.confidence_head_with_markov}


def recipe_values(d, tshape) -> dict:
    """The drafter fields a checkpoint decided, as built (recorded in a run's resolved recipe)."""
    if d.path is None and d.config is None:
        return {}
    return _values(*config_from_recipe(d, tshape))


def plan(d, tshape):
    from ..plan import FamilyPlan, HookPoint

    cfg, mcfg = config_from_recipe(d, tshape)
    k = cfg.block_size if mcfg.sample_from_anchor else cfg.block_size - 1
    h, r, v = cfg.hidden_size, mcfg.markov_rank, cfg.vocab_size
    markov = r > 0 and d.graft == "on_top"
    dh = h + r if markov else h
    return FamilyPlan(
        family="dspark",
        summary=(f"DSpark {cfg.num_hidden_layers} layer(s), hidden {h}, block {cfg.block_size}, mask id "
                 f"{cfg.mask_token_id}, sample_from_anchor {mcfg.sample_from_anchor}, capture {cfg.target_layer_ids}, "
                 f"Markov {mcfg.markov_head_type} rank {r}, confidence head {mcfg.enable_confidence_head}; "
                 f"Domino {d.graft.replace('_', ' ')} of the Markov head"),
        num_slots=k,
        hidden_dim=dh,
        emb_dim=tshape.hidden_size,
        vocab_size=v,
        capture_layers=list(cfg.target_layer_ids),
        backbone_tensors=tensor_shapes(cfg, mcfg),
        hooks=[
            HookPoint("hidden", "[drafter norm output ; Markov feature m_j]" if markov else "drafter norm output",
                      f"[B, {k}, {dh}]"),
            HookPoint("base_logits", "lm_head(H_j) + markov_w2(m_j), DSpark's greedy chain" if markov
                      else "target lm_head(hidden) (Markov head unused)", f"[B, {k}, {v}]"),
            HookPoint("embed", "target input embeddings of x_0..x_{K-1}", f"[B, {k}, {tshape.hidden_size}]"),
        ],
        source=d.path or f"fresh (seed {d.seed})",
    )


def build(d, target):
    """-> (adapter, {}) : a DSpark checkpoint holds no Domino head (bundles keep it in head.safetensors)."""
    from pathlib import Path

    from domino_graft.artifacts.tensors import check_tensors, load_tensors

    cfg, mcfg = config_from_recipe(d, target.shape)
    adapter = DSparkAdapter(cfg, mcfg, target, d.graft)
    if d.path is not None:
        weights = Path(d.path) / "model.safetensors"
        state = {k.removeprefix("model."): v for k, v in load_tensors(weights).items()}
        state = {k: v for k, v in state.items() if k not in VERIFIER_KEYS}
        check_tensors(state, tensor_shapes(cfg, mcfg), source=str(weights))
        adapter.backbone.load_state_dict(state, strict=True)
    else:
        adapter.backbone.init_weights(d.seed)
    adapter.backbone.to(device=target.device, dtype=target.dtype)
    return adapter, {}
