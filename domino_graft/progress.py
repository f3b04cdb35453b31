"""Progress that a log file can read too.

On a terminal: a tqdm bar, redrawn in place. Anywhere else (stderr piped or redirected to a
file, CI, `| tee`) a redrawn bar is either hidden or a smear of carriage returns, so a long step
looked dead for minutes. There, a plain line instead, at the start, every
DOMINO_GRAFT_PROGRESS_S seconds (default 15) and at the end:

    bench: 4/18 decodes, 62 s, about 3 min 37 s left (prompt 2/6 base)

A background thread writes the periodic line, so one step longer than the interval (a pip
download, one decode of a real model on a CPU) still shows it is alive. With the variable at 0
there is no thread and a line at every update (what tests use).

Lines go to stderr, like tqdm's bars, after flushing stdout: in a log that holds both, they
appear in the order they happened.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from typing import Optional

ENV = "DOMINO_GRAFT_PROGRESS_S"
DEFAULT_INTERVAL_S = 15.0
_lock = threading.Lock()  # one line at a time: a heartbeat thread and the main thread share stderr


def interval_s() -> float:
    """Seconds between plain progress lines (DOMINO_GRAFT_PROGRESS_S, default 15)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{ENV}: {raw!r} is invalid; valid: the seconds between progress lines off a terminal, "
                         ">= 0 (0: a line at every update)")
    return value


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def say(message: str) -> None:
    """One status line on stderr, now (stdout flushed first, so a shared log keeps the order)."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with _lock:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def loading(command: str, what: str = "the run") -> None:
    """The line a torch command prints before its heavy imports: importing torch and
    transformers takes seconds (6-8 s cold), and a silent start reads as a hang."""
    say(f"{command}: loading torch and {what} …")


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """A progress bar on a terminal, plain lines elsewhere; the subset of tqdm's API the
    commands use (update, set_postfix_str, set_postfix, write, close; a context manager).

    enabled=False: silent (`--no-progress`). plain=False: a bar on a terminal, nothing
    elsewhere (a bar nested in another one, whose lines already say the run is alive).
    eta=False: no "about N s left" (steps of very unequal length, where it would mislead)."""

    def __init__(self, total: Optional[int] = None, desc: str = "", unit: str = "step", *, enabled: bool = True,
                 initial: int = 0, plain: bool = True, eta: bool = True, **tqdm_kwargs):
        self.total, self.desc, self.unit, self.eta = total, desc, unit, eta
        self.n = self._initial = initial
        self.postfix = ""
        self._bar = None
        self._plain = False
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._shown = None  # (n, postfix) of the last plain line
        self._closed = False
        if not enabled:
            return
        stream = sys.stderr
        if is_terminal(stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, initial=initial, file=stream, **tqdm_kwargs)
            return
        if not plain:
            return
        self._plain = True
        self.interval = interval_s()
        self._start = time.monotonic()
        self._emit()
        if self.interval > 0:
            self._thread = threading.Thread(target=self._beat, name=f"progress: {desc}", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ tqdm's API
    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._plain and self.interval == 0:
            self._emit()

    def set_postfix_str(self, s: str) -> None:
        self.postfix = s
        if self._bar is not None:
            self._bar.set_postfix_str(s)

    def set_postfix(self, **values) -> None:
        self.set_postfix_str(", ".join(f"{k}={v}" for k, v in values.items()))

    def write(self, message: str, echo=print) -> None:
        """`echo(message)` without tearing the bar: on a terminal the bar is cleared around it."""
        if self._bar is not None:
            with self._bar.external_write_mode():
                echo(message)
        else:
            echo(message)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self._plain and self._shown != (self.n, self.postfix):
            self._emit()  # where it ended (the last line may be up to one interval old)
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- plain lines
    def line(self) -> str:
        """e.g. 'bench: 4/18 decodes, 62 s, about 3 min 37 s left (prompt 2/6 base)'."""
        elapsed = time.monotonic() - self._start
        if self.unit == "B":  # bytes: megabytes read better than 536870912 B
            count = f"{self.n / 1e6:.0f}" + (f"/{self.total / 1e6:.0f}" if self.total else "") + " MB"
        else:
            count = f"{self.n}" + (f"/{self.total}" if self.total else "") + f" {self.unit}s"
        parts = [f"{self.desc}: {count}" if self.desc else count, duration(elapsed)]
        done = self.n - self._initial
        if self.eta and self.total and 0 < done and self.n < self.total and elapsed > 0:
            parts.append(f"about {duration(elapsed / done * (self.total - self.n))} left")
        return ", ".join(parts) + (f" ({self.postfix})" if self.postfix else "")

    def _emit(self, main_thread: bool = True) -> None:
        text = self.line()
        if main_thread:  # the heartbeat thread leaves stdout alone (the main thread may be writing it)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
        with _lock:
            self._shown = (self.n, self.postfix)
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            self._emit(main_thread=False)
