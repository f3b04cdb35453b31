"""The Domino training objective: anchors, curriculum, per-slot weights, chunked loss.

    loss = (1-λ)·CE(final) + λ·CE(base),   final = head.block(hidden, base, prev_emb)

summed over slots k = 1..K with weight exp(-(k-1)/γ) and normalised by the total weight
of the labelled slots in the *global* batch (all ranks, all micro-steps), so a run's loss
does not depend on how the batch was split.

Memory: [blocks·K, V] logits are never held at once. The GRU and W1 (rank r features) run
on the whole batch; base logits, W2 and the cross-entropies run `loss_chunk` rows at a
time under activation checkpointing, so each chunk's [rows, V] tensors are freed after its
forward and recomputed during backward. `train.loss_checkpoint: false` keeps them instead
(about two [rows, V] fp32 tensors per chunk until backward) and skips the recompute, the
same numbers for less time where memory allows (docs/design.md §1, Time).

While the head is the identity and does not train (a `_base` run, a warm-up before the
head starts: W2 = 0 so final == base bit for bit), CE(final) and its argmax are CE(base)
and its argmax: neither they nor the head's GRU features are computed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

IGNORE = -100


def slot_weights(num_slots: int, gamma: float, device=None) -> torch.Tensor:
    """[K] weights exp(-(k-1)/γ) for slots k = 1..K."""
    k = torch.arange(num_slots, device=device, dtype=torch.float32)
    return torch.exp(-k / gamma)


def lambda_at(step: int, *, lambda_start: float, decay_ratio: float, max_steps: int) -> float:
    """λ for 0-based optimizer step `step`: lambda_start at step 0, linear to 0 at
    decay_ratio·max_steps, 0 after. The span is a float so a short run never divides by 0
    (or skips the curriculum because int(decay_ratio·max_steps) rounded to 0)."""
    if max_steps < 1:
        raise ValueError(f"train.max_steps: {max_steps} — the λ curriculum needs the run length; valid: >= 1")
    if not 0 < decay_ratio <= 1:
        raise ValueError(f"train.decay_ratio: {decay_ratio} is invalid; valid: 0 < decay_ratio <= 1")
    span = decay_ratio * max_steps
    return lambda_start * max(0.0, 1.0 - step / span)


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, schedule: str) -> float:
    """Multiplier of the peak LR at 0-based optimizer step `step`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    progress = min(1.0, progress)
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def estimated_tau(acc: list[float | None]) -> float:
    """Expected tokens per target forward for a chain drafter whose slot k is right with
    probability acc[k] independently of the others: 1 + Σ_k Π_{i<=k} acc_i."""
    tau, run = 1.0, 1.0
    for a in acc:
        if a is None:
            break
        run *= a
        tau += run
    return tau


def sample_anchors(loss_mask: torch.Tensor, length: int, count: int, generator: torch.Generator):
    """Anchor positions for one sequence: a >= 1 (the block sees context < a) and the first
    label x_{a+1} lies in the loss region. -> (anchors [count], valid [count] bool).

    Without replacement; a sequence with fewer candidates fills the rest with a copy of the
    first anchor marked invalid (its labels are dropped), so every batch has a fixed shape."""
    cand = torch.nonzero(loss_mask[2:length].bool()).flatten() + 1  # a with loss_mask[a+1] = 1
    anchors = torch.ones(count, dtype=torch.long)
    valid = torch.zeros(count, dtype=torch.bool)
    if cand.numel():
        take = min(count, cand.numel())
        pick = cand[torch.randperm(cand.numel(), generator=generator)[:take]]
        anchors[:take] = pick
        anchors[take:] = pick[0]
        valid[:take] = True
    return anchors, valid


