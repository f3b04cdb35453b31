"""Static-tree speculative decoding with Domino-corrected branches (`adapter.topology == "tree"`).

A tree is given in "choices" notation (the static trees of drafters with one LM head per
slot): each path lists, per depth, the rank of the chosen token among its parent's top-k, e.g. [[0], [1], [0, 0], [0, 1]] (node [0, 1] =
the 2nd-best child of the best depth-1 token). Node n at depth d is a proposal for slot d.

Why each node carries its own GRU state: the Domino correction of slot d depends on the
tokens drafted before it, which differ from branch to branch. So a node's children come
from *its own* corrected logits, computed from its own state

    S(child) = GRU(S(node), E(token(node))),  final = L_base_d + W2·SiLU(W1·[H_d; S(child)])

and one batched head step per depth serves every parent at that depth: the cost grows
with the depth, not with the number of nodes (docs/design.md §5).

Verification: one target forward over [x_0, every node] at positions pos + depth, with a
4D mask (a node sees the verified context, x_0 and its own ancestors). The target cache then
keeps x_0 and the accepted path (gathered into place), the drafter observes them, and the
next step starts from the emitted token after the path.

The target's cache is a one-row `session.DynamicSession`, but only its prefill goes through
the session contract: the contract's step is causal over each row's T tokens and its keep a
prefix of them, while a tree verify needs the ancestor mask and keeps a path that is no prefix
(a gather). Widening the contract by a mask and a gather would serve this one decoder, and the
static cache could not honour them without its own tree-masked graphs and a K/V gather; so the
tree steps and keeps on `session.cache` itself, and runs on the dynamic cache only.

Greedy: node n is the rank-th token of its parent's corrected logits; acceptance walks from
x_0 down the child whose token is the target's argmax at its parent, then emits the target's
argmax at the last accepted node, exactly what target-only greedy decoding emits.

Temperature > 0 (docs/design.md §5, tree sampling): a parent's m children are m draws *without
replacement* from q, its warped corrected distribution, in rank order (rank = draw order;
top-k would make the children no sample of q at all). Verification is recursive rejection
sampling without replacement: try the children in order, accept child c with probability
min(1, p(c)/q(c)); on a rejection p <- norm(max(p - q, 0)) and c leaves q (q <- norm(q with
q(c) = 0), the law of the next sibling's draw); after the last child, draw from p. Each
accepted child restarts the walk with the target's distribution at it. The emitted tokens
are then distributed exactly as target-only sampling.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import torch

from ..sampling import Sampling, pick, sample, warp
from .common import DecodeResult, OnTokens, Output, check_prompt, positions, stop_set
from .session import DynamicSession

ROOT = -1


@dataclass(frozen=True)
class DepthPlan:
    """One depth's expansion: which nodes, their parents (ROOT or a node index), and where
    in the batched head step each parent sits."""

    nodes: torch.Tensor  # [n_d] node indices
    parents: torch.Tensor  # [P] distinct parents (ROOT = -1), one head step row each
    row: torch.Tensor  # [n_d] each node's parent row in `parents`
    rank: torch.Tensor  # [n_d] rank among its parent's top-k
    kmax: int  # largest rank + 1
    sib: torch.Tensor  # [n_d] place among its siblings by rank: its draw at T > 0
    width: int  # most children of one parent at this depth (draws per parent at T > 0)


@dataclass(frozen=True)
class TreeSpec:
    paths: tuple[tuple[int, ...], ...]  # node n's choices path; BFS order (by depth, then path)
    parent: tuple[int, ...]  # ROOT for depth-1 nodes
    depth: tuple[int, ...]  # 1-based: node n proposes slot depth[n]
    levels: tuple[DepthPlan, ...] = field(repr=False)
    # [1+N, W] over [x_0, nodes]: each row's children in rank order, -1 padded
    kids: torch.Tensor = field(repr=False, compare=False, default=None)
    walk_steps: int = 0  # the most iterations the sampling walk can take (verify_tree_sampling)

    @classmethod
    def from_choices(cls, choices: Sequence[Sequence[int]]) -> "TreeSpec":
        paths = sorted({tuple(int(r) for r in p) for p in choices}, key=lambda p: (len(p), p))
        index = {p: i for i, p in enumerate(paths)}
        problems = [f"{list(p)} has no parent {list(p[:-1])}" for p in paths if len(p) > 1 and p[:-1] not in index]
        problems += [f"{list(p)} is empty or has a negative rank" for p in paths if not p or min(p) < 0]
        if problems:
            raise ValueError("tree: " + "; ".join(problems))
        parent = tuple(index[p[:-1]] if len(p) > 1 else ROOT for p in paths)
        depth = tuple(len(p) for p in paths)
        children: list[list[int]] = [[] for _ in range(1 + len(paths))]  # rows [x_0, nodes]; BFS = rank order
        for n, par in enumerate(parent):
            children[0 if par == ROOT else 1 + par].append(n)
        sib = [children[0 if par == ROOT else 1 + par].index(n) for n, par in enumerate(parent)]
        levels = []
        for d in range(1, max(depth) + 1):
            nodes = [n for n in range(len(paths)) if depth[n] == d]
            parents = sorted({parent[n] for n in nodes})
            levels.append(DepthPlan(
                nodes=torch.tensor(nodes),
                parents=torch.tensor(parents),
                row=torch.tensor([parents.index(parent[n]) for n in nodes]),
                rank=torch.tensor([paths[n][-1] for n in nodes]),
                kmax=max(paths[n][-1] for n in nodes) + 1,
                sib=torch.tensor([sib[n] for n in nodes]),
                width=max(sib[n] for n in nodes) + 1,
            ))
        width = max(map(len, children))
        kids = torch.tensor([c + [-1] * (width - len(c)) for c in children])
        # the walk spends one iteration per child it tries and one to end: at row r at most
        # len(children[r]) tries, then either the end or the walk below the child it accepted
        steps = [1] * (1 + len(paths))
        for r in reversed(range(1 + len(paths))):  # children come after their parent in BFS order
            if children[r]:
                steps[r] = len(children[r]) + max(steps[1 + c] for c in children[r])
        return cls(tuple(paths), parent, depth, tuple(levels), kids, steps[0])

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return len(self.levels)

    def visible(self) -> torch.Tensor:
        """[1+N, 1+N] bool over [x_0, nodes]: row i may attend to column j (ancestor or self)."""
        n = self.num_nodes
        out = torch.zeros(1 + n, 1 + n, dtype=torch.bool)
        out[:, 0] = True
        for i in range(n):
            j = i
            while j != ROOT:
                out[1 + i, 1 + j] = True
                j = self.parent[j]
        return out

    def children(self) -> list[dict[int, int]]:
        """[1+N] maps token -> child node for x_0 (entry 0) and each node (filled at decode time)."""
        return [dict() for _ in range(1 + self.num_nodes)]


@dataclass
class TreeDraft:
    """One block's tree for B rows. At T > 0 also what verification divides by: q[:, r] is the
    distribution row r's children (r = 0: x_0, r = 1 + n: node n) were drawn from, without
    replacement in `kids` order; `drawn` is False for a child its parent's q had no mass left
    for (top-k / top-p support smaller than the number of children): it is never accepted."""

    tokens: torch.Tensor  # [B, N]
    q: Optional[torch.Tensor] = None  # [B, 1+N, V] fp32 (rows of leaves stay 0)
    drawn: Optional[torch.Tensor] = None  # [B, N] bool


def grow_tree(head, block, anchor: torch.Tensor, embed, spec: TreeSpec, *, use_head: bool = True,
              sampling: Optional[Sampling] = None, generator: Optional[torch.Generator] = None) -> TreeDraft:
    """The tree's nodes for B blocks (block [B, K, ...], anchor [B]), depth by depth, from each
    parent's Domino-corrected slot-d logits (plain base logits with use_head=False): greedy
    (sampling None or T = 0) the rank-th token; at T > 0 draws without replacement from the
    warped distribution q, which the draft carries for verification."""
    hidden, base = block.hidden, block.base_logits  # [B, K, H], [B, K, V]
    b, k, v = base.shape
    if spec.max_depth > k:
        raise ValueError(f"tree: depth {spec.max_depth} exceeds the drafter's {k} slots")
    dev = base.device
    sampled = sampling is not None and not sampling.greedy
    n = spec.num_nodes
    tokens = torch.zeros(b, n, dtype=torch.long, device=dev)
    q = torch.zeros(b, 1 + n, v, dtype=torch.float32, device=dev) if sampled else None
    drawn = torch.ones(b, n, dtype=torch.bool, device=dev) if sampled else None
    if use_head:
        from ..head import HeadState

        root = head.init_state(b, device=dev).gru  # S_0 [B, G]
        states = root.new_empty(b, n, root.shape[1])  # each node's S (its logits' state)
    for d, lvl in enumerate(spec.levels, start=1):
        parents, row, nodes = lvl.parents.to(dev), lvl.row.to(dev), lvl.nodes.to(dev)
        p = parents.numel()
        is_root = parents == ROOT
        safe = parents.clamp(min=0)
        base_d = base[:, d - 1, None].expand(b, p, v)
        if use_head:
            ptok = torch.where(is_root, anchor[:, None], tokens[:, safe])  # [B, P]
            pstate = torch.where(is_root[:, None], root[:, None], states[:, safe])  # [B, P, G]
            final, new = head.step(HeadState(gru=pstate.reshape(b * p, -1), steps=d - 1),
                                   embed(ptok).reshape(b * p, -1),
                                   hidden[:, d - 1, None].expand(b, p, -1).reshape(b * p, -1),
                                   base_d.reshape(b * p, v))
            final = final.view(b, p, v)
            states[:, nodes] = new.gru.view(b, p, -1)[:, row]
        else:
            final = base_d
        if not sampled:
            top = final.topk(lvl.kmax, dim=-1).indices  # [B, P, kmax]
            tokens[:, nodes] = top[:, row, lvl.rank.to(dev)]
            continue
        qd = warp(final, sampling.temperature, sampling.top_k, sampling.top_p)  # [B, P, V]
        # `width` draws without replacement in draw order: the largest q/E, E ~ Exp(1) (the
        # exponential race; torch.multinomial's own method, which refuses a support < width)
        race = torch.empty_like(qd).exponential_(generator=generator).clamp_min(torch.finfo(qd.dtype).tiny)
        order = (qd / race).topk(lvl.width, dim=-1).indices  # [B, P, width]
        got = order[:, row, lvl.sib.to(dev)]  # [B, n_d]
        tokens[:, nodes] = got
        drawn[:, nodes] = qd[:, row].gather(-1, got[..., None])[..., 0] > 0
        q[:, torch.where(is_root, 0, 1 + safe)] = qd
    return TreeDraft(tokens, q, drawn)


def draft_tree(head, block, anchor: torch.Tensor, embed, spec: TreeSpec, *, use_head: bool = True) -> torch.Tensor:
    """Greedy node tokens [N] for one block (batch 1): node n = rank-th token of its parent's
    Domino-corrected slot-d logits (plain base logits with use_head=False)."""
    return grow_tree(head, block, anchor, embed, spec, use_head=use_head).tokens[0]


def verify_tree_sampling(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, drawn: torch.Tensor, spec: TreeSpec,
                         generator: Optional[torch.Generator]):
    """Recursive rejection sampling over a tree drawn without replacement (module docstring;
    docs/design.md §5, tree sampling), batched over B rows with no host sync.

    p [B, 1+N, V]: the target's warped distributions at [x_0, nodes] (row r predicts the token
    after r); q, tokens, drawn: a TreeDraft's (q must be what the children were drawn from).
    -> (n_acc [B], path [B, D] accepted nodes by depth, -1 past n_acc, next [B]): the walk
    emits the path's tokens, then `next`."""
    b, rows, _ = p.shape
    dev = p.device
    kids = spec.kids.to(dev)
    width = kids.shape[1]
    depth0 = torch.tensor(spec.depth, device=dev) - 1
    r = torch.arange(b, device=dev)
    cur = torch.zeros(b, dtype=torch.long, device=dev)  # the walk's row in [x_0, nodes]
    j = torch.zeros_like(cur)  # the next of cur's children to try
    live = torch.ones(b, dtype=torch.bool, device=dev)
    res, qc = p[:, 0], q[:, 0]  # the target's residual at cur, the law of cur's next child
    final = res
    n_acc = torch.zeros_like(cur)
    path = torch.full((b, spec.max_depth), -1, dtype=torch.long, device=dev)
    u = torch.rand(b, rows - 1, device=dev, generator=generator, dtype=p.dtype)  # one per node: tried once at most
    tiny = torch.finfo(p.dtype).tiny
    for _ in range(spec.walk_steps):  # a fixed count: rows that ended idle
        c = torch.where(j < width, kids[cur, j.clamp(max=width - 1)], -1)
        end = live & (c < 0)  # every child tried, or a leaf
        final = torch.where(end[:, None], res, final)
        live &= ~end
        c = c.clamp(min=0)
        tok = tokens[r, c]
        tried = live & drawn[r, c]
        qt, pt = qc.gather(1, tok[:, None])[:, 0], res.gather(1, tok[:, None])[:, 0]
        acc = tried & (u[r, c] * qt < pt)  # u < p/q, multiplied out: q(tok) > 0 for a drawn child
        rej = tried & ~acc
        path[r, depth0[c]] = torch.where(acc, c, path[r, depth0[c]])
        n_acc += acc.long()
        # rejected: the residual; mass 0 means p <= q everywhere, i.e. p == q, where rejection
        # has probability 0 (as in the chain verifier, p is the fallback)
        resid = (res - qc).clamp_min(0)
        mass = resid.sum(-1, keepdim=True)
        resid = torch.where(mass > 0, resid / mass.clamp_min(tiny), res)
        # ... and the next sibling was drawn without this one
        rest = qc.scatter(1, tok[:, None], 0.0)
        rest = rest / rest.sum(-1, keepdim=True).clamp_min(tiny)
        res = torch.where(acc[:, None], p[r, 1 + c], torch.where(rej[:, None], resid, res))
        qc = torch.where(acc[:, None], q[r, 1 + c], torch.where(rej[:, None], rest, qc))
        cur = torch.where(acc, 1 + c, cur)
        j = torch.where(acc, 0, j + live.long())  # an undrawn child is skipped: nothing changes
    return n_acc, path, sample(final, generator)


