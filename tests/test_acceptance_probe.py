"""bench/acceptance_probe.py replays greedy decoding from training-style blocks. On the target's
own greedy output it must accept exactly what `Engine.speculative` accepts, block for block: the
training label/GRU convention (`training_blocks`) and the decoding one are the same."""

from __future__ import annotations

import random
import sys

import pytest
import torch

from domino_graft.decoding import Engine
from domino_graft.training.data import Example
from tests.conftest import REPO
from tests.test_decoding import build

sys.path.insert(0, str(REPO / "bench"))
from acceptance_probe import leading_matches, walk  # noqa: E402


def test_walk_steps_over_accepted_drafts():
    assert walk(torch.tensor([0, 0, 0])) == [0, 0, 0]
    # block 0 accepts 2 drafts (+ the target's token): the next block starts 3 tokens later
    assert walk(torch.tensor([2, 9, 9, 1, 9, 0])) == [2, 1, 0]
    assert walk(torch.tensor([5, 0])) == [5]


# Vocabularies of 8-11 tokens: random drafters then accept often enough (runs of 1-3 drafts)
# for block boundaries to matter.
@pytest.mark.parametrize("seed,vocab,block_size,shift,ppl,arch", [
    (1, 11, 4, True, 1, "llama"), (2, 8, 4, True, 1, "llama"), (4, 8, 4, False, 0, "qwen3"),
    (3, 11, 6, True, 0, "qwen3"), (5, 8, 3, False, 1, "llama"), (6, 9, 8, True, 1, "gemma3"),
])
def test_replay_accepts_what_decoding_accepts(seed, vocab, block_size, shift, ppl, arch):
    target, adapter, head = build(seed, arch=arch, vocab=vocab, block_size=block_size, shift=shift, ppl=ppl)
    engine = Engine(target, adapter, head, stop_ids=[])
    rng = random.Random(seed)
    prompt = [rng.randrange(2, vocab - 1) for _ in range(5)]
    ref = engine.target_only(prompt, max_new_tokens=40)
    for use_head in (True, False):
        out = engine.speculative(prompt, max_new_tokens=40, use_head=use_head)
        assert out.tokens == ref.tokens
        ex = Example(prompt + ref.tokens, [0] * len(prompt) + [1] * len(ref.tokens))
        lead_base, lead_final = leading_matches(target, adapter, head, ex, max_anchors=len(ref.tokens))
        replay = walk(lead_final if use_head else lead_base)
        # the last block is cut by max_new_tokens in decoding, by the response's end in the replay
        assert replay[: len(out.accepted) - 1] == out.accepted[:-1], f"use_head={use_head}"
    assert sum(out.accepted) > 0, "the case must accept drafts to test anything"
