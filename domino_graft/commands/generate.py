"""`domino-graft generate [RUN_OR_BUNDLE] --prompt TEXT`: stream speculative decoding to stdout.

Several prompts (`--prompt A --prompt B`, `--prompt-ids` repeated, or `--prompts FILE.jsonl`)
print one labelled answer each ("[1] ...", or "[ID] ..." for a file line with an "id"). With
`--batch-size N` they decode N at a time as one batch (Engine.*_batch, decoding/batched.py),
each answer printed when its batch ends; with N = 1 (the default) each is streamed in turn. One
prompt streams exactly as before, unlabelled. Sampling seeds: the decode of prompts i.. (0-based,
its first prompt) uses seed + i, so a rerun with the same batch size reproduces every answer.
"""

from __future__ import annotations

import sys


def add_arguments(p) -> None:
    p.add_argument("run", nargs="?", metavar="RUN_OR_BUNDLE", help="run dir or bundle (default: the latest run)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", action="append",
                     help="user message (chat template applied unless --raw); repeat for several prompts")
    src.add_argument("--prompt-ids", metavar="IDS", action="append",
                     help="token ids, comma or space separated (tokenizer-less targets); repeatable")
    src.add_argument("--prompts", metavar="FILE.jsonl",
                     help="one prompt per line: {\"prompt\": ...} | {\"messages\": [...]} | {\"prompt_ids\": [...]}")
    p.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="decode N prompts at a time as one batch (chain drafters that take ragged batches; default 1: "
                        "one after another)")
    p.add_argument("--verify-budget", default="full", metavar="{full,auto,N}",
                   help="drafts verified per batched step: full (all K, default), N, or auto (by measured costs)")
    p.add_argument("--verify-costs", metavar="FILE.json", help="costs for --verify-budget auto (needed off CUDA)")
    p.add_argument("--raw", action="store_true", help="tokenize the prompt as is, without the chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, help="sampling seed (default: fresh entropy)")
    p.add_argument("--no-head", action="store_true", help="base drafter only (Domino head off)")
    p.add_argument("--target-only", action="store_true", help="no speculation: the target alone (the baseline)")
    p.add_argument("--stop-id", type=int, action="append", default=[], metavar="ID",
                   help="extra stop token id (repeatable); the target's eos ids always stop")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--kv", default="auto", choices=("auto", "dynamic", "static"),
                   help="target KV cache: auto (default: static on a CUDA device, dynamic elsewhere), dynamic "
                        "(HF forward and DynamicCache) or static (the fast engine where the target supports it, "
                        "else dynamic)")
    p.add_argument("--rollout", default=None,
                   help="rollout implementation: torch or a kernel rollout (triton, triton_pool); default: recipe bench.head_kernel")


def _parse_ids(text: str, where: str = "--prompt-ids") -> list[int]:
    from ..inputs import short

    parts = text.replace(",", " ").split()
    if not parts:
        raise ValueError(f"{where}: {short(text)} holds no ids; valid: integers separated by commas or spaces")
    for n, x in enumerate(parts):
        if not (x.isascii() and x.isdigit()):
            raise ValueError(f"{where}: id {n + 1}, {short(x)}, is not a token id; valid: integers >= 0 "
                             "separated by commas or spaces, e.g. \"5 9 12 7\"")
    return [int(x) for x in parts]


class _Streamer:
    """Prints text as tokens arrive; holds back an incomplete UTF-8 character."""

    def __init__(self, target, out=None):
        self.target = target
        self.out = out if out is not None else sys.stdout  # looked up now: callers may redirect it
        self.ids: list[int] = []
        self.printed = 0

    def __call__(self, new: list[int]) -> None:
        from ..decoding import decode_text

        self.ids.extend(new)
        if self.target.tokenizer is None:
            self.out.write("".join(f"{i} " for i in new))
        else:
            text = decode_text(self.target, self.ids)
            if text.endswith("\ufffd"):
                return
            self.out.write(text[self.printed:])
            self.printed = len(text)
        self.out.flush()

    def close(self) -> None:
        if self.target.tokenizer is not None:
            from ..decoding import decode_text

            self.out.write(decode_text(self.target, self.ids)[self.printed:])
        self.out.write("\n")
        self.out.flush()


def _sources(args) -> list[dict]:
    """The prompts as records {"prompt" | "messages" | "prompt_ids", "raw", "where", "label"}."""
    if args.prompts is not None:
        from ..benchmark import read_prompts

        return [{**{k: rec[k] for k in ("prompt", "messages", "prompt_ids") if k in rec},
                 "raw": bool(rec.get("raw", args.raw)), "where": f"--prompts {rec['source']}",
                 "label": str(rec.get("id", n + 1))} for n, rec in enumerate(read_prompts(args.prompts))]
    flag, key, values = (("--prompt", "prompt", args.prompt) if args.prompt is not None
                         else ("--prompt-ids", "prompt_ids", args.prompt_ids))
    out = []
    for n, v in enumerate(values):
        where = flag if len(values) == 1 else f"{flag} #{n + 1}"
        out.append({key: _parse_ids(v, where) if key == "prompt_ids" else v, "raw": args.raw, "where": where,
                    "label": str(n + 1)})
    return out


