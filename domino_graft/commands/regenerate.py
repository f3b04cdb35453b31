"""`domino-graft regenerate RUN_OR_RECIPE --prompts FILE.jsonl -o OUT.jsonl [--max-new-tokens N] [--batch-size B]`."""

from __future__ import annotations


def add_arguments(p) -> None:
    from .train import allow_intermixed

    allow_intermixed(p)
    p.add_argument("--prompts", required=True, metavar="FILE.jsonl", help="messages | prompt | prompt_ids per line")
    p.add_argument("-o", "--out", required=True, metavar="OUT.jsonl", help="appended to; ids already there are skipped "
                   "(only ever an earlier regenerate output: anything else there is refused)")
    p.add_argument("--force", action="store_true", help="regenerate every prompt, replacing an earlier OUT.jsonl "
                   "once complete")
    p.add_argument("--max-new-tokens", type=int, default=256, metavar="N")
    p.add_argument("--batch-size", type=int, default=8, metavar="B")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("items", nargs="*", metavar="[RUN_OR_RECIPE] [KEY=VALUE ...]",
                   help="a run directory or a recipe YAML (default: the most recent run; only its target is loaded), "
                        "then recipe overrides (e.g. device=cpu), re-validated")


def run(args) -> int:
    from ..progress import loading

    loading("regenerate", "the target")
    from ..training.regenerate import regenerate
    from .train import split_run_and_overrides

    source, overrides = split_run_and_overrides(args.items, "RUN_OR_RECIPE")
    regenerate(source, args.prompts, args.out, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
               overrides=overrides, progress=not args.no_progress, force=args.force)
    return 0
