"""Hardening, round 2 (issue #43): a second fuzz round over the features added since the first.

Table-driven like test_inputs.py: each Case writes its files into a fresh folder (the current
directory while it runs), runs `domino_graft.cli.main(argv)` in-process, and checks the exit code,
that every expected fragment is in stderr (the culprit, the bad value, what is valid), that stderr
holds no traceback and no over-long line, that nothing is refused in more time than `seconds`, and,
for a failing command, that no file appeared or changed. Classes (CLASSES below): batched and
sampled decoding, export and inspect, plug-in families, recipes. The faults (a file-size limit,
two exports racing, a read-only run dir) are tests of their own after the table.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

import pytest

from domino_graft.cli import main
from tests.conftest import REPO

FAMILIES = ("dflash", "medusa", "pard", "dspark", "peagle")
TARGET = ("{architecture: qwen3, vocab_size: 97, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, "
          "head_dim: 8, intermediate_size: 64, eos_token_id: 1, seed: 0}")
DFLASH = f"target:\n  random: {TARGET}\ndrafter: {{family: dflash, block_size: 8, mask_token_id: 96}}\n" \
         "head: {gru_hidden_dim: 8, rank: 4}\n"
EVIL_MARK = "evil-was-run"


def jsonl(*rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


P3 = jsonl({"prompt_ids": [5, 6]}, {"prompt_ids": [7, 8, 9]}, {"prompt_ids": [10]})


@dataclass
class Case:
    id: str
    group: str  # one of CLASSES
    argv: list[str]  # "{dflash}" ... "{peagle}" (runs), "{hfb}" (an hf bundle), "{R}" (the repo): replaced
    expect: list[str] = field(default_factory=list)  # fragments stderr must hold
    files: dict[str, Union[str, bytes]] = field(default_factory=dict)
    rc: int = 1
    setup: Optional[Callable[[Path], None]] = None  # extra preparation in the case folder
    plugins: tuple = ()  # (entry point name, "module:attr") registered for the case
    seconds: float = 20.0  # a refusal must come at least this fast
    absent: tuple[str, ...] = ()  # fragments stderr must not hold


CLASSES = ("decode", "export-inspect", "plugins", "recipes")  # the faults need processes: after the table


def _fifo(work: Path) -> None:
    os.mkfifo(work / "fifo.jsonl")


def _sparse(work: Path) -> None:
    with open(work / "sparse.jsonl", "wb") as f:
        f.truncate(2 * 2**30)  # 2 GB of holes: no disk used, and no newline anywhere


def _folder(name: str, config: Union[str, dict], weights: Optional[bytes] = None, wname: str = "model.safetensors"):
    def setup(work: Path) -> None:
        d = work / name
        d.mkdir()
        (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        if weights is not None:
            (d / wname).write_bytes(weights)
    return setup


def _safetensors_header(header: dict, length: Optional[int] = None) -> bytes:
    import struct

    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h


PEAGLE_CFG = {"speculators_model_type": "peagle"}


def _evil_pickle(work: Path) -> None:
    """A medusa folder whose .pt would, unpickled without weights_only, create a file."""
    import pickle

    class Evil:
        def __reduce__(self):
            return (open, (str(work / EVIL_MARK), "w"))

    d = work / "pick"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1, "hidden_size": 32,
                                               "vocab_size": 97}))
    (d / "medusa_lm_head.pt").write_bytes(pickle.dumps({"0.0.linear.weight": Evil()}))


def _symlink_loop(work: Path) -> None:
    d = work / "loop"
    d.mkdir()
    os.symlink("config.json", d / "config.json")


def _self_link(work: Path) -> None:
    _folder("selfl", PEAGLE_CFG)(work)
    os.symlink(".", work / "selfl" / "self")
    os.symlink("b", work / "selfl" / "a")
    os.symlink("a", work / "selfl" / "b")


def _copy_hf_bundle(swap: Optional[str] = None, extra: Optional[str] = None):
    """The hf bundle copied to ./b, one .py replaced (or one added) and manifest.json re-signed."""
    def setup(work: Path) -> None:
        from domino_graft.artifacts.files import sha256_file

        shutil.copytree(Path(os.environ["_ROUND2_HFB"]), work / "b")
        target = work / "b" / (swap or extra)
        target.write_text(f"open({str(work / EVIL_MARK)!r}, 'w')\n")
        m = json.loads((work / "b" / "manifest.json").read_text())
        m["files"][target.name] = sha256_file(target)
        (work / "b" / "manifest.json").write_text(json.dumps(m, indent=2))
    return setup


PLUGIN_RAISES = ("broken", "round2_plugins:RAISES")
CASES = [
    # ---------------------------------------------------------- batched and sampled decoding
    Case("gen-prompts-blank-lines-skipped", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl",
                                                        "--max-new-tokens", "3"], [], {"p.jsonl": jsonl(
                                                            {"prompt_ids": [5]}, "", "   ", {"prompt_ids": [6]})}, rc=0),
    Case("gen-prompts-only-blank-lines", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl"],
         ["--prompts: p.jsonl holds no prompts; valid: one JSON object per line"], {"p.jsonl": "\n\n  \n"}),
    Case("gen-prompts-empty-file", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl"],
         ["p.jsonl holds no prompts"], {"p.jsonl": ""}),
    Case("gen-prompts-mixed-ids-and-text", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl",
                                                       "--max-new-tokens", "3", "--batch-size", "2"],
         ["byte fallback"], {"p.jsonl": jsonl({"prompt_ids": [5, 6]}, {"prompt": "hello"})}, rc=0),
    Case("gen-prompts-zero-token-ids", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl"],
         ["p.jsonl:2: prompt_ids: [] is empty; valid: a non-empty list"],
         {"p.jsonl": jsonl({"prompt_ids": [5]}, {"prompt_ids": []})}),
    Case("gen-prompts-over-long", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl", "--max-new-tokens", "4"],
         ["p.jsonl:1: 3,000 prompt tokens + 4 new tokens", "the target has 2,048 positions"],
         {"p.jsonl": jsonl({"prompt_ids": [5] * 3000})}),
    Case("gen-prompts-2gb-sparse-file", "decode", ["generate", "{dflash}", "--prompts", "sparse.jsonl"],
         ["sparse.jsonl:1: a binary file (NUL byte at offset 0)"], setup=_sparse, seconds=8),
    Case("gen-prompts-line-over-16mb", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl"],
         ["p.jsonl:1: a line longer than 16,777,216 bytes"], {"p.jsonl": "x" * (17 * 2**20)}),
    Case("gen-prompts-fifo-no-hang", "decode", ["generate", "{dflash}", "--prompts", "fifo.jsonl"],
         ["--prompts: 'fifo.jsonl' does not exist or is not a file"], setup=_fifo, seconds=5),
    Case("gen-prompts-dev-zero-no-hang", "decode", ["generate", "{dflash}", "--prompts", "/dev/zero"],
         ["'/dev/zero' does not exist or is not a file"], seconds=5),
    Case("gen-prompts-negative-id", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl"],
         ["p.jsonl:1: prompt_ids[0]: -1 is negative; valid: integers >= 0"], {"p.jsonl": jsonl({"prompt_ids": [-1]})}),
    Case("gen-prompts-float-id", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl"],
         ["prompt_ids[0]: 5.5 (a number) is not a token id"], {"p.jsonl": jsonl({"prompt_ids": [5.5]})}),
    Case("gen-prompts-huge-id", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl"],
         ["prompt_ids[0]: 1000000000000000000000000000000 is outside the target vocabulary; valid: 0..96"],
         {"p.jsonl": '{"prompt_ids": [1000000000000000000000000000000]}\n'}),
    Case("gen-prompts-two-kinds-on-a-line", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl"],
         ["p.jsonl:1: each line needs exactly one of", "'prompt', 'prompt_ids'"],
         {"p.jsonl": jsonl({"prompt_ids": [5], "prompt": "x"})}),
    Case("gen-batch-size-0", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl", "--batch-size", "0"],
         ["--batch-size: 0 is invalid; valid: an integer >= 1"], {"p.jsonl": P3}),
    Case("gen-batch-size-negative", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl", "--batch-size", "-1"],
         ["--batch-size: -1 is invalid"], {"p.jsonl": P3}),
    Case("gen-batch-size-1e6", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl", "--batch-size", "1000000",
                                          "--max-new-tokens", "3"], ["batch of 3 (prompts 1..3)"], {"p.jsonl": P3}, rc=0),
    Case("bench-batch-size-0", "decode", ["bench", "{dflash}", "--prompts", "p.jsonl", "--batch-size", "0"],
         ["--batch-size: 0 is invalid"], {"p.jsonl": P3}),
    Case("bench-batch-size-negative", "decode", ["bench", "{dflash}", "--prompts", "p.jsonl", "--batch-size", "-1"],
         ["--batch-size: -1 is invalid"], {"p.jsonl": P3}),
    Case("bench-batch-size-1e6", "decode", ["bench", "{dflash}", "--prompts", "p.jsonl", "--batch-size", "1000000",
                                            "--max-new-tokens", "3", "--no-progress"], [], {"p.jsonl": P3}, rc=0),
    Case("gen-temperature-nan", "decode", ["generate", "{dflash}", "--prompt-ids", "5 6", "--temperature", "nan"],
         ["--temperature: nan is invalid; valid: a finite number >= 0"]),
    Case("gen-temperature-negative", "decode", ["generate", "{dflash}", "--prompt-ids", "5 6", "--temperature", "-1"],
         ["--temperature: -1.0 is invalid"]),
    Case("gen-temperature-inf", "decode", ["generate", "{dflash}", "--prompt-ids", "5 6", "--temperature", "inf"],
         ["--temperature: inf is invalid"]),
    Case("gen-temperature-1e9-samples", "decode", ["generate", "{dflash}", "--prompt-ids", "5 6", "--temperature",
                                                   "1e9", "--seed", "1", "--max-new-tokens", "3"], [], rc=0),
    Case("gen-top-p-0", "decode", ["generate", "{dflash}", "--prompt-ids", "5 6", "--temperature", "1", "--top-p", "0"],
         ["--top-p: 0.0 is invalid; valid: 0 < top_p <= 1"]),
    Case("gen-top-p-1.5", "decode", ["generate", "{dflash}", "--prompt-ids", "5", "--temperature", "1", "--top-p",
                                     "1.5"], ["--top-p: 1.5 is invalid"]),
    Case("gen-top-p-nan", "decode", ["generate", "{dflash}", "--prompt-ids", "5", "--temperature", "1", "--top-p",
                                     "nan"], ["--top-p: nan is invalid"]),
    Case("gen-top-k-0-is-off", "decode", ["generate", "{dflash}", "--prompt-ids", "5 6", "--temperature", "1",
                                          "--top-k", "0", "--seed", "0", "--max-new-tokens", "3"], [], rc=0),
    Case("gen-top-k-negative", "decode", ["generate", "{dflash}", "--prompt-ids", "5", "--temperature", "1", "--top-k",
                                          "-3"], ["--top-k: -3 is invalid; valid: an integer >= 0"]),
    Case("gen-top-k-1e9-is-the-vocabulary", "decode", ["generate", "{dflash}", "--prompt-ids", "5 6", "--temperature",
                                                       "1", "--top-k", "1000000000", "--seed", "0",
                                                       "--max-new-tokens", "3"], [], rc=0),
    Case("gen-seed-negative", "decode", ["generate", "{dflash}", "--prompt-ids", "5 6", "--temperature", "1", "--seed",
                                         "-5", "--max-new-tokens", "3"], [], rc=0),
    Case("gen-seed-1e23", "decode", ["generate", "{dflash}", "--prompt-ids", "5 6", "--temperature", "1", "--seed",
                                     "100000000000000000000000"],
         ["--seed: 100000000000000000000000 is invalid; valid: an integer in -9223372036854775808.."]),
    Case("gen-seed-1e23-batched", "decode", ["generate", "{dflash}", "--prompts", "p.jsonl", "--batch-size", "3",
                                             "--temperature", "1", "--seed", str(2**64)],
         [f"--seed: {2**64} is invalid"], {"p.jsonl": P3}),
    Case("bench-seed-1e23", "decode", ["bench", "{dflash}", "--prompts", "p.jsonl", "--temperature", "1", "--seed",
                                       "100000000000000000000000", "--no-progress"],
         ["--seed: 100000000000000000000000 is invalid"], {"p.jsonl": P3}),
    Case("bench-temperature-nan", "decode", ["bench", "{dflash}", "--prompts", "p.jsonl", "--temperature", "nan"],
         ["--temperature: nan is invalid"], {"p.jsonl": P3}),
    Case("bench-top-p-0", "decode", ["bench", "{dflash}", "--prompts", "p.jsonl", "--temperature", "1", "--top-p", "0"],
         ["--top-p: 0.0 is invalid"], {"p.jsonl": P3}),
    Case("bench-top-k-negative", "decode", ["bench", "{dflash}", "--prompts", "p.jsonl", "--temperature", "1",
                                            "--top-k", "-3"], ["--top-k: -3 is invalid"], {"p.jsonl": P3}),
    Case("bench-limit-0", "decode", ["bench", "{dflash}", "--prompts", "p.jsonl", "--limit", "0"],
         ["--limit: 0 is invalid; valid: an integer >= 1"], {"p.jsonl": P3}),
    Case("gen-max-new-tokens-0", "decode", ["generate", "{dflash}", "--prompt-ids", "5", "--max-new-tokens", "0"],
         ["--max-new-tokens: 0 is invalid; valid: an integer >= 1"]),
    Case("gen-prompt-ids-empty", "decode", ["generate", "{dflash}", "--prompt-ids", ""],
         ["--prompt-ids: '' holds no ids"]),
    Case("bench-engine-sglang-medusa-refused", "decode", ["bench", "{medusa}", "--engine", "sglang", "--prompts",
                                                          "p.jsonl"],
         ["bench --engine sglang: SGLang cannot serve Medusa-1 drafters"], {"p.jsonl": P3}),
    Case("bench-engine-sglang-sampling-refused", "decode", ["bench", "{dflash}", "--engine", "sglang", "--prompts",
                                                            "p.jsonl", "--temperature", "0.5"],
         ["--temperature: 0.5 with --engine sglang: its Domino runtime is greedy only; valid: 0"], {"p.jsonl": P3}),
    Case("bench-engine-sglang-contradicts-rollout", "decode", ["bench", "{dflash}", "--engine", "sglang", "--rollout",
                                                               "torch", "--prompts", "p.jsonl"],
         ["--rollout torch contradicts --engine sglang"], {"p.jsonl": P3}),
    Case("bench-engine-sglang-block-shared", "decode", ["bench", "{dflash}", "--engine", "sglang", "--prompts",
                                                        "p.jsonl", "--max-new-tokens", "4", "--no-progress", "--json",
                                                        "b.json"],
         ["domino drafts from SGLang's candidates: one block_shared pool of 2048 per block"], {"p.jsonl": P3}, rc=0),
    # --------------------------------------------------------------------- export and inspect
    *[Case(f"export-dry-{fam}-{eng}", "export-inspect", ["export", "{" + fam + "}", "--dry-run", "--engine", eng],
           expect, rc=rc, absent=("engines module", "no entry there"))
      for fam, eng, rc, expect in [
          ("dflash", "sglang", 0, []), ("dflash", "vllm", 0, []), ("dflash", "hf", 0, []),
          ("medusa", "sglang", 1, ["SGLang cannot serve Medusa-1 drafters: SGLang has no Medusa algorithm"]),
          ("medusa", "vllm", 1, ["vLLM cannot serve Medusa-1 drafters"]),
          ("pard", "sglang", 1, ["SGLang cannot serve PARD drafters"]),
          ("dspark", "sglang", 1, ["SGLang cannot serve DSpark drafters: SGLang's DSPARK algorithm runs DSpark's own "
                                   "Markov head, not a Domino head"]),
          ("dspark", "vllm", 1, ["export --engine vllm: the recipe's target is random (target.random, seed 0)",
                                 "DSpark drafter's speculators_config.verifier.name_or_path is null"]),
          ("dspark", "hf", 1, ["transformers cannot serve DSpark drafters: there is no transformers remote code"]),
          ("peagle", "vllm", 1, ["the recipe's target is random", "P-EAGLE drafter's speculators_config.verifier"]),
          ("peagle", "sglang", 1, ["SGLang has no P-EAGLE algorithm"])]],
    Case("export-engine-contradicts-format", "export-inspect", ["export", "{dflash}", "--dry-run", "--engine", "vllm",
                                                                "--format", "hf"],
         ["--format hf contradicts --engine vllm"]),
    Case("export-hf-format-for-medusa", "export-inspect", ["export", "{medusa}", "--dry-run", "--format", "hf",
                                                           "--dtype", "fp16"],
         ["export.format: 'hf' is not available for medusa drafters; valid: native"]),
    Case("export-hf-format-for-peagle", "export-inspect", ["export", "{peagle}", "--dry-run", "--format", "hf"],
         ["'hf' is not available for peagle drafters"]),
    Case("export-dry-run-of-no-run", "export-inspect", ["export", "nowhere", "--dry-run"], ["nowhere"]),
    Case("inspect-random-bytes", "export-inspect", ["inspect", "rand"], ["no registered drafter family recognises rand"],
         setup=_folder("rand", os.urandom(4000).hex(), os.urandom(3000))),
    Case("inspect-a-file", "export-inspect", ["inspect", "x.bin"], ["'x.bin' is not a folder"], {"x.bin": b"\x00" * 10}),
    Case("inspect-dev-null", "export-inspect", ["inspect", "/dev/null"], ["'/dev/null' is not a folder"]),
    Case("inspect-0-byte-safetensors", "export-inspect", ["inspect", "z"],
         ["z/model.safetensors: not a readable safetensors file", "header too small"],
         setup=_folder("z", PEAGLE_CFG, b"")),
    Case("inspect-header-claims-huge-tensor", "export-inspect", ["inspect", "h"],
         ["h/model.safetensors: not a readable safetensors file"], seconds=5,
         setup=_folder("h", PEAGLE_CFG, _safetensors_header(
             {"w": {"dtype": "F32", "shape": [10**12, 10**6], "data_offsets": [0, 4 * 10**18]}}))),
    Case("inspect-header-length-2-62", "export-inspect", ["inspect", "h"], ["header too large"], seconds=5,
         setup=_folder("h", PEAGLE_CFG, _safetensors_header({}, length=2**62))),
    Case("inspect-50mb-config", "export-inspect", ["inspect", "big"],
         ["big/config.json: 50,000,0", "bytes; valid: a JSON object of at most 16,777,216 bytes"], seconds=5,
         setup=_folder("big", '{"speculators_model_type": "peagle", "pad": "' + "x" * 50_000_000 + '"}')),
    Case("inspect-deep-json-array", "export-inspect", ["inspect", "deep"],
         ["deep/config.json: JSON nested too deeply to read"], setup=_folder("deep", "[" * 100_000 + "]" * 100_000)),
    Case("inspect-deep-json-object", "export-inspect", ["inspect", "deep"], ["deep/config.json: JSON nested too deeply"],
         setup=_folder("deep", '{"a":' * 100_000 + "1" + "}" * 100_000)),
    Case("inspect-config-symlink-loop", "export-inspect", ["inspect", "loop"],
         ["loop/config.json: Too many levels of symbolic links"], setup=_symlink_loop),
    Case("inspect-folder-with-link-cycles", "export-inspect", ["inspect", "selfl"], [], setup=_self_link, rc=0,
         seconds=10),
    Case("inspect-pickle-never-runs", "export-inspect", ["inspect", "pick"], [], setup=_evil_pickle, rc=0),
    Case("apply-pickle-drafter-refused-unrun", "export-inspect", ["apply", "m.yaml", "-o", "out"],
         ["pick/medusa_lm_head.pt: not a readable torch file of plain tensors", "nothing in it was run"],
         {"m.yaml": f"target:\n  random: {TARGET}\ndrafter: {{family: medusa, path: pick}}\n"
                    "head: {gru_hidden_dim: 8, rank: 4}\n"}, setup=_evil_pickle, absent=("weights_only` set to `False",)),
    Case("inspect-swapped-py-with-resigned-manifest", "export-inspect", ["inspect", "b"],
         ["modeling_domino.py differs from the remote code this domino-graft ships"], rc=0,
         setup=_copy_hf_bundle(swap="modeling_domino.py")),
    Case("generate-swapped-py-bundle-refused", "export-inspect", ["generate", "b", "--prompt-ids", "5 6"],
         ["b: modified after export", "modeling_domino.py differs from the remote code"],
         setup=_copy_hf_bundle(swap="modeling_domino.py")),
    Case("generate-bundle-with-extra-py-refused", "export-inspect", ["generate", "b", "--prompt-ids", "5"],
         ["evil.py is Python code domino-graft never writes"], setup=_copy_hf_bundle(extra="evil.py")),
    # ------------------------------------------------------------------------ plug-in families
    Case("families-plugin-raises-at-import", "plugins", ["families"],
         ["entry point 'broken' (round2_plugins:RAISES)", "could not be imported (RuntimeError: boom at import)",
          "1 installed plug-in(s) ignored: 'broken'"], plugins=(PLUGIN_RAISES,)),
    Case("validate-with-a-broken-plugin-installed", "plugins", ["validate", "r.yaml"],
         ["warning: entry point 'broken'", "the plug-in is ignored"], {"r.yaml": DFLASH}, rc=0,
         plugins=(PLUGIN_RAISES,)),
    Case("apply-with-a-broken-plugin-installed", "plugins", ["apply", "r.yaml", "--dry-run"], ["warning: entry point"],
         {"r.yaml": DFLASH}, rc=0, plugins=(PLUGIN_RAISES,)),
    Case("validate-recipe-naming-the-broken-plugin", "plugins", ["validate", "r.yaml"],
         ["drafter.family: 'broken' is an installed plug-in that failed to load", "boom at import"],
         {"r.yaml": DFLASH.replace("family: dflash", "family: broken")}, plugins=(PLUGIN_RAISES,)),
    Case("families-plugin-collides-with-builtin", "plugins", ["families"],
         ["entry point 'dflash' (round2_plugins:COLLIDES)",
          "family name 'dflash' is already registered by domino_graft.adapters.dflash"],
         plugins=(("dflash", "round2_plugins:COLLIDES"),)),
    Case("apply-with-colliding-plugin-uses-builtin", "plugins", ["apply", "r.yaml", "--dry-run"],
         ["already registered"], {"r.yaml": DFLASH}, rc=0, plugins=(("dflash", "round2_plugins:COLLIDES"),)),
    Case("families-plugin-returns-an-int", "plugins", ["families"],
         ["(round2_plugins:AN_INT)", "int is not a domino_graft.adapters.family.Family"],
         plugins=(("w", "round2_plugins:AN_INT"),)),
    Case("families-plugin-returns-a-function", "plugins", ["families"], ["function is not a"],
         plugins=(("w", "round2_plugins:A_FUNCTION"),)),
    Case("families-plugin-class-init-raises", "plugins", ["families"],
         ["(round2_plugins:NEEDS_ARGS)", "NeedsArgs() failed (TypeError: needs args)"],
         plugins=(("w", "round2_plugins:NEEDS_ARGS"),), absent=("internal error",)),
    Case("families-plugin-calls-sys-exit", "plugins", ["families"],
         ["entry point 'x' (round2_exits:F)", "could not be imported (SystemExit: 3)"],
         plugins=(("x", "round2_exits:F"),)),
    Case("families-plugin-name-not-a-string", "plugins", ["families"],
         ["name 5 is not a family name; valid: a non-empty string"], plugins=(("n", "round2_plugins:NUMBER_NAMED"),)),
    Case("families-plugin-missing-attribute", "plugins", ["families"],
         ["(round2_plugins:MISSING)", "AttributeError"], plugins=(("m", "round2_plugins:MISSING"),)),
    Case("families-plugin-module-missing", "plugins", ["families"], ["No module named 'round2_nowhere'"],
         plugins=(("m", "round2_nowhere:X"),)),
    # ------------------------------------------------------------------------------- recipes
    *[Case(f"recipe-{key.replace('.', '-')}-1e9", "recipes", ["apply", "r.yaml", "--dry-run", f"{key}=1000000000"],
           [f"{key}: 1000000000 is invalid; valid: {valid}"], {"r.yaml": DFLASH}, seconds=5)
      for key, valid in [("train.max_steps", "1..100,000,000"), ("drafter.block_size", "2..1,024"),
                         ("head.rank", "1..131,072"), ("head.gru_hidden_dim", "1..131,072"),
                         ("drafter.num_layers", "1..512"), ("train.batch_size", "1..65,536"),
                         ("target.random.vocab_size", "8..4,194,304"), ("target.random.num_layers", "1..512")]],
    Case("recipe-anchors-per-seq-1e9", "recipes", ["apply", "r.yaml", "--dry-run", "train.anchors_per_seq=1000000000"],
         ["train.anchors_per_seq: 1000000000 is more than train.data.max_length 256; valid: 1..256"],
         {"r.yaml": DFLASH}),
    *[Case(f"recipe-{fam}-{key.split('.')[-1]}-1e9", "recipes", ["apply", f"{{R}}/recipes/tiny_{fam}.yaml",
                                                                  "--dry-run", f"{key}=1000000000"],
           [f"{key}: 1000000000 is invalid; valid: {valid}"], seconds=5)
      for fam, key, valid in [("medusa", "drafter.num_heads", "1..1,024"), ("pard", "drafter.num_slots", "2..1,024"),
                              ("peagle", "drafter.num_slots", "2..1,024"), ("dspark", "drafter.num_layers", "1..512")]],
    Case("recipe-sizes-beyond-memory", "recipes", ["apply", "r.yaml", "-o", "out", "target.random.vocab_size=4000000",
                                                   "head.rank=100000"],
         ["apply: the graft needs ~1,490.", "GiB to build (largest: head.embed_proj.2.weight [4000000, 100000]",
          "nothing was written"], {"r.yaml": DFLASH}, seconds=10),
    Case("recipe-name-with-slash", "recipes", ["validate", "r.yaml"],
         ["name: 'a/b' is not a plain name; valid: 1-128 letters, digits"], {"r.yaml": "name: a/b\n" + DFLASH}),
    Case("recipe-name-with-dotdot", "recipes", ["apply", "r.yaml", "--dry-run", "name=../evil"],
         ["name: '../evil' is not a plain name", "no '..'"], {"r.yaml": DFLASH}),
    Case("recipe-seed-1e23", "recipes", ["validate", "r.yaml"], ["head.seed: 100000000000000000000000 is invalid"],
         {"r.yaml": DFLASH.replace("rank: 4}", "rank: 4, seed: 100000000000000000000000}")}),
    Case("train-data-dev-zero-no-hang", "recipes", ["train", "{dflash}", "train.data.path=/dev/zero",
                                                    "train.data.synthetic=null", "--max-steps", "1"],
         ["train.data.path: '/dev/zero' is not a supported dataset"], seconds=10),
    Case("train-data-fifo-no-hang", "recipes", ["train", "{dflash}", "train.data.path=fifo.jsonl",
                                                "train.data.synthetic=null", "--max-steps", "1"],
         ["fifo.jsonl' is not a supported dataset"], setup=_fifo, seconds=10),
    Case("train-data-2gb-sparse-file", "recipes", ["train", "{dflash}", "train.data.path=sparse.jsonl",
                                                   "train.data.synthetic=null", "--max-steps", "1"],
         ["sparse.jsonl:1: a binary file (NUL byte at offset 0)"], setup=_sparse, seconds=10),
]


# ------------------------------------------------------------------------------ fixtures
PLUGINS_SRC = '''
from domino_graft.adapters.dflash import FAMILY as COLLIDES

AN_INT = 42


def A_FUNCTION():
    return None


class NeedsArgs:
    def __init__(self):
        raise TypeError("needs args")


NEEDS_ARGS = NeedsArgs


class _Named:
    name, display_name, schema, model_module, bundle_files = 5, "x", None, "x", None


NUMBER_NAMED = _Named()


def __getattr__(name):
    if name == "RAISES":
        raise RuntimeError("boom at import")
    raise AttributeError(f"module 'round2_plugins' has no attribute {name!r}")
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """A fresh tiny run of every family, and an fp32 hf bundle of the DFlash one."""
    from domino_graft.apply import apply_recipe
    from domino_graft.export.run import export_run

    root = tmp_path_factory.mktemp("round2")
    out = {fam: root / fam for fam in FAMILIES}
    for fam, path in out.items():
        apply_recipe(str(REPO / "recipes" / f"tiny_{fam}.yaml"), str(path), echo=lambda *_: None)
    out["hfb"] = export_run(str(out["dflash"]), str(root / "hfb"), format="hf", dtype="fp32", device="cpu",
                            echo=lambda *_: None)
    site = root / "site"
    site.mkdir()
    (site / "round2_plugins.py").write_text(PLUGINS_SRC)
    (site / "round2_exits.py").write_text("import sys\nsys.exit(3)\n")
    out["site"] = site
    return out


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}


@pytest.fixture
def plugins(runs, monkeypatch):
    """Register fake entry points (module:attr on a temporary path) for one case; the registry's
    scan is redone before and after, so no other test sees them."""
    from domino_graft import registry

    real = importlib.metadata.entry_points

    def install(pairs):
        monkeypatch.syspath_prepend(str(runs["site"]))
        eps = [importlib.metadata.EntryPoint(n, v, registry.ENTRY_POINT_GROUP) for n, v in pairs]

        def fake(group=None, **kw):
            if group == registry.ENTRY_POINT_GROUP:
                return eps
            return real(group=group, **kw) if group is not None else real(**kw)

        monkeypatch.setattr(importlib.metadata, "entry_points", fake)
        registry._scan.cache_clear()

    yield install
    registry._scan.cache_clear()
    for mod in ("round2_plugins", "round2_exits"):
        sys.modules.pop(mod, None)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_round2_case(case, runs, plugins, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("_ROUND2_HFB", str(runs["hfb"]))
    names = {**{k: str(v) for k, v in runs.items()}, "R": str(REPO)}

    def fill(text: str) -> str:
        for name, path in names.items():
            text = text.replace("{" + name + "}", path)
        return text

    for name, content in case.files.items():
        (work / name).write_bytes(fill(content).encode() if isinstance(content, str) else content)
    monkeypatch.chdir(work)
    if case.setup:
        case.setup(work)
    if case.plugins:
        plugins(case.plugins)
    argv = [fill(a) for a in case.argv]
    before = _tree(work)
    start = time.monotonic()
    rc = main(argv)
    took = time.monotonic() - start
    got = capsys.readouterr()
    err = got.err
    assert rc == case.rc, err
    assert "Traceback" not in err
    for fragment in case.expect:  # a refusal says it on stderr; a report (inspect) may say it on stdout
        assert fragment in err + got.out, f"{fragment!r} not in:\n{err}"
    for fragment in case.absent:
        assert fragment not in err, f"{fragment!r} in:\n{err}"
    assert not (work / EVIL_MARK).exists(), "code from a file was run"
    assert took < case.seconds, f"{took:.1f} s"
    if case.rc:
        assert all(len(line) < 400 for line in err.splitlines()), "an error line this long repeats a value"
        assert _tree(work) == before, "a failing command wrote files"


def test_the_round_has_sixty_cases_half_in_the_first_three_classes():
    by_class = {c: sum(case.group == c for case in CASES) for c in CLASSES}
    assert sum(by_class.values()) >= 60 and sum(by_class[c] for c in CLASSES[:3]) >= 30, by_class
    assert set(by_class) == set(CLASSES) and all(by_class.values()), by_class


# ------------------------------------------------------------- greedy batches = target alone
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_batches_equal_the_target_alone(family, runs, tmp_path, monkeypatch, capsys):
    """`generate --batch-size 1, 3, 7` prints, prompt by prompt, exactly what `--target-only` prints
    (greedy: lossless), for every family (each takes ragged batches; a family that does not is refused by
    name: tests/decoding/test_batched.py)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text(jsonl(*({"prompt_ids": list(range(5, 5 + n))} for n in (1, 4, 2, 7, 3, 5, 6))))
    base = ["generate", str(runs[family]), "--prompts", "p.jsonl", "--max-new-tokens", "6"]

    def answers(*extra) -> tuple[int, str, str]:
        rc = main(base + list(extra))
        got = capsys.readouterr()
        return rc, got.out, got.err

    rc, want, err = answers("--target-only")
    assert rc == 0, err
    for bs in ("1", "3", "7"):
        rc, out, err = answers("--batch-size", bs)
        assert rc == 0, err
        assert out == want, f"--batch-size {bs}"


