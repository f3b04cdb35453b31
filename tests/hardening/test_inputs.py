"""Hardening, inputs (issue #26): every bad recipe, override, prompt, data or response file gets
one clear line naming the culprit (field / file / line) and the bad value, and what would be
valid; nothing hangs, nothing is written, no traceback.

Table-driven: each Case writes its files into a fresh folder (the current directory while it
runs), runs `domino_graft.cli.main(argv)` in-process, and checks the exit code, that every
expected fragment is in stderr, that stderr has no traceback, and that no file appeared or
changed (so `apply` with a bad recipe leaves no run dir, `regenerate` no output, ...). The
alias bomb runs in a subprocess under a timeout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import pytest

from domino_graft.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "tiny_dflash.yaml"
# the shipped tiny target (random, 97 ids, 4 layers, 2,048 positions, eos 1); the tiny DFlash run masks 96
TARGET = ("{architecture: qwen3, vocab_size: 97, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, "
          "head_dim: 8, intermediate_size: 64, eos_token_id: 1, seed: 0}")
RECIPE = f"""target:
  random: {TARGET}
drafter:
  family: dflash
  block_size: 8
  target_layer_ids: [0, 2]
  mask_token_id: 96
head:
  gru_hidden_dim: 24
  rank: 8
"""
ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def recipe(**sections: str) -> str:
    """RECIPE with extra YAML lines appended (each section's text as given)."""
    return RECIPE + "".join(sections.values())


def jsonl(*rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


@dataclass
class Case:
    id: str
    argv: list[str]  # "{run}", "{hf}", "{notok}" (run dirs), "{nosys}", "{broken}" (target folders): fixtures' paths
    expect: list[str]  # fragments stderr must hold: the culprit (field / file:line) and the bad value
    files: dict[str, Union[str, bytes]] = field(default_factory=dict)  # str contents get the same replacements
    rc: int = 1
    unchanged: Optional[str] = None  # a fixture run dir ("run") that must come out untouched


BAD_UTF8 = b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n'
LONG_WORDS = " ".join(["w1"] * 2100)  # 2,100 tokens of the tiny tokenizer, 6,299 characters

CASES = [
    # ------------------------------------------------------------------ recipes
    Case("recipe-duplicate-key", ["validate", "r.yaml"],
         ["head.rank: duplicate key 'rank' at line 11 (first given at line 10)"],
         {"r.yaml": RECIPE + "  rank: 16\n"}),
    Case("recipe-duplicate-section", ["validate", "r.yaml"],
         ["head: duplicate key 'head' at line 11 (first given at line 8)"],
         {"r.yaml": RECIPE + "head: {rank: 4}\n"}),
    Case("recipe-binary", ["validate", "r.yaml"], ["r.yaml", "<file>: a binary file (NUL byte at offset 0)"],
         {"r.yaml": bytes(range(256)) * 8}),
    Case("recipe-not-utf8", ["validate", "r.yaml"], ["<file>: not UTF-8 text: byte 0xe9 at offset 9 (line 1)"],
         {"r.yaml": "name: caf\xe9\n".encode("latin-1") + RECIPE.encode()}),
    Case("recipe-too-big", ["validate", "r.yaml"], ["<file>: 1,200,000 bytes; the limit is 1,048,576 bytes"],
         {"r.yaml": "#" * 1_200_000}),
    Case("recipe-too-deep", ["validate", "r.yaml"], ["<yaml>: line 1: nested more than 32 levels"],
         {"r.yaml": "[" * 500 + "]" * 500}),
    Case("recipe-anchor", ["validate", "r.yaml"], ["<yaml>: line 8: YAML anchor &h refused"],
         {"r.yaml": RECIPE.replace("head:\n", "head: &h\n")}),
    Case("recipe-bad-yaml", ["validate", "r.yaml"], ["<yaml>: not valid YAML: line 3, column 1: expected ',' or ']'"],
         {"r.yaml": "target: {random: {}}\ndrafter: [family: dflash\n"}),
    Case("recipe-top-level-list", ["validate", "r.yaml"], ["expected a mapping", "got list [1, 2]"],
         {"r.yaml": "[1, 2]\n"}),
    Case("recipe-long-value-is-cut", ["validate", "r.yaml"], ["head.rank: [0, 0, 0", "chars) is invalid"],
         {"r.yaml": RECIPE.replace("rank: 8", "rank: [" + ", ".join(["0"] * 5000) + "]")}),
    Case("empty-recipe-plus-override", ["apply", "r.yaml", "--dry-run", "head.rank=4"],
         ["target: required field is missing", "drafter: required field is missing"], {"r.yaml": ""}),
    Case("recipe-pure-prefix-beyond-slots", ["validate", "r.yaml"],
         ["head.pure_prefix_len: 50 is invalid; valid: 0..6", "7 proposal(s) per block"],
         {"r.yaml": RECIPE + "  pure_prefix_len: 50\n"}),
    Case("random-target-heads-kv-heads", ["validate", "r.yaml"],
         ["target.random.num_kv_heads: 2 does not divide num_heads 3", "valid: 1, 3"],
         {"r.yaml": RECIPE.replace("num_heads: 4", "num_heads: 3")}),
    Case("random-target-odd-head-dim-and-eos", ["validate", "r.yaml"],
         ["target.random.head_dim: 7 is odd", "target.random.eos_token_id: 200 is outside the vocabulary; valid: 0..96"],
         {"r.yaml": RECIPE.replace("head_dim: 8", "head_dim: 7").replace("eos_token_id: 1", "eos_token_id: 200")}),
    Case("train-batch-vs-grad-accum", ["validate", "r.yaml"],
         ["train.batch_size: 6 is not a multiple of train.grad_accum 4"],
         {"r.yaml": recipe(train="train: {batch_size: 6, grad_accum: 4}\n")}),
    Case("dflash-layer-ids-dup", ["validate", "r.yaml"], ["drafter.target_layer_ids: layer 2 is listed twice in [2, 2]"],
         {"r.yaml": RECIPE.replace("[0, 2]", "[2, 2]")}),
    # --------------------------------------------------------- plan-time (dry-run, apply)
    Case("dry-run-layer-ids-out-of-range", ["apply", "r.yaml", "--dry-run"],
         ["drafter.target_layer_ids: 99 in [0, 99] is out of range; valid: 0..3"],
         {"r.yaml": RECIPE.replace("[0, 2]", "[0, 99]")}),
    Case("apply-mask-id-and-layer-ids-at-once", ["apply", "r.yaml", "-o", "out"],
         ["2 problem(s)", "drafter.target_layer_ids: 99 in [0, 99]",
          "drafter.mask_token_id: 500 is outside the target vocabulary; valid: 0..96"],
         {"r.yaml": RECIPE.replace("[0, 2]", "[0, 99]").replace("mask_token_id: 96", "mask_token_id: 500")}),
    Case("apply-mask-id-is-eos", ["apply", "r.yaml", "-o", "out"], ["drafter.mask_token_id: 1 is the target's eos id"],
         {"r.yaml": RECIPE.replace("mask_token_id: 96", "mask_token_id: 1")}),
    Case("dry-run-bench-max-new-tokens", ["apply", "r.yaml", "--dry-run"],
         ["bench.max_new_tokens: 5000 is invalid; valid: 1..2047"],
         {"r.yaml": recipe(bench="bench: {max_new_tokens: 5000}\n")}),
    Case("dry-run-medusa-tree-deeper-than-checkpoint", ["apply", "r.yaml", "--dry-run"],
         ["drafter.tree[2]: [0, 0, 0] is 3 deep; valid: at most 2"],
         {"r.yaml": f"target:\n  random: {TARGET}\ndrafter:\n  family: medusa\n  config: m.json\n"
                    "  tree: [[0], [0, 0], [0, 0, 0]]\nhead: {gru_hidden_dim: 8, rank: 4}\n",
          "m.json": json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1})}),
    Case("dry-run-pard-token-is-eos", ["apply", "r.yaml", "--dry-run"],
         ["drafter.pard_token_id: 1 is the target's eos id"],
         {"r.yaml": f"target:\n  random: {TARGET}\ndrafter: {{family: pard, num_layers: 1, num_slots: 4, "
                    "pard_token_id: 1}\nhead: {gru_hidden_dim: 8, rank: 4}\n"}),
    Case("apply-target-config-not-json", ["apply", "r.yaml", "--dry-run"],
         ["target.config:", "c.json is not valid JSON"],
         {"r.yaml": "target: {path: nowhere, config: c.json}\ndrafter: {family: dflash}\n", "c.json": "{oops"}),
    # ---------------------------------------------------------------- overrides
    Case("override-bad-yaml", ["apply", "r.yaml", "--dry-run", "head.rank=[1,"],
         ["override 'head.rank=[1,': the value '[1,' is not valid YAML", "valid: section.key=VALUE"],
         {"r.yaml": RECIPE}),
    Case("override-not-a-key", ["apply", "r.yaml", "--dry-run", "head..rank=3"],
         ["override 'head..rank=3': 'head..rank' is not a dotted key"], {"r.yaml": RECIPE}),
    Case("override-into-a-scalar", ["apply", "r.yaml", "--dry-run", "head.rank.x=1"],
         ["override 'head.rank.x=1': head.rank is 8, not a section"], {"r.yaml": RECIPE}),
    Case("override-wrong-type", ["apply", "r.yaml", "--dry-run", "drafter.block_size=big"],
         ["drafter.block_size: 'big' is invalid"], {"r.yaml": RECIPE}),
    # ----------------------------------------------------------------- prompts
    Case("generate-prompt-ids-not-ints", ["generate", "{run}", "--prompt-ids", "5 x 7"],
         ["--prompt-ids: id 2, 'x', is not a token id"]),
    Case("generate-prompt-ids-too-long", ["generate", "{run}", "--prompt-ids", " ".join(["5"] * 5000)],
         ["--prompt-ids: 5,000 prompt tokens + 128 new tokens", "the target has 2,048 positions"]),
    Case("generate-prompt-ids-out-of-vocab", ["generate", "{run}", "--prompt-ids", "5 500"],
         ["--prompt-ids: prompt_ids[1]: 500 is outside the target vocabulary; valid: 0..96"]),
    Case("generate-prompt-holds-the-mask", ["generate", "{run}", "--prompt-ids", "5 96 7"],
         ["--prompt-ids: holds token id 96, the drafter's reserved placeholder"]),
    Case("generate-1mb-prompt", ["generate", "{hf}", "--prompt", "w1 " * 350_000],
         ["--prompt: the prompt text is 1,050,000 characters; at most 32,768 are tokenised"]),
    Case("generate-prompt-too-long-after-template", ["generate", "{hf}", "--prompt", LONG_WORDS, "--max-new-tokens", "8"],
         ["--prompt: 2,10", "prompt tokens + 8 new tokens", "2,048 positions"]),
    Case("bench-role-wizard", ["bench", "{hf}", "--prompts", "p.jsonl", "--json", "b.json"],
         ["--prompts: p.jsonl:2: messages[0].role: 'wizard' is not a chat role; valid: system, user, assistant"],
         {"p.jsonl": jsonl({"prompt": "w1"}, {"messages": [{"role": "wizard", "content": "w2"}]})}),
    Case("bench-content-not-a-string", ["bench", "{hf}", "--prompts", "p.jsonl"],
         ["--prompts: p.jsonl:1: messages[0].content: expected a string, got 123 (an integer)"],
         {"p.jsonl": jsonl({"messages": [{"role": "user", "content": 123}]})}),
    Case("bench-prompt-not-a-string", ["bench", "{run}", "--prompts", "p.jsonl"],
         ["--prompts: p.jsonl:3: \"prompt\": expected a string, got 123 (an integer)"],
         {"p.jsonl": jsonl({"prompt_ids": [5, 6]}, "", {"prompt": 123})}),
    Case("bench-prompt-ids-as-strings", ["bench", "{run}", "--prompts", "p.jsonl"],
         ["--prompts: p.jsonl:1: prompt_ids[0]: '5' (a string) is not a token id"],
         {"p.jsonl": jsonl({"prompt_ids": ["5", "6"]})}),
    Case("bench-prompts-not-utf8", ["bench", "{run}", "--prompts", "p.jsonl"],
         ["--prompts: p.jsonl:2: not UTF-8 text: byte 0xe9 at offset 32"], {"p.jsonl": BAD_UTF8}),
    Case("bench-prompts-bad-json", ["bench", "{run}", "--prompts", "p.jsonl"],
         ["--prompts: p.jsonl:2 is not JSON (Expecting value at column 19)"], {"p.jsonl": '{"prompt_ids": [5]}\n{"prompt_ids": [5,\n'}),
    Case("bench-prompt-too-long", ["bench", "{hf}", "--prompts", "p.jsonl", "--max-new-tokens", "8"],
         ["--prompts p.jsonl:2: 2,10", "prompt tokens + 8 new tokens", "2,048 positions"],
         {"p.jsonl": jsonl({"prompt": "w1 w2"}, {"messages": [{"role": "user", "content": LONG_WORDS}]})}),
    Case("regenerate-duplicate-id", ["regenerate", "{run}", "--prompts", "p.jsonl", "-o", "out.jsonl"],
         ["--prompts: p.jsonl:3: id '7' appears twice (first at line 1)"],
         {"p.jsonl": jsonl({"id": 7, "prompt_ids": [5]}, {"id": 8, "prompt_ids": [6]}, {"id": "7", "prompt_ids": [7]})}),
    Case("regenerate-role-and-no-output", ["regenerate", "{hf}", "--prompts", "p.jsonl", "-o", "out.jsonl"],
         ["--prompts: p.jsonl:1: messages[1].role: 'bot' is not a chat role"],
         {"p.jsonl": jsonl({"messages": [{"role": "user", "content": "w1"}, {"role": "bot", "content": "w2"}]})}),
    Case("regenerate-template-refuses-system", ["regenerate", "nosys.yaml", "--prompts", "p.jsonl", "-o", "out.jsonl"],
         ["--prompts: p.jsonl:1: messages (roles system, user): the target's chat template refuses them: "
          "System role not supported"],
         {"p.jsonl": jsonl({"messages": [{"role": "system", "content": "w1"}, {"role": "user", "content": "w2"}]}),
          "nosys.yaml": "target: {path: {nosys}}\ndrafter: {family: dflash}\n"}),
    Case("regenerate-prompt-too-long", ["regenerate", "{run}", "--prompts", "p.jsonl", "-o", "out.jsonl",
                                        "--max-new-tokens", "100"],
         ["--prompts: p.jsonl:1: 2,000 prompt tokens + 100 new tokens (max_new_tokens) = 2,100 positions",
          "the target has 2,048 positions"],
         {"p.jsonl": jsonl({"prompt_ids": [5] * 2000})}),
    # ------------------------------------------------------------- training data
    Case("train-data-not-utf8", ["train", "{run}", "train.data.path=d.jsonl", "train.data.synthetic=null"],
         ["train.data.path: ", "d.jsonl:2: not UTF-8 text: byte 0xe9 at offset 32"], {"d.jsonl": BAD_UTF8},
         unchanged="run"),
    Case("train-data-ids-as-strings", ["train", "{run}", "train.data.path=d.jsonl", "train.data.synthetic=null"],
         ["d.jsonl:2: response_ids[1]: '7' (a string) is not a token id"],
         {"d.jsonl": jsonl({"prompt_ids": [5], "response_ids": [6, 7]}, {"prompt_ids": [5], "response_ids": [6, "7"]})},
         unchanged="run"),
    Case("train-data-role-and-record-kind", ["train", "{run}", "train.data.path=d.jsonl", "train.data.synthetic=null"],
         ["d.jsonl:1: messages[0].role: 'wizard' is not a chat role"],
         {"d.jsonl": jsonl({"messages": [{"role": "wizard", "content": "hi"}]})}, unchanged="run"),
    Case("train-data-record-not-an-object", ["train", "{run}", "train.data.path=d.jsonl", "train.data.synthetic=null"],
         ["d.jsonl:1: expected a JSON object", "got [1, 2] (a list)"], {"d.jsonl": "[1, 2]\n"}, unchanged="run"),
    Case("train-data-holds-the-mask", ["train", "{run}", "train.data.path=d.jsonl", "train.data.synthetic=null"],
         ["d.jsonl:1: holds token id 96, the drafter's reserved placeholder"],
         {"d.jsonl": jsonl({"prompt_ids": [5, 96], "response_ids": [6, 7, 8, 9]})}, unchanged="run"),
    # ------------------------------------------------------------ response files
    Case("replay-not-utf8", ["replay", "{run}", "--responses", "r.jsonl", "--json", "out.json"],
         ["--responses: r.jsonl:2: not UTF-8 text: byte 0xff at offset 78"],
         {"r.jsonl": b'{"prompt_ids": [5], "response_ids": [6]}\n{"prompt_ids": [5], "response_ids": [\xff]}\n'}),
    Case("replay-ids-outside-vocab", ["replay", "{run}", "--responses", "r.jsonl", "--json", "out.json"],
         ["--responses: r.jsonl:1: token id 500 is outside the target vocabulary; valid: 0..96"],
         {"r.jsonl": jsonl({"prompt_ids": [5, 6], "response_ids": [7, 500]})}),
    Case("replay-record-too-long", ["replay", "{run}", "--responses", "r.jsonl"],
         ["--responses: r.jsonl:1: 3,000 tokens (prompt + response); the target has 2,048 positions"],
         {"r.jsonl": jsonl({"prompt_ids": [5] * 1000, "response_ids": [6] * 2000})}),
    Case("replay-prompt-not-a-string", ["replay", "{run}", "--responses", "r.jsonl"],
         ["--responses: r.jsonl:1: prompt: expected a string, got 123 (an integer)"],
         {"r.jsonl": jsonl({"prompt": 123, "response": "x"})}),
    # ------------------------------------------------------ targets without a tokenizer
    Case("tokenizer-less-target-text-prompt", ["generate", "{notok}", "--prompt", "w1 w2"],
         ["--prompt: target folder", "has no tokenizer files (none of tokenizer.json", "give token ids instead"]),
    Case("tokenizer-less-target-ids-work", ["generate", "{notok}", "--prompt-ids", "5 6 7", "--max-new-tokens", "3"],
         [], rc=0),
    Case("broken-tokenizer", ["apply", "r.yaml", "-o", "out"],
         ["target: the tokenizer in", "(tokenizer.json) cannot be loaded"],
         {"r.yaml": "target: {path: {broken}}\ndrafter: {family: dflash}\n"}),
]


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def targets(tmp_path_factory, tiny_run):
    """Tiny HF target folders (random weights): with the ChatML tokenizer, with a template that
    refuses the system role, without tokenizer files, with a broken tokenizer.json; and runs on the
    first and third."""
    from domino_graft.apply import apply_recipe
    from domino_graft.recipe import load_recipe
    from domino_graft.target import load_target

    from tests.training.test_train_data import tiny_tokenizer

    root = tmp_path_factory.mktemp("targets")
    hf = root / "hf"
    target = load_target(load_recipe(TINY).target)
    target.model.config.eos_token_id = 1
    target.model.save_pretrained(hf)
    tiny_tokenizer().save_pretrained(hf)
    weights_only = [p for p in hf.iterdir() if not p.name.startswith(("tokenizer", "chat_template"))]
    nosys, notok, broken = root / "nosys", root / "notok", root / "broken"
    for folder in (nosys, notok, broken):
        folder.mkdir()
        for p in weights_only:
            shutil.copy(p, folder / p.name)
    tok = tiny_tokenizer()
    tok.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                         "{% endif %}" + tok.chat_template)
    tok.save_pretrained(nosys)
    (broken / "tokenizer.json").write_text("{not a tokenizer")
    runs = {"run": tiny_run, "nosys": nosys, "broken": broken}
    for name, folder in (("hf", hf), ("notok", notok)):
        runs[name] = root / f"{name}-run"
        apply_recipe(str(TINY), str(runs[name]), overrides=["target.random=null", f"target.path={folder}"],
                     echo=lambda *_: None)
    return runs


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_line(case, targets, tmp_path, monkeypatch, capsys):
    runs = dict(targets)
    if case.unchanged:  # training would write into the run: a copy, checked untouched afterwards
        runs[case.unchanged] = tmp_path / "run-copy"
        shutil.copytree(targets[case.unchanged], runs[case.unchanged])
    work = tmp_path / "work"
    work.mkdir()

    def fill(text: str) -> str:
        for name, path in runs.items():
            text = text.replace("{" + name + "}", str(path))
        return text

    for name, content in case.files.items():
        (work / name).write_bytes(fill(content).encode() if isinstance(content, str) else content)
    monkeypatch.chdir(work)
    argv = [fill(a) for a in case.argv]
    before = _tree(work), _tree(runs[case.unchanged]) if case.unchanged else None
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == case.rc, err
    assert "Traceback" not in err
    for fragment in case.expect:
        assert fragment in err, f"{fragment!r} not in:\n{err}"
    if case.rc:
        assert all(len(line) < 400 for line in err.splitlines()), "an error line this long repeats a value"
        assert _tree(work) == before[0], "a failing command wrote files"
        if case.unchanged:
            assert _tree(runs[case.unchanged]) == before[1], "a failing command changed the run"


