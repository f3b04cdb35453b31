"""The PARD drafter attached to a target (PardAdapter, the adapter contract of adapters/base.py), and the
recipe's drafter section turned into one: the plan from configs alone and `build`. The drafter's
configs, tensors and weights are model.py."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ..base import DraftBlock, DrafterAdapter, TrainingBlocks, forget_rows, ragged_allowed, slot_targets
from .model import SLOTS_KEY, load_folder_state, resolve, tensor_shapes, tied_aliases, untie
from .vocab import fit_vocab


def recipe_values(d, tshape) -> dict:
    """The drafter fields a checkpoint decided, as built (recorded in a run's resolved recipe, so
    that reloading the run never finds a schema default in conflict with the checkpoint)."""
    if d.path is None:
        return {}
    cfg, _, num_slots, _ = resolve(d, tshape)
    values = {"num_slots": num_slots}
    if d.random is None:
        values["num_layers"] = cfg.get_text_config().num_hidden_layers
    return values


# ------------------------------------------------------------------------------ adapter
class PardAdapter(DrafterAdapter):
    family = "pard"
    topology = "chain"
    one_pass = True

    def __init__(self, model: nn.Module, pard_token_id: int, num_slots: int, target):
        super().__init__()
        # `backbone`: the name trainers and exporters use for a family's own trainable weights
        self.backbone = model
        object.__setattr__(self, "target", target)  # shared, not owned
        text = model.config.get_text_config()
        self.pard_token_id = pard_token_id
        self.num_slots = num_slots
        self.hidden_dim = text.hidden_size
        self.emb_dim = model.get_input_embeddings().weight.shape[1]
        self.vocab_size = target.shape.vocab_size  # logits live in the target's vocabulary
        self.drafter_vocab_size = text.vocab_size
        params = inspect.signature(self._decoder.forward).parameters
        # transformers >= 5.x renamed past_key_values -> cache (the GPU image runs an older 5.x)
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._cache = None
        self._ctx = 0  # positions in the cache: always the verified prefix 0.._ctx-1
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def model(self) -> nn.Module:
        """The drafter: a Hugging Face causal LM."""
        return self.backbone

    @property
    def _decoder(self) -> nn.Module:
        # a property, not an attribute: a second registration would duplicate every weight
        # in state_dict()
        m = self.backbone
        return m.get_decoder() if hasattr(m, "get_decoder") else m.model

    def reserved_token_ids(self) -> frozenset[int]:
        return frozenset({self.pard_token_id})

    def capture_layers(self) -> tuple[int, ...]:
        return ()  # PARD reads tokens, never the target's hidden states

    # ---- hook points
    def known(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids the drafter's smaller vocabulary lacks read as the pard token (a "don't
        know" input: drafts may suffer, verification keeps the output exact). No-op when the
        drafter's vocabulary covers the target's."""
        if self.drafter_vocab_size >= self.vocab_size:
            return ids
        return torch.where(ids < self.drafter_vocab_size, ids, torch.full_like(ids, self.pard_token_id))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(self.known(ids))

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.get_output_embeddings()(hidden)
        cap = getattr(self.model.config.get_text_config(), "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return fit_vocab(logits, self.vocab_size)

    def _hidden(self, ids, positions, *, cache=None, mask=None) -> torch.Tensor:
        kwargs = {self._cache_kw: cache, "use_cache": cache is not None}
        out = self._decoder(input_ids=ids, position_ids=positions, attention_mask=mask, **kwargs)
        return out.last_hidden_state

    # ---- decoding
    @property
    def ragged_batch(self) -> bool:
        """Ragged batches (adapters/base.py): rows share one DynamicCache of the drafter's LM, each row
        owning the entries a validity mask marks (`_propose_ragged`); not with sliding-window layers,
        whose cache keeps only a window for every row alike."""
        cfg = self.model.config.get_text_config()
        layer_types = getattr(cfg, "layer_types", None) or ()
        return not (any("sliding" in str(t) for t in layer_types)
                    or (getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None)))

    @property
    def admits_rows(self) -> bool:
        """New prompts into rows of a ragged batch in flight (`observe_prompts`): wherever it batches."""
        return self.ragged_batch

    def observe_prompts(self, features, positions: torch.Tensor, ids: torch.Tensor, rows: list[int]) -> None:
        """(adapters/base.py) The rows' cache entries leave the validity mask and their pending entries
        become padding; the prompts then come in as any ragged observe, each at its own positions from 0."""
        if self._valid is not None:
            self._valid = forget_rows(self._valid, rows)
        self._pending = [(i, forget_rows(p, rows)) for i, p in self._pending]
        self.observe(features, positions, ids)

    def reset(self, batch_size: int) -> None:
        from transformers import DynamicCache

        self._cache = DynamicCache(config=self.model.config)
        if hasattr(self._cache, "activate_past_recording"):  # sliding layers must be able to crop
            self._cache.activate_past_recording()
        self._ctx = 0
        self._pending = []
        self._valid = None  # [B, L] bool in a ragged batch: row b owns cache entry l

    def observe(self, features, positions: torch.Tensor, ids: Optional[torch.Tensor] = None) -> None:
        """ids [1, n] at positions [n] (one row), or ids [B, n] at positions [B, n], -1 where an entry is not
        that row's (a ragged batch: a right-padded prompt, or a row that kept fewer of the block)."""
        if ids is None:
            raise ValueError(
                "PARD observe(): token ids are required (the drafter reads tokens, not target features); "
                "the decoding engine must call adapter.observe(features, positions, ids=...)"
            )
        if positions.dim() == 2 and tuple(ids.shape) != tuple(positions.shape):
            raise ValueError(f"PARD observe(): ids {tuple(ids.shape)} for positions {tuple(positions.shape)}")
        if positions.dim() != 2 and ids.shape[1] != positions.numel():
            raise ValueError(f"PARD observe(): {ids.shape[1]} ids for {positions.numel()} positions")
        self._pending.append((self.known(ids), positions))

    def context_length(self) -> int:
        return self._ctx + sum(int(p.numel()) for _, p in self._pending)

    def block_ids(self, anchor: torch.Tensor) -> torch.Tensor:
        ids = torch.full((anchor.shape[0], self.num_slots), self.pard_token_id, dtype=torch.long, device=anchor.device)
        ids[:, 0] = self.known(anchor)
        return ids

    def static_drafter(self, max_len: int):
        """The static-cache, graphed drafter (fast.py), kept between decodes while it has room
        (its captured graphs are reused) and the drafter's weights are the ones it copied (same
        device, dtype, tensors and version counters: a training step in between rebuilds it).
        None where the fast engine cannot run the drafter's architecture, or for a subclass
        that changes propose: PARD then proposes eagerly."""
        from domino_graft.fast import UnsupportedModel, round_up_pow2

        from .fast import StaticPardDrafter

        if type(self).propose is not PardAdapter.propose:
            return None
        params = list(self.model.parameters())
        stamp = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        cur = getattr(self, "_static_drafter", None)
        fresh = getattr(self, "_static_stamp", None) == stamp
        if fresh and cur is False:  # known unsupported: eager, without another try
            return None
        if cur is None or not fresh or cur.max_len < max_len:
            try:
                cur = StaticPardDrafter(self, round_up_pow2(max_len))
            except UnsupportedModel:
                cur = False
            object.__setattr__(self, "_static_drafter", cur)  # not a submodule: no state_dict entry
            object.__setattr__(self, "_static_stamp", stamp)
        return cur or None

    def propose(self, anchor: torch.Tensor, position) -> DraftBlock:
        """anchor [B] at `position`: an int (one row), or a [B] tensor (a ragged batch)."""
        if self._cache is None:
            raise RuntimeError("PARD propose() before reset(): call adapter.reset(batch_size) first")
        if torch.is_tensor(position):
            return self._propose_ragged(anchor, position)
        new = [i for i, _ in self._pending]
        new_pos = [p for _, p in self._pending]
        n_new = sum(int(p.numel()) for p in new_pos)
        if new_pos and int(new_pos[0][0]) != self._ctx:
            raise RuntimeError(f"PARD observe(): context resumes at position {int(new_pos[0][0])}, expected {self._ctx}")
        if self._ctx + n_new != position:
            raise RuntimeError(
                f"PARD propose(anchor at position {position}): the drafter has seen positions 0..{self._ctx + n_new - 1}; "
                "it needs every verified position before the anchor"
            )
        k = self.num_slots
        # Newly verified context and the block in one forward (exactly one backbone pass).
        ids = torch.cat(new + [self.block_ids(anchor)], dim=1)
        pos = torch.arange(self._ctx, position + k, device=anchor.device)[None].expand(ids.shape[0], -1)
        hidden = self._hidden(ids, pos, cache=self._cache)[:, -k:].contiguous()  # one matmul in the LM head
        # Keep only verified context in the cache: the block (x_0 included) comes back
        # through observe() once the target has verified it.
        self._cache.crop(-k)
        self._ctx, self._pending = position, []
        return DraftBlock(hidden=hidden, base_logits=self.base_logits(hidden))

    def _propose_ragged(self, anchor: torch.Tensor, position: torch.Tensor) -> DraftBlock:
        """A ragged batch's block: each row's newly verified entries (observe's -1 columns are not that
        row's) and its block [x_0, PARD, ...] at its own positions, in one forward over the shared cache.
        A query sees its row's valid entries and the new columns of its row up to itself, so each row's
        block is its solo propose's up to floating-point reassociation (as decoding/session.py's
        DynamicSession argues for the target); the block is cropped off again, and the new entries join
        the cache under the validity mask."""
        b, k, dev = anchor.shape[0], self.num_slots, anchor.device
        if self._valid is None:
            self._valid = torch.zeros(b, 0, dtype=torch.bool, device=dev)
        if self._pending:
            new_ids = torch.cat([i.expand(b, -1) for i, _ in self._pending], dim=1)
            new_pos = torch.cat([p.expand(b, -1) if p.dim() == 2 else p[None].expand(b, -1) for _, p in self._pending],
                                dim=1).to(dev)
        else:
            new_ids = torch.zeros(b, 0, dtype=torch.long, device=dev)
            new_pos = torch.zeros(b, 0, dtype=torch.long, device=dev)
        mine = new_pos >= 0
        block_pos = position.to(dev)[:, None] + torch.arange(k, device=dev)
        ids = torch.cat([new_ids, self.block_ids(anchor)], dim=1)
        pos = torch.cat([new_pos.clamp(min=0), block_pos], dim=1)
        allowed = ragged_allowed(self._valid, torch.cat([mine, torch.ones(b, k, dtype=torch.bool, device=dev)], 1))
        dtype = self.model.get_input_embeddings().weight.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(~allowed, torch.finfo(dtype).min)
        hidden = self._hidden(ids, pos, cache=self._cache, mask=mask[:, None])[:, -k:].contiguous()
        self._cache.crop(-k)  # the block comes back through observe() once the target has verified it
        self._valid = torch.cat([self._valid, mine], dim=1)
        self._pending = []
        return DraftBlock(hidden=hidden, base_logits=self.base_logits(hidden))

    # ---- training
    def training_blocks(self, features, input_ids, loss_mask, anchors) -> TrainingBlocks:
        """input_ids / loss_mask [B, L], anchors [B, nb] = positions a of x_0 (features unused).

        One forward over [sequence, pard tokens of every block]: sequence tokens attend
        causally among themselves; block b's pard token at offset o (position a_b + o)
        attends to sequence positions <= a_b and to its block's offsets 1..o."""
        b, length = input_ids.shape
        nb, k, dev = anchors.shape[1], self.num_slots, input_ids.device
        m = k - 1
        offs = torch.arange(1, k, device=dev)
        blk_pos = (anchors[:, :, None] + offs).reshape(b, nb * m)
        seq_pos = torch.arange(length, device=dev).expand(b, -1)
        ids = torch.cat([self.known(input_ids),
                         torch.full((b, nb * m), self.pard_token_id, dtype=torch.long, device=dev)], 1)
        pos = torch.cat([seq_pos, blk_pos], 1)

        q_seq = torch.arange(length, device=dev)
        seq_seq = (q_seq[None, :] <= q_seq[:, None]).expand(b, -1, -1)  # [B, L, L] causal
        seq_blk = torch.zeros(b, length, nb * m, dtype=torch.bool, device=dev)
        blk_anchor = anchors.repeat_interleave(m, dim=1)  # [B, nb·m]
        blk_seq = q_seq[None, None, :] <= blk_anchor[:, :, None]  # [B, nb·m, L]
        blk_id = torch.arange(nb, device=dev).repeat_interleave(m)
        blk_off = offs.repeat(nb)
        blk_blk = (blk_id[:, None] == blk_id[None, :]) & (blk_off[None, :] <= blk_off[:, None])
        allowed = torch.cat([torch.cat([seq_seq, seq_blk], 2),
                             torch.cat([blk_seq, blk_blk.expand(b, -1, -1)], 2)], 1)
        dtype = self.model.get_input_embeddings().weight.dtype
        # Additive float mask: every attention implementation (eager, sdpa) takes it as is.
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(~allowed, torch.finfo(dtype).min)
        hidden_all = self._hidden(ids, pos, mask=mask[:, None])

        rows = torch.arange(b, device=dev).repeat_interleave(nb)
        a = anchors.reshape(-1)
        first = hidden_all[rows, a]  # slot 1: x_0's own position predicts x_1
        rest = hidden_all[:, length:].reshape(b * nb, m, -1)
        hidden = torch.cat([first[:, None], rest], 1)  # [N, K, H]

        labels, prev = slot_targets(input_ids, loss_mask, anchors, k)
        return TrainingBlocks(hidden=hidden, prev_emb=self.embed(prev), labels=labels, base_logits_fn=self.base_logits)

    def backbone_parameters(self) -> list[nn.Parameter]:
        return list(self.model.parameters())

    # ---- persistence
    def backbone_state_dict(self) -> dict[str, torch.Tensor]:
        """HF layout (`model.layers...`, `lm_head.weight` unless tied): the folder this and
        native_config() make loads with AutoModelForCausalLM.from_pretrained and in vLLM."""
        skip = tied_aliases(self.model)
        return {k: v for k, v in self.model.state_dict().items() if k not in skip}

    def native_config(self) -> dict:
        cfg = json.loads(self.model.config.to_json_string(use_diff=False))
        cfg["pard_token"] = self.pard_token_id
        cfg[SLOTS_KEY] = self.num_slots
        cfg.pop("pard_token_id", None)
        return cfg


