"""Eager reference of the Domino-head rollout, and the sampling helpers every path shares.

This is the semantics the fused Triton path (`domino_rollout.py`) is tested against; it is
built from `DominoHead.step` and nothing else, so the head module stays the single source
of truth for the arithmetic:

    S_0 = 0;  for j = 1..K:  S_j = GRUCell(E(x_{j-1}), S_{j-1})   (x_0 = anchor, x_j = d_j)
    final_j = base_j                          if j <= pure_prefix_len (or use_head=False)
            = base_j + W2·SiLU(W1·[H_j; S_j])  otherwise
    greedy:   d_j = argmax final_j            (exact ties: the lowest token id wins)
    sampling: q_j = softmax(filter(final_j / T)),  d_j ~ q_j

Candidate pool (pool_size > 0): a corrected slot only scores `pool_size` base candidates of
that slot; the draft is the best of those, and under sampling q_j is the pool distribution
scattered into a dense [V] vector (zeros elsewhere). Verification reads q, so speculative
sampling stays exact. Slots within the pure prefix are not pooled. The candidates
(`pool_select`): "topk" = the exact top-`pool_size` base logits; "bucket" = the max of each of
`pool_size` contiguous V buckets (`bucket_candidates`): approximate (a top token is missed only
when a higher one shares its bucket), always containing the base argmax, and one cheap pass;
"radix" = a two-level radix select (`radix_candidates`): the exact top-k for bf16/fp16 logits
(boundary ties to the lowest ids), to 2^-15 relative for fp32, in a fixed order. These four pick
each slot's own candidates. "block_shared" is SGLang's rule (`block_shared_ids`): one pool for
the whole block, the top-`pool_size` of each token's max base logit over the corrected slots; a τ
measured with it is the τ SGLang's Domino runtime drafts for (the same drafts, ties aside: SGLang
takes the first maximal candidate in torch.topk's unspecified order, here the lowest id).

Sampling draws one uniform per (row, slot) up front and inverts the CDF; drawing them
before the loop is what lets a CUDA graph replay the whole rollout (no RNG inside).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

_BIG_ID = torch.iinfo(torch.int64).max


def argmax_lowest_id(values: torch.Tensor, ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Position of the maximum along the last dim; exact ties go to the lowest token id.

    Without `ids` the positions are the ids, and torch.argmax already returns the first
    maximal index (documented behaviour). With `ids` (an unsorted candidate pool) the tie is
    broken on the id, not the position.
    """
    if ids is None:
        return values.argmax(dim=-1)
    best = values.amax(dim=-1, keepdim=True)
    cand = torch.where(values == best, ids, torch.full_like(ids, _BIG_ID))
    best_id = cand.amin(dim=-1, keepdim=True)
    return (ids == best_id).to(torch.int8).argmax(dim=-1)


# "bucket" approximate; "radix" exact on 16-bit logits; "block_shared": one pool for the whole block (SGLang's)
POOL_SELECTS = ("topk", "topk2", "sort", "bucket", "radix", "block_shared")


def bucket_bounds(vocab: int, pool: int, device=None):
    """Bucket p = [starts[p], ends[p]) with starts[p] = p·V // P: P contiguous, non-empty buckets
    (V >= P) whose sizes differ by at most one."""
    p = torch.arange(pool + 1, device=device, dtype=torch.int64)
    edges = p * vocab // pool
    return edges[:-1], edges[1:]


def bucket_candidates(base: torch.Tensor, pool: int):
    """The max of each of `pool` contiguous buckets of base [..., V] -> (vals fp32, ids int64),
    [..., pool], ids ascending; exact ties inside a bucket go to the lowest id. The PyTorch
    definition of the fused `triton_rollout.bucket_max` (same values and ids)."""
    vocab = base.shape[-1]
    starts, ends = bucket_bounds(vocab, pool, base.device)
    width = int((ends - starts).max())
    idx = starts[:, None] + torch.arange(width, device=base.device)  # [P, width]
    inside = idx < ends[:, None]
    tiles = base[..., idx.clamp(max=vocab - 1)].float()  # [..., P, width]
    tiles = tiles.masked_fill(~inside, float("-inf"))
    pos = tiles.argmax(-1, keepdim=True)  # first maximum = lowest id (padding sits after real ids)
    return tiles.gather(-1, pos).squeeze(-1), (starts[:, None] + pos).squeeze(-1)


RADIX_BITS = 12  # bins per radix level (4096); two levels = the key's top 24 bits (triton_rollout.RADIX_BITS)


def radix_key24(base: torch.Tensor) -> torch.Tensor:
    """int32 keys [..., V] whose order is the order of base.float(): the float's bits with the
    negatives' magnitude bits flipped, arithmetic-shifted right by 8 (the top 24 bits). Exact for
    bf16/fp16 values (all their bits survive), fp32 keeps 15 of 23 mantissa bits. -0.0 sorts just
    below +0.0. (NaN is not a logit: unsupported.)"""
    i = base.float().contiguous().view(torch.int32)
    return torch.where(i < 0, i ^ 0x7FFFFFFF, i) >> 8


