"""training/attention.py: the feature passes' attention (KV heads repeated, then SDPA) gives the
model's own features, is used only inside its context, and falls back on any failure."""

from __future__ import annotations

import types

import pytest
import torch

from domino_graft.training import attention
from tests.conftest import TINY_RECIPE


@pytest.fixture
def target():
    from domino_graft.recipe import load_recipe
    from domino_graft.target import load_target

    t = load_target(load_recipe(TINY_RECIPE).target)
    assert t.model.config.num_key_value_heads < t.model.config.num_attention_heads  # grouped-query
    return t


@pytest.fixture(autouse=True)
def _fresh_state():
    saved = dict(attention._state)
    attention._state["failed"] = None
    yield
    attention._state.update(saved)


def test_repeated_kv_features_equal_the_models_own(target, monkeypatch):
    torch.manual_seed(0)
    ids = torch.randint(3, 90, (3, 21))
    capture = (0, 2, 3)
    own = target(ids, capture=capture, logits_to_keep=1)[1]
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.shape[1], k.shape[1], kw["is_causal"]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(attention, "F", types.SimpleNamespace(scaled_dot_product_attention=spy))
    before = target.model.config._attn_implementation
    with attention.repeated_kv_attention(target.model):
        assert target.model.config._attn_implementation == attention.NAME
        mine = target(ids, capture=capture, logits_to_keep=1)[1]
    assert target.model.config._attn_implementation == before
    heads = target.model.config.num_attention_heads
    assert calls == [(heads, heads, True)] * target.model.config.num_hidden_layers
    torch.testing.assert_close(mine, own, rtol=1e-5, atol=1e-5)


def test_not_wanted_on_a_cpu_so_features_are_unchanged(target):
    assert not attention.wanted(target.model)
    ran = []
    assert attention.run_with_fallback(target.model, lambda: ran.append(target.model.config._attn_implementation)
                                       or "ok") == "ok"
    assert ran == [target.model.config._attn_implementation] and ran[0] != attention.NAME


def test_a_failure_falls_back_once_and_stays_off(target):
    notes = []

    def fn():
        if target.model.config._attn_implementation == attention.NAME:
            raise RuntimeError("unsupported here")
        return "own attention"

    assert attention.run_with_fallback(target.model, fn, echo=notes.append, force=True) == "own attention"
    assert len(notes) == 1 and "unsupported here" in notes[0] and attention.NAME in notes[0]
    assert attention._state["failed"] and not attention.wanted(target.model)
    assert target.model.config._attn_implementation != attention.NAME
