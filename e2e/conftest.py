"""Fixtures for end-to-end tests: a real locals daemon on the embedded model.

`locals_server` (session-scoped) runs `locals start --model smollm2 --port <free port>`
as a subprocess with LOCALS_HOME in a temp dir, waits until it serves, and runs
`locals stop` at the end. Tests use its `.url` (base URL), `.openai_url` (`…/v1`),
`.port`, `.home` and `.env` (the environment that reaches the same daemon, e.g. for
`subprocess.run(["locals", …], env=server.env)`), and `.cli(*args)` to run the CLI.
`fresh_locals` gives a test its own home and port with nothing started yet.
Run with: pytest e2e -m slow
"""

from __future__ import annotations

import os

import pytest

from locals.traffic.servers import free_port

from e2e.daemon import MODEL, LocalsServer


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
    server.cli("stop", "--port", str(server.port), timeout=60)


@pytest.fixture
def fresh_locals(tmp_path, locals_server) -> LocalsServer:
    """A daemon-to-be of its own (own LOCALS_HOME and port, nothing started), for tests of
    start/stop themselves; stopped at the end. Depends on `locals_server` only so the
    model is known to load."""
    env = {**locals_server.env, "LOCALS_HOME": str(tmp_path / "home")}
    server = LocalsServer(port=free_port(), home=tmp_path / "home", env=env)
    yield server
    server.cli("stop", "--port", str(server.port), timeout=60)
