"""The verify budget's cost table: milliseconds of the target's forward by (batch size, tokens per row),
of the drafter's propose and of the head's rollout per slot, given (`--verify-costs`) or measured on CUDA
(docs/design.md §5, "Verify budget"; the policy that reads it: decoding/budget.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


def _segment(x: float, keys) -> tuple:
    """The measured points `_interp` reads for x: (x,) where measured, the only one, or the segment around x
    (an end segment outside them)."""
    if x in keys:
        return (x,)
    xs = sorted(keys)
    if len(xs) == 1:
        return (xs[0],)
    return (xs[0], xs[1]) if x < xs[0] else (xs[-2], xs[-1]) if x > xs[-1] else next(
        (a, b) for a, b in zip(xs, xs[1:]) if a < x < b)


def _interp(x: float, points: dict[int, float]) -> float:
    """Piecewise linear through the measured points, extended along the end segments (never below 0)."""
    seg = _segment(x, points)
    if len(seg) == 1:
        return points[seg[0]]
    lo, hi = seg
    y = points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)
    return max(y, 0.0)


def _positive_ms(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"{where}: {v!r} is not a time; valid: milliseconds > 0")
    return float(v)


def _count(v, where: str, what: str) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = None
    if n is None or isinstance(v, bool) or str(n) != str(v).strip() or n < 1:
        raise ValueError(f"{where}: key {v!r} is not a {what}; valid: integers >= 1")
    return n


@dataclass
class VerifyCosts:
    """Milliseconds of the target's forward by (batch size B, tokens per row T), of the drafter's
    propose by B and of the head's rollout per slot by B (measured on CUDA; a given table may hold the
    whole block's cost in propose_ms and no rollout_ms). A (B, T) not in the table is interpolated linearly (B, then T)."""

    step_ms: dict[int, dict[int, float]] = field(default_factory=dict)  # B -> T -> ms
    propose_ms: dict[int, float] = field(default_factory=dict)  # B -> ms (the drafter's forward)
    rollout_ms: dict[int, float] = field(default_factory=dict)  # B -> ms per slot rolled out (measured on CUDA)
    source: str = "table"  # "table" (given) | "measured" (on CUDA, by the engine) | "table+measured"

    @classmethod
    def from_dict(cls, data, where: str = "verify costs") -> "VerifyCosts":
        """{"step_ms": {B: {T: ms}}, "propose_ms": {B: ms}} (JSON keys as strings), or one shape's
        rows of bench/results/engine_batch_h200.json: {"by_batch": [{"B", "T", "default_ms" (or
        "ms"), "propose_ms"?}, ...]}."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a {type(data).__name__}; valid: an object with step_ms and propose_ms, "
                             "or by_batch rows")
        if "by_batch" in data:
            return cls._from_rows(data["by_batch"], f"{where}: by_batch")
        unknown = sorted(set(data) - {"step_ms", "propose_ms", "rollout_ms", "source"})
        if unknown or "step_ms" not in data:
            what = f"unknown key {unknown[0]!r}" if unknown else "no step_ms"
            raise ValueError(f"{where}: {what}; valid keys: step_ms ({{B: {{T: ms}}}}), propose_ms ({{B: ms}}), "
                             "rollout_ms ({B: ms per slot}), source, or by_batch (rows)")
        step = data["step_ms"]
        if not isinstance(step, dict) or not step:
            raise ValueError(f"{where}: step_ms is {step!r}; valid: {{B: {{T: ms}}}}, e.g. {{\"8\": {{\"1\": 4.8, "
                             "\"16\": 16.5}}")
        costs = cls(source=str(data.get("source") or "table"))
        for b, row in step.items():
            nb = _count(b, f"{where}: step_ms", "batch size")
            if not isinstance(row, dict) or not row:
                raise ValueError(f"{where}: step_ms[{b!r}] is {row!r}; valid: {{T: ms}}, e.g. {{\"1\": 4.8}}")
            costs.step_ms[nb] = {_count(t, f"{where}: step_ms[{b!r}]", "verify length T"):
                                 _positive_ms(ms, f"{where}: step_ms[{b!r}][{t!r}]") for t, ms in row.items()}
        prop = data.get("propose_ms", {})
        if not isinstance(prop, dict):
            raise ValueError(f"{where}: propose_ms is {prop!r}; valid: {{B: ms}}")
        costs.propose_ms = {_count(b, f"{where}: propose_ms", "batch size"):
                            _positive_ms(ms, f"{where}: propose_ms[{b!r}]") for b, ms in prop.items()}
        roll = data.get("rollout_ms", {})
        if not isinstance(roll, dict):
            raise ValueError(f"{where}: rollout_ms is {roll!r}; valid: {{B: ms per slot}}")
        costs.rollout_ms = {_count(b, f"{where}: rollout_ms", "batch size"):
                            _positive_ms(ms, f"{where}: rollout_ms[{b!r}]") for b, ms in roll.items()}
        return costs

    @classmethod
    def _from_rows(cls, rows, where: str) -> "VerifyCosts":
        if not isinstance(rows, list) or not rows:
            raise ValueError(f"{where}: {rows!r}; valid: a list of {{\"B\", \"T\", \"default_ms\"}} rows")
        costs = cls()
        for n, r in enumerate(rows):
            at = f"{where}[{n}]"
            ms_key = "default_ms" if isinstance(r, dict) and "default_ms" in r else "ms"
            if not isinstance(r, dict) or not {"B", "T", ms_key} <= set(r):
                raise ValueError(f"{at}: {r!r}; valid: an object with B, T and default_ms (or ms)")
            b, t = _count(r["B"], f"{at}.B", "batch size"), _count(r["T"], f"{at}.T", "verify length")
            costs.step_ms.setdefault(b, {})[t] = _positive_ms(r[ms_key], f"{at}.{ms_key}")
            if r.get("propose_ms") is not None:
                costs.propose_ms[b] = _positive_ms(r["propose_ms"], f"{at}.propose_ms")
        return costs

    @classmethod
    def load(cls, path) -> "VerifyCosts":
        p = Path(path)
        where = f"--verify-costs {str(p)!r}"
        if not p.is_file():
            raise FileNotFoundError(f"{where}: no such file; valid: a JSON file of measured costs")
        try:
            data = json.loads(p.read_text())
        except ValueError as e:
            raise ValueError(f"{where}: not valid JSON ({e})") from None
        return cls.from_dict(data, where)

    def has(self, b: int, t: int) -> bool:
        return t in self.step_ms.get(b, {})

    def step(self, b: int, t: int) -> float:
        """ms of the target's forward of t tokens per row at batch b."""
        if not self.step_ms:
            raise ValueError("verify costs: the table is empty; valid: step_ms by batch size and verify length")
        # (only the batch sizes the interpolation in B reads: the budget asks this every step)
        by_b = {nb: _interp(t, self.step_ms[nb]) for nb in _segment(b, self.step_ms)}
        return _interp(b, by_b)

    def propose(self, b: int) -> Optional[float]:
        return _interp(b, self.propose_ms) if self.propose_ms else None

    def rollout(self, b: int) -> float:
        """ms per slot the head rolls out at batch b (0 where none was measured: a given table's propose
        then holds the whole block's)."""
        return _interp(b, self.rollout_ms) if self.rollout_ms else 0.0

    def to_dict(self) -> dict:
        return {"step_ms": {str(b): {str(t): ms for t, ms in sorted(row.items())}
                            for b, row in sorted(self.step_ms.items())},
                "propose_ms": {str(b): ms for b, ms in sorted(self.propose_ms.items())},
                **({"rollout_ms": {str(b): ms for b, ms in sorted(self.rollout_ms.items())}} if self.rollout_ms else {}),
                "source": self.source}
