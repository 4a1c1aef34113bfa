"""Fixtures of the chaos suite: the app in-process on a scripted engine (served from a thread,
so that plain sockets and synchronous Hypothesis tests reach it), and real `locals serve`
daemons on the embedded model that a test may `kill -9` and start again on the same home.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.chaos.daemon_process import Daemon
from tests.helpers.server_fakes import ScriptedEngine, make_state


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


@pytest.fixture
def daemons():
    """Start daemons with `daemons(home, *args, settings={...})`; every one still running is
    stopped at the end."""
    started: list[Daemon] = []

    def start(home: Path, *args: str, settings: dict[str, str] | None = None) -> Daemon:
        daemon = Daemon(home, args=args, settings=settings or {})
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.stop()
