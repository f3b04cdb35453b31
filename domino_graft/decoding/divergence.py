"""Where a speculative decode first left the target's own decode, and whether that is a bug.

Greedy speculation is exact in exact arithmetic. In floating point the target's K+1-token verify
forward and its 1-token decode forward use different kernels, so a greedy step whose top-2
logits are within rounding of each other can pick the other token (bf16 makes this common).
`first_divergence` names the position and measures the target's top-2 logit gap there, from one
uncached forward over the shared prefix: a gap at the rounding level of the dtype says "numerics"
(both outputs are valid greedy decodes of the target), a large gap says "look for a bug".
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

# The largest top-2 gap (in logits) still read as a floating-point near-tie, per target dtype:
# a few units of the dtype's resolution at logit magnitudes ~10-30.
NEAR_TIE = {torch.float32: 1e-3, torch.bfloat16: 0.25, torch.float16: 0.05}


@torch.no_grad()
def first_divergence(target, prompt_ids: Sequence[int], ref_tokens: Sequence[int],
                     got_tokens: Sequence[int]) -> Optional[dict]:
    """None if got_tokens == ref_tokens; else {first_diff, target_token, spec_token,
    target_top2_gap, near_tie}. A length-only difference (one output is a prefix of the other)
    reports spec_token None (got stopped early) or target_token None (got ran longer)."""
    ref, got = list(ref_tokens), list(got_tokens)
    if ref == got:
        return None
    i = next((n for n, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    seq = torch.tensor([list(prompt_ids) + ref[:i]], device=target.device)
    logits, _ = target.forward(seq, logits_to_keep=1)
    top = torch.topk(logits[0, -1].float(), 2)
    gap = float(top.values[0] - top.values[1])
    return {
        "first_diff": i,
        "target_token": ref[i] if i < len(ref) else None,
        "spec_token": got[i] if i < len(got) else None,
        "target_top2_gap": gap,
        "near_tie": gap <= NEAR_TIE.get(target.dtype, 1e-3),
    }