def _keep_positions(cache, keep: torch.Tensor) -> None:
    """Keep cache positions `keep` (in order) in every layer: the accepted path moves into place."""
    for layer in getattr(cache, "layers", ()):
        if type(layer).__name__ != "DynamicLayer":
            raise ValueError(
                f"tree decoding: cache layer {type(layer).__name__} cannot be reordered (sliding-window targets, "
                "e.g. Gemma3); valid: full-attention targets, or chain decoding (remove drafter.tree)"
            )
        layer.keys = layer.keys.index_select(-2, keep)
        layer.values = layer.values.index_select(-2, keep)


def tree_speculative(engine, prompt_ids, *, max_new_tokens: int, sampling: Optional[Sampling] = None,
                     stop_ids: Iterable[int] = (), use_head: bool = True, on_tokens: OnTokens = None,
                     seed_offset: int = 0, tree=None) -> DecodeResult:
    """Tree speculative decoding with `engine`'s target, adapter and head; output identical
    (greedy) or identically distributed (T > 0) to `engine.target_only`'s. `tree`: choices
    (default: the adapter's)."""
    sampling = sampling or Sampling()
    target, adapter, head = engine.target, engine.adapter, engine.head
    if use_head and head is None:
        raise ValueError("use_head=True but no Domino head is loaded")
    choices = tree if tree is not None else getattr(adapter, "tree", None)
    if not choices:
        raise ValueError("tree decoding: no tree given and the drafter has none (drafter.tree)")
    spec = TreeSpec.from_choices(choices)
    k = adapter.num_slots  # per-slot statistics keep the chain engine's shape (depth <= K)
    ids = check_prompt(target, prompt_ids, max_new_tokens)
    dev = ids.device
    gen = sampling.generator(dev, seed_offset)
    capture = adapter.capture_layers()
    out = Output(max_new_tokens, stop_set(engine.stop_ids, stop_ids), on_tokens)
    reached, accepted_slot, accepted = [0] * k, [0] * k, []
    visible = spec.visible().to(dev)
    depth = torch.tensor((0,) + spec.depth, device=dev)
    parent = spec.parent
    dtype = target.dtype

    t0 = time.perf_counter()
    with torch.inference_mode():
        session = DynamicSession(target, rollback=False)  # full-attention layers only (_keep_positions)
        cache = session.cache
        adapter.reset(1)
        n = ids.shape[1]
        logits, feats, _, _ = session.prefill([ids[0]], capture)
        forwards = 1
        adapter.observe(feats, positions(0, n, dev), ids=ids)
        anchor = pick(logits, sampling, gen)  # [1]
        pos = n
        done = out.push([int(anchor)])
        while not done:
            block = adapter.propose(anchor, pos)
            draft = grow_tree(head, block, anchor, adapter.embed, spec, use_head=use_head, sampling=sampling,
                              generator=gen)
            nodes = draft.tokens[0]
            seq = torch.cat([anchor, nodes])[None]
            mask = torch.zeros(1, 1, 1 + spec.num_nodes, pos + 1 + spec.num_nodes, dtype=dtype, device=dev)
            mask[..., pos:] = mask[..., pos:].masked_fill(~visible, torch.finfo(dtype).min)
            logits, feats = target(seq, cache=cache, position_ids=(pos + depth)[None], attention_mask=mask,
                                   capture=capture)
            forwards += 1
            if sampling.greedy:
                best = logits[0].argmax(-1).tolist()  # one device->host sync per step
                toks = nodes.tolist()
                children = spec.children()
                for i in range(spec.num_nodes):
                    children[1 + parent[i] if parent[i] != ROOT else 0].setdefault(toks[i], i)
                path, cur = [], 0  # cur: row in [x_0, nodes]
                while best[cur] in children[cur]:
                    node = children[cur][best[cur]]
                    path.append(node)
                    cur = 1 + node
                nxt = best[cur]
            else:
                p = warp(logits, sampling.temperature, sampling.top_k, sampling.top_p)
                n_acc, walk, last = verify_tree_sampling(p, draft.q, draft.tokens, draft.drawn, spec, gen)
                host = torch.cat([n_acc, last, walk[0], nodes]).tolist()  # one device->host sync per step
                nxt, path, toks = host[1], host[2: 2 + host[0]], host[2 + spec.max_depth:]
            a = len(path)
            accepted.append(a)
            for j in range(min(a + 1, k)):
                reached[j] += 1
                accepted_slot[j] += j < a
            done = out.push([toks[i] for i in path] + [nxt])
            if done:
                break
            rows = torch.tensor([0] + [1 + i for i in path], device=dev)
            _keep_positions(cache, torch.cat([torch.arange(pos, device=dev), pos + rows]))
            adapter.observe(None if feats is None else feats[:, rows], positions(pos, a + 1, dev), ids=seq[:, rows])
            anchor = torch.tensor([nxt], device=dev)
            pos += a + 1
    return DecodeResult(out.tokens, n, out.stop_reason, time.perf_counter() - t0, forwards, accepted, reached,
                        accepted_slot)
