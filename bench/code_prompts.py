"""Code prompts derived from real Python source (the standard library on this machine).

HumanEval asks for a function from its signature and docstring; these prompts have the same
shape but come from stdlib functions, so the training data never contains an eval problem.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path


def _functions(path: Path):
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc and 40 <= len(doc) <= 600:
                args = ast.unparse(node.args)
                yield f"def {node.name}({args}):", doc.strip()


def code_prompts(count: int, *, seed: int = 0) -> list[dict]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(stdlib.glob("*.py")):
        for sig, doc in _functions(path):
            found.append((path.stem, sig, doc))
    random.Random(seed).shuffle(found)
    out = []
    for module, sig, doc in found[:count]:
        text = f"Write a Python function with this signature:\n\n{sig}\n\nIt should do the following:\n{doc}"
        out.append({"id": f"stdlib/{module}/{sig.split('(')[0][4:]}", "messages": [{"role": "user", "content": text}]})
    return out


if __name__ == "__main__":
    import json

    for rec in code_prompts(5):
        print(json.dumps(rec)[:200])
