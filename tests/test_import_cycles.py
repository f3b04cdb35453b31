"""The package's layering, from the source only (tests/import_cycles.py; nothing imported): no import
cycle among domino_graft's modules, no arrow back up (a module importing a package below it that
imports it back), no module over 650 lines outside kernels/."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.import_cycles import MAX_LINES, arrows_back_up, cycles, example_path, import_graph, long_modules

REPO = Path(__file__).resolve().parents[1]


def test_no_import_cycle():
    edges = import_graph(REPO)
    found = [" -> ".join(example_path(edges, g)) for g in cycles(edges)]
    assert not found, "import cycles: " + "; ".join(found)


def test_no_arrow_back_up():
    found = [f"{m} -> {down}, and {back} -> {m}" for m, _, down, back in arrows_back_up(REPO, import_graph(REPO))]
    assert not found, "arrows back up: " + "; ".join(found)


def test_no_long_module():
    found = [f"{f}: {n} lines" for f, n in long_modules(REPO)]
    assert not found, f"modules over {MAX_LINES} lines (split them by job): " + "; ".join(found)


def test_the_checker_sees_lazy_relative_and_package_imports(tmp_path):
    def write(rel, text):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))

    write("domino_graft/__init__.py", "")
    write("domino_graft/a.py", "def f():\n    from .b import x\n")  # lazy and relative
    write("domino_graft/b.py", "from domino_graft import a\nx = 1\n")
    write("domino_graft/sub/__init__.py", "from .m import y\n")
    write("domino_graft/sub/m.py", "y = 1\n")
    write("domino_graft/c.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import z\n")
    write("domino_graft/d.py", "from .c import *\nfrom .sub.m import y\n")
    (tmp_path / "adapters").mkdir()
    write("kernels/__init__.py", "import domino_graft.sub.m\n")
    edges = import_graph(tmp_path)
    assert edges["domino_graft.a"] == {"domino_graft.b"} and "domino_graft.a" in edges["domino_graft.b"]
    assert edges["domino_graft.c"] == set()  # TYPE_CHECKING imports never run
    assert edges["domino_graft.d"] == {"domino_graft.c", "domino_graft.sub.m", "domino_graft.sub"}
    assert edges["domino_graft.kernels"] == {"domino_graft.sub.m", "domino_graft.sub"}
    assert cycles(edges) == [["domino_graft.a", "domino_graft.b"]]


def test_the_checker_sees_an_arrow_back_up_and_a_long_module(tmp_path):
    """The shape issue #41 removed: rundir.py imports training/lock.py while training/loop.py imports
    rundir.py (no cycle of modules, a circle between a module and the package below it)."""
    def write(rel, text):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))

    write("domino_graft/__init__.py", "")
    write("domino_graft/rundir.py", "def held():\n    from .training.lock import held_by\n")
    write("domino_graft/training/__init__.py", "")
    write("domino_graft/training/lock.py", "held_by = None\n")
    write("domino_graft/training/loop.py", "from ..rundir import held\n")
    write("domino_graft/export/__init__.py", "")
    write("domino_graft/export/long.py", "x = 1\n" * (MAX_LINES + 1))
    write("domino_graft/export/fine.py", "x = 1\n" * MAX_LINES)
    write("kernels/__init__.py", "")
    write("kernels/triton_long.py", "x = 1\n" * (MAX_LINES + 100))  # kernels/ are exempt
    edges = import_graph(tmp_path)
    assert cycles(edges) == []
    assert arrows_back_up(tmp_path, edges) == [("domino_graft.rundir", "domino_graft.training",
                                                "domino_graft.training.lock", "domino_graft.training.loop")]
    assert long_modules(tmp_path) == [("domino_graft/export/long.py", MAX_LINES + 1)]