class DominoObjective(nn.Module):
    """Backbone + head as one module, so FSDP2 can shard both and gather them per forward.

    forward() returns the *unnormalised* weighted loss sum (for backward) and the detached
    statistics the trainer reduces across ranks: the caller divides gradients by the global
    label weight once per optimizer step.
    """

    def __init__(self, adapter, head, *, gamma: float, loss_chunk: int, backbone_trainable: bool,
                 checkpoint_chunks: bool = True):
        super().__init__()
        self.adapter = adapter
        self.head = head
        self.gamma = gamma
        self.loss_chunk = loss_chunk
        self.backbone_trainable = backbone_trainable
        self.checkpoint_chunks = checkpoint_chunks
        # set by the trainer once the head's weights are final for the run's start (after any
        # resume): W2 == 0, so the head adds exactly nothing while it does not train
        self.head_is_identity = False

    def forward(self, features, input_ids, loss_mask, anchors, valid, lam: float, train_head: bool):
        grad = torch.is_grad_enabled()
        # A frozen backbone needs no graph: its activations would only cost memory.
        with torch.set_grad_enabled(grad and self.backbone_trainable):
            blocks = self.adapter.training_blocks(features, input_ids, loss_mask, anchors)
        labels = blocks.labels.masked_fill(~valid.reshape(-1, 1), IGNORE)
        n, k = labels.shape
        same_as_base = self.head_is_identity and not train_head
        if same_as_base:  # the head's features would only be multiplied by W2 = 0
            feats = blocks.hidden.new_zeros(n, k, 1)
        else:
            with torch.set_grad_enabled(grad and train_head):
                feats = self.head.correction(blocks.hidden, blocks.prev_emb)  # [N, K, r]
        w = slot_weights(k, self.gamma, labels.device)
        corrected = self.head.corrected_slots(k, labels.device)
        slot = torch.arange(k, device=labels.device).expand(n, k)
        # Only labelled rows reach the vocabulary projection. A micro-batch without any keeps
        # one row at weight 0: every rank must build the same graph, or the FSDP/DDP gradient
        # collectives would disagree on which parameters have gradients.
        keep = (labels != IGNORE).reshape(-1)
        real = torch.ones(int(keep.sum()), dtype=torch.bool, device=labels.device)
        if not keep.any():
            keep = keep.clone()
            keep[0] = True
            real = torch.zeros(1, dtype=torch.bool, device=labels.device)
        hid = blocks.hidden.reshape(n * k, -1)[keep]
        fts = feats.reshape(n * k, -1)[keep]
        lab = labels.reshape(-1).clamp(min=0)[keep]
        slot = slot.reshape(-1)[keep]
        wrow = w[slot] * real
        corr = corrected[slot]

        zero = hid.new_zeros(())
        loss, ce_f, ce_b = zero, zero.detach(), zero.detach()
        correct_b = torch.zeros(k, dtype=torch.long, device=lab.device)
        correct_f = torch.zeros_like(correct_b)
        for s in range(0, lab.numel(), self.loss_chunk):
            e = s + self.loss_chunk
            args = (hid[s:e], fts[s:e], lab[s:e], wrow[s:e], corr[s:e], slot[s:e], lam, train_head and grad,
                    same_as_base)
            if grad and self.checkpoint_chunks and (hid.requires_grad or fts.requires_grad):
                out = checkpoint(self._chunk, *args, use_reentrant=False)
            else:
                out = self._chunk(*args)
            part, f_sum, b_sum, ok_b, ok_f = out
            loss = loss + part
            ce_f = ce_f + f_sum
            ce_b = ce_b + b_sum
            correct_b.index_add_(0, slot[s:e], (ok_b & real[s:e]).long())
            correct_f.index_add_(0, slot[s:e], (ok_f & real[s:e]).long())
        count = torch.bincount(slot[real], minlength=k)
        return {
            "loss_sum": loss,
            "ce_final_sum": ce_f,
            "ce_base_sum": ce_b,
            "weight_sum": wrow.sum().detach(),
            "correct_base": correct_b,
            "correct_final": correct_f,
            "count": count,
        }

    def _chunk(self, hid, fts, lab, wrow, corr, slot, lam: float, head_grad: bool, same_as_base: bool):
        # rows keep their slot: a family with one LM head per slot reads it
        base = self.adapter.slot_base_logits(hid, slot).float()  # [c, V]
        if same_as_base:  # final == base exactly; the loss keeps its two terms' arithmetic
            ce_b = F.cross_entropy(base, lab, reduction="none")
            b_sum = (wrow * ce_b).sum()
            ok_b = base.argmax(-1) == lab
            return (1.0 - lam) * b_sum + lam * b_sum, b_sum.detach(), b_sum.detach(), ok_b, ok_b
        with torch.set_grad_enabled(torch.is_grad_enabled() and head_grad):
            delta = self.head.embed_proj[2](fts).float()
        final = base + delta * corr[:, None].to(delta.dtype)
        ce_b = F.cross_entropy(base, lab, reduction="none")
        ce_f = F.cross_entropy(final, lab, reduction="none")
        f_sum = (wrow * ce_f).sum()
        b_sum = (wrow * ce_b).sum()
        part = (1.0 - lam) * f_sum + lam * b_sum
        ok_b = base.argmax(-1) == lab
        ok_f = final.argmax(-1) == lab
        return part, f_sum.detach(), b_sum.detach(), ok_b, ok_f
