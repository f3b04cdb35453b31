"""The CPU proxies' training draw (bench/dflash_slot1_probe.sh, bench/dflash_rank_probe.sh,
bench/dflash_data_probe.sh): 600 code + 200 math responses of a device run's train.regen.jsonl,
seed 0, skipping the first 40 of each kind (math, puzzle code, library code: the probes'
training-distribution evaluation sets, written by --held-out).

    python bench/proxy_train_sample.py WORK/train.regen.jsonl OUT_DIR/train_sub.jsonl [--code puzzle]
    python bench/proxy_train_sample.py WORK/train.regen.jsonl --held-out OUT_DIR

--code all (default) draws the code from puzzle and library responses alike (a run without
puzzles: exactly the draw the earlier probes made); --code puzzle only from puzzles.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from domino_graft.checkpoint import atomic_write_text

HELD_OUT = 40


def kind_of(rec: dict) -> str:
    rid = rec["id"]
    return "math" if rid.startswith("gsm8k-symbolic") else "puzzle" if rid.startswith("puzzle/") else "library"


def by_kind(src: str) -> dict[str, list[tuple[int, dict]]]:
    """(line number, record) per kind, in file order."""
    kinds: dict[str, list[tuple[int, dict]]] = {"math": [], "puzzle": [], "library": []}
    for i, line in enumerate(open(src, encoding="utf-8")):
        rec = json.loads(line)
        kinds[kind_of(rec)].append((i, rec))
    return kinds


def draw(kinds: dict[str, list[tuple[int, dict]]], code_from: str, seed: int = 0) -> list[dict]:
    rest = {k: v[HELD_OUT:] for k, v in kinds.items()}
    # code in file order: without puzzles, exactly the earlier probes' `code[40:]`
    code = [r for _, r in sorted(rest["puzzle"] + ([] if code_from == "puzzle" else rest["library"]),
                                 key=lambda pair: pair[0])]
    math = [r for _, r in rest["math"]]
    if len(code) < 600 or len(math) < 200:
        raise SystemExit(f"--code {code_from}: {len(code)} code and {len(math)} math responses "
                         "past the held-out ones; the draw needs 600 and 200")
    random.seed(seed)  # the module-level generator, as the earlier probes drew
    sub = random.sample(code, 600) + random.sample(math, 200)
    random.shuffle(sub)
    return sub


def write(path: Path, recs: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in recs))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst", nargs="?")
    p.add_argument("--code", choices=("all", "puzzle"), default="all")
    p.add_argument("--held-out", type=Path, default=None, help="write train_{math,puzzle,library}40.jsonl here")
    args = p.parse_args()
    kinds = by_kind(args.src)
    if args.held_out is not None:
        args.held_out.mkdir(parents=True, exist_ok=True)
        for k, v in kinds.items():
            if v:
                write(args.held_out / f"train_{k}{HELD_OUT}.jsonl", [r for _, r in v[:HELD_OUT]])
    if args.dst:
        write(Path(args.dst), draw(kinds, args.code))
