"""Static-tree speculative decoding with Domino-corrected branches (`adapter.topology == "tree"`).

A tree is given in "choices" notation (the static trees of drafters with one LM head per
slot): each path lists, per depth, the rank of the chosen token among its parent's top-k, e.g. [[0], [1], [0, 0], [0, 1]] (node [0, 1] =
the 2nd-best child of the best depth-1 token). Node n at depth d is a proposal for slot d.

Why each node carries its own GRU state: the Domino correction of slot d depends on the
tokens drafted before it, which differ from branch to branch. So a node's children are the
top-k of *its own* corrected logits, computed from its own state

    S(child) = GRU(S(node), E(token(node))),  final = L_base_d + W2·SiLU(W1·[H_d; S(child)])

and one batched head step per depth serves every parent at that depth: the cost grows
with the depth, not with the number of nodes (docs/design.md §5).

Verification: one target forward over [x_0, every node] at positions pos + depth, with a
4D mask (a node sees the verified context, x_0 and its own ancestors). Greedy acceptance
walks from x_0 down the child whose token is the target's argmax at its parent; the bonus
token is the target's argmax at the last accepted node, so the output is exactly what
target-only greedy decoding emits. The target cache then keeps x_0 and the accepted path
(gathered into place), the drafter observes them, and the next step starts from the bonus.

Greedy only: speculative *sampling* over a tree needs a multi-candidate acceptance rule
(e.g. recursive rejection sampling) to stay lossless; "typical acceptance" heuristics are not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import torch

from ..sampling import Sampling
from .common import DecodeResult, OnTokens, Output, check_prompt, positions, stop_set

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


@dataclass(frozen=True)
class TreeSpec:
    paths: tuple[tuple[int, ...], ...]  # node n's choices path; BFS order (by depth, then path)
    parent: tuple[int, ...]  # ROOT for depth-1 nodes
    depth: tuple[int, ...]  # 1-based: node n proposes slot depth[n]
    levels: tuple[DepthPlan, ...] = field(repr=False)

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
            ))
        return cls(tuple(paths), parent, depth, tuple(levels))

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


def draft_tree(head, block, anchor: torch.Tensor, embed, spec: TreeSpec, *, use_head: bool = True) -> torch.Tensor:
    """Node tokens [N] for one block (batch 1): node n = rank-th token of its parent's
    Domino-corrected slot-d logits (plain base logits with use_head=False)."""
    hidden, base = block.hidden[0], block.base_logits[0]  # [K, H], [K, V]
    if spec.max_depth > base.shape[0]:
        raise ValueError(f"tree: depth {spec.max_depth} exceeds the drafter's {base.shape[0]} slots")
    dev = base.device
    tokens = torch.empty(spec.num_nodes, dtype=torch.long, device=dev)
    states = None
    if use_head:
        from ..head import HeadState

        root = head.init_state(1, device=dev).gru  # S_0
        states = root.new_empty(spec.num_nodes, root.shape[1])  # each node's S (its logits' state)
    for d, lvl in enumerate(spec.levels, start=1):
        parents, row = lvl.parents.to(dev), lvl.row.to(dev)
        p = parents.numel()
        is_root = parents == ROOT
        safe = parents.clamp(min=0)
        ptok = torch.where(is_root, anchor.expand(p), tokens[safe])
        if use_head:
            pstate = torch.where(is_root[:, None], root.expand(p, -1), states[safe])
            final, new = head.step(HeadState(gru=pstate, steps=d - 1), embed(ptok), hidden[d - 1].expand(p, -1),
                                   base[d - 1].expand(p, -1))
            states[lvl.nodes.to(dev)] = new.gru[row]
        else:
            final = base[d - 1].expand(p, -1)
        top = final.topk(lvl.kmax, dim=-1).indices  # [P, kmax]
        tokens[lvl.nodes.to(dev)] = top[row, lvl.rank.to(dev)]
    return tokens


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
    """Greedy tree speculative decoding with `engine`'s target, adapter and head; output is
    token-for-token `engine.target_only`'s. `tree`: choices (default: the adapter's)."""
    sampling = sampling or Sampling()
    if not sampling.greedy:
        raise ValueError(
            f"--temperature: {sampling.temperature} with a tree drafter; valid: 0 (tree verification here is greedy). "
            "For sampling, decode as a chain (remove drafter.tree)"
        )
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
    capture = adapter.capture_layers()
    out = Output(max_new_tokens, stop_set(engine.stop_ids, stop_ids), on_tokens)
    reached, accepted_slot, accepted = [0] * k, [0] * k, []
    visible = spec.visible().to(dev)
    depth = torch.tensor((0,) + spec.depth, device=dev)
    parent = spec.parent
    dtype = target.dtype

    t0 = time.perf_counter()
    with torch.inference_mode():
        from transformers import DynamicCache

        cache = DynamicCache(config=target.model.config)  # full-attention layers only (_keep_positions)
        adapter.reset(1)
        n = ids.shape[1]
        logits, feats = target(ids, cache=cache, position_ids=positions(0, n, dev)[None], capture=capture,
                               logits_to_keep=1)
        forwards = 1
        adapter.observe(feats, positions(0, n, dev), ids=ids)
        anchor = logits[:, -1].argmax(-1)
        pos = n
        done = out.push([int(anchor)])
        while not done:
            block = adapter.propose(anchor, pos)
            nodes = draft_tree(head, block, anchor, adapter.embed, spec, use_head=use_head)
            seq = torch.cat([anchor, nodes])[None]
            mask = torch.zeros(1, 1, 1 + spec.num_nodes, pos + 1 + spec.num_nodes, dtype=dtype, device=dev)
            mask[..., pos:] = mask[..., pos:].masked_fill(~visible, torch.finfo(dtype).min)
            logits, feats = target(seq, cache=cache, position_ids=(pos + depth)[None], attention_mask=mask,
                                   capture=capture)
            forwards += 1
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
            a = len(path)
            accepted.append(a)
            for j in range(min(a + 1, k)):
                reached[j] += 1
                accepted_slot[j] += j < a
            done = out.push([toks[i] for i in path] + [best[cur]])
            if done:
                break
            rows = torch.tensor([0] + [1 + i for i in path], device=dev)
            _keep_positions(cache, torch.cat([torch.arange(pos, device=dev), pos + rows]))
            adapter.observe(None if feats is None else feats[:, rows], positions(pos, a + 1, dev), ids=seq[:, rows])
            anchor = torch.tensor([best[cur]], device=dev)
            pos += a + 1
    return DecodeResult(out.tokens, n, out.stop_reason, time.perf_counter() - t0, forwards, accepted, reached,
                        accepted_slot)
