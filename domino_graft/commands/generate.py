"""`domino-graft generate [RUN_OR_BUNDLE] --prompt TEXT`: stream speculative decoding to stdout."""

from __future__ import annotations

import sys


def add_arguments(p) -> None:
    p.add_argument("run", nargs="?", metavar="RUN_OR_BUNDLE", help="run dir or bundle (default: the latest run)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="user message (chat template applied unless --raw)")
    src.add_argument("--prompt-ids", metavar="IDS", help="token ids, comma or space separated (tokenizer-less targets)")
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


def _parse_ids(text: str) -> list[int]:
    from ..inputs import short

    parts = text.replace(",", " ").split()
    if not parts:
        raise ValueError(f"--prompt-ids: {short(text)} holds no ids; valid: integers separated by commas or spaces")
    for n, x in enumerate(parts):
        if not (x.isascii() and x.isdigit()):
            raise ValueError(f"--prompt-ids: id {n + 1}, {short(x)}, is not a token id; valid: integers >= 0 "
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


def run(args) -> int:
    from ..progress import loading

    loading("generate")
    from ..decoding import Engine, Sampling, check_rollout_name, encode_prompt, rollout_choice, stop_token_ids
    from ..device import pick_device
    from ..loading import load_run_or_bundle

    sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    if args.max_new_tokens < 1:  # before minutes of loading
        raise ValueError(f"--max-new-tokens: {args.max_new_tokens!r} is invalid; valid: an integer >= 1")
    prompt_ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    if args.rollout is not None:
        check_rollout_name(args.rollout)  # before minutes of loading
    loaded = load_run_or_bundle(args.run, device=pick_device(args.device, option="--device"))
    target = loaded.target
    reserved = stop_token_ids(target)
    prompt_ids = encode_prompt(
        target,
        prompt=args.prompt,
        prompt_ids=prompt_ids,
        raw=args.raw,
        chat=loaded.recipe.target.chat,
        reserved=reserved | loaded.adapter.reserved_token_ids(),
        placeholders=loaded.adapter.reserved_token_ids(),
        max_new_tokens=args.max_new_tokens,
        where="--prompt" if args.prompt is not None else "--prompt-ids",
    )
    if target.tokenizer is None and args.prompt is not None:
        print(f"note: this target has no tokenizer; the prompt was mapped to ids by byte fallback: {prompt_ids}",
              file=sys.stderr)
    engine = Engine(target, loaded.adapter, loaded.head, rollout=rollout_choice(loaded.recipe.bench, args.rollout),
                    stop_ids=stop_token_ids(target, args.stop_id), kv=args.kv)
    stream = _Streamer(target)
    kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, on_tokens=stream)
    if args.target_only:
        res = engine.target_only(prompt_ids, **kw)
    else:
        res = engine.speculative(prompt_ids, use_head=not args.no_head, **kw)
    stream.close()
    tps = len(res.tokens) / res.seconds if res.seconds > 0 else float("nan")
    tau = "-" if res.tau is None else f"{res.tau:.2f}"
    mode = "target alone" if args.target_only else ("base drafter" if args.no_head else "domino drafter")
    print(f"tau {tau} ({mode}): {len(res.tokens)} tokens, {res.target_forwards} target forwards, "
          f"{tps:.1f} tokens/s, stopped by {res.stop_reason}, kv {res.kv_path}", file=sys.stderr)
    return 0
