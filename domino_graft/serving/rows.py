"""What a served batch holds of each request, apart from stepping it (serving/batch.py): the row itself
(`BatchRow`), a prompt admitted a chunk at a time (`Chunked`), the rows' sampling groups and the batch's one
generator, and the target's cache for a batch."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from ..decoding.batched import ragged_target
from ..sampling import Sampling


class BatchRow:
    """What the batch needs of a request: its verified context, the anchor when it already has
    one, its token budget, and where its tokens go (`push(ids) -> finished`)."""

    def __init__(self, context: Sequence[int], anchor: Optional[int], positions_needed: int, sampling: Sampling,
                 push: Callable[[list[int]], bool], alive: Callable[[], bool]):
        self.context = list(context)
        self.sampling = sampling
        self.anchor = anchor
        self.positions_needed = positions_needed  # the most positions this row can reach
        self.push = push  # -> True when the row is done (stop token, length or stop string)
        self.alive = alive  # False once the client has gone


class Chunked:
    """A prompt admitted in chunks (serving/batch.py `admit`): how much of it is in the target's cache, and the
    captured features of those chunks (the drafter's context is written whole after the last)."""

    def __init__(self, row: BatchRow):
        self.row, self.done, self.feats = row, 0, []

    def next_ids(self, chunk: int, dev) -> torch.Tensor:
        return torch.tensor(self.row.context[self.done: self.done + chunk], dtype=torch.long, device=dev)

    def add(self, n: int, feats) -> None:
        self.done += n
        if feats is not None:
            self.feats.append(feats)

    @staticmethod
    def features(chunked: list["Chunked"]):
        """[P, n_max, F] of the prompts' features, right-padded with zeros (None without features)."""
        if not chunked[0].feats:
            return None
        whole = [torch.cat(c.feats, dim=0) for c in chunked]
        n = max(f.shape[0] for f in whole)
        return torch.stack([torch.nn.functional.pad(f, (0, 0, 0, n - f.shape[0])) for f in whole])


def setting_key(s: Sampling) -> tuple:
    """What groups a row with others (greedy ignores top_k / top_p; the seed is the batch's, `batch_generator`)."""
    return ("greedy",) if s.greedy else (s.temperature, s.top_k, s.top_p)


def sampling_groups(rows: list[BatchRow], dev) -> list[tuple[torch.Tensor, Sampling]]:
    """The rows of each sampling setting, in order of their first row: [(rows' indices, setting)]."""
    by_key: dict[tuple, list[int]] = {}
    for b, r in enumerate(rows):
        by_key.setdefault(setting_key(r.sampling), []).append(b)
    return [(torch.tensor(idx, device=dev), rows[idx[0]].sampling) for idx in by_key.values()]


def batch_generator(groups, dev, seed: Optional[int]) -> Optional[torch.Generator]:
    """One generator per batch (None if every row is greedy): a request's seed is not used here
    (serving/batch.py's docstring); `seed` fixes the batch's (tests), else fresh entropy."""
    if all(s.greedy for _, s in groups):
        return None
    gen = torch.Generator(device=dev)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def batch_target(engine, rows: int, length: int):
    """The target for a batch of `rows` rows reaching `length` positions: the engine's static ragged
    cache, kept while it has room (`ragged_target`; the warm start reserves it at full size once),
    or a DynamicCache. kv as Engine.speculative_batch."""
    kv = "dynamic" if engine.kv_requested == "dynamic" else "auto"
    dev = engine.target.device
    return ragged_target(engine, [torch.zeros(1, dtype=torch.long, device=dev)] * rows, length, kv)
