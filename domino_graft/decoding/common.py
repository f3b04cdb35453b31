"""What every decoder shares: the result, the target-only stop rules, prompt checks,
positions and the kv choice (the target's cache itself is a session: decoding/session.py).

The target-only baseline (engine.py), chain decoding (chain.py) and tree decoding (tree.py)
each import this module and none of the others, so a measured speedup compares decoders
that stop and count exactly alike. The verify budget's CUDA timings (`cuda_median_ms`,
`propose_timer`) live here too: the solo, batched and served chains measure alike.
"""

from __future__ import annotations

import time

from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Optional

import torch

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
    kv_path: str = "dynamic"  # the target's cache that ran: "static" (fast engine) | "dynamic" (HF)

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


class Output:
    """Appends emitted tokens with exactly the target-only stop rules: stop right after a
    stop token (kept) or at max_new_tokens, whichever comes first."""

    def __init__(self, max_new_tokens: int, stop_ids: frozenset[int], on_tokens: OnTokens):
        self.max_new_tokens = max_new_tokens
        self.stop_ids = frozenset(stop_ids)
        self.on_tokens = on_tokens
        self.tokens: list[int] = []
        self.stop_reason: Optional[str] = None

    def push(self, ids: list[int]) -> bool:
        start = len(self.tokens)
        if len(ids) < self.max_new_tokens - start and self.stop_ids.isdisjoint(ids):
            self.tokens.extend(ids)  # nothing in the chunk ends the decode (the common case: one check, no loop)
        else:
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

    def left(self) -> int:
        """The most tokens this decode may still emit (a stop token may end it sooner)."""
        return 0 if self.stop_reason is not None else self.max_new_tokens - len(self.tokens)


def check_prompt_ids(target, prompt_ids, max_new_tokens: int) -> list[int]:
    """The prompt's ids as a list of ints, or a ValueError saying what is wrong. Plain ints take a fast
    path (a type check and min/max): a batch of 64 GSM8K prompts is ~10,000 ids to check per decode."""
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens: {max_new_tokens!r} is invalid; valid: an integer >= 1")
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt: empty; decoding needs at least one prompt token")
    if not all(type(i) is int for i in ids):  # numpy or tensor ints, or something that is no id (bool is not)
        import operator

        for i in ids:
            try:
                if isinstance(i, bool):
                    raise TypeError
                operator.index(i)
            except TypeError:
                from ..inputs import describe

                raise ValueError(f"prompt ids: {describe(i)} is not a token id; valid: integers") from None
        ids = [int(i) for i in ids]
    v = target.shape.vocab_size
    if min(ids) < 0 or max(ids) >= v:
        bad = [i for i in ids if not 0 <= i < v]
        raise ValueError(f"prompt ids: {bad[:5]} outside the target vocabulary; valid: 0..{v - 1}")
    from ..inputs import check_length

    check_length(len(ids), max_new_tokens, target.shape.max_position_embeddings, "prompt")
    return ids


def check_prompt(target, prompt_ids, max_new_tokens: int) -> torch.Tensor:
    """The prompt as a [1, T] tensor on the target's device, or a ValueError saying what is wrong."""
    return torch.tensor([check_prompt_ids(target, prompt_ids, max_new_tokens)], dtype=torch.long,
                        device=target.device)


def check_prompts(target, prompts, max_new_tokens: int) -> list[torch.Tensor]:
    """Each prompt as a [T] tensor on the target's device (views of one copy: one host-to-device
    transfer a batch, not one a prompt), or a ValueError saying what is wrong with the first bad one."""
    lists = [check_prompt_ids(target, p, max_new_tokens) for p in prompts]
    flat = torch.tensor([i for ids in lists for i in ids], dtype=torch.long).to(target.device)
    return list(flat.split([len(ids) for ids in lists]))


def stop_set(stop_ids: frozenset[int], extra: Iterable[int]) -> frozenset[int]:
    """The engine's stop ids plus one decode's extra ones."""
    return stop_ids | frozenset(int(i) for i in extra)


def positions(start: int, n: int, device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device)


# --------------------------------------------------------------------- kv choice
# auto: the fast engine on a CUDA device (graphs are where it pays), the HF cache elsewhere
KV_CHOICES = ("auto", "dynamic", "static")


def check_kv(kv: str) -> str:
    if kv not in KV_CHOICES:
        raise ValueError(f"kv: {kv!r} is invalid; valid: {', '.join(KV_CHOICES)}")
    return kv


