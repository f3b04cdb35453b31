"""Tree speculative sampling at T > 0 is lossless in distribution (docs/design.md §5, tree sampling).

As for chains (test_sampling.py): a tiny vocabulary makes the target's joint distribution of
the first generated tokens computable exactly, by enumerating every prefix in one forward;
empirical samples are compared with it by the chi-square test at ALPHA = 1e-3 (cells with
expected count < 5 pooled; the seeds are fixed, so the outcome is too). Every test also runs a
wrong verifier input — the base drafter's distributions passed as q while the nodes were drawn
from the Domino-corrected ones — and asserts that the same test rejects it.
"""

from __future__ import annotations

import pytest
import torch

from domino_graft.adapters.base import DraftBlock
from domino_graft.adapters.medusa import adapter as medusa
from domino_graft.decoding import Engine, Sampling, sample, tree as tree_mod, warp
from domino_graft.decoding.tree import ROOT, TreeSpec, grow_tree, verify_tree_sampling
from domino_graft.graft import build_head
from domino_graft.recipe import load_recipe
from domino_graft.target import load_target
from tests.conftest import REPO, randomize_head
from tests.decoding.test_sampling import ALPHA, chi_square_pvalue

# depth 2; x_0 has 3 children, its first child 2, its second 1: siblings at both depths
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0]]


def build(seed: int, *, vocab: int, tree=TREE, head_scale: float = 1.0):
    """Tiny Medusa (one LM head per slot, 2 target layers) with a random Domino head correcting every slot."""
    recipe = load_recipe(REPO / "recipes" / "tiny_medusa.yaml", [
        f"target.random.vocab_size={vocab}", f"target.random.seed={seed}", "target.random.tie_word_embeddings=false",
        "target.random.num_layers=2", f"drafter.tree={tree}", "drafter.num_heads=2", f"drafter.seed={seed}",
        "head.pure_prefix_len=0",
    ])
    target = load_target(recipe.target)
    adapter, _ = medusa.build(recipe.drafter, target)
    head = build_head(recipe, adapter)
    randomize_head(head, seed, head_scale)
    return target, adapter, head


def base_q(block: DraftBlock, spec: TreeSpec, sampling: Sampling) -> torch.Tensor:
    """The wrong q: every parent's children scored by the base drafter's slot (no Domino head)."""
    b, _, v = block.base_logits.shape
    q = torch.zeros(b, 1 + spec.num_nodes, v)
    flat = warp(block.base_logits, sampling.temperature, sampling.top_k, sampling.top_p)  # [B, K, V]
    for n, par in enumerate(spec.parent):
        q[:, 0 if par == ROOT else 1 + par] = flat[:, spec.depth[n] - 1]
    return q


def exact_tables(target, context: torch.Tensor, vocab: int, warp_: dict):
    """The target's warped distributions after `context` [1, n] and every 1- and 2-token
    continuation of it, from one forward: (p1 [V], p2 [V, V], p3 [V, V, V])."""
    n = context.shape[1]
    a = torch.arange(vocab)
    pairs = torch.stack(torch.meshgrid(a, a, indexing="ij"), -1).reshape(-1, 2)
    logits, _ = target(torch.cat([context.expand(vocab * vocab, -1), pairs], 1))
    p1 = warp(logits[0, n - 1], **warp_)
    p2 = warp(logits[::vocab, n], **warp_)
    p3 = warp(logits[:, n + 1], **warp_).view(vocab, vocab, vocab)
    return p1, p2, p3


def one_block(target, adapter, prompt: torch.Tensor, x0: int, rows: int) -> DraftBlock:
    """The drafter's block for anchor x0 after `prompt`, repeated over `rows` rows."""
    _, feats = target(prompt, capture=adapter.capture_layers())
    adapter.reset(1)
    adapter.observe(feats, torch.arange(prompt.shape[1]))
    one = adapter.propose(torch.tensor([x0]), prompt.shape[1])
    return DraftBlock(one.hidden.expand(rows, -1, -1), one.base_logits.expand(rows, -1, -1))


def node_targets(spec: TreeSpec, tokens: torch.Tensor, p1, p2, p3) -> torch.Tensor:
    """p [B, 1+N, V] at [x_0, nodes] of a depth <= 2 tree, looked up in the exact tables."""
    p = p1.expand(tokens.shape[0], 1 + spec.num_nodes, -1).clone()
    for i, par in enumerate(spec.parent):
        p[:, 1 + i] = p2[tokens[:, i]] if par == ROOT else p3[tokens[:, par], tokens[:, i]]
    return p


