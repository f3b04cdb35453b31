"""bench/proxy_train_sample.py: the CPU proxies' draws never contain their held-out responses, a
file without puzzles gives the draw the earlier probes made, and --code puzzle draws only puzzles."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _records() -> list[dict]:
    math = [{"id": f"gsm8k-symbolic/{i}/0"} for i in range(300)]
    puzzles = [{"id": f"puzzle/algorithms.m/f{i}"} for i in range(700)]
    library = [{"id": f"pysrc/toolz.m/g{i}"} for i in range(700)]
    return math + puzzles + library


def test_draws_skip_held_out_and_keep_the_old_draw(tmp_path):
    sys.path.insert(0, str(REPO / "bench"))
    import proxy_train_sample as pts

    src = tmp_path / "train.regen.jsonl"
    recs = _records()
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    kinds = pts.by_kind(str(src))
    held = {r["id"] for v in kinds.values() for _, r in v[:pts.HELD_OUT]}
    mixed, puzzle = pts.draw(kinds, "all"), pts.draw(kinds, "puzzle")
    for sub in (mixed, puzzle):
        assert len(sub) == 800 and not held & {r["id"] for r in sub}
        assert sum(r["id"].startswith("gsm8k") for r in sub) == 200
    assert sum(r["id"].startswith("puzzle/") for r in puzzle) == 600

    # without puzzles: exactly the earlier probes' draw (code[40:] in file order, seed 0)
    no_puzzles = [r for r in recs if not r["id"].startswith("puzzle/")]
    src.write_text("".join(json.dumps(r) + "\n" for r in no_puzzles))
    math = [r for r in no_puzzles if r["id"].startswith("gsm8k")]
    code = [r for r in no_puzzles if not r["id"].startswith("gsm8k")]
    random.seed(0)
    old = random.sample(code[40:], 600) + random.sample(math[40:], 200)
    random.shuffle(old)
    assert pts.draw(pts.by_kind(str(src)), "all") == old
