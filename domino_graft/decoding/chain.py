"""Lossless chain speculative decoding, for drafters whose proposals form one chain per block.

Speculative step (batch size 1; the anchor x_0 sits at position `pos`, not yet in the
target's cache; the drafter has observed every position < pos):

    block        = adapter.propose(x_0, pos)                 one backbone forward
    d, q         = rollout(head, block, x_0, ...)            Domino chain, K slots
    logits, feat = target([x_0, d_1..d_K] at pos..pos+K)     one target forward
    n_acc, next  = verify(...)                               greedy or speculative sampling
    roll the target cache back to pos + 1 + n_acc; observe feat of x_0, d_1..d_{n_acc}
    emit d_1..d_{n_acc}, next; x_0 <- next

The target's cache is the HF DynamicCache (rollback = crop), or on the fast engine
(`Engine(kv="static")`, the default on a GPU for a supported target) its static cache
(rollback = set its length; the T = K + 1 verify replays a CUDA graph on a GPU). There a
drafter whose family offers `adapter.static_drafter` keeps its context in static
tensors too and proposes through one CUDA graph per block (one that reads tokens, ``reads_ids``,
also gets the prompt's and each verified block's ids); the others observe/propose eagerly.
"""

from __future__ import annotations

import time
from typing import Iterable

import torch

from ..sampling import Sampling, pick
from .common import DecodeResult, OnTokens, Output, check_prompt, new_cache, positions, rollback, stop_set
from .verify import verify_chain


@torch.inference_mode()
def chain_speculative(engine, prompt_ids, *, max_new_tokens: int, sampling: Sampling = Sampling(),
                      stop_ids: Iterable[int] = (), use_head: bool = True, on_tokens: OnTokens = None,
                      seed_offset: int = 0) -> DecodeResult:
    """Chain speculative decoding with `engine`'s target, adapter, head and rollout; output
    identical (greedy) or identically distributed (T > 0) to `engine.target_only`'s."""
    ids = check_prompt(engine.target, prompt_ids, max_new_tokens)
    dev = ids.device
    target, adapter = engine.target, engine.adapter
    k = adapter.num_slots
    capture = adapter.capture_layers()
    gen = sampling.generator(dev, seed_offset)
    out = Output(max_new_tokens, stop_set(engine.stop_ids, stop_ids), on_tokens)
    reached, accepted_slot, accepted = [0] * k, [0] * k, []

    t0 = time.perf_counter()
    n = ids.shape[1]
    # the static cache (Engine(kv="static") on a supported target) or the HF DynamicCache
    static_target = getattr(engine, "static_target", None)  # duck-typed engines: dynamic
    length = n + max_new_tokens + k + 1
    static = static_target(length) if static_target is not None else None
    # the drafter's own fast path (static context, graphed propose) where its family has one
    drafter = adapter.static_drafter(length) if static is not None else None
    if static is not None:
        def forward(seq, at):
            return static.step(seq, at, capture=capture)

        def keep(length):
            static.rollback(length)
    else:
        cache = new_cache(target, rollback=True)

        def forward(seq, at):
            return target(seq, cache=cache, position_ids=positions(at, seq.shape[1], dev)[None], capture=capture)

        def keep(length):
            rollback(cache, length)
    adapter.reset(1)
    if static is not None:
        logits, feats = static.prefill(ids, capture=capture, logits_to_keep=1)
    else:
        logits, feats = target(ids, cache=cache, position_ids=positions(0, n, dev)[None], capture=capture,
                               logits_to_keep=1)
    forwards = 1
    keep(n)
    # a static drafter that reads tokens (`reads_ids`) gets the ids beside the features
    with_ids = getattr(drafter, "reads_ids", False)
    if drafter is not None:
        drafter.prefill(feats, n, **({"ids": ids} if with_ids else {}))
    else:
        adapter.observe(feats, positions(0, n, dev), ids=ids)
    anchor = pick(logits[:, -1], sampling, gen)  # [1]
    pos = n
    done = out.push([int(anchor)])
    while not done:
        block = (drafter or adapter).propose(anchor, pos)
        drafts, q = engine.rollout(
            engine.head, block, anchor, adapter.embed, temperature=sampling.temperature, top_k=sampling.top_k,
            top_p=sampling.top_p, generator=gen, use_head=use_head,
        )
        seq = torch.cat([anchor[:, None], drafts], dim=1)
        logits, feats = forward(seq, pos)
        forwards += 1
        n_acc, nxt = verify_chain(logits, drafts, q, sampling, gen)
        # one device->host sync per step
        host = torch.cat([n_acc, nxt, drafts[0]]).tolist()
        a, nxt_id, draft_ids = host[0], host[1], host[2:]
        accepted.append(a)
        for j in range(min(a + 1, k)):
            reached[j] += 1
            accepted_slot[j] += j < a
        done = out.push(draft_ids[:a] + [nxt_id])
        if done:
            break
        # the cache now holds pos + K + 1 positions; keep x_0 and the accepted drafts
        keep(pos + 1 + a)
        if drafter is not None:  # all K+1: the next block reads only those before its anchor
            drafter.observe_block(feats, pos, **({"ids": seq} if with_ids else {}))
        else:  # feats is None for a drafter that reads tokens only (capture_layers() == ())
            adapter.observe(None if feats is None else feats[:, : a + 1], positions(pos, a + 1, dev),
                            ids=seq[:, : a + 1])
        anchor = nxt
        pos += a + 1
    return DecodeResult(out.tokens, n, out.stop_reason, time.perf_counter() - t0, forwards, accepted,
                        reached, accepted_slot, kv_path="dynamic" if static is None else "static")
