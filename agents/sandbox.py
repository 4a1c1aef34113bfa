"""Confinement for the shell commands agents and `--check` run: writes only in the worktree and
a private temp dir (with a private cache folder in it); no network unless asked; the user's
credentials (key folders, token files, variables named for secrets) and the sockets of the
session's services (ssh-agent, D-Bus, Docker) out of sight.

Linux uses bubblewrap (Landlock as a fallback, see landlock_box), macOS `sandbox-exec`
with a generated profile. `run_confined` runs one shell command under a Sandbox with a
timeout and an output cap; diffs are never computed in here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from locals import settings
from agents import landlock_box
from agents.command_bounds import (FLOOD_BYTES, LINGER_S, TAG_VARIABLE, BoundedOutput, kill_group,
                                   kill_tagged)
from locals.errors import LocalsError

OUTPUT_CAP = 12_000
# Credentials under the home folder that no build or test needs to read: hidden inside the sandbox
# (bubblewrap, sandbox-exec; Landlock cannot hide what it lets be read).
SECRET_PATHS = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".config/gcloud", ".config/gh", ".config/git/credentials",
                ".docker/config.json", ".netrc", ".git-credentials", ".pypirc", ".npmrc", ".yarnrc", ".yarnrc.yml",
                ".cargo/credentials", ".cargo/credentials.toml", ".m2/settings.xml", ".gradle/gradle.properties",
                ".vault-token", ".password-store", ".local/share/keyrings", ".cache/huggingface/token",
                ".config/google-chrome", ".config/chromium", ".mozilla", "Library/Keychains")
# Sockets of services that would act for the user outside the sandbox (a file socket is reached
# whatever the network namespace): hidden, like the variables that name them.
SERVICE_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/podman", "/run/dbus")
# ... and where desktop apps keep theirs under the home folder (Docker Desktop, Colima, Rancher
# Desktop, OrbStack, 1Password's ssh agent).
HOME_SOCKETS = (".docker/desktop", ".docker/run", ".colima", ".rd", ".orbstack", ".1password")
SERVICE_VARIABLES = ("SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR", "DISPLAY", "WAYLAND_DISPLAY",
                     "GPG_AGENT_INFO", "DOCKER_HOST")
# Environment variables whose names say they hold a secret are not passed to confined commands.
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL|_PAT$|_AUTH|_DSN$"
                         r"|_KEY$|^AWS_|^DATABASE_URL$", re.I)
# A URL with a password in it (postgres://app:secret@host), whatever its variable's name.
SECRET_VALUE = re.compile(r"://[^/\s:@]+:[^/\s@]+@")


class SandboxUnavailable(LocalsError):
    """No way to confine commands on this machine; the message says what to install."""


@dataclass
class Sandbox:
    """How to wrap a shell command so it can write only to `writable` paths."""

    writable: list[Path]
    network: bool = False
    kind: str = "bwrap"  # "bwrap", "sandbox-exec", "landlock" (Linux fallback) or "none"
    tmp_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def wrap(self, shell_command: str, cwd: Path) -> list[str]:
        """The argv that runs `shell_command` in `cwd` under this sandbox."""
        inner = ["/bin/sh", "-c", shell_command]
        if self.kind in ("none", "landlock"):
            return inner
        if self.kind == "bwrap":
            return _bwrap_argv(self, cwd) + inner
        if self.kind == "sandbox-exec":
            return ["sandbox-exec", "-p", macos_profile(self)] + inner
        raise ValueError(f"unknown sandbox kind {self.kind!r}")

    def preexec(self):
        """What the child runs before exec: Landlock's restriction, or nothing."""
        return landlock_box.restrictor(self.writable) if self.kind == "landlock" else None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.kind != "none":
            env = {k: v for k, v in env.items()
                   if not (SECRET_NAME.search(k) or SECRET_VALUE.search(v) or k in SERVICE_VARIABLES)}
            if self.tmp_dir is not None:  # the user's cache folders are read-only here (make_sandbox)
                env["XDG_CACHE_HOME"] = str(private_cache(self.tmp_dir))
        # Bytecode caches would otherwise show up in the agents' diffs.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        # The OpenBLAS preload locals adds for its own speed hangs bwrap (its threads start
        # before bwrap's namespace setup); user commands never needed it.
        preload = [p for p in env.pop("LD_PRELOAD", "").split(":") if p and "openblas" not in p]
        if preload:
            env["LD_PRELOAD"] = ":".join(preload)
        if self.tmp_dir is not None and self.kind != "bwrap":
            env["TMPDIR"] = str(self.tmp_dir)
        env.update(self.extra_env)
        return env


