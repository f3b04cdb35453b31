"""Target-only decoding and speculative decoding for any drafter adapter, on one engine.

Every path shares the same TargetModel forward, DynamicCache, dtype, stop handling and
token accounting (decoding/common.py), so a measured speedup is a speedup over an equally
optimised baseline (docs/design.md §5), not over `model.generate`.

`Engine(kv="static")` (the default on a CUDA device: kv="auto") runs target-alone and chain
decoding on the fast engine's static KV cache (decoding/session.py `StaticSession`: own forward,
torch.compile'd and CUDA-graphed on a GPU, eager on a CPU) when the target's architecture is
supported; otherwise (and for trees) the dynamic path runs. Either way the decoders see one
contract, a target session (`Engine.session`). `DecodeResult.kv_path` says which ran.

Speculative decoding is chosen by the drafter's topology (`adapter.topology`):

    "chain"   one chain of K proposals per block, greedy or sampled     decoding/chain.py
    "tree"    a static tree of proposals per block, greedy or sampled   decoding/tree.py
"""

from __future__ import annotations

import time
from typing import Iterable, Optional

import torch

from ..sampling import Sampling, pick
from .batched import batched_chain, batched_target_only, reads_ahead
from .budget import VerifyBudget
from .chain import chain_speculative
from .common import DecodeResult, OnTokens, Output, TokenReader, check_kv, check_prompt, stop_set
from .rollout import get_rollout
from .session import DynamicSession, StaticSession, TargetSession
from .tree import tree_speculative

SOLO_START = 256  # the solo static cache's smallest size (batches start at 64: batched.py)

# adapter.topology -> the decoder for it: f(engine, prompt_ids, *, max_new_tokens, sampling,
# stop_ids, use_head, on_tokens, seed_offset) -> DecodeResult
DECODERS = {"chain": chain_speculative, "tree": tree_speculative}