# ------------------------------------------------------------------ recipe -> drafter
def config_from_recipe(d, tshape):
    """The drafter's HF config (planning: from configs alone)."""
    return resolve(d, tshape)[0]


def plan(d, tshape):
    from ..plan import FamilyPlan, HookPoint

    cfg, token, k, start = resolve(d, tshape)
    text = cfg.get_text_config()
    h, v = text.hidden_size, tshape.vocab_size
    if text.vocab_size != v:
        start += f"; its {text.vocab_size} vocabulary rows mapped onto the target's {v}"
    return FamilyPlan(
        family="pard",
        summary=(f"PARD causal LM ({start}): {text.num_hidden_layers} layer(s), hidden {h}, vocab {v}, "
                 f"k = {k}, pard token {token}"),
        num_slots=k,
        hidden_dim=h,
        emb_dim=h,  # input embedding dim = hidden size for every causal LM transformers builds
        vocab_size=v,
        capture_layers=[],
        backbone_tensors=tensor_shapes(cfg),
        hooks=[
            HookPoint("hidden", "drafter final hidden state at x_0 and the k-1 pard tokens", f"[B, {k}, {h}]"),
            HookPoint("base_logits", "drafter lm_head(hidden)", f"[B, {k}, {v}]"),
            HookPoint("embed", "drafter input embeddings of x_0..x_{K-1}", f"[B, {k}, {h}]"),
        ],
        source=d.path or f"fresh: {start}",
    )


def build(d, target):
    """-> (adapter, {}): weights checked strictly (no silently re-initialised tensors)."""
    from transformers import AutoModelForCausalLM

    from domino_graft.artifacts.tensors import check_tensors

    cfg, token, num_slots, _ = resolve(d, target.shape, target.model.config)
    torch.manual_seed(d.random.seed if d.random is not None else d.seed)
    model = AutoModelForCausalLM.from_config(cfg)
    skip = tied_aliases(model)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in skip}
    if d.path is not None:
        state, source = load_folder_state(Path(d.path))
        state = {k: v for k, v in state.items() if k not in skip}  # a tied head saved twice is harmless
        check_tensors(state, expected, source=source)
    elif d.random is None:
        # Warm start: the target's embeddings, first layers, final norm and LM head.
        theirs = target.model.state_dict()
        state = {k: theirs[k] for k in expected}
    else:
        state = None
    if state is not None:
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        left = set(missing) - skip
        if left or unexpected:
            raise RuntimeError(f"PARD drafter load: missing {sorted(left)}, unexpected {sorted(unexpected)}")
    untie(model)
    model.eval().to(device=target.device, dtype=target.dtype)
    return PardAdapter(model, token, num_slots, target), {}
