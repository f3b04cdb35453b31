"""`domino-graft bench [RUN_OR_BUNDLE] --prompts FILE.jsonl ...`: target alone vs base vs Domino."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("run", nargs="?", metavar="RUN_OR_BUNDLE", help="run dir or bundle (default: the latest run)")
    p.add_argument("--prompts", metavar="FILE.jsonl",
                   help='one JSON object per line: {"prompt": ...}, {"messages": [...]} or {"prompt_ids": [...]} '
                        "(default: recipe bench.prompts; random id prompts for tokenizer-less targets)")
    p.add_argument("--max-new-tokens", type=int, help="default: recipe bench.max_new_tokens")
    p.add_argument("--temperature", type=float, help="0 = greedy (default: recipe bench.temperature)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, help="default: recipe bench.seed")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N prompts")
    p.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="decode N prompts at a time (greedy chains; tokens/s are then the batch's total, with "
                        "per-request tokens/s beside them); default 1")
    p.add_argument("--verify-budget", default="full", metavar="{full,auto,N}",
                   help="drafts verified per batched step: full (all K, default), N, or auto (by measured costs); "
                        "the report's verify_budget counts the K' chosen by batch size")
    p.add_argument("--verify-costs", metavar="FILE.json", help="costs for --verify-budget auto (needed off CUDA)")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON (atomically); never over another file, "
                   "nor over an earlier bench report without --force")
    p.add_argument("--force", action="store_true", help="--json may replace an existing bench report")
    p.add_argument("--plot", metavar="PNG", help="plot acceptance by slot, base vs Domino (needs matplotlib)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--rollout", default=None,
                   help="rollout implementation: torch or a kernel rollout (triton, triton_pool); default: recipe bench.head_kernel")
    p.add_argument("--engine", choices=("sglang",), help="measure tau as that engine serves the drafter: sglang = "
                   "its Domino runtime's candidates (the triton_pool rollout with block_shared pools of bench.pool_size, "
                   "SGLang's --speculative-domino-candidate-pool-size), greedy only, families SGLang serves")
    p.add_argument("--kv", default="auto", choices=("auto", "dynamic", "static"),
                   help="target KV cache: auto (default: static on a CUDA device, dynamic elsewhere), dynamic "
                        "(HF forward and DynamicCache) or static (the fast engine where the target supports it, "
                        "else dynamic; the report's kv_path says which ran)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (off a terminal, no progress lines: one every DOMINO_GRAFT_PROGRESS_S "
                        "seconds, default 15)")


BENCH_REPORT_KEYS = ("tau", "per_slot_acceptance", "identical_to_target")


def is_bench_report(path) -> bool:
    """A JSON file `bench --json` wrote (its report's headline keys)."""
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(k in data for k in BENCH_REPORT_KEYS)


def check_json_destination(path, force: bool) -> None:
    from ..artifacts.destination import check_destination

    check_destination(path, kind="bench report", option="--json", force=force, is_kind=is_bench_report)


def engine_rollout(loaded, engine: str, override) -> dict:
    """The rollout that drafts what `engine` drafts: SGLang's block-shared candidate pool."""
    from ..export.engine_rules import ENGINE_NAMES, engine_spec
    from ..registry import get_family

    family = get_family(loaded.recipe.drafter.family)
    spec = engine_spec(family, engine)
    if spec.refused:
        raise ValueError(f"bench --engine {engine}: {ENGINE_NAMES[engine]} cannot serve {family.display_name} "
                         f"drafters: {spec.refused}")
    if override not in (None, "triton_pool"):
        raise ValueError(f"bench: --rollout {override} contradicts --engine {engine}, which drafts with triton_pool "
                         "and block_shared candidates; give one of them")
    return {"name": "triton_pool", "pool_size": loaded.recipe.bench.pool_size, "pool_select": "block_shared"}


def run(args) -> int:
    from ..progress import loading

    loading("bench")
    from ..artifacts.files import atomic_write_json
    from ..benchmark import (check_plot_available, format_report, plot_acceptance, read_prompts, resolve_prompts,
                             run_bench)
    from ..decoding import Sampling, check_rollout_name, rollout_choice
    from ..decoding.budget import budget_option
    from ..device import pick_device
    from ..loading import load_run_or_bundle

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit: {args.limit!r} is invalid; valid: an integer >= 1")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size: {args.batch_size!r} is invalid; valid: an integer >= 1")
    budget = budget_option(args.verify_budget, args.verify_costs, args.batch_size)
    if args.json:
        check_json_destination(args.json, args.force)  # before minutes of decoding, not after
    if args.plot:
        check_plot_available()  # fail before minutes of decoding, not after
    if args.rollout is not None:
        check_rollout_name(args.rollout)  # before minutes of loading
    if args.prompts:
        read_prompts(args.prompts, limit=args.limit)  # a bad prompt file fails before the models load
    if args.engine and args.temperature:  # SGLang's Domino runtime drafts greedily (dflash_utils.py)
        raise ValueError(f"--temperature: {args.temperature!r} with --engine {args.engine}: its Domino runtime is "
                         "greedy only; valid: 0")
    loaded = load_run_or_bundle(args.run, device=pick_device(args.device, option="--device"))
    b = loaded.recipe.bench
    rollout = rollout_choice(b, args.rollout)
    if args.engine:
        rollout = engine_rollout(loaded, args.engine, args.rollout)
    seed = b.seed if args.seed is None else args.seed
    sampling = Sampling(
        temperature=b.temperature if args.temperature is None else args.temperature,
        top_k=args.top_k, top_p=args.top_p, seed=seed,
    )
    max_new = b.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    if max_new < 1:
        raise ValueError(f"--max-new-tokens: {max_new!r} is invalid; valid: an integer >= 1")
    prompts = resolve_prompts(loaded, args.prompts, seed=seed, limit=args.limit)
    report = run_bench(loaded, prompts, max_new_tokens=max_new, sampling=sampling, rollout=rollout,
                       progress=not args.no_progress, kv=args.kv, batch_size=args.batch_size, verify_budget=budget)
    print(format_report(report))
    if args.json:
        check_json_destination(args.json, args.force)  # again: the decode took a while
        atomic_write_json(args.json, report)
        print(f"wrote {args.json}")
    if args.plot:
        plot_acceptance(report, args.plot)
        print(f"wrote {args.plot}")
    return 0
