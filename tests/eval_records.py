"""Synthetic eval records in the layout bench/smollm2_pipeline.py writes (WORK/eval/*.jsonl), for the
tests of the scripts that read them back."""

from __future__ import annotations

import json
from pathlib import Path


def write_eval_records(folder: Path, kind: str, rows: list[tuple]) -> Path:
    """rows: (set, idx, mode, accepted tokens, target forwards[, identical]) -> folder/eval/{kind}_0of1.jsonl"""
    (folder / "eval").mkdir(parents=True)
    lines = [json.dumps({"kind": kind, "set": s, "idx": i, "mode": m, "step_tokens": t, "decode_steps": n,
                         **({"identical": rest[0]} if rest else {})})
             for s, i, m, t, n, *rest in rows]
    (folder / "eval" / f"{kind}_0of1.jsonl").write_text("\n".join(lines) + "\n")
    return folder
