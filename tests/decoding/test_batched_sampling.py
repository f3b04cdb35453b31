"""Batched chains at T > 0 are lossless in distribution, row by row (decoding/batched.py).

As for solo chains (test_sampling.py) and trees (test_tree_sampling.py): on a tiny vocabulary
the target's joint law of the first three generated tokens after each prompt is enumerated
exactly, and the empirical samples of every row are compared with it by the chi-square test at
ALPHA = 1e-3 (cells with expected count < 5 pooled; seeds fixed, so the outcome is too).

One batch holds prompts of lengths 7, 1 and 4, interleaved and repeated (R rows each), so every
row runs the real ragged decode: a ragged prefill, per-row acceptance, rows that finish after one
step masked while the others take a second. (t0, t1, t2) = the prefill's draw, then the first
step's accepted drafts / residual draw / bonus (K = 2), then a second step where needed.

The control: the same decode with the base drafter's q handed to the verifier while the drafts
are drawn from the Domino-corrected q; the same test must reject it for every prompt.
"""

from __future__ import annotations

import pytest
import torch

from domino_graft.decoding import Engine, Sampling, rollout, warp
from tests.decoding.test_sampling import ALPHA, build, chi_square_pvalue
from tests.decoding.test_tree_sampling import exact_tables

VOCAB = 8
PROMPTS = [[2, 5, 3, 6, 4, 3, 2], [4], [6, 2, 5, 3]]


def peaked(seed: int, lm_head_scale: float = 15.0):
    """A tiny DFlash + Domino build whose target is peaked at T = 1 (entropies ~1.2-1.7 nats of
    ln 8 = 2.08): a random tiny target is near-uniform, which would spread the samples over all
    512 cells. The head is strong (scale 2), so a wrong q is far from the right one."""
    target, adapter, head = build(seed, vocab=VOCAB, ppl=0, block_size=3, head_scale=2.0)
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(lm_head_scale)
    return target, adapter, head


def wrong_q(head, block, anchor, embed, **kw):
    """Domino-corrected drafts, verified against the base drafter's q."""
    drafts, _ = rollout(head, block, anchor, embed, **kw)
    return drafts, warp(block.base_logits, kw["temperature"], kw["top_k"], kw["top_p"])


@torch.inference_mode()
def exact_joints(target, warp_: dict) -> list[torch.Tensor]:
    """For each of PROMPTS, the target's exact joint law of its first three tokens [V, V, V]."""
    joints = []
    for prompt in PROMPTS:
        p1, p2, p3 = exact_tables(target, torch.tensor([prompt]), VOCAB, warp_)
        joints.append(p1[:, None, None] * p2[:, :, None] * p3)
    return joints


def row_pvalues(results, joints) -> list[float]:
    """A chi-square p-value per prompt: results[i] decoded the prompt of joints[i % len(joints)]."""
    counts = torch.zeros(len(joints), VOCAB ** 3, dtype=torch.long)
    for i, r in enumerate(results):
        t0, t1, t2 = r.tokens
        counts[i % len(joints), (t0 * VOCAB + t1) * VOCAB + t2] += 1
    return [chi_square_pvalue(counts[i], joints[i])[1] for i in range(len(joints))]


@pytest.mark.parametrize("top_p,seed", [(1.0, 0), (0.8, 2)])
def test_batched_chain_sampling_matches_target_distribution(top_p, seed):
    rows_per_prompt = 3000
    target, adapter, head = peaked(seed)
    warp_ = dict(temperature=1.0, top_k=0, top_p=top_p)
    sampling = Sampling(seed=seed, **warp_)
    joints = exact_joints(target, warp_)
    batch = [PROMPTS[i % len(PROMPTS)] for i in range(len(PROMPTS) * rows_per_prompt)]

    engine = Engine(target, adapter, head)
    pvalues = {"target alone": row_pvalues(engine.target_only_batch(batch, max_new_tokens=3, sampling=sampling),
                                           joints)}
    results = engine.speculative_batch(batch, max_new_tokens=3, sampling=sampling)
    assert len({r.target_forwards for r in results}) > 1, "no row took a second step: rows never finished apart"
    pvalues["right"] = row_pvalues(results, joints)
    engine.rollout = wrong_q
    pvalues["wrong"] = row_pvalues(engine.speculative_batch(batch, max_new_tokens=3, sampling=sampling), joints)
    assert min(pvalues["target alone"]) > ALPHA, pvalues
    assert min(pvalues["right"]) > ALPHA, f"a batched row deviates from the target: {pvalues}"
    assert max(pvalues["wrong"]) < ALPHA, f"the test cannot tell a wrong q from the right one: {pvalues}"


