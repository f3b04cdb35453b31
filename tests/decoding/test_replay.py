"""domino_graft.replay (`domino-graft replay`) replays greedy decoding
from training-style blocks. On the target's own greedy output it must accept exactly what
`Engine.speculative` accepts, block for block: the training label/GRU convention
(`training_blocks`) and the decoding one are the same."""

from __future__ import annotations

import json
import random

import pytest
import torch

from domino_graft.decoding import Engine
from domino_graft.replay import leading_matches, replay, walk
from domino_graft.training.data import Example
from tests.decoding.test_decoding import build


def test_walk_steps_over_accepted_drafts():
    assert walk(torch.tensor([0, 0, 0])) == [0, 0, 0]
    # block 0 accepts 2 drafts (+ the target's token): the next block starts 3 tokens later
    assert walk(torch.tensor([2, 9, 9, 1, 9, 0])) == [2, 1, 0]
    assert walk(torch.tensor([5, 0])) == [5]


# Vocabularies of 8-11 tokens: random drafters then accept often enough (runs of 1-3 drafts)
# for block boundaries to matter.
@pytest.mark.parametrize("seed,vocab,block_size,shift,ppl,arch", [
    (1, 11, 4, True, 1, "llama"), (2, 8, 4, True, 1, "llama"), (4, 8, 4, False, 0, "qwen3"),
    (3, 11, 6, True, 0, "qwen3"), (5, 8, 3, False, 1, "llama"), (6, 9, 8, True, 1, "gemma3"),
])
def test_replay_accepts_what_decoding_accepts(seed, vocab, block_size, shift, ppl, arch):
    target, adapter, head = build(seed, arch=arch, vocab=vocab, block_size=block_size, shift=shift, ppl=ppl)
    engine = Engine(target, adapter, head, stop_ids=[])
    rng = random.Random(seed)
    prompt = [rng.randrange(2, vocab - 1) for _ in range(5)]
    ref = engine.target_only(prompt, max_new_tokens=40)
    for use_head in (True, False):
        out = engine.speculative(prompt, max_new_tokens=40, use_head=use_head)
        assert out.tokens == ref.tokens
        ex = Example(prompt + ref.tokens, [0] * len(prompt) + [1] * len(ref.tokens))
        lead_base, lead_final = leading_matches(target, adapter, head, ex, max_anchors=len(ref.tokens))
        replayed = walk(lead_final if use_head else lead_base)
        # the last block is cut by max_new_tokens in decoding, by the response's end in the replay
        assert replayed[: len(out.accepted) - 1] == out.accepted[:-1], f"use_head={use_head}"
        # replay's τ is tokens per target forward over that walk, as `bench` counts it
        tau = replay(target, adapter, head, [ex])[f"tau_{'final' if use_head else 'base'}"]
        assert tau == round(sum(a + 1 for a in replayed) / len(replayed), 4)
    assert sum(out.accepted) > 0, "the case must accept drafts to test anything"


def _responses(run_dir, path, n=2, tokens=12):
    """The run's target's own greedy responses, as `regenerate` writes them for an id-only target."""
    from domino_graft.decoding.chat import stop_token_ids
    from domino_graft.loading import load_run

    loaded = load_run(run_dir)
    engine = Engine(loaded.target, loaded.adapter, loaded.head, stop_ids=stop_token_ids(loaded.target))
    with open(path, "w") as fh:
        for i in range(n):
            prompt = [3 + i, 5, 7, 9]
            out = engine.target_only(prompt, max_new_tokens=tokens)
            fh.write(json.dumps({"id": f"r{i}", "prompt_ids": prompt, "response_ids": out.tokens}) + "\n")


def test_replay_command_reports_both_taus(tiny_run, tmp_path, capsys):
    from domino_graft.cli import main

    responses, out = tmp_path / "responses.jsonl", tmp_path / "replay.json"
    _responses(tiny_run, responses)
    assert main(["replay", str(tiny_run), "--responses", str(responses), "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["sequences"] == 2 and rep["tau_base"] >= 1 and rep["tau_final"] >= 1
    assert rep["target"]["kind"] == "random"  # the artifact names the model it measured
    assert "greedy τ replayed" in capsys.readouterr().out


@pytest.mark.parametrize("content,flags,message", [
    (None, [], "does not exist"),
    ("{not json\n", [], "is not JSON"),
    ('{"id": "a", "prompt_ids": [3, 4], "response_ids": []}\n', [], "has no response tokens"),
    ('{"id": "a", "prompt_ids": [3, 4], "response_ids": [5]}\n', ["--max-tokens", "0"], "--max-tokens: 0"),
])
def test_replay_command_errors_name_the_input(tiny_run, tmp_path, capsys, content, flags, message):
    from domino_graft.cli import main

    path = tmp_path / "r.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["replay", str(tiny_run), "--responses", str(path), *flags]) != 0
    assert message in capsys.readouterr().err
