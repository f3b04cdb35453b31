"""`generate` for several prompts: labelled answers, one batch per --batch-size (decoding/batched.py)."""

from __future__ import annotations

import json

from tests.decoding.test_decoding import run_command

PROMPTS = ["5,6,7,8", "9 10", "3", "12 4 8 30 2 11 7"]


def answers(out: str) -> dict[str, list[int]]:
    """'[label] id id ...' lines -> {label: ids}."""
    got = {}
    for line in out.strip().splitlines():
        label, _, rest = line.partition("] ")
        assert label.startswith("["), line
        got[label[1:]] = [int(x) for x in rest.split()]
    return got


def test_generate_several_prompts_as_batches(tiny_run, tmp_path, capsys):
    solo = []
    for ids in PROMPTS:  # one prompt: streamed and unlabelled, as before
        assert run_command("generate", [str(tiny_run), "--prompt-ids", ids, "--max-new-tokens", "7"]) == 0
        cap = capsys.readouterr()
        assert "[" not in cap.out and cap.err.count("tau ") == 1
        solo.append([int(x) for x in cap.out.split()])
    want = {str(n + 1): ids for n, ids in enumerate(solo)}
    many = [a for ids in PROMPTS for a in ("--prompt-ids", ids)]
    for extra in (["--batch-size", "4"], ["--batch-size", "3"], ["--batch-size", "1"],
                  ["--batch-size", "4", "--target-only"], ["--batch-size", "2", "--no-head"]):
        assert run_command("generate", [str(tiny_run), *many, "--max-new-tokens", "7", *extra]) == 0, extra
        cap = capsys.readouterr()
        assert answers(cap.out) == want, extra
        assert cap.err.count("tau ") == 4 and "[3] tau" in cap.err
        batches = -(-4 // int(extra[1]))
        assert cap.err.count("tokens/s in total") == (batches if extra[1] != "1" else 0), cap.err

    # a prompt file, its "id" labels; sampling reproducible with a seed
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"id": f"q{n}", "prompt_ids": [int(x) for x in ids.replace(",", " ").split()]})
                         + "\n" for n, ids in enumerate(PROMPTS)))
    assert run_command("generate", [str(tiny_run), "--prompts", str(f), "--batch-size", "4", "--max-new-tokens",
                                    "7"]) == 0
    assert answers(capsys.readouterr().out) == {f"q{n}": ids for n, ids in enumerate(solo)}
    sampled = []
    for _ in range(2):
        assert run_command("generate", [str(tiny_run), "--prompts", str(f), "--batch-size", "3", "--max-new-tokens",
                                        "7", "--temperature", "1", "--seed", "0"]) == 0
        sampled.append(answers(capsys.readouterr().out))
    assert sampled[0] == sampled[1] and sorted(sampled[0]) == ["q0", "q1", "q2", "q3"]
    assert all(1 <= len(v) <= 7 for v in sampled[0].values())


def test_generate_batch_errors_name_the_flag(tiny_run, capsys):
    assert run_command("generate", [str(tiny_run), "--prompt-ids", "5", "--prompt-ids", "5 x", "--batch-size",
                                    "2"]) == 1
    assert "--prompt-ids #2: id 2, 'x', is not a token id" in capsys.readouterr().err
    assert run_command("generate", [str(tiny_run), "--prompt-ids", "5", "--batch-size", "0"]) == 1
    assert "--batch-size: 0 is invalid; valid: an integer >= 1" in capsys.readouterr().err
    assert run_command("generate", [str(tiny_run), "--prompt-ids", "5", "--prompt-ids", "500"]) == 1
    assert "--prompt-ids #2: prompt_ids[0]: 500 is outside the target vocabulary" in capsys.readouterr().err
