"""The DFlash drafter attached to a target (DFlashAdapter, the adapter contract of adapters/base.py),
and the recipe's drafter section turned into one: its config (from a checkpoint or fresh), the
plan from configs alone, and `build`. The drafter itself is model.py."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..base import (DraftBlock, DrafterAdapter, TrainingBlocks, checkpoint_conflicts, forget_rows,
                    placeholder_token_problems, read_config_json, slot_targets)
from .model import (HEAD_KEYS_PREFIXES, ContextCache, DFlashBackbone, DFlashConfig, backbone_tensor_shapes,
                    default_target_layer_ids, domino_head_fields)


# ------------------------------------------------------------------------------ adapter
class DFlashAdapter(DrafterAdapter):
    family = "dflash"
    topology = "chain"
    one_pass = True
    ragged_batch = True
    admits_rows = True  # observe_prompts (eager; the static batched drafter admits rows itself)

    def __init__(self, cfg: DFlashConfig, target):
        super().__init__()
        if cfg.hidden_size != target.shape.hidden_size:
            raise ValueError(
                f"drafter hidden_size {cfg.hidden_size} != target hidden_size {target.shape.hidden_size}: "
                "DFlash reuses the target's embeddings and LM head, so they must match"
            )
        if cfg.vocab_size != target.shape.vocab_size:
            raise ValueError(f"drafter vocab_size {cfg.vocab_size} != target vocab_size {target.shape.vocab_size}")
        for lid in cfg.target_layer_ids:
            if not -1 <= lid < target.shape.num_layers:
                raise ValueError(
                    f"drafter.target_layer_ids: {lid} is out of range; valid: 0..{target.shape.num_layers - 1} or -1"
                )
        self.cfg = cfg
        self.backbone = DFlashBackbone(cfg)
        # The target is shared, not owned: keep it out of this module's state_dict.
        object.__setattr__(self, "target", target)
        self.num_slots = cfg.block_size - 1
        self.hidden_dim = cfg.hidden_size
        self.emb_dim = target.shape.hidden_size
        self.vocab_size = cfg.vocab_size
        self._cache: Optional[ContextCache] = None
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def reserved_token_ids(self) -> frozenset[int]:
        return frozenset({self.cfg.mask_token_id})

    def capture_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.target_layer_ids)

    # ---- hook points
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(ids)

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(hidden)

    def slot_hidden(self, block_hidden: torch.Tensor) -> torch.Tensor:
        """Block positions -> per-slot hidden H_1..H_K (the slot/label convention), contiguous: the [B, K, H]
        slice of a [B, block, H] block is not (for B > 1), and torch runs a linear over such an input as a
        batched matmul against the weight broadcast over B, which reads the whole LM head once per row of
        the batch (on the H100 at 45d49fd: 0.97 ms of the batched chain's 4.8 ms step at B = 64; one matmul
        over the B·K rows reads it once)."""
        k = self.num_slots
        return (block_hidden[:, :k] if self.cfg.shift_label else block_hidden[:, 1 : k + 1]).contiguous()

    # ---- decoding
    def reset(self, batch_size: int) -> None:
        self._cache = None
        self._pending = []

    def observe(self, features: torch.Tensor, positions: torch.Tensor, ids: Optional[torch.Tensor] = None) -> None:
        self._pending.append((features, positions))

    def observe_prompts(self, features, positions: torch.Tensor, ids: Optional[torch.Tensor], rows: list[int]) -> None:
        """(adapters/base.py) The rows' context entries, cached and pending, become padding (-1: never
        attended); the prompts then come in as any ragged observe."""
        if self._cache is not None:
            c = self._cache
            self._cache = ContextCache(c.k, c.v, forget_rows(c.positions, rows))
        self._pending = [(f, forget_rows(p, rows)) for f, p in self._pending]
        self.observe(features, positions, ids)

    def context_length(self) -> int:
        n = 0 if self._cache is None else int(self._cache.positions.numel())
        return n + sum(int(p.numel()) for _, p in self._pending)

    def _flush_context(self) -> ContextCache:
        if self._pending:
            feats = torch.cat([f for f, _ in self._pending], dim=1)
            pos = torch.cat([p for _, p in self._pending], dim=-1)
            new = self.backbone.context_kv(feats, pos)
            if self._cache is None:
                self._cache = ContextCache([k for k, _ in new], [v for _, v in new], pos)
            else:
                c = self._cache
                self._cache = ContextCache(
                    [torch.cat([a, k], dim=2) for a, (k, _) in zip(c.k, new)],
                    [torch.cat([a, v], dim=2) for a, (_, v) in zip(c.v, new)],
                    torch.cat([c.positions, pos], dim=-1),
                )
            self._pending = []
        if self._cache is None:
            raise RuntimeError("DFlash propose() before any observe(): the drafter needs verified context")
        return self._cache

    def static_drafter(self, max_len: int):
        """The static-cache, graphed drafter (fast.py), kept between decodes while it has room
        (its captured graphs are reused) and the weights' device and dtype are unchanged."""
        from domino_graft.fast import round_up_pow2

        from .fast import StaticDFlashDrafter

        w = self.backbone.fc.weight
        cur = getattr(self, "_static_drafter", None)
        if cur is None or cur.max_len < max_len or (cur.device, cur.dtype) != (w.device, w.dtype):
            cur = StaticDFlashDrafter(self, round_up_pow2(max_len))
            if cur.device.type == "cuda":
                # the Triton attention kernels + compiled pieces under the graphs: 0.25 vs 0.92 ms a
                # block (eager math) at the shipped SmolLM2 drafter's shape, 1.10 vs 2.34 ms at
                # Qwen3-8B's (bench/results/engine_h200.json). The compiled eager-kernel variant
                # compiled once per attention bucket and did not pay end to end (docs/results.md §6);
                # this one compiles once per block shape.
                from domino_graft.fast import UnsupportedModel

                try:
                    cur.use_kernels("triton").compile()
                except UnsupportedModel:  # head size / sliding windows: eager math in the graphs
                    pass
            object.__setattr__(self, "_static_drafter", cur)  # not a submodule: no state_dict entry
        return cur

    def static_batch_drafter(self, max_len: int, batch: int):
        """The static drafter with `batch` rows for ragged batches (decoding/batched.py, beside the
        target's static ragged cache), or None where it would not be this adapter's propose (a
        subclass that changes propose, e.g. DSpark's Markov head). Kept apart from the solo one
        (as the target's ragged cache is from its solo cache) and, like the target's StaticSession, from
        64 positions up and grown to the larger of each, so that a big CPU batch of short decodes
        (the chi-square tests' 9,000 rows) keeps its cache small."""
        from domino_graft.fast import round_up_pow2

        from .fast import StaticDFlashDrafter

        if type(self).propose is not DFlashAdapter.propose:
            return None
        w = self.backbone.fc.weight
        cur = getattr(self, "_static_batch_drafter", None)
        if cur is not None and (cur.device, cur.dtype) != (w.device, w.dtype):
            cur = None
        if cur is None or cur.max_len < max_len or cur.max_batch < batch:
            if cur is not None:
                max_len, batch = max(max_len, cur.max_len), max(batch, cur.max_batch)
            cur = StaticDFlashDrafter(self, round_up_pow2(max_len, 64), max_batch=batch)
            if cur.device.type == "cuda":  # as static_drafter: the Triton kernels where they serve
                from domino_graft.fast import UnsupportedModel

                try:
                    cur.use_kernels("triton").compile()
                except UnsupportedModel:
                    pass
            object.__setattr__(self, "_static_batch_drafter", cur)
        return cur

    def block_ids(self, anchor: torch.Tensor) -> torch.Tensor:
        b = anchor.shape[0]
        ids = torch.full((b, self.cfg.block_size), self.cfg.mask_token_id, dtype=torch.long, device=anchor.device)
        ids[:, 0] = anchor
        return ids

    def propose(self, anchor: torch.Tensor, position: int) -> DraftBlock:
        cache = self._flush_context()
        ids = self.block_ids(anchor)
        bs = self.cfg.block_size
        pos = torch.arange(bs, device=anchor.device) + (position[:, None] if torch.is_tensor(position) else position)
        allowed = None
        if cache.positions.ndim == 2:  # a ragged batch: padding (negative positions) is never attended
            b, c = ids.shape[0], cache.positions.shape[-1]
            allowed = torch.cat([(cache.positions >= 0)[:, None, :].expand(b, bs, c),
                                 torch.ones(b, bs, bs, dtype=torch.bool, device=anchor.device)], dim=-1)
        hidden = self.backbone(self.embed(ids), pos, list(zip(cache.k, cache.v)), cache.positions, allowed)
        slots = self.slot_hidden(hidden)
        return DraftBlock(hidden=slots, base_logits=self.base_logits(slots))

    # ---- training
    def training_blocks(self, features, input_ids, loss_mask, anchors) -> TrainingBlocks:
        """features [B, L, n·H] (target capture over whole sequences), input_ids/loss_mask [B, L],
        anchors [B, nb] (positions a; context is < a). Ground-truth previous tokens feed the GRU."""
        cfg = self.cfg
        b, length = input_ids.shape
        nb, bs = anchors.shape[1], cfg.block_size
        dev = input_ids.device
        offs = torch.arange(bs, device=dev)
        block_pos = (anchors[:, :, None] + offs).reshape(b, nb * bs)  # [B, nb·bs]
        ids = torch.full((b, nb, bs), cfg.mask_token_id, dtype=torch.long, device=dev)
        ids[:, :, 0] = torch.gather(input_ids, 1, anchors)
        ctx_pos = torch.arange(length, device=dev)
        kv_ctx = self.backbone.context_kv(features, ctx_pos)
        # block b's queries see context strictly before its anchor, and their own block
        blk = torch.arange(nb, device=dev).repeat_interleave(bs)
        sees_ctx = ctx_pos[None, None, :] < anchors.repeat_interleave(bs, dim=1)[:, :, None]
        sees_blk = (blk[:, None] == blk[None, :]).expand(b, -1, -1)
        allowed = torch.cat([sees_ctx, sees_blk], dim=-1)
        hidden = self.backbone(self.embed(ids.reshape(b, nb * bs)), block_pos, kv_ctx, ctx_pos, allowed)
        hidden = hidden.view(b * nb, bs, -1)
        k = bs if cfg.shift_label else bs - 1
        slots = hidden[:, :k] if cfg.shift_label else hidden[:, 1:]
        # slot j (1..k) predicts x_{a+j}; the GRU reads x_{a}..x_{a+k-1}
        labels, prev = slot_targets(input_ids, loss_mask, anchors, k)
        return TrainingBlocks(
            hidden=slots,
            prev_emb=self.embed(prev),
            labels=labels,
            base_logits_fn=self.base_logits,
        )

    def backbone_parameters(self) -> list[nn.Parameter]:
        return list(self.backbone.parameters())

    # ---- persistence
    def backbone_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.backbone.state_dict().items()}

    def native_config(self) -> dict:
        return self.cfg.to_native()


