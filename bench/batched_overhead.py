"""Where a batched chain step's time goes (issue #39): the SmolLM2-135M shape with random weights
(target: 30 layers, H = 576; drafter: the shipped DFlash shape, 4 layers, block 16; a Domino head at
smollm2_dflash.yaml's shape), bf16 on the fast engine, CUDA graphs.

    source experiments/gpu_env.sh; python3 bench/batched_overhead.py --out bench/results/batched_overhead_h200.json

For B in --batches: ms per step (wall clock over a whole decode / the target forwards of its longest
row) of the target alone (solo at B = 1, batched otherwise), the solo chain (B = 1), the batched
chain verifying every draft, and the batched chain under a fixed budget of 0 (plain steps); then a
cProfile of one batched-chain decode (host functions by own time: the device->host sync shows as
`tolist`). Random weights accept almost nothing, so each speculative step is a full-K verify that
emits one token: the figures are per step, not per token. --temperature T > 0 runs every mode
sampled (seed 0; rows keyed "B@T"), and --kernel-profile adds a torch.profiler table of one
batched-chain decode (device time by kernel, host time by op). --phases K1,K2 splits a batched-chain
step verifying K' drafts (a fixed budget per K') into its phases, timed on the device by CUDA events
recorded around each host call (`phase_times`): the drafter's propose (the pending context written
first), the head's rollout, the target's forward, the verify's accept rule, and "host", the device's
idle time from one step's verify to the next step's propose (the sync, the bookkeeping, launches).
--ahead K1,K2 times the batched chain under a fixed budget of each K' (and at B = 1 the solo chain, all K) with
its steps drafted ahead and without (decoding/batched.py "Drafted ahead", `batched.SPEC_AHEAD`), each mode's
best of five decodes, the two modes alternating: rows "ahead_ms_per_step" {K': {"off", "on"}}.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

SHAPE = [  # recipes/tiny_dflash.yaml grown to SmolLM2-135M-Instruct and the shipped drafter
    "target.random.architecture=llama", "target.random.vocab_size=49152", "target.random.hidden_size=576",
    "target.random.num_layers=30", "target.random.num_heads=9", "target.random.num_kv_heads=3",
    "target.random.head_dim=64", "target.random.intermediate_size=1536", "target.random.eos_token_id=49151",
    "drafter.num_layers=4", "drafter.block_size=16", "drafter.target_layer_ids=[1,8,15,22,29]",
    "drafter.mask_token_id=16", "head.gru_hidden_dim=256", "head.rank=64",
]


def build(shape: list[str] = SHAPE, device: str = "cuda", dtype=torch.bfloat16, create_on_device: bool = False):
    """An Engine of random weights: recipes/tiny_dflash.yaml with the `shape` overrides, on `device` in `dtype`.
    create_on_device: the weights are created there (an 8B model not first on the host), which draws other random
    weights than creating them on the host and moving them (this benchmark's own runs)."""
    import contextlib

    from domino_graft.decoding import Engine
    from domino_graft.graft import build_head
    from domino_graft.recipe import load_recipe
    from domino_graft.registry import get_family
    from domino_graft.target import load_target

    recipe = load_recipe(REPO / "recipes" / "tiny_dflash.yaml", shape)
    with torch.device(device) if create_on_device else contextlib.nullcontext():
        target = load_target(recipe.target, device=device if create_on_device else "cpu")
        adapter, head_tensors = get_family("dflash").build(recipe.drafter, target)
        head = build_head(recipe, adapter, head_tensors)
    for m in (target.model, adapter, head):
        m.to(device=device, dtype=dtype)
    return Engine(target, adapter, head, rollout="triton" if device == "cuda" else "torch", stop_ids=(), kv="static")


def per_step(fn, results_of) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = fn()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return 1e3 * wall / max(r.target_forwards for r in results_of(res))


def kernel_profile(fn, top: int = 25) -> dict:
    """One call of fn under torch.profiler: the top CUDA kernels by total device time and the top
    host ops by self CPU time (ms, with call counts), and the decode's wall clock."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    dev = sorted((e for e in events if e.self_device_time_total > 0), key=lambda e: -e.self_device_time_total)[:top]
    host = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    return {"wall_ms": round(1e3 * wall, 3),
            "device_ms_by_kernel": [[e.key[:90], e.count, round(e.self_device_time_total / 1e3, 3)] for e in dev],
            "host_self_ms_by_op": [[e.key[:90], e.count, round(e.self_cpu_time_total / 1e3, 3)] for e in host]}


class _Timed:
    """Forwards attribute access to `inner`, timing the named methods by CUDA events on the current stream."""

    def __init__(self, inner, names, log):
        self._inner, self._names, self._log = inner, names, log

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in self._names:
            return attr
        return _timed(attr, self._names[name], self._log)


def _timed(fn, label, log):
    def call(*a, **kw):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(*a, **kw)
        end.record()
        log.append((label, start, end))
        return out
    return call


def phase_times(engine, prompts, kw, kk: int) -> dict:
    """ms per step of each phase of one batched-chain decode verifying `kk` drafts a step (module
    docstring), from CUDA events around the drafter's propose, the rollout, the target's forward and
    the accept rule; "host" is the device time between one step's accept rule and the next propose."""
    from domino_graft.decoding import batched
    from domino_graft.decoding.budget import VerifyBudget

    log: list = []
    saved = (batched.static_batch_drafter, batched.ragged_target, batched.verify_chain, engine.rollout)
    batched.static_batch_drafter = lambda *a: _Timed(saved[0](*a), {"propose": "propose"}, log)
    batched.ragged_target = lambda *a: _Timed(saved[1](*a), {"step": "target"}, log)
    batched.verify_chain = _timed(saved[2], "accept", log)
    engine.rollout = _timed(saved[3], "rollout", log)
    try:
        budget = VerifyBudget.parse(str(kk))
        engine.speculative_batch(prompts, budget=budget, **kw)  # shapes warmed
        log.clear()
        res = engine.speculative_batch(prompts, budget=budget, **kw)
        torch.cuda.synchronize()
    finally:
        batched.static_batch_drafter, batched.ragged_target, batched.verify_chain = saved[:3]
        engine.rollout = saved[3]
    steps = max(r.target_forwards for r in res) - 1
    out: dict = {}
    prev_end = None
    for label, start, end in log:
        out[label] = out.get(label, 0.0) + start.elapsed_time(end)
        if label == "propose" and prev_end is not None:
            out["host"] = out.get("host", 0.0) + prev_end.elapsed_time(start)
        if label == "accept":
            prev_end = end
    return {k: round(v / steps, 4) for k, v in out.items()} | {"steps": steps}


def ahead_times(engine, prompts, kw, kks: list[int], repeats: int = 5) -> dict:
    """ms per step of the batched chain at a fixed budget of each K' in `kks` (B = 1: also "solo", the solo
    chain at all K), drafted ahead ("on") and not ("off"): each mode's best of `repeats` decodes, alternating."""
    from domino_graft.decoding import batched
    from domino_graft.decoding.budget import VerifyBudget

    runs = {str(kk): (lambda kk=kk: engine.speculative_batch(prompts, budget=VerifyBudget.parse(str(kk)), **kw))
            for kk in kks}
    if len(prompts) == 1:
        runs["solo"] = lambda: [engine.speculative(prompts[0], **kw)]
    out = {}
    saved = batched.SPEC_AHEAD
    try:
        for name, fn in runs.items():
            best = {"off": float("inf"), "on": float("inf")}
            for i in range(2 * repeats + 2):  # the first two: each mode's shapes warmed
                mode = ("off", "on")[i % 2]
                batched.SPEC_AHEAD = mode == "on"
                ms = per_step(fn, lambda r: r)
                if i >= 2:
                    best[mode] = min(best[mode], ms)
            out[name] = {m: round(v, 4) for m, v in best.items()}
    finally:
        batched.SPEC_AHEAD = saved
    return out


def main(argv=None) -> int:
    from domino_graft.decoding.budget import VerifyBudget

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--prompt-len", type=int, default=160)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--kernel-profile", action="store_true")
    p.add_argument("--phases", default="", help="K' values (comma-separated) whose steps are split into phases")
    p.add_argument("--no-cprofile", action="store_true")
    p.add_argument("--ahead", default="", help="K' values (comma-separated): steps drafted ahead or not, timed")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from domino_graft.sampling import Sampling

    sampling = Sampling(temperature=args.temperature, seed=0 if args.temperature else None)
    engine = build()
    gen = torch.Generator().manual_seed(0)
    rows = {}
    for b in [int(x) for x in args.batches.split(",")]:
        prompts = [torch.randint(100, 49000, (args.prompt_len,), generator=gen).tolist() for _ in range(b)]
        kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling)
        plain = VerifyBudget.parse("0")
        runs = {
            "target": (lambda: [engine.target_only(prompts[0], **kw)]) if b == 1
            else (lambda: engine.target_only_batch(prompts, **kw)),
            "batched_chain_full": lambda: engine.speculative_batch(prompts, **kw),
            "batched_chain_plain": lambda: engine.speculative_batch(prompts, budget=plain, **kw),
        }
        if b == 1:
            runs["solo_chain"] = lambda: [engine.speculative(prompts[0], **kw)]
        row = {}
        for name, fn in runs.items():
            fn()  # compile, capture
            row[f"{name}_ms_per_step"] = round(min(per_step(fn, lambda r: r) for _ in range(3)), 4)
            print(f"B={b} {name}: {row[f'{name}_ms_per_step']} ms/step", flush=True)
        if args.ahead:
            row["ahead_ms_per_step"] = ahead_times(engine, prompts, kw, [int(x) for x in args.ahead.split(",")])
            print(f"B={b} drafted ahead off/on: {row['ahead_ms_per_step']}", flush=True)
        for kk in [int(x) for x in args.phases.split(",") if x]:
            row[f"phases_ms_per_step_k{kk}"] = phase_times(engine, prompts, kw, kk)
            print(f"B={b} K'={kk} phases: {row[f'phases_ms_per_step_k{kk}']}", flush=True)
        if not args.no_cprofile:
            prof = cProfile.Profile()
            prof.enable()
            engine.speculative_batch(prompts, **kw)
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
            row["cprofile_batched_chain_full"] = s.getvalue().splitlines()[:60]
            print("\n".join(row["cprofile_batched_chain_full"][:45]), flush=True)
        if args.kernel_profile:
            row["kernel_profile_batched_chain_full"] = kernel_profile(lambda: engine.speculative_batch(prompts, **kw))
            print(json.dumps(row["kernel_profile_batched_chain_full"], indent=1), flush=True)
        rows[f"{b}@T{args.temperature:g}" if args.temperature else str(b)] = row
        Path(args.out).write_text(json.dumps({"command": " ".join(["bench/batched_overhead.py", *(argv or sys.argv[1:])]),
                                              "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                              "git_sha": os.environ.get("DG_GIT_SHA"),
                                              "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
