"""`domino-graft replay [RUN] --responses FILE.jsonl`: the greedy τ decoding would measure, from
one teacher-forced forward per response (domino_graft.replay), with and without the head."""

from __future__ import annotations

import json
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
    from ..checkpoint import atomic_write_json
    from ..replay import replay
    from ..rundir import load_run, resolve_run
    from ..training.data import encode_record
    from .generate import pick_device

    for flag, value in (("--limit", args.limit), ("--max-tokens", args.max_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag}: {value} is invalid; valid: an integer >= 1")
    path = Path(args.responses)
    if not path.is_file():
        raise FileNotFoundError(f"--responses: {args.responses!r} does not exist; write one with `domino-graft regenerate`")
    run_dir = resolve_run(args.run)
    loaded = load_run(run_dir, device=pick_device(args.device))
    target = loaded.target
    eos = (target.shape.eos_token_ids or (None,))[0]
    examples = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if args.limit is not None and len(examples) >= args.limit:
                break
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"--responses: {path}:{n} is not JSON ({e.msg})") from None
            ex = encode_record(rec, target.tokenizer, chat=loaded.recipe.target.chat, eos_id=eos, where=f"{path}:{n}")
            if not any(ex.loss_mask):
                raise ValueError(f"--responses: {path}:{n} has no response tokens; each record needs the target's "
                                 "answer (messages ending with the assistant turn, or prompt+response)")
            examples.append(ex)
    if not examples:
        raise ValueError(f"--responses: {path} holds no records")
    res = replay(target, loaded.adapter, loaded.head, examples, max_anchors=args.max_tokens)
    print(f"{run_dir}: {res['sequences']} responses, greedy τ replayed: base {res['tau_base']:.3f}, "
          f"with the Domino head {res['tau_final']:.3f} (×{res['tau_final'] / res['tau_base']:.3f})")
    if args.json:
        atomic_write_json(Path(args.json), {"run": str(run_dir), "target": loaded.manifest.get("target"),
                                            "responses": str(path), "max_tokens": args.max_tokens, **res})
    return 0
