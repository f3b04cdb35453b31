"""Import cycles among domino_graft's modules, arrows back up, and long modules, from the source
alone (nothing is imported).

    python tests/import_cycles.py [REPO]     prints what it finds; exit status 1 if anything

Every module under domino_graft/, adapters/, kernels/ and recipes/ (installed as
domino_graft.adapters, .kernels, .recipes) is parsed with ast. An edge A -> B is any import of B in A, at module
level or inside a function (a lazy import still runs, just later), relative imports resolved;
`from P import name` is an edge to P.name when that is a module, else to P. Importing P.Q.M
also runs P.Q's __init__, so it is an edge to P.Q too, unless P.Q is a package A lives in
(already imported by then). Imports under `if TYPE_CHECKING:` never run and are skipped.
A cycle is a strongly connected group of two or more modules; one example path is printed.

An arrow back up: a module imports from a package below it (a subpackage, at any depth, of the
package the module is in) and a module of that package imports it back, e.g. rundir.py ->
training/lock.py while training/loop.py -> rundir.py. Without a cycle of modules, that is still a
circle between a module and the package below it. A long module: over MAX_LINES lines, outside
kernels/ (Triton kernels keep a kernel and its launch table in one file).
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from pathlib import Path


def package_dirs(root: Path) -> dict[str, Path]:
    """Installed name -> folder (pyproject's package-dir), those present."""
    dirs = {"domino_graft": root / "domino_graft", "domino_graft.adapters": root / "adapters",
            "domino_graft.kernels": root / "kernels", "domino_graft.recipes": root / "recipes"}
    return {name: d for name, d in dirs.items() if d.is_dir()}


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package __init__)."""
    out = {}
    for pkg, folder in package_dirs(root).items():
        for f in sorted(folder.rglob("*.py")):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = (f, f.name == "__init__.py")
    return out


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST):
    """Import nodes, skipping the bodies of `if TYPE_CHECKING:` (their `else:` still runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        children = list(ast.iter_child_nodes(node))
        if _type_checking_only(node):
            children = list(node.orelse)
        stack.extend(children)


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module if is_pkg else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def import_graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, (f, is_pkg) in mods.items():
        for node in _imports(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                src = _resolve(m, is_pkg, node)
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]
            for t in targets:
                while t and t not in mods:  # `import a.b.name`, or something outside domino_graft
                    t = t.rpartition(".")[0]
                if not t or t == m:
                    continue
                edges[m].add(t)
                parent = t.rpartition(".")[0]  # its packages' __init__ run first
                while parent and parent != m and not (m + ".").startswith(parent + "."):
                    edges[m].add(parent)
                    parent = parent.rpartition(".")[0]
    return edges


def arrows_back_up(root: Path, edges: dict[str, set[str]]) -> list[tuple[str, str, str, str]]:
    """(module, package below it, what it imports there, what there imports it back), sorted."""
    mods = modules(root)

    def inside(m: str, pkg: str) -> bool:
        return m == pkg or m.startswith(pkg + ".")

    found = []
    for pkg in sorted(m for m, (_, is_pkg) in mods.items() if is_pkg):
        above = pkg.rpartition(".")[0]
        if not above:
            continue
        for m in sorted(mods):
            if inside(m, pkg) or not inside(m, above):
                continue
            down = sorted(b for b in edges[m] if inside(b, pkg) and b != pkg) or sorted(b for b in edges[m] if b == pkg)
            back = sorted(a for a in edges if inside(a, pkg) and m in edges[a])
            if down and back:
                found.append((m, pkg, down[0], back[0]))
    return found


MAX_LINES = 650
LONG_EXEMPT = ("domino_graft.kernels",)


def long_modules(root: Path, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """(file relative to root, lines) of every module over `limit` lines, outside kernels/."""
    out = []
    for pkg, folder in package_dirs(root).items():
        if pkg in LONG_EXEMPT:
            continue
        for f in sorted(folder.rglob("*.py")):
            n = len(f.read_text().splitlines())
            if n > limit:
                out.append((str(f.relative_to(root)), n))
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of >= 2 modules (Tarjan, iterative)."""
    index, low, on, stack, groups, counter = {}, {}, set(), [], [], [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def example_path(edges: dict[str, set[str]], group: list[str]) -> list[str]:
    """A shortest cycle through the group's first module."""
    members, start = set(group), group[0]
    prev, queue = {start: None}, deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(edges[v]):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return group


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parents[1]).resolve()
    edges = import_graph(root)
    found = cycles(edges)
    up = arrows_back_up(root, edges)
    long = long_modules(root)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} import edges, {len(found)} cycle group(s), "
          f"{len(up)} arrow(s) back up, {len(long)} module(s) over {MAX_LINES} lines")
    for group in found:
        print(f"cycle among {len(group)} modules: {', '.join(group)}")
        print("  e.g. " + " -> ".join(example_path(edges, group)))
    for m, pkg, down, back in up:
        print(f"arrow back up: {m} -> {down} (in {pkg}), and {back} -> {m}")
    for f, n in long:
        print(f"long module: {f}, {n} lines")
    return 1 if found or up or long else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
