"""`observe_prompts` (adapters/base.py): a new prompt taken into a row of a ragged batch in flight, as the
server's admission in place does for the eager drafters (serving/batch.py). The row's next block must be
the block a fresh decode of that prompt proposes, and every other row's block must be what it was."""

from __future__ import annotations

import pytest
import torch

from domino_graft.decoding import Engine
from domino_graft.decoding.batched import ragged_target
from tests.decoding.test_static_kv import graft


@pytest.mark.parametrize("family", ["dspark", "medusa", "pard", "peagle"])
def test_a_prompt_observed_into_a_row_in_flight_drafts_as_a_fresh_decode(family):
    target, adapter, head = graft(family, "qwen3", seed=3)
    engine = Engine(target, adapter, head)
    capture = adapter.capture_layers()
    first = [torch.tensor(p) for p in ([5, 9, 13, 4, 22], [7, 3, 11])]
    new = torch.tensor([12, 6, 8, 30, 2, 17, 9])

    def prefill(prompts):
        _, feats, ids, pos = ragged_target(engine, prompts, 64).prefill(prompts, capture)
        return feats, ids, pos

    with torch.inference_mode():
        feats, ids, pos = prefill(first)
        adapter.reset(2)
        adapter.observe(feats, pos, ids=ids)
        anchors = torch.tensor([21, 14])
        before = adapter.propose(anchors, torch.tensor([5, 3]))
        # row 1's request ended: the new prompt takes it, right-padded into a [2, n] observe
        f1, i1, p1 = prefill([new])
        n = new.numel()
        full_pos = torch.full((2, n), -1, dtype=torch.long)
        full_ids = torch.zeros((2, n), dtype=torch.long)
        full_pos[1], full_ids[1] = p1[0, :n], i1[0, :n]
        full = None if f1 is None else torch.cat([torch.zeros_like(f1[:, :n]), f1[:, :n]])
        adapter.observe_prompts(full, full_pos, full_ids, [1])
        after = adapter.propose(torch.tensor([21, 25]), torch.tensor([5, n]))
        # the reference: the new prompt decoded alone, from reset
        adapter.reset(1)
        adapter.observe(f1, p1, ids=i1)
        fresh = adapter.propose(torch.tensor([25]), torch.tensor([n]))
    torch.testing.assert_close(after.hidden[1], fresh.hidden[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(after.base_logits[1], fresh.base_logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(after.hidden[0], before.hidden[0], rtol=1e-4, atol=1e-4)  # row 0 untouched
    assert not torch.allclose(after.hidden[1], before.hidden[1], atol=1e-3)  # row 1's old context is gone