# ------------------------------------------------------------------ recipe -> drafter
def config_from_recipe(d, tshape) -> DFlashConfig:
    """The drafter's config: from its checkpoint (drafter.path / drafter.config) or fresh
    from recipe settings and the target's shape. Explicit recipe settings that contradict
    a checkpoint are errors, never silently overridden; values the recipe did not set yield
    to the checkpoint's. Every problem is one line of the ValueError raised."""
    source = d.path or d.config
    problems = []
    if source is not None:
        field_name = "drafter.path" if d.path else "drafter.config"
        cfg = DFlashConfig.from_native(read_config_json(source, field_name))
        # None = "the default", never a contradiction (a run's resolved recipe lists every field)
        problems += checkpoint_conflicts(d, {**{name: getattr(cfg, name) for name in (
            "block_size", "target_layer_ids", "mask_token_id", "shift_label")}, "num_layers": cfg.num_hidden_layers})
        if cfg.num_target_layers in (0, None):
            cfg.num_target_layers = tshape.num_layers
        for name, ours, theirs in (("hidden_size", cfg.hidden_size, tshape.hidden_size),
                                   ("vocab_size", cfg.vocab_size, tshape.vocab_size)):
            if ours != theirs:
                problems.append(f"{field_name}: the checkpoint's {name} {ours} != the target's {theirs}; DFlash reuses "
                                "the target's embeddings and LM head, so they must match (a drafter for another target?)")
        if cfg.block_size < 2:
            problems.append(f"{field_name}: the checkpoint's block_size {cfg.block_size} is invalid; valid: >= 2")
        ids_from = " (from the checkpoint's config)"
    else:
        ids = d.target_layer_ids or default_target_layer_ids(tshape.num_layers, d.num_layers)
        cfg = DFlashConfig(
            hidden_size=tshape.hidden_size,
            num_hidden_layers=d.num_layers,
            num_attention_heads=tshape.num_heads,
            num_key_value_heads=tshape.num_kv_heads,
            head_dim=tshape.head_dim,
            intermediate_size=d.intermediate_size or tshape.intermediate_size,
            vocab_size=tshape.vocab_size,
            num_target_layers=tshape.num_layers,
            target_layer_ids=list(ids),
            mask_token_id=d.mask_token_id if d.mask_token_id is not None else tshape.vocab_size - 1,
            block_size=d.block_size,
            shift_label=d.shift_label,
            rms_norm_eps=tshape.rms_norm_eps,
            rope_theta=tshape.rope_theta,
            max_position_embeddings=tshape.max_position_embeddings,
        )
        ids_from = "" if d.target_layer_ids else (
            f" (the default spread for {d.num_layers} drafter layer(s); set drafter.target_layer_ids)")
    n = tshape.num_layers
    ids = cfg.target_layer_ids
    bad = [i for i in ids if not -1 <= i < n]
    if bad:
        problems.append(f"drafter.target_layer_ids: {bad[0]} in {ids} is out of range{ids_from}; valid: 0..{n - 1} "
                        f"(0-based outputs of the target's {n} decoder layers) or -1 (the final norm)")
    elif len(set(ids)) != len(ids):
        problems.append(f"drafter.target_layer_ids: {ids} lists a layer twice{ids_from}; valid: distinct ids in "
                        f"0..{n - 1} or -1")
    problems += placeholder_token_problems("mask_token_id", cfg.mask_token_id, tshape.vocab_size, tshape.eos_token_ids)
    if problems:
        raise ValueError("\n".join(problems))
    return cfg


