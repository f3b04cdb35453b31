"""The P-EAGLE drafter attached to a target (PEagleAdapter, the adapter contract of adapters/base.py)
and its training mask, and the recipe's drafter section turned into one: the config (from a
checkpoint or fresh), the plan from configs alone, and `build`. The drafter itself is model.py."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..base import (DraftBlock, DrafterAdapter, TrainingBlocks, checkpoint_conflicts, forget_rows,
                    placeholder_token_problems, ragged_allowed, read_config_json, slot_targets)
from .model import (FILL_MARGIN, VERIFIER_KEYS, PEagleBackbone, PEagleConfig, check_vocab_maps, from_native,
                    load_npy_maps, random_vocab_maps, tensor_shapes, to_native)
from .schema import CHECKPOINT_FIELDS


# ------------------------------------------------------------------------------ adapter
class PEagleAdapter(DrafterAdapter):
    family = "peagle"
    topology = "chain"
    one_pass = True
    ragged_batch = True  # rows at their own positions: one entry cache, a validity mask per row (_observe_ragged)
    admits_rows = True  # observe_prompts: new prompts into rows of a ragged batch in flight

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
        self._valid: Optional[torch.Tensor] = None  # ragged batches: [B, C] bool, row b owns committed entry c

    def observe(self, features, positions: torch.Tensor, ids: Optional[torch.Tensor] = None) -> None:
        """Entries pair g_q with x_{q+1}: each observed position completes the previous one's entry,
        and the last position's g waits for its token (the next observe's first id, or the anchor).
        positions [n] (one row), or [B, n] with -1 where an entry is not the row's (a ragged batch)."""
        if ids is None:
            raise ValueError("P-EAGLE observe(): token ids are required (an entry pairs the target's features with "
                             "the next token); the engine must call adapter.observe(features, positions, ids=...)")
        if positions.dim() == 2:
            return self._observe_ragged(features, positions, ids)
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

    def observe_prompts(self, features, positions: torch.Tensor, ids: torch.Tensor, rows: list[int]) -> None:
        """(adapters/base.py) The rows' committed entries leave the validity mask and their waiting entries
        become padding; the prompts are then paired inside themselves (g_q with x_{q+1}), as a first
        observe pairs a prompt, while every other row keeps its waiting g."""
        if self._valid is not None:
            self._valid = forget_rows(self._valid, rows)
        self._todo = [(t, f, forget_rows(p, rows)) for t, f, p in self._todo]
        self._observe_ragged(features, positions, ids, prompts=True)

    def _observe_ragged(self, features, positions: torch.Tensor, ids: torch.Tensor, prompts: bool = False) -> None:
        """The ragged batch's observe: each row's valid columns are a prefix (a right-padded prompt, or the
        entries a row kept of its block), paired as the solo observe pairs them; an entry a row does not
        own keeps position -1 (masked from every query but its own in `_propose_ragged`). prompts: the
        valid columns are prompts (`observe_prompts`), paired inside themselves."""
        if features is None or tuple(ids.shape) != tuple(positions.shape) or features.shape[:2] != ids.shape:
            raise RuntimeError(f"P-EAGLE observe(): ids {tuple(ids.shape)}, positions {tuple(positions.shape)} and "
                               f"features {None if features is None else tuple(features.shape[:2])} must match [B, n]")
        b, n = ids.shape
        if n == 0:
            return
        valid = positions >= 0
        count = valid.sum(1)  # each row's observed positions
        if self._last is None or prompts:  # the prompt: g_q pairs with x_{q+1} inside it
            toks, feats, pos = ids[:, 1:], features[:, :-1], torch.where(valid[:, 1:], positions[:, :-1], -1)
        else:  # the row's waiting g pairs with this observe's first id
            feats = torch.cat([self._last[0].to(features.dtype), features[:, :-1]], 1)
            pos = torch.where(valid, torch.cat([self._last[1][:, None], positions[:, :-1]], 1), -1)
            toks = ids
        if toks.shape[1]:
            self._todo.append((toks, feats, pos))
        rows = torch.arange(b, device=ids.device)
        at = (count - 1).clamp(min=0)
        g, g_pos = features[rows, at][:, None], positions[rows, at]
        if self._last is not None:  # a row that observed nothing keeps its waiting g
            keep = count == 0
            g = torch.where(keep[:, None, None], self._last[0].to(g.dtype), g)
            g_pos = torch.where(keep, self._last[1], g_pos)
        self._last = (g, g_pos)

    def _propose_ragged(self, anchor: torch.Tensor, position: torch.Tensor) -> DraftBlock:
        """The solo propose's one forward over [committed entries, new entries, anchor entry, masks], each
        row at its own positions: a query sees its row's committed and new entries and the block causally
        (a column the row does not own only by itself, so that no query is fully masked); the new entries
        join the cache under the validity mask, the block never does."""
        b, k, dev = anchor.shape[0], self.num_slots, anchor.device
        mask_id = torch.full((b, k - 1), self.cfg.mask_token_id, dtype=torch.long, device=dev)
        blk_ids = torch.cat([anchor[:, None].long(), mask_id], 1)
        g = self._last[0].to(self.backbone.mask_hidden.dtype)
        blk_feats = torch.cat([g, self.backbone.mask_hidden.expand(b, k - 1, -1)], 1)
        blk_pos = position.to(dev)[:, None] - 1 + torch.arange(k, device=dev)
        ids = torch.cat([t for t, _, _ in self._todo] + [blk_ids], 1)
        feats = torch.cat([f.to(g.dtype) for _, f, _ in self._todo] + [blk_feats], 1)
        new_pos = torch.cat([p.to(dev) for _, _, p in self._todo] + [blk_pos], 1)
        mine = new_pos >= 0
        t = ids.shape[1]
        if self._valid is None:
            self._valid = torch.zeros(b, 0, dtype=torch.bool, device=dev)
        mask = ragged_allowed(self._valid, mine)
        hidden, kvs = self.backbone(ids, feats, new_pos.clamp(min=0), self._past, mask)
        n_ctx = t - k
        if n_ctx:
            new = [(kk[:, :, :n_ctx], vv[:, :, :n_ctx]) for kk, vv in kvs]
            self._past = new if self._past is None else [
                (torch.cat([pk, nk], 2), torch.cat([pv, nv], 2)) for (pk, pv), (nk, nv) in zip(self._past, new)]
            self._valid = torch.cat([self._valid, mine[:, :n_ctx]], dim=1)
        self._todo = []
        slots = hidden[:, n_ctx:].contiguous()  # one matmul in the LM head (dflash/adapter.py `slot_hidden`)
        return DraftBlock(hidden=slots, base_logits=self.base_logits(slots))

    def context_length(self) -> int:
        return self._seen

    def propose(self, anchor: torch.Tensor, position) -> DraftBlock:
        """anchor [B] at `position`: an int (one row), or a [B] tensor (a ragged batch)."""
        if torch.is_tensor(position):
            if self._last is None:
                raise RuntimeError("P-EAGLE propose(): nothing observed yet; observe the prompt first")
            return self._propose_ragged(anchor, position)
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
        slots = hidden[:, n_ctx:].contiguous()  # one matmul in the LM head (dflash/adapter.py `slot_hidden`)
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
