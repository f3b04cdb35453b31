"""The target session contract (decoding/session.py), on both implementations: prefill rows, step
them at their own positions, keep a different count per row (a rollback), free a row and prefill a
new prompt into its slot while the others are in flight. Every logit is checked against the plain
HF forward of that row's verified context alone (no cache)."""

from __future__ import annotations

import pytest
import torch

from domino_graft.decoding.session import DynamicSession, StaticSession
from tests.decoding.test_decoding import build

PROMPTS = [[3, 9, 4, 17, 5], [11], [20, 2, 44, 6]]
NEW = [7, 8, 9]  # the prompt that takes a freed slot


def open_session(kind: str, target, rows: int):
    if kind == "dynamic":
        return DynamicSession(target)
    session, why = StaticSession.create(target, rows, 64)
    assert session is not None, why
    return session


def alone(target, ids: list[int]) -> torch.Tensor:
    """The row's logits at every position, from the target's forward over that row only."""
    return target(torch.tensor([ids]))[0][0]


def check(got: torch.Tensor, want: torch.Tensor, where: str) -> None:
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0, msg=lambda m: f"{where}: {m}")


def step_all(target, session, contexts: list[list[int]], t: int, gen: torch.Generator, where: str):
    """t random tokens per row at each row's own position; -> them, after checking every row's logits."""
    seq = torch.randint(2, 60, (len(contexts), t), generator=gen)
    host = [len(c) for c in contexts]
    logits, _ = session.step(seq, torch.tensor(host), (), host)
    for r, c in enumerate(contexts):
        check(logits[r], alone(target, c + seq[r].tolist())[-t:], f"{where} row {r}")
    return seq


@pytest.mark.parametrize("rows", [3, 1])
@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_session_contract(kind, rows):
    target, _, _ = build(5, arch="llama", vocab=61, layers=3)
    prompts = PROMPTS[:rows]
    session = open_session(kind, target, rows)
    assert session.kv_path == kind
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        last, feats, ids, pos = session.prefill([torch.tensor(p) for p in prompts], ())
        assert feats is None and last.shape[0] == rows
        for r, p in enumerate(prompts):
            check(last[r], alone(target, p)[-1], f"prefill row {r}")
            assert ids[r, : len(p)].tolist() == p and pos[r].tolist()[: len(p)] == list(range(len(p)))
        contexts = [list(p) for p in prompts]
        # two steps, each row keeping its own count of the new entries (the rest rolled back)
        for t, kept in ((3, [3, 1, 2]), (2, [1, 2, 0])):
            seq = step_all(target, session, contexts, t, gen, f"step of {t}")
            kept = kept[:rows] if rows > 1 else [t]  # one row keeps a prefix of `longest` (the contract)
            session.keep(torch.tensor(kept), max(kept))
            contexts = [c + s[:k].tolist() for c, s, k in zip(contexts, seq, kept)]
        # the last row leaves; a new prompt takes its slot while the others stay in flight
        slot = rows - 1
        session.free(slot)
        last, _, _, _ = session.prefill([torch.tensor(NEW)], (), rows=[slot])
        assert last.shape[0] == 1
        check(last[0], alone(target, NEW)[-1], "prefill into the freed slot")
        contexts[slot] = list(NEW)
        step_all(target, session, contexts, 2, gen, "after the refill")


def test_static_prefill_into_a_full_cache_is_refused():
    """A prefill into a slot steps the other rows past everything they wrote (module docstring): with no
    positions left for that, it says so instead of overwriting a row's verified entries."""
    target, _, _ = build(5, arch="llama", vocab=61, layers=3)
    session = open_session("static", target, 2)
    with torch.inference_mode():
        session.prefill([torch.tensor(p) for p in PROMPTS[:2]], ())
        host = [session.lm.max_len - 2, 1]
        session.step(torch.ones(2, 2, dtype=torch.long), None, (), host)
        with pytest.raises(ValueError, match="row 0 has no 16 positions left"):
            session.prefill([torch.tensor(NEW)], (), rows=[1])
        last, _, _, _ = session.prefill([torch.tensor(NEW)], (), rows=[0])  # the full row itself starts anew
        check(last[0], alone(target, NEW)[-1], "prefill into the full row")