# ------------------------------------------------------------------- beyond the table
def test_alias_bomb_is_refused_at_once(tmp_path):
    """~300 bytes that PyYAML would expand to 9^9 strings (minutes, gigabytes): refused before anything expands."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "domino_graft", "validate", str(bomb)], capture_output=True, text=True,
                       timeout=60)
    assert time.monotonic() - start < 30
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "<yaml>: line 1: YAML anchor &a refused: recipes take no anchors or aliases" in r.stderr
    assert len(r.stderr) < 500


def test_override_paths_resolve_against_the_current_directory(tmp_path, monkeypatch, capsys):
    """Paths in a recipe file are the recipe folder's; a path typed on the command line is the shell's."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text("target: {path: model, config: c.json}\ndrafter: {family: dflash}\n")
    (tmp_path / "c.json").write_text((REPO / "recipes" / "configs" / "smollm2-135m-instruct.json").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["apply", "recipes/r.yaml", "--dry-run", "target.config=c.json"]) == 0, capsys.readouterr().err
    assert f"({tmp_path / 'recipes' / 'model'})" in capsys.readouterr().out  # from the file: the recipe's folder
    assert main(["apply", "recipes/r.yaml", "--dry-run", "target.config=c.json", "target.path=model"]) == 0
    assert f"({tmp_path / 'model'})" in capsys.readouterr().out  # typed: the current directory