def _report(res, mode: str, label: str = "", seconds=None) -> None:
    """One decode's summary line on stderr; `seconds`: a batch's wall time (the rate is then its total)."""
    secs = res.seconds if seconds is None else seconds
    tps = len(res.tokens) / secs if secs > 0 else float("nan")
    tau = "-" if res.tau is None else f"{res.tau:.2f}"
    print(f"{label}tau {tau} ({mode}): {len(res.tokens)} tokens, {res.target_forwards} target forwards, "
          f"{tps:.1f} tokens/s, stopped by {res.stop_reason}, kv {res.kv_path}", file=sys.stderr)


def run(args) -> int:
    from ..progress import loading

    loading("generate")
    from ..decoding import Engine, Sampling, check_rollout_name, encode_prompt, rollout_choice, stop_token_ids
    from ..decoding.budget import budget_option
    from ..device import pick_device
    from ..loading import load_run_or_bundle

    sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    if args.max_new_tokens < 1:  # before minutes of loading
        raise ValueError(f"--max-new-tokens: {args.max_new_tokens!r} is invalid; valid: an integer >= 1")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size: {args.batch_size!r} is invalid; valid: an integer >= 1")
    budget = budget_option(args.verify_budget, args.verify_costs, args.batch_size)
    sources = _sources(args)  # bad ids or a bad prompt file fail before the models load
    if args.rollout is not None:
        check_rollout_name(args.rollout)  # before minutes of loading
    loaded = load_run_or_bundle(args.run, device=pick_device(args.device, option="--device"))
    target = loaded.target
    reserved = stop_token_ids(target)
    encoded = [encode_prompt(
        target,
        prompt=src.get("prompt"),
        messages=src.get("messages"),
        prompt_ids=src.get("prompt_ids"),
        raw=src["raw"],
        chat=loaded.recipe.target.chat,
        reserved=reserved | loaded.adapter.reserved_token_ids(),
        placeholders=loaded.adapter.reserved_token_ids(),
        max_new_tokens=args.max_new_tokens,
        where=src["where"],
    ) for src in sources]
    if target.tokenizer is None:
        for src, ids in zip(sources, encoded):
            if src.get("prompt_ids") is None:
                what = "the prompt" if len(sources) == 1 else src["where"]
                print(f"note: this target has no tokenizer; {what} was mapped to ids by byte fallback: {ids}",
                      file=sys.stderr)
    engine = Engine(target, loaded.adapter, loaded.head, rollout=rollout_choice(loaded.recipe.bench, args.rollout),
                    stop_ids=stop_token_ids(target, args.stop_id), kv=args.kv)
    if budget is not None:
        budget.check(loaded.adapter.num_slots, str(target.device).split(":")[0])  # before any decode
    mode = "target alone" if args.target_only else ("base drafter" if args.no_head else "domino drafter")
    kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling)
    if len(encoded) == 1 and (budget is None or args.batch_size == 1):  # one prompt: streamed, unlabelled
        stream = _Streamer(target)
        if args.target_only:
            res = engine.target_only(encoded[0], on_tokens=stream, **kw)
        else:
            res = engine.speculative(encoded[0], use_head=not args.no_head, on_tokens=stream, budget=budget, **kw)
        stream.close()
        _report(res, mode)
        return 0
    labels = [f"[{src['label']}] " for src in sources]
    if args.batch_size == 1:
        for i, (ids, label) in enumerate(zip(encoded, labels)):
            stream = _Streamer(target)
            stream.out.write(label)
            if args.target_only:
                res = engine.target_only(ids, on_tokens=stream, seed_offset=i, **kw)
            else:
                res = engine.speculative(ids, use_head=not args.no_head, on_tokens=stream, seed_offset=i,
                                         budget=budget, **kw)
            stream.close()
            _report(res, mode, label)
        return 0
    import time

    for start in range(0, len(encoded), args.batch_size):
        chunk = encoded[start: start + args.batch_size]
        t0 = time.perf_counter()
        if args.target_only:
            results = engine.target_only_batch(chunk, seed_offset=start, **kw)
        else:
            results = engine.speculative_batch(chunk, use_head=not args.no_head, seed_offset=start, budget=budget,
                                               **kw)
        wall = time.perf_counter() - t0
        for res, label in zip(results, labels[start:]):
            stream = _Streamer(target)
            stream.out.write(label)
            stream(res.tokens)
            stream.close()
            _report(res, mode, label)
        total = sum(len(r.tokens) for r in results)
        chosen = "" if budget is None or args.target_only else f", verify budget K': steps {engine.last_budget['k_hist']}"
        print(f"batch of {len(chunk)} (prompts {start + 1}..{start + len(chunk)}): {total} tokens in {wall:.2f} s, "
              f"{total / wall if wall > 0 else float('nan'):.1f} tokens/s in total{chosen}", file=sys.stderr)
    return 0
