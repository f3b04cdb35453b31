"""The training objective against docs/design.md §2 and its own formulas (labels, anchors, λ, chunking)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from domino_graft.training.objective import (
    DominoObjective,
    estimated_tau,
    lambda_at,
    lr_factor,
    sample_anchors,
    slot_weights,
)

from tests.conftest import TINY_RECIPE, randomize_head


def _build(shift_label: bool):
    from domino_graft.registry import get_family
    from domino_graft.graft import build_head
    from domino_graft.recipe import load_recipe
    from domino_graft.target import load_target

    recipe = load_recipe(TINY_RECIPE, [f"drafter.shift_label={str(shift_label).lower()}"])
    target = load_target(recipe.target)
    adapter, _ = get_family("dflash").build(recipe.drafter, target)
    head = build_head(recipe, adapter)
    return target, adapter, head


@pytest.mark.parametrize("shift_label", [True, False])
def test_slot_labels_prev_tokens_and_hidden_follow_design(shift_label):
    """docs/design.md §2: slot j predicts x_{a+j}; the GRU reads x_a..x_{a+j-1}; with shift_label=true
    block position k predicts x_{a+1+k} (slot j = position j-1, K = block_size), with
    shift_label=false position k predicts x_{a+k} and position 0 is unused (slot j = position j)."""
    target, adapter, _ = _build(shift_label)
    bs = adapter.cfg.block_size
    length = 40
    x = torch.arange(5, 5 + length)[None]  # distinct ids: a label's value names its position
    loss_mask = torch.ones_like(x)
    loss_mask[0, :2] = 0
    anchors = torch.tensor([[3, 12, 35]])
    feats = target(x, capture=adapter.capture_layers())[1]
    with torch.no_grad():
        blocks = adapter.training_blocks(feats, x, loss_mask, anchors)
    k_slots = bs if shift_label else bs - 1
    assert blocks.labels.shape == (3, k_slots)
    emb = target.embed(x[0])
    for n, a in enumerate(anchors[0].tolist()):
        # the block as the drafter sees it at inference: [x_a, MASK...] at positions a.., context < a
        ids = torch.full((1, bs), adapter.cfg.mask_token_id)
        ids[0, 0] = x[0, a]
        kv = adapter.backbone.context_kv(feats[:, :a], torch.arange(a))
        with torch.no_grad():
            raw = adapter.backbone(target.embed(ids), torch.arange(a, a + bs), kv, torch.arange(a))[0]
        for j in range(1, k_slots + 1):
            want = int(x[0, a + j]) if a + j < length else -100
            assert int(blocks.labels[n, j - 1]) == want, (shift_label, a, j)
            if a + j - 1 < length:
                torch.testing.assert_close(blocks.prev_emb[n, j - 1], emb[a + j - 1])
            pos = j - 1 if shift_label else j
            torch.testing.assert_close(blocks.hidden[n, j - 1], raw[pos], rtol=1e-5, atol=1e-5)
        # inference (propose) reads the same per-slot hidden states as training
        adapter.reset(1)
        adapter.observe(feats[:, :a], torch.arange(a))
        with torch.no_grad():
            blk = adapter.propose(x[:, a], a)
        torch.testing.assert_close(blk.hidden[0], blocks.hidden[n, : adapter.num_slots], rtol=1e-5, atol=1e-5)


def test_anchor_positions_have_context_and_labels_in_the_loss_region():
    mask = torch.tensor([0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0])
    g = torch.Generator().manual_seed(0)
    anchors, valid = sample_anchors(mask, 11, 4, g)  # length 11: the last mask entry is padding
    got = sorted(anchors[valid].tolist())
    assert got == sorted(set(got)) and len(got) == 4
    for a in got:
        assert a >= 1 and mask[a + 1] == 1 and a + 1 < 11
    assert set(got) <= {3, 4, 5, 8, 9}
    # fewer candidates than requested: the rest are marked invalid
    anchors, valid = sample_anchors(mask, 11, 8, g)
    assert int(valid.sum()) == 5
    anchors, valid = sample_anchors(torch.zeros(10, dtype=torch.long), 10, 3, g)
    assert not valid.any()


def test_lambda_schedule_formula_and_never_silently_zero():
    for step in range(10):
        assert lambda_at(step, lambda_start=0.8, decay_ratio=0.5, max_steps=10) == pytest.approx(
            0.8 * max(0.0, 1 - step / 5.0))
    # decay_ratio·max_steps < 1: the first step still uses lambda_start (no int() rounding to 0)
    assert lambda_at(0, lambda_start=1.0, decay_ratio=0.1, max_steps=3) == 1.0
    assert lambda_at(1, lambda_start=1.0, decay_ratio=0.1, max_steps=3) == 0.0
    with pytest.raises(ValueError, match="train.max_steps"):
        lambda_at(0, lambda_start=1.0, decay_ratio=1.0, max_steps=0)
    assert [lr_factor(s, warmup_steps=2, max_steps=6, schedule="linear") for s in range(6)] == pytest.approx(
        [0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
    assert lr_factor(5, warmup_steps=0, max_steps=6, schedule="cosine") == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 5 / 6)))


def test_tau_estimate():
    assert estimated_tau([1.0, 1.0, 1.0]) == 4.0
    assert estimated_tau([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert estimated_tau([0.0, 1.0]) == 1.0
    assert estimated_tau([0.5, None, 1.0]) == 1.5


def _batch(target, adapter):
    torch.manual_seed(0)
    x = torch.randint(3, 90, (2, 30))
    mask = torch.ones_like(x)
    mask[:, :10] = 0
    anchors = torch.tensor([[10, 15, 26], [12, 20, 27]])
    valid = torch.tensor([[True, True, True], [True, False, True]])
    feats = target(x, capture=adapter.capture_layers())[1]
    return feats, x, mask, anchors, valid


def test_chunked_loss_equals_direct_formula_and_gradients():
    """loss = Σ_rows w_k [(1-λ) CE(final) + λ CE(base)], final = head.block(...) on full logits;
    the chunked + checkpointed objective must give the same value and gradients."""
    target, adapter, head = _build(True)
    randomize_head(head, seed=1)
    feats, x, mask, anchors, valid = _batch(target, adapter)
    lam = 0.3

    def run(chunk):
        obj = DominoObjective(adapter, head, gamma=7.0, loss_chunk=chunk, backbone_trainable=True)
        obj.zero_grad()
        out = obj(feats, x, mask, anchors, valid, lam, True)
        out["loss_sum"].backward()
        grads = {n: p.grad.clone() for n, p in obj.named_parameters() if p.grad is not None}
        return out, grads

    small, g_small = run(3)
    big, g_big = run(10_000)
    torch.testing.assert_close(small["loss_sum"], big["loss_sum"])
    assert g_small.keys() == g_big.keys() and any(k.startswith("head.embed_proj.2") for k in g_small)
    for k in g_small:
        torch.testing.assert_close(g_small[k], g_big[k], rtol=1e-5, atol=1e-6)

    with torch.no_grad():
        blocks = adapter.training_blocks(feats, x, mask, anchors)
        labels = blocks.labels.masked_fill(~valid.reshape(-1, 1), -100)
        base = adapter.base_logits(blocks.hidden)
        final = head.block(blocks.hidden, base, blocks.prev_emb)
        w = torch.exp(-torch.arange(labels.shape[1]) / 7.0).expand_as(labels)
        keep = labels != -100
        ce_f = F.cross_entropy(final[keep], labels[keep], reduction="none")
        ce_b = F.cross_entropy(base[keep], labels[keep], reduction="none")
        want = ((1 - lam) * (w[keep] * ce_f).sum() + lam * (w[keep] * ce_b).sum())
    torch.testing.assert_close(small["loss_sum"].detach(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(small["weight_sum"], w[keep].sum())
    assert small["count"].tolist() == keep.sum(0).tolist()
    assert small["correct_final"].tolist() == ((final.argmax(-1) == labels) & keep).sum(0).tolist()


def _loss_and_grads(obj, batch, lam, train_head):
    obj.zero_grad()
    out = obj(*batch, lam, train_head)
    out["loss_sum"].backward()
    return out, {n: p.grad.clone() for n, p in obj.named_parameters() if p.grad is not None}


def _assert_bit_identical(a, b):
    (out_a, g_a), (out_b, g_b) = a, b
    for key in ("loss_sum", "ce_final_sum", "ce_base_sum", "weight_sum", "correct_base", "correct_final", "count"):
        assert torch.equal(out_a[key], out_b[key]), key
    assert g_a.keys() == g_b.keys() and g_a
    for k in g_a:
        assert torch.equal(g_a[k], g_b[k]), k


@pytest.mark.parametrize("train_head,lam", [(True, 0.3), (False, 1.0)])
def test_loss_checkpoint_off_gives_the_same_bits(train_head, lam):
    """train.loss_checkpoint: false keeps each chunk's logits instead of recomputing them in
    backward: the loss, the statistics and every gradient are the same bits."""
    target, adapter, head = _build(True)
    randomize_head(head, seed=1)
    batch = _batch(target, adapter)
    runs = [_loss_and_grads(DominoObjective(adapter, head, gamma=7.0, loss_chunk=4, backbone_trainable=True,
                                            checkpoint_chunks=ckpt), batch, lam, train_head)
            for ckpt in (True, False)]
    _assert_bit_identical(*runs)


@pytest.mark.parametrize("ckpt", [True, False])
def test_an_identity_head_that_does_not_train_is_not_computed_but_changes_no_bit(ckpt):
    """A `_base` run (W2 = 0, head frozen, λ = 1): CE(final) is CE(base), so the objective skips
    the head's residual and the second cross-entropy; loss, statistics and gradients stay the
    same bits as computing them."""
    target, adapter, head = _build(True)
    with torch.no_grad():
        head.embed_proj[2].weight.zero_()
    batch = _batch(target, adapter)
    runs = []
    for skip in (False, True):
        obj = DominoObjective(adapter, head, gamma=7.0, loss_chunk=4, backbone_trainable=True, checkpoint_chunks=ckpt)
        obj.head_is_identity = skip
        runs.append(_loss_and_grads(obj, batch, 1.0, False))
    _assert_bit_identical(*runs)


def test_the_trainer_skips_only_a_head_that_is_exactly_zero():
    """head_is_identity is read from the run's W2 after any resume: a fresh zero-init head is the
    identity; a randomly initialised W2 (head.zero_init_w2: false) is not."""
    from domino_graft.training.loop import _all_zero

    _, _, head = _build(True)
    assert _all_zero(head.embed_proj[2].weight)
    randomize_head(head, seed=1)
    assert not _all_zero(head.embed_proj[2].weight)


def test_slot_weights():
    assert slot_weights(3, 7.0).tolist() == pytest.approx([1.0, math.exp(-1 / 7), math.exp(-2 / 7)])


def test_merge_lora_matches_the_injected_model():
    from peft import LoraConfig, inject_adapter_in_model

    from domino_graft.adapters.dflash.model import DFlashBackbone
    from domino_graft.training.weights import merge_lora

    _, adapter, _ = _build(True)
    cfg = adapter.cfg
    fresh = DFlashBackbone(cfg)
    fresh.load_state_dict(adapter.backbone.state_dict())
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj", "fc"]), adapter.backbone)
    with torch.no_grad():
        for n, p in adapter.backbone.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    merged = merge_lora(adapter.backbone.state_dict(), 8 / 4)
    assert set(merged) == set(fresh.state_dict())
    fresh.load_state_dict(merged, strict=True)
    torch.manual_seed(0)
    feats = torch.randn(1, 6, cfg.hidden_size * len(cfg.target_layer_ids))
    emb = torch.randn(1, cfg.block_size, cfg.hidden_size)
    with torch.no_grad():
        a = adapter.backbone(emb, torch.arange(6, 6 + cfg.block_size), adapter.backbone.context_kv(feats, torch.arange(6)),
                             torch.arange(6))
        b = fresh(emb, torch.arange(6, 6 + cfg.block_size), fresh.context_kv(feats, torch.arange(6)), torch.arange(6))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
