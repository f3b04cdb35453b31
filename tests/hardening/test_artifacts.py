"""Issue #26, artifacts: nothing of the user's is lost, nothing half-written, no NaN saved or
loaded, one clear line per failure.

Table-driven: each case prepares a copy of one trained tiny run (and of its bundle) in its
own folder, runs the real CLI in-process (`domino_graft.cli.main`, seconds instead of a
torch import per case), and checks the exit code, that the single `error:` line names the
culprit (file / field / tensor / path), that stderr holds no traceback, and that no file was
written or lost: every file under the case folder is hashed before and after (only the
paths a case names may change).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from domino_graft.cli import main
from tests.conftest import REPO, TINY_RECIPE

RUN, BUNDLE = "runs/tiny", "bundles/b"


# ------------------------------------------------------------------------------ fixture
@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """One trained tiny run (checkpoints step-2, step-4) and its fp32 bundle, built once."""
    from domino_graft.apply import apply_recipe
    from domino_graft.export.run import export_run
    from domino_graft.training.loop import train

    root = tmp_path_factory.mktemp("made")
    run = root / "run"
    apply_recipe(str(TINY_RECIPE), str(run), echo=lambda *_: None)
    train(str(run), ["train.lr=5e-2"], max_steps=4, save_every=2, progress=False, echo=lambda *_: None)
    bundle = export_run(str(run), str(root / "bundle"), dtype="fp32", device="cpu", echo=lambda *_: None)
    return {"run": run, "bundle": bundle}


class Env:
    """A case's folder (the cwd): runs/tiny and bundles/b are fresh copies."""

    def __init__(self, root: Path, made: dict, stack: contextlib.ExitStack, monkeypatch):
        self.root, self.stack, self.monkeypatch = root, stack, monkeypatch
        shutil.copytree(made["run"], root / RUN)
        shutil.copytree(made["bundle"], root / BUNDLE)

    def p(self, rel: str) -> Path:
        return self.root / rel

    def write(self, rel: str, text: str) -> Path:
        f = self.p(rel)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        return f

    def rm(self, rel: str) -> None:
        f = self.p(rel)
        shutil.rmtree(f) if f.is_dir() else f.unlink()

    def edit_json(self, rel: str, fn) -> None:
        f = self.p(rel)
        data = json.loads(f.read_text())
        fn(data)
        f.write_text(json.dumps(data, indent=2))

    def poison(self, rel: str, tensor: str, value=float("nan"), n: int = 3) -> None:
        """Put `n` non-finite values into one tensor of a safetensors file (metadata kept)."""
        from safetensors import safe_open

        f = self.p(rel)
        with safe_open(str(f), framework="pt") as fh:
            meta = fh.metadata()
        state = load_file(str(f))
        state[tensor].view(-1)[:n] = value
        save_file(state, str(f), metadata=meta)

    def holder(self, *, flock: bool = True) -> subprocess.Popen:
        """Another process: holding RUN's lock (flock=True), or a bare live pid (flock=False)."""
        code = ("import sys, time\n"
                "from domino_graft.artifacts.lock import RunLock\n"
                "RunLock(sys.argv[1], echo=lambda *a: None).acquire()\n" if flock else "import sys, time\n")
        code += "print('ready', flush=True)\ntime.sleep(120)\n"
        proc = subprocess.Popen([sys.executable, "-c", code, str(self.p(RUN))], stdout=subprocess.PIPE,
                                env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=self.root)
        self.stack.callback(lambda: (proc.poll() is None and proc.kill(), proc.wait()))
        assert proc.stdout.readline().strip() == b"ready"
        return proc

    def full_disk(self, skip: int = 0) -> None:
        """Every file the package writes through os.fdopen (after the first `skip`) fails with
        ENOSPC on write()."""
        real = os.fdopen
        opened = []

        class Full:
            def __init__(self, f):
                self.f = f

            def write(self, data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

        def fdopen(fd, *a, **k):
            opened.append(fd)
            return real(fd, *a, **k) if len(opened) <= skip else Full(real(fd, *a, **k))

        self.monkeypatch.setattr(os, "fdopen", fdopen)


@dataclass
class Case:
    id: str
    group: str
    setup: Callable[[Env], list[str]]
    needles: tuple[str, ...] = ()   # each must be in the one `error:` line (rc 1), or in stdout (rc 0)
    rc: int = 1
    allow: tuple[str, ...] = ()     # path prefixes (relative to the case folder) that may change
    check: Callable | None = None   # extra assertions: check(env, out, err)


CASES: list[Case] = []


def case(id: str, group: str, needles=(), rc: int = 1, allow=(), check=None):
    def deco(fn):
        CASES.append(Case(id, group, fn, tuple(needles), rc, tuple(allow), check))
        return fn
    return deco


def _bench_report(env: Env, rel: str) -> None:
    env.write(rel, json.dumps({"tau": 2.0, "per_slot_acceptance": [0.5], "identical_to_target": True}))


def _user_folder(env: Env, rel: str) -> None:
    env.write(f"{rel}/notes.txt", "my notes\n")
    env.write(f"{rel}/data.csv", "a,b\n1,2\n")


def _no_leftovers(env: Env, out: str, err: str) -> None:
    left = [str(p) for p in env.root.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]
    assert not left, left


# ------------------------------------------------------------------------------ outputs
@case("apply-o-onto-existing-run", "outputs", [RUN, "existing domino-graft run", "--force"])
def _(env):
    return ["apply", str(TINY_RECIPE), "-o", RUN]


@case("apply-default-destination-is-a-run", "outputs", ["runs/tiny_dflash", "existing domino-graft run", "--force"])
def _(env):
    shutil.copytree(env.p(RUN), env.p("runs/tiny_dflash"))
    return ["apply", "tiny_dflash"]


@case("apply-o-onto-user-folder", "outputs", ["mine", "not a domino-graft run", "notes.txt"])
def _(env):
    _user_folder(env, "mine")
    return ["apply", "tiny_dflash", "-o", "mine"]


@case("apply-o-onto-user-folder-even-with-force", "outputs", ["mine", "not a domino-graft run"])
def _(env):
    _user_folder(env, "mine")
    return ["apply", "tiny_dflash", "-o", "mine", "--force"]


@case("apply-o-onto-regular-file", "outputs", ["notes.txt", "a file of 9 bytes"])
def _(env):
    env.write("notes.txt", "my notes\n")
    return ["apply", "tiny_dflash", "-o", "notes.txt", "--force"]


@case("apply-o-onto-bundle-with-force", "outputs", [BUNDLE, "not a domino-graft run", "domino-graft bundle"])
def _(env):
    return ["apply", "tiny_dflash", "-o", BUNDLE, "--force"]


@case("apply-o-under-regular-file", "outputs", ["notes.txt/run", "notes.txt is a file"])
def _(env):
    env.write("notes.txt", "x\n")
    return ["apply", "tiny_dflash", "-o", "notes.txt/run"]


@case("apply-o-under-proc", "outputs", ["/proc/domino-graft-test/run", "/proc"])
def _(env):
    return ["apply", "tiny_dflash", "-o", "/proc/domino-graft-test/run"]


@case("apply-force-onto-run-being-trained", "outputs", [RUN, "in use", f"pid {os.getpid()}"])
def _(env):
    from domino_graft.artifacts.lock import RunLock

    env.stack.enter_context(RunLock(env.p(RUN), echo=lambda *a: None))
    return ["apply", "tiny_dflash", "-o", RUN, "--force"]


@case("apply-force-replaces-a-run-atomically", "outputs", ["replaced run dir runs/tiny"], rc=0, allow=(RUN, "runs/.latest"),
      check=lambda env, out, err: (_no_leftovers(env, out, err),
                                   not env.p(f"{RUN}/checkpoints").exists() or pytest.fail("old checkpoints kept"),
                                   "training" not in json.loads(env.p(f"{RUN}/manifest.json").read_text())
                                   or pytest.fail("old manifest kept")))
def _(env):
    return ["apply", "tiny_dflash", "-o", RUN, "--force"]


@case("export-o-onto-existing-bundle", "outputs", [BUNDLE, "existing domino-graft bundle", "native, fp32", "--force"])
def _(env):
    return ["export", RUN, "-o", BUNDLE, "--dtype", "fp32"]


@case("export-o-onto-the-run-itself-with-force", "outputs", [RUN, "not a domino-graft bundle", "domino-graft run"])
def _(env):
    return ["export", RUN, "-o", RUN, "--force"]


@case("export-o-onto-user-folder", "outputs", ["mine", "not a domino-graft bundle", "2 entries"])
def _(env):
    _user_folder(env, "mine")
    return ["export", RUN, "-o", "mine", "--force"]


@case("export-default-destination-is-a-bundle", "outputs", ["bundles/tiny-native-fp32", "existing domino-graft bundle"])
def _(env):
    shutil.copytree(env.p(BUNDLE), env.p("bundles/tiny-native-fp32"))
    return ["export", RUN, "--dtype", "fp32"]


@case("export-o-under-regular-file", "outputs", ["notes.txt/b", "notes.txt is a file"])
def _(env):
    env.write("notes.txt", "x\n")
    return ["export", RUN, "-o", "notes.txt/b"]


@case("export-force-replaces-a-bundle-atomically", "outputs", ["replaced bundle bundles/b"], rc=0, allow=(BUNDLE,),
      check=_no_leftovers)
def _(env):
    return ["export", RUN, "-o", BUNDLE, "--dtype", "fp32", "--force"]


@case("bench-json-onto-other-json", "outputs", ["--json", "results.json", "not a bench report"])
def _(env):
    env.write("results.json", json.dumps({"mine": [1, 2, 3]}))
    return ["bench", RUN, "--json", "results.json", "--no-progress"]


@case("bench-json-onto-existing-report", "outputs", ["--json", f"{RUN}/bench.json", "existing bench report", "--force"])
def _(env):
    _bench_report(env, f"{RUN}/bench.json")
    return ["bench", RUN, "--json", f"{RUN}/bench.json", "--no-progress"]


@case("bench-json-onto-folder", "outputs", ["--json", "mine", "a folder"])
def _(env):
    _user_folder(env, "mine")
    return ["bench", RUN, "--json", "mine", "--force", "--no-progress"]


@case("regenerate-o-onto-user-text", "outputs", ["-o", "notes.txt", "not a regenerate output"])
def _(env):
    env.write("notes.txt", "line one\nline two, not JSON\n")  # the old resume logic truncated this to nothing
    env.write("p.jsonl", '{"prompt_ids": [5, 9, 12]}\n')
    return ["regenerate", RUN, "--prompts", "p.jsonl", "-o", "notes.txt", "--no-progress"]


@case("regenerate-o-onto-folder", "outputs", ["-o", "mine", "a folder"])
def _(env):
    _user_folder(env, "mine")
    env.write("p.jsonl", '{"prompt_ids": [5, 9, 12]}\n')
    return ["regenerate", RUN, "--prompts", "p.jsonl", "-o", "mine", "--force", "--no-progress"]


@case("bench-json-under-proc", "outputs", ["--json", "/proc/domino-graft-test/bench.json", "/proc"])
def _(env):
    return ["bench", RUN, "--json", "/proc/domino-graft-test/bench.json", "--no-progress"]


@case("bench-json-force-replaces-a-report", "outputs", [f"wrote {RUN}/bench.json"], rc=0, allow=(f"{RUN}/bench.json",),
      check=lambda env, out, err: json.loads(env.p(f"{RUN}/bench.json").read_text())["num_prompts"] == 1
      or pytest.fail("not replaced"))
def _(env):
    _bench_report(env, f"{RUN}/bench.json")
    return ["bench", RUN, "--json", f"{RUN}/bench.json", "--force", "--limit", "1", "--max-new-tokens", "4",
            "--no-progress"]


@case("regenerate-o-under-regular-file", "outputs", ["-o", "notes.txt/out.jsonl", "notes.txt is a file"])
def _(env):
    env.write("notes.txt", "x\n")
    env.write("p.jsonl", '{"prompt_ids": [5, 9, 12]}\n')
    return ["regenerate", RUN, "--prompts", "p.jsonl", "-o", "notes.txt/out.jsonl", "--no-progress"]


def _resumed(env, out, err):
    lines = env.p("out.jsonl").read_text().splitlines()
    assert lines[0] == REGEN_LINE and len(lines) == 2 and json.loads(lines[1])["id"] == "1", lines


REGEN_LINE = json.dumps({"id": "0", "finish": "length", "prompt_ids": [5, 9, 12], "response_ids": [3, 4]})


@case("regenerate-o-own-output-is-resumed-not-replaced", "outputs", ["1 already in out.jsonl", "1 to go"], rc=0,
      allow=("out.jsonl",), check=_resumed)
def _(env):
    env.write("out.jsonl", REGEN_LINE + "\n")
    env.write("p.jsonl", '{"prompt_ids": [5, 9, 12]}\n{"prompt_ids": [7, 8]}\n')
    return ["regenerate", RUN, "--prompts", "p.jsonl", "-o", "out.jsonl", "--max-new-tokens", "2", "--no-progress"]


# ------------------------------------------------------------------------------ run dirs
@case("run-resolved-recipe-not-json", "run dirs", [f"{RUN}/recipe.resolved.json", "not valid JSON"])
def _(env):
    env.write(f"{RUN}/recipe.resolved.json", '{"name": "tiny_dflash", ')
    return ["export", RUN, "-o", "out"]


@case("run-manifest-not-json", "run dirs", [f"{RUN}/manifest.json", "not valid JSON"])
def _(env):
    env.write(f"{RUN}/manifest.json", "{oops")
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


@case("run-manifest-without-target", "run dirs", [f"{RUN}/manifest.json", "'target'", "missing"])
def _(env):
    env.edit_json(f"{RUN}/manifest.json", lambda m: m.pop("target"))
    return ["export", RUN, "-o", "out"]


@case("checkpoint-state-not-json", "run dirs", [f"{RUN}/checkpoints/step-4/state.json", "not valid JSON"])
def _(env):
    env.write(f"{RUN}/checkpoints/step-4/state.json", "")
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


@case("checkpoint-state-missing-field", "run dirs", [f"{RUN}/checkpoints/step-4/state.json", "'train'", "missing"])
def _(env):
    env.edit_json(f"{RUN}/checkpoints/step-4/state.json", lambda s: s.pop("train"))
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


@case("checkpoint-optimizer-corrupt", "run dirs", [f"{RUN}/checkpoints/step-4/optimizer.pt", "not a readable torch file"])
def _(env):
    env.p(f"{RUN}/checkpoints/step-4/optimizer.pt").write_bytes(b"\x80\x02garbage")
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


@case("checkpoints-is-a-file", "run dirs", [f"{RUN}/checkpoints", "is a file"])
def _(env):
    env.rm(f"{RUN}/checkpoints")
    env.write(f"{RUN}/checkpoints", "not a folder\n")
    return ["train", RUN, "--max-steps", "2", "--no-progress"]


@case("run-recipe-target-seed-edited", "run dirs", [f"{RUN}/recipe.resolved.json", "target.random.seed", "5", "has 0"])
def _(env):
    env.edit_json(f"{RUN}/recipe.resolved.json", lambda r: r["target"]["random"].__setitem__("seed", 5))
    return ["export", RUN, "-o", "out"]


@case("run-recipe-head-edited", "run dirs", [f"{RUN}/recipe.resolved.json", "head.pure_prefix_len", "2", "has 1"])
def _(env):
    env.edit_json(f"{RUN}/recipe.resolved.json", lambda r: r["head"].__setitem__("pure_prefix_len", 2))
    return ["export", RUN, "-o", "out"]


@case("run-recipe-drafter-source-edited", "run dirs", ["drafter.path", "'/elsewhere/drafter'", "'fresh'"])
def _(env):
    env.edit_json(f"{RUN}/recipe.resolved.json", lambda r: r["drafter"].__setitem__("path", "/elsewhere/drafter"))
    return ["generate", RUN, "--prompt-ids", "5 9 12", "--max-new-tokens", "2"]


@case("run-recipe-drafter-family-edited", "run dirs", [f"{RUN}/recipe.resolved.json", "drafter.family", "'medusa'",
                                                      "'dflash'"])
def _(env):
    env.edit_json(f"{RUN}/recipe.resolved.json", lambda r: r["drafter"].__setitem__("family", "medusa"))
    return ["export", RUN, "-o", "out"]


@case("run-recipe-drafter-field-edited", "run dirs", [f"{RUN}/recipe.resolved.json", f"{RUN}/drafter/",
                                                     "drafter.block_size", "4", "8"])
def _(env):
    env.edit_json(f"{RUN}/recipe.resolved.json", lambda r: r["drafter"].__setitem__("block_size", 4))
    return ["export", RUN, "-o", "out"]


@case("checkpoint-trainer-state-corrupt", "run dirs", [f"{RUN}/checkpoints/step-4/trainer.pt", "not a readable torch file"])
def _(env):
    env.p(f"{RUN}/checkpoints/step-4/trainer.pt").write_bytes(b"")
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


@case("run-head-holds-nan", "run dirs", [f"{RUN}/head.safetensors", "'embed_proj.2.weight'", "3 non-finite"])
def _(env):
    env.poison(f"{RUN}/head.safetensors", "embed_proj.2.weight")
    return ["export", RUN, "-o", "out"]


@case("run-drafter-holds-inf", "run dirs", [f"{RUN}/drafter/model.safetensors", "'norm.weight'", "2 non-finite"])
def _(env):
    env.poison(f"{RUN}/drafter/model.safetensors", "norm.weight", float("inf"), n=2)
    return ["generate", RUN, "--prompt-ids", "5 9 12", "--max-new-tokens", "2", "--temperature", "1"]


@case("checkpoint-model-holds-nan", "run dirs", [f"{RUN}/checkpoints/step-4/model.safetensors", "non-finite"])
def _(env):
    f = f"{RUN}/checkpoints/step-4/model.safetensors"
    env.poison(f, sorted(load_file(str(env.p(f))))[0])
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


@case("checkpoint-optimizer-moments-hold-inf", "run dirs", [f"{RUN}/checkpoints/step-4/optimizer.pt", "exp_avg", "non-finite"])
def _(env):
    f = env.p(f"{RUN}/checkpoints/step-4/optimizer.pt")
    osd = torch.load(f, weights_only=True)
    next(iter(osd["state"].values()))["exp_avg"].view(-1)[0] = float("inf")
    torch.save(osd, f)
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


# ------------------------------------------------------------------------------ bundles
def _resign(env: Env) -> None:
    """Update the bundle manifest's checksums to the (damaged) files: only the finite check can tell."""
    from domino_graft.artifacts.files import sha256_file
    from domino_graft.artifacts.tensors import tensor_sha256

    state = load_file(str(env.p(f"{BUNDLE}/model.safetensors")))

    def fix(m):
        for name, info in m["tensors"].items():
            info["sha256"] = tensor_sha256(state[name])
        m["files"]["model.safetensors"] = sha256_file(env.p(f"{BUNDLE}/model.safetensors"))
    env.edit_json(f"{BUNDLE}/manifest.json", fix)


@case("bundle-nan-weights-resigned", "bundles", ["b/model.safetensors", "'embed_proj.0.weight'", "3 non-finite"])
def _(env):
    env.poison(f"{BUNDLE}/model.safetensors", "embed_proj.0.weight")
    _resign(env)
    return ["generate", BUNDLE, "--prompt-ids", "5 9 12", "--max-new-tokens", "4", "--temperature", "1", "--seed", "0"]


@case("bundle-inf-drafter-weights-resigned", "bundles", ["b/model.safetensors", "'layers.0.mlp.up_proj.weight'", "non-finite"])
def _(env):
    env.poison(f"{BUNDLE}/model.safetensors", "layers.0.mlp.up_proj.weight", float("-inf"), n=5)
    _resign(env)
    return ["bench", BUNDLE, "--limit", "1", "--max-new-tokens", "4", "--no-progress"]


@case("bundle-manifest-recipe-seed-edited", "bundles", ["manifest.json", "target.random.seed", "7", "0"])
def _(env):
    env.edit_json(f"{BUNDLE}/manifest.json", lambda m: m["recipe"]["target"]["random"].__setitem__("seed", 7))
    return ["generate", BUNDLE, "--prompt-ids", "5 9 12", "--max-new-tokens", "2"]


@case("checkpoint-without-manifest-holds-nan", "bundles", ["zlab/model.safetensors", "'fc.weight'", "non-finite"])
def _(env):
    env.p("zlab").mkdir()
    shutil.copy(env.p(f"{BUNDLE}/config.json"), env.p("zlab/config.json"))
    shutil.copy(env.p(f"{BUNDLE}/model.safetensors"), env.p("zlab/model.safetensors"))
    env.poison("zlab/model.safetensors", "fc.weight")
    return ["apply", "tiny_dflash", "-o", "runs/new", f"drafter.path={env.p('zlab')}"]


# ------------------------------------------------------------------------------ faults
def _fresh(env: Env) -> None:
    env.rm(f"{RUN}/checkpoints")  # so that `train` (without --resume) starts over


@case("train-lr-inf-saves-nothing", "faults", ["lr", "inf"], allow=(f"{RUN}/metrics.jsonl",))
def _(env):
    _fresh(env)
    return ["train", RUN, "train.lr=.inf", "--max-steps", "3", "--no-progress"]


@case("train-lr-1e30-diverges-names-step-and-loss", "faults",
      ["step 2", "loss_final is", "train.lr 1e+30", "before saving anything", "no checkpoint yet"],
      allow=(f"{RUN}/metrics.jsonl",))
def _(env):
    _fresh(env)
    return ["train", RUN, "train.lr=1e30", "--max-steps", "3", "--no-progress"]


@case("train-nan-weights-never-checkpointed", "faults", ["after step 1", "head.prefix_gru.weight_ih_l0", "4 non-finite"],
      allow=(f"{RUN}/metrics.jsonl",))
def _(env):
    import domino_graft.training.loop as loop

    real = loop.TrainingRun.train_step

    def diverging(self, step):  # an update that leaves NaN in one head tensor
        rec = real(self, step)
        with torch.no_grad():
            dict(zip(self.param_names, self.params))["head.prefix_gru.weight_ih_l0"].view(-1)[:4] = float("nan")
        return rec

    env.monkeypatch.setattr(loop.TrainingRun, "train_step", diverging)
    _fresh(env)
    return ["train", RUN, "--max-steps", "2", "--save-every", "1", "--no-progress"]


@case("train-second-process-refused", "faults", [f"{RUN}/train.lock", "being trained by pid"])
def _(env):
    proc = env.holder()
    env.expected_pid = proc.pid
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


@case("train-handmade-lock-live-pid-refused", "faults", [f"{RUN}/train.lock", "being trained by pid"])
def _(env):
    proc = env.holder(flock=False)
    import socket

    env.write(f"{RUN}/train.lock", json.dumps({"pid": proc.pid, "host": socket.gethostname()}))
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


def _took_over(env, out, err):
    assert "no longer running" in out and "taking the lock over" in out, out
    assert not env.p(f"{RUN}/train.lock").exists(), "the lock was not released"
    assert "step-5" in {p.name for p in env.p(f"{RUN}/checkpoints").iterdir()}


@case("train-resume-after-kill-9-takes-stale-lock", "faults", ["resumed from"], rc=0, allow=(RUN,), check=_took_over)
def _(env):
    proc = env.holder()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert env.p(f"{RUN}/train.lock").exists()  # left behind: stale
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


@case("train-handmade-stale-lock-dead-pid", "faults", ["resumed from"], rc=0, allow=(RUN,), check=_took_over)
def _(env):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    env.write(f"{RUN}/train.lock", json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


@case("train-lock-with-bare-live-pid-refused", "faults", [f"{RUN}/train.lock", "being trained by pid"])
def _(env):
    proc = env.holder(flock=False)
    env.expected_pid = proc.pid
    env.write(f"{RUN}/train.lock", f"{proc.pid}\n")  # a lock written by hand or another tool
    return ["train", RUN, "--resume", "--max-steps", "5", "--no-progress"]


@case("disk-full-at-final-save-leaves-run-as-it-was", "faults", [f"{RUN}/head.safetensors", "No space left on device"],
      allow=(f"{RUN}/metrics.jsonl", f"{RUN}/checkpoints"), check=_no_leftovers)
def _(env):
    _fresh(env)
    env.full_disk(skip=5)  # metrics.jsonl and the step-2 checkpoint's 4 files go through; the final save does not
    return ["train", RUN, "--max-steps", "2", "--no-progress"]


@case("disk-full-during-export", "faults", ["out", "No space left on device"], check=_no_leftovers)
def _(env):
    env.full_disk()
    return ["export", RUN, "-o", "out", "--dtype", "fp32"]


@case("disk-full-during-apply", "faults", ["runs/new", "No space left on device"], check=_no_leftovers)
def _(env):
    env.full_disk()
    return ["apply", "tiny_dflash", "-o", "runs/new"]


@case("disk-full-at-training-checkpoint", "faults", [f"{RUN}/checkpoints/step-1", "No space left on device"],
      allow=(f"{RUN}/metrics.jsonl",), check=_no_leftovers)
def _(env):
    _fresh(env)
    env.full_disk(skip=1)  # metrics.jsonl is started afresh; the first checkpoint hits the full disk
    return ["train", RUN, "--max-steps", "2", "--save-every", "1", "--no-progress"]


# ------------------------------------------------------------------------------ the table
def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_the_table_has_enough_cases():
    groups = {c.group for c in CASES}
    assert len(CASES) >= 30 and groups == {"outputs", "run dirs", "bundles", "faults"}, (len(CASES), groups)
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_artifact_case(c: Case, made, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DOMINO_GRAFT_DEBUG", raising=False)
    with contextlib.ExitStack() as stack:
        env = Env(tmp_path, made, stack, monkeypatch)
        argv = c.setup(env)
        before = snapshot(tmp_path)
        capsys.readouterr()
        rc = main(argv)
        out, err = capsys.readouterr()
        monkeypatch.undo()  # a simulated full disk must not get in the way of the checks
        monkeypatch.chdir(tmp_path)
        after = snapshot(tmp_path)  # while the case's own lock holders still hold
    assert "Traceback" not in err, err
    assert rc == c.rc, f"rc {rc}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    if c.rc:
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, err
        assert err.rstrip().endswith(errors[0]), err  # the last thing said, on one line
        for needle in c.needles:
            assert needle in errors[0], (needle, errors[0])
        if hasattr(env, "expected_pid"):
            assert f"pid {env.expected_pid}" in errors[0], errors[0]
    else:
        for needle in c.needles:
            assert needle in out, (needle, out[-2000:])

    def allowed(rel: str) -> bool:
        return any(rel == a or rel.startswith(a.rstrip("/") + "/") for a in c.allow)

    lost = sorted(k for k in before if k not in after and not allowed(k))
    made_ = sorted(k for k in after if k not in before and not allowed(k))
    changed = sorted(k for k in before if k in after and before[k] != after[k] and not allowed(k))
    assert not (lost or made_ or changed), {"lost": lost, "written": made_, "changed": changed}
    if c.check:
        c.check(env, out, err)


# ------------------------------------------------------------------------------ the rest
def test_self_check_comparison_propagates_nan():
    from domino_graft.export.self_check import max_rel_diff

    a = torch.zeros(2, 3)
    nan = a.clone()
    nan[0, 1] = float("nan")
    assert max_rel_diff([(a, None)], [(a, None)]) == 0.0
    d = max_rel_diff([(a, None), (a, None)], [(a, None), (nan, None)])  # max(0.0, nan) would be 0.0
    assert d != d and not d <= 1e-5


def test_debug_flag_and_env_reraise(made, tmp_path, monkeypatch):
    from domino_graft.artifacts.files import CheckpointError

    run = tmp_path / "run"
    shutil.copytree(made["run"], run)
    (run / "manifest.json").write_text("{")
    with pytest.raises(CheckpointError, match="manifest.json"):
        main(["--debug", "export", str(run)])
    with pytest.raises(CheckpointError):
        main(["export", str(run), "--debug"])
    monkeypatch.setenv("DOMINO_GRAFT_DEBUG", "1")
    with pytest.raises(CheckpointError):
        main(["export", str(run)])


def test_save_tensors_refuses_nan_and_writes_nothing(tmp_path):
    from domino_graft.artifacts.files import CheckpointError
    from domino_graft.artifacts.tensors import save_tensors

    with pytest.raises(CheckpointError, match=r"'w'.*1 non-finite"):
        save_tensors(tmp_path / "x.safetensors", {"w": torch.tensor([1.0, float("nan")])})
    assert not list(tmp_path.iterdir())


def test_a_subprocess_failure_is_one_line(made, tmp_path):
    """The same through a real `python -m domino_graft` process (the way a user meets it)."""
    (tmp_path / "notes.txt").write_text("x\n")
    r = subprocess.run([sys.executable, "-m", "domino_graft", "export", str(made["run"]), "-o", "notes.txt/b"],
                       cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
                       timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("error: -o: cannot write notes.txt/b: notes.txt is a file"), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
