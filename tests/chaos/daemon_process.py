"""`locals serve --model smollm2` as a child process on a home that outlives it, for the
chaos tests that need a real daemon: started, waited for, killed with SIGKILL, started again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from locals.traffic.servers import free_port

READY_TIMEOUT_S = 300



@dataclass
class Daemon:
    """`locals serve --model smollm2` as a child process on a home that outlives it."""

    home: Path
    port: int = field(default_factory=free_port)
    args: tuple[str, ...] = ()
    settings: dict[str, str] = field(default_factory=dict)  # LOCALS_* settings for the server
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / "serve.log"

    def start(self) -> "Daemon":
        env = {**os.environ, **self.settings, "LOCALS_HOME": str(self.home), "HF_HUB_OFFLINE": "1",
               "NO_COLOR": "1"}
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "locals", "serve", "--model", "smollm2", "--port",
                 str(self.port), *self.args], env=env, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"locals serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.get_json("/health").get("status") == "ok":
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"locals serve was not ready in {READY_TIMEOUT_S} s:\n{self.log_tail()}")

    def get_json(self, path: str, timeout: float = 30) -> dict:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    def post_json(self, path: str, body: dict, timeout: float = 300) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill9()

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
