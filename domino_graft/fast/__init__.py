"""The fast target engine (issue #24): a static KV cache, an own forward for the Llama family
of architectures and for Gemma-3 (gemma3.py: sliding-window layers) sharing the HF model's
weights, and CUDA-graph replay of decode/verify steps.

Imports torch only (no pydantic, no other domino_graft module), so GPU scripts can use it on
images without the project's full dependencies.
"""

from .gemma3 import Gemma3LM
from .graphs import (KV_BLOCK, CapturedCall, GraphRunner, capture_graph, graphs_captured, host_ints, kv_bucket,
                     prefill_length, round_up_pow2)
from .llama import (SUPPORTED_MODEL_TYPES, FastConfig, FastLM, UnsupportedModel, check_supported,
                    prepare_for_cuda_decoding)
from .static_cache import StaticKVCache

__all__ = ["KV_BLOCK", "CapturedCall", "FastConfig", "FastLM", "Gemma3LM", "GraphRunner", "StaticKVCache",
           "SUPPORTED_MODEL_TYPES", "UnsupportedModel", "capture_graph", "check_supported", "graphs_captured", "host_ints",
           "kv_bucket", "prefill_length", "prepare_for_cuda_decoding", "round_up_pow2"]
