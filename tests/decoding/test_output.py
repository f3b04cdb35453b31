"""Output (decoding/common.py): the target-only stop rules every decoder's rows append by."""

from __future__ import annotations

import random

from domino_graft.decoding.common import Output


def test_output_push_matches_token_by_token():
    """Output.push's one-check path for a chunk that ends nothing keeps the target-only stop rules: the
    tokens, the stop reason and what on_tokens saw equal appending token by token (stop token kept, or
    max_new_tokens reached, whichever first)."""
    rng = random.Random(1)
    for trial in range(300):
        cap, stops = rng.randint(1, 30), {rng.randrange(8) for _ in range(rng.randint(0, 2))}
        seen = []
        out, want, reason = Output(cap, stops, seen.append), [], None
        while reason is None:
            chunk = [rng.randrange(8) for _ in range(rng.randint(1, 6))]
            done = out.push(chunk)
            for t in chunk:
                want.append(t)
                reason = "stop" if t in stops else "length" if len(want) >= cap else None
                if reason:
                    break
            assert done is (reason is not None) and out.tokens == want and out.stop_reason == reason, trial
        assert [t for c in seen for t in c] == want
