"""The daemon's bookkeeping without a model: records, stale records, pid safety, health
identification, bind checks, and a start whose server dies reporting why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from locals import daemon, service
from locals.config import load_remembered
from locals.errors import LocalsError
from locals.server.run import check_bind


def test_record_round_trip_and_foreground_marking():
    daemon.mark_serving(18555, "127.0.0.1", "smollm2")
    record = daemon.read_record(18555)
    assert record.pid == os.getpid() and record.mode == "foreground" and record.model == "smollm2"
    daemon.unmark_serving(18555)
    assert daemon.read_record(18555) is None


def test_daemon_record_keeps_its_mode_when_the_server_marks_itself():
    daemon.write_record(daemon.ServerRecord(port=18556, mode="systemd", model="qwen"))
    daemon.mark_serving(18556, "127.0.0.1", "qwen")
    record = daemon.read_record(18556)
    assert record.mode == "systemd" and record.pid == os.getpid()


def test_stop_never_signals_a_process_that_is_not_our_server():
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        daemon.write_record(daemon.ServerRecord(port=18557, pid=stranger.pid))
        assert daemon.stop(18557) is False
        assert stranger.poll() is None  # still alive
        assert daemon.read_record(18557) is None  # the stale record is gone
    finally:
        stranger.kill()
        stranger.wait()


def test_stop_with_nothing_running():
    assert daemon.stop(18558) is False
    assert not daemon.is_running(18558)


class _OtherServer(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_another_server_on_the_port_is_not_mistaken_for_locals():
    server = HTTPServer(("127.0.0.1", 0), _OtherServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert daemon.health(server.server_port) is None
        assert not daemon.is_running(server.server_port)
    finally:
        server.shutdown()


@pytest.mark.parametrize("host, allow, ok", [
    ("127.0.0.1", False, True), ("localhost", False, True), ("::1", False, True),
    ("0.0.0.0", False, False), ("192.168.1.2", False, False), ("0.0.0.0", True, True),
])
def test_non_loopback_bind_needs_allow_remote(host, allow, ok):
    if ok:
        check_bind(host, allow)
    else:
        with pytest.raises(LocalsError, match="--allow-remote"):
            check_bind(host, allow)


def test_a_server_that_dies_while_starting_is_reported(monkeypatch):
    monkeypatch.setattr(service, "service_manager", lambda: "process")
    with pytest.raises(LocalsError) as info:
        daemon.start("/nonexistent/model-folder", 18559, timeout=120)
    message = str(info.value)
    # Seen exiting, or caught in the moment it reports the failure before exiting.
    assert ("stopped while starting" in message or "could not start" in message) and "model-folder" in message
    assert daemon.read_record(18559) is None and not daemon.is_running(18559)
    assert load_remembered().port != 18559  # only a start that worked is remembered


def test_start_with_another_model_than_the_running_one_fails(monkeypatch):
    from typer.testing import CliRunner

    from locals.cli import app

    def running(model, port, **_):
        raise daemon.AlreadyRunning("locals is already running with smollm2; run `locals stop` first", "smollm2")

    monkeypatch.setattr(daemon, "start", running)
    same = CliRunner().invoke(app, ["start", "--model", "smollm2"])
    assert same.exit_code == 0 and "already running" in same.output  # asking again is fine
    plain = CliRunner().invoke(app, ["start"])
    assert plain.exit_code == 0
    alias = CliRunner().invoke(app, ["start", "--model", "smollm2:135m"])  # another name, same weights
    assert alias.exit_code == 0, alias.output
    other = CliRunner().invoke(app, ["start", "--model", "qwen"])
    assert other.exit_code != 0 and isinstance(other.exception, daemon.AlreadyRunning)


def test_asking_for_a_model_that_cannot_be_had_keeps_the_running_server(monkeypatch, tmp_path):
    from locals.errors import ModelNotFound

    stopped, started = [], []
    monkeypatch.setattr(daemon, "health", lambda port, host=None: {"status": "ok", "model": "smollm2"})
    monkeypatch.setattr(daemon, "read_record", lambda port: None)
    monkeypatch.setattr(daemon, "stop", lambda port: stopped.append(port) or True)
    monkeypatch.setattr(daemon, "_start", lambda model, port, *_: started.append(model) or "http://x")
    with pytest.raises(ModelNotFound):
        daemon.ensure_running(str(tmp_path / "missing.gguf"), 18561)
    assert stopped == [] and started == []  # the working server was left alone
    # Another name for the same weights is not a change of model.
    assert daemon.ensure_running("smollm2:135m", 18561) == daemon.base_url(18561)
    assert stopped == [] and started == []
    gguf = tmp_path / "other.gguf"
    gguf.write_bytes(b"GGUF")
    daemon.ensure_running(str(gguf), 18561)  # on disk: the server restarts with it
    assert stopped == [18561] and started == [str(gguf)]


def test_a_tools_own_port_is_not_remembered_as_the_users(monkeypatch):
    from locals.config import Remembered, save_remembered

    save_remembered(Remembered(model="smollm2", port=8431))
    monkeypatch.setattr(daemon, "health", lambda port, host=None: {"status": "ok", "model": "smollm2"})
    daemon.ensure_running(None, 11434, remember_port=False)
    assert load_remembered().port == 8431
    daemon.ensure_running(None, 8499)
    assert load_remembered().port == 8499


@pytest.mark.parametrize("text", ["[]", '{"port": "abc"}', '{"port": null}', '{"port": 0}', "{not json"])
def test_state_files_edited_by_hand_are_read_as_absent(locals_home, text):
    from locals.config import load_remembered, state_dir

    (state_dir() / "remembered.json").write_text(text)
    assert load_remembered().port == 8321
    for record in ("[]", '{"port": 18770, "pid": -1}', '{"port": 18770, "pid": "7"}'):
        (state_dir() / "server-18770.json").write_text(record)
        assert daemon.read_record(18770) is None
        assert daemon.stop(18770) is False  # nothing runs there: no traceback, no signal
