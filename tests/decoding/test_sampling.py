"""Speculative sampling at T > 0 is lossless in distribution (docs/design.md §5).

Tiny-vocabulary targets make the target's own distribution of the first generated tokens
computable exactly, by enumerating every prefix in one batched forward. Empirical
speculative samples are compared with it by a chi-square goodness-of-fit test at
ALPHA = 1e-3 (cells with expected count < 5 pooled), i.e. a correct sampler fails with
probability 1e-3 for a random seed (the seeds below are fixed, so the outcome is too).
Every test also runs a deliberately wrong verifier input — the base drafter's
distribution passed as q while the drafts are sampled from the Domino-corrected one — and
asserts that the same test rejects it: a test that cannot fail would prove nothing.
"""

from __future__ import annotations

import pytest
import torch

from domino_graft.adapters.base import DraftBlock
from domino_graft.adapters.dflash import adapter as dflash
from domino_graft.decoding import Engine, Sampling, rollout, sample, verify_sampling, warp
from domino_graft.graft import build_head
from domino_graft.recipe import parse_recipe
from domino_graft.target import load_target
from tests.conftest import randomize_head

ALPHA = 1e-3


def build(seed: int, *, vocab: int, ppl: int, block_size: int = 4, head_scale: float = 0.5):
    data = {
        "target": {"random": {
            "architecture": "qwen3", "vocab_size": vocab, "hidden_size": 32, "num_layers": 2, "num_heads": 4,
            "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 64, "tie_word_embeddings": False,
            "eos_token_id": 1, "seed": seed,
        }},
        "drafter": {"family": "dflash", "num_layers": 1, "block_size": block_size, "target_layer_ids": [0, 1],
                    "mask_token_id": vocab - 1, "shift_label": True, "seed": seed},
        "head": {"gru_hidden_dim": 16, "rank": 8, "pure_prefix_len": ppl, "seed": seed},
        "device": "cpu",
    }
    recipe = parse_recipe(data)
    target = load_target(recipe.target)
    adapter, _ = dflash.build(recipe.drafter, target)
    head = build_head(recipe, adapter)
    randomize_head(head, seed, head_scale)
    return target, adapter, head


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """(statistic, p-value) of observed counts against exact cell probabilities."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    n = counts.sum()
    if counts[probs <= 0].sum() > 0:  # an impossible outcome was observed
        return float("inf"), 0.0
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    # chi2 survival function = regularized upper incomplete gamma Q(dof/2, stat/2)
    return float(stat), float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def test_chi_square_helper_calibrated():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(40, generator=g, dtype=torch.float64), 0)
    draws = torch.multinomial(probs.float(), 20000, replacement=True, generator=g)
    _, p_ok = chi_square_pvalue(torch.bincount(draws, minlength=40), probs)
    skewed = probs.clone()
    skewed[0] += 0.02
    _, p_bad = chi_square_pvalue(torch.bincount(draws, minlength=40), skewed / skewed.sum())
    assert p_ok > ALPHA and p_bad < ALPHA


def test_warp():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]])
    torch.testing.assert_close(warp(logits, 0.5), torch.softmax(logits / 0.5, -1))
    top2 = warp(logits, 1.0, top_k=2)
    assert (top2[0, [0, 4]] > 0).all() and (top2[0, [1, 2, 3]] == 0).all()
    torch.testing.assert_close(top2.sum(-1), torch.ones(1))
    p = torch.softmax(logits, -1)[0]  # sorted masses: 0.636, 0.234, 0.086, ...
    nucleus = warp(logits, 1.0, top_p=0.8)  # 0.636 < 0.8: the second token is needed, the third not
    assert (nucleus[0] > 0).tolist() == [True, False, False, False, True]
    torch.testing.assert_close(nucleus[0, [0, 4]], p[[0, 4]] / p[[0, 4]].sum())
    assert (warp(logits, 1.0, top_p=0.5)[0] > 0).sum() == 1  # the top token always stays
    with pytest.raises(ValueError, match="temperature"):
        warp(logits, 0.0)


# ----------------------------------------------------------------- one verify step, batched
CASES = [
    # temperature, top_k, top_p, pure_prefix_len, block_size, seed
    (0.1, 0, 1.0, 1, 4, 0),
    (0.2, 6, 0.9, 0, 4, 3),
    (0.1, 0, 1.0, 0, 2, 1),  # K = 1: y2 is the bonus token whenever d_1 is accepted
]


@pytest.mark.parametrize("temperature,top_k,top_p,ppl,block_size,seed", CASES)
def test_one_step_matches_target_distribution(temperature, top_k, top_p, ppl, block_size, seed):
    """N independent speculative steps from one context (batched: the rollout and the
    verifier are batched; the drafter's block is the same for every row).

    (y1, y2) = the first two tokens after the anchor. y2 comes from the same step when
    d_1 was accepted; otherwise (the step emitted only y1) it is drawn from the exact
    target distribution, standing in for the next step. Their joint law must be
    p(y1) p(y2 | y1); slot 2 is Domino-corrected, slot 1 too when ppl = 0."""
    vocab, n_samples = 12, 12000
    target, adapter, head = build(seed, vocab=vocab, ppl=ppl, block_size=block_size)
    warp_ = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    prompt = torch.tensor([[3, 7, 2, 9, 4, 5]])
    n, x0 = prompt.shape[1], 6
    with torch.inference_mode():
        _, feats = target(prompt, capture=adapter.capture_layers())
        adapter.reset(1)
        adapter.observe(feats, torch.arange(n))
        one = adapter.propose(torch.tensor([x0]), n)
        # exact: every continuation x0, a of the prompt in one forward
        every = torch.cat([prompt.expand(vocab, -1), torch.full((vocab, 1), x0), torch.arange(vocab)[:, None]], 1)
        logits, _ = target(every)
        p1 = warp(logits[0, n], **warp_)  # [V]   p(y1)
        p2 = warp(logits[:, n + 1], **warp_)  # [V, V] p(y2 | y1)
        joint = p1[:, None] * p2

        block = DraftBlock(one.hidden.expand(n_samples, -1, -1), one.base_logits.expand(n_samples, -1, -1))
        anchor = torch.full((n_samples,), x0)
        g = torch.Generator().manual_seed(seed)
        drafts, q = rollout(head, block, anchor, adapter.embed, generator=g, **warp_)
        rows = torch.cat([prompt.expand(n_samples, -1), anchor[:, None], drafts], 1)
        logits, _ = target(rows)
        p = warp(logits[:, n:], **warp_)  # [N, K+1, V]
        q_base = warp(block.base_logits, **warp_)
        corrected = 1 if ppl == 0 else 2  # the first slot the head corrects
        assert (q - q_base).abs().sum(-1)[0, corrected - 1] > 0.2, "head too weak: the wrong-q check would be vacuous"

        results = {}
        for name, q_given in (("right", q), ("wrong", q_base)):
            g = torch.Generator().manual_seed(100 + seed)
            n_acc, nxt = verify_sampling(p, q_given, drafts, g)
            y1 = torch.where(n_acc >= 1, drafts[:, 0], nxt)
            second = drafts[:, 1] if drafts.shape[1] > 1 else nxt
            y2 = torch.where(n_acc >= 2, second, torch.where(n_acc == 1, nxt, sample(p2[y1], g)))
            counts = torch.bincount(y1 * vocab + y2, minlength=vocab * vocab)
            results[name] = chi_square_pvalue(counts, joint)
    assert results["right"][1] > ALPHA, f"speculative sampling deviates from the target: {results}"
    assert results["wrong"][1] < ALPHA, f"the test cannot tell a wrong q from the right one: {results}"


# ------------------------------------------------------------------ the engine, end to end
@pytest.mark.parametrize("kv", ["dynamic", "static"])
def test_engine_sampling_matches_target_distribution(kv):
    """The real engine (prefill, rollout, verify, caches), one decode per sample: the
    joint law of the first two generated tokens (t0 from the prefill, t1 from the first
    verify step, where slot 1 is Domino-corrected with pure_prefix_len = 0); on the HF
    DynamicCache and on the fast engine's static cache (Engine(kv="static"))."""
    vocab, n_samples = 8, 600
    warp_ = dict(temperature=0.1, top_k=5, top_p=0.95)  # p must be warped exactly as target-only sampling
    target, adapter, head = build(4, vocab=vocab, ppl=0, block_size=3)
    prompt = [2, 5, 3, 6]
    with torch.inference_mode():
        every = torch.cat([torch.tensor([prompt]).expand(vocab, -1), torch.arange(vocab)[:, None]], 1)
        logits, _ = target(every)
    joint = warp(logits[0, -2], **warp_)[:, None] * warp(logits[:, -1], **warp_)

    def wrong_q(head_, block, anchor, embed, **kw):
        drafts, _ = rollout(head_, block, anchor, embed, **kw)
        return drafts, warp(block.base_logits, kw["temperature"], kw["top_k"], kw["top_p"])

    sampling = Sampling(seed=0, **warp_)
    pvalues = {}
    for name in ("right", "wrong"):
        engine = Engine(target, adapter, head, kv=kv)
        if name == "wrong":
            engine.rollout = wrong_q
        counts = torch.zeros(vocab * vocab, dtype=torch.long)
        for i in range(n_samples):
            res = engine.speculative(prompt, max_new_tokens=2, sampling=sampling, seed_offset=i)
            assert res.kv_path == kv
            t0, t1 = res.tokens
            counts[t0 * vocab + t1] += 1
        pvalues[name] = chi_square_pvalue(counts, joint)
    assert pvalues["right"][1] > ALPHA, pvalues
    assert pvalues["wrong"][1] < ALPHA, pvalues


def test_same_seed_same_samples():
    target, adapter, head = build(2, vocab=16, ppl=1)
    engine = Engine(target, adapter, head)
    s = Sampling(temperature=1.0, top_k=8, seed=5)
    a = engine.speculative([3, 4, 5], max_new_tokens=12, sampling=s)
    b = engine.speculative([3, 4, 5], max_new_tokens=12, sampling=s)
    assert a.tokens == b.tokens and len(a.tokens) >= 1
