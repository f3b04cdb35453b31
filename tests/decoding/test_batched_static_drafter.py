"""DFlash's static drafter over ragged batches (adapters/dflash/fast.py with max_batch rows), the
drafter batched.py runs beside the static ragged target. CPU, fp32, eager.

- blocks: row b of the batched drafter proposes its own solo drafter's blocks, over ragged
  accepts (0..K, a rejection right after a full acceptance), rows of different prompt lengths
  (right-padded prefill), a row that finishes and keeps stepping at its last position, and huge
  garbage written into every slot at or after each row's anchor before each block; for the
  default math ("torch", per-row masks) and the kernels' per-row device positions ("reference",
  and "triton" in Triton's CPU interpreter);
- decoding: batched greedy chains through the static drafter equal each row's solo decode token
  for token, and their acceptance equals the eager ragged drafter's, over several models, ragged
  prompt sets with early stops, and nudged drafters that make the accepts ragged; the static
  drafter path is asserted taken (and not taken for a wrapper that never declared it).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (as tests/kernels does)

from domino_graft.adapters.dflash.fast import StaticDFlashDrafter  # noqa: E402
from domino_graft.adapters.dflash.adapter import DFlashAdapter  # noqa: E402
from domino_graft.decoding import Engine, stop_token_ids  # noqa: E402
from domino_graft.decoding.batched import batched_chain  # noqa: E402
from tests.decoding.test_batched import RowOracle  # noqa: E402
from tests.decoding.test_batched_static import ragged_case  # noqa: E402
from tests.decoding.test_static_kv import graft  # noqa: E402


@pytest.mark.parametrize("kernels", ["torch", "reference", "triton"])
def test_batched_drafter_blocks_equal_solo_drafters(kernels):
    if kernels == "triton":
        pytest.importorskip("triton")
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("the CPU kernel tests run in Triton's interpreter")
    target, adapter, _ = graft("dflash", "qwen3", seed=3, extra=("target.random.head_dim=16",))
    k, f = adapter.num_slots, adapter.cfg.hidden_size * len(adapter.cfg.target_layer_ids)
    g = torch.Generator().manual_seed(0)
    # row 1's blocks cross the default math's first kv bucket (256); the kernels have no bucket,
    # and the interpreter's time grows with the keys
    lens, max_len = ([5, 60, 31], 256) if kernels == "triton" else ([5, 250, 31], 512)
    accepts = [[0, k, 1, k, k - 1, 0, 2, k], [k, 0, k, k, 1, 0, k, 3], [1, k, 0]]  # row 2 then finishes
    if kernels == "triton":  # ~2 s a batched block in the interpreter
        accepts = [a[:4] for a in accepts]

    def make(rows):
        d = StaticDFlashDrafter(adapter, max_len, max_batch=rows)
        return d if kernels == "torch" else d.use_kernels(kernels)

    batched, solos = make(4), [make(1) for _ in lens]  # 3 of 4 rows: a batch below max_batch
    feats = torch.randn(len(lens), max(lens), f, generator=g) * 3  # the padding columns: garbage too
    with torch.inference_mode():
        batched.prefill(feats, max(lens))
        for r, n in enumerate(lens):
            solos[r].prefill(feats[r: r + 1], n)
        pos, live = list(lens), [True] * len(lens)
        for step in range(len(accepts[0])):
            for kc in (*batched.k, *batched.v):  # nothing at or after an anchor may matter
                for r, p in enumerate(pos):
                    kc[r, :, p:] = torch.randn(kc[r, :, p:].shape, generator=g) * 1e3
            anchor = torch.randint(0, target.shape.vocab_size, (len(lens),), generator=g)
            got = batched.propose(anchor, pos)
            for r in range(len(lens)):
                if not live[r]:
                    continue
                want = solos[r].propose(anchor[r: r + 1], pos[r])
                where = f"{kernels} step {step} row {r} pos {pos[r]}"
                torch.testing.assert_close(got.hidden[r: r + 1], want.hidden, atol=2e-5, rtol=1e-4, msg=where)
                torch.testing.assert_close(got.base_logits[r: r + 1], want.base_logits, atol=2e-5, rtol=1e-4,
                                           msg=where)
            verified = torch.randn(len(lens), k + 1, f, generator=g)
            batched.observe_block(verified, pos)  # a finished row too, at its last position
            for r in range(len(lens)):
                if live[r]:
                    solos[r].observe_block(verified[r: r + 1], pos[r])
                    pos[r] += accepts[r][step] + 1
                    live[r] = step + 1 < len(accepts[r])
    assert (pos[1] > 256 or kernels == "triton") and not live[2]
    assert {key[1] for key in batched._calls} == {3}  # graphs (on CUDA) keyed by the batch too


class Eager:
    """The real adapter behind a forwarding wrapper that declares no static drafter: batched
    decoding must take the eager ragged contract (class lookup, not __getattr__)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _NudgedRows(RowOracle):
    """RowOracle's nudges over the static batch drafter (its propose takes host positions)."""

    def propose(self, anchor, position):
        return super().propose(anchor, torch.tensor(position))

    def compact(self, rows):
        """The batch shrank (decoding/batched.py): the nudges follow each row to its new place."""
        self.rows, self.references = [self.rows[r] for r in rows], [self.references[r] for r in rows]
        self.inner.compact(rows)


