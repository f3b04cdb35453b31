"""Public functions and their docstrings, read (never imported) from Python source.

Code training prompts are HumanEval-shaped: a signature and a docstring. This module finds
such pairs in source text with `ast`, so the same extraction serves the standard library of
the running Python and the pinned wheels of the `python-functions` asset.
"""

from __future__ import annotations

import ast
from typing import Iterator

# packages and folders that are tests, demos or GUI glue rather than the library itself
SKIP_PARTS = frozenset({"test", "tests", "testing", "benchmarks", "idlelib", "lib2to3", "tkinter", "turtledemo",
                        "site-packages", "ensurepip", "__phello__", "pydoc_data"})
DOC_MIN, DOC_MAX = 40, 800  # characters; HumanEval's docstrings are ~100-600


def skipped_path(parts: tuple[str, ...]) -> bool:
    return any(p in SKIP_PARTS or p.startswith("test_") for p in parts)


def signature(node: ast.FunctionDef) -> str:
    """`def name(args) -> ret:` with a leading self/cls dropped (a method read as a function)."""
    args = node.args
    if args.posonlyargs and args.posonlyargs[0].arg in ("self", "cls"):
        args.posonlyargs = args.posonlyargs[1:]
    elif args.args and args.args[0].arg in ("self", "cls"):
        args.args = args.args[1:]
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"def {node.name}({ast.unparse(args)}){returns}:"


def trim_doc(doc: str, limit: int = DOC_MAX) -> str:
    """Whole leading paragraphs up to `limit` characters: a numpydoc docstring keeps its
    description and drops the Parameters/Returns tables that would follow."""
    kept: list[str] = []
    for para in doc.strip().split("\n\n"):
        if len("\n\n".join(kept + [para])) > limit:
            break
        kept.append(para)
    return "\n\n".join(kept).strip()


def functions(source: str) -> Iterator[tuple[str, str]]:
    """(signature, docstring) of each public module-level function and public-class method."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    candidates = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")):
        candidates += [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    for node in candidates:
        if node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        doc = trim_doc(doc) if doc else ""
        if len(doc) >= DOC_MIN:
            yield signature(node), doc
