"""`domino-graft train [RUN] [--max-steps N] [--save-every N] [--resume] [KEY=VALUE ...]`.

Multi-GPU: `torchrun --nproc-per-node N -m domino_graft train RUN` (FSDP2).
"""

from __future__ import annotations


def allow_intermixed(p) -> None:
    """Let `RUN --flag KEY=VALUE` parse: plain argparse fills positionals from one contiguous
    run of arguments, so overrides after a flag would be 'unrecognized'. The parent parser calls
    this sub-parser's parse_known_args; route it through the intermixed variant (which itself
    calls parse_known_args, hence the guard)."""
    plain = p.parse_known_args

    def parse_known_args(args=None, namespace=None):
        if getattr(p, "_intermixing", False):
            return plain(args, namespace)
        p._intermixing = True
        try:
            return p.parse_known_intermixed_args(args, namespace)
        finally:
            p._intermixing = False

    p.parse_known_args = parse_known_args


def add_arguments(p) -> None:
    allow_intermixed(p)
    p.add_argument("--max-steps", type=int, metavar="N", help="override train.max_steps")
    p.add_argument("--save-every", type=int, metavar="N", help="checkpoint every N steps (override train.save_every)")
    p.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    # One positional list: argparse cannot match `RUN --flag KEY=VALUE` to two positionals.
    p.add_argument("items", nargs="*", metavar="[RUN] [KEY=VALUE ...]",
                   help="run directory (default: the most recent one), then train.* overrides, re-validated (a relative path in an override is taken from the current directory)")


def split_run_and_overrides(items: list[str], name: str) -> tuple[str | None, list[str]]:
    """[RUN] KEY=VALUE ... -> (RUN or None, overrides): a path never holds '='."""
    paths = [x for x in items if "=" not in x]
    if len(paths) > 1:
        raise ValueError(f"{name}: give one (got {', '.join(map(repr, paths))}); overrides look like key=value")
    return (paths[0] if paths else None), [x for x in items if "=" in x]


def run(args) -> int:
    from ..progress import loading

    loading("train")
    from ..training.loop import train

    run_dir, overrides = split_run_and_overrides(args.items, "RUN")
    train(run_dir, overrides, max_steps=args.max_steps, save_every=args.save_every, resume=args.resume,
          progress=not args.no_progress)
    return 0
