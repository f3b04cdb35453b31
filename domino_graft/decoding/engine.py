"""Lossless chain speculative decoding for any drafter adapter, and the target-only baseline.

Both paths share one engine: the same TargetModel forward, DynamicCache, dtype, stop
handling and token accounting, so a measured speedup is a speedup over an equally
optimised baseline (DESIGN §5), not over `model.generate`.

Speculative step (batch size 1; the anchor x_0 sits at position `pos`, not yet in the
target's cache; the drafter has observed every position < pos):

    block        = adapter.propose(x_0, pos)                 one backbone forward
    d, q         = rollout(head, block, x_0, ...)            Domino chain, K slots
    logits, feat = target([x_0, d_1..d_K] at pos..pos+K)     one target forward
    n_acc, next  = verify(...)                               greedy or speculative sampling
    crop the target cache to pos + 1 + n_acc; observe feat of x_0, d_1..d_{n_acc}
    emit d_1..d_{n_acc}, next; x_0 <- next
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import torch

from .rollout import get_rollout
from .sampling import Sampling, pick, warp
from .verify import verify_greedy, verify_sampling

OnTokens = Optional[Callable[[list[int]], None]]


@dataclass
class DecodeResult:
    tokens: list[int]  # generated ids (stop token included when one ended the decode)
    prompt_len: int
    stop_reason: str  # "stop" | "length"
    seconds: float  # wall time, prefill included (both paths)
    target_forwards: int  # prefill included
    accepted: list[int] = field(default_factory=list)  # drafts accepted per verify step
    slot_reached: list[int] = field(default_factory=list)  # [K]: blocks whose slot j was verified
    slot_accepted: list[int] = field(default_factory=list)  # [K]: ... and accepted

    @property
    def decode_steps(self) -> int:
        """Target forwards after the prefill (one per emitted chunk)."""
        return self.target_forwards - 1

    @property
    def tau(self) -> Optional[float]:
        """Tokens per target forward after the prefill (accepted + bonus), before truncation by
        stop/max_new_tokens; 1.0 for target-only decoding; None if no decode step ran."""
        if self.accepted:
            return sum(a + 1 for a in self.accepted) / len(self.accepted)
        return 1.0 if self.decode_steps > 0 else None


class _Output:
    """Appends emitted tokens with exactly the target-only stop rules: stop right after a
    stop token (kept) or at max_new_tokens, whichever comes first."""

    def __init__(self, max_new_tokens: int, stop_ids: frozenset[int], on_tokens: OnTokens):
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_ids
        self.on_tokens = on_tokens
        self.tokens: list[int] = []
        self.stop_reason: Optional[str] = None

    def push(self, ids: list[int]) -> bool:
        start = len(self.tokens)
        for t in ids:
            self.tokens.append(t)
            if t in self.stop_ids:
                self.stop_reason = "stop"
                break
            if len(self.tokens) >= self.max_new_tokens:
                self.stop_reason = "length"
                break
        if self.on_tokens is not None and len(self.tokens) > start:
            self.on_tokens(self.tokens[start:])
        return self.stop_reason is not None


def _positions(start: int, n: int, device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device)


class Engine:
    """Decoding with one loaded target, drafter adapter and (optional) Domino head.

    Batch size 1: a batched chain verifier needs per-row cache lengths (ragged crops);
    not implemented."""

    def __init__(self, target, adapter=None, head=None, *, rollout: str | dict = "torch", stop_ids: Iterable[int] = ()):
        """rollout: a name, or a choice {"name", "pool_size", "pool_select"} (decoding.rollout_choice)."""
        self.target = target
        self.adapter = adapter
        self.head = head
        choice = {"name": rollout} if isinstance(rollout, str) else rollout
        self.rollout_name = choice["name"]
        self.rollout = get_rollout(choice["name"], head, pool_size=choice.get("pool_size"),
                                   pool_select=choice.get("pool_select"))
        self.stop_ids = frozenset(int(i) for i in stop_ids)

    # ------------------------------------------------------------------ helpers
    def _new_cache(self, *, rollback: bool):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.target.model.config)
        # Sliding-window layers (Gemma3) drop old states unless told to keep them until the
        # next crop; without this a rejection past the window cannot be rolled back. The
        # baseline never rolls back, so it keeps the lean window-sized cache.
        if rollback and hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()
        return cache

    @staticmethod
    def _rollback(cache, keep: int) -> None:
        """Keep the first `keep` positions (transformers 5.x: crop takes a negative count),
        then shrink recording sliding-window layers back to their window.

        A recording sliding layer keeps every state until the next crop. transformers 5.24
        only hands the last window-1+q of them to attention; 5.17 hands all of them while
        its mask expects window-1+q (a shape error), so after the prefill and after a fully
        accepted block (nothing cropped) the surplus must go. Keys older than the window are
        never needed again: a rollback removes at most K of the newest positions."""
        remove = cache.get_seq_length() - keep
        if remove > 0:
            cache.crop(-remove)
        for layer in getattr(cache, "layers", ()):
            if not (getattr(layer, "is_sliding", False) and getattr(layer, "record_past", False)):
                continue
            window = getattr(layer, "sliding_window", None)
            if window and getattr(layer, "keys", None) is not None and layer.keys.shape[-2] > window - 1:
                layer.keys = layer.keys[..., -(window - 1):, :]
                layer.values = layer.values[..., -(window - 1):, :]

    def _check(self, prompt_ids, max_new_tokens: int) -> torch.Tensor:
        if max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens: {max_new_tokens!r} is invalid; valid: an integer >= 1")
        ids = list(prompt_ids)
        if not ids:
            raise ValueError("prompt: empty; decoding needs at least one prompt token")
        v = self.target.shape.vocab_size
        bad = [i for i in ids if not 0 <= int(i) < v]
        if bad:
            raise ValueError(f"prompt ids: {bad[:5]} outside the target vocabulary; valid: 0..{v - 1}")
        return torch.tensor([ids], dtype=torch.long, device=self.target.device)

    def _stops(self, extra: Iterable[int]) -> frozenset[int]:
        return self.stop_ids | frozenset(int(i) for i in extra)

    # ---------------------------------------------------------------- baseline
    @torch.inference_mode()
    def target_only(self, prompt_ids, *, max_new_tokens: int, sampling: Sampling = Sampling(),
                    stop_ids: Iterable[int] = (), on_tokens: OnTokens = None, seed_offset: int = 0) -> DecodeResult:
        """Autoregressive decoding with the target alone, on the engine's cache machinery."""
        ids = self._check(prompt_ids, max_new_tokens)
        dev = ids.device
        gen = sampling.generator(dev, seed_offset)
        out = _Output(max_new_tokens, self._stops(stop_ids), on_tokens)
        t0 = time.perf_counter()
        cache = self._new_cache(rollback=False)
        n = ids.shape[1]
        logits, _ = self.target(ids, cache=cache, position_ids=_positions(0, n, dev)[None], logits_to_keep=1)
        forwards = 1
        tok = pick(logits[:, -1], sampling, gen)
        pos = n
        while not out.push([int(tok)]):
            logits, _ = self.target(tok[:, None], cache=cache, position_ids=_positions(pos, 1, dev)[None])
            forwards += 1
            tok = pick(logits[:, -1], sampling, gen)
            pos += 1
        return DecodeResult(out.tokens, n, out.stop_reason, time.perf_counter() - t0, forwards)

    # ------------------------------------------------------------- speculative
    @torch.inference_mode()
    def speculative(self, prompt_ids, *, max_new_tokens: int, sampling: Sampling = Sampling(),
                    stop_ids: Iterable[int] = (), use_head: bool = True, on_tokens: OnTokens = None,
                    seed_offset: int = 0) -> DecodeResult:
        """Chain speculative decoding; output identical (greedy) or identically distributed
        (T > 0) to `target_only` with the same settings."""
        if self.adapter is None:
            raise ValueError("speculative decoding needs a drafter adapter")
        if use_head and self.head is None:
            raise ValueError("use_head=True but no Domino head is loaded")
        if self.adapter.topology == "tree":  # a static tree (Medusa choices): greedy, decoding/tree.py
            from .tree import tree_speculative

            return tree_speculative(self, prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling,
                                    stop_ids=stop_ids, use_head=use_head, on_tokens=on_tokens, seed_offset=seed_offset)
        if self.adapter.topology != "chain":
            raise ValueError(f"drafter topology {self.adapter.topology!r} is not supported here; valid: 'chain', 'tree'")
        ids = self._check(prompt_ids, max_new_tokens)
        dev = ids.device
        target, adapter = self.target, self.adapter
        k = adapter.num_slots
        capture = adapter.capture_layers()
        gen = sampling.generator(dev, seed_offset)
        out = _Output(max_new_tokens, self._stops(stop_ids), on_tokens)
        reached, accepted_slot, accepted = [0] * k, [0] * k, []

        t0 = time.perf_counter()
        cache = self._new_cache(rollback=True)
        adapter.reset(1)
        n = ids.shape[1]
        logits, feats = target(ids, cache=cache, position_ids=_positions(0, n, dev)[None], capture=capture,
                               logits_to_keep=1)
        forwards = 1
        self._rollback(cache, n)
        adapter.observe(feats, _positions(0, n, dev), ids=ids)
        anchor = pick(logits[:, -1], sampling, gen)  # [1]
        pos = n
        done = out.push([int(anchor)])
        while not done:
            block = adapter.propose(anchor, pos)
            drafts, q = self.rollout(
                self.head, block, anchor, adapter.embed, temperature=sampling.temperature, top_k=sampling.top_k,
                top_p=sampling.top_p, generator=gen, use_head=use_head,
            )
            seq = torch.cat([anchor[:, None], drafts], dim=1)
            logits, feats = target(seq, cache=cache, position_ids=_positions(pos, k + 1, dev)[None], capture=capture)
            forwards += 1
            if sampling.greedy:
                n_acc, nxt = verify_greedy(logits, drafts)
            else:
                p = warp(logits, sampling.temperature, sampling.top_k, sampling.top_p)
                n_acc, nxt = verify_sampling(p, q, drafts, gen)
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
            self._rollback(cache, pos + 1 + a)
            # feats is None for drafters that read tokens only (capture_layers() == (), PARD)
            adapter.observe(None if feats is None else feats[:, : a + 1], _positions(pos, a + 1, dev),
                            ids=seq[:, : a + 1])
            anchor = nxt
            pos += a + 1
        return DecodeResult(out.tokens, n, out.stop_reason, time.perf_counter() - t0, forwards, accepted,
                            reached, accepted_slot)
