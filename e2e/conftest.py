"""Fixtures for end-to-end tests: a real locals daemon on the embedded model.

`locals_server` (session-scoped) runs `locals start --model smollm2 --port <free port>`
as a subprocess with LOCALS_HOME in a temp dir, waits until it serves, and runs
`locals stop` at the end. Tests use its `.url` (base URL), `.openai_url` (`…/v1`),
`.port`, `.home` and `.env` (the environment that reaches the same daemon, e.g. for
`subprocess.run(["locals", …], env=server.env)`), and `.cli(*args)` to run the CLI.
`fresh_locals` gives a test its own home and port with nothing started yet; `capped_server(home,
cap)` starts a daemon of its own whose replies stop at `cap` tokens (for the agent tools).
Run with: pytest e2e -m slow (`--tools a,b` drives only those agent tools in e2e/test_tools.py)
"""

from __future__ import annotations

import os

import pytest

from locals.daemon import STOP_TIMEOUT_S
from locals.traffic.servers import free_port

from e2e.daemon import MODEL, LocalsServer


def pytest_addoption(parser):
    """Which agent tools e2e/test_tools.py drives: each reads a first prompt of 2k to 12k tokens,
    minutes apiece on two CPU cores (docs/testing.md), so CI runs a few of them."""
    parser.getgroup("e2e").addoption(
        "--tools", default="all",
        help="comma-separated agent tools for e2e/test_tools.py, e.g. claude,codex (default: all)")


@pytest.fixture(scope="session")
def locals_server(tmp_path_factory) -> LocalsServer:
    home = tmp_path_factory.mktemp("locals-home")
    env = {**os.environ, "LOCALS_HOME": str(home), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1",
           "COLUMNS": "200"}
    server = LocalsServer(port=free_port(), home=home, env=env)
    started = server.cli("start", "--model", MODEL, "--port", str(server.port))
    if started.returncode != 0:
        pytest.fail(f"locals start failed:\n{started.stdout}\n{started.stderr}")
    yield server
    # A long prompt step (minutes on a CPU at 12k tokens) can still run: `locals stop` waits
    # STOP_TIMEOUT_S for it, then kills the server.
    server.cli("stop", "--port", str(server.port), timeout=STOP_TIMEOUT_S + 30)


@pytest.fixture(scope="session")
def capped_server(tmp_path_factory, locals_server):
    """Start a daemon whose replies stop at `cap` tokens (`LOCALS_MAX_TOKENS`), in a fresh home:
    the agent tools send 4k limits or none, and the embedded model on two CPU cores writes a few
    tokens a second after their 6–12k-token prompts, so a reply that rambles to its limit would
    take longer than a test waits. Each is stopped at the session's end."""
    started: list[LocalsServer] = []

    def start(name: str, cap: int) -> LocalsServer:
        home = tmp_path_factory.mktemp(name)
        env = {**locals_server.env, "LOCALS_HOME": str(home), "LOCALS_MAX_TOKENS": str(cap)}
        server = LocalsServer(port=free_port(), home=home, env=env)
        result = server.cli("start", "--model", MODEL, "--port", str(server.port))
        assert result.returncode == 0, result.stderr
        started.append(server)
        return server

    yield start
    for server in started:
        server.cli("stop", "--port", str(server.port), timeout=STOP_TIMEOUT_S + 30)


@pytest.fixture
def fresh_locals(tmp_path, locals_server) -> LocalsServer:
    """A daemon-to-be of its own (own LOCALS_HOME and port, nothing started), for tests of
    start/stop themselves; stopped at the end. Depends on `locals_server` only so the
    model is known to load."""
    env = {**locals_server.env, "LOCALS_HOME": str(tmp_path / "home")}
    server = LocalsServer(port=free_port(), home=tmp_path / "home", env=env)
    yield server
    server.cli("stop", "--port", str(server.port), timeout=60)
