"""What every decoder shares: the result, the target-only stop rules, prompt checks,
positions, and the target's cache (with rollback): the HF DynamicCache, or the fast
engine's static cache (`StaticTarget`, opt-in via `Engine(kv="static")`).

The target-only baseline (engine.py), chain decoding (chain.py) and tree decoding (tree.py)
each import this module and none of the others, so a measured speedup compares decoders
that stop, count and cache exactly alike. The verify budget's CUDA timings (`cuda_median_ms`,
`propose_timer`) live here too: the solo, batched and served chains measure alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import torch
import torch.nn.functional as F

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


def check_prompt(target, prompt_ids, max_new_tokens: int) -> torch.Tensor:
    """The prompt as a [1, T] tensor on the target's device, or a ValueError saying what is wrong."""
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens: {max_new_tokens!r} is invalid; valid: an integer >= 1")
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt: empty; decoding needs at least one prompt token")
    import operator

    for i in ids:
        try:
            if isinstance(i, bool):
                raise TypeError
            operator.index(i)
        except TypeError:
            from ..inputs import describe

            raise ValueError(f"prompt ids: {describe(i)} is not a token id; valid: integers") from None
    v = target.shape.vocab_size
    bad = [i for i in ids if not 0 <= int(i) < v]
    if bad:
        raise ValueError(f"prompt ids: {bad[:5]} outside the target vocabulary; valid: 0..{v - 1}")
    from ..inputs import check_length

    check_length(len(ids), max_new_tokens, target.shape.max_position_embeddings, "prompt")
    return torch.tensor([ids], dtype=torch.long, device=target.device)


def stop_set(stop_ids: frozenset[int], extra: Iterable[int]) -> frozenset[int]:
    """The engine's stop ids plus one decode's extra ones."""
    return stop_ids | frozenset(int(i) for i in extra)


def positions(start: int, n: int, device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device)


# ------------------------------------------------------------------------ target cache
def new_cache(target, *, rollback: bool):
    from transformers import DynamicCache

    cache = DynamicCache(config=target.model.config)
    # Sliding-window layers (Gemma3) drop old states unless told to keep them until the
    # next crop; without this a rejection past the window cannot be rolled back. The
    # baseline never rolls back, so it keeps the lean window-sized cache.
    if rollback and hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def rollback(cache, keep: int) -> None:
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


# ------------------------------------------------------------- static target cache
# auto: the fast engine on a CUDA device (graphs are where it pays), the HF cache elsewhere
KV_CHOICES = ("auto", "dynamic", "static")


def check_kv(kv: str) -> str:
    if kv not in KV_CHOICES:
        raise ValueError(f"kv: {kv!r} is invalid; valid: {', '.join(KV_CHOICES)}")
    return kv


class GraphedSteps:
    """What both static targets (StaticTarget here, ragged_static.StaticRaggedTarget for batches)
    share: a graph runner per captured-layer tuple over `self.lm`, and the features a runner's
    hidden states give."""

    lm = None
    _runner_cls = None
    runners: dict

    def _runner(self, capture: tuple[int, ...]):
        runner = self.runners.get(capture)
        if runner is None:
            runner = self.runners[capture] = self._runner_cls(self.lm, capture=capture)
        return runner

    @staticmethod
    def _features(hidden: dict, capture: tuple[int, ...]):
        """The captured layers' outputs concatenated along the last dim in the order given, or None."""
        return torch.cat([hidden[i] for i in capture], dim=-1) if capture else None


