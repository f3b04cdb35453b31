"""The shape of the package, checked: families reached only through the registry, every package
installed, shipped recipes usable by name and from anywhere (import cycles: test_import_cycles.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# installed name -> folder (pyproject's package-dir)
ROOTS = {"domino_graft": REPO / "domino_graft", "domino_graft.adapters": REPO / "adapters",
         "domino_graft.kernels": REPO / "kernels", "domino_graft.recipes": REPO / "recipes"}
FAMILY_WORDS = re.compile(r"\b(dflash|medusa|pard|dspark|peagle)\b", re.I)  # every in-tree family


def _modules() -> dict[str, Path]:
    found = {}
    for root, folder in ROOTS.items():
        for f in folder.rglob("*.py"):
            rel = f.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([root, *parts])] = f
    return found


def test_core_modules_name_no_family():
    """Families live in their own packages; the core (and the kernels) reach them through
    domino_graft.registry."""
    offenders = []
    for f in sorted([*(REPO / "domino_graft").rglob("*.py"), *(REPO / "kernels").rglob("*.py")]):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if FAMILY_WORDS.search(line):
                offenders.append(f"{f.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_every_package_is_listed_in_pyproject():
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {m for m, f in _modules().items() if f.name == "__init__.py"}
    data_dirs = {"domino_graft.recipes.configs"}  # package data, listed so setuptools does not warn
    assert folders | data_dirs == listed, f"missing: {sorted(folders - listed)}, stale: {sorted(listed - folders - data_dirs)}"


def test_registry_finds_the_built_in_families_without_torch():
    code = ("import sys; from domino_graft.registry import families; "
            "print(sorted(families())); print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["['dflash', 'dspark', 'medusa', 'pard', 'peagle']", "False"]


def test_shipped_recipe_by_name_from_any_folder_and_copied_out(tmp_path):
    r = subprocess.run([sys.executable, "-m", "domino_graft", "recipes"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and re.search(r"^tiny_dflash +Tiny random DFlash", r.stdout, re.M), r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "domino_graft", "apply", "tiny_dflash", "-o", "X"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "X" / "manifest.json").is_file() and "wrote run dir X" in r.stdout
    # a shipped recipe whose config path is relative (configs/qwen3-8b.json), copied elsewhere
    shutil.copy(REPO / "recipes" / "dflash_qwen3_8b.yaml", tmp_path / "mine.yaml")
    r = subprocess.run([sys.executable, "-m", "domino_graft", "apply", "mine.yaml", "--dry-run"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "head parameters 55,934,976" in r.stdout
    r = subprocess.run([sys.executable, "-m", "domino_graft", "apply", "no_such_recipe"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0 and "neither a file nor a shipped recipe; shipped: dflash_qwen3_8b" in r.stderr


def test_every_kernel_has_a_test_and_a_bench_entry_of_its_name():
    """Liger's triad: kernels/<client>/<name>.py, tests/kernels/test_<name>.py and the bench entry
    `<name>` of bench/kernels.py. reference.py is the eager reference the rollout kernels are tested
    against: a test of its own, no bench entry (it is every entry's baseline)."""
    entries = set(re.findall(r"^def ([a-z_0-9]+)\(s, smoke\)", (REPO / "bench" / "kernels.py").read_text(), re.M))
    kernels = {f.stem for client in ("engine", "head") for f in (REPO / "kernels" / client).glob("*.py")
               if f.stem != "__init__"}
    assert kernels, "no kernels found under kernels/engine, kernels/head"
    no_test = sorted(k for k in kernels if not (REPO / "tests" / "kernels" / f"test_{k}.py").is_file())
    no_bench = sorted(kernels - entries - {"reference"})
    assert not no_test and not no_bench, f"no tests/kernels/test_<name>.py: {no_test}; no bench entry: {no_bench}"
    assert not (set(f.stem for f in (REPO / "kernels").glob("*.py")) - {"__init__"}), \
        "a kernel outside kernels/engine and kernels/head: put it under the client it serves"
