"""Where a training step's time goes: the SmolLM2 pipeline's drafters (experiments/smollm2_pipeline.py),
applied at a scale's settings, timed step by step and then profiled with torch.profiler.

    python bench/training.py --work /tmp/prof --scale gpu-block16 --names dspark_base,peagle_base \
        --out prof.json

Each drafter is applied fresh under WORK/<name> (the pipeline's own plan: recipe, overrides, data at
WORK/train.regen.jsonl), then runs `--warmup` untimed steps, `--steps` timed ones (synchronised,
so each is its own wall time), and `--profile` steps under the profiler. The report has the step
times, peak memory, and the ops with the most device (or, on a CPU, host) time, per drafter; the
profiler's own table goes to WORK/<name>.profile.txt. Nothing is checkpointed or kept.

Why it exists: issue #29's five drafters trained at ~6.5 steps/s together on one H200 (under MPS
and without it), ~0.2 s a step each alone, several times what their FLOPs need; this says which
ops hold it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))  # the pipeline prepares the run

import smollm2_pipeline as pipeline  # noqa: E402


def _session(run: Path):
    """A TrainingRun prepared exactly as `train` prepares one (model, data, optimizer, fresh start), not started."""
    from domino_graft.device import pick_device
    from domino_graft.training.distributed import init_distributed
    from domino_graft.training.loop import TrainingRun, _recipe

    recipe = _recipe(run, [], None)
    info = init_distributed(pick_device(recipe.device))
    tr = TrainingRun(run, recipe, info, echo=lambda *a, **k: None, progress=False)
    tr.prepare(None)
    return tr


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def profile_one(work: Path, name: str, plan: list[str], *, warmup: int, steps: int, profile: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity

    run = pipeline._apply(work, name, plan)
    tr = _session(run)
    dev = tr.info.device
    cuda = dev.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    # head-on steps for a Domino drafter, backbone-only ones for a _base (its plan says so)
    first = 0 if tr.cfg.backbone_only_steps >= tr.cfg.max_steps else tr.cfg.backbone_only_steps
    for s in range(warmup):
        tr.train_step(first + s)
    _sync(dev)
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        tr.train_step(first + warmup + s)
        _sync(dev)
        times.append(time.perf_counter() - t0)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for s in range(profile):
            tr.train_step(first + warmup + steps + s)
        _sync(dev)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages(group_by_input_shape=True).table(sort_by=key, row_limit=40)
    (work / f"{name}.profile.txt").write_text(table)
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in rows) or 1.0
    top = [{"op": e.key, "calls": e.count, "self_ms_per_step": round(getattr(e, key) / 1e3 / profile, 3),
            "share": round(getattr(e, key) / total, 4)} for e in rows[:25]]
    out = {"device": dev, "plan": plan, "step_s": [round(t, 4) for t in times],
           "median_step_s": round(sorted(times)[len(times) // 2], 4) if times else None,
           "profiled_steps": profile, "time_kind": key,
           # against the median step: near it, the device is the bottleneck; far below, the host is
           "self_ms_per_step_all_ops": round(total / 1e3 / profile, 2), "top_ops": top}
    if cuda:
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del tr
    if cuda:
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="holds train.regen.jsonl; runs are applied under it")
    p.add_argument("--scale", choices=sorted(pipeline.SCALES), default="smoke")
    p.add_argument("--names", default="dspark_base", help="pipeline drafters, comma-separated")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--profile", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    scale = pipeline.SCALES[a.scale]
    if scale["device"] == "cuda":  # as stage_train: training matmuls on TF32
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    names = a.names.split(",")
    pipeline.set_families(sorted({n.split("_")[0] for n in names}))
    plans = pipeline._plans(a.work, scale)
    report = {"scale": a.scale, "torch": torch.__version__, "drafters": {}}
    for name in names:
        report["drafters"][name] = profile_one(a.work, name, plans[name], warmup=a.warmup, steps=a.steps,
                                               profile=a.profile)
        d = report["drafters"][name]
        print(f"{name}: median step {d['median_step_s']} s; top: "
              + "; ".join(f"{t['op']} {t['self_ms_per_step']} ms" for t in d["top_ops"][:6]), flush=True)
        a.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
