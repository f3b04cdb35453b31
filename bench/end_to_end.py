"""End-to-end speculative decoding on the fast engine, over an equally fast baseline (issue #24):
the real SmolLM2-135M-Instruct target with the DFlash drafter the repository ships
(models/smollm2-135m-dflash/) and a Domino head grafted onto it (head-only training, backbone
frozen), on every GSM8K (100) and HumanEval (164) prompt.

    python bench/end_to_end.py --data WORK/train.regen.jsonl --work WORK --out end_to_end.json

Stages, in one process:
  graft   `apply` recipes/smollm2_graft.yaml onto the shipped drafter at the GPU head size
          (rank 256, the committed head-only setting: 500 steps x 32 sequences of the pipeline's
          regenerated responses, lr 1e-3), then `train` (skipped when WORK/graft is trained);
  decode  per dtype (--dtypes): the engine's default on a GPU (kv=auto: the fast target engine,
          static KV cache, torch.compile'd forward under CUDA graphs; DFlash's static drafter with
          its propose graphed; fused Triton rollout), three decodes per prompt, greedy: the target
          alone (the baseline), the base drafter, base + Domino. tokens/s include the prefill; the
          speculative outputs are compared token for token with the target alone's;
  hf      the reference a plain transformers user gets: HF StaticCache + torch.compile
          (reduce-overhead) greedy decoding of the first --hf-prompts prompts of each set.

Writes --out: `end_to_end` (per dtype, family, set: speedup_base, speedup_domino,
baseline_tokens_per_s, hf_compiled_tokens_per_s, tau_base, tau_domino, identical_to_target, the
per-prompt speedup spread) and WORK/records.jsonl (one line per decode). `--merge-into
engine_h200.json` copies the section into that report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRAFTER = REPO / "models" / "smollm2-135m-dflash"
SETS = ("gsm8k", "humaneval")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def graft(work: Path, data: Path, steps: int, device: str) -> dict:
    from domino_graft.apply import apply_recipe
    from domino_graft.training.loop import train

    run = work / "graft"
    n = sum(1 for _ in data.open())
    overrides = [f"device={device}", f"drafter.path={DRAFTER}", "head.rank=256", f"train.data.path={data}",
                 f"train.data.num_samples={n}", "train.data.max_length=512", "train.batch_size=32",
                 "train.anchors_per_seq=32", f"train.max_steps={steps}", f"train.save_every={steps}",
                 "train.features=online", "train.lr=1e-3", "train.warmup_steps=10", "train.keep_last=1"]
    summary = work / "training_graft.json"
    if summary.exists():
        return json.loads(summary.read_text())
    if not (run / "manifest.json").exists():
        apply_recipe("smollm2_graft", str(run), overrides=overrides, echo=lambda *_: None)
    t0 = time.time()
    train(str(run), progress=False, echo=lambda m: log(f"graft: {m}"))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    out = {"recipe": "recipes/smollm2_graft.yaml", "overrides": overrides, "steps": metrics[-1]["step"],
           "seconds": round(time.time() - t0, 1),
           "last_step_metrics": {k: metrics[-1][k] for k in ("loss", "tau_base", "tau_final") if k in metrics[-1]}}
    summary.write_text(json.dumps(out, indent=1))
    return out


def prompts(loaded, limit):
    from domino_graft.assets import asset_dir
    from domino_graft.benchmark import encode, read_prompts

    return [(s, i, encode(loaded, item)) for s in SETS
            for i, item in enumerate(read_prompts(str(asset_dir(s) / "prompts.jsonl"), limit=limit))]


def warm_up_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """The longest prompt, then the longest of each other padded prefill length: decoding these
    compiles and captures every prefill shape the timed prompts meet."""
    from domino_graft.fast import prefill_length

    longest: dict[int, list[int]] = {}
    for ids in sorted(prompts, key=len):
        longest[prefill_length(len(ids), 1 << 30)] = ids
    return sorted(longest.values(), key=len, reverse=True)


def decode(run: Path, dtype: str, items_limit, max_new: int, records, device: str) -> list[dict]:
    import torch

    from domino_graft.decoding import Engine
    from domino_graft.decoding.chat import stop_token_ids
    from domino_graft.loading import load_run

    loaded = load_run(run, device=device)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    loaded.target.model.to(dt)
    loaded.adapter.to(dt)
    loaded.head.to(dt)
    engine = Engine(loaded.target, loaded.adapter, loaded.head, rollout="triton" if device == "cuda" else "torch", stop_ids=stop_token_ids(loaded.target))
    items = prompts(loaded, items_limit)
    # one-off costs out of the timings: compile + capture every shape a prompt reaches, the
    # longest first (caches sized for it, so no later prompt re-sizes them), then the longest
    # of each padded prefill length (fast.prefill_length) with its attention buckets
    t0 = time.time()
    for ids in warm_up_prompts([t[2] for t in items]):
        for use_head in (None, False, True):
            for n_new in (max_new, 8):
                if use_head is None:
                    engine.target_only(ids, max_new_tokens=n_new)
                else:
                    engine.speculative(ids, max_new_tokens=n_new, use_head=use_head)
    if device == "cuda":
        torch.cuda.synchronize()
    log(f"{dtype}: warm-up (compile, graph capture) {time.time() - t0:.0f} s; kv_path {engine.kv_path}")
    rows = []
    for s, i, ids in items:
        ref = engine.target_only(ids, max_new_tokens=max_new)
        rec = {"dtype": dtype, "set": s, "idx": i, "prompt_tokens": len(ids),
               "target": {"tokens": len(ref.tokens), "seconds": ref.seconds, "kv_path": ref.kv_path}}
        for mode, use_head in (("base", False), ("domino", True)):
            r = engine.speculative(ids, max_new_tokens=max_new, use_head=use_head)
            rec[mode] = {"tokens": len(r.tokens), "seconds": r.seconds, "tau": r.tau, "steps": len(r.accepted),
                         "step_tokens": sum(a + 1 for a in r.accepted), "identical": r.tokens == ref.tokens,
                         "kv_path": r.kv_path}
        rows.append(rec)
        records.write(json.dumps(rec) + "\n")
        records.flush()
    log(f"{dtype}: {len(rows)} prompts decoded")
    del engine, loaded
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def hf_compiled(run: Path, dtype: str, limit: int, max_new: int) -> dict:
    """Greedy tokens/s of HF StaticCache + torch.compile(reduce-overhead), prefill included."""
    import torch
    from transformers import StaticCache

    from domino_graft.decoding.chat import stop_token_ids
    from domino_graft.loading import load_run

    loaded = load_run(run, device="cuda")
    model = loaded.target.model.to({"bf16": torch.bfloat16, "fp32": torch.float32}[dtype])
    stops = set(stop_token_ids(loaded.target))
    items = prompts(loaded, limit)
    max_len = max(len(ids) for _, _, ids in items) + max_new + 8
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True, dynamic=False)

    def run_one(ids):
        cache.reset()
        x = torch.tensor([ids], device="cuda")
        n = x.shape[1]
        with torch.no_grad():
            out = model(x, past_key_values=cache, cache_position=torch.arange(n, device="cuda"), use_cache=True)
            tok = out.logits[:, -1].argmax(-1)
            toks = [int(tok)]
            for p in range(n, n + max_new - 1):
                if toks[-1] in stops:
                    break
                torch.compiler.cudagraph_mark_step_begin()
                out = step(tok[:, None], past_key_values=cache, cache_position=torch.tensor([p], device="cuda"),
                           use_cache=True)
                tok = out.logits[:, -1].argmax(-1)
                toks.append(int(tok))
        return toks

    t0 = time.time()
    for _ in range(3):
        run_one(items[0][2])
    compile_s = time.time() - t0
    per_set = {}
    for s in SETS:
        tokens = seconds = 0
        for _, _, ids in [t for t in items if t[0] == s]:
            t1 = time.perf_counter()
            tokens += len(run_one(ids))
            seconds += time.perf_counter() - t1
        per_set[s] = {"tokens_per_s": tokens / seconds, "prompts": sum(t[0] == s for t in items)}
    return {"compile_s": round(compile_s, 1), "per_set": per_set}


def summarize(rows: list[dict], hf: dict | None) -> dict:
    out = {}
    for s in SETS:
        rs = [r for r in rows if r["set"] == s]
        if not rs:
            continue

        def rate(mode):
            return sum(r[mode]["tokens"] for r in rs) / sum(r[mode]["seconds"] for r in rs)

        def tau(mode):
            return sum(r[mode]["step_tokens"] for r in rs) / sum(r[mode]["steps"] for r in rs)

        spread = {}
        for mode in ("base", "domino"):
            ratios = sorted((r[mode]["tokens"] / r[mode]["seconds"]) / (r["target"]["tokens"] / r["target"]["seconds"])
                            for r in rs)
            q = statistics.quantiles(ratios, n=10) if len(ratios) >= 10 else [min(ratios)] * 9
            spread[mode] = {"median": statistics.median(ratios), "p10": q[0], "p90": q[-1]}
        base_rate = rate("target")
        entry = {
            "speedup_base": rate("base") / base_rate,
            "speedup_domino": rate("domino") / base_rate,
            "baseline_tokens_per_s": base_rate,
            "base_tokens_per_s": rate("base"),
            "domino_tokens_per_s": rate("domino"),
            "tau_base": tau("base"),
            "tau_domino": tau("domino"),
            "identical_to_target": all(r[m]["identical"] for r in rs for m in ("base", "domino")),
            "prompts_not_identical": {m: sum(not r[m]["identical"] for r in rs) for m in ("base", "domino")},
            "num_prompts": len(rs),
            "per_prompt_speedup": spread,
            "kv_path": sorted({r[m]["kv_path"] for r in rs for m in ("target", "base", "domino")}),
        }
        if hf and s in hf["per_set"]:
            entry["hf_compiled_tokens_per_s"] = hf["per_set"][s]["tokens_per_s"]
            entry["hf_compiled_prompts"] = hf["per_set"][s]["prompts"]
        out[s] = entry
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("bench/work/end_to_end"))
    p.add_argument("--data", type=Path, help="the pipeline's regenerated responses (train.regen.jsonl)")
    p.add_argument("--head-steps", type=int, default=500)
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--max-per-set", type=int, default=None, help="first N prompts of each set (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--hf-prompts", type=int, default=16, help="prompts per set for the HF compiled reference")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the mechanics (numbers meaningless)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--merge-into", type=Path, default=None, help="add the result as `end_to_end` to this report")
    args = p.parse_args()
    if args.merge_into is not None:
        if args.out is None:
            p.error("--merge-into needs --out: the end-to-end result to merge")
        report = json.loads(args.merge_into.read_text())
        report["end_to_end"] = json.loads(args.out.read_text())
        args.merge_into.write_text(json.dumps(report, indent=2) + "\n")
        print(f"merged {args.out} into {args.merge_into}")
        return 0
    import torch

    from domino_graft.artifacts.provenance import git_sha, hardware, versions

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: losslessness is compared token for token
    args.work.mkdir(parents=True, exist_ok=True)
    training = graft(args.work, args.data, args.head_steps, args.device)
    log(f"graft: {training}")
    shipped = json.loads((DRAFTER / "training.json").read_text())
    result = {
        "what": "real SmolLM2-135M-Instruct target, the shipped DFlash drafter (models/smollm2-135m-dflash) and a "
                "Domino head grafted onto it (head-only); batch 1, greedy, the engine's GPU default (kv=auto: fast "
                "target engine with static KV cache, compiled forward and CUDA graphs; DFlash static drafter with "
                "graphed propose; fused Triton rollout); baseline = the target alone on the same engine",
        "drafter": {"path": "models/smollm2-135m-dflash", "sha256": shipped["model_sha256"]},
        "head_training": training,
        "max_new_tokens": args.max_new_tokens,
        "dtypes": {},
        "hardware": hardware(), "versions": versions(), "git_sha": git_sha(), "command": " ".join(sys.argv),
    }
    out = args.out or args.work / "end_to_end.json"
    with (args.work / "records.jsonl").open("a") as records:
        for dtype in [d for d in args.dtypes.split(",") if d]:
            hf = None
            try:
                if args.hf_prompts > 0:
                        hf = hf_compiled(args.work / "graft", dtype, args.hf_prompts, args.max_new_tokens)
            except Exception as e:  # the reference must not cost the measurement itself
                log(f"{dtype}: HF compiled reference failed: {type(e).__name__}: {e}")
            rows = decode(args.work / "graft", dtype, args.max_per_set, args.max_new_tokens, records, args.device)
            result["dtypes"][dtype] = {"dflash": summarize(rows, hf), "hf_compiled": hf}
            out.write_text(json.dumps(result, indent=2) + "\n")
            log(f"{dtype}: {json.dumps(result['dtypes'][dtype]['dflash'])[:900]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