def test_batched_sampling_is_reproducible_and_stops_per_row():
    """Same prompts, order and seed: the same samples (one generator, a fixed draw order); a
    stop token ends its row while the others go on; every row stays within its budget."""
    target, adapter, head = build(1, vocab=16, ppl=1, block_size=4)
    prompts = [[3, 4, 5], [7], [2, 9, 11, 4, 6, 8, 10, 3, 5]]
    sampling = Sampling(temperature=1.0, top_k=8, seed=5)
    engine = Engine(target, adapter, head)
    for use_head in (True, False):
        a = engine.speculative_batch(prompts, max_new_tokens=12, sampling=sampling, use_head=use_head)
        b = engine.speculative_batch(prompts, max_new_tokens=12, sampling=sampling, use_head=use_head)
        assert [r.tokens for r in a] == [r.tokens for r in b]
        assert all(1 <= len(r.tokens) <= 12 and r.tau is not None for r in a)
    c = engine.speculative_batch(prompts, max_new_tokens=12, sampling=sampling, seed_offset=1)
    assert [r.tokens for r in c] != [r.tokens for r in a]
    stop = a[0].tokens[1] if len(a[0].tokens) > 1 else a[0].tokens[0]
    got = engine.speculative_batch(prompts, max_new_tokens=12, sampling=sampling, stop_ids=[stop])
    for r in got:
        assert stop not in r.tokens[:-1] and (r.stop_reason != "stop" or r.tokens[-1] == stop), r
    t = engine.target_only_batch(prompts, max_new_tokens=12, sampling=sampling)
    assert [r.tokens for r in t] == [r.tokens for r in engine.target_only_batch(prompts, max_new_tokens=12,
                                                                                   sampling=sampling)]


# PARD and P-EAGLE take ragged batches through contracts of their own (adapters' `_propose_ragged`); their
# vocabularies shrunk to the 8 tokens (the mask / PARD token the last). A target not peaked: with these
# drafters' own LMs a peaked one gives the drafts almost no mass, nothing is accepted, and no q could be
# told from another (the control would pass); near-uniform, most drafts are accepted (tau 2.2-3.3 of 3).
VOCAB_OVERRIDES = {
    "pard": ("target.random.vocab_size=8", "drafter.random.vocab_size=8", "drafter.pard_token_id=7"),
    "peagle": ("target.random.vocab_size=8", "drafter.mask_token_id=7", "drafter.draft_vocab_size=6"),
}


@pytest.mark.parametrize("family", sorted(VOCAB_OVERRIDES))
def test_pard_and_peagle_batches_sample_the_target_distribution(family):
    """As the DFlash test above, for PARD's and P-EAGLE's ragged batches: every prompt's rows follow
    the target's exact joint law of three tokens; the base drafter's q handed to the verifier is rejected."""
    from tests.conftest import randomize_head
    from tests.decoding.test_static_kv import graft

    target, adapter, head = graft(family, "qwen3", seed=0, extra=VOCAB_OVERRIDES[family])
    randomize_head(head, 1, 2.0)
    warp_ = dict(temperature=1.0, top_k=0, top_p=1.0)
    sampling = Sampling(seed=0, **warp_)
    joints = exact_joints(target, warp_)
    batch = [PROMPTS[i % len(PROMPTS)] for i in range(len(PROMPTS) * 3000)]
    engine = Engine(target, adapter, head)
    results = engine.speculative_batch(batch, max_new_tokens=3, sampling=sampling)
    assert len({r.target_forwards for r in results}) > 1, "no row took a second step: rows never finished apart"
    right = row_pvalues(results, joints)
    engine.rollout = wrong_q
    wrong = row_pvalues(engine.speculative_batch(batch, max_new_tokens=3, sampling=sampling), joints)
    assert min(right) > ALPHA, f"a batched {family} row deviates from the target: {right}"
    assert max(wrong) < ALPHA, f"the test cannot tell a wrong q from the right one: {wrong}"