STEP_CASES = [
    # temperature, top_k, top_p, seed
    (1.0, 0, 1.0, 0),
    (0.5, 0, 1.0, 1),
    (0.7, 0, 0.8, 3),
    (0.7, 2, 1.0, 2),  # top-2 support < x_0's 3 children: its third child is never drawn
]


@pytest.mark.parametrize("temperature,top_k,top_p,seed", STEP_CASES)
def test_tree_step_matches_target_distribution(temperature, top_k, top_p, seed):
    """N independent tree steps from one context, batched (grow_tree and verify_tree_sampling
    take B rows). (y1, y2, y3) = the first three tokens after the anchor: the accepted path,
    then the step's own draw, then exact target draws standing in for the next steps. Their
    joint law must be p(y1) p(y2 | y1) p(y3 | y1, y2): siblings at depth 1 and 2, the
    residual after each rejection and the bonus after a depth-2 node all count."""
    vocab, n_samples = 8, 20000
    target, adapter, head = build(seed, vocab=vocab)
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    warp_ = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    spec = TreeSpec.from_choices(TREE)
    prompt, x0 = torch.tensor([[3, 7, 2, 5, 4, 6]]), 5
    with torch.inference_mode():
        p1, p2, p3 = exact_tables(target, torch.cat([prompt, torch.tensor([[x0]])], 1), vocab, warp_)
        joint = p1[:, None, None] * p2[:, :, None] * p3
        block = one_block(target, adapter, prompt, x0, n_samples)
        g = torch.Generator().manual_seed(seed)
        draft = grow_tree(head, block, torch.full((n_samples,), x0), adapter.embed, spec, sampling=sampling,
                          generator=g)
        tok = draft.tokens
        p = node_targets(spec, tok, p1, p2, p3)
        wrong = base_q(block, spec, sampling)
        assert (draft.q - wrong)[0, :3].abs().sum(-1).min() > 0.2, "head too weak: the wrong-q check would be vacuous"
        if top_k == 2:
            assert not draft.drawn[:, 2].any() and draft.drawn[:, :2].all()
        results = {}
        for name, q in (("right", draft.q), ("wrong", wrong)):
            g = torch.Generator().manual_seed(100 + seed)
            n_acc, path, nxt = verify_tree_sampling(p, q, tok, draft.drawn, spec, g)
            on_path = tok.gather(1, path.clamp(min=0))
            y1 = torch.where(n_acc >= 1, on_path[:, 0], nxt)
            y2 = torch.where(n_acc >= 2, on_path[:, 1], torch.where(n_acc == 1, nxt, sample(p2[y1], g)))
            y3 = torch.where(n_acc == 2, nxt, sample(p3[y1, y2], g))
            counts = torch.bincount((y1 * vocab + y2) * vocab + y3, minlength=vocab ** 3)
            results[name] = chi_square_pvalue(counts, joint)
    assert results["right"][1] > ALPHA, f"tree sampling deviates from the target: {results}"
    assert results["wrong"][1] < ALPHA, f"the test cannot tell a wrong q from the right one: {results}"


def test_siblings_drawn_with_replacement_break_the_rule():
    """The rule is for children drawn WITHOUT replacement (the next sibling's law excludes the
    rejected ones). Children drawn i.i.d. from the same q and verified by it must fail the test
    that the tree's own draws pass: the draw and the rule belong together."""
    vocab, n_samples, tree = 8, 20000, [[0], [1], [2]]
    target, adapter, head = build(1, vocab=vocab, tree=tree)
    sampling = Sampling(temperature=0.2)
    spec = TreeSpec.from_choices(tree)
    prompt, x0 = torch.tensor([[3, 7, 2, 5, 4, 6]]), 5
    with torch.inference_mode():
        p1, p2, _ = exact_tables(target, torch.cat([prompt, torch.tensor([[x0]])], 1), vocab, dict(temperature=0.2))
        block = one_block(target, adapter, prompt, x0, n_samples)
        g = torch.Generator().manual_seed(1)
        draft = grow_tree(head, block, torch.full((n_samples,), x0), adapter.embed, spec, sampling=sampling,
                          generator=g)
        iid = torch.multinomial(draft.q[:, 0], 3, replacement=True, generator=g)
        results = {}
        for name, tok in (("without replacement", draft.tokens), ("with replacement", iid)):
            g = torch.Generator().manual_seed(101)
            n_acc, path, nxt = verify_tree_sampling(node_targets(spec, tok, p1, p2, None), draft.q, tok,
                                                    draft.drawn, spec, g)
            y1 = torch.where(n_acc >= 1, tok.gather(1, path.clamp(min=0))[:, 0], nxt)
            y2 = torch.where(n_acc >= 1, nxt, sample(p2[y1], g))
            results[name] = chi_square_pvalue(torch.bincount(y1 * vocab + y2, minlength=vocab ** 2),
                                              p1[:, None] * p2)
    assert results["without replacement"][1] > ALPHA, results
    assert results["with replacement"][1] < ALPHA, results


