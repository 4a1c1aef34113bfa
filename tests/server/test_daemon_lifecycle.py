"""`locals start` / `stop` / `status` against fake servers: a server still loading, a locals
server locals did not start, another program's JSON, two starts at once, the remembered model."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from locals import daemon, service
from locals.config import Remembered, save_remembered
from locals.errors import LocalsError


def _fake_server(answer):
    """An HTTP server on a free port whose GET answers (status, body) = answer(path)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            code, body = answer(self.path)
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def stranger():
    """A live process that is not a locals server."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_stop_refuses_a_locals_server_it_did_not_start(stranger):
    server = _fake_server(lambda path: (200, {"status": "ok", "service": "locals", "model": "m",
                                              "pid": stranger.pid}))
    try:
        with pytest.raises(LocalsError, match=f"kill {stranger.pid}"):
            daemon.stop(server.server_port)
        assert stranger.poll() is None
    finally:
        server.shutdown()


def test_status_ignores_another_programs_json():
    server = _fake_server(lambda path: (404, {"detail": "Not Found"}))
    try:
        assert daemon.status(server.server_port) is None
        assert daemon.health(server.server_port) is None
    finally:
        server.shutdown()


def test_status_names_another_program_on_the_port():
    from typer.testing import CliRunner

    from locals.cli import app

    server = _fake_server(lambda path: (404, {"detail": "Not Found"}))
    try:
        result = CliRunner().invoke(app, ["status", "--port", str(server.server_port)])
        assert isinstance(result.exception, LocalsError) and "held by another program" in str(result.exception)
    finally:
        server.shutdown()
        server.server_close()
    result = CliRunner().invoke(app, ["status", "--port", str(server.server_port)])  # nothing there now
    port = server.server_port
    assert isinstance(result.exception, LocalsError) and f"run `locals start --port {port}`" in str(result.exception)


def test_our_server_is_recognised_by_its_command_and_port():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "locals", "serve",
                             "--port", "18601"])
    try:
        time.sleep(0.3)
        assert daemon._is_our_server(proc.pid, 18601)
        assert not daemon._is_our_server(proc.pid, 18602)  # a locals server, but another port's
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def silent_serve(port: int):
    """A recorded process whose command line is `locals serve --port PORT` that never answers
    (as a server paused with SIGSTOP, hung, or not listening yet)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "locals", "serve",
                             "--port", str(port)])
    try:
        time.sleep(0.3)
        daemon.write_record(daemon.ServerRecord(port=port, pid=proc.pid))
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_stop_and_status_name_a_server_still_running_on_another_port():
    from typer.testing import CliRunner

    from locals.cli import app

    with silent_serve(18641):
        assert daemon.other_servers(18642) == [18641] and daemon.other_servers(18641) == []
        stopped = CliRunner().invoke(app, ["stop", "--port", "18642"])
        assert "locals still runs on port 18641: `locals stop --port 18641`" in stopped.output
        status = CliRunner().invoke(app, ["status", "--port", "18642"])
        assert "it runs on port 18641 (`locals status --port 18641`)" in str(status.exception)
    assert daemon.other_servers(18642) == []  # its record stays, its process is gone


def test_status_of_a_recorded_server_that_does_not_answer_says_so():
    from typer.testing import CliRunner

    from locals.cli import app

    with silent_serve(18643) as proc:
        status = CliRunner().invoke(app, ["status", "--port", "18643"])
        message = str(status.exception)
        assert status.exit_code == 1 and f"(pid {proc.pid}) does not answer" in message
        assert "`locals stop --port 18643`" in message and "another program" not in message


def test_start_while_the_model_loads_waits_until_it_serves():
    ready_at = time.monotonic() + 1.5

    def answer(path):
        if time.monotonic() < ready_at:
            return 503, {"status": "loading", "service": "locals", "model": "smollm2"}
        return 200, {"status": "ok", "service": "locals", "model": "smollm2"}

    server = _fake_server(answer)
    try:
        with pytest.raises(daemon.AlreadyRunning):
            daemon.start("smollm2", server.server_port, timeout=30)
        assert time.monotonic() >= ready_at  # "already running" only once it serves
    finally:
        server.shutdown()


def test_a_second_start_waits_for_the_first(monkeypatch):
    order, waits = [], []
    began, release = threading.Event(), threading.Event()

    def slow_start(model, port, *_):
        order.append(("begin", model))
        began.set()
        release.wait(30)
        order.append(("end", model))
        return daemon.base_url(port)

    monkeypatch.setattr(daemon, "_start", slow_start)
    first = threading.Thread(target=daemon.start, args=("a", 18603))
    second = threading.Thread(target=daemon.start, args=("b", 18603), kwargs={"on_wait": waits.append})
    try:
        first.start()
        assert began.wait(30)
        second.start()
        deadline = time.monotonic() + 30
        while not waits and time.monotonic() < deadline:
            time.sleep(0.05)
        assert order == [("begin", "a")] and waits[0] == {"status": "starting elsewhere"}
    finally:
        release.set()
        first.join(30)
        second.join(30)  # before the patch goes: a waiting start must never reach the real one
    assert order == [("begin", "a"), ("end", "a"), ("begin", "b"), ("end", "b")]


def test_a_start_waiting_for_another_gives_up_at_its_timeout():
    with daemon.port_lock(18606, timeout=5):
        t0 = time.monotonic()
        with pytest.raises(LocalsError, match="another `locals start`"):
            with daemon.port_lock(18606, timeout=0.5):
                pass
        assert time.monotonic() - t0 < 5