class Engine:
    """Decoding with one loaded target, drafter adapter and (optional) Domino head: one prompt
    at a time (`target_only`, `speculative`), or several at once, chains (greedy or sampled) on the
    fast engine's static cache where the target supports it, else the dynamic one
    (`target_only_batch`, `speculative_batch`: decoding/batched.py)."""

    def __init__(self, target, adapter=None, head=None, *, rollout: str | dict = "torch", stop_ids: Iterable[int] = (),
                 kv: str = "auto"):
        """rollout: a name, or a choice {"name", "pool_size", "pool_select"} (decoding.rollout_choice).
        kv: "dynamic" (the HF forward and DynamicCache), "static" (the fast engine where the
        target supports it, else dynamic; `kv_note` says why not) or "auto" (static on a CUDA
        device, dynamic elsewhere). Batches run on the static cache unless kv is "dynamic"
        (requested as such: "auto" on a CPU still batches on the static cache, whose eager code
        the CPU tests exercise)."""
        self.kv = self.kv_requested = check_kv(kv)
        if self.kv == "auto":
            self.kv = "static" if torch.device(target.device).type == "cuda" else "dynamic"
        self._static: Optional[StaticSession] = None  # the solo decodes' one-row static session
        self.kv_note: Optional[str] = None
        self._ragged_static = None  # batched.py's static session, kept between batch decodes
        self.batch_kv_note: Optional[str] = None  # why the last batch ran on the dynamic cache
        self.batch_drafter_path: Optional[str] = None  # "static" / "eager": the last batched chain's drafter
        self.last_run = None  # the last budgeted decode's run (budget.BudgetRun; its report: `last_budget`)
        if self.kv == "static":
            self._static, self.kv_note = StaticSession.create(target, 1, 1, start=SOLO_START)
        self.target = target
        self.adapter = adapter
        self.head = head
        choice = {"name": rollout} if isinstance(rollout, str) else rollout
        self.rollout_name = choice["name"]
        self.rollout = get_rollout(choice["name"], head, pool_size=choice.get("pool_size"),
                                   pool_select=choice.get("pool_select"))
        self.stop_ids = frozenset(int(i) for i in stop_ids)

    @property
    def kv_path(self) -> str:
        """The cache target-alone and chain decodes use: "static" or "dynamic"."""
        return "static" if self._static is not None else "dynamic"

    def session(self, length: int, *, rollback: bool = True) -> TargetSession:
        """A one-row target session with room for `length` positions: the static one (kept between
        decodes, grown when too short), else the dynamic one. rollback=False: a decode that never
        rolls back (the target alone: a sliding layer's dynamic cache keeps only its window)."""
        if self._static is not None:
            static, why = StaticSession.create(self.target, 1, length, self._static, start=SOLO_START)
            if static is not None:
                self._static = static
                return static
            self.kv_note = why  # e.g. a sliding window shorter than this decode
        return DynamicSession(self.target, rollback=rollback)

    # ---------------------------------------------------------------- baseline
    @torch.inference_mode()
    def target_only(self, prompt_ids, *, max_new_tokens: int, sampling: Sampling = Sampling(),
                    stop_ids: Iterable[int] = (), on_tokens: OnTokens = None, seed_offset: int = 0) -> DecodeResult:
        """Autoregressive decoding with the target alone, on the engine's cache machinery."""
        return self.target_only_checked(check_prompt(self.target, prompt_ids, max_new_tokens),
                                        max_new_tokens=max_new_tokens, sampling=sampling, stop_ids=stop_ids,
                                        on_tokens=on_tokens, seed_offset=seed_offset)

    @torch.inference_mode()
    def target_only_checked(self, ids: torch.Tensor, *, max_new_tokens: int, sampling: Sampling = Sampling(),
                            stop_ids: Iterable[int] = (), on_tokens: OnTokens = None,
                            seed_offset: int = 0) -> DecodeResult:
        """`target_only` of ids [1, n] that `check_prompt` already returned (the solo chain's decode that
        starts committed checks its prompt once, not twice)."""
        dev = ids.device
        gen = sampling.generator(dev, seed_offset)
        out = Output(max_new_tokens, stop_set(self.stop_ids, stop_ids), on_tokens)
        t0 = time.perf_counter()
        n = ids.shape[1]
        target = self.session(n + max_new_tokens + 1, rollback=False)
        logits, _, _, _ = target.prefill([ids[0]], ())
        tok = pick(logits, sampling, gen)
        pos = n
        # a step ahead (batched.reads_ahead, as the batched loop): the next step is launched before this token is
        # read, unless the tokens under way use up max_new_tokens; a stop token is learnt a step late
        ahead = reads_ahead(target, dev)
        reader = TokenReader(dev, pinned=ahead)
        reads = [reader.send(tok)]  # tokens picked on the device, not yet pushed, oldest first
        forwards = 0  # the forwards whose token was pushed (the prefill's, then one a step)
        while reads:
            if ahead and out.left() > len(reads):
                tok, pos = self._plain_step(target, tok, pos, sampling, gen)
                reads.append(reader.send(tok))
            forwards += 1
            if out.push(reads.pop(0)()):
                break
            if not reads:
                tok, pos = self._plain_step(target, tok, pos, sampling, gen)
                reads.append(reader.send(tok))
        return DecodeResult(out.tokens, n, out.stop_reason, time.perf_counter() - t0, forwards,
                            kv_path=target.kv_path)

    @staticmethod
    def _plain_step(target, tok: torch.Tensor, pos: int, sampling: Sampling, gen) -> tuple[torch.Tensor, int]:
        """One token of the target alone's solo loop: tok [1] at pos -> (the next token [1] on the device, pos + 1)."""
        logits, _ = target.step(tok[:, None], None, (), [pos])
        target.keep((1,), 1)
        return pick(logits[:, -1], sampling, gen), pos + 1

    # ------------------------------------------------------------- speculative
    @torch.inference_mode()
    def speculative(self, prompt_ids, *, max_new_tokens: int, sampling: Sampling = Sampling(),
                    stop_ids: Iterable[int] = (), use_head: bool = True, on_tokens: OnTokens = None,
                    seed_offset: int = 0, budget: Optional[VerifyBudget] = None) -> DecodeResult:
        """Speculative decoding with the decoder of the drafter's topology; output identical
        (greedy) or identically distributed (T > 0) to `target_only` with the same settings.
        budget: chains only (decoding/chain.py: auto may end speculation for the rest of a decode)."""
        if self.adapter is None:
            raise ValueError("speculative decoding needs a drafter adapter")
        if use_head and self.head is None:
            raise ValueError("use_head=True but no Domino head is loaded")
        decode = DECODERS.get(self.adapter.topology)
        if decode is None:
            raise ValueError(f"drafter topology {self.adapter.topology!r} is not supported here; valid: "
                             f"{', '.join(map(repr, DECODERS))}")
        kw = {}
        if budget is not None:
            if self.adapter.topology != "chain":
                raise ValueError(f"--verify-budget: {budget.label()!r} with a {self.adapter.topology} drafter; "
                                 "valid: full (a budget applies to chain drafters)")
            kw["budget"] = budget
        return decode(self, prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling, stop_ids=stop_ids,
                      use_head=use_head, on_tokens=on_tokens, seed_offset=seed_offset, **kw)

    # ---------------------------------------------------------------- batched
    @property
    def last_budget(self) -> Optional[dict]:
        """The last budgeted decode's choices (`budget.BudgetRun.report`), built here, when read: not in
        the decode's own time."""
        return None if self.last_run is None else self.last_run.report()

    def target_only_batch(self, prompts, *, max_new_tokens: int, sampling: Sampling = Sampling(),
                          stop_ids: Iterable[int] = (), seed_offset: int = 0) -> list[DecodeResult]:
        """Every prompt at once (decoding/batched.py); row b == `target_only(prompts[b])` (greedy:
        token for token; T > 0: in distribution)."""
        return batched_target_only(self, prompts, max_new_tokens=max_new_tokens, sampling=sampling, stop_ids=stop_ids,
                                   seed_offset=seed_offset, kv=self._batch_kv())

    def speculative_batch(self, prompts, *, max_new_tokens: int, sampling: Sampling = Sampling(),
                          stop_ids: Iterable[int] = (), use_head: bool = True, seed_offset: int = 0,
                          budget: Optional[VerifyBudget] = None, shrink: bool = False) -> list[DecodeResult]:
        """Every prompt at once, chains (decoding/batched.py); row b == `speculative(prompts[b])`
        (greedy: token for token; T > 0: in distribution, by per-row speculative sampling).
        budget: the drafts verified per step (decoding/budget.py); None = all K. shrink: compact the
        speculative batch as its rows end (batched.py; off by default, docs/design.md says why)."""
        if self.adapter is None:
            raise ValueError("speculative decoding needs a drafter adapter")
        return batched_chain(self, prompts, max_new_tokens=max_new_tokens, sampling=sampling, stop_ids=stop_ids,
                             use_head=use_head, seed_offset=seed_offset, kv=self._batch_kv(), budget=budget,
                             shrink=shrink)

    def _batch_kv(self) -> str:
        return "dynamic" if self.kv_requested == "dynamic" else "auto"
