"""Batched decoding of B prompts of different lengths: one propose, one rollout and one target
forward per step for the whole batch, with per-row acceptance, positions and stop rules.

The target is a session over B rows (decoding/session.py: prefill, step at per-row positions,
keep): wherever the target's architecture runs on the fast engine (on any device), its static
cache (`StaticSession`: row b is cache row b at its own position, a step is [B, K+1] at per-row
positions, CUDA graphs per batch size and attention bucket on a GPU, eager on a CPU, a rejection
is just the row's next position). Elsewhere (a target the fast engine refuses), or with
kv="dynamic", one HF DynamicCache shared by the rows (`DynamicSession`), in which each row owns
the entries a validity mask [B, L] marks (a 4D attention mask hides the others). A step is
[x_0, d_1..d_K] of every row at pos_b..pos_b+K; row b keeps x_0 and its accepted drafts.

Either way attention over a row's own entries only is the row's own decode: each row's greedy
output is its solo decode's, token for token, up to floating-point reassociation (the property
tests compare them, on both caches). A finished row stays in the batch, masked: its new entries
are never kept, its tokens never emitted, and the others do not wait for it (the static
target and drafter step it at its last position, its outputs dropped).
`DecodeResult.kv_path` says which cache ran.

The drafter sees the same ragged layout. Beside the static target, a family that offers
``static_batch_drafter(max_len, batch)`` (a family's static drafter, adapters/base.py) keeps its context in
static per-row slots too: the prefill writes the right-padded prompts' features, a step is
``propose(anchor [B], positions)`` with the positions as host ints (no sync), then
``observe_block(features of all K+1 [B, K+1, F], positions)``; row b's next block reads only
its slots before its own anchor, so a rejection costs nothing, and on CUDA "write, then
propose" replays one graph per batch size and block shape. Otherwise (other families, or
the DynamicCache) the drafter runs eagerly through the adapter contract's ragged batches
(adapters/base.py: per-row positions [B, n], negative = padding; `propose` at [B] positions);
families set `ragged_batch`. Either way a step makes one device->host sync (the verify's
accept counts, bonus tokens and drafts together). Chains only (a tree's ragged verify is not
wired here): trees decode one prompt at a time.

At T > 0 each row is verified by standard speculative sampling (`verify.verify_chain`, the
solo chain path's rule and `warp()`), so each row's output is distributed exactly as its own
target-alone sampling. Randomness: one generator per batch decode, `sampling.generator(device,
seed_offset)`, consumed in a fixed order at every step: the anchors' draw at the prefill, [B]
rows at once; then per step the rollout's draws ([B] rows per slot, slot by slot), the
verifier's uniforms [B, K], then the [B] corrections / bonuses. Finished rows still draw (their
results are dropped), so a batch with the same prompts, order and seed reproduces its samples;
a row's samples depend on the batch it sits in, not only on its prompt (rows are not
bit-reproducible against their solo decode at T > 0, only equal in distribution).

A verify budget (`budget=`, decoding/budget.py) makes a step verify only the first K' <= K drafts
(the rollout runs over K' slots, the verify over [x_0, d_1..d_K'], the drafter observes K' + 1
positions), or none: K' = 0 is a plain target step, the next token the target's own `pick`. K' is
the same for every row and chosen before the step's draws, so every row stays lossless. Once auto
has chosen K' = 0 a few steps in a row (`BudgetRun.committed`) the rest of the decode is the target
alone's own loop (`_target_steps`: no features captured, nothing written to the drafter).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Iterable, Optional, Sequence

import torch

from ..sampling import Sampling, pick
from .budget import VerifyBudget
from .common import DecodeResult, Output, check_kv, check_prompt, cuda_median_ms, propose_timer, stop_set
from .session import DynamicSession, StaticSession, TargetSession
from .verify import verify_chain


def static_batch_drafter(adapter, target, length: int, batch: int):
    """The drafter's static, graphed path for `batch` rows, or None (the eager ragged contract):
    only beside the static ragged target, and only where the adapter's class offers
    ``static_batch_drafter(max_len, batch)`` (a family may answer None, e.g. for a subclass whose
    propose differs). Looked up on the class, as is the drafter's ``propose``: a wrapper that
    forwards attributes to an adapter it nudges (the tests' oracles) is not bypassed by a fast
    path it never declared."""
    if target.kv_path != "static" or not adapter.capture_layers():
        return None
    if getattr(type(adapter), "static_batch_drafter", None) is None:
        return None
    return adapter.static_batch_drafter(length, batch)


def _check_batch(engine, prompts, max_new_tokens: int) -> list[torch.Tensor]:
    if not len(prompts):
        raise ValueError("batched decoding: no prompts")
    return [check_prompt(engine.target, p, max_new_tokens)[0] for p in prompts]


def ragged_target(engine, ids: list[torch.Tensor], length: int, kv: str = "auto") -> TargetSession:
    """The batch's target session: the fast engine's static cache (`StaticSession`, kept on the engine
    between decodes) where the target's architecture supports it and kv is not "dynamic"; else a
    `DynamicSession`. `length`: the positions the longest row may reach."""
    if check_kv(kv) != "dynamic":
        static, why = StaticSession.create(engine.target, len(ids), length, getattr(engine, "_ragged_static", None))
        if static is not None:
            engine._ragged_static = static
            return static
        engine.batch_kv_note = why
    return DynamicSession(engine.target)


@torch.inference_mode()
def batched_target_only(engine, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                        sampling: Sampling = Sampling(), stop_ids: Iterable[int] = (),
                        seed_offset: int = 0, kv: str = "auto", run=None) -> list[DecodeResult]:
    """Target-alone decoding of every prompt at once; row b's output is
    `engine.target_only(prompts[b])`'s (greedy: token for token; T > 0: in distribution).
    kv: "dynamic" forces the HF cache; otherwise the static one where supported (`ragged_target`).
    run: a verify budget's run that starts committed (`batched_chain`): it counts the steps, and
    each row's accepted list gets a 0 per step, as its plain steps record."""
    sampling = sampling or Sampling()
    ids = _check_batch(engine, prompts, max_new_tokens)
    b, dev = len(ids), ids[0].device
    gen = sampling.generator(dev, seed_offset)
    stops = stop_set(engine.stop_ids, stop_ids)
    outs = [Output(max_new_tokens, stops, None) for _ in ids]
    t0 = time.perf_counter()
    # room for a chain's K extra positions too, so that the speculative decodes of the same
    # prompts reuse this cache (and on CUDA its graphs) instead of growing it
    k = getattr(getattr(engine, "adapter", None), "num_slots", 0)
    target = ragged_target(engine, ids, max(p.numel() for p in ids) + max_new_tokens + k + 1, kv)
    logits, _, _, _ = target.prefill(ids, ())
    tok = pick(logits, sampling, gen)
    pos_h = [p.numel() for p in ids]  # host copy of pos: the static cache's attention bucket, no sync
    pos = torch.tensor(pos_h, device=dev)
    seconds, forwards = [0.0] * b, [1] * b
    live = _push_each(outs, [[t] for t in tok.tolist()], None, seconds, t0)
    accepted = None if run is None else [[] for _ in ids]
    _target_steps(target, tok, pos, pos_h, live, outs, sampling, gen, seconds, forwards, t0, run, accepted)
    return [DecodeResult(o.tokens, p.numel(), o.stop_reason, s, f, [] if accepted is None else accepted[r],
                         kv_path=target.kv_path)
            for r, (o, p, s, f) in enumerate(zip(outs, ids, seconds, forwards))]


def _target_steps(target, tok, pos, pos_h, live, outs, sampling, gen, seconds, forwards, t0, run=None,
                  accepted=None) -> None:
    """The target alone's loop until every row ends: `tok` [B] (each row's last token, not yet in
    the cache) at `pos`; one forward of one token per row a step, no features, one sync. Also the
    tail of a batched chain whose verify budget committed to plain steps (`run` counts them, and
    each live row's `accepted` gets a 0 per step, as a K' = 0 step records)."""
    dev = tok.device
    while any(live):
        if run is not None:  # the lean loop's own cost: the plain kind's wall-clock samples
            run.tick(0)
        logits, _ = target.step(tok[:, None], pos, (), pos_h)
        live_t = torch.tensor(live, device=dev)
        target.keep(live_t.long(), 1)
        tok = torch.where(live_t, pick(logits[:, -1], sampling, gen), tok)
        pos = pos + live_t.long()
        pos_h = [p + on for p, on in zip(pos_h, live)]
        for r in range(len(live)):
            forwards[r] += live[r]
            if accepted is not None and live[r]:
                accepted[r].append(0)
        if run is not None:
            run.count_plain()
        live = _push_each(outs, [[t] for t in tok.tolist()], live, seconds, t0)  # the step's one sync


def _push_each(outs: list[Output], chunks: list[list[int]], live, seconds: list[float], t0: float) -> list[bool]:
    """Each live row's chunk into its Output; -> which rows go on (a row's seconds: when it ended)."""
    now = None
    still = []
    for r, (out, chunk) in enumerate(zip(outs, chunks)):
        if live is not None and not live[r]:
            still.append(False)
            continue
        done = out.push(chunk)
        if done:
            now = now or time.perf_counter()
            seconds[r] = now - t0
        still.append(not done)
    return still


@torch.inference_mode()
def batched_chain(engine, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, sampling: Sampling = Sampling(),
                  stop_ids: Iterable[int] = (), use_head: bool = True, seed_offset: int = 0,
                  kv: str = "auto", budget: Optional[VerifyBudget] = None) -> list[DecodeResult]:
    """Chain speculative decoding of every prompt at once (module docstring); row b's output is
    `engine.speculative(prompts[b])`'s: token for token (greedy), in distribution (T > 0).
    kv: "dynamic" forces the HF cache; otherwise the static one where supported (`ragged_target`).
    budget: how many drafts each step verifies (decoding/budget.py); None = all K. What it chose
    is left in `engine.last_budget` (budget.BudgetRun.report)."""
    sampling = sampling or Sampling()
    adapter = engine.adapter
    if adapter.topology != "chain":
        raise ValueError(f"batched decoding: drafter topology {adapter.topology!r}; valid: 'chain' (trees decode one "
                         "prompt at a time: --batch-size 1)")
    if not getattr(adapter, "ragged_batch", False):
        raise ValueError(f"batched decoding: the {adapter.family} drafter does not take ragged batches "
                         "(adapter.ragged_batch); valid: --batch-size 1")
    if use_head and engine.head is None:
        raise ValueError("use_head=True but no Domino head is loaded")
    ids = _check_batch(engine, prompts, max_new_tokens)
    b, dev, k = len(ids), ids[0].device, adapter.num_slots
    run = None if budget is None else budget.start(k, b, dev.type)  # refused before any forward
    if run is not None and run.starts_committed:  # the target alone from the first step (budget.py)
        results = batched_target_only(engine, prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                                      stop_ids=stop_ids, seed_offset=seed_offset, kv=kv, run=run)
        engine.last_budget = run.finish()
        return results
    gen = sampling.generator(dev, seed_offset)
    capture = adapter.capture_layers()
    stops = stop_set(engine.stop_ids, stop_ids)
    outs = [Output(max_new_tokens, stops, None) for _ in ids]
    accepted = [[] for _ in ids]
    reached, accepted_slot = [[0] * k for _ in ids], [[0] * k for _ in ids]
    seconds, forwards = [0.0] * b, [1] * b

    t0 = time.perf_counter()
    length = max(p.numel() for p in ids) + max_new_tokens + k + 1
    target = ragged_target(engine, ids, length, kv)
    drafter = static_batch_drafter(adapter, target, length, b)
    engine.batch_drafter_path = "eager" if drafter is None else "static"  # what the last batch ran (bench reports)
    adapter.reset(b)
    logits, feats, prompt_ids, prompt_pos = target.prefill(ids, capture)
    if drafter is not None:  # right-padded: row b's padding slots lie at or after its anchor
        drafter.prefill(feats, feats.shape[1])
    else:
        adapter.observe(feats, prompt_pos, ids=prompt_ids)
    anchor = pick(logits, sampling, gen)  # [B]
    pos_h = [p.numel() for p in ids]  # host copy of pos: attention buckets and drafter slots, no sync
    pos = torch.tensor(pos_h, device=dev)
    live = _push_each(outs, [[t] for t in anchor.tolist()], None, seconds, t0)
    offs = torch.arange(k + 1, device=dev)
    if run is not None and dev.type == "cuda":  # the target's cost of each candidate length not known yet
        run.add_measured(measure_step_costs(target, anchor, pos, pos_h, capture, run.lengths_to_measure()))
    while any(live):
        if run is not None and run.committed():  # plain from here on: the target alone's loop
            _target_steps(target, anchor, pos, pos_h, live, outs, sampling, gen, seconds, forwards, t0, run, accepted)
            break
        kk = k if run is None else run.choose()  # K': the drafts this step verifies
        if run is not None:
            run.tick(kk)
        timer = propose_timer(run, dev) if kk else None
        if kk == 0:  # a plain target step: the anchor alone, the next token the target's own pick
            seq = anchor[:, None]
            logits, feats = target.step(seq, pos, capture, pos_h)
            nxt = pick(logits[:, 0], sampling, gen)
            n_acc, drafts = torch.zeros_like(nxt), seq[:, :0]
        else:
            block = adapter.propose(anchor, pos) if drafter is None else drafter.propose(anchor, pos_h)
            if kk < k:  # only the first K' slots are rolled out
                block = first_slots(block, kk)
            drafts, q = engine.rollout(engine.head, block, anchor, adapter.embed, temperature=sampling.temperature,
                                       top_k=sampling.top_k, top_p=sampling.top_p, generator=gen, use_head=use_head)
            if timer is not None:
                timer[1].record()
            seq = torch.cat([anchor[:, None], drafts], dim=1)
            logits, feats = target.step(seq, pos, capture, pos_h)
            n_acc, nxt = verify_chain(logits, drafts, q, sampling, gen)
        host = torch.cat([n_acc, nxt, drafts.flatten()]).tolist()  # one device->host sync per step
        n_acc_h, nxt_h, drafts_h = host[:b], host[b: 2 * b], host[2 * b:]
        if timer is not None:
            run.propose_samples.append(timer[0].elapsed_time(timer[1]))
        chunks = []
        for r in range(b):
            a = n_acc_h[r]
            chunks.append(drafts_h[r * kk: r * kk + a] + [nxt_h[r]])
            if live[r]:
                forwards[r] += 1
                accepted[r].append(a)
                for j in range(min(a + 1, kk)):
                    reached[r][j] += 1
                    accepted_slot[r][j] += j < a
        if run is not None:
            run.observe(kk, [a for a, on in zip(n_acc_h, live) if on])
        live = _push_each(outs, chunks, live, seconds, t0)
        if not any(live):
            break
        # rows that just ended keep nothing more; the others x_0 and their accepted drafts
        kept = torch.where(torch.tensor(live, device=dev), n_acc + 1, 0)
        longest = max(n + 1 for n, on in zip(n_acc_h, live) if on)
        target.keep(kept, longest)
        if drafter is not None:  # all K'+1 of every row, finished ones too (at their last position)
            drafter.observe_block(feats, pos_h)
        else:  # the kept entries at their positions, -1 elsewhere
            new = offs[None, :longest] < kept[:, None]
            adapter.observe(None if feats is None else feats[:, :longest],
                            torch.where(new, pos[:, None] + offs[:longest], -1), ids=seq[:, :longest])
        anchor = torch.where(kept > 0, nxt, anchor)
        pos = pos + kept
        pos_h = [p + (n + 1 if on else 0) for p, n, on in zip(pos_h, n_acc_h, live)]
    engine.last_budget = None if run is None else run.finish()
    return [DecodeResult(o.tokens, p.numel(), o.stop_reason, s, f, acc, rch, slot, kv_path=target.kv_path)
            for o, p, s, f, acc, rch, slot in zip(outs, ids, seconds, forwards, accepted, reached, accepted_slot)]


def measure_step_costs(target, anchor: torch.Tensor, pos: torch.Tensor, pos_h: list[int], capture,
                       lengths: list[int]) -> dict[int, float]:
    """ms of the target's forward of T tokens per row at this batch and these positions, for each T
    in `lengths` (`cuda_median_ms`). Nothing stays: the static cache is overwritten by the next step
    before any query reads it (session.py), the dynamic one is cropped back."""
    none_kept = torch.zeros_like(pos)
    out = {}
    for t in lengths:
        seq = anchor[:, None].expand(-1, t).contiguous()
        out[t] = cuda_median_ms(lambda: target.step(seq, pos, capture, pos_h), lambda: target.keep(none_kept, 0))
    return out


def first_slots(block, kk: int):
    """The drafter's block cut to its first kk slots (a verify budget's K' < K): slot j reads only
    slots < j, so the rollout over them is the full block's first kk."""
    return replace(block, hidden=block.hidden[:, :kk].contiguous(), base_logits=block.base_logits[:, :kk].contiguous())
