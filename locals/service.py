"""How a background server is launched and taken down: a launchd agent on macOS, a systemd
user unit on Linux where a user manager runs, else a detached process.

`locals.daemon` decides when to start and stop and keeps the record of what it started; this
module only knows each service manager's commands. A service manager does not inherit the
caller's environment, so the settings a server reads are handed to it explicitly.
"""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from locals import settings
from locals.errors import LocalsError

if TYPE_CHECKING:
    from locals.daemon import ServerRecord

# A stopping server first finishes its prompt-cache disk writes (up to 60 s).
STOP_TIMEOUT_S = 70
LOG_ROTATE_BYTES = 20 << 20


def service_manager() -> str:
    """"launchd" on macOS, "systemd" where a user manager runs, else "process"."""
    if sys.platform == "darwin" and shutil.which("launchctl"):
        return "launchd"
    if sys.platform.startswith("linux") and shutil.which("systemd-run") and shutil.which("systemctl"):
        try:
            state = subprocess.run(["systemctl", "--user", "is-system-running"], capture_output=True,
                                   text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            state = ""
        if state in ("running", "degraded"):
            return "systemd"
    return "process"


def server_command(model: str | None, port: int, host: str, overflow: str | None) -> list[str]:
    """The `locals serve` command line a background server runs."""
    # -P: the caller's folder (a project with its own locals.py) stays off the server's module path.
    cmd = [sys.executable, "-P", "-m", "locals", "serve", "--port", str(port), "--host", host]
    return cmd + (["--model", model] if model else []) + (["--overflow", overflow] if overflow else [])


def rotate(log: Path) -> None:
    """Move a log past LOG_ROTATE_BYTES aside (one old file kept)."""
    if log.exists() and log.stat().st_size > LOG_ROTATE_BYTES:
        log.replace(log.with_suffix(".log.1"))


def launch(record: ServerRecord, cmd: list[str]) -> subprocess.Popen | None:
    """Start `cmd` the way `record.mode` says; the process where this one is its parent."""
    if record.mode == "systemd":
        launch_systemd(record, cmd)
        return None
    if record.mode == "launchd":
        launch_launchd(record, cmd)
        return None
    return launch_process(record, cmd)


def unload(record: ServerRecord) -> None:
    """Tell the service manager that started the server to stop it (a process: nothing to do)."""
    if record.mode == "systemd":
        subprocess.run(["systemctl", "--user", "stop", record.unit], capture_output=True)
    elif record.mode == "launchd":
        subprocess.run(["launchctl", "bootout", f"gui/{os.getuid()}/{record.label}"], capture_output=True)
        _plist_path(record).unlink(missing_ok=True)


def _passed_env() -> dict[str, str]:
    env = settings.passed_to_daemon()
    env["PYTHONUNBUFFERED"] = "1"  # log lines reach the file as they happen
    return env


def launch_process(record: ServerRecord, cmd: list[str]) -> subprocess.Popen:
    with open(record.log, "ab") as out:
        # A new session: the server outlives this terminal and ignores its Ctrl-C.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True,
                                env={**os.environ, **_passed_env()})
    record.pid = proc.pid
    return proc


def launch_systemd(record: ServerRecord, cmd: list[str]) -> None:
    subprocess.run(["systemctl", "--user", "reset-failed", record.unit], capture_output=True)
    args = ["systemd-run", "--user", f"--unit={record.unit}", "--collect", "--quiet",
            f"--property=StandardOutput=append:{record.log}",
            f"--property=StandardError=append:{record.log}", f"--property=TimeoutStopSec={STOP_TIMEOUT_S}"]
    args += [f"--setenv={k}={v}" for k, v in _passed_env().items()]
    done = subprocess.run(args + cmd, capture_output=True, text=True)
    if done.returncode:
        raise LocalsError(f"systemd-run failed: {done.stderr.strip()}")


def _plist_path(record: ServerRecord) -> Path:
    return Path.home() / "Library" / "LaunchAgents" / f"{record.label}.plist"


def launch_launchd(record: ServerRecord, cmd: list[str]) -> None:
    path = _plist_path(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(plistlib.dumps({
        "Label": record.label, "ProgramArguments": cmd, "RunAtLoad": True, "KeepAlive": False,
        "EnvironmentVariables": _passed_env(), "StandardOutPath": record.log,
        "StandardErrorPath": record.log, "ProcessType": "Interactive",
        "ExitTimeOut": STOP_TIMEOUT_S}))
    domain = f"gui/{os.getuid()}"
    subprocess.run(["launchctl", "bootout", f"{domain}/{record.label}"], capture_output=True)
    done = subprocess.run(["launchctl", "bootstrap", domain, str(path)], capture_output=True, text=True)
    if done.returncode:
        raise LocalsError(f"launchctl bootstrap failed: {done.stderr.strip()}")