def test_engine_tree_sampling_matches_target_distribution(monkeypatch):
    """The real decoder (prefill, tree growth, one masked target forward over the tree, the walk,
    cache gather), one decode per sample: the joint law of the first three generated tokens
    (t0 from the prefill, t1..t2 from the tree: depth 1, depth 2 or its bonus)."""
    vocab, n_samples = 8, 300
    warp_ = dict(temperature=0.15, top_k=4, top_p=1.0)
    target, adapter, head = build(6, vocab=vocab)
    prompt = [2, 5, 3, 6]
    with torch.inference_mode():
        p1, p2, p3 = exact_tables(target, torch.tensor([prompt]), vocab, warp_)
    joint = p1[:, None, None] * p2[:, :, None] * p3
    real = tree_mod.grow_tree

    def wrong_q(*args, **kw):
        draft = real(*args, **kw)
        draft.q = base_q(args[1], args[4], kw["sampling"])
        return draft

    sampling = Sampling(seed=0, **warp_)
    pvalues = {}
    for name in ("right", "wrong"):
        monkeypatch.setattr(tree_mod, "grow_tree", real if name == "right" else wrong_q)
        engine = Engine(target, adapter, head)
        counts = torch.zeros(vocab ** 3, dtype=torch.long)
        for i in range(n_samples):
            t0, t1, t2 = engine.speculative(prompt, max_new_tokens=3, sampling=sampling, seed_offset=i).tokens
            counts[(t0 * vocab + t1) * vocab + t2] += 1
        pvalues[name] = chi_square_pvalue(counts, joint)
    assert pvalues["right"][1] > ALPHA, pvalues
    assert pvalues["wrong"][1] < ALPHA, pvalues


def test_tree_draws_are_distinct_siblings_inside_q():
    """Every drawn node lies in the support of the q it was drawn from, siblings differ, the
    walk's static iteration count covers the longest walk, and greedy growth is batched alike."""
    target, adapter, head = build(0, vocab=97)
    spec = TreeSpec.from_choices(TREE)
    assert spec.kids.tolist()[:3] == [[0, 1, 2], [3, 4, -1], [5, -1, -1]]
    assert spec.walk_steps == 3 + 2 + 1  # worst walk: 3 tries at x_0, 2 at node 0, then the end
    with torch.inference_mode():
        block = one_block(target, adapter, torch.tensor([[3, 7, 2, 5, 4, 6]]), 5, 64)
        anchor = torch.full((64,), 5)
        g = torch.Generator().manual_seed(0)
        draft = grow_tree(head, block, anchor, adapter.embed, spec, sampling=Sampling(temperature=1.0, top_k=3),
                          generator=g)
        for i, par in enumerate(spec.parent):
            row = 0 if par == ROOT else 1 + par
            assert (draft.q[:, row].gather(1, draft.tokens[:, i, None]) > 0).all()
        assert (draft.tokens[:, 0] != draft.tokens[:, 1]).all() and (draft.tokens[:, 3] != draft.tokens[:, 4]).all()
        greedy = grow_tree(head, block, anchor, adapter.embed, spec).tokens
        assert greedy.unique(dim=0).shape[0] == 1 and draft.q is not None
        assert torch.equal(greedy[0], tree_mod.draft_tree(head, DraftBlock(block.hidden[:1], block.base_logits[:1]),
                                                          anchor[:1], adapter.embed, spec))


def test_bench_tree_at_temperature_1_reports_tau(tmp_path):
    """`bench --temperature 1` on a Medusa tree run completes and reports tau."""
    import json

    from domino_graft.apply import apply_recipe
    from tests.decoding.test_decoding import run_command

    run = tmp_path / "tree"
    apply_recipe(str(REPO / "recipes" / "tiny_medusa.yaml"), str(run), echo=lambda *_: None,
                 overrides=["drafter.tree=[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0]]"])
    out = tmp_path / "bench.json"
    assert run_command("bench", [str(run), "--temperature", "1", "--seed", "0", "--limit", "2",
                                 "--max-new-tokens", "12", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["temperature"] == 1.0 and rep["tau"] >= 1 and rep["base"]["tau"] >= 1
    assert rep["identical_to_target"] is None and sum(rep["slot_reached"]) > 0
