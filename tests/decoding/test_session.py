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


def test_static_prefill_into_a_full_cache_is_refused(monkeypatch):
    """A prefill into a slot of the whole batch steps the other rows past everything they wrote (module
    docstring): with no positions left for that, it says so instead of overwriting a row's verified entries. One
    that runs the admitted row alone (`admission_rows`) parks nothing, and the full row keeps its entries."""
    from domino_graft.decoding import session as session_module

    monkeypatch.setattr(session_module, "ADMIT_ROWS", True)
    target, _, _ = build(5, arch="llama", vocab=61, layers=3)
    session = open_session("static", target, 2)
    with torch.inference_mode():
        session.prefill([torch.tensor(p) for p in PROMPTS[:2]], ())
        host = [session.lm.max_len - 2, 1]
        session.step(torch.ones(2, 2, dtype=torch.long), None, (), host)
        kept = [k[0].clone() for k in session.lm.cache.k]
        last, _, _, _ = session.prefill([torch.tensor(NEW)], (), rows=[1])  # alone: nothing parks
        check(last[0], alone(target, NEW)[-1], "prefill of the row alone")
        assert all(torch.equal(k[0], was) for k, was in zip(session.lm.cache.k, kept))
        monkeypatch.setattr(session_module, "ADMIT_ROWS", False)
        with pytest.raises(ValueError, match="row 0 has no 16 positions left"):
            session.prefill([torch.tensor(NEW)], (), rows=[1])
        last, _, _, _ = session.prefill([torch.tensor(NEW)], (), rows=[0])  # the full row itself starts anew
        check(last[0], alone(target, NEW)[-1], "prefill into the full row")


@pytest.mark.parametrize("admit_rows", [True, False])
def test_an_admission_runs_only_the_admitted_rows(admit_rows, monkeypatch):
    """A prefill into freed slots of a static batch in flight runs the admitted rows alone, moved to the front of
    the cache (a power of two of rows: decoding/session.py `admission_rows`), and every row goes back to its slot:
    the admitted rows' logits are their prompts' alone, and every row's next step is its own context's. With
    DOMINO_GRAFT_ADMIT_ROWS=0 the prefill runs the whole batch (the other rows parked)."""
    from domino_graft.decoding import session as session_module
    from domino_graft.decoding.session import _inverse, _to_front

    monkeypatch.setattr(session_module, "ADMIT_ROWS", admit_rows)
    target, _, _ = build(5, arch="llama", vocab=61, layers=3)
    session = open_session("static", target, 8)
    ran = []
    runner = session._runner

    def recorded(capture):
        run = runner(capture)
        return lambda ids, *a, **kw: (ran.append(ids.shape[0]), run(ids, *a, **kw))[1]

    monkeypatch.setattr(session, "_runner", recorded)
    gen = torch.Generator().manual_seed(1)
    prompts = [[2 + (7 * r + i) % 50 for i in range(3 + r)] for r in range(8)]
    with torch.inference_mode():
        session.prefill([torch.tensor(p) for p in prompts], ())
        contexts = [list(p) for p in prompts]
        seq = step_all(target, session, contexts, 2, gen, "before")
        contexts = [c + s.tolist() for c, s in zip(contexts, seq)]
        for slots in ([6], [5, 1], [7, 0, 3]):
            news = [[9 + s, 4, 30 + s, 2][: 2 + s % 3] for s in slots]
            ran.clear()
            last, _, _, _ = session.prefill([torch.tensor(n) for n in news], (), rows=slots)
            assert ran == [min(1 << (len(slots) - 1).bit_length(), 4) if admit_rows else 8]
            for i, (s, n) in enumerate(zip(slots, news)):
                check(last[i], alone(target, n)[-1], f"admitted into slot {s}")
                contexts[s] = list(n)
            seq = step_all(target, session, contexts, 2, gen, f"after admitting into {slots}")
            contexts = [c + q.tolist() for c, q in zip(contexts, seq)]
    order = _to_front([5, 1, 6], 8)
    assert order[:3] == [5, 1, 6] and sorted(order) == list(range(8))
    assert [order[i] for i in _inverse(order)] == list(range(8))


def test_an_admission_with_no_room_to_park_leaves_every_row_in_its_slot(monkeypatch):
    """Three rows admitted into a batch of 8 run as the front four, the fourth row parked past its end: where it has
    no room the prefill says so (the caller rebuilds) and every row is back in its slot, its entries as they were."""
    from domino_graft.decoding import session as session_module

    monkeypatch.setattr(session_module, "ADMIT_ROWS", True)
    target, _, _ = build(5, arch="llama", vocab=61, layers=3)
    session = open_session("static", target, 8)
    with torch.inference_mode():
        session.prefill([torch.tensor([3 + r, 4, 5 + 2 * r]) for r in range(8)], ())  # each row its own entries
        host = [session.lm.max_len - 2 if r == 3 else 3 for r in range(8)]  # row 3: deep, no room to park
        session.step(torch.ones(8, 2, dtype=torch.long), None, (), host)
        cache = session.lm.cache
        before = ([k.clone() for k in cache.k], cache.lengths.clone(), list(session._ends))
        with pytest.raises(ValueError, match="positions left to park"):
            session.prefill([torch.tensor(NEW)] * 3, (), rows=[5, 6, 7])
        assert all(torch.equal(k, was) for k, was in zip(cache.k, before[0]))
        assert torch.equal(cache.lengths, before[1]) and session._ends == before[2]
