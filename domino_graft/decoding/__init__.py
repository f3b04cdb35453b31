"""Lossless speculative decoding with Domino-grafted drafters (docs/design.md §5).

    common     the result, stop rules, prompt checks and positions every decoder shares
    session    the target's KV cache behind one contract (prefill rows, step, keep, free): static or dynamic
    rollout    the drafter's chain rollout over one block (reference; kernels plug in by name)
    verify     greedy and speculative-sampling verification (batched)
    chain      chain speculative decoding (adapter.topology "chain")
    tree       static-tree speculative decoding, greedy or sampled (adapter.topology "tree")
    batched    several prompts at once: greedy chains and the target alone on a ragged cache
    engine     the target-only baseline, the topology -> decoder map, and the batched entry points
    chat       prompts -> ids (chat template / raw / token ids) and stop tokens

Sampling settings and the shared logit warper live in `domino_graft.sampling` (kernels use
them too); they are re-exported here.
"""

from ..sampling import Sampling, pick, sample, warp
from .chat import decode_text, encode_prompt, stop_token_ids
from .common import DecodeResult
from .engine import DECODERS, Engine
from .rollout import ROLLOUTS, check_rollout_name, get_rollout, register_rollout, rollout, rollout_choice, rollout_names
from .verify import verify_greedy, verify_sampling

__all__ = [
    "DECODERS", "DecodeResult", "Engine", "ROLLOUTS", "check_rollout_name", "Sampling", "decode_text", "encode_prompt",
    "get_rollout", "pick", "register_rollout", "rollout", "rollout_choice", "rollout_names", "sample", "stop_token_ids",
    "verify_greedy", "verify_sampling", "warp",
]