def test_start_without_a_model_takes_the_remembered_one(monkeypatch):
    asked = []
    monkeypatch.setattr(daemon, "_start", lambda model, port, *_: asked.append(model) or "http://x")
    save_remembered(Remembered(model="smollm2", port=18604))
    daemon.start(None, 18604)
    assert asked == ["smollm2"]


def test_a_failed_start_shows_only_its_own_log_lines():
    log = daemon.log_path(18605)
    log.write_text("old line from yesterday\n")
    size = log.stat().st_size
    with open(log, "a") as out:
        out.write("error: this start's reason\n")
    assert daemon.log_tail(18605, since=size) == "error: this start's reason"
    assert "yesterday" in daemon.log_tail(18605)


def test_stop_of_a_server_its_service_manager_stopped_says_stopped(monkeypatch, stranger):
    server = _fake_server(lambda path: (200, {"status": "ok", "service": "locals", "model": "m",
                                              "pid": stranger.pid}))
    port = server.server_port
    daemon.write_record(daemon.ServerRecord(port=port, mode="systemd", pid=stranger.pid))
    # `systemctl --user stop` waits until the unit is gone: the server answers no more.
    monkeypatch.setattr(service, "unload", lambda record: server.shutdown() or server.server_close())
    assert daemon.stop(port) is True
    assert stranger.poll() is None and daemon.read_record(port) is None


def test_start_hands_its_overflow_policy_to_the_server_and_refuses_an_unknown_one(monkeypatch):
    from typer.testing import CliRunner

    from locals.cli import app

    launched = []

    def launch(record, cmd):
        launched.append(cmd)
        raise LocalsError("launch stopped by the test")

    monkeypatch.setattr(service, "service_manager", lambda: "process")
    monkeypatch.setattr(service, "launch_process", launch)
    result = CliRunner().invoke(app, ["start", "--model", "smollm2", "--port", "18612", "--overflow", "trim"])
    assert "launch stopped by the test" in str(result.exception or result.output)
    assert launched and launched[0][launched[0].index("serve"):][-2:] == ["--overflow", "trim"]
    launched.clear()
    with pytest.raises(LocalsError):
        daemon.start("smollm2", 18612, timeout=5)
    assert "--overflow" not in launched[0]
    bad = CliRunner().invoke(app, ["start", "--overflow", "drop"])
    assert bad.exit_code != 0 and "--overflow (or LOCALS_OVERFLOW) 'drop': use refuse or trim" in bad.output + str(bad.exception)


def test_status_counts_a_request_reading_its_prompt_among_those_in_flight(monkeypatch):
    from typer.testing import CliRunner

    from locals.cli import app

    engine = {"running": 2, "prefilling": 1, "waiting": 0, "decode_tokens_per_s": 58.3, "prefill_tokens_per_s": 410.0,
              "cached_tokens_total": 10, "prompt_tokens_total": 20, "kv_bytes": 1 << 20, "kv_budget_bytes": 0}
    snap = {"model": "smollm2", "status": "ready", "uptime_s": 5, "memory_rss_bytes": 1 << 28, "engine": engine,
            "requests": {"total": 4, "in_flight": 3}}
    monkeypatch.setattr(daemon, "status", lambda port: snap)
    result = CliRunner().invoke(app, ["status", "--port", "18643"], env={"COLUMNS": "200"})
    assert "3 in flight (2 decoding, 1 reading a prompt, 0 queued)" in result.output, result.output


def test_start_never_kills_a_running_server_that_does_not_answer(monkeypatch):
    # A server busy with one huge request misses /health for seconds: `start` (and `code`,
    # `launch`) waits for it, then says so; before, it took it for stale and killed it.
    monkeypatch.setattr(daemon, "BUSY_WAIT_S", 1.0)
    waits = []
    with silent_serve(18644) as proc:
        with pytest.raises(LocalsError, match=r"has not answered for 1 s .*`locals stop --port 18644`"):
            daemon.start("smollm2", 18644, timeout=5, on_wait=waits.append)
        assert proc.poll() is None and daemon.read_record(18644).pid == proc.pid  # untouched
    assert {"status": "busy"} in waits


def test_serve_on_a_port_where_locals_runs_says_so_before_loading_a_model():
    from typer.testing import CliRunner

    from locals.cli import app

    server = _fake_server(lambda path: (200, {"status": "ok", "service": "locals", "model": "smollm2"}))
    try:
        result = CliRunner().invoke(app, ["serve", "--port", str(server.server_port), "--model", "/nonexistent"])
        assert "locals already runs on port" in str(result.exception) and "with smollm2" in str(result.exception)
        assert f"locals status --port {server.server_port}" in str(result.exception)
    finally:
        server.shutdown()
        server.server_close()


def test_start_over_a_stale_record_forgets_it_and_launches(monkeypatch, tmp_path):
    # A record whose server died (kill -9): start asks its service manager to let go, drops it, launches.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    daemon.write_record(daemon.ServerRecord(port=18613, mode="process", pid=dead.pid, log=str(tmp_path / "x.log")))
    unloaded, launched = [], []

    def launch(record, cmd):
        launched.append(daemon.read_record(18613))
        raise LocalsError("launch stopped by the test")

    monkeypatch.setattr(service, "unload", lambda record: unloaded.append(record.pid))
    monkeypatch.setattr(service, "service_manager", lambda: "process")
    monkeypatch.setattr(service, "launch_process", launch)
    with pytest.raises(LocalsError, match="launch stopped by the test"):
        daemon.start("smollm2", 18613, timeout=5)
    assert unloaded[:1] == [dead.pid] and launched == [None]  # the stale record was gone before the launch