def _radix_threshold(hist: torch.Tensor, need: torch.Tensor):
    """Per row of hist [R, NB]: the bin where the count from the top first reaches need [R]
    (1 <= need <= total), and the count strictly above that bin."""
    incl = hist.flip(-1).cumsum(-1).flip(-1)  # elements in bins >= i
    i = torch.arange(hist.shape[-1], device=hist.device)
    t = torch.where(incl >= need[:, None], i, -1).amax(-1)
    above = torch.where(i > t[:, None], hist, 0).sum(-1)
    return t, above


def radix_candidates(base: torch.Tensor, pool: int):
    """The top-`pool` of base [..., V] by a two-level radix select -> (vals fp32, ids int64), [..., pool].

    The PyTorch definition of `triton_rollout.radix_select`, computed the same way: a histogram
    of each row's key top 12 bits (4096 bins) gives the boundary bin, a histogram of the next 12
    bits over that bin's elements gives T, the 24-bit key of the pool-th largest value. The pool is
    every element with key > T (fewer than `pool`) in increasing id order, then elements with
    key == T in increasing id order until `pool` slots are filled (always exactly filled: no padding).

    So for bf16/fp16 logits it is an exact top-`pool` (key == value), with ties at the boundary
    value broken by the lowest id, deterministically; recall of the true top-`pool` is 1. For fp32
    logits T is a bin of relative width 2^-15: every element above that bin is in (recall 1
    for them), and within it the lowest ids win, so a value that beats another of the same bin by
    less than 2^-15 relative may be dropped in favour of the lower id.
    """
    vocab = base.shape[-1]
    if not 0 < pool <= vocab:
        raise ValueError(f"radix_candidates: pool {pool} must be in 1..V={vocab}")
    key = radix_key24(base).reshape(-1, vocab)
    rows, nb = key.shape[0], 1 << RADIX_BITS
    ones = torch.ones_like(key)
    bin1 = (key >> RADIX_BITS) + nb // 2
    hist1 = torch.zeros(rows, nb, dtype=key.dtype, device=key.device).scatter_add_(-1, bin1, ones)
    need = torch.full((rows,), pool, dtype=key.dtype, device=key.device)
    t1, above1 = _radix_threshold(hist1, need)
    in_bin = (bin1 == t1[:, None]).to(key.dtype)
    hist2 = torch.zeros_like(hist1).scatter_add_(-1, key & (nb - 1), in_bin)
    t2, _ = _radix_threshold(hist2, need - above1)
    thr = ((t1 - nb // 2) * nb + t2)[:, None]
    rank = torch.where(key > thr, 0, torch.where(key == thr, 1, 2)).to(torch.int8)
    ids = torch.sort(rank, dim=-1, stable=True).indices[:, :pool].reshape(*base.shape[:-1], pool)
    return base.gather(-1, ids).float(), ids


def block_shared_ids(rows: torch.Tensor, pool: int) -> torch.Tensor:
    """SGLang's candidate pool: base rows [B, N, V] of the N corrected slots -> ids [B, pool], the
    top-`pool` of each token's max over those slots, shared by every one of them (sglang
    speculative/dflash_utils.py `domino_greedy_rollout`: topk(feedback_logits.amax(0))). The max is
    exact in any dtype, so the pool is the same set wherever it is computed."""
    return torch.topk(rows.amax(dim=1), pool, dim=-1, sorted=False).indices


def pool_ids(base: torch.Tensor, pool: int, pool_select: str = "topk") -> torch.Tensor:
    """Candidate ids [..., pool] of base [..., V] under `pool_select` (exact methods: a top-k)."""
    if pool_select == "bucket":
        return bucket_candidates(base, pool)[1]
    if pool_select == "radix":
        return radix_candidates(base, pool)[1]
    if pool_select not in POOL_SELECTS or pool_select == "block_shared":  # a block's pool: block_shared_ids
        raise ValueError(f"pool_select {pool_select!r}: valid: {', '.join(s for s in POOL_SELECTS if s != 'block_shared')}")
    return torch.topk(base, pool, dim=-1, sorted=False).indices


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: Optional[int] = 0,
                   top_p: Optional[float] = 1.0) -> torch.Tensor:
    """softmax(filter(logits / T)) along the last dim, in fp32; static shapes (graph-safe).

    This is `domino_graft.sampling.warp`, the one warper every decoding path shares,
    so the fused kernels and the engine can never filter differently.
    """
    from domino_graft.sampling import warp

    return warp(logits, float(temperature), int(top_k or 0), 1.0 if top_p is None else float(top_p))


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Sample one index per row of probs [N, M] from uniforms u [N] in [0, 1).

    Returns the first index whose CDF exceeds u·total. The CDF only rises at entries of
    positive probability, so the result always has q > 0 (the clamp keeps u·total strictly
    under the total, which fp rounding could otherwise reach).

    (On CUDA torch scans a long row one row at a time: a [16, 49152] cumsum takes ~60 us on an H100,
    15 of them a sampled rollout step at B = 16. A two-level search in torch ops, tried at 45d49fd,
    removed that but added ~16 small kernels a slot and was slower at every B
    (bench/results/batched_overhead_h100/); a fused sampling kernel is the way to take it.)
    """
    cdf = probs.cumsum(dim=-1)
    total = cdf[..., -1:]
    target = torch.minimum(u.to(cdf.dtype)[..., None] * total, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, target, right=True)
    return idx.clamp_(max=probs.shape[-1] - 1).squeeze(-1)


def draw_uniforms(batch: int, slots: int, generator: Optional[torch.Generator], device) -> torch.Tensor:
    """The rollout's randomness: one uniform per (row, slot), drawn on the generator's device."""
    gen_device = generator.device if generator is not None else torch.device(device)
    return torch.rand((batch, slots), generator=generator, device=gen_device).to(device)


def is_sampling(temperature: Optional[float]) -> bool:
    return temperature is not None and temperature > 0


@torch.no_grad()
def reference_rollout(head, block, anchor: torch.Tensor, embed: Callable[[torch.Tensor], torch.Tensor], *,
                      temperature: float = 0.0, top_k: Optional[int] = 0, top_p: Optional[float] = 1.0,
                      generator: Optional[torch.Generator] = None, use_head: bool = True, pool_size: int = 0,
                      uniforms: Optional[torch.Tensor] = None, pool_select: str = "topk"):
    """Eager incremental rollout: one `DominoHead.step` per slot. Returns (draft_ids [B,K], q [B,K,V] | None)."""
    hidden, base = block.hidden, block.base_logits
    bsz, k, vocab = base.shape
    use_head = use_head and head is not None  # no head: the base drafter
    sampling = is_sampling(temperature)
    if sampling and uniforms is None:
        uniforms = draw_uniforms(bsz, k, generator, base.device)
    pure = head.spec.pure_prefix_len if use_head else 0
    pool = min(int(pool_size), vocab) if pool_size else 0
    state = head.init_state(bsz, device=base.device) if use_head else None
    shared = (block_shared_ids(base[:, pure:], pool) if pool and use_head and k > pure and pool_select == "block_shared"
              else None)
    x = anchor
    drafts, qs = [], []
    for j in range(1, k + 1):
        base_j = base[:, j - 1]
        if use_head:
            final, state = head.step(state, embed(x), hidden[:, j - 1], base_j)
        else:
            final = base_j
        pooled = pool and use_head and j > pure
        if pooled:
            ids = shared if shared is not None else pool_ids(base_j, pool, pool_select)
            vals = final.gather(-1, ids).float()
        if not sampling:
            if pooled:
                d = ids.gather(-1, argmax_lowest_id(vals, ids)[:, None]).squeeze(-1)
            else:
                d = argmax_lowest_id(final)
        elif pooled:
            p = filtered_probs(vals, temperature, top_k, top_p)
            d = ids.gather(-1, inverse_cdf(p, uniforms[:, j - 1])[:, None]).squeeze(-1)
            qs.append(torch.zeros(bsz, vocab, device=base.device).scatter_(-1, ids, p))
        else:
            p = filtered_probs(final, temperature, top_k, top_p)
            d = inverse_cdf(p, uniforms[:, j - 1])
            qs.append(p)
        drafts.append(d)
        x = d
    draft_ids = torch.stack(drafts, dim=1)
    return draft_ids, (torch.stack(qs, dim=1) if sampling else None)


@torch.no_grad()
def teacher_forced_logits(head, block, anchor: torch.Tensor, embed, draft_ids: torch.Tensor,
                          use_head: bool = True) -> torch.Tensor:
    """final_j for every slot given a fixed draft (x_j = draft_ids[:, j-1]): [B, K, V].

    Lets tests check a rollout's q against the reference on the prefix that rollout drew.
    """
    if not use_head:
        return block.base_logits
    bsz, k, _ = block.base_logits.shape
    state = head.init_state(bsz, device=block.base_logits.device)
    xs = torch.cat([anchor[:, None], draft_ids[:, :-1]], dim=1)
    out = []
    for j in range(1, k + 1):
        final, state = head.step(state, embed(xs[:, j - 1]), block.hidden[:, j - 1], block.base_logits[:, j - 1])
        out.append(final)
    return torch.stack(out, dim=1)


def dense_embed(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda ids: F.embedding(ids, weight)
