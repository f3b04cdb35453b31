"""serving/lag.py: where lean plain steps leave a served batch's drafter behind, and the chunks that give it back."""

from __future__ import annotations

import random

import pytest

from domino_graft.serving.lag import DrafterLag, chunks


def test_the_hole_begins_at_the_stretchs_first_step_and_at_an_admitted_prompts_first_token():
    lag = DrafterLag()
    lag.admitted([1], [7])  # before a stretch: the prompt's context is all in the drafter
    assert not lag and lag.behind == {}
    lag.begin([10, 20, 30], [True, False, True])
    lag.begin([11, 20, 31], [True, False, True])  # later steps of the stretch move nothing
    lag.admitted([1], [5])  # a prompt admitted into the ended row during the stretch
    assert lag and lag.behind == {0: 10, 1: 5, 2: 30}
    # the stretch ends: row 1 ended again, row 2 decoded nothing since
    assert lag.holes([14, 8, 30], [True, False, True]) == {0: 10}
    assert not lag and lag.behind == {}


@pytest.mark.parametrize("seed", range(40))
def test_chunks_give_back_each_position_of_each_hole_once(seed):
    rng = random.Random(seed)
    t = rng.choice([2, 4, 8, 16])
    b = rng.randint(1, 6)
    pos = [rng.randint(1, 60) for _ in range(b)]
    contexts = [[rng.randrange(100) for _ in range(p)] for p in pos]
    anchors = [rng.randrange(100) for _ in range(b)]
    holes = {r: rng.randint(0, pos[r] - 1) for r in range(b) if rng.random() < 0.7}
    if not holes:
        holes = {0: 0}
    given = {r: [] for r in holes}
    for starts, seqs, owned in chunks(holes, contexts, pos, anchors, t):
        assert len(starts) == len(seqs) == len(owned) == b
        for r in range(b):
            s, seq = starts[r], seqs[r]
            assert len(seq) == t and s >= 0 and s + t <= pos[r] + t  # a verify's room past the anchor
            for i, tok in enumerate(seq):
                # a real token before the anchor, the placeholder at and past it
                assert tok == (contexts[r][s + i] if r in holes and s + i < pos[r] else anchors[r])
                if owned[r][i]:
                    given[r].append(s + i)
            if r not in holes:
                assert s == pos[r] and not any(owned[r])
    for r, first in holes.items():
        assert sorted(given[r]) == list(range(first, pos[r]))  # every hole position, once


def test_a_chunk_ends_at_each_rows_anchor():
    """Right-aligned: the last chunk of a row that catches up ends at its anchor, so nothing past it is written there
    and the cache's room is a verify's."""
    out = list(chunks({0: 32, 1: 30}, [list(range(40)), list(range(40))], [40, 40], [99, 99], 8))
    assert len(out) == 2  # ceil(10 / 8) chunks: the longest hole decides
    assert [starts for starts, _, _ in out] == [[24, 24], [32, 32]]
    assert out[0][2] == [[False] * 8, [False] * 6 + [True] * 2]  # row 0 recomputes 24..31, which it had
    assert out[1][2] == [[True] * 8, [True] * 8]