def recipe_values(d, tshape) -> dict:
    """The drafter fields a checkpoint decided, as built (graft.effective_recipe records them in a
    run's resolved recipe, so that reloading it never finds a schema default in conflict)."""
    if d.path is None and d.config is None:
        return {}
    cfg = config_from_recipe(d, tshape)
    return {"block_size": cfg.block_size, "num_layers": cfg.num_hidden_layers,
            "target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
            "shift_label": cfg.shift_label}


def plan(d, tshape):
    from ..plan import FamilyPlan, HookPoint

    cfg = config_from_recipe(d, tshape)
    k = cfg.block_size - 1
    h = cfg.hidden_size
    where = "positions 0..K-1 (shift_label)" if cfg.shift_label else "positions 1..K"
    return FamilyPlan(
        family="dflash",
        summary=(
            f"DFlash {cfg.num_hidden_layers} layer(s), hidden {h}, block {cfg.block_size}, "
            f"mask id {cfg.mask_token_id}, shift_label {cfg.shift_label}, capture {cfg.target_layer_ids}"
        ),
        num_slots=k,
        hidden_dim=h,
        emb_dim=tshape.hidden_size,
        vocab_size=cfg.vocab_size,
        capture_layers=list(cfg.target_layer_ids),
        backbone_tensors=backbone_tensor_shapes(cfg),
        hooks=[
            HookPoint("hidden", f"drafter norm output, block {where}", f"[B, {k}, {h}]"),
            HookPoint("base_logits", "target lm_head(hidden)", f"[B, {k}, {cfg.vocab_size}]"),
            HookPoint("embed", "target input embeddings of x_0..x_{K-1}", f"[B, {k}, {tshape.hidden_size}]"),
        ],
        source=d.path or f"fresh (seed {d.seed})",
    )


