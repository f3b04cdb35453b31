"""`domino-graft serve` under load (issue #40, item 6): a request-rate sweep and a max-concurrency
sweep, in the manner of vLLM's benchmark_serving, with speculation on (drafter + Domino, the verify
budget on auto) and off (`serve --target-only`, the baseline), on the same prompts.

    python bench/serve_sweep.py --run WORK/graft --out bench/results/serve_sweep_h200.json \
        --num-prompts 64 --rates 4,16,64 --concurrency 1,8,32 --max-batch 32 --dtype bf16

(On the GPU image, which lacks FastAPI, uvicorn and httpx2: `bash experiments/serve_wheels.sh` here first,
then carry .whl/ and `source experiments/gpu_env.sh` there.)

For each mode a server is started on a free 127.0.0.1 port (`python -m domino_graft serve`), warmed
up untimed (every padded batch size once), then driven over HTTP by an asyncio client (httpx,
streamed /v1/completions with token-id prompts, greedy, `stream_options.include_usage`):

    rate R        the prompts in order, arrivals Poisson at R requests/s (seeded), all concurrent
    concurrency C the prompts in order, at most C in flight (a new one as soon as one ends)

Per sweep point: output tokens/s (all requests' completion tokens / the point's wall seconds),
requests/s, TTFT (first streamed token) and TPOT ((latency - TTFT) / (tokens - 1)) at p50 and p99,
in ms. identical_to_target: every greedy completion of the speculative server equals the target
server's completion of the same prompt at the same point, and every point's completions equal each
other's (a row's output does not depend on what else is in its batch).

A time limit (--deadline-s) stops before a point that would start past it; the report is rewritten
after every point, so a cut-off call leaves what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

MODES = ("target", "domino")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, mode: str, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "domino_graft", "serve", args.run, "--port", str(port), "--max-batch",
           str(args.max_batch), "--max-queue", str(max(64, 2 * args.num_prompts)), "--served-model-name", "m",
           "--log-level", "warning"]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    if args.rollout:
        cmd += ["--rollout", args.rollout]
    if args.max_model_len:  # the positions the servers' warm start reserves and captures for
        cmd += ["--max-model-len", str(args.max_model_len)]
    cmd += ["--admit-in-place", args.admit_in_place]  # both servers alike: the modes differ only in speculation
    cmd += ["--target-only"] if mode == "target" else ["--verify-budget", args.verify_budget]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)


async def wait_ready(client, base: str, proc: subprocess.Popen, timeout: float = 600.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            r = await client.get(f"{base}/health")
            if r.status_code == 200:
                return r.json()
        except Exception:  # not listening yet
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError("the server was not ready in time")


async def one(client, base: str, prompt: list[int], max_tokens: int) -> dict:
    """One streamed greedy completion: its text, completion tokens, TTFT and latency (s)."""
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, text, tokens = None, [], None
    async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    text.append(choice["text"])
    latency = time.perf_counter() - t0
    return {"text": "".join(text), "tokens": tokens, "ttft": ttft if ttft is not None else latency,
            "latency": latency}


async def by_rate(client, base, items, max_tokens, rate: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    tasks = []
    for ids in items:
        tasks.append(asyncio.create_task(one(client, base, ids, max_tokens)))
        await asyncio.sleep(rng.expovariate(rate))
    return list(await asyncio.gather(*tasks))


async def by_concurrency(client, base, items, max_tokens, c: int) -> list[dict]:
    gate = asyncio.Semaphore(c)

    async def gated(ids):
        async with gate:
            return await one(client, base, ids, max_tokens)

    return list(await asyncio.gather(*(gated(ids) for ids in items)))


def pct(xs: list[float], q: float):
    if not xs:
        return None
    xs = sorted(xs)
    return round(1e3 * xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))], 2)


def summarize(results: list[dict], wall: float) -> dict:
    ok = [r for r in results if "error" not in r]
    tokens = sum(r["tokens"] or 0 for r in ok)
    tpot = [(r["latency"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if (r["tokens"] or 0) > 1]
    ttft = [r["ttft"] for r in ok]
    return {"requests": len(results), "errors": len(results) - len(ok), "wall_s": round(wall, 3),
            "output_tokens": tokens, "output_tokens_per_s": round(tokens / wall, 1) if wall else None,
            "requests_per_s": round(len(ok) / wall, 3) if wall else None,
            "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
            "tpot_ms_p50": pct(tpot, 50), "tpot_ms_p99": pct(tpot, 99),
            "tpot_ms_mean": round(1e3 * statistics.fmean(tpot), 3) if tpot else None}


async def drive(args, mode: str, items: list[list[int]], report: dict, write, clock) -> dict:
    import httpx2 as httpx  # the openai client's HTTP library (the dev extra)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(args, mode, port, Path(args.out).with_suffix(f".{mode}.log"))
    texts: dict[str, list] = {}
    try:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
            t0 = time.perf_counter()
            health = await wait_ready(client, base, proc)
            # ready_s includes the server's own warm start (its seconds in /health's warm_start)
            report["servers"][mode] = {"health": health, "ready_s": round(time.perf_counter() - t0, 1),
                                       "server_warm_start_s": (health.get("warm_start") or {}).get("seconds")}
            t0 = time.perf_counter()
            n = 1
            # every padded batch size once, short and long prompts: kept from before the servers warmed
            # themselves up, and cheap; the points' shapes are the server's warm start's now
            while n <= args.max_batch:
                await by_concurrency(client, base, (sorted(items, key=len)[-n:] + items[:n])[: 2 * n],
                                     args.max_tokens, n)
                n *= 2
            report["servers"][mode]["warm_up_s"] = round(time.perf_counter() - t0, 1)
            points = [("rate", r) for r in args.rates] + [("concurrency", c) for c in args.concurrency]
            for kind, x in points:
                key = f"{kind}={x:g}"
                if clock():
                    report.setdefault("stopped", {})[mode] = f"deadline before {key}"
                    break
                t0 = time.perf_counter()
                if kind == "rate":
                    res = await by_rate(client, base, items, args.max_tokens, x, seed=args.seed)
                else:
                    res = await by_concurrency(client, base, items, args.max_tokens, int(x))
                wall = time.perf_counter() - t0
                row = {"mode": mode, "kind": kind, "x": x, **summarize(res, wall)}
                report["points"].append(row)
                texts[key] = [r.get("text") for r in res]
                write()
                print(f"{mode} {key}: {row['output_tokens_per_s']} tok/s, TPOT p50 {row['tpot_ms_p50']} ms, "
                      f"TTFT p99 {row['ttft_ms_p99']} ms", flush=True)
            health = (await client.get(f"{base}/health")).json()
            after = health.get("warm_start") or {}
            # graphs captured after the warm start (0: it covered every shape the points met) and whether the
            # reserved cache was kept
            report["servers"][mode]["after_points"] = {k: after.get(k) for k in ("graphs_since", "cache_kept")}
            report["servers"][mode]["batches"] = health.get("batches")
            metrics = await client.get(f"{base}/metrics")
            report["servers"][mode]["metrics_tail"] = [
                ln for ln in metrics.text.splitlines() if ln.startswith(("domino_graft_tau", "domino_graft_verify"))]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            report["servers"].setdefault(mode, {})["exit_code"] = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            report["servers"][mode]["exit_code"] = "killed"
    return texts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a run dir or bundle (the graft)")
    p.add_argument("--prompts", default=None, help="a prompts file (default: the GSM8K test questions)")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rates", default="4,16,64", help="requests/s, comma-separated (Poisson arrivals)")
    p.add_argument("--concurrency", default="1,8,32", help="max requests in flight, comma-separated")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="serve --max-model-len (default: the longest prompt + --max-tokens, what the points reach; "
                        "0: the target's own, every position warmed up)")
    p.add_argument("--verify-budget", default="auto")
    p.add_argument("--admit-in-place", default="auto", choices=("auto", "on", "off"),
                   help="the servers' --admit-in-place (auto: off on a GPU; docs/serving.md)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32", ""))
    p.add_argument("--rollout", default="triton", help="the Domino rollout kernel (serve --rollout; '' = the recipe's)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline-s", type=float, default=float("inf"))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    args.rates = [float(x) for x in args.rates.split(",") if x]
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x]
    modes = [m for m in args.modes.split(",") if m]

    from concurrency import read_items  # the GSM8K prompts bench/concurrency.py decodes

    from domino_graft.artifacts.files import atomic_write_json
    from domino_graft.loading import load_run_or_bundle

    start = time.monotonic()
    loaded = load_run_or_bundle(args.run, device="cpu")  # the tokenizer, for the prompts
    items = read_items(loaded, args.prompts, args.num_prompts)
    del loaded
    if args.max_model_len is None:
        args.max_model_len = max(len(ids) for ids in items) + args.max_tokens
    report = {
        "what": "domino-graft serve under load: Poisson arrival rates and max-concurrency, speculation (drafter + "
                "Domino, verify budget) against the target alone; greedy, streamed /v1/completions",
        "command": " ".join(["bench/serve_sweep.py", *(sys.argv[1:] if argv is None else argv)]),
        "git_sha": os.environ.get("DG_GIT_SHA"), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "run": args.run, "num_prompts": len(items), "max_tokens": args.max_tokens, "max_batch": args.max_batch,
        "max_model_len": args.max_model_len or None,
        "verify_budget": args.verify_budget, "admit_in_place": args.admit_in_place, "dtype": args.dtype, "rollout": args.rollout, "servers": {}, "points": [],
    }
    try:
        import torch

        report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        report["torch"] = torch.__version__
    except Exception:
        pass

    def write():
        atomic_write_json(Path(args.out), {**report, "elapsed_s": round(time.monotonic() - start, 1)})

    def over() -> bool:
        return time.monotonic() - start > args.deadline_s

    texts = {m: asyncio.run(drive(args, m, items, report, write, over)) for m in modes}
    if "target" in texts:
        ref = texts["target"]
        keys = list(ref)
        base = ref[keys[0]] if keys else None
        report["target_rows_equal_across_points"] = all(ref[k] == base for k in keys)
        for row in report["points"]:
            key = f"{row['kind']}={row['x']:g}"
            got = texts.get(row["mode"], {}).get(key)
            if row["mode"] != "target" and got is not None and key in ref:
                row["identical_to_target"] = got == ref[key]
    by = {(r["kind"], r["x"]): {} for r in report["points"]}
    for r in report["points"]:
        by[(r["kind"], r["x"])][r["mode"]] = r
    report["comparison"] = [
        {"kind": kind, "x": x, "target_tokens_per_s": m["target"]["output_tokens_per_s"],
         "domino_tokens_per_s": m["domino"]["output_tokens_per_s"],
         "throughput_ratio": round(m["domino"]["output_tokens_per_s"] / m["target"]["output_tokens_per_s"], 3),
         "target_tpot_ms_p50": m["target"]["tpot_ms_p50"], "domino_tpot_ms_p50": m["domino"]["tpot_ms_p50"],
         "target_ttft_ms_p99": m["target"]["ttft_ms_p99"], "domino_ttft_ms_p99": m["domino"]["ttft_ms_p99"],
         "identical_to_target": m["domino"].get("identical_to_target")}
        for (kind, x), m in by.items() if {"target", "domino"} <= set(m)]
    write()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
