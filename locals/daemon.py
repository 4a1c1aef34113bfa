"""Runs the server in the background and finds it again: started through `locals.service` (a
launchd agent on macOS, a systemd user unit on Linux when a user manager runs, else a detached
process); a JSON record per port in the state dir says how it was started and its pid.

Public API (used by the CLI, the runner and the integrations): `ensure_running`, `start`,
`stop`, `is_running`, `health`, `status`. Nothing here imports the engine at import time; only a
change of model resolves names and fetches weights through `engine.load.models`, on demand.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from locals import service
from locals.config import (DEFAULT_HOST, DEFAULT_PORT, Remembered, load_remembered, log_dir, record_of,
                           save_remembered, state_dir)
from locals.errors import LocalsError
from locals.service import STOP_TIMEOUT_S

SERVICE = "locals"  # how /health and /v1/locals/status name the server (never another one on the port)
START_TIMEOUT_S = 900  # first start may download a model
# How long `start` gives a running server that does not answer before saying so (never killing it).
BUSY_WAIT_S = 30.0


class AlreadyRunning(LocalsError):
    """`locals start` while a server already answers on that port; `model` is what it serves."""

    def __init__(self, message: str, model: str | None = None):
        super().__init__(message)
        self.model = model


@dataclass
class ServerRecord:
    """How the server on one port was started (mode: process, systemd, launchd, foreground)."""

    port: int
    host: str = DEFAULT_HOST
    model: str | None = None
    mode: str = "process"
    pid: int | None = None
    log: str = ""
    started: float = field(default_factory=time.time)

    @property
    def unit(self) -> str:
        return f"locals-{self.port}"

    @property
    def label(self) -> str:
        return f"dev.locals.server.{self.port}"


def _record_path(port: int) -> Path:
    return state_dir() / f"server-{port}.json"


def read_record(port: int) -> ServerRecord | None:
    try:
        return record_of(ServerRecord, json.loads(_record_path(port).read_text()))
    except (OSError, ValueError):
        return None


def write_record(record: ServerRecord) -> None:
    path = _record_path(record.port)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record)))
    tmp.replace(path)


def remove_record(port: int) -> None:
    _record_path(port).unlink(missing_ok=True)


def mark_serving(port: int, host: str, model: str | None) -> None:
    """Called by the server process once it listens: records its pid (keeps the mode the
    daemon wrote; a server started by hand is "foreground")."""
    record = read_record(port)
    if record is None or (record.pid and record.pid != os.getpid() and _alive(record.pid)):
        record = ServerRecord(port=port, host=host, model=model, mode="foreground")  # logs to its terminal
    record.pid = os.getpid()
    write_record(record)


def other_servers(port: int) -> list[int]:
    """Ports other than `port` where a `locals serve` this user started still runs (by its record)."""
    ports = []
    for path in sorted(state_dir().glob("server-*.json")):
        other = path.stem.removeprefix("server-")
        record = read_record(int(other)) if other.isdigit() and int(other) != port else None
        if record is not None and record.pid and _alive(record.pid) and _is_our_server(record.pid, record.port):
            ports.append(record.port)
    return ports


def unmark_serving(port: int) -> None:
    record = read_record(port)
    if record is not None and record.pid == os.getpid():
        remove_record(port)


def log_path(port: int) -> Path:
    return log_dir() / f"server-{port}.log"


def base_url(port: int, host: str = DEFAULT_HOST) -> str:
    return f"http://{host}:{port}"


def _get_json(url: str, timeout: float) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 while loading still carries the JSON
        try:
            return json.loads(exc.read())
        except ValueError:
            return None
    except (OSError, ValueError):
        return None


def health(port: int | None = None, host: str | None = None, timeout: float = 2.0) -> dict | None:
    """/health of the locals server on `port` (status ok/loading/failed), None if none answers."""
    remembered = load_remembered()
    body = _get_json(f"{base_url(port or remembered.port, host or DEFAULT_HOST)}/health", timeout)
    return body if isinstance(body, dict) and body.get("service") == SERVICE else None


def is_running(port: int | None = None) -> bool:
    return health(port) is not None


def port_answers(port: int, host: str = DEFAULT_HOST) -> bool:
    """Whether any program (locals or another) accepts connections on `port`."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def status(port: int | None = None) -> dict | None:
    """Everything the server reports about itself (/v1/locals/status), None if not running."""
    port = port or load_remembered().port
    body = _get_json(f"{base_url(port)}/v1/locals/status", timeout=5.0)
    return body if isinstance(body, dict) and body.get("service") == SERVICE and "model" in body else None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def unanswering_server(port: int) -> int | None:
    """The pid of the recorded `locals serve` on `port` when it runs (it may not answer)."""
    record = read_record(port)
    pid = record.pid if record else None
    return pid if pid and _alive(pid) and _is_our_server(pid, port) else None


