"""Lossless chain speculative decoding, for drafters whose proposals form one chain per block.

Speculative step (batch size 1; the anchor x_0 sits at position `pos`, not yet in the
target's cache; the drafter has observed every position < pos):

    block        = adapter.propose(x_0, pos)                 one backbone forward
    d, q         = rollout(head, block, x_0, ...)            Domino chain, K slots
    logits, feat = target([x_0, d_1..d_K] at pos..pos+K)     one target forward
    n_acc, next  = verify(...)                               greedy or speculative sampling
    roll the target cache back to pos + 1 + n_acc; observe feat of x_0, d_1..d_{n_acc}
    emit d_1..d_{n_acc}, next; x_0 <- next

The target is a one-row session (`Engine.session`, decoding/session.py): the HF DynamicCache
(rollback = crop), or on the fast engine (`Engine(kv="static")`, the default on a GPU for a
supported target) its static cache (a rollback is the next step's position; the T = K + 1 verify
replays a CUDA graph on a GPU). There a
drafter whose family offers `adapter.static_drafter` keeps its context in static
tensors too and proposes through one CUDA graph per block (one that reads tokens, ``reads_ids``,
also gets the prompt's and each verified block's ids); the others observe/propose eagerly.

On CUDA, beside the static cache and a static drafter that takes its positions on the device, the next block is
drafted while the device verifies this one (`batched.drafts_ahead`; decoding/batched.py, "Drafted ahead"): its
anchor and position are the verify's outputs on the device, so the host reads a step after launching the next
one's propose and rollout.

A verify budget (`budget=`, decoding/budget.py, its auto mode) chooses each step how many drafts
it verifies, K' of the candidates (1, 4, 8, 16 tokens a verify: budget.py), from the running
acceptance and each candidate's cost (measured on CUDA: the target's forward of each length, the
propose, each step kind's wall-clock excess; a table elsewhere); K' = 0 decodes the rest with the
target alone (its own loop: no features, no drafter). A step that verifies K' < K rolls out and
verifies the block's first K' slots only (`first_slots`), the step the batched chain takes; a drafter
whose static path needs every block whole (``takes_short_blocks`` unset: adapters/base.py) has the
candidates all K or none. What a decode learns stays with the budget (key "solo"), so the next decode
starts from it; one that `starts_committed` is `engine.target_only`'s decode outright (no drafter
prefill, no features).
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from typing import Iterable, Optional

import torch

from ..sampling import Sampling, pick
from .batched import chain_room, drafts_ahead
from .budget import VerifyBudget
from .common import (DecodeResult, OnTokens, Output, TokenReader, check_prompt, cuda_median_ms, draft_step,
                     positions, stop_set, whole_decode)
from .verify import verify_chain


@torch.inference_mode()
def chain_speculative(engine, prompt_ids, *, max_new_tokens: int, sampling: Sampling = Sampling(),
                      stop_ids: Iterable[int] = (), use_head: bool = True, on_tokens: OnTokens = None,
                      seed_offset: int = 0, budget: Optional[VerifyBudget] = None) -> DecodeResult:
    """Chain speculative decoding with `engine`'s target, adapter, head and rollout; output
    identical (greedy) or identically distributed (T > 0) to `engine.target_only`'s. budget: auto
    may end speculation for the rest of the decode (module docstring); full and N verify all K."""
    ids = check_prompt(engine.target, prompt_ids, max_new_tokens)
    dev = ids.device
    adapter = engine.adapter
    k = adapter.num_slots
    run = budget.start(k, 1, dev.type, key="solo", remaining=max_new_tokens) if budget is not None and budget.mode == "auto" else None
    from ..fast import graphs_captured

    # the whole decode's tokens/s, either arm timed alike, for the budget's outcomes (budget.py, "Whole decodes")
    started, captured = time.perf_counter(), graphs_captured()
    if run is not None and run.starts_committed:  # the target alone from the first step (budget.py)
        res = engine.target_only_checked(ids, max_new_tokens=max_new_tokens, sampling=sampling, stop_ids=stop_ids,
                                         on_tokens=on_tokens, seed_offset=seed_offset)
        run.count_plain(res.decode_steps)
        engine.last_run = run.finish(*whole_decode(len(res.tokens), started, graphs_captured() != captured))
        return replace(res, accepted=[0] * res.decode_steps, slot_reached=[0] * k, slot_accepted=[0] * k)
    capture = adapter.capture_layers()
    gen = sampling.generator(dev, seed_offset)
    out = Output(max_new_tokens, stop_set(engine.stop_ids, stop_ids), on_tokens)
    reached, accepted_slot, accepted = [0] * k, [0] * k, []

    t0 = time.perf_counter()
    n = ids.shape[1]
    length = n + max_new_tokens + chain_room(k)
    session = engine.session(length)  # the static cache (Engine(kv="static") on a supported target) or the HF one
    # the drafter's own fast path (static context, graphed propose) where its family has one
    drafter = adapter.static_drafter(length) if session.kv_path == "static" else None
    adapter.reset(1)
    logits, feats, _, _ = session.prefill([ids[0]], capture)
    forwards = 1
    # a static drafter that reads tokens (`reads_ids`) gets the ids beside the features
    with_ids = getattr(drafter, "reads_ids", False)
    if drafter is not None:
        drafter.prefill(feats, n, **({"ids": ids} if with_ids else {}))
    else:
        adapter.observe(feats, positions(0, n, dev), ids=ids)
    anchor = pick(logits, sampling, gen)  # [1]
    pos = n
    done = out.push([int(anchor)])
    short_blocks = drafter is None or getattr(drafter, "takes_short_blocks", False)  # K' < K: adapters/base.py
    _measure_solo_costs(run, k, dev, session, anchor, pos, short_blocks)
    ahead = drafts_ahead(session, drafter, dev) and not with_ids
    reader = TokenReader(dev, pinned=ahead)
    drafted = None  # the next step's (K', drafts, q, timer), drafted before this step was read (batched.py)

    def draft(kk: int, anchor, at=None, bound: Optional[int] = None):
        """(drafts, q, timer) of a step verifying kk drafts: from `anchor` at `pos`, or drafted ahead at the device's
        position `at` ([1]), `bound` on the host bounding it from above."""
        propose = partial((drafter or adapter).propose, anchor, pos) if at is None else partial(
            drafter.propose, anchor, bound, at)
        return draft_step(engine, propose, anchor, kk, sampling, gen, use_head, run, dev)

    while not done:
        if drafted is not None:
            kk, drafts, q, timer = drafted
            drafted = None
        else:
            kk = k if run is None else run.choose()  # the drafts this step verifies
            if kk:
                drafts, q, timer = draft(kk, anchor)
        if kk == 0:  # the rest is the target alone's loop: the decode commits
            run.commit()
            forwards += _plain_tail(session, anchor, pos, out, sampling, gen, run, accepted)
            break
        seq = torch.cat([anchor[:, None], drafts], dim=1)
        logits, feats = session.step(seq, None, capture, [pos])
        forwards += 1
        n_acc, nxt = verify_chain(logits, drafts, q, sampling, gen)
        if run is not None:  # the step's wall-clock sample, while the device runs it (budget.py `tick`)
            run.tick(kk)
        read = reader.send(torch.cat([n_acc, nxt, drafts[0]]))  # one device->host sync per step
        # drafted ahead (batched.py "Drafted ahead"), unless this step may be the decode's last: the next block from
        # the anchor and position the device holds, while the device verifies this step
        moved = ahead and out.left() > kk + 1  # (`chain_room` holds the block drafted at pos + kk + 1 at most)
        if moved:
            drafter.observe_block(feats, pos)
            kk_next = k if run is None else run.choose()
            # (K' = 0: the decode commits at the next step, from the anchor and position the read gives)
            drafted = (kk_next, *draft(kk_next, nxt, n_acc + (pos + 1), pos + kk + 1)) if kk_next else (0, *[None] * 3)
        host = read()
        a, nxt_id, draft_ids = host[0], host[1], host[2:]
        if run is not None:
            if timer is not None:
                run.add_propose(*timer.read(), slots=kk)
            run.observe(kk, [a])
        accepted.append(a)
        for j in range(min(a + 1, kk)):
            reached[j] += 1
            accepted_slot[j] += j < a
        done = out.push(draft_ids[:a] + [nxt_id])
        if done:
            if drafted is not None and run is not None:  # chosen (and drafted) ahead, never verified
                run.withdraw(drafted[0])
            break
        if not moved:
            # the cache now holds pos + K' + 1 positions; keep x_0 and the accepted drafts
            session.keep((a + 1,), a + 1)
            if drafter is not None:  # all K'+1: the next block reads only those before its anchor
                drafter.observe_block(feats, pos, **({"ids": seq} if with_ids else {}))
            else:  # feats is None for a drafter that reads tokens only (capture_layers() == ())
                adapter.observe(None if feats is None else feats[:, : a + 1], positions(pos, a + 1, dev),
                                ids=seq[:, : a + 1])
        anchor = nxt
        pos += a + 1
    if run is not None:
        engine.last_run = run.finish(*whole_decode(len(out.tokens), started, graphs_captured() != captured))
    return DecodeResult(out.tokens, n, out.stop_reason, time.perf_counter() - t0, forwards, accepted,
                        reached, accepted_slot, kv_path=session.kv_path)


def _measure_solo_costs(run, k: int, dev, session, anchor, pos: int, short_blocks: bool) -> None:
    """The auto budget's candidates here: the batched chain's where the drafter takes short blocks
    (`short_blocks`), else all K or none; on CUDA the target's forward of each candidate's length
    measured once (`cuda_median_ms`; the cache is rolled back to `pos`)."""
    if run is None:
        return
    if not short_blocks:
        run.candidates = [0, k]
    todo = sorted({kk + 1 for kk in run.candidates} & set(run.lengths_to_measure()))
    if dev.type == "cuda" and todo:
        measured = {}
        for t in todo:
            seq = anchor[:, None].expand(-1, t).contiguous()
            measured[t] = cuda_median_ms(lambda: session.step(seq, None, (), [pos]), lambda: session.keep((0,), 0))
        run.add_measured(measured)


def _plain_tail(session, anchor, pos: int, out: Output, sampling, gen, run, accepted: list) -> int:
    """The target alone from `anchor` (emitted, not yet in the cache) at `pos` until `out` is done,
    as `Engine.target_only` steps: no features, no drafter; -> the forwards it ran (each one a
    step with 0 drafts accepted in `accepted`)."""
    forwards = 0
    done = False
    while not done:
        logits, _ = session.step(anchor[:, None], None, (), [pos])
        session.keep((1,), 1)
        forwards += 1
        anchor = pick(logits[:, -1], sampling, gen)
        run.tick(0, lean=True)  # the target alone's loop: the lean kind's samples, while the device runs the step
        done = out.push([int(anchor)])
        pos += 1
    accepted.extend([0] * forwards)
    run.count_plain(forwards - 1)  # the first is the step run.choose() chose, and counted
    return forwards
