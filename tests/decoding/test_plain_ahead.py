"""The target alone's loop a step ahead (decoding/batched.py `_target_steps` and the solo
`Engine.target_only`, DOMINO_GRAFT_PLAIN_AHEAD=1 on CUDA): step n + 1 is launched before step n's tokens
are read. Forced on here (CPU, static cache), it must give every row the tokens, stop reason and forward
count of the loop that reads each step first: rows ending on a stop token at different steps, rows reaching
max_new_tokens, a batch that shrinks, greedy and sampled, the plain decode a verify budget commits to (its
per-step accepted counts too), and the solo loop (its streamed chunks too).
"""

from __future__ import annotations

import random

import pytest

from domino_graft.decoding import Engine, Sampling, batched, stop_token_ids
from domino_graft.decoding import engine as engine_module
from domino_graft.decoding.budget import VerifyBudget, VerifyCosts
from domino_graft.decoding.common import TokenReader
from tests.decoding.test_batched import variant
from tests.decoding.test_decoding import build


class LoggedReader(TokenReader):
    """TokenReader that logs each send and read in order (which step was read when)."""

    log: list = []

    def send(self, tok):
        step = sum(1 for e in self.log if e[0] == "send")
        self.log.append(("send", step))
        read = super().send(tok)

        def logged():
            self.log.append(("read", step))
            return read()

        return logged


def _setup(seed: int):
    cfg = variant(seed)
    target, adapter, head = build(seed, **cfg)
    rng = random.Random(seed)
    b = rng.randint(3, 8)
    prompts = [[rng.randrange(2, cfg["vocab"] - 1) for _ in range(rng.randint(1, 14))] for _ in range(b)]
    engine = Engine(target, adapter, head, stop_ids=stop_token_ids(target))
    budget = rng.choice([9, 16, 24])
    first = engine.target_only_batch(prompts, max_new_tokens=budget)
    # stop tokens some rows emit early and at different steps: they end while the others go on
    early = sorted({t for r in first for t in r.tokens[1: budget // 2]})
    stops = rng.sample(early, min(2, len(early)))
    return engine, prompts, budget, stops


def _decode(engine, prompts, budget, stops, monkeypatch, ahead: bool, **kw):
    LoggedReader.log = []
    monkeypatch.setattr(batched, "TokenReader", LoggedReader)
    monkeypatch.setattr(batched, "reads_ahead", lambda target, device: ahead)
    return engine.target_only_batch(prompts, max_new_tokens=budget, stop_ids=stops, **kw), list(LoggedReader.log)


def _ran_ahead(log) -> bool:
    """Some step n + 1 was sent before step n was read."""
    at = {e: i for i, e in enumerate(log)}
    return any(("send", n + 1) in at and at[("send", n + 1)] < at[("read", n)] for _, n in log if ("read", n) in at)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_step_ahead_gives_every_row_the_same_decode(seed, temperature, monkeypatch):
    """Sampled, the batch keeps its size here: a step ahead learns a step later that half its rows ended, so it
    shrinks a step later, and a step's draws follow the batch's size (each row's draw is still its own fresh
    uniform, so its law is the target's either way); at one size throughout the draws, hence tokens, are equal."""
    engine, prompts, budget, stops = _setup(seed)
    if temperature:
        monkeypatch.setattr(batched, "_shrink", lambda live: None)
    for sampling in (Sampling(temperature=temperature, seed=seed if temperature else None),):
        want, log_first = _decode(engine, prompts, budget, stops, monkeypatch, False, sampling=sampling)
        got, log_ahead = _decode(engine, prompts, budget, stops, monkeypatch, True, sampling=sampling)
        where = f"seed {seed} prompts {prompts} stops {stops} T={sampling.temperature}"
        assert got[0].kv_path == "static", where
        assert [r.tokens for r in got] == [r.tokens for r in want], where
        assert [r.stop_reason for r in got] == [r.stop_reason for r in want], where
        assert [r.target_forwards for r in got] == [r.target_forwards for r in want], where
        assert _ran_ahead(log_ahead) and not _ran_ahead(log_first), where
        # at most one step more: launched for rows that had ended on a stop token unread
        assert len(log_first) // 2 <= len(log_ahead) // 2 <= len(log_first) // 2 + 1, where


def test_rows_reaching_max_new_tokens_take_no_step_past_it(monkeypatch):
    """With no stop token every row ends at max_new_tokens, which the host knows ahead: a step ahead launches
    exactly the steps the reading loop does, and reads each one after launching the next."""
    engine, prompts, budget, _ = _setup(3)
    engine = Engine(engine.target, engine.adapter, engine.head)  # no stop ids at all
    want, log_first = _decode(engine, prompts, budget, [], monkeypatch, False)
    got, log_ahead = _decode(engine, prompts, budget, [], monkeypatch, True)
    assert all(r.stop_reason == "length" for r in want)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert sorted(log_ahead) == sorted(log_first) and _ran_ahead(log_ahead)


def test_the_plain_decode_a_budget_commits_to_is_the_same_a_step_ahead(monkeypatch):
    """A batched chain whose verify budget starts committed runs this loop with a budget's run: its rows'
    tokens, forwards and per-step accepted counts (a 0 a plain step) are the reading loop's."""
    engine, prompts, budget, stops = _setup(5)
    b = len(prompts)
    costs = VerifyCosts.from_dict({"step_ms": {str(b): {"1": 1.0, "4": 50.0, "8": 50.0, "16": 50.0}},
                                   "propose_ms": {str(b): 5.0}, "rollout_ms": {str(b): 1.0}})
    out = {}
    for ahead in (False, True):
        monkeypatch.setattr(batched, "reads_ahead", lambda target, device, ahead=ahead: ahead)
        plan = VerifyBudget("auto", costs=costs)
        for _ in range(3):  # the first decode at a size measures; later ones start committed (budget.py)
            got = engine.speculative_batch(prompts, max_new_tokens=budget, stop_ids=stops, budget=plan)
        assert engine.last_run.starts_committed
        out[ahead] = got
    for key in ("tokens", "stop_reason", "target_forwards", "accepted"):
        assert [getattr(r, key) for r in out[True]] == [getattr(r, key) for r in out[False]], key


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_solo_loop_a_step_ahead_gives_the_same_decode(seed, temperature, monkeypatch):
    """Engine.target_only a step ahead: the same tokens, stop reason, forward count and streamed chunks, with a
    stop token that ends it early and with max_new_tokens; sampled too (one row: the draws are the same)."""
    engine, prompts, budget, stops = _setup(seed)
    sampling = Sampling(temperature=temperature, seed=seed if temperature else None)
    for prompt in prompts[:3]:
        for stop in (stops, []):
            got = {}
            for ahead in (False, True):
                LoggedReader.log = []
                monkeypatch.setattr(engine_module, "TokenReader", LoggedReader)
                monkeypatch.setattr(engine_module, "reads_ahead", lambda target, device, ahead=ahead: ahead)
                streamed = []
                r = engine.target_only(prompt, max_new_tokens=budget, stop_ids=stop, sampling=sampling,
                                       on_tokens=streamed.append)
                got[ahead] = (r.tokens, r.stop_reason, r.target_forwards, streamed, list(LoggedReader.log))
            where = f"seed {seed} prompt {prompt} stop {stop}"
            assert got[True][:4] == got[False][:4], where
            assert _ran_ahead(got[True][4]) and not _ran_ahead(got[False][4]), where
