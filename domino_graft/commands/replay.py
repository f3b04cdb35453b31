"""`domino-graft replay [RUN] --responses FILE.jsonl`: the greedy τ decoding would measure, from
one teacher-forced forward per response (domino_graft.replay), with and without the head."""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("run", nargs="?", metavar="RUN", help="run directory (default: the latest run)")
    p.add_argument("--responses", required=True, metavar="FILE.jsonl",
                   help="the target's own greedy responses (`domino-graft regenerate` output); held-out prompts "
                        "show what decoding will get, training ones how well the drafter fits")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="first N records")
    p.add_argument("--max-tokens", type=int, default=128, metavar="N",
                   help="response tokens replayed per record (like bench's --max-new-tokens)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--json", metavar="OUT.json", help="also write the result (with the run's identity) here")


def run(args) -> int:
    from ..progress import loading

    loading("replay")
    from ..artifacts.files import atomic_write_json
    from ..artifacts.rundir import resolve_run
    from ..device import pick_device
    from ..loading import load_run
    from ..replay import check_responses, read_responses, replay

    for flag, value in (("--limit", args.limit), ("--max-tokens", args.max_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag}: {value} is invalid; valid: an integer >= 1")
    check_responses(args.responses, limit=args.limit)  # a bad file fails before the model loads
    run_dir = resolve_run(args.run)
    loaded = load_run(run_dir, device=pick_device(args.device, option="--device"))
    target = loaded.target
    examples = read_responses(args.responses, target, chat=loaded.recipe.target.chat, limit=args.limit,
                              reserved=loaded.adapter.reserved_token_ids())
    res = replay(target, loaded.adapter, loaded.head, examples, max_anchors=args.max_tokens)
    print(f"{run_dir}: {res['sequences']} responses, greedy τ replayed: base {res['tau_base']:.3f}, "
          f"with the Domino head {res['tau_final']:.3f} (×{res['tau_final'] / res['tau_base']:.3f})")
    if args.json:
        atomic_write_json(Path(args.json), {"run": str(run_dir), "target": loaded.manifest.get("target"),
                                            "responses": args.responses, "max_tokens": args.max_tokens, **res})
    return 0
