"""FastLM.use_linears: every projection of the fast forward through kernels/engine/small_linear.py.

CPU (default): the "reference" linears (the kernels' torch math) and, in Triton's interpreter
(TRITON_INTERPRET=1, set before triton is imported), the "triton" ones give the default
forward's logits and hidden states in fp32, over a prefill and per-row steps. GPU (`-m gpu`,
bf16): a row's logits are the same bits whether it runs alone or inside a batch of 8, and
whether it is a 1-token step or a row of a 16-token verify (what `use_linears` promises and the
batched engine's identity to solo decoding relies on); greedy through CUDA graphs = eager.
"""

from __future__ import annotations

import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from domino_graft.fast import FastLM, GraphRunner, UnsupportedModel  # noqa: E402

from ..fast.test_static_engine import build, ids_of  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _close(a, b, atol, what):
    err = (a.double() - b.double()).abs().max().item()
    assert err <= atol, f"{what}: max abs err {err:.3g} > {atol}"


def _forwards(lm):
    ids = ids_of(2, 7)
    first = lm.forward(ids, 0, capture=(0, 2, -1))
    second = lm.forward(ids[:, :3], [7, 5], capture=(1, -1), logits_to_keep=2)
    return first, second


@pytest.mark.parametrize("kind", ["llama_tied", "qwen3_untied", "qwen2_bias"])
def test_fastlm_linears_equal_default_math(kind):
    """Prefill, per-row steps, logits_to_keep and hidden captures: linears "reference" (and
    "triton" in the interpreter) give the default forward's outputs."""
    model = build(kind)
    ref = _forwards(FastLM.from_hf(model, max_batch=2, max_len=64))
    combos = [("reference", "reference")] + ([("triton", "triton")] if INTERPRETED else [])
    for kernels, linears in combos:
        lm = FastLM.from_hf(model, max_batch=2, max_len=64).use_kernels(kernels).use_linears(linears)
        got = _forwards(lm)
        # the prefill's logits from picked rows go through the forward's own LM-head projection
        (logits, hidden), _ = got
        _close(lm.project_logits(hidden[-1]), logits, 0.0, f"{kind} {linears} project_logits")
        for (la, ha), (lb, hb) in zip(ref, got):
            _close(lb, la, 1e-5, f"{kind} {linears} logits")
            assert ha.keys() == hb.keys()
            for lid in ha:
                _close(hb[lid], ha[lid], 1e-5, f"{kind} {linears} hidden {lid}")


def test_use_linears_needs_the_split_forward_and_a_known_name():
    model = build("llama_tied")
    lm = FastLM.from_hf(model, max_len=32)
    with pytest.raises(ValueError, match=r"use_linears\(\) needs use_kernels"):
        lm.use_linears("reference")
    with pytest.raises(ValueError, match="linear kernels 'cublas'; valid: torch, triton, reference"):
        lm.use_kernels("reference").use_linears("cublas")
    lm.use_linears("reference").compile()
    with pytest.raises(ValueError, match=r"use_linears\(\) after compile\(\)"):
        lm.use_linears("torch")


def test_gemma3_refuses_linears():
    from tests.fast.test_gemma3_engine import build as build_gemma

    lm = FastLM.from_hf(build_gemma(), max_len=64)
    with pytest.raises(UnsupportedModel, match="linears 'triton' for gemma3_text; valid: torch"):
        lm.use_linears("triton")


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_rows_do_not_depend_on_the_batch_or_t():
    """bf16: row 0's logits alone (B=1) and inside a batch of 8 (and of 64) other prompts, as a
    1-token step and as one row of a 16-token verify, bit for bit; greedy through graphs = eager."""
    dev = torch.device("cuda")
    model = build("qwen3_untied").to(dev, torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(0, 97, (8, 40), generator=g).to(dev)
    solo = FastLM.from_hf(model, max_batch=1, max_len=128).use_kernels("triton").use_linears("triton")
    batch = FastLM.from_hf(model, max_batch=8, max_len=128).use_kernels("triton").use_linears("triton")
    with torch.no_grad():
        a, _ = solo.forward(prompts[:1, :24], 0)
        b, _ = batch.forward(prompts[:, :24], 0)
        assert torch.equal(a[0], b[0]), "prefill row 0: alone != inside a batch of 8"
        verify, _ = solo.forward(prompts[:1, 24:40], 24)  # 16 tokens at 24..39
        solo.cache.set_lengths(24)
        for j in range(16):
            step, _ = solo.forward(prompts[:1, 24 + j:25 + j], 24 + j)
            assert torch.equal(step[0, 0], verify[0, j]), f"position {24 + j}: step != verify row"
        bstep, _ = batch.forward(prompts[:, 24:25], [24] * 8)
        solo.cache.set_lengths(24)
        sstep, _ = solo.forward(prompts[:1, 24:25], 24)
        assert torch.equal(sstep[0], bstep[0]), "step row 0: alone != inside a batch of 8"
        # a batch of 64 (its prefill 1,536 rows, its 16-token verify 1,024: the many-rows tier of
        # kernels/engine/small_linear.py) gives row 0 the bits of the 16-row verify alone
        many = torch.randint(0, 97, (64, 40), generator=g).to(dev)
        many[0] = prompts[0]
        big = FastLM.from_hf(model, max_batch=64, max_len=128).use_kernels("triton").use_linears("triton")
        big.forward(many[:, :24], 0)
        v64, _ = big.forward(many[:, 24:40], [24] * 64)
        assert torch.equal(v64[0], verify[0]), "verify row 0: alone != inside a batch of 64"
    prompt = prompts[:1, :9]
    eager = FastLM.from_hf(model, max_len=256).use_kernels("triton").use_linears("triton")
    graphed = FastLM.from_hf(model, max_len=256).use_kernels("triton").use_linears("triton").compile()
    assert graphed.greedy(prompt, 40, step=GraphRunner(graphed)) == eager.greedy(prompt, 40)
