"""Does drawing the drafts at another temperature than the target's raise τ at T > 0? (issue #39: at T = 1
speculation does not pay on SmolLM2; its slot-1 acceptance is ~0.47.)

Speculative sampling is lossless for any draft distribution q the drafts were actually drawn from: the
verifier accepts d with probability min(1, p(d) / q(d)) and resamples from norm(max(0, p - q)). So the
rollout may draw at a draft temperature T_d != T (q = the warped, corrected logits at T_d) while p stays
the target's at T. A slot then accepts with probability sum_x min(p(x), q(x)), which T_d changes.

    python experiments/draft_temperature.py --run RUN --prompts PROMPTS.jsonl --limit 16 \
        --temperature 1 --draft-temperatures 0.5,0.75,1,1.5 --out bench/results/draft_temperature_cpu.json

RUN: a run dir (`domino-graft apply`) or bundle. Each T_d decodes the same prompts with the same seeds
(the drafter alone unless --use-head). τ = tokens / verify forwards (DecodeResult.tau's count).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--draft-temperatures", default="0.5,0.75,1,1.5")
    p.add_argument("--seeds", type=int, default=2, help="decodes per prompt and T_d (seed offsets 0..N-1)")
    p.add_argument("--use-head", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    from domino_graft.artifacts.provenance import versions
    from domino_graft.benchmark import encode, read_prompts
    from domino_graft.decoding import Engine
    from domino_graft.decoding.chat import stop_token_ids
    from domino_graft.loading import load_run_or_bundle
    from domino_graft.sampling import Sampling

    loaded = load_run_or_bundle(args.run, device="cpu")
    engine = Engine(loaded.target, loaded.adapter, loaded.head, rollout={"name": "torch"},
                    stop_ids=stop_token_ids(loaded.target), kv="auto")
    prompts = [encode(loaded, item, max_new_tokens=args.max_new_tokens)
               for item in read_prompts(args.prompts, limit=args.limit)]
    sampling = Sampling(temperature=args.temperature, seed=0)
    rollout = engine.rollout
    rows = []
    for td in [float(x) for x in args.draft_temperatures.split(",")]:
        # the drafts (and the q the verifier divides by) at T_d; the target's p stays at T
        engine.rollout = lambda *a, temperature=None, _td=td, **kw: rollout(*a, temperature=_td, **kw)
        t0 = time.perf_counter()
        tokens = forwards = 0
        reached = accepted = None
        for i, ids in enumerate(prompts):
            for s in range(args.seeds):
                r = engine.speculative(ids, max_new_tokens=args.max_new_tokens, sampling=sampling,
                                       use_head=args.use_head, seed_offset=1000 * s + i)
                tokens += sum(a + 1 for a in r.accepted)  # DecodeResult.tau's count: before truncation
                forwards += len(r.accepted)
                reached = r.slot_reached if reached is None else [a + b for a, b in zip(reached, r.slot_reached)]
                accepted = r.slot_accepted if accepted is None else [a + b for a, b in zip(accepted, r.slot_accepted)]
        row = {"draft_temperature": td, "tau": round(tokens / max(forwards, 1), 4), "tokens": tokens,
               "target_forwards": forwards,
               "slot_acceptance": [round(a / n, 4) if n else None for a, n in zip(accepted, reached)],
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    engine.rollout = rollout
    out = {"what": "tau at T > 0 with the drafts drawn at a draft temperature T_d (experiments/draft_temperature.py)",
           "command": " ".join(["experiments/draft_temperature.py", *(argv if argv is not None else sys.argv[1:])]),
           "run": str(args.run), "temperature": args.temperature, "use_head": args.use_head,
           "prompts": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
           "seeds": args.seeds, "device": "cpu", "dtype": "fp32", "versions": versions(), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