def private_cache(tmp_dir: Path) -> Path:
    """The cache folder confined commands get (`XDG_CACHE_HOME`), made in their temp folder."""
    (tmp_dir / "cache").mkdir(parents=True, exist_ok=True)
    return tmp_dir / "cache"


def secret_paths() -> list[Path]:
    """The credential files and folders of `SECRET_PATHS` this user has, and the session's sockets."""
    home = Path.home()
    runtime = settings.foreign("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    named = [settings.foreign("SSH_AUTH_SOCK") or "", (settings.foreign("DOCKER_HOST") or "").removeprefix("unix://")]
    found = [home / rel for rel in (*SECRET_PATHS, *HOME_SOCKETS)]
    found += [Path(p) for p in (*SERVICE_SOCKETS, runtime, *named) if p.startswith("/")]
    return [p for p in found if os.path.lexists(p)]


def make_sandbox(worktree: Path, tmp_dir: Path, *, network: bool = False, enabled: bool = True) -> Sandbox:
    """A sandbox for commands in `worktree`; raises SandboxUnavailable with install advice.

    The user's own cache folders stay read-only: tools run what they keep there (pip's built
    wheels, pre-commit's hooks, locals' compiled automata), so a command writing there could
    run code outside the sandbox later. Commands get a private cache in their temp folder (made
    by the runner, `private_cache`)."""
    writable = [worktree, tmp_dir]
    if not enabled:
        return Sandbox(writable, network=True, kind="none", tmp_dir=tmp_dir)
    if sys.platform == "darwin":
        if shutil.which("sandbox-exec") is None:
            raise SandboxUnavailable("sandbox-exec not found; pass --no-sandbox to run agents' commands unconfined")
        return Sandbox(writable, network=network, kind="sandbox-exec", tmp_dir=tmp_dir)
    if sys.platform.startswith("linux"):
        try:
            check_bwrap()
        except SandboxUnavailable as exc:
            if not landlock_box.available():
                raise
            if not network:
                raise SandboxUnavailable(f"{exc}; or add --network to confine writes with Landlock alone "
                                         "(it cannot cut the network)") from None
            return Sandbox([*writable, Path(tempfile.gettempdir())], network=True, kind="landlock", tmp_dir=tmp_dir)
        return Sandbox(writable, network=network, kind="bwrap", tmp_dir=tmp_dir)
    raise SandboxUnavailable(f"no sandbox for {sys.platform}; pass --no-sandbox to run agents' commands unconfined")


_bwrap_ok: bool | None = None


def check_bwrap() -> None:
    """Fail with install advice unless bubblewrap exists and can create its namespaces here."""
    global _bwrap_ok
    if _bwrap_ok:
        return
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            "bubblewrap is needed to confine the agents' commands: install it "
            "(`sudo apt install bubblewrap`, `sudo dnf install bubblewrap`, `sudo pacman -S bubblewrap`) "
            "or pass --no-sandbox"
        )
    probe = Sandbox([], kind="bwrap")
    try:
        proc = subprocess.run(probe.wrap("true", Path("/")), env=probe.env(), capture_output=True, text=True,
                              timeout=30)
    except subprocess.TimeoutExpired:
        raise SandboxUnavailable("bubblewrap did not start within 30 s; pass --no-sandbox to run unconfined") from None
    if proc.returncode != 0:
        raise SandboxUnavailable(
            f"bubblewrap cannot create a sandbox here ({proc.stderr.strip()}); enable unprivileged user "
            "namespaces (`sudo sysctl kernel.unprivileged_userns_clone=1`, or on Ubuntu an AppArmor "
            "profile for bwrap) or pass --no-sandbox"
        )
    _bwrap_ok = True


