"""Code prompts derived from real Python source (the standard library of the running Python).

HumanEval's prompts are bare function stubs: a signature and a docstring, sent as the user
message. Most prompts here have that shape; a quarter are phrased as instructions instead, for
variety. They come from public stdlib functions and methods (`self` dropped), so the training
data never contains an evaluation problem.
"""

from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from pathlib import Path

# packages that are tests, demos or GUI glue rather than the library itself
_SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo", "site-packages", "ensurepip",
               "__phello__", "pydoc_data"}


def _signature(node: ast.FunctionDef) -> str:
    args = node.args
    if args.posonlyargs and args.posonlyargs[0].arg in ("self", "cls"):
        args.posonlyargs = args.posonlyargs[1:]
    elif args.args and args.args[0].arg in ("self", "cls"):
        args.args = args.args[1:]
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"def {node.name}({ast.unparse(args)}){returns}:"


def _functions(path: Path):
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    candidates = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")):
        candidates += [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    for node in candidates:
        if node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if doc and 40 <= len(doc) <= 800:
            yield _signature(node), doc.strip()


def _stub(sig: str, doc: str) -> str:
    body = textwrap.indent(doc, "    ").lstrip()
    return f"{sig}\n    \"\"\" {body}\n    \"\"\"\n"


def stdlib_functions() -> list[tuple[str, str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if any(part in _SKIP_PARTS or part.startswith("test_") for part in rel.parts):
            continue
        module = ".".join(rel.with_suffix("").parts)
        found += [(module, sig, doc) for sig, doc in _functions(path)]
    return found


def code_prompts(count: int, *, seed: int = 0) -> list[dict]:
    found = stdlib_functions()
    rng = random.Random(seed)
    rng.shuffle(found)
    out, seen, ids = [], set(), set()
    for module, sig, doc in found:
        if len(out) >= count:
            break
        if sig in seen:  # the same method on sibling classes
            continue
        seen.add(sig)
        if rng.random() < 0.25:
            text = f"Write a Python function with this signature:\n\n{sig}\n\nIt should do the following:\n{doc}"
        else:
            text = _stub(sig, doc)
        rid = f"stdlib/{module}/{sig.split('(')[0][4:]}"
        if rid in ids:  # same name, other signature (methods of two classes): ids must be unique
            rid = f"{rid}#{len(out)}"
        ids.add(rid)
        out.append({"id": rid, "messages": [{"role": "user", "content": text}]})
    return out


if __name__ == "__main__":
    import json

    prompts = code_prompts(100000)
    print(f"{len(prompts)} prompts available")
    for rec in prompts[:3]:
        print(json.dumps(rec)[:300])
