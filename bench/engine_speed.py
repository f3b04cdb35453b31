"""Speed of the fast target engine (domino_graft/fast) on one GPU, against HF eager and
HF StaticCache + torch.compile(mode="reduce-overhead"), at batch 1 on random bf16 weights.

Rows: smollm2_135m (recipes/configs/smollm2-135m-instruct.json) and qwen3_8b
(recipes/configs/qwen3-8b.json), built directly on the GPU and initialised with a fixed seed
(std 0.02 for every matrix, ones for the norms). Per row:

  target_step_ms      own forward in a CUDA graph + argmax, 1 token at a context of ~128
  target_verify_ms    the same, 16 tokens (a verify step) at the same context
                      (both: the fastest own variant, named in target_*_mode; each
                      variant's figure is kept under *_<variant>, see VARIANTS; profile_*
                      break the headline step into kernels)
  floor_ms            weight bytes read once / read bandwidth measured in this run
                      (a sum over a 4 GiB bf16 buffer)
  hf_compiled_step_ms / hf_compiled_verify_ms   transformers StaticCache + torch.compile
                      (mode="reduce-overhead", dynamic=False) of the HF forward; an error
                      string instead of a number if compile fails
  hf_eager_step_ms / hf_eager_verify_ms         eager HF with a DynamicCache (reference)
  greedy_identical    32 greedy tokens of the fast path (the headline variant, CUDA graph)
                      == HF eager greedy, bf16; greedy_tf_* feed the fast path HF's tokens and
                      count disagreements with HF's top-2 logit gap there (one bf16 rounding
                      step of the logits = a floating-point near-tie); *_fp32: the same
                      random weights cast to fp32, where such ties are rare

Times are medians over --iters CUDA-event-timed runs after --warmup runs; each timed run is
forward + argmax (the *_wall_ms figures add the host sync, by perf_counter).

Needs only torch + transformers (imports domino_graft.fast, which imports no pydantic).
Usage (GPU):  PYTHONPATH=. python bench/engine_speed.py --git-sha $(git rev-parse HEAD) \
                  --out bench/results/engine_h200.json
--merge adds sections to an existing file (rows keep the set-up and floor of the run that made
them; "runs" / "sections_by_run" say which run measured what). bench/results/engine_h200.json
came from two calls on one H200 (2026-12-01), each on a fresh machine:
  python3 bench/engine_speed.py --git-sha <sha> --out $OUT/engine_h200.json --deadline-s 390
  python3 bench/engine_speed.py --git-sha <sha> --rows smollm2_135m,qwen3_8b \
      --sections greedy,greedy_fp32 --merge --out bench/results/engine_h200.json --deadline-s 300
Smoke run on a CPU (no real figures): --device cpu --num-layers 1 --iters 3 --warmup 1
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch._dynamo
import transformers

from domino_graft.fast import FastLM, GraphRunner

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import harness  # noqa: E402  (bench/ is not a package)
ROWS = {
    "smollm2_135m": "recipes/configs/smollm2-135m-instruct.json",
    "qwen3_8b": "recipes/configs/qwen3-8b.json",
}
# own-engine variants: eager math in a graph; the whole forward compiled as one graph (scope
# "model"); per-layer compiled pieces (scope "layer"), with the boolean and with an additive
# float attention mask; the forward split around the Triton attention kernels
# (kernels/engine/decode_attention.py), eager pieces or compiled ones (with or without inductor's
# coordinate-descent tuning). Each compiled variant starts
# from a reset dynamo cache, so none reuses another's compiled code.
VARIANTS = {
    "graph": {},
    "compiled": {"scope": "model"},
    "compiled_layer": {"scope": "layer"},
    "compiled_layer_fmask": {"scope": "layer", "float_mask": True},
    "triton_graph": {"kernels": "triton"},
    "compiled_layer_triton": {"scope": "layer", "kernels": "triton"},
    # inductor's coordinate-descent tuning of its own kernels' launch parameters (gpt-fast sets it)
    "compiled_layer_triton_cdt": {"scope": "layer", "kernels": "triton",
                                  "options": {"coordinate_descent_tuning": True}},
    # every projection through kernels/engine/small_linear.py too (FastLM.use_linears): rows independent of
    # the batch; configs from --linear-configs (bench/linear_speed.py's winners) or default_config
    "compiled_layer_triton_linears": {"scope": "layer", "kernels": "triton", "linears": "triton"},
}
SECTIONS = ("own_graph", "own_nograph", "hf_eager", *(f"own_{v}" for v in list(VARIANTS)[1:]), "profile", "greedy",
            "long_context", "hf_compiled", "greedy_fp32")
HEADER_KEYS = ("config", "dtype", "batch", "seed", "context", "verify_tokens", "iters", "warmup", "build_s", "params",
               "weight_bytes", "read_bandwidth_gbs", "floor_ms", "own_max_len", "own_kv_block", "num_layers_override")
DROP_KEYS = ("_model_name_or_path", "transformers_version", "dtype", "torch_dtype", "architectures")


# ------------------------------------------------------------------------------ helpers
def load_config(rel: str):
    d = json.loads((REPO / rel).read_text())
    model_type = d.pop("model_type")
    for k in DROP_KEYS:
        d.pop(k, None)
    return transformers.AutoConfig.for_model(model_type, **d)


DEV = "cuda"  # main() sets "cpu" for a smoke run (--device cpu)


def build_model(cfg, seed: int):
    cfg._attn_implementation = "sdpa"
    with torch.device(DEV):
        try:
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:
            model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.to(device=DEV, dtype=torch.bfloat16).eval()
    gen = torch.Generator(device=DEV).manual_seed(seed)
    with torch.no_grad():
        seen = set()
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            p.requires_grad_(False)
            if p.data_ptr() in seen:
                continue
            seen.add(p.data_ptr())
            if p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.fill_(1.0)  # RMSNorm weights (these architectures carry no biases)
    return model


def read_bandwidth_gbs(gib: int = 4, reps: int = 20) -> float:
    buf = torch.empty(gib * 2**30 // 2, dtype=torch.bfloat16, device=DEV).normal_()
    for _ in range(3):
        buf.sum(dtype=torch.float32)
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        buf.sum(dtype=torch.float32)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    nbytes = buf.numel() * buf.element_size()
    del buf
    torch.cuda.empty_cache()
    return nbytes / (statistics.median(ts) * 1e-3) / 1e9


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def time_steps(fn, iters: int, warmup: int) -> dict:
    """fn() launches one step and returns a device tensor (the argmax); medians in ms."""
    if DEV == "cpu":  # smoke runs only: wall clock
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return {"ms": statistics.median(ts), "wall_ms": statistics.median(ts), "min_ms": min(ts), "n": iters}
    for _ in range(warmup):
        fn().cpu()
    torch.cuda.synchronize()
    ev, wall = [], []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        out = fn()
        e.record()
        out.cpu()  # host sync, as a decoding loop has
        wall.append((time.perf_counter() - t0) * 1e3)
        e.synchronize()
        ev.append(s.elapsed_time(e))
    return {"ms": statistics.median(ev), "wall_ms": statistics.median(wall), "min_ms": min(ev), "n": iters}


def cache_kwarg(model) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def takes_cache_position(model) -> bool:
    return "cache_position" in inspect.signature(model.forward).parameters


def hf_call(model, ids, pos: int, cache, fwd=None):
    t = ids.shape[1]
    p = torch.arange(pos, pos + t, device=ids.device)
    kw = {cache_kwarg(model): cache, "use_cache": True, "position_ids": p[None]}
    if takes_cache_position(model):
        kw["cache_position"] = p
    return (fwd or model)(input_ids=ids, **kw)


def hf_greedy(model, p, n: int):
    """HF eager greedy decoding (DynamicCache): n tokens and HF's top-2 logit gap at each."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    want, gaps = [], []
    with torch.no_grad():
        logits = hf_call(model, p, 0, cache).logits[:, -1]
        for i in range(n):
            top2 = logits.float().topk(2, -1).values[0]
            gaps.append(float(top2[0] - top2[1]))
            tok = logits.argmax(-1)
            want.append(int(tok))
            if i + 1 < n:
                logits = hf_call(model, tok[:, None], p.shape[1] + i, cache).logits[:, -1]
    return want, gaps


