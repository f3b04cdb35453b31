"""Lossless speculative decoding with Domino-grafted drafters (DESIGN §5).

    sampling   the shared logit warper and sampling settings
    rollout    the drafter's chain rollout over one block (reference; kernels plug in by name)
    verify     greedy and speculative-sampling verification (batched)
    engine     target-only and speculative decoding on one cache machinery (batch size 1)
    chat       prompts -> ids (chat template / raw / token ids) and stop tokens
"""

from .chat import decode_text, encode_prompt, stop_token_ids
from .engine import DecodeResult, Engine
from .rollout import ROLLOUTS, check_rollout_name, get_rollout, register_rollout, rollout, rollout_choice, rollout_names
from .sampling import Sampling, pick, sample, warp
from .verify import verify_greedy, verify_sampling

__all__ = [
    "DecodeResult", "Engine", "ROLLOUTS", "check_rollout_name", "Sampling", "decode_text", "encode_prompt", "get_rollout", "pick",
    "register_rollout", "rollout", "rollout_choice", "rollout_names", "sample", "stop_token_ids", "verify_greedy", "verify_sampling", "warp",
]
