"""A speculative step drafted ahead (decoding/batched.py "Drafted ahead", `drafts_ahead`; the solo chain in
decoding/chain.py): step n + 1's propose and rollout are launched from the anchors and positions step n's verify
left on the device, before the host reads step n. Forced on here (CPU, the static cache, DFlash's static drafter
nudged toward each row's reference at the positions it is given, so that a wrong device position shows as other
accepts), it must give every row the same decode as the loop that reads each step first:
- batched greedy, at full K, a fixed K' and under auto: the target alone's tokens, and (where both loops choose the
  same K's) the same stop reasons, forwards and accepted counts; rows that end on a stop token while others go on;
- batched sampled at full K: the same tokens (the generator's draws keep their order);
- the solo chain, greedy and sampled;
and a step drafted ahead whose batch ended leaves no count in the budget's report.
"""

from __future__ import annotations

import random

import pytest
import torch

from domino_graft.adapters.dflash.fast import StaticDFlashDrafter
from domino_graft.decoding import Engine, Sampling, batched, chain, stop_token_ids
from domino_graft.decoding.budget import VerifyBudget, VerifyCosts
from domino_graft.decoding.common import TokenReader
from domino_graft.decoding.session import StaticSession
from domino_graft.fast import host_ints
from tests.decoding.test_batched import RowOracle
from tests.decoding.test_plain_ahead import _setup as plain_setup


class LoggedReader(TokenReader):
    """TokenReader that logs each step's send and read into the oracle's log."""

    log: list = []

    def send(self, tok):
        self.log.append("send")
        read = super().send(tok)

        def logged():
            self.log.append("read")
            return read()

        return logged


def _ahead(log: list[str]) -> int:
    """The proposes launched between a step's send and its read: blocks drafted ahead."""
    sent, n = False, 0
    for e in log:
        sent = e == "send" or (sent and e != "read")
        n += sent and e == "propose"
    return n


class AheadNudged(RowOracle):
    """RowOracle's nudges over a static DFlash drafter that takes device positions (`at`): nudged at the positions
    the device holds, so a block drafted at a wrong position accepts differently. Logs its proposes."""

    positions_on_device = True

    def __init__(self, *a, log: list, **kw):
        super().__init__(*a, **kw)
        self.log = log

    def propose(self, anchor, position, at=None):
        block = self.inner.propose(anchor, position, at)
        self.log.append("propose")
        starts = host_ints(position, anchor.shape[0]) if at is None else at.tolist()
        return self.nudge(block, starts)


class Oracle(RowOracle):
    """An adapter whose static drafters (batched and solo) are AheadNudged."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.log: list[str] = []

    def static_batch_drafter(self, max_len, batch):
        fast = self.inner.static_batch_drafter(max_len, batch)
        return AheadNudged(fast, self.references, self.rows, self.hit, self.seed, self.vocab, log=self.log)

    def static_drafter(self, max_len):
        fast = self.inner.static_drafter(max_len)
        return AheadNudged(fast, self.references, self.rows, self.hit, self.seed, self.vocab, log=self.log)


def _force(monkeypatch, on: bool) -> None:
    def ahead(target, drafter, device):
        return on and isinstance(target, StaticSession) and batched.takes_device_positions(drafter)

    monkeypatch.setattr(batched, "drafts_ahead", ahead)
    monkeypatch.setattr(chain, "drafts_ahead", ahead)
    monkeypatch.setattr(batched, "TokenReader", LoggedReader)
    monkeypatch.setattr(chain, "TokenReader", LoggedReader)


def _setup(seed: int):
    """test_plain_ahead's case (a tiny DFlash build, ragged prompts, stop tokens some rows emit early) with each row's
    target-alone reference and an Oracle nudging the drafts toward it."""
    plain, prompts, budget, extra = plain_setup(seed)
    budget += 16  # past any block (K <= 7 here): steps to draft ahead of, not only steps that may end a decode
    refs = [plain.target_only(p, max_new_tokens=budget, stop_ids=extra).tokens for p in prompts]
    vocab = plain.target.shape.vocab_size
    oracle = Oracle(plain.adapter, [p + r for p, r in zip(prompts, refs)], list(range(len(prompts))), 0.75, seed, vocab)
    return plain.target, oracle, plain.head, prompts, budget, extra, refs


def _solo(target, oracle: Oracle, head, r: int) -> Engine:
    """A solo engine (the static cache) over row r's nudges."""
    solo = Oracle(oracle.inner, [oracle.references[r]], [r], oracle.hit, oracle.seed, oracle.vocab)
    return Engine(target, solo, head, stop_ids=stop_token_ids(target), kv="static")


