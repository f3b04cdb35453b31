"""Training data (synthetic tasks, chat records, file formats) and `regenerate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from domino_graft.training.data import encode_record, load_examples, read_records, synthetic_examples

from tests.conftest import TINY_RECIPE

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer():
    """A word-level tokenizer with a ChatML-style template (ids < 97, the tiny target's vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<|im_start|>", "<|im_end|>"]
    words = ["user", "assistant", "system"] + [f"w{i}" for i in range(60)]
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + words)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.decoder = decoders.WordPiece(prefix="##")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def hf_target_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen3 saved as a Hugging Face folder, with the tokenizer above."""
    from domino_graft.recipe import load_recipe
    from domino_graft.target import load_target

    out = tmp_path_factory.mktemp("hf_target")
    target = load_target(load_recipe(TINY_RECIPE).target)
    target.model.config.eos_token_id = 1
    target.model.save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


def test_synthetic_copy_and_arith_are_well_formed():
    ex = synthetic_examples("copy", num_samples=3, max_length=41, vocab_size=97, eos_id=1, reserved={96}, seed=0)
    for e in ex:
        n = (41 - 3) // 2
        prompt_run, response_run = e.input_ids[1 : 1 + n], e.input_ids[2 + n : 2 + 2 * n]
        assert prompt_run == response_run and e.input_ids[-1] == 1
        assert e.loss_mask == [0] * (n + 2) + [1] * (n + 1)
        assert 96 not in e.input_ids and len(e.input_ids) <= 41
    ar = synthetic_examples("arith", num_samples=2, max_length=30, vocab_size=97, eos_id=1, reserved={96}, seed=0)
    assert all(len(e.input_ids) == 30 and sum(e.loss_mask) == 27 for e in ar)
    # deterministic in the seed
    assert synthetic_examples("copy", num_samples=3, max_length=41, vocab_size=97, eos_id=1, reserved={96},
                              seed=0)[1].input_ids == ex[1].input_ids
    with pytest.raises(ValueError, match="vocabulary"):
        synthetic_examples("copy", num_samples=1, max_length=20, vocab_size=12, eos_id=1, reserved=set(), seed=0)


def test_chat_records_train_only_assistant_tokens():
    tok = tiny_tokenizer()
    msgs = [{"role": "user", "content": "w1 w2"}, {"role": "assistant", "content": "w3 w4 w5"},
            {"role": "user", "content": "w6"}, {"role": "assistant", "content": "w7"}]
    ex = encode_record({"messages": msgs}, tok, chat=True, eos_id=1, where="t")
    assert ex.input_ids == tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]
    trained = tok.convert_ids_to_tokens([t for t, m in zip(ex.input_ids, ex.loss_mask) if m])
    assert trained == ["w3", "w4", "w5", "<|im_end|>", "w7", "<|im_end|>"]
    # prompt/response is the one-turn conversation
    pr = encode_record({"prompt": "w1 w2", "response": "w3 w4 w5"}, tok, chat=True, eos_id=1, where="t")
    assert pr.input_ids == ex.input_ids[: len(pr.input_ids)] and pr.loss_mask == ex.loss_mask[: len(pr.loss_mask)]
    # without the chat template: plain prompt then response + EOS, the response trained
    plain = encode_record({"prompt": "w1 w2", "response": "w3"}, tok, chat=False, eos_id=1, where="t")
    assert plain.loss_mask == [0, 0, 1, 1] and plain.input_ids[-1] == 1
    with pytest.raises(ValueError, match="valid record formats"):
        encode_record({"question": "?"}, tok, chat=True, eos_id=1, where="row 3")
    with pytest.raises(ValueError, match="no tokenizer"):
        encode_record({"prompt": "a", "response": "b"}, None, chat=True, eos_id=1, where="row 0")


def test_jsonl_parquet_and_saved_dataset_read_the_same(tmp_path):
    import datasets

    rows = [{"prompt": f"w{i}", "response": f"w{i + 1} w{i + 2}"} for i in range(5)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    for src in ("d.jsonl", "d.parquet", "saved"):
        assert read_records(str(tmp_path / src)) == rows, src
    (tmp_path / "d.csv").write_text("prompt,response\n")
    with pytest.raises(ValueError, match="train.data.path: .*valid: .jsonl"):
        read_records(str(tmp_path / "d.csv"))
    with pytest.raises(FileNotFoundError, match="train.data.path"):
        read_records(str(tmp_path / "missing.jsonl"))


def test_no_data_is_an_error_naming_the_fields():
    from domino_graft.recipe import load_recipe

    recipe = load_recipe(TINY_RECIPE, ["train.data.synthetic=null"])
    with pytest.raises(ValueError, match="train.data.path .*train.data.synthetic"):
        load_examples(recipe, None, vocab_size=97, eos_id=1, reserved=set())


def _greedy_reference(model, prompt: list[int], n: int, eos: int) -> list[int]:
    ids = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(nxt)
            ids.append(nxt)
            if nxt == eos:
                break
    return out


def test_regenerate_batched_left_padded_matches_greedy_and_resumes(tmp_path):
    from domino_graft.recipe import load_recipe
    from domino_graft.target import load_target
    from domino_graft.training.regenerate import regenerate

    g = torch.Generator().manual_seed(0)
    prompts = [{"id": f"p{i}", "prompt_ids": torch.randint(2, 90, (int(n),), generator=g).tolist()}
               for i, n in enumerate([3, 9, 5, 12, 7])]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    out = tmp_path / "out.jsonl"
    # untied embeddings: a tied random model just repeats its last token, which would hide padding bugs
    untied = ["target.random.tie_word_embeddings=false"]
    regenerate(str(TINY_RECIPE), str(tmp_path / "p.jsonl"), str(out), max_new_tokens=6, batch_size=3,
               overrides=untied, echo=lambda *a: None, progress=False)
    got = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(got) == [p["id"] for p in prompts]
    model = load_target(load_recipe(TINY_RECIPE, untied).target).model
    for p in prompts:
        assert got[p["id"]]["response_ids"] == _greedy_reference(model, p["prompt_ids"], 6, eos=1), p["id"]
        assert got[p["id"]]["prompt_ids"] == p["prompt_ids"]
    assert len({tuple(r["response_ids"]) for r in got.values()}) > 1

    # resumable: a kill left a cut line and two prompts unanswered -> only those are generated
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:3]) + "\n" + lines[3][:10])
    res = regenerate(str(TINY_RECIPE), str(tmp_path / "p.jsonl"), str(out), max_new_tokens=6, batch_size=3,
                     overrides=untied, echo=lambda *a: None, progress=False)
    assert res == {"written": 2, "skipped": 3}
    again = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["id"] for r in again) == sorted(got) and {r["id"]: r for r in again} == got


def test_regenerate_with_chat_template_then_train_on_it(hf_target_dir, tmp_path):
    """The target answers in its chat template; `train` reads that file with loss on the answers."""
    import yaml

    from domino_graft.apply import apply_recipe
    from domino_graft.training.data import load_examples
    from domino_graft.training.loop import train
    from domino_graft.training.regenerate import regenerate

    recipe = yaml.safe_load(Path(TINY_RECIPE).read_text())
    recipe["target"] = {"path": str(hf_target_dir)}
    recipe["train"]["data"] = {"path": str(tmp_path / "answers.jsonl"), "max_length": 64}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    prompts = [{"messages": [{"role": "user", "content": f"w{i} w{i + 3} w{i + 7}"}]} for i in range(6)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    regenerate(str(tmp_path / "r.yaml"), str(tmp_path / "p.jsonl"), str(tmp_path / "answers.jsonl"),
               max_new_tokens=12, batch_size=4, echo=lambda *a: None, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["messages"][-1]["role"] == "assistant" for r in rows)
    assert {r["id"] for r in rows} == {str(i) for i in range(6)}

    _, run = apply_recipe(str(tmp_path / "r.yaml"), str(tmp_path / "run"), echo=lambda *a: None)
    from domino_graft.loading import load_run

    loaded = load_run(run)
    examples = load_examples(loaded.recipe, loaded.target.tokenizer, vocab_size=97, eos_id=1, reserved={96})
    tok = loaded.target.tokenizer
    for ex, row in zip(examples, rows):
        start = tok.convert_tokens_to_ids("<|im_start|>")
        # everything up to and including the generation prompt is context, never a label
        gen_prompt = tok.apply_chat_template(row["messages"][:1], add_generation_prompt=True, tokenize=False)
        n_prompt = len(tok(gen_prompt, add_special_tokens=False)["input_ids"])
        assert not any(ex.loss_mask[:n_prompt]) and all(ex.loss_mask[n_prompt:])
        assert ex.input_ids[0] == start
    train(str(run), max_steps=2, progress=False, echo=lambda *a: None)
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and recs[0]["count"][0] > 0
