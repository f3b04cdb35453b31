"""Start `domino-graft serve` as a subprocess on a free 127.0.0.1 port, and the references the
tests compare it with. Everything is bounded: startup, requests (client timeouts) and shutdown."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai package itself uses

REPO = Path(__file__).resolve().parents[2]
STARTUP_S = 90  # import torch + load a tiny run on a busy 2-core machine: ~5-10 s measured
FAMILIES = ("dflash", "dspark", "medusa", "pard", "peagle")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def apply_tiny(family: str, out: Path, overrides: list[str] = ()) -> Path:
    from domino_graft.apply import apply_recipe

    apply_recipe(str(REPO / "recipes" / f"tiny_{family}.yaml"), str(out), overrides=list(overrides),
                 echo=lambda *_: None)
    return out


class Server:
    """`domino-graft serve RUN --port P *args` until `stop()`; `url`, `base` (…/v1), `proc`."""

    def __init__(self, run: Path, *args: str, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base = self.url + "/v1"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.log_path = log
        self._log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "domino_graft", "serve", str(run), "--port", str(self.port), "--log-level",
             "warning", *args], stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"serve did not come up in {STARTUP_S} s:\n{self.log()}")
            time.sleep(0.2)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.base, api_key=kw.pop("api_key", "none"), max_retries=0,
                             timeout=kw.pop("timeout", 60), **kw)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def __repr__(self) -> str:
        return f"Server({self.url}, rc={self.proc.returncode})\n{self.log()}"

    def metric(self, name: str) -> float:
        """The sum of a metric's samples (all label values) from /metrics."""
        total = 0.0
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name) and line[len(name)] in " {":
                total += float(line.rsplit(" ", 1)[1])
        return total


class Reference:
    """The target alone, greedy, in this process: what every greedy answer must equal."""

    def __init__(self, run: Path):
        from domino_graft.decoding import Engine, stop_token_ids
        from domino_graft.loading import load_run_or_bundle

        self.loaded = load_run_or_bundle(str(run))
        self.engine = Engine(self.loaded.target, kv="dynamic", stop_ids=stop_token_ids(self.loaded.target))
        self._memo: dict = {}

    def greedy(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt_ids), max_tokens)
        if key not in self._memo:
            self._memo[key] = self.engine.target_only(prompt_ids, max_new_tokens=max_tokens).tokens
        return self._memo[key]
