"""No import cycle among domino_graft's modules (tests/import_cycles.py; source only, nothing imported)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.import_cycles import cycles, example_path, import_graph

REPO = Path(__file__).resolve().parents[1]


def test_no_import_cycle():
    edges = import_graph(REPO)
    found = [" -> ".join(example_path(edges, g)) for g in cycles(edges)]
    assert not found, "import cycles: " + "; ".join(found)


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