# ------------------------------------------------------------------------ faults (processes)
def _cli(args, cwd, **kw):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "domino_graft", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, **kw)


def test_full_disk_during_export_leaves_nothing(runs, tmp_path):
    """`ulimit -f`: the first file over the limit fails the export with the path and the reason; no
    temporary folder is left, the destination never appears."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    r = _cli(["export", str(runs["dflash"]), "-o", "b", "--dtype", "fp32"], tmp_path, preexec_fn=limit)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "b/model.safetensors: File too large" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_two_exports_to_one_destination(runs, tmp_path, monkeypatch, capsys):
    """Two exports racing to one -o (two threads, both past the destination check before either
    renames): one writes the bundle; the other refuses, replacing nothing; the bundle verifies."""
    import threading

    from domino_graft.artifacts.bundle import verify_bundle
    from domino_graft.export import run as export

    both_checked = threading.Barrier(2, timeout=60)
    real = export.self_check

    def after_the_other(*a, **k):  # each waits here, its bundle written in its temporary folder
        both_checked.wait()
        return real(*a, **k)

    monkeypatch.setattr(export, "self_check", after_the_other)
    monkeypatch.chdir(tmp_path)
    results = []
    threads = [threading.Thread(target=lambda: results.append(main(["export", str(runs["dflash"]), "-o", "b",
                                                                      "--dtype", "fp32"]))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    err = capsys.readouterr().err
    assert sorted(results) == [0, 1], err
    assert "Traceback" not in err and "b: appeared while it was being written; nothing replaced" in err, err
    verify_bundle(tmp_path / "b")
    assert [p.name for p in tmp_path.iterdir()] == ["b"]


def test_export_refuses_a_run_being_trained(runs, tmp_path, monkeypatch, capsys):
    """`export` while `train` holds the run (its lock, taken by a live process): refused at once,
    naming the run and the trainer; nothing written, the run untouched."""
    from domino_graft.artifacts.lock import RunLock

    run = tmp_path / "run"
    shutil.copytree(runs["dflash"], run)
    monkeypatch.chdir(tmp_path)
    with RunLock(run, echo=lambda *a: None):
        before = _tree(run)
        assert main(["export", str(run), "-o", "b", "--dtype", "fp32"]) == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and _tree(run) == before
    err = capsys.readouterr().err
    assert f"export: {run} is being trained (pid {os.getpid()}" in err and "export it after that" in err, err


@pytest.mark.parametrize("command", ["train", "export"])
def test_read_only_run_dir(command, runs, tmp_path, monkeypatch, capsys):
    """A run on a read-only file system (simulated: root ignores permission bits): `train` fails at
    once naming the path and EROFS, and the run is unchanged; `export` only reads it."""
    import errno
    import tempfile

    run = tmp_path / "run"
    shutil.copytree(runs["dflash"], run)
    before = _tree(run)
    real_open, real_mkstemp = os.open, tempfile.mkstemp

    def inside(path) -> bool:
        return str(Path(path).resolve()).startswith(str(run))

    def ro_open(path, flags, *a, **k):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a, **k)

    def ro_mkstemp(*a, dir=None, **k):
        if dir is not None and inside(dir):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real_mkstemp(*a, dir=dir, **k)

    monkeypatch.setattr(os, "open", ro_open)
    monkeypatch.setattr(tempfile, "mkstemp", ro_mkstemp)
    monkeypatch.chdir(tmp_path)
    if command == "train":
        rc = main(["train", str(run), "--max-steps", "1"])
        err = capsys.readouterr().err
        assert rc == 1 and "Traceback" not in err, err
        assert str(run) in err and "Read-only file system" in err, err
    else:
        rc = main(["export", str(run), "-o", "b", "--dtype", "fp32"])
        assert rc == 0, capsys.readouterr().err
        assert (tmp_path / "b" / "manifest.json").is_file()
    assert _tree(run) == before


@pytest.mark.parametrize("sig,rc,said", [("SIGTERM", 143, "terminated (SIGTERM)"), ("SIGINT", 130, "interrupted")])
def test_signal_during_export_leaves_nothing(sig, rc, said, runs, tmp_path, monkeypatch, capsys):
    """TERM or INT while the bundle is being written (the signal arrives during its self-check,
    which runs in the temporary folder): the command unwinds, the temporary folder is removed,
    no bundle appears. (kill -9 cannot be caught: its temporary folder stays, hidden, and a new
    export to the same -o is unaffected.)"""
    import signal

    from domino_graft.export import run as export

    def signalled(*a, **k):
        os.kill(os.getpid(), getattr(signal, sig))
        time.sleep(30)  # the handler raises before this returns
        raise AssertionError("the signal did not stop the export")

    monkeypatch.setattr(export, "self_check", signalled)
    monkeypatch.chdir(tmp_path)
    # Python's own Ctrl-C handler, as a terminal's command has it: a suite started in the background of a
    # non-interactive shell (`pytest &`) inherits SIGINT ignored, and Python then keeps it ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(["export", str(runs["dflash"]), "-o", "b", "--dtype", "fp32"]) == rc
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_a_folder_that_lands_between_the_check_and_the_rename_is_named_not_replaced(tmp_path, monkeypatch):
    """atomic_dir(overwrite=False): the other writer's folder may land after the existence check, right
    before this rename (test_two_exports_to_one_destination's race, once seen as "Directory not empty"):
    the write still fails with the one message, and the folder that landed is kept."""
    import os

    from domino_graft.artifacts import files

    final = tmp_path / "b"
    real = os.replace

    def the_other_lands_first(src, dst):
        if str(dst) == str(final) and not final.exists():
            final.mkdir()
            (final / "theirs.txt").write_text("kept")
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", the_other_lands_first)
    with pytest.raises(FileExistsError, match="appeared while it was being written; nothing replaced"):
        with files.atomic_dir(final, overwrite=False) as tmp:
            (tmp / "mine.txt").write_text("mine")
    assert (final / "theirs.txt").read_text() == "kept" and not (final / "mine.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # no temporary folder left behind
