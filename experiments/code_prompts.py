"""Code prompts derived from real Python source: the standard library of the running Python,
plus (when given) the pinned libraries of the `python-functions` asset.

HumanEval's prompts are bare function stubs: a signature and a docstring, sent as the user
message. Most prompts here have that shape; a quarter are phrased as instructions instead, for
variety. They come from public functions and methods (`self` dropped); a function named like a
HumanEval entry point is left out (`exclude_names`), so the training data never contains an
evaluation problem.
"""

from __future__ import annotations

import json
import random
import sysconfig
import textwrap
from pathlib import Path

from domino_graft.pysource import functions, skipped_path


def _stub(sig: str, doc: str) -> str:
    body = textwrap.indent(doc, "    ").lstrip()
    return f"{sig}\n    \"\"\" {body}\n    \"\"\"\n"


def stdlib_functions() -> list[tuple[str, str, str]]:
    """(source id, signature, docstring) of the running Python's standard library."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if skipped_path(rel.parts):
            continue
        try:
            source = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        module = ".".join(rel.with_suffix("").parts)
        found += [(f"stdlib/{module}", sig, doc) for sig, doc in functions(source)]
    return found


def package_functions(path: Path, prefix: str = "pysrc") -> list[tuple[str, str, str]]:
    """The same triples from a functions.jsonl (`python-functions`, `python-puzzles` assets)."""
    with open(path, encoding="utf-8") as fh:
        return [(f"{prefix}/{r['module']}", r["signature"], r["doc"]) for r in map(json.loads, fh)]


def _prompts(found: list[tuple[str, str, str]], count: int, rng: random.Random,
             exclude_names: frozenset[str]) -> list[tuple[str, dict]]:
    """The first `count` usable functions of `found` as (signature, prompt record)."""
    out, seen, ids = [], set(), set()
    for source, sig, doc in found:
        if len(out) >= count:
            break
        name = sig.split("(")[0][4:]
        if sig in seen or name in exclude_names:  # the same method on sibling classes; an eval problem's name
            continue
        seen.add(sig)
        if rng.random() < 0.25:
            text = f"Write a Python function with this signature:\n\n{sig}\n\nIt should do the following:\n{doc}"
        else:
            text = _stub(sig, doc)
        rid = f"{source}/{name}"
        if rid in ids:  # same name, other signature (methods of two classes): ids must be unique
            rid = f"{rid}#{len(out)}"
        ids.add(rid)
        out.append((sig, {"id": rid, "messages": [{"role": "user", "content": text}]}))
    return out


def code_prompts(count: int, *, seed: int = 0, packages: Path | None = None, first: Path | None = None,
                 exclude_names: frozenset[str] = frozenset()) -> list[dict]:
    """`count` prompts from the stdlib and `packages`, shuffled; the functions of `first` (the
    `python-puzzles` asset, ids "puzzle/...") come before all others, so all of them are used."""
    found = stdlib_functions() + (package_functions(packages) if packages is not None else [])
    rng = random.Random(seed)
    rng.shuffle(found)
    if first is None:
        return [rec for _, rec in _prompts(found, count, rng, exclude_names)]
    # The `first` functions draw from their own random stream and the others are built exactly as
    # without them (a signature they share goes to the puzzle), so every other prompt keeps its
    # wording and id, and responses regenerated for the run without them can be reused
    # (smollm2_pipeline.py --reuse).
    head = package_functions(first, prefix="puzzle")
    first_rng = random.Random(f"{seed}/first")
    first_rng.shuffle(head)
    puzzles = _prompts(head, count, first_rng, exclude_names)
    taken = {sig for sig, _ in puzzles}
    rest = [rec for sig, rec in _prompts(found, count, rng, exclude_names) if sig not in taken]
    return ([rec for _, rec in puzzles] + rest)[:count]


if __name__ == "__main__":
    import sys

    prompts = code_prompts(100000, packages=Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(f"{len(prompts)} prompts available")
    for rec in prompts[:3]:
        print(json.dumps(rec)[:300])