@pytest.mark.parametrize("family,override,checkpoint_value", [
    ("medusa", "drafter.num_heads=3", "num_heads: 3"),
    ("pard", "drafter.num_slots=4", "num_slots: 4"),
    ("dflash", "drafter.num_layers=2", "num_layers: 2"),
])
def test_a_drafter_path_alone_takes_the_checkpoints_values(family, override, checkpoint_value, tmp_path, monkeypatch,
                                                           capsys):
    """A recipe giving only drafter.path: values it never set (schema defaults) yield to the checkpoint's,
    and the run records the checkpoint's, so reloading it (generate) finds no conflict."""
    from domino_graft.apply import apply_recipe

    monkeypatch.chdir(tmp_path)
    apply_recipe(f"tiny_{family}", "first", overrides=[override], echo=lambda *_: None)
    spec = {"dflash": "{gru_hidden_dim: 24, rank: 8}", "medusa": "{gru_hidden_dim: 24, rank: 8}",
            "pard": "{gru_hidden_dim: 16, rank: 8}"}[family]
    (tmp_path / "r.yaml").write_text(f"target:\n  random: {TARGET}\ndrafter: {{family: {family}, path: first/drafter}}\n"
                                     f"head: {spec}\n")
    assert main(["apply", "r.yaml", "-o", "second"]) == 0, capsys.readouterr().err
    resolved = json.loads((tmp_path / "second" / "recipe.resolved.json").read_text())["drafter"]
    key, value = checkpoint_value.split(": ")
    assert resolved[key] == int(value)
    assert main(["generate", "second", "--prompt-ids", "5 6 7", "--max-new-tokens", "3"]) == 0, capsys.readouterr().err
    # a value the user did set and that contradicts the checkpoint stays an error, naming both
    (tmp_path / "bad.yaml").write_text((tmp_path / "r.yaml").read_text().replace(
        "path: first/drafter}", f"path: first/drafter, {key}: {int(value) + 1}}}"))
    assert main(["apply", "bad.yaml", "--dry-run"]) == 1
    assert f"drafter.{key}: {int(value) + 1} conflicts with the checkpoint's" in capsys.readouterr().err
