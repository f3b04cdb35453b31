"""serving/batch.py at T > 0 in a batch shared with greedy rows: each sampled row is distributed as
the target's own sampling, and each greedy row equals the target alone's greedy decode.

The exact-law chi-square test of tests/decoding/test_batched_sampling.py (a peaked tiny target on an
8-token vocabulary, the joint law of the first three tokens enumerated), on a ChainBatch whose rows
are sampled at T = 1 or greedy, so every step runs two rollouts and two verifies. Its control,
the base drafter's q handed to the verifier, must be rejected.
"""

from __future__ import annotations

from domino_graft.decoding import Engine, Sampling, rollout
from domino_graft.decoding.common import Output
from domino_graft.serving.batch import BatchRow, ChainBatch
from tests.decoding.test_batched_sampling import PROMPTS, exact_joints, peaked, row_pvalues, wrong_q
from tests.decoding.test_sampling import ALPHA

ROWS_PER_PROMPT = 1000  # a third of test_batched_sampling's: the control is still rejected at p < 1e-20


def _wrong_when_sampled(head, block, anchor, embed, **kw):
    """The control's wrong q for the sampled rows; greedy rows keep the real rollout."""
    if kw["temperature"] == 0:
        return rollout(head, block, anchor, embed, **kw)
    return wrong_q(head, block, anchor, embed, **kw)


def _decode(engine, rows: list[tuple[list[int], Sampling]], seed: int) -> list[Output]:
    outs = [Output(3, frozenset(), None) for _ in rows]
    batch = ChainBatch(engine, [BatchRow(p, None, len(p) + 3, s, out.push, lambda: True)
                                for (p, s), out in zip(rows, outs)], use_head=True, seed=seed)
    for _ in range(10):  # 3 tokens: the prefill's and at most 2 blocks
        if not batch.any_live:
            break
        batch.step()
    assert not batch.any_live
    return outs


def test_sampled_rows_beside_greedy_rows_have_the_target_distribution(top_p=1.0, seed=0):
    target, adapter, head = peaked(seed)
    warp_ = dict(temperature=1.0, top_k=0, top_p=top_p)
    joints = exact_joints(target, warp_)
    sampled = [PROMPTS[i % len(PROMPTS)] for i in range(len(PROMPTS) * ROWS_PER_PROMPT)]
    rows = [(p, Sampling(**warp_)) for p in sampled]
    rows += [(p, Sampling()) for p in PROMPTS * 50]  # greedy rows in the same batch
    engine = Engine(target, adapter, head)
    greedy = {tuple(p): engine.target_only(p, max_new_tokens=3).tokens for p in PROMPTS}
    pvalues = {}
    for name in ("right", "wrong"):
        if name == "wrong":
            engine.rollout = _wrong_when_sampled
        outs = _decode(engine, rows, seed)
        for (p, s), out in zip(rows, outs):
            if s.greedy:
                assert out.tokens == greedy[tuple(p)], "a greedy row depends on the sampled rows beside it"
        pvalues[name] = row_pvalues(outs[: len(sampled)], joints)
    assert min(pvalues["right"]) > ALPHA, f"a sampled row deviates from the target: {pvalues}"
    assert max(pvalues["wrong"]) < ALPHA, f"the test cannot tell a wrong q from the right one: {pvalues}"
