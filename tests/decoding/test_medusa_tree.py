"""Medusa tree decoding with Domino heads: per-branch GRU states, lossless greedy verification."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from domino_graft.adapters.base import DraftBlock
from domino_graft.adapters.medusa import adapter as medusa
from domino_graft.decoding import Engine, Sampling
from domino_graft.decoding.tree import ROOT, TreeSpec, draft_tree
from domino_graft.graft import build_head
from domino_graft.recipe import load_recipe
from domino_graft.target import load_target
from tests.conftest import randomize_head

REPO = Path(__file__).resolve().parents[2]
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [0, 0, 0], [0, 1, 0], [1, 0, 0], [1, 0, 0, 0]]


def _tiny(tree=TREE, head_seed=0, pure_prefix_len=1):
    recipe = load_recipe(REPO / "recipes" / "tiny_medusa.yaml",
                         [f"drafter.tree={tree}", f"head.pure_prefix_len={pure_prefix_len}"])
    target = load_target(recipe.target)
    adapter, _ = medusa.build(recipe.drafter, target)
    head = build_head(recipe, adapter)
    randomize_head(head, head_seed)
    return recipe, target, adapter, head


def test_tree_spec_orders_nodes_by_depth_and_masks_ancestors():
    spec = TreeSpec.from_choices([[1, 0], [0], [1], [0, 0]])
    assert spec.paths == ((0,), (1,), (0, 0), (1, 0))
    assert spec.parent == (ROOT, ROOT, 0, 1) and spec.depth == (1, 1, 2, 2)
    vis = spec.visible().int().tolist()  # rows/cols: x_0, (0,), (1,), (0,0), (1,0)
    assert vis == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]]
    with pytest.raises(ValueError, match=r"\[2, 0\] has no parent \[2\]"):
        TreeSpec.from_choices([[0], [2, 0]])


def test_vicuna_tree_costs_one_head_step_per_depth():
    from domino_graft.recipe import load_recipe as load

    tree = load(REPO / "recipes" / "medusa_vicuna_7b.yaml").drafter.tree
    spec = TreeSpec.from_choices(tree)
    assert spec.num_nodes == 63 and spec.max_depth == 4 and len(spec.levels) == 4
    assert [lvl.kmax for lvl in spec.levels] == [10, 10, 10, 2]


@pytest.mark.parametrize("pure_prefix_len", [1, 0])  # 0: depth 1 is corrected too (the Vicuna recipe)
def test_each_node_is_the_ranked_token_of_its_own_branch(pure_prefix_len):
    """Node n at depth d = the rank-th token of the corrected slot-d logits computed with the
    GRU over [x_0, the tokens on n's own path]: teacher-forced head.block is the reference."""
    _, target, adapter, head = _tiny(head_seed=1, pure_prefix_len=pure_prefix_len)
    ids = torch.randint(2, 90, (1, 14), generator=torch.Generator().manual_seed(0))
    _, feats = target(ids, capture=(-1,))
    adapter.reset(1)
    adapter.observe(feats[:, :13], torch.arange(13))
    block = adapter.propose(ids[:, 13], 13)
    spec = TreeSpec.from_choices(TREE)
    tokens = draft_tree(head, block, ids[:, 13], adapter.embed, spec).tolist()
    branch_differs = False
    for n, path in enumerate(spec.paths):
        d, chain = len(path), []
        j = spec.parent[n]
        while j != ROOT:
            chain.insert(0, tokens[j])
            j = spec.parent[j]
        prev = torch.tensor([[int(ids[0, 13])] + chain])
        final = head.block(block.hidden[:, :d], block.base_logits[:, :d], adapter.embed(prev))[0, d - 1]
        assert tokens[n] == int(final.topk(path[-1] + 1).indices[-1]), path
        base_rank = int(block.base_logits[0, d - 1].topk(path[-1] + 1).indices[-1])
        branch_differs |= base_rank != tokens[n]
    assert branch_differs, "the head never changed a node: the test would not see a shared GRU state"


class Oracle:
    """The real Medusa adapter with base logits nudged so the target's continuation sits at a
    chosen rank (0, 1 or 2) of each slot: acceptance then runs through rank>0 branches and
    the cache has to gather a path with gaps."""

    def __init__(self, inner, reference: list[int], seed: int):
        self.inner, self.reference, self.rng = inner, reference, random.Random(seed)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, anchor, position):
        block = self.inner.propose(anchor, position)
        base = block.base_logits.clone()
        for j in range(base.shape[1]):
            at = position + 1 + j
            if at < len(self.reference):
                base[:, j, self.reference[at]] += 40.0
                for decoy in range(self.rng.choice([0, 1, 1, 2])):  # push the truth down to rank 1 or 2
                    base[:, j, (self.reference[at] + 1 + decoy) % base.shape[-1]] += 50.0 + decoy
        return DraftBlock(block.hidden, base)


@pytest.mark.parametrize("seed,pure_prefix_len", [(0, 1), (1, 1), (2, 0)])
def test_tree_greedy_decoding_is_lossless(seed, pure_prefix_len):
    _, target, adapter, head = _tiny(head_seed=seed, pure_prefix_len=pure_prefix_len)
    prompt = torch.randint(2, 90, (10,), generator=torch.Generator().manual_seed(seed)).tolist()
    plain = Engine(target, adapter, head)
    ref = plain.target_only(prompt, max_new_tokens=40)
    for use_head in (True, False):
        assert plain.speculative(prompt, max_new_tokens=40, use_head=use_head).tokens == ref.tokens
    reference = prompt + ref.tokens
    oracle = Engine(target, Oracle(adapter, reference, seed), head)
    out = oracle.speculative(prompt, max_new_tokens=40)
    assert out.tokens == ref.tokens
    assert max(out.accepted) >= 2 and out.tau > 2.0, out.accepted  # deep, partly rank>0 paths accepted
    stopped = oracle.speculative(prompt, max_new_tokens=7)  # max_new_tokens inside an accepted path
    assert stopped.tokens == ref.tokens[:7]


def test_tree_sampling_is_reproducible_and_stops_like_the_target():
    """T > 0 (its distribution is checked in test_tree_sampling.py): the same seed gives the same
    tokens; max_new_tokens and a stop token end the decode where target-only decoding would."""
    _, target, adapter, head = _tiny()
    prompt = [3, 4, 5, 6]
    for use_head in (True, False):
        engine = Engine(target, adapter, head)
        s = Sampling(temperature=0.7, top_k=20, seed=3)
        a = engine.speculative(prompt, max_new_tokens=24, sampling=s, use_head=use_head)
        assert a.tokens == engine.speculative(prompt, max_new_tokens=24, sampling=s, use_head=use_head).tokens
        assert len(a.tokens) == 24 and a.stop_reason == "length" and a.tau >= 1 and max(a.accepted) >= 1
        # the same draws up to the stop: a stop token only truncates
        stop = a.tokens[7]
        cut = engine.speculative(prompt, max_new_tokens=24, sampling=s, use_head=use_head, stop_ids=[stop])
        assert cut.tokens == a.tokens[: a.tokens.index(stop) + 1] and cut.stop_reason == "stop"
