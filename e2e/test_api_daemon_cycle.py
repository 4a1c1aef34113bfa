"""`locals start` → `status` → `stop`, twice; a second start says it is already running;
a stale pid record (dead process) does not block a start. Own LOCALS_HOME and port."""

from __future__ import annotations

import json
import re

import pytest

from locals.engine.load.backend import detect

pytestmark = pytest.mark.slow


def test_start_status_stop_twice(fresh_locals):
    for _ in range(2):
        started = fresh_locals.cli("start", "--model", "smollm2", "--port", str(fresh_locals.port))
        assert started.returncode == 0, started.stderr
        assert "serving smollm2" in started.stdout
        again = fresh_locals.cli("start", "--port", str(fresh_locals.port))
        assert again.returncode == 0 and "already running" in again.stdout
        status = fresh_locals.cli("status")  # port and model remembered from `start`
        assert status.returncode == 0 and "smollm2 (ready)" in status.stdout and "uptime" in status.stdout
        # Compiled before ready: the compiles line; the CPU compiles nothing (forward/choices.py), and says none.
        assert ("shapes ahead in" in status.stdout) == (detect().kind != "cpu")
        logs = fresh_locals.cli("status", "--logs")
        assert "listening on" in logs.stdout
        assert re.search(r"ready [\d.]+ s after the process started: model loaded in [\d.]+ s, kernels and "
                         r"engine set up in [\d.]+ s, compiling ahead [\d.]+ s", logs.stdout), logs.stdout[-2000:]
        stopped = fresh_locals.cli("stop")
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
        status = fresh_locals.cli("status")
        assert status.returncode == 1 and "locals start" in status.stderr


def test_stale_pid_record_is_handled(fresh_locals):
    state = fresh_locals.home / "state"
    state.mkdir(parents=True)
    # A record left by a server that died without cleaning up (pid 2**22 + 1 is never used).
    (state / f"server-{fresh_locals.port}.json").write_text(json.dumps(
        {"port": fresh_locals.port, "host": "127.0.0.1", "model": "smollm2", "mode": "process", "pid": 4194305}))
    stopped = fresh_locals.cli("stop", "--port", str(fresh_locals.port))
    assert stopped.returncode == 0 and "not running" in stopped.stdout
    assert not (state / f"server-{fresh_locals.port}.json").exists()
    (state / f"server-{fresh_locals.port}.json").write_text(json.dumps(
        {"port": fresh_locals.port, "mode": "process", "pid": 4194305}))
    project = fresh_locals.home / "project"  # started from a project with a module named like ours
    project.mkdir()
    (project / "locals.py").write_text("raise SystemExit('the project locals.py ran')\n")
    started = fresh_locals.cli("start", "--model", "smollm2", "--port", str(fresh_locals.port), cwd=project)
    assert started.returncode == 0, started.stderr
    record = json.loads((state / f"server-{fresh_locals.port}.json").read_text())
    assert record["pid"] != 4194305 and record["mode"] in ("process", "systemd", "launchd")


def test_ensure_running_reuses_the_running_daemon(locals_server, monkeypatch):
    from locals import daemon
    from locals.config import load_remembered

    monkeypatch.setenv("LOCALS_HOME", str(locals_server.home))
    assert daemon.is_running(locals_server.port)
    assert daemon.ensure_running(port=locals_server.port) == locals_server.url
    assert daemon.ensure_running("smollm2", locals_server.port) == locals_server.url
    assert load_remembered().port == locals_server.port