def checkpoint_head_fields(d) -> dict:
    """The Domino head declared by the checkpoint at drafter.path (from its config alone)."""
    if d.path is None:
        return {}
    return domino_head_fields(read_config_json(d.path, "drafter.path"), f"{d.path}/config.json")


def build(d, target):
    """-> (adapter, head tensors found in the checkpoint). Weights are checked strictly."""
    from pathlib import Path

    from domino_graft.artifacts.files import CheckpointError
    from domino_graft.artifacts.tensors import check_tensors, load_tensors

    cfg = config_from_recipe(d, target.shape)
    adapter = DFlashAdapter(cfg, target)
    head_tensors: dict = {}
    if d.path is not None:
        weights = Path(d.path) / "model.safetensors"
        state = load_tensors(weights)
        state = {k.removeprefix("model."): v for k, v in state.items()}
        head_tensors = {k: v for k, v in state.items() if k.startswith(HEAD_KEYS_PREFIXES)}
        backbone = {k: v for k, v in state.items() if not k.startswith(HEAD_KEYS_PREFIXES)}
        check_tensors(backbone, backbone_tensor_shapes(cfg), source=str(weights))
        adapter.backbone.load_state_dict(backbone, strict=True)
        # graft.build_head reads this: a declared head must be loaded whole (even when its
        # tensors are all missing), and its G, r, pure prefix override recipe defaults.
        adapter.checkpoint_head_fields = checkpoint_head_fields(d)
        if head_tensors and not adapter.checkpoint_head_fields:
            raise CheckpointError(
                f"{weights}: tensor {sorted(head_tensors)[0]!r} belongs to a Domino head but config.json does not "
                "declare one (dflash_config.projector_type must be 'domino', with gru_hidden_dim, emb_dim, "
                "pure_draft_prefix_len)"
            )
    else:
        adapter.backbone.init_weights(d.seed)
    adapter.backbone.to(device=target.device, dtype=target.dtype)
    return adapter, head_tensors
