"""Where locals keeps its files and what it remembers between commands (no MLX here).

Paths come from platformdirs and can be moved as a whole with LOCALS_HOME (tests use it).
"""

from __future__ import annotations

import json
import os
import typing
from dataclasses import asdict, dataclass
from pathlib import Path

import platformdirs

from locals import settings
from locals.errors import UnusableFolder

DEFAULT_PORT = 8321
DEFAULT_HOST = "127.0.0.1"
OLLAMA_PORT = 11434
APP = "locals"


def _root(kind: str) -> Path:
    home = settings.HOME.get()
    if home:
        return Path(home) / kind
    getter = {
        "state": platformdirs.user_state_dir,
        "cache": platformdirs.user_cache_dir,
        "log": platformdirs.user_log_dir,
        "config": platformdirs.user_config_dir,
    }[kind]
    return Path(getter(APP))


def state_dir() -> Path:
    """Runtime state: pid file, remembered settings, worktrees of `locals run`."""
    return _ensure(_root("state"))


def cache_dir() -> Path:
    """Caches that may be deleted at any time: prompt KV on disk, compiled automata, tuning."""
    return _ensure(_root("cache"))


def constraint_dir() -> Path:
    """Compiled tool/schema automata (not created here: `locals cache list` only looks)."""
    return cache_dir() / "constraint"


def kernels_dir() -> Path:
    """Compiled CUDA kernels, a folder per MLX version (not created here: `locals cache list` only looks)."""
    return cache_dir() / "cuda-kernels"


def kernel_checks_dir() -> Path:
    """Kernel checks that passed on this machine (kernels/passed_checks.py; not created here)."""
    return cache_dir() / "kernel-checks"


def log_dir() -> Path:
    """Daemon logs."""
    return _ensure(_root("log"))


def config_dir() -> Path:
    """User settings and the setup/disconnect manifest of tool configs."""
    return _ensure(_root("config"))


def _ensure(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnusableFolder(unusable_folder(path, exc)) from None
    return path


def data_roots() -> list[Path]:
    """The folders locals writes its own files in (what an OSError there is about)."""
    return [_root(kind) for kind in ("state", "cache", "log", "config")]


def unusable_folder(path, exc: OSError) -> str:
    """The one-line message for a data folder or file locals cannot write."""
    return (f"cannot write {path} ({exc.strerror or exc}); make it writable, or set LOCALS_HOME "
            "to a folder you can write")


@dataclass
class Remembered:
    """Settings the last `locals start` used, so later commands reach the same daemon."""

    model: str | None = None
    port: int = DEFAULT_PORT
    host: str = DEFAULT_HOST

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _remembered_path() -> Path:
    return state_dir() / "remembered.json"


def record_of(cls, data):
    """A `cls` dataclass from a JSON object read back, or None when it is not one of ours: not an
    object, a field of the wrong type, a port or pid out of range (a file edited by hand)."""
    if not isinstance(data, dict):
        return None
    hints = typing.get_type_hints(cls)
    values = {k: v for k, v in data.items() if k in hints}
    if not all(isinstance(v, hints[k]) and not isinstance(v, bool) for k, v in values.items()):
        return None
    pid = values.get("pid")
    if not 0 < values.get("port", 1) < 65536 or (pid is not None and pid <= 0):
        return None
    try:
        return cls(**values)
    except TypeError:  # a required field missing
        return None


def load_remembered() -> Remembered:
    """The remembered settings, or defaults when none (or unreadable)."""
    try:
        data = json.loads(_remembered_path().read_text())
    except (OSError, ValueError):
        return Remembered()
    return record_of(Remembered, data) or Remembered()


def save_remembered(settings: Remembered) -> None:
    """Write the remembered settings atomically."""
    path = _remembered_path()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(settings)))
    tmp.replace(path)