def _decode(oracle: Oracle, monkeypatch, on: bool, decode):
    """decode() with drafting ahead forced on or off, the oracle's log fresh; -> (its result, blocks drafted ahead)."""
    _force(monkeypatch, on)
    oracle.log.clear()
    LoggedReader.log = oracle.log
    return decode(), _ahead(oracle.log)


def _costs(b: int) -> VerifyCosts:
    return VerifyCosts.from_dict({"step_ms": {str(b): {"1": 1.0, "4": 1.3, "8": 1.6, "16": 2.2}},
                                  "propose_ms": {str(b): 0.3}})


def _steps(results) -> int:
    return max(len(r.accepted) for r in results)


@pytest.mark.parametrize("seed", range(6))
def test_batched_greedy_drafted_ahead_is_the_same_decode(seed, monkeypatch):
    target, oracle, head, prompts, budget, extra, refs = _setup(seed)
    engine = Engine(target, oracle, head, stop_ids=stop_token_ids(target))
    k = oracle.num_slots
    for spec in (None, str(max(1, k - 1)), "auto"):
        got = {}
        for on in (False, True):
            plan = None if spec is None else VerifyBudget.parse(spec, _costs(len(prompts)))
            got[on], ahead = _decode(oracle, monkeypatch, on, lambda: engine.speculative_batch(
                prompts, max_new_tokens=budget, stop_ids=extra, budget=plan))
            where = f"seed {seed} budget {spec} ahead {on} prompts {prompts} stops {extra}"
            assert got[on][0].kv_path == "static" and engine.batch_drafter_path == "static", where
            assert [r.tokens for r in got[on]] == refs, where
            assert bool(ahead) == on, where  # blocks were drafted ahead exactly when forced on
            if plan is not None:  # every step chosen was verified: a step drafted ahead of the end is withdrawn
                assert sum(engine.last_budget["k_hist"].values()) == _steps(got[on]), where
        if spec != "auto":  # the same K' every step: the same drafts, so the same accepts
            for key in ("stop_reason", "target_forwards", "accepted", "slot_reached", "slot_accepted"):
                assert [getattr(r, key) for r in got[True]] == [getattr(r, key) for r in got[False]], (key, spec)


@pytest.mark.parametrize("seed", range(3))
def test_batched_sampled_drafted_ahead_draws_the_same_tokens(seed, monkeypatch):
    target, oracle, head, prompts, budget, extra, _ = _setup(seed)
    engine = Engine(target, oracle, head, stop_ids=stop_token_ids(target))
    sampling = Sampling(temperature=1.0, seed=seed)
    got = {}
    for on in (False, True):
        got[on], ahead = _decode(oracle, monkeypatch, on, lambda: engine.speculative_batch(
            prompts, max_new_tokens=budget, stop_ids=extra, sampling=sampling))
        assert bool(ahead) == on
    for key in ("tokens", "stop_reason", "target_forwards", "accepted"):
        assert [getattr(r, key) for r in got[True]] == [getattr(r, key) for r in got[False]], (seed, key)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_solo_chain_drafted_ahead_is_the_same_decode(seed, temperature, monkeypatch):
    target, oracle, head, prompts, budget, extra, refs = _setup(seed)
    sampling = Sampling(temperature=temperature, seed=seed if temperature else None)
    stops = [] if temperature else extra  # (picked from greedy outputs: a sampled decode may meet one at once)
    drafted_ahead = {False: 0, True: 0}  # (a row that ends in its first step has nothing to draft ahead of)
    for r, prompt in enumerate(prompts[:3]):
        engine = _solo(target, oracle, head, r)
        got = {}
        for on in (False, True):
            got[on], ahead = _decode(engine.adapter, monkeypatch, on, lambda: engine.speculative(
                prompt, max_new_tokens=budget, stop_ids=stops, sampling=sampling))
            assert got[on].kv_path == "static"
            drafted_ahead[on] += ahead
        where = f"seed {seed} row {r} T={temperature}"
        if not temperature:
            assert got[True].tokens == refs[r], where
        for key in ("tokens", "stop_reason", "target_forwards", "accepted"):
            assert getattr(got[True], key) == getattr(got[False], key), (where, key)
    assert drafted_ahead[False] == 0 and drafted_ahead[True] > 0, drafted_ahead


