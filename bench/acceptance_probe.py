"""Offline acceptance of several trained runs on several response sets (domino_graft.replay):
greedy decoding replayed from teacher-forced training blocks on the target's own responses,
for the base proposals and the Domino-corrected ones, without decoding.

Run it on training responses and on held-out responses of the evaluation prompts: a gap between
the two is generalisation; a gap between the held-out figure and the decoded τ of
`bench/smollm2_pipeline.py` would be an inference mismatch.

    python bench/acceptance_probe.py --runs WORK/dflash_base,WORK/dflash_domino \\
        --data train=WORK/train.regen.jsonl --data gsm8k=gsm8k.regen.jsonl --limit 40 --out probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from domino_graft.replay import read_responses, replay


def decoded_tau(records: Path, *, mode: str, eval_set: str, limit: int) -> float | None:
    """τ the decoding benchmark measured for drafter `mode` on the first `limit` prompts of a set."""
    rows = [r for f in sorted(records.glob("greedy_*.jsonl")) for r in map(json.loads, open(f))
            if r["mode"] == mode and r["set"] == eval_set and r["idx"] < limit]
    steps = sum(r["decode_steps"] for r in rows)
    return round(sum(r["step_tokens"] for r in rows) / steps, 4) if steps else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, help="run directories, comma-separated")
    p.add_argument("--data", action="append", required=True, metavar="NAME=FILE.jsonl",
                   help="responses of the target (regenerate output); repeatable")
    p.add_argument("--limit", type=int, default=40, help="first N records of each file")
    p.add_argument("--max-anchors", type=int, default=96, help="response tokens replayed per record "
                   "(the benchmark decodes 96)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--records", default=None, help="eval records of bench/smollm2_pipeline.py (WORK/eval): adds the "
                   "decoded greedy τ of the same first --limit prompts, for runs named like its drafters")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from domino_graft.rundir import load_run

    sets = {}
    for spec in args.data:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            p.error(f"--data: {spec!r}; valid: NAME=FILE.jsonl with an existing file")
        sets[name] = path
    result = {"what": "greedy decoding replayed on the target's own greedy responses (teacher-forced drafts)",
              "limit": args.limit, "max_anchors": args.max_anchors,
              "data": {k: v for k, v in (s.partition("=")[::2] for s in args.data)}, "runs": {}}
    target = None
    for run_dir in args.runs.split(","):
        run = load_run(Path(run_dir), device=args.device)
        if target is not None:  # one target in memory for every run (load_run checks the identity)
            run.adapter.target = target
        target = target or run.target
        result["runs"][run_dir] = {}
        for name, path in sets.items():
            t0 = time.time()
            examples = read_responses(path, target, chat=run.recipe.target.chat, limit=args.limit, flag=f"--data {name}")
            res = replay(target, run.adapter, run.head, examples, max_anchors=args.max_anchors)
            if args.records:
                res["tau_decoded"] = decoded_tau(Path(args.records), mode=Path(run_dir).name, eval_set=name,
                                                 limit=args.limit)
            result["runs"][run_dir][name] = res
            print(f"{run_dir} {name}: tau base {res['tau_base']:.3f} final {res['tau_final']:.3f} "
                  f"(every anchor: {res['tau_base_every_anchor']:.3f} / {res['tau_final_every_anchor']:.3f}; "
                  f"{time.time() - t0:.0f} s)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
