"""serve's batches stepping ahead of their reads, forced on here (CPU, the static cache):

- ChainBatch drafting block n + 1 before it reads block n (serving/batch.py "Drafted ahead"; a static DFlash
  drafter that takes device positions, nudged toward each row's greedy continuation so that blocks accept several
  tokens): prompts through the scheduler, more than its rows, so that rows end and new ones are admitted into
  freed slots while a block drafted for the row before them is pending. Every greedy request's tokens must be the
  target alone's, with blocks drafted ahead exactly when forced on; sampled rows beside greedy ones (a slot whose
  setting changes drops its block) must leave the greedy rows exact.
- the plain step launched before the one before it is read (serving/batch.py "A plain step ahead"): `serve
  --target-only`'s batch, and a ChainBatch whose verify budget committed to plain steps, give every request the
  target alone's tokens, rows admitted while a step is under way included.
"""

from __future__ import annotations

import random

from domino_graft.decoding import Engine, Sampling, batched, stop_token_ids
from domino_graft.decoding.budget import VerifyBudget, VerifyCosts
from domino_graft.decoding.session import StaticSession
from domino_graft.serving import batch as batch_module
from domino_graft.serving.scheduler import Scheduler
from tests.decoding.test_batched import build, variant
from tests.decoding.test_spec_ahead import LoggedReader, Oracle, _ahead
from tests.test_concurrency_bench import load_module


def _force(monkeypatch, on: bool, plain: bool = False) -> None:
    def ahead(target, drafter, device):
        return on and isinstance(target, StaticSession) and batched.takes_device_positions(drafter)

    monkeypatch.setattr(batch_module, "drafts_ahead", ahead)
    monkeypatch.setattr(batch_module, "reads_ahead", lambda target, device: plain and isinstance(target, StaticSession))
    monkeypatch.setattr(batch_module, "TokenReader", LoggedReader)


def _setup(seed: int, n: int = 9):
    """Prompts that are prefixes of one greedy line (so the line is every row's continuation, and a slot's nudges
    fit whichever row is in it), each with its own max_tokens and some with a stop token that ends them early,
    and each one's target-alone tokens. No end-of-text token: the line runs past every row's budget."""
    cfg = variant(seed)
    target, adapter, head = build(seed, **cfg)
    plain = Engine(target, adapter, head, stop_ids=())
    rng = random.Random(seed)
    start = [rng.randrange(2, cfg["vocab"] - 1) for _ in range(3)]
    line = start + plain.target_only(start, max_new_tokens=60).tokens
    prompts = [line[: rng.randint(1, 14)] for _ in range(n)]
    budgets = [rng.randint(3, 24) for _ in range(n)]
    stops = [[] if rng.random() < 0.6 else [rng.choice(line[20:])] for _ in range(n)]
    refs = [plain.target_only(p, max_new_tokens=m, stop_ids=x).tokens for p, m, x in zip(prompts, budgets, stops)]
    oracle = Oracle(adapter, [line] * 8, list(range(8)), 0.8, seed, cfg["vocab"])
    return Engine(target, oracle, head, stop_ids=()), oracle, prompts, budgets, stops, refs


def _serve(engine, prompts, budgets, stops, samplings, rows: int, **kw) -> tuple[list[list[int]], Scheduler]:
    """Every prompt submitted at once to a scheduler of `rows` rows -> (each request's tokens, the scheduler)."""
    s = Scheduler(engine, max_batch=rows, max_queue=len(prompts), **kw)
    s.start()
    try:
        specs = [dict(prompt_ids=p, max_tokens=m, sampling=smp, stop=[], stop_ids=frozenset(x))
                 for p, m, x, smp in zip(prompts, budgets, stops, samplings)]
        return load_module("rollouts").run_jobs(s, specs, timeout_s=120), s
    finally:
        s.stop(timeout=30)


