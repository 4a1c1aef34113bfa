"""Fixtures of the chaos suite: the app in-process on a scripted engine (served from a thread,
so that plain sockets and synchronous Hypothesis tests reach it), and real `locals serve`
daemons on the embedded model that a test may `kill -9` and start again on the same home.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from server_fakes import ScriptedEngine, make_state

READY_TIMEOUT_S = 300


@dataclass
class AppServer:
    """The aiohttp app on a scripted engine, listening on 127.0.0.1:`port` from its own thread."""

    port: int
    engine: ScriptedEngine

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def app_server():
    from aiohttp import web

    from locals.server.app import create_app

    engine = ScriptedEngine()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(create_app(make_state(engine)))
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, name="chaos-app", daemon=True)
    thread.start()
    yield AppServer(port, engine)
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)
    loop.close()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Daemon:
    """`locals serve --model smollm2` as a child process on a home that outlives it."""

    home: Path
    port: int = field(default_factory=free_port)
    args: tuple[str, ...] = ()
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / "serve.log"

    def start(self) -> "Daemon":
        env = {**os.environ, "LOCALS_HOME": str(self.home), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
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


@pytest.fixture
def daemons():
    """Start daemons with `daemons(home, *args)`; every one still running is stopped at the end."""
    started: list[Daemon] = []

    def start(home: Path, *args: str) -> Daemon:
        daemon = Daemon(home, args=args)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.stop()