def _python_dirs_under_tmp() -> list[str]:
    """This Python's environment and base install when they are under /tmp (hidden by the private /tmp)."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable))}
    return sorted(d for d in dirs if d == "/tmp" or d.startswith("/tmp/"))


def _bwrap_argv(box: Sandbox, cwd: Path) -> list[str]:
    # The whole file system read-only, a private /tmp, then the writable folders at their own paths.
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for path in _python_dirs_under_tmp():  # a Python env living in /tmp stays visible, read-only
        argv += ["--ro-bind", path, path]
    for path in map(Path, map(os.path.realpath, secret_paths())):  # an empty folder or file in their place
        if not path.is_relative_to("/tmp"):  # the private /tmp hides those already
            argv += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    for path in box.writable:
        argv += ["--bind", str(path), str(path)]
    argv += ["--unshare-user-try", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not box.network:
        argv.append("--unshare-net")
    argv += ["--die-with-parent", "--new-session", "--chdir", str(cwd)]
    if box.tmp_dir is not None:
        argv += ["--setenv", "TMPDIR", str(box.tmp_dir)]
    return argv + ["--"]


def macos_profile(box: Sandbox) -> str:
    """A Seatbelt profile: everything allowed except writes outside `writable`, reading the user's
    credentials (and network)."""
    allowed = " ".join(f'(subpath "{os.path.realpath(p)}")' for p in box.writable)
    lines = [
        "(version 1)",
        "(allow default)",
        "(deny file-write*)",
        f'(allow file-write* {allowed} (literal "/dev/null") (literal "/dev/tty") (subpath "/dev/fd"))',
    ]
    secrets = " ".join(f'(subpath "{os.path.realpath(p)}")' for p in secret_paths())
    if secrets:
        lines.append(f"(deny file-read* {secrets})")
    if not box.network:
        lines.append("(deny network*)")
        lines.append('(allow network* (remote unix-socket))')
    return "\n".join(lines)


@dataclass
class CommandResult:
    """Exit status and the (capped) combined output of one confined command."""

    returncode: int
    output: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


async def run_confined(
    command: str, cwd: Path, sandbox: Sandbox, *, timeout_s: float = 120.0, cap: int = OUTPUT_CAP
) -> CommandResult:
    """Run `command` under `sandbox` within command_bounds' limits: its process group and every
    process it started are killed when it ends, times out, floods its output, or is cancelled;
    a process it left running may hold its output for LINGER_S after it exits, no longer."""
    tag = uuid.uuid4().hex
    proc = await asyncio.create_subprocess_exec(
        *sandbox.wrap(command, cwd),
        cwd=str(cwd),
        env={**sandbox.env(), TAG_VARIABLE: tag},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=sandbox.preexec(),
    )
    output = BoundedOutput(cap)
    reading = asyncio.ensure_future(output.read(proc.stdout))
    try:
        ending = await asyncio.wait_for(_ending(proc, reading), timeout=timeout_s)
    except asyncio.TimeoutError:
        ending = f"killed after {timeout_s:g} s"
    finally:  # cancelled too: nothing it started may outlive it
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        kill_group(proc.pid)
        await asyncio.to_thread(kill_tagged, tag)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(_closed(proc), LINGER_S)
    text = output.text() + (f"\n({ending})" if ending else "")
    stopped = ending.startswith(("killed", "stopped"))
    return CommandResult(returncode=-1 if stopped else proc.returncode or 0, output=text,
                         timed_out=ending.startswith("killed"))


async def _ending(proc: asyncio.subprocess.Process, reading: asyncio.Future) -> str:
    """Wait for the command; "" when it ended by itself, else a note on how it was ended."""
    flood = f"stopped: more than {FLOOD_BYTES >> 20} MiB of output"
    waiting = asyncio.ensure_future(_exited(proc))
    await asyncio.wait({waiting, reading}, return_when=asyncio.FIRST_COMPLETED)
    if reading.done() and not reading.result():
        waiting.cancel()
        return flood
    await waiting
    try:
        whole = await asyncio.wait_for(asyncio.shield(reading), LINGER_S)
    except asyncio.TimeoutError:
        return "it left a process running that held its output; that process was stopped"
    return "" if whole else flood


async def _closed(proc: asyncio.subprocess.Process) -> None:
    """Until the killed command's output pipe is closed (what is left unread is dropped)."""
    while await proc.stdout.read(1 << 16):
        pass
    await proc.wait()


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Until the command's own process has exited. Not `proc.wait()`: on Python 3.11 that also
    waits for its output pipe to close, which a process it left running keeps open."""
    while proc.returncode is None:
        await asyncio.sleep(0.05)


def cap_text(text: str, cap: int) -> str:
    """Keep the head and the tail of long output: errors tend to be at the end."""
    if len(text) <= cap:
        return text
    half = cap // 2
    return f"{text[:half]}\n... ({len(text) - cap} characters cut) ...\n{text[-half:]}"
