"""A PROJECTION of decoding tokens/s by batch size at the Qwen3-8B shape, from measured components
(issue #39): no Qwen3-8B drafter was trained or run; the acceptance is SmolLM2's.

    python bench/batch_projection.py --out bench/results/batch_projection_h200.json

Components (all committed, all one H200, bf16, random weights at real shapes, CUDA graphs):
  step(B, T)   the target's forward of T tokens per row, the engine's default (batch-invariant) kernels:
               bench/results/engine_batch_h200.json rows.qwen3_8b.by_batch[].default_ms (T = 1, 4, 8, 16)
  propose(B)   z-lab's 5-layer DFlash drafter (1.05 B parameters), block 16: the same file's propose_ms
  head(B)      the fused exact Domino rollout: bench/results/head_latency_h200.json (B = 1, 4, 16, 32;
               other B interpolated, B = 64 extended linearly from 16 -> 32)
  acceptance   the per-slot acceptance of the SmolLM2 DFlash drafters, base and + Domino, GSM8K greedy:
               bench/results/smollm2_h200.json (the README's τ table)

Per B: the target alone makes B / step(B, 1) tokens a ms; a speculative step verifying K' drafts makes
B · E(K') / (step(B, K' + 1) + propose(B) + head(B)), E(K') = 1 + Σ_j Π_{i<=j} α_i
(decoding/budget.py's formula); "full" is K' = K, "budget" the best of K' ∈ {0, 3, 7, 15}
(K' = 0: the target's own step, no propose), as `--verify-budget auto` chooses. Host time is left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    sys.path.insert(0, str(REPO))
    from domino_graft.decoding.budget import VerifyCosts, candidate_budgets, expected_tokens

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    eng = json.loads((REPO / "bench/results/engine_batch_h200.json").read_text())["rows"]["qwen3_8b"]
    heads = json.loads((REPO / "bench/results/head_latency_h200.json").read_text())["shapes"]["qwen3_8b"]["batches"]
    # the budget's own cost table (interpolated in B and T as the engine's budget does); the head's
    # rollout is a second "propose" table, by B
    costs = VerifyCosts.from_dict(eng, "engine_batch_h200.json rows.qwen3_8b")
    head = VerifyCosts(propose_ms={int(b): v["fused_full_ms"] for b, v in heads.items()})
    sm = json.loads((REPO / "bench/results/smollm2_h200.json").read_text())["dflash"]["gsm8k"]
    out = {"kind": "PROJECTION from measured components (not a decode of a Qwen3-8B drafter)",
           "command": "python bench/batch_projection.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "sources": {"step_and_propose": "bench/results/engine_batch_h200.json rows.qwen3_8b",
                       "head": "bench/results/head_latency_h200.json shapes.qwen3_8b.batches.*.fused_full_ms",
                       "acceptance": "bench/results/smollm2_h200.json dflash.gsm8k.per_slot_acceptance"},
           "by_batch": []}
    for variant in ("base", "domino"):
        alphas = sm["per_slot_acceptance"][variant]
        k = len(alphas)
        for b in sorted(costs.step_ms):
            if not costs.has(b, 1) or b not in costs.propose_ms:
                continue
            target = b / costs.step(b, 1)
            extra = costs.propose(b) + (head.propose(b) if variant == "domino" else 0.0)

            def rate(kk, b=b, extra=extra, alphas=alphas):
                if kk == 0:
                    return b / costs.step(b, 1)
                return b * expected_tokens(alphas, kk) / (costs.step(b, kk + 1) + extra)

            full = rate(k)
            cands = candidate_budgets(k)
            best = max(cands, key=rate)
            out["by_batch"].append({
                "variant": variant, "B": b, "target_tokens_per_s": round(1e3 * target, 1),
                "full_tokens_per_s": round(1e3 * full, 1), "full_speedup": round(full / target, 3),
                "budget_k": best, "budget_tokens_per_s": round(1e3 * rate(best), 1),
                "budget_speedup": round(rate(best) / target, 3), "tau_full": round(expected_tokens(alphas, k), 3)})
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for r in out["by_batch"]:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