# ------------------------------------------------------------------ the budget's CUDA timings
def cuda_median_ms(call: Callable[[], object], after: Callable[[], object], repeats: int = 5) -> float:
    """Median ms of `call()` by CUDA events over `repeats` calls after a first one (which may compile
    or capture a graph); `after()` runs after each call (a rollback), outside the timing."""
    events = []
    for i in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        after()
        if i:
            events.append((start, end))
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in events)
    return ms[len(ms) // 2]


class ProposeTimer:
    """CUDA events around a step's propose and its rollout, read after the step's sync (no extra sync):
    `proposed()` after the drafter's forward, `rolled_out()` after the head's rollout; `read()` -> (propose
    ms, rollout ms). The two apart because a rollout's cost grows with the slots it rolls out (the Domino
    GRU and residual run slot after slot) while the drafter's forward does not (decoding/budget.py)."""

    def __init__(self):
        self.start, self.mid, self.end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        self.start.record()

    def proposed(self) -> None:
        self.mid.record()

    def rolled_out(self) -> None:
        self.end.record()

    def read(self) -> tuple[float, float]:
        return self.start.elapsed_time(self.mid), self.mid.elapsed_time(self.end)


def propose_timer(run, dev) -> Optional[ProposeTimer]:
    """A ProposeTimer while the auto budget `run` has no propose cost for its batch size; else None."""
    if run is None or not run.times_propose(dev.type):
        return None
    return ProposeTimer()


def draft_step(engine, propose: Callable[[], object], anchor: torch.Tensor, kk: int, sampling, gen, use_head: bool,
               run, dev):
    """A chain step's drafts: `propose()` (the drafter's block), cut to its first kk slots where kk < K, rolled out by
    the engine's head. -> (drafts [B, kk], q or None, the ProposeTimer that timed them or None: `propose_timer`)."""
    timer = propose_timer(run, dev)
    block = propose()
    if timer is not None:
        timer.proposed()
    if kk < engine.adapter.num_slots:  # only the first K' slots are rolled out and verified
        block = first_slots(block, kk)
    drafts, q = engine.rollout(engine.head, block, anchor, engine.adapter.embed, temperature=sampling.temperature,
                               top_k=sampling.top_k, top_p=sampling.top_p, generator=gen, use_head=use_head)
    if timer is not None:
        timer.rolled_out()
    return drafts, q, timer


def whole_decode(tokens: int, started: float, captured: bool) -> tuple[int, float]:
    """(tokens, seconds since `started`) of a whole decode for the verify budget's outcomes (budget.py,
    "Whole decodes"); (0, 0.0), no sample, where the decode `captured` a CUDA graph: its wall holds the
    capture (and the compiles beside it), as a first decode at a new size or prompt length does."""
    return (0, 0.0) if captured else (tokens, time.perf_counter() - started)


class LiveMask:
    """Which rows of a batch go on, mirrored on the device: copied there again only when the host list
    changes. Rows end a few times a decode; a copy every step (torch.tensor(live, device=...)) was host
    time between a step's sync and its next launches, where the device waits."""

    def __init__(self, device):
        self.device = device
        self._host: Optional[list[bool]] = None
        self.on = self.long = None  # bool [B] and its 0/1 long

    def of(self, live: list[bool]) -> "LiveMask":
        if live != self._host:
            self._host = list(live)
            self.on = torch.tensor(self._host, device=self.device)
            self.long = self.on.long()
        return self


class TokenReader:
    """A step's tokens [B] for the host. `send(tok)` -> a function that returns them as ints: `tok.tolist()`
    (the step's sync), or with `pinned` (CUDA) a copy into pinned host memory queued behind the step and an
    event, so that the host can launch the next step before it waits for this one (batched.py's plain loop a
    step ahead). Two buffers take turns: one being read while the next step's copy lands in the other."""

    def __init__(self, device, pinned: bool):
        self.pinned = pinned and torch.device(device).type == "cuda"
        self._bufs: list[torch.Tensor] = []
        self._turn = 0

    def send(self, tok: torch.Tensor) -> Callable[[], list[int]]:
        if not self.pinned:
            return tok.tolist
        n = tok.shape[0]
        if not self._bufs or self._bufs[0].numel() < n:
            self._bufs = [torch.empty(n, dtype=tok.dtype, pin_memory=True) for _ in range(2)]
        buf = self._bufs[self._turn][:n]
        self._turn ^= 1
        buf.copy_(tok, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def read() -> list[int]:
            done.synchronize()
            return buf.tolist()

        return read


def first_slots(block, kk: int):
    """The drafter's block cut to its first kk slots (a verify budget's K' < K): slot j reads only
    slots < j, so the rollout over them is the full block's first kk."""
    return replace(block, hidden=block.hidden[:, :kk].contiguous(), base_logits=block.base_logits[:, :kk].contiguous())