def make_static_cache(model, max_cache_len: int):
    from transformers import StaticCache

    errors = []
    for kw in (dict(config=model.config, max_cache_len=max_cache_len),
               dict(config=model.config, max_batch_size=1, max_cache_len=max_cache_len, device=DEV,
                    dtype=torch.bfloat16)):
        try:
            return StaticCache(**kw)
        except TypeError as e:
            errors.append(str(e))
    raise TypeError("StaticCache: " + " | ".join(errors))


def short_error(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}"
    return s if len(s) < 600 else s[:600] + " ..."


# ----------------------------------------------------------------------------- one row
def run_row(name: str, args, deadline: float, save) -> dict:
    row: dict = {"config": ROWS[name], "dtype": "bf16", "batch": 1, "seed": args.seed, "context": args.context,
                 "verify_tokens": args.verify, "iters": args.iters, "warmup": args.warmup}
    save(name, row)
    ctx, kv = args.context, args.verify
    t_build = time.perf_counter()
    cfg = load_config(ROWS[name])
    if args.num_layers:  # smoke runs only
        cfg.num_hidden_layers = args.num_layers
        row["num_layers_override"] = args.num_layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[: args.num_layers]
    model = build_model(cfg, args.seed)
    sync()
    row["build_s"] = round(time.perf_counter() - t_build, 1)
    n_params = sum(p.numel() for p in {p.data_ptr(): p for p in model.parameters()}.values())
    row["params"] = n_params
    gen = torch.Generator(device=DEV).manual_seed(args.seed + 1)
    prompt = torch.randint(0, cfg.vocab_size, (1, ctx), device=DEV, generator=gen)
    step_ids = torch.randint(0, cfg.vocab_size, (1, 1), device=DEV, generator=gen)
    verify_ids = torch.randint(0, cfg.vocab_size, (1, kv), device=DEV, generator=gen)

    fast = FastLM.from_hf(model, max_batch=1, max_len=args.max_len)
    row["weight_bytes"] = fast.weight_bytes
    row["read_bandwidth_gbs"] = args.bandwidth_gbs
    row["floor_ms"] = fast.weight_bytes / (args.bandwidth_gbs * 1e9) * 1e3
    row["own_max_len"], row["own_kv_block"] = args.max_len, args.kv_block
    save(name, row)

    def section(key, fn):
        if key not in args.sections:
            return
        if time.perf_counter() > deadline:
            row[f"{key}_skipped"] = "deadline"
            save(name, row)
            return
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # record, keep going
            row[f"{key}_error"] = short_error(e)
            traceback.print_exc()
        sync()
        row[f"{key}_s"] = round(time.perf_counter() - t0, 1)
        save(name, row)
        print(f"[{name}] {key} done in {row[f'{key}_s']} s", flush=True)

    runners = {}

    def own(variant: str):
        spec = VARIANTS[variant]
        if not spec:
            lm = fast
        else:
            torch._dynamo.reset()
            lm = FastLM.from_hf(model, 1, args.max_len)
            lm.float_mask = spec.get("float_mask", False)
            if "kernels" in spec:
                lm.use_kernels(spec["kernels"])
            if "linears" in spec:
                lm.use_linears(spec["linears"])
            if "scope" in spec:
                lm.compile(spec["scope"], **({"options": spec["options"]} if "options" in spec else {}))
        lm.forward(prompt, 0, logits_to_keep=1, use_compiled=False)  # prefill, eager math
        run = GraphRunner(lm, kv_block=args.kv_block)
        runners[variant] = (lm, run)
        st = time_steps(lambda: run(step_ids, ctx)[0][:, -1].argmax(-1), args.iters, args.warmup)
        vf = time_steps(lambda: run(verify_ids, ctx)[0].argmax(-1), args.iters, args.warmup)
        row[f"target_step_ms_{variant}"], row[f"target_step_wall_ms_{variant}"] = st["ms"], st["wall_ms"]
        row[f"target_verify_ms_{variant}"], row[f"target_verify_wall_ms_{variant}"] = vf["ms"], vf["wall_ms"]
        row[f"graphs_captured_{variant}"] = run.captures

    def profile():
        """Kernel time per step of the headline variant (torch.profiler over replays): how much
        of a step is kernels at all, and which kernels; launch gaps are the rest."""
        headline(row)
        if DEV != "cuda":
            return
        for key, ids, t in (("step", step_ids, 1), ("verify", verify_ids, kv)):
            mode = row.get(f"target_{key}_mode")
            if mode not in runners:
                continue
            _, run = runners[mode]
            n = 20
            from torch.profiler import ProfilerActivity, profile as torch_profile

            run(ids, ctx)
            sync()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    run(ids, ctx)
                sync()
            kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
            total_us = sum(e.self_device_time_total for e in kernels) / n
            top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:25]
            row[f"profile_{key}_mode"] = mode
            row[f"profile_{key}_kernel_ms"] = total_us / 1e3
            row[f"profile_{key}_kernels_per_step"] = sum(e.count for e in kernels) / n
            row[f"profile_{key}_top"] = [[e.key[:90], round(e.self_device_time_total / n, 1), e.count // n]
                                         for e in top]

    def own_nograph():
        fast.forward(prompt, 0, logits_to_keep=1)
        st = time_steps(lambda: fast.forward(step_ids, ctx)[0][:, -1].argmax(-1), max(10, args.iters // 3), 3)
        row["own_nograph_step_ms"] = st["ms"]

    def hf_eager():
        from transformers import DynamicCache

        for t, ids, key in ((1, step_ids, "step"), (kv, verify_ids, "verify")):
            cache = DynamicCache(config=model.config)
            with torch.no_grad():
                hf_call(model, prompt, 0, cache)
                state = {"pos": ctx}

                def fn():
                    out = hf_call(model, ids, state["pos"], cache)
                    state["pos"] += t
                    return out.logits[:, -1].argmax(-1)

                r = time_steps(fn, args.iters, args.warmup)
            row[f"hf_eager_{key}_ms"], row[f"hf_eager_{key}_wall_ms"] = r["ms"], r["wall_ms"]
            row[f"hf_eager_{key}_context_range"] = [ctx, state["pos"]]

    def greedy_prompt():
        g = torch.Generator(device=DEV).manual_seed(args.seed + 2)
        return torch.randint(0, cfg.vocab_size, (1, 16), device=DEV, generator=g)

    def greedy_check(lms: dict, suffix: str):
        """HF eager greedy (DynamicCache) vs each fast variant in lms {name: (FastLM, step)}:
        free-running equality, then a teacher-forced pass (the fast path fed HF's tokens) that
        counts every disagreement and HF's top-2 logit gap there (a gap of one rounding step of
        the logits is a floating-point near-tie, anything larger a bug)."""
        p, n = greedy_prompt(), args.greedy_tokens
        want, gaps = hf_greedy(model, p, n)
        row[f"greedy_tokens{suffix}"] = n
        row[f"greedy_min_top2_gap_hf{suffix}"] = min(gaps)
        for variant, (lm, step) in lms.items():
            tag = f"{variant}{suffix}"
            got = lm.greedy(p, n, step=step)
            row[f"greedy_identical_{tag}"] = got == want
            if got != want:
                j = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
                row[f"greedy_first_divergence_{tag}"] = j
                row[f"greedy_hf_top2_gap_at_divergence_{tag}"] = gaps[j]
            # teacher-forced over HF's tokens: position i predicts want[i]
            logits, _ = lm.forward(p, 0, logits_to_keep=1, use_compiled=False)
            preds, own_gaps = [int(logits[:, -1].argmax(-1))], []
            for i in range(n - 1):
                logits, _ = step(torch.tensor([[want[i]]], device=DEV), p.shape[1] + i)
                lg = logits[:, -1].float()
                top2 = lg.topk(2, -1).values[0]
                own_gaps.append(float(top2[0] - top2[1]))
                preds.append(int(lg.argmax(-1)))
            bad = [i for i in range(n) if preds[i] != want[i]]
            row[f"greedy_tf_mismatches_{tag}"] = len(bad)
            if bad:
                row[f"greedy_tf_max_hf_gap_at_mismatch_{tag}"] = max(gaps[i] for i in bad)

    def greedy():
        if "graph" not in runners:  # a run of the greedy sections alone
            runners["graph"] = (fast, GraphRunner(fast, kv_block=args.kv_block))
        if not any(v.startswith("compiled") for v in runners):
            lmc = FastLM.from_hf(model, 1, args.max_len).compile()
            runners["compiled_layer"] = (lmc, GraphRunner(lmc, kv_block=args.kv_block))
        greedy_check(dict(runners), "")
        # teacher-forced: own logits (eager math, no graph) vs HF on prompt + HF's greedy tokens
        p = greedy_prompt()
        want, _ = hf_greedy(model, p, args.greedy_tokens)
        seq = torch.cat([p, torch.tensor([want], device=DEV)], 1)
        with torch.no_grad():
            ref = model(seq).logits.float()
        mine = fast.forward(seq, 0, use_compiled=False)[0].float()
        row["teacher_forced_max_abs_logit_diff"] = float((ref - mine).abs().max())
        row["teacher_forced_logit_scale"] = float(ref.abs().max())
        row["teacher_forced_argmax_agree"] = float((ref.argmax(-1) == mine.argmax(-1)).float().mean())

    def long_context():
        """The step and verify of each measured variant at --long-context positions (the cache's
        contents do not matter for timing): does the attention keep up when it reads ~1k keys."""
        at = args.long_context
        if at + kv > args.max_len:
            raise ValueError(f"--long-context {at} + {kv} > --max-len {args.max_len}")
        row["long_context"] = at
        for variant, (_, run) in runners.items():
            st = time_steps(lambda: run(step_ids, at)[0][:, -1].argmax(-1), args.iters, args.warmup)
            vf = time_steps(lambda: run(verify_ids, at)[0].argmax(-1), args.iters, args.warmup)
            row[f"target_step_ms_{variant}_at_{at}"] = st["ms"]
            row[f"target_verify_ms_{variant}_at_{at}"] = vf["ms"]

    def greedy_fp32():
        """The same random weights in fp32 (HF model cast in place; the fast path re-wrapped):
        bf16 greedy runs meet one-rounding-step ties on random weights, fp32 ones rarely."""
        runners.clear()
        model.to(torch.float32)
        lm = FastLM.from_hf(model, 1, args.max_len)
        lmc = FastLM.from_hf(model, 1, args.max_len).compile()
        greedy_check({"graph": (lm, GraphRunner(lm, kv_block=args.kv_block)),
                      "compiled_layer": (lmc, GraphRunner(lmc, kv_block=args.kv_block))}, "_fp32")

    def hf_compiled():
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        from torch._dynamo.utils import counters

        before = counters["stats"].get("unique_graphs", 0)
        max_cache = ctx + (args.warmup + args.iters + 4) * (1 + kv) + 64
        cache = make_static_cache(model, max_cache)
        row["hf_compiled_max_cache_len"] = max_cache
        with torch.no_grad():
            hf_call(model, prompt, 0, cache)  # eager prefill (lazy cache init)
        cf = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True, dynamic=False)
        state = {"pos": ctx}
        for t, ids, key in ((1, step_ids, "step"), (kv, verify_ids, "verify")):
            def fn(t=t, ids=ids):
                torch.compiler.cudagraph_mark_step_begin()
                with torch.no_grad():
                    out = hf_call(model, ids, state["pos"], cache, fwd=cf)
                state["pos"] += t
                return out.logits[:, -1].argmax(-1)

            try:
                t0 = time.perf_counter()
                for _ in range(3):  # compile, then cudagraph-tree recording
                    fn().cpu()
                row[f"hf_compiled_{key}_compile_s"] = round(time.perf_counter() - t0, 1)
                r = time_steps(fn, args.iters, args.warmup)
                row[f"hf_compiled_{key}_ms"], row[f"hf_compiled_{key}_wall_ms"] = r["ms"], r["wall_ms"]
            except Exception as e:
                row[f"hf_compiled_{key}_ms"] = short_error(e)
                traceback.print_exc()
            save(name, row)
        row["hf_compiled_unique_graphs"] = counters["stats"].get("unique_graphs", 0) - before
        row["hf_compiled_context_range"] = [ctx, state["pos"]]

    section("own_graph", lambda: own("graph"))
    section("own_nograph", own_nograph)
    section("hf_eager", hf_eager)
    for variant in list(VARIANTS)[1:]:
        section(f"own_{variant}", lambda v=variant: own(v))
    section("profile", profile)
    section("greedy", greedy)
    section("long_context", long_context)
    section("hf_compiled", hf_compiled)
    section("greedy_fp32", greedy_fp32)  # last: casts the model to fp32

    save(name, row)
    del fast, runners, model
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return row


def register_linear_configs(path: str) -> dict:
    """small_linear's table from bench/linear_speed.py's winners: {"N,K[,swiglu]": config}."""
    from domino_graft.kernels.engine import small_linear as S

    table = {}
    for key, w in harness.read_json(path)["winners"].items():  # plain or .json.gz
        if w.get("config_all_m"):
            swiglu = key.endswith("/swiglu")
            S.register_config(w["n"], w["k"], S.Config(**w["config_all_m"]), swiglu=swiglu)
            table[f"{w['n']},{w['k']}" + (",swiglu" if swiglu else "")] = w["config_all_m"]
    return table


def headline(row: dict) -> None:
    """The headline figures (on the merged row): the faster own variant, and the ratios."""
    for key in ("step", "verify"):
        cands = {v: row[f"target_{key}_ms_{v}"] for v in VARIANTS
                 if isinstance(row.get(f"target_{key}_ms_{v}"), float)}
        if cands:
            best = min(cands, key=cands.get)
            row[f"target_{key}_ms"] = cands[best]
            row[f"target_{key}_mode"] = best
    mode = row.get("target_step_mode")
    if mode and f"greedy_identical_{mode}" in row:
        row["greedy_identical"] = row[f"greedy_identical_{mode}"]
    if isinstance(row.get("target_step_ms"), float):
        row["step_over_floor"] = row["target_step_ms"] / row["floor_ms"]
        for key in ("step", "verify"):
            hf = row.get(f"hf_compiled_{key}_ms")
            if isinstance(hf, float) and isinstance(row.get(f"target_{key}_ms"), float):
                row[f"{key}_over_hf_compiled"] = row[f"target_{key}_ms"] / hf


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "engine_h200.json"))
    ap.add_argument("--merge", action="store_true", help="update rows/keys of an existing --out file")
    ap.add_argument("--git-sha", default=None)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--verify", type=int, default=16)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--greedy-tokens", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=512, help="the own engine's static cache length")
    ap.add_argument("--kv-block", type=int, default=256, help="attention bucket of the own engine")
    ap.add_argument("--long-context", type=int, default=1024, help="position of the long_context section's steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the code paths (no real figures)")
    ap.add_argument("--num-layers", type=int, default=0, help="smoke runs: fewer decoder layers")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="skip sections that would start after this")
    ap.add_argument("--linear-configs", default=None,
                    help="bench/linear_speed.py's report: its winners (config_all_m) become small_linear's table")
    args = ap.parse_args(argv)
    args.sections = set(args.sections.split(","))
    linear_table = register_linear_configs(args.linear_configs) if args.linear_configs else None
    global DEV
    DEV = args.device
    if DEV == "cuda" and not torch.cuda.is_available():
        print("engine_speed: needs a CUDA GPU", file=sys.stderr)
        return 2
    deadline = time.perf_counter() + args.deadline_s
    torch.backends.cuda.matmul.allow_tf32 = False
    out = Path(args.out)
    doc = json.loads(out.read_text()) if args.merge and out.is_file() else {"rows": {}}
    run_meta = {
        "script": "bench/engine_speed.py",
        "argv": sys.argv[1:] if argv is None else list(argv),
        "git_sha": args.git_sha,
        "gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (smoke run)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    args.bandwidth_gbs = read_bandwidth_gbs() if DEV == "cuda" else 100.0  # smoke runs: a placeholder
    run_meta["read_bandwidth_gbs"] = args.bandwidth_gbs
    run_meta["small_linear_configs"] = linear_table or "default_config (no --linear-configs)"
    print(f"read bandwidth {args.bandwidth_gbs:.0f} GB/s", flush=True)
    doc.setdefault("runs", []).append(run_meta)
    doc["description"] = ("fast target engine (domino_graft/fast) vs HF eager and HF StaticCache+torch.compile"
                          "(reduce-overhead); batch 1, bf16, random weights (seeded, std 0.02); ms are medians "
                          "of CUDA-event-timed forward+argmax; floor = weight bytes / measured read bandwidth")

    def save(name, row):
        old = dict(doc["rows"].get(name, {})) if args.merge else {}
        # a merge run adds sections; the row's set-up (and floor) stay those of the run that made it
        merged = {**old, **{k: v for k, v in row.items() if not (k in HEADER_KEYS and k in old)}}
        idx = len(doc["runs"]) - 1
        merged["runs"] = sorted(set(old.get("runs", [])) | {idx})  # indices into doc["runs"]
        merged["sections_by_run"] = {**old.get("sections_by_run", {}),
                                     str(idx): [k[:-2] for k in row if k[:-2] in SECTIONS and k.endswith("_s")]}
        headline(merged)
        doc["rows"][name] = merged
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")

    for name in args.rows.split(","):
        if time.perf_counter() > deadline:
            save(name, {"skipped": "deadline"})
            continue
        try:
            row = run_row(name, args, deadline, save)
        except Exception as e:
            traceback.print_exc()
            save(name, {"error": short_error(e)})
            continue
        keys = ("target_step_ms", "target_verify_ms", "floor_ms", "hf_compiled_step_ms", "hf_compiled_verify_ms",
                "hf_eager_step_ms", "greedy_identical")
        print(name, json.dumps({k: row.get(k) for k in keys}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