def test_served_greedy_rows_drafted_ahead_are_the_target_alone(monkeypatch):
    """Tokens: the target alone's either way (a verify is lossless whatever drafted its tokens). Blocks: a block drafted
    ahead at a wrong device position is nudged toward the wrong tokens and accepts little, so the decode needs more
    blocks: forced on it needs about as many as the loop that reads each block first (the admitted rows' first blocks,
    drafted for the rows before them, accept little). A device position that moved by one token a block, not by
    the block's accepts, took 1.57x the blocks here."""
    blocks = {False: 0, True: 0}
    for seed in range(4):
        engine, oracle, prompts, budgets, stops, refs = _setup(seed)
        for on in (False, True):
            _force(monkeypatch, on)
            oracle.log.clear()
            LoggedReader.log = oracle.log
            got, s = _serve(engine, prompts, budgets, stops, [Sampling()] * len(prompts), rows=3)
            where = f"seed {seed} ahead {on} prompts {prompts} budgets {budgets} stops {stops}"
            assert got == refs, where
            assert s.admitted_in_place > 0, where  # rows were admitted into a batch in flight
            assert (_ahead(oracle.log) > 0) == on, where
            blocks[on] += oracle.log.count("send")
    assert blocks[True] <= 1.15 * blocks[False], blocks


def test_sampled_rows_beside_greedy_ones_leave_the_greedy_rows_exact(monkeypatch):
    """A slot whose row changes setting drops the block drafted for it (its verify groups changed); greedy rows
    stay the target alone's whatever their neighbours sample."""
    engine, oracle, prompts, budgets, stops, refs = _setup(5, n=12)
    samplings = [Sampling() if i % 3 else Sampling(temperature=1.0, seed=i) for i in range(len(prompts))]
    _force(monkeypatch, True)
    oracle.log.clear()
    LoggedReader.log = oracle.log
    dropped = []  # blocks drafted ahead that an admission with another setting dropped
    drop = batch_module.ChainBatch.drop_drafted

    def recorded(self):
        dropped.append(self.drafted is not None)
        drop(self)

    monkeypatch.setattr(batch_module.ChainBatch, "drop_drafted", recorded)
    got, _ = _serve(engine, prompts, budgets, stops, samplings, rows=3)
    for i, (tokens, ref, smp) in enumerate(zip(got, refs, samplings)):
        if smp.greedy:
            assert tokens == ref, (i, prompts[i])
        else:  # a sampled request ran to its stop token or its budget
            assert tokens and (len(tokens) == budgets[i] or set(tokens[-1:]) <= set(stops[i])), i
    assert _ahead(oracle.log) > 0 and any(dropped)


def _plain_sends_ahead(log: list) -> bool:
    """Two sends in a row somewhere: a step launched before the one before it was read."""
    return any(a == b == "send" for a, b in zip(log, log[1:]))


def test_served_plain_steps_a_step_ahead_are_the_target_alone(monkeypatch):
    for seed in range(4):
        engine, oracle, prompts, budgets, stops, refs = _setup(seed)
        costs = VerifyCosts.from_dict({"step_ms": {"3": {"1": 1.0, "4": 50.0, "8": 50.0, "16": 50.0}},
                                       "propose_ms": {"3": 5.0}, "rollout_ms": {"3": 1.0}})
        for target_only, budget in ((True, None), (False, VerifyBudget("auto", costs=costs))):
            for plain in (False, True):
                _force(monkeypatch, False, plain=plain)
                oracle.log.clear()
                LoggedReader.log = oracle.log
                got, s = _serve(engine, prompts, budgets, stops, [Sampling()] * len(prompts), rows=3,
                                target_only=target_only, budget=budget)
                where = f"seed {seed} target_only {target_only} ahead {plain} prompts {prompts} budgets {budgets}"
                assert got == refs, where
                assert s.admitted_in_place > 0, where
                assert _plain_sends_ahead(oracle.log) == plain, where