def test_solo_auto_budget_drafted_ahead_counts_only_verified_steps(monkeypatch):
    """Under auto the solo chain chooses K' a step early when drafted ahead; its tokens stay the target's and every
    step its report counts was verified or ran plain."""
    target, oracle, head, prompts, budget, extra, refs = _setup(4)
    engine = _solo(target, oracle, head, 0)
    _force(monkeypatch, True)
    plan = VerifyBudget.parse("auto", _costs(1))
    for _ in range(3):
        res = engine.speculative(prompts[0], max_new_tokens=budget, stop_ids=extra, budget=plan)
        assert res.tokens == refs[0]
        assert sum(engine.last_budget["k_hist"].values()) == len(res.accepted)


def test_batched_sampling_drafted_ahead_follows_the_target_distribution(monkeypatch):
    """Lossless in distribution when drafted ahead, rows that end in a step drafted ahead of included (the step
    after is drafted for every row, `_all_may_end` off): test_batched_sampling.py's exact joint law of three tokens
    per prompt, chi-square at ALPHA, and its control (the base drafter's q handed to the verifier) rejected."""
    from tests.decoding.test_batched_sampling import PROMPTS, exact_joints, peaked, row_pvalues, wrong_q
    from tests.decoding.test_sampling import ALPHA

    target, adapter, head = peaked(0)
    warp_ = dict(temperature=1.0, top_k=0, top_p=1.0)
    sampling = Sampling(seed=0, **warp_)
    joints = exact_joints(target, warp_)
    batch = [PROMPTS[i % len(PROMPTS)] for i in range(len(PROMPTS) * 3000)]
    engine = Engine(target, adapter, head)
    log: list[str] = []
    _force(monkeypatch, True)
    monkeypatch.setattr(batched, "_all_may_end", lambda rows, live, kk: False)
    LoggedReader.log = log
    propose = StaticDFlashDrafter.propose
    monkeypatch.setattr(StaticDFlashDrafter, "propose", lambda *a, **kw: log.append("propose") or propose(*a, **kw))
    results = engine.speculative_batch(batch, max_new_tokens=3, sampling=sampling)
    assert engine.batch_drafter_path == "static" and len({r.target_forwards for r in results}) > 1
    right = row_pvalues(results, joints)
    engine.rollout = wrong_q
    wrong = row_pvalues(engine.speculative_batch(batch, max_new_tokens=3, sampling=sampling), joints)
    assert _ahead(log) >= 2  # drafted ahead, in both decodes
    assert min(right) > ALPHA, f"a row drafted ahead deviates from the target: {right}"
    assert max(wrong) < ALPHA, f"the test cannot tell a wrong q from the right one: {wrong}"


# ----------------------------------------------------------------------------- GPU (opt-in: -m gpu)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("head_dim", [8, 16])  # 8: the compiled per-layer math; 16: the Triton kernels
def test_gpu_drafted_ahead_is_the_same_decode(head_dim, monkeypatch):
    """On CUDA, graphs and the pinned reads, drafting ahead by default: every row of a batch and a solo decode
    equals the target alone's, with the accepts of the loop that reads each step first (SPEC_AHEAD off), through
    ragged acceptance (a drafter nudged at the positions the device gives it)."""
    from tests.decoding.test_static_kv import graft

    target, adapter, head = graft("dflash", "qwen3", seed=2, extra=(f"target.random.head_dim={head_dim}",))
    for module in (target.model, adapter, head):
        module.to("cuda")
    stops = stop_token_ids(target)
    rng = random.Random(0)
    prompts = [[rng.randrange(2, 90) for _ in range(n)] for n in (5, 1, 17, 9)]
    plain = Engine(target, adapter, head, stop_ids=stops)
    want = [r.tokens for r in plain.target_only_batch(prompts, max_new_tokens=40)]
    oracle = Oracle(adapter, [p + w for p, w in zip(prompts, want)], [0, 1, 2, 3], 0.8, 0, target.shape.vocab_size)
    engine = Engine(target, oracle, head, stop_ids=stops)
    monkeypatch.setattr(batched, "TokenReader", LoggedReader)
    got = {}
    for on in (False, True):
        monkeypatch.setattr(batched, "SPEC_AHEAD", on)
        for _ in range(2):  # the second replays the graphs the first captured
            oracle.log.clear()
            LoggedReader.log = oracle.log
            got[on] = engine.speculative_batch(prompts, max_new_tokens=40)
        assert [r.tokens for r in got[on]] == want and bool(_ahead(oracle.log)) == on
    assert [r.accepted for r in got[True]] == [r.accepted for r in got[False]]
    assert len({a for r in got[True] for a in r.accepted}) > 2  # ragged accepts
    solo = _solo(target, oracle, head, 2)
    for on in (False, True):
        monkeypatch.setattr(batched, "SPEC_AHEAD", on)
        res = solo.speculative(prompts[2], max_new_tokens=40)
        assert res.tokens == want[2] and res.kv_path == "static"