def _is_our_server(pid: int, port: int) -> bool:
    """True if `pid` runs `locals serve` on `port` (pids get reused; never signal a stranger)."""
    try:
        args = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    if "serve" not in args or not any("locals" in a for a in args[: args.index("serve")]):
        return False
    for i, arg in enumerate(args):
        if arg in ("--port", "-p") and i + 1 < len(args):
            return args[i + 1] == str(port)
        if arg.startswith("--port="):
            return arg.removeprefix("--port=") == str(port)
    return port == DEFAULT_PORT


# --- start / stop ---------------------------------------------------------------------------

def log_tail(port: int, lines: int = 20, since: int = 0) -> str:
    """The last `lines` lines of the server log, from byte `since` on (one start's own lines)."""
    try:
        with open(log_path(port), "rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _log_size(port: int) -> int:
    try:
        return log_path(port).stat().st_size
    except OSError:
        return 0


@contextlib.contextmanager
def port_lock(port: int, timeout: float, on_wait: Callable[[dict | None], None] | None = None):
    """Held while one `locals start` (or a restart for another model) owns `port`: a second
    one waits for it (at most `timeout` s), then finds its server, instead of taking it for a
    stale one."""
    deadline = time.monotonic() + timeout
    with open(state_dir() / f"server-{port}.lock", "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LocalsError(f"another `locals start` has been starting the server on port {port} "
                                      f"for over {timeout:.0f} s; wait for it, or `locals stop --port {port}`")
                if on_wait:
                    on_wait({"status": "starting elsewhere"})
                time.sleep(0.25)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _wait_while_busy(port: int, host: str, on_wait) -> dict | None:
    """A recorded server that runs but does not answer is given BUSY_WAIT_S to answer (a huge
    request being parsed, a flush at stop) rather than taken for stale and killed under its
    clients' streams. Its /health once it answers; None when no such server runs; still silent,
    a LocalsError that names `locals stop`."""
    pid = unanswering_server(port)
    deadline = time.monotonic() + BUSY_WAIT_S
    while pid is not None and time.monotonic() < deadline:
        if on_wait:
            on_wait({"status": "busy"})
        body = health(port, host)
        if body is not None:
            return body
        time.sleep(0.5)  # one not listening at all refuses at once
        pid = unanswering_server(port)
    if pid is None:
        return None
    raise LocalsError(f"locals on port {port} (pid {pid}) runs but has not answered for {BUSY_WAIT_S:.0f} s "
                      f"(stuck or paused); `locals stop --port {port}` ends it, then start it again")


def _clear_stale(port: int) -> None:
    """A record whose server no longer runs (`_wait_while_busy` found none): forget it."""
    record = read_record(port)
    if record is None:
        return
    service.unload(record)
    remove_record(port)


def start(model: str | None = None, port: int | None = None, host: str | None = None, *,
          timeout: float = START_TIMEOUT_S, on_wait: Callable[[dict | None], None] | None = None,
          overflow: str | None = None) -> str:
    """Start the server in the background (`model` None: the remembered one; `overflow` None: the
    server's default policy) and wait until it serves; returns its base URL. Raises AlreadyRunning,
    once it serves, if one answered already."""
    remembered = load_remembered()
    port = port or remembered.port
    with port_lock(port, timeout, on_wait):
        return _start(model or remembered.model, port, host or remembered.host or DEFAULT_HOST, timeout, on_wait,
                      overflow)


def _start(model: str | None, port: int, host: str, timeout: float, on_wait, overflow: str | None) -> str:
    """`start` with the port's lock held."""
    url = base_url(port, host)
    running = health(port, host) or _wait_while_busy(port, host, on_wait)
    if running is not None and running.get("status") == "failed":
        stop(port)  # a server whose model failed to load, or whose engine broke: start afresh
        running = None
    if running is not None:
        if running.get("status") != "ok":  # still loading: "already running" means serving
            _wait_healthy(port, host, timeout, read_record(port) or ServerRecord(port), None, on_wait)
        raise AlreadyRunning(f"locals is already running at {url} with {running.get('model')}; "
                             "run `locals stop` first to change the model or port", model=running.get("model"))
    _clear_stale(port)
    record = ServerRecord(port=port, host=host, model=model, mode=service.service_manager(), log=str(log_path(port)))
    service.rotate(Path(record.log))
    log_start = _log_size(port)
    proc = service.launch(record, service.server_command(model, port, host, overflow))
    write_record(record)
    try:
        _wait_healthy(port, host, timeout, record, proc, on_wait, log_start)
    except BaseException:
        with contextlib.suppress(LocalsError):
            stop(port)  # never leave a half-started server behind
        raise
    save_remembered(Remembered(model=model, port=port, host=host))
    return url


def _wait_healthy(port: int, host: str, timeout: float, record: ServerRecord,
                  proc: subprocess.Popen | None, on_wait, log_start: int = 0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = health(port, host, timeout=1.0)
        if body and body.get("status") == "ok":
            return
        if body and body.get("status") == "failed":
            raise LocalsError(f"the server on port {port} could not start: {body.get('error')}"
                              + (f" (its log: {record.log})" if record.log else ""))
        if on_wait:
            on_wait(body)
        if _exited(record, proc, started=body is not None):
            if not record.log:
                raise LocalsError(f"the server on port {port} stopped while starting; its terminal says why")
            raise LocalsError(f"the server stopped while starting; the end of {record.log}:\n"
                              f"{log_tail(port, since=log_start)}")
        time.sleep(0.25)
    raise LocalsError(f"the server did not become ready within {timeout:.0f} s (a first start loads and compiles "
                      f"the model; `locals start --timeout` gives it longer); see {record.log or 'its terminal'}")


def _exited(record: ServerRecord, proc: subprocess.Popen | None, started: bool) -> bool:
    if proc is not None:
        return proc.poll() is not None
    pid = (read_record(record.port) or record).pid
    if pid:
        return not _alive(pid)
    if record.mode == "systemd":
        active = subprocess.run(["systemctl", "--user", "is-active", record.unit],
                                capture_output=True, text=True).stdout.strip()
        return active in ("failed", "inactive")
    return False


def _terminate(pid: int, timeout: float) -> None:
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
    except psutil.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    except psutil.Error:
        pass


def stop(port: int | None = None, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the server on `port` (default: the remembered one); False if none was running
    (a stale record is removed all the same). A server that answers without a `locals serve`
    process on that port behind it is never signalled: LocalsError."""
    port = port or load_remembered().port
    record = read_record(port)
    body = health(port)
    if record is None and body is None:
        return False
    if record is not None:
        service.unload(record)
    pid = (record.pid if record else None) or (body or {}).get("pid")
    ours = bool(pid and _alive(pid) and _is_our_server(pid, port))
    if ours:
        _terminate(pid, timeout)
    remove_record(port)  # also forgets a stale record of a server that died
    if body is None:
        return ours
    if health(port) is None:
        return True  # it answered and is gone (a service manager may have stopped it above)
    who = f"pid {body['pid']}" if body.get("pid") else "its pid unknown"
    raise LocalsError(f"a locals server answers on port {port} ({who}) that locals cannot stop: not a "
                      "`locals serve` process of yours (a script's, another user's); stop it where it runs"
                      + (f" (Ctrl-C) or with `kill {body['pid']}`" if body.get("pid") else " (Ctrl-C)"))


def same_model(asked: str, serving: str) -> bool:
    """Whether two names (alias, repo id, path) mean the same weights."""
    if asked == serving:
        return True
    from locals.engine.load.models import resolve

    try:
        return resolve(asked)[1] == resolve(serving)[1]
    except LocalsError:
        return False


def ensure_running(model: str | None = None, port: int | None = None, remember_port: bool = True) -> str:
    """The base URL of a running server with `model` (None: whichever runs, or the remembered
    one), starting or restarting the daemon as needed and waiting until it serves. The model and
    port are remembered for the next command; the port only with `remember_port` (a tool's own
    port, such as Ollama's, is not the user's choice)."""
    remembered = load_remembered()
    port = port or remembered.port
    with port_lock(port, START_TIMEOUT_S):  # two agents' launches at once: the second finds the first's server
        body = health(port)
        if body is not None and model:
            record = read_record(port)
            serving = {body.get("model"), record.model if record else None} - {None}
            if not any(same_model(model, name) for name in serving):
                from locals.engine.load.models import fetch_weights

                fetch_weights(model)  # a model that cannot be had fails here, the running server untouched
                stop(port)
                body = None
        if body is None or body.get("status") == "failed":
            try:
                return _start(model or remembered.model, port, remembered.host or DEFAULT_HOST, START_TIMEOUT_S, None,
                              None)
            except AlreadyRunning as exc:  # a foreground `locals serve` got there first
                if model and not same_model(model, exc.model or ""):
                    raise
        elif body.get("status") != "ok":
            _wait_healthy(port, DEFAULT_HOST, START_TIMEOUT_S, read_record(port) or ServerRecord(port), None, None)
    save_remembered(Remembered(model=model or remembered.model, port=port if remember_port else remembered.port,
                               host=remembered.host))
    return base_url(port)
