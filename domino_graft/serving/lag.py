"""What a served ChainBatch's drafter missed while its verify budget ran the target alone's lean steps, and the
chunks that give it back (serving/batch.py `_catch_up`; docs/serving.md "Measured arms", docs/design.md §5).

A batch committed to plain steps (decoding/budget.py `committed`) runs the target alone's loop: no features
captured, nothing written to the drafter. A static decode stays committed to its end. A served batch under measured
arms (serving/windows.py) goes back to drafting at the next speculative window, and its drafter then reads a
context with a hole where the plain steps went: stale entries at those positions (lossless, since a verify accepts
only the target's tokens, but the drafts are worse). On this CPU (bench/results/drafter_lag_cpu.json: the real SmolLM2
and the shipped drafter, 8 GSM8K prompts through 4 rows, windows of 0.25 s taking turns) a speculative block accepted
1.90 drafts a row where every window speculated and 1.04 where plain windows came between (2.32 with the catch-up):
the speculative arm measured at about half its worth.

So the plain stretch records where each row's hole begins (`begin`: the live rows' positions at its first step; a
prompt admitted during it: its first token's), and the next speculative block first recomputes the hole: target
forwards of K + 1 tokens a row (the full verify's shape, captured at warm start), chunk after chunk, each row's
chunks ending at its anchor. They rewrite the target's cache with its own entries (a row's bits depend on its
positions only, the property every verify's identity with the target alone rests on) and give the drafter the
features of those positions, as a verify's block does. A row whose hole is shorter than the others' recomputes
entries it had; a row near position 0 starts at 0 and writes placeholders at and past its anchor, which no query
of the row reads before a step overwrites them (the verify's own rule for rejected drafts). Rows not catching up
(ended, or pending a chunked prompt) run placeholders at their positions, as in any verify.
"""

from __future__ import annotations

from typing import Iterator, Sequence


class DrafterLag:
    """Per slot: the first position whose features the drafter lacks, while a plain stretch runs."""

    def __init__(self):
        self.behind: dict[int, int] = {}
        self.lagging = False

    def __bool__(self) -> bool:
        return self.lagging

    def begin(self, pos_h: Sequence[int], live: Sequence[bool]) -> None:
        """A lean plain step is about to run: at the stretch's first, each live row's hole begins at its position."""
        if not self.lagging:
            self.behind = {b: p for b, (p, on) in enumerate(zip(pos_h, live)) if on}
            self.lagging = True

    def admitted(self, slots: Sequence[int], firsts: Sequence[int]) -> None:
        """Prompts whose context the drafter just got; during a stretch their holes begin at their first tokens
        (`firsts`: each one's position), before it they have none."""
        for slot, first in zip(slots, firsts):
            if self.lagging:
                self.behind[slot] = first
            else:
                self.behind.pop(slot, None)

    def holes(self, pos_h: Sequence[int], live: Sequence[bool]) -> dict[int, int]:
        """The stretch ends (a speculative block is next): {slot: the hole's first position} of the live rows
        with one."""
        behind, self.behind, self.lagging = self.behind, {}, False
        return {b: f for b, f in behind.items() if live[b] and pos_h[b] > f}


def chunks(holes: dict[int, int], contexts: Sequence[Sequence[int]], pos_h: Sequence[int], anchors: Sequence[int],
           t: int) -> Iterator[tuple[list[int], list[list[int]], list[list[bool]]]]:
    """The forwards that recompute `holes` (module docstring), t tokens a row each: per chunk (each row's first
    position, its t tokens, which of them are the hole's: the positions the chunk is the first to give back).
    contexts[b]: row b's verified tokens (position i is contexts[b][i]); anchors[b]: its token at pos_h[b], the
    placeholder past its context and of the rows not catching up."""
    n = max(pos_h[b] - f for b, f in holes.items())
    for back in range(-(-n // t), 0, -1):  # chunks counted back from each row's anchor
        starts, seqs, owned = [], [], []
        for b, p in enumerate(pos_h):
            first = holes.get(b)
            s = p if first is None else max(0, p - back * t)
            toks = list(contexts[b][s: min(s + t, p)]) if first is not None else []
            seqs.append(toks + [anchors[b]] * (t - len(toks)))
            lo = -1 if first is None else max(first, p - back * t)  # this chunk's own part of the hole
            owned.append([first is not None and lo <= s + i < p - (back - 1) * t for i in range(t)])
            starts.append(s)
        yield starts, seqs, owned