class StaticRowOracle(RowOracle):
    """RowOracle that declares the static batch drafter, nudged the same way: the same drafts as
    the eager RowOracle, so acceptance (ragged, with full acceptances then rejections) can be
    compared between the two drafter paths."""

    def static_batch_drafter(self, max_len, batch):
        fast = self.inner.static_batch_drafter(max_len, batch)
        return None if fast is None else _NudgedRows(fast, self.references, self.rows, self.hit, self.seed,
                                                     self.vocab)


@pytest.fixture
def drafter_calls(monkeypatch):
    calls = {"static": 0, "eager": 0}
    static_propose, eager_propose = StaticDFlashDrafter.propose, DFlashAdapter.propose

    def counted_static(self, *a, **kw):
        calls["static"] += 1
        return static_propose(self, *a, **kw)

    def counted_eager(self, *a, **kw):
        calls["eager"] += 1
        return eager_propose(self, *a, **kw)

    monkeypatch.setattr(StaticDFlashDrafter, "propose", counted_static)
    monkeypatch.setattr(DFlashAdapter, "propose", counted_eager)
    return calls


@pytest.mark.parametrize("seed", range(4))
def test_batched_chain_with_static_drafter_equals_solo(seed, drafter_calls):
    cfg, target, adapter, head, prompts, rng = ragged_case(seed)
    budget = rng.choice([12, 20])
    stops = stop_token_ids(target)
    engine = Engine(target, adapter, head, stop_ids=stops)
    refs = [engine.target_only(p, max_new_tokens=budget) for p in prompts]
    early = [t for r in refs for t in r.tokens[1: budget // 2]]
    extra = [rng.choice(early)] if early else []  # a row ends early, the others go on
    refs = [engine.target_only(p, max_new_tokens=budget, stop_ids=extra) for p in prompts]
    want = [r.tokens for r in refs]
    where = f"seed {seed} {cfg} K={adapter.num_slots} prompts {prompts} stop {extra}"
    eager_engine = Engine(target, Eager(adapter), head, stop_ids=stops)

    for use_head in (True, False):
        drafter_calls.update(static=0, eager=0)
        got = engine.speculative_batch(prompts, max_new_tokens=budget, stop_ids=extra, use_head=use_head)
        assert drafter_calls["static"] > 0 and drafter_calls["eager"] == 0, (where, drafter_calls)
        assert {r.kv_path for r in got} == {"static"}, where
        assert [r.tokens for r in got] == want, f"{where} use_head={use_head}"
        assert [r.stop_reason for r in got] == [r.stop_reason for r in refs], where
        drafter_calls.update(static=0, eager=0)
        eager = eager_engine.speculative_batch(prompts, max_new_tokens=budget, stop_ids=extra, use_head=use_head)
        assert drafter_calls["static"] == 0 and drafter_calls["eager"] > 0, (where, drafter_calls)
        assert [r.tokens for r in eager] == want
        assert [r.accepted for r in got] == [r.accepted for r in eager], f"{where} use_head={use_head}"

    # ragged acceptance through the static drafter: nudged toward each row's continuation
    static, dynamic = nudged_decodes(seed, target, adapter, head, prompts, refs, budget, extra, drafter_calls)
    assert [r.tokens for r in static] == [r.tokens for r in dynamic] == want, where
    assert [r.accepted for r in static] == [r.accepted for r in dynamic], where


def nudged_decodes(seed, target, adapter, head, prompts, refs, budget, extra, calls):
    """(the static drafter's batch, the eager DynamicCache batch) of one case, RowOracle-nudged."""
    vocab, stops = target.shape.vocab_size, stop_token_ids(target)
    full = [p + r.tokens for p, r in zip(prompts, refs)]
    rows = list(range(len(prompts)))
    nudged = Engine(target, StaticRowOracle(adapter, full, rows, 0.7, seed, vocab), head, stop_ids=stops)
    plain = Engine(target, RowOracle(adapter, full, rows, 0.7, seed, vocab), head, stop_ids=stops)
    calls.update(static=0, eager=0)
    # shrink: the static path compacts as rows end (the eager one cannot), acceptance must not change
    static = nudged.speculative_batch(prompts, max_new_tokens=budget, stop_ids=extra, shrink=True)
    assert calls["static"] > 0 and calls["eager"] == 0, calls
    return static, batched_chain(plain, prompts, max_new_tokens=budget, stop_ids=extra, kv="dynamic")


def test_harness_reaches_ragged_accepts(drafter_calls):
    """The nudged cases above make rows of different lengths, full acceptances followed by
    rejections, rows accepting different counts in one step, and rows ending early."""
    seen = {"full_then_reject": 0, "differ": 0, "early": 0}
    for seed in range(4):
        _, target, adapter, head, prompts, rng = ragged_case(seed)
        engine = Engine(target, adapter, head, stop_ids=stop_token_ids(target))
        refs = [engine.target_only(p, max_new_tokens=20) for p in prompts]
        extra = [refs[0].tokens[2]] if len(refs[0].tokens) > 2 else []
        refs = [engine.target_only(p, max_new_tokens=20, stop_ids=extra) for p in prompts]
        got, _ = nudged_decodes(seed, target, adapter, head, prompts, refs, 20, extra, drafter_calls)
        k = adapter.num_slots
        seen["full_then_reject"] += any(a == k and b < k for r in got for a, b in zip(r.accepted, r.accepted[1:]))
        steps = min(len(r.accepted) for r in got)
        seen["differ"] += any(len({r.accepted[s] for r in got}) > 1 for s in range(steps))
        seen["early"] += len({len(r.tokens) for r in got}) > 1
    assert all(seen.values()), seen


def test_batch_drafter_is_reused_grown_and_kept_apart():
    _, target, adapter, head, prompts, _ = ragged_case(1)
    engine = Engine(target, adapter, head)
    solo = adapter.static_drafter(64)
    engine.speculative_batch(prompts, max_new_tokens=8)
    first = adapter._static_batch_drafter
    assert first is not solo and first.max_batch >= len(prompts) and solo.max_batch == 1
    engine.speculative_batch(prompts[:2], max_new_tokens=8)
    assert adapter._static_batch_drafter is first  # a smaller batch reuses it (and its graphs on CUDA)
    more = prompts * 3
    got = engine.speculative_batch(more, max_new_tokens=8)
    assert adapter._static_batch_drafter.max_batch >= len(more) and adapter.static_drafter(64) is solo
    assert [r.tokens for r in got] == [engine.target_only(p, max_new_tokens=8).tokens for p in more]


def test_a_subclass_that_changes_propose_keeps_the_eager_drafter(drafter_calls):
    """DSpark subclasses DFlash with a Markov head in its propose: DFlash's static drafter would
    skip it, so its batches stay on the eager ragged contract (and stay lossless)."""
    from tests.adapters.test_dspark import build as build_dspark

    _, target, adapter, head = build_dspark(["target.random.vocab_size=11", "drafter.mask_token_id=10"],
                                            markov_scale=0.3, head_seed=2)
    assert adapter.static_batch_drafter(64, 3) is None
    engine = Engine(target, adapter, head, stop_ids=[])
    prompts = [[3, 5, 7, 2, 4], [6, 2], [9, 8, 7, 1, 3, 5, 2]]
    got = engine.speculative_batch(prompts, max_new_tokens=12)
    assert drafter_calls["static"] == 0 and drafter_calls["eager"] > 0
    assert [r.tokens for r in got] == [engine.target_only(p, max_new_tokens=12).tokens for p in prompts]


@pytest.mark.parametrize("static", [False, True])
def test_the_lm_head_reads_the_slots_as_one_matrix(static):
    """The LM head over a batch's slots gets them contiguous (adapter.slot_hidden): over a [B, K, H] slice of
    the block torch runs a batched matmul against the weight broadcast over B, which on a GPU reads the whole
    vocabulary projection once per row of the batch (issue #39: ~1 ms a step at B = 64 on an H100)."""
    target, adapter, _ = graft("dflash", "qwen3", seed=3, extra=("target.random.head_dim=16",))
    seen = []
    hook = target.model.get_output_embeddings().register_forward_pre_hook(
        lambda _module, args: seen.append((tuple(args[0].shape), args[0].is_contiguous())))
    b, f = 3, adapter.cfg.hidden_size * len(adapter.cfg.target_layer_ids)
    feats = torch.randn(b, 9, f, generator=torch.Generator().manual_seed(0))
    anchor = torch.tensor([5, 6, 7])
    try:
        with torch.inference_mode():
            if static:
                drafter = StaticDFlashDrafter(adapter, 64, max_batch=b)
                drafter.prefill(feats, 9)
                block = drafter.propose(anchor, [9, 9, 9])
            else:
                adapter.reset(b)
                adapter.observe(feats, torch.arange(9).expand(b, 9))
                block = adapter.propose(anchor, torch.tensor([9, 9, 9]))
    finally:
        hook.remove()
    assert seen == [((b, adapter.num_slots, adapter.cfg.hidden_size), True)]
    assert block.hidden.is_contiguous() and block.base_logits.shape[:2] == (b, adapter.num_slots)


def prefill_and_admit(drafters, feats, lens: list[int], admissions, randn) -> None:
    """Every drafter: a new batch of `feats` (its rows' lengths `lens`), then each admission (rows, their lengths)
    of the same `randn(rows, length, F)` features into freed rows; `lens` follows the admitted rows."""
    for d in drafters:
        d.prefill(feats, max(lens))
    for rows, sizes in admissions:
        new = randn(len(rows), max(sizes), feats.shape[-1])
        for d in drafters:
            d.prefill(new, max(sizes), rows=rows)
        for r, n in zip(rows, sizes):
            lens[r] = n


def assert_same_contexts(got, want, lens: list[int], tol: float, note: str = "") -> None:
    """Each row's context K/V before its own length equal in two static drafters."""
    for k_got, k_want in zip((*got.k, *got.v), (*want.k, *want.v)):
        for r, n in enumerate(lens):
            torch.testing.assert_close(k_got[r, :, :n], k_want[r, :, :n], atol=tol, rtol=tol, msg=f"{note}row {r}")


def test_padded_prefills_write_what_exact_shapes_do():
    """pad_prefills (CUDA's default: graphs of padded shapes, adapters/dflash/fast.py `_prefill_write`) run here
    eagerly through the same calls: a new batch's prompts right-padded to their prefill length, then admissions
    into freed rows widened to a power of two by repeating their first prompt. Every row's context before its own
    length, and so every block it proposes, equals the exact shapes'; nothing else of the batch changes; the
    graphs are keyed by (rows, padded length), and `visit_admissions` meets every admission key first."""
    target, adapter, _ = graft("dflash", "qwen3", seed=3, extra=("target.random.head_dim=16",))
    f = adapter.cfg.hidden_size * len(adapter.cfg.target_layer_ids)
    g = torch.Generator().manual_seed(1)
    exact, padded = StaticDFlashDrafter(adapter, 128, max_batch=4), StaticDFlashDrafter(adapter, 128, max_batch=4)
    padded.pad_prefills = True
    lens = [5, 20, 9, 14]
    feats = torch.randn(4, 20, f, generator=g)
    admissions = [([2], [11]), ([3, 0, 1], [7, 17, 3])]  # one row; three rows widened to four
    with torch.inference_mode():
        prefill_and_admit((exact, padded), feats, lens, admissions, lambda *shape: torch.randn(*shape, generator=g))
        assert_same_contexts(padded, exact, lens, 1e-5)
        anchor = torch.randint(0, target.shape.vocab_size, (4,), generator=g)
        got, want = padded.propose(anchor, lens), exact.propose(anchor, lens)
        torch.testing.assert_close(got.base_logits, want.base_logits, atol=2e-5, rtol=1e-4)
        assert {key for key in padded._calls if key[0] != "propose"} == {("prefill", 4, 32), ("admit", 1, 16),
                                                                         ("admit", 4, 32)}
        assert all(key[0] == "propose" for key in exact._calls)  # the exact shapes: eager prefills
        assert padded.visit_admissions([5, 20]) == 6  # widths 1, 2, 4 at lengths 16 and 32
        assert {("admit", w, t) for w in (1, 2, 4) for t in (16, 32)} <= padded._calls.keys()
        assert exact.visit_admissions([5, 20]) == 0
        # every prefill graph reads a view of one input buffer, the largest shape's; a longer shape reallocates it
        # and drops the graphs that read the old one
        assert padded._prefill_buffer.numel() == 4 * 32 * f
        assert padded.visit_admissions([40]) == 3
        assert padded._prefill_buffer.numel() == 4 * 64 * f
        assert {key for key in padded._calls if key[0] != "propose"} == {("admit", w, 64) for w in (1, 2, 4)}
        feats = torch.randn(4, 20, f, generator=g)  # a new batch after the reallocation: the same contexts again
        prefill_and_admit((exact, padded), feats, [20] * 4, [], None)
        assert_same_contexts(padded, exact, [20] * 4, 1e-5)
