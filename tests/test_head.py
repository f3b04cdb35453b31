"""The standalone Domino head: sizes, native names, block == incremental, zero-init identity."""

from __future__ import annotations

import pytest
import torch

from domino_graft.head import HEAD_TENSOR_NAMES, DominoHead, HeadSpec
from tests.conftest import randomize_head


def test_qwen3_8b_sizes_and_native_names():
    spec = HeadSpec(hidden_dim=4096, emb_dim=4096, gru_hidden_dim=1024, rank=256, vocab_size=151936)
    with torch.device("meta"):
        head = DominoHead(spec)
    shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert tuple(shapes) == HEAD_TENSOR_NAMES
    assert shapes == spec.tensor_shapes()
    assert shapes["prefix_gru.weight_ih_l0"] == (3072, 4096)
    assert shapes["embed_proj.2.weight"] == (151936, 256)
    assert sum(p.numel() for p in head.parameters()) == spec.num_parameters() == 55_934_976


def test_no_biases_anywhere():
    head = DominoHead(HeadSpec(8, 6, 5, 3, 11))
    assert all("bias" not in name for name, _ in head.named_parameters())


def _inputs(spec, b=3, k=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, k, spec.hidden_dim, generator=g),
        torch.randn(b, k, spec.vocab_size, generator=g),
        torch.randn(b, k, spec.emb_dim, generator=g),
    )


@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_block_and_incremental_steps_agree(prefix):
    spec = HeadSpec(hidden_dim=12, emb_dim=10, gru_hidden_dim=7, rank=5, vocab_size=23, pure_prefix_len=prefix)
    head = DominoHead(spec)
    randomize_head(head, seed=3, scale=2.0)
    hidden, base, emb = _inputs(spec)
    full = head.block(hidden, base, emb)
    state = head.init_state(hidden.shape[0])
    for j in range(hidden.shape[1]):
        logits, state = head.step(state, emb[:, j], hidden[:, j], base[:, j])
        torch.testing.assert_close(logits, full[:, j], rtol=1e-5, atol=1e-5)
        if j < prefix:  # pure-prefix slots are the plain base logits
            assert torch.equal(logits, base[:, j])
        else:
            assert not torch.allclose(logits, base[:, j])  # the correction is live
    assert state.steps == hidden.shape[1]


def test_gru_state_matches_the_formula():
    """S_j = GRU(S_{j-1}, E(x_{j-1})), bias-free, S_0 = 0 — written out by hand."""
    spec = HeadSpec(hidden_dim=4, emb_dim=3, gru_hidden_dim=5, rank=2, vocab_size=7)
    head = DominoHead(spec)
    randomize_head(head, seed=1, scale=1.0)
    emb = torch.randn(1, 3, 3)
    w_ih, w_hh = head.prefix_gru.weight_ih_l0, head.prefix_gru.weight_hh_l0
    h = torch.zeros(1, 5)
    for j in range(3):
        gi, gh = emb[:, j] @ w_ih.T, h @ w_hh.T
        r = torch.sigmoid(gi[:, :5] + gh[:, :5])
        z = torch.sigmoid(gi[:, 5:10] + gh[:, 5:10])
        n = torch.tanh(gi[:, 10:] + r * gh[:, 10:])
        h = (1 - z) * n + z * h
    states, _ = head.prefix_gru(emb)
    torch.testing.assert_close(states[:, -1], h, rtol=1e-5, atol=1e-6)


def test_zero_init_w2_is_the_identity_bit_for_bit():
    spec = HeadSpec(hidden_dim=12, emb_dim=10, gru_hidden_dim=7, rank=5, vocab_size=23, pure_prefix_len=0)
    head = DominoHead(spec)
    assert head.is_identity()
    hidden, base, emb = _inputs(spec)
    assert torch.equal(head.block(hidden, base, emb), base)