class StaticTarget(GraphedSteps):
    """The target on the fast engine (domino_graft.fast): its own forward sharing the HF
    weights, a static KV cache whose rollback is a length, and on CUDA graph replay of the
    fixed-shape steps (T = 1 decode, T = K + 1 verify; eager on a CPU).

    ``step(ids, pos, capture=...)`` returns ``(logits, features)`` exactly like
    ``TargetModel.__call__(..., capture=...)``: the captured layers' outputs concatenated
    along the last dim in the order given (-1 = the final post-norm state), or None.
    Build with ``StaticTarget.create(target)``; an unsupported target (or a cache length it
    cannot serve: ``reserve`` raises ``fast.UnsupportedModel``) runs on the dynamic path."""

    def __init__(self, target, lm_cls, runner_cls):
        self.target = target
        self._lm_cls, self._runner_cls = lm_cls, runner_cls
        self.lm = None
        self.runners: dict[tuple[int, ...], object] = {}

    @classmethod
    def create(cls, target) -> tuple[Optional["StaticTarget"], Optional[str]]:
        """(the static target, None), or (None, why the target cannot run on it)."""
        from ..fast import FastLM, GraphRunner, UnsupportedModel

        self = cls(target, FastLM, GraphRunner)
        try:
            self.reserve(1)  # from_hf's architecture checks, on a small cache
        except UnsupportedModel as e:
            return None, str(e)
        return self, None

    def reserve(self, length: int) -> None:
        """Make room for `length` positions (a new cache when the current one is shorter:
        powers of two from 256, capped at the target's max_position_embeddings + slack)."""
        if self.lm is not None and self.lm.max_len >= length:
            return
        from ..fast import round_up_pow2

        size = max(length, min(round_up_pow2(length), self.target.shape.max_position_embeddings + 64))
        self.lm = self._lm_cls.from_hf(self.target.model, max_batch=1, max_len=size)
        if self.lm.device.type == "cuda":
            from ..fast import prepare_for_cuda_decoding

            prepare_for_cuda_decoding(self.lm)
        self.runners = {}  # graphs captured over the old cache's tensors

    def reset(self, length: int) -> None:
        """Start a decode that needs `length` positions: room for them, cache emptied."""
        self.reserve(length)
        self.lm.cache.reset()

    def prefill(self, ids: torch.Tensor, *, capture: tuple[int, ...] = (), logits_to_keep: int = 1):
        """The prompt at positions 0..n-1, right-padded to `prefill_length(n)` and run through
        the graph runner like a step: a handful of padded lengths, each compiled and captured
        once, instead of an eager launch-bound forward per prompt (SmolLM2's eager forward is
        ~22 ms against a ~1 ms graphed step; docs/design.md §5). The padding's K/V land after
        the prompt, where no later query looks before a step overwrites them (the cache's
        length goes back to n), and the logits are taken at the real last rows."""
        from ..fast import prefill_length

        capture = tuple(capture)
        n = ids.shape[1]
        t = prefill_length(n, self.lm.max_len)
        padded = ids if t == n else F.pad(ids, (0, t - n))
        need = capture if -1 in capture else capture + (-1,)
        _, hidden = self._runner(need)(padded, 0, logits_to_keep=1)  # only hidden[-1]'s rows are read
        keep = n if logits_to_keep <= 0 else min(int(logits_to_keep), n)  # 0: every row, as FastLM.forward
        last = hidden[-1][:, n - keep: n]
        logits = self.lm.project_logits(last)
        feats = self._features(hidden, capture)
        self.rollback(n)
        return logits, None if feats is None else feats[:, :n]

    def step(self, ids: torch.Tensor, pos: int, *, capture: tuple[int, ...] = ()):
        """ids [1, T] at positions pos..pos+T-1, through the graph runner for `capture`.
        The logits may be the runner's static buffer: valid until the next step."""
        capture = tuple(capture)
        logits, hidden = self._runner(capture)(ids, int(pos))
        return logits, self._features(hidden, capture)

    def rollback(self, keep: int) -> None:
        """Keep the first `keep` positions: the cache's length moves, nothing is copied."""
        self.lm.cache.set_lengths(int(keep))


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


def propose_timer(run, dev):
    """CUDA events around a step's propose + rollout, while the auto budget `run` has no propose cost
    for its batch size (read after the step's sync, so they cost no extra sync); else None."""
    if run is None or not run.times_propose(dev.type):
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    return start, end
