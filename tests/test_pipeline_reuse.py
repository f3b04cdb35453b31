"""experiments/smollm2_pipeline.py --reuse: an earlier run's responses to identical prompts are kept, only
the other prompts are regenerated (in shards), and the merged file keeps this run's prompt order."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _chat(pid: str, words: str, answer: str | None = None) -> dict:
    msgs = [{"role": "user", "content": words}] + ([{"role": "assistant", "content": answer}] if answer else [])
    return {"id": pid, "messages": msgs}


def _write(path: Path, recs: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _runs(tmp_path: Path, prompts: list[dict], old: list[dict], tokens: int) -> tuple[Path, Path]:
    """This run's work dir (its prompts) and an earlier run's (its responses and data.json)."""
    work, prev = tmp_path / "work", tmp_path / "old"
    work.mkdir(), prev.mkdir()
    _write(work / "train_prompts.jsonl", prompts)
    _write(prev / "train.regen.jsonl", old)
    (prev / "data.json").write_text(json.dumps({"regen_max_new_tokens": tokens}))
    return work, prev


@pytest.fixture
def pipeline(monkeypatch):
    sys.path.insert(0, str(REPO / "experiments"))
    import smollm2_pipeline
    import domino_graft.training.regenerate as regen_module

    calls = []

    def fake_regenerate(recipe, prompts, out, **kwargs):  # the target's answer, without the target
        recs = [json.loads(line) for line in Path(prompts).open()]
        calls.append([r["id"] for r in recs])
        _write(Path(out), [_chat(r["id"], r["messages"][0]["content"], f"new {r['id']}") | {"finish": "eos"}
                           for r in recs])
        return {"sequences": len(recs)}

    monkeypatch.setattr(regen_module, "regenerate", fake_regenerate)
    return smollm2_pipeline, calls


def test_reuse_keeps_identical_prompts_and_regenerates_the_rest(tmp_path, pipeline):
    pipe, calls = pipeline
    scale = pipe.SCALES["smoke"]
    work, old = _runs(tmp_path, [_chat(p, f"words {p}") for p in "abcd"],
                      [_chat("a", "words a", "old a"),        # same prompt: kept
                       _chat("b", "other words", "old b"),    # same id, new words: redone
                       _chat("e", "words e", "old e")],       # not a prompt here
                      scale["regen_tokens"])

    for shard in ((0, 2), (1, 2)):
        pipe.stage_data(work, scale, shard, reuse=old)
    assert sorted(sum(calls, [])) == ["b", "c", "d"]
    out = pipe.stage_data(work, scale, reuse=old)
    recs = [json.loads(line) for line in out.open()]
    assert [r["id"] for r in recs] == ["a", "b", "c", "d"]
    assert [r["messages"][-1]["content"] for r in recs] == ["old a", "new b", "new c", "new d"]
    meta = json.loads((work / "data.json").read_text())
    assert (meta["reused"], meta["regenerated_here"], meta["sequences"]) == (1, 3, 4)
    assert meta["target"] == "smollm2-135m-instruct"
    assert len(calls) == 2  # the merge regenerated nothing


def test_reuse_unsharded_regenerates_only_what_is_left(tmp_path, pipeline):
    pipe, calls = pipeline
    scale = pipe.SCALES["smoke"]
    work, old = _runs(tmp_path, [_chat(p, f"words {p}") for p in "ab"], [_chat("b", "words b", "old b")],
                      scale["regen_tokens"])
    out = pipe.stage_data(work, scale, reuse=old)
    assert calls == [["a"]]
    assert [json.loads(line)["messages"][-1]["content"] for line in out.open()] == ["new a", "old b"]


def test_reuse_refuses_responses_of_another_length_or_target(tmp_path, pipeline):
    pipe, calls = pipeline
    work, old = _runs(tmp_path, [_chat("a", "words a")], [_chat("a", "words a", "old a")], 999)
    with pytest.raises(SystemExit, match="regen_max_new_tokens=999"):
        pipe.stage_data(work, pipe.SCALES["smoke"], reuse=old)
    (old / "data.json").write_text(json.dumps({"regen_max_new_tokens": pipe.SCALES["smoke"]["regen_tokens"],
                                               "target": "gemma3-270m"}))
    with pytest.raises(SystemExit, match="target 'gemma3-270m'; this run's target is 'smollm2-135m-instruct'"):
        pipe.stage_data(work, pipe.SCALES["smoke"], reuse=old)
    with pytest.raises(SystemExit, match="has no train.regen.jsonl"):
        pipe.stage_data(work, pipe.SCALES["smoke"], reuse=tmp_path / "missing")
    assert calls == [] and not (work / "train.regen.jsonl").exists()


def test_reuse_of_every_prompt_regenerates_nothing(tmp_path, pipeline):
    pipe, calls = pipeline
    scale = pipe.SCALES["smoke"]
    work, old = _runs(tmp_path, [_chat(p, f"words {p}") for p in "ab"],
                      [_chat(p, f"words {p}", f"old {p}") for p in "ab"], scale["regen_tokens"])
    for shard in ((0, 2), (1, 2)):  # empty shards still leave their (empty) part and meta files
        pipe.stage_data(work, scale, shard, reuse=old)
    out = pipe.stage_data(work, scale, reuse=old)
    assert calls == []
    assert [json.loads(line)["messages"][-1]["content"] for line in out.open()] == ["old a", "old b"]
