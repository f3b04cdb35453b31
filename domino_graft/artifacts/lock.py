"""One trainer per run dir: RUN/train.lock, held while a process trains in it.

The lock file records its owner (pid, host, process start time, when, the command) and is
held with `flock`, which the kernel releases when the owner dies, kill -9 included. A second
`train` on the same run fails naming the lock and its owner. A lock whose owner is gone (a
killed run: its pid is no longer alive, or its flock is free) is stale: it is named and taken
over, so `train --resume` after a crash just works. Released (the file removed) on exit,
including on exceptions. A lock written on another host cannot be checked from here: it is
refused, and the message says how to clear it. Torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Optional

LOCK_NAME = "train.lock"

try:
    import fcntl
except ImportError:  # not POSIX: the pid check alone
    fcntl = None


class RunLockedError(RuntimeError):
    """Another live process trains in this run dir."""


def lock_path(run_dir) -> Path:
    return Path(run_dir) / LOCK_NAME


def _proc_start(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return stat.rsplit(")", 1)[1].split()[19]
    except IndexError:
        return None


def _alive(pid: int, start: Optional[str]) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        pass
    except OSError:
        return False
    if start is not None:
        now = _proc_start(pid)
        if now is not None and now != start:  # the pid was reused by another process
            return False
    return True


def _read(path: Path) -> dict:
    """The owner a lock file records: our JSON, or a bare pid (a lock written by hand or by
    another tool), or {} when it names none."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return {}
    try:
        data = json.loads(text or "{}")
    except ValueError:
        data = None
    if isinstance(data, dict):
        return data
    m = re.match(r"\s*(\d+)\b", text)
    return {"pid": int(m.group(1))} if m else {}


def describe_owner(info: dict) -> str:
    pid, host = info.get("pid", "?"), info.get("host", "?")
    since = f" since {info['started_at']}" if info.get("started_at") else ""
    return f"pid {pid} on host {host}{since}"


def held_by(run_dir) -> Optional[str]:
    """Who holds the run's lock right now ('pid N on host H ...'), or None when it is free or stale."""
    path = lock_path(run_dir)
    if not path.is_file():
        return None
    info = _read(path)
    if _owner_is_live(path, info):
        return describe_owner(info)
    return None


def _owner_is_live(path: Path, info: dict) -> bool:
    host = info.get("host")
    pid = info.get("pid")
    if fcntl is not None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            pass
        finally:
            os.close(fd)  # closing releases the probe's shared lock
    if host not in (None, socket.gethostname()):
        return True  # cannot be checked from here: assume it lives
    return isinstance(pid, int) and pid != os.getpid() and _alive(pid, info.get("proc_start"))


class RunLock:
    """`with RunLock(run_dir, echo=...):` — exclusive for the block, or RunLockedError."""

    def __init__(self, run_dir, *, command: str = "train", echo: Callable = print):
        self.path = lock_path(run_dir)
        self.command = command
        self.echo = echo
        self.fd: Optional[int] = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _refuse(self, info: dict) -> None:
        host = info.get("host")
        remote = host not in (None, socket.gethostname())
        hint = (f"if that process is gone (this host cannot check {host}), delete {self.path}" if remote else
                "wait for it to finish, or stop it first")
        raise RunLockedError(f"{self.path}: this run is being trained by {describe_owner(info)}; {hint}")

    def acquire(self) -> None:
        for _ in range(20):  # retried only when the file was replaced or removed under us
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise OSError(e.errno, e.strerror, str(self.path)) from None
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    info = _read(self.path)
                    os.close(fd)
                    self._refuse(info)
                except OSError as e:
                    if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                        os.close(fd)
                        raise
                # the path may have been released (unlinked) between open and flock: retry on the new file
                try:
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if not same:
                    os.close(fd)
                    continue
            info = _read(self.path)
            if info:
                live = (info.get("pid") != os.getpid() and
                        (info.get("host") not in (None, socket.gethostname()) or
                         (isinstance(info.get("pid"), int) and _alive(info["pid"], info.get("proc_start")))))
                if live:
                    os.close(fd)
                    self._refuse(info)
                self.echo(f"note: {self.path} was left by {describe_owner(info)}, which is no longer running "
                          "(a killed run); taking the lock over")
            record = {"pid": os.getpid(), "host": socket.gethostname(), "proc_start": _proc_start(os.getpid()),
                      "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": self.command,
                      "argv": sys.argv[1:]}
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
                os.fsync(fd)
            except OSError as e:
                os.close(fd)
                raise OSError(e.errno, e.strerror, str(self.path)) from None
            self.fd = fd
            return
        raise RunLockedError(f"{self.path}: could not take the lock (it keeps being replaced)")

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            if os.fstat(self.fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = None
