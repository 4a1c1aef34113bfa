"""Every setting locals reads from the environment, declared once: name, type, default, meaning.

The only module that reads `os.environ` for locals' own settings (and for the few variables
of other programs locals honours, through `foreign`). The engine gets its settings as an
`EngineConfig` built from these (`locals.engine.assemble.config_from_settings`); the daemon
passes `passed_to_daemon()` to the server it starts; docs/how-it-works.md's settings table is
`markdown_table()` (a test keeps the two equal). No MLX here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T", int, float, bool, str)

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One LOCALS_* variable: its type, the value when unset, and what it does (one line)."""

    name: str
    kind: type
    default: T | None
    meaning: str
    shown_default: str = ""  # how the docs table states the default, when not the value itself
    internal: bool = False  # set by locals for a process of its own; not a user's setting, not passed on
    minimum: float | None = None  # the smallest value that means anything (a number below it is refused)

    def get(self) -> T | None:
        """The value now: the environment's, parsed as `kind`, else the default.
        A value that does not parse is a user error, raised with the variable's name."""
        raw = os.environ.get(self.name, "").strip()
        if not raw:
            return self.default
        if self.kind is bool:
            return parse_bool(self.name, raw)  # type: ignore[return-value]
        from locals.errors import LocalsError

        try:
            value = self.kind(raw)
        except ValueError:
            raise LocalsError(f"{self.name}={raw!r}: expected a {self.kind.__name__}; unset it or fix it") from None
        if self.minimum is not None and not value >= self.minimum:  # NaN too
            raise LocalsError(f"{self.name}={raw!r}: must be at least {self.minimum:g}; unset it or raise it")
        return value


def parse_bool(name: str, raw: str) -> bool:
    """`1/true/on/yes` or `0/false/off/no` (any case); anything else names the variable."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    from locals.errors import LocalsError

    raise LocalsError(f"{name}={raw!r}: use 1/on/true/yes or 0/off/false/no")


HOME = Setting("LOCALS_HOME", str, None, "put all of locals' folders (state, cache, log, config) under this one folder",
               "unset")
KV_BUDGET_MB = Setting("LOCALS_KV_BUDGET_MB", float, None,
                       "KV memory the engine may reserve for requests (the memory guard)",
                       "half of available memory at start (on CUDA, of the GPU's, after the weights and their copies)",
                       minimum=1)
PREFIX_CACHE_MB = Setting("LOCALS_PREFIX_CACHE_MB", float, None,
                          "memory the prompt cache may keep between requests; `0` turns the prompt cache off",
                          "a quarter of available memory at start (measured as for the KV budget; ≥ 256)", minimum=0)
MAX_BATCH = Setting("LOCALS_MAX_BATCH", int, 64, "most replies written at once; more wait", minimum=1)
SPECULATE = Setting("LOCALS_SPECULATE", bool, True, "`0` (or `off`, `false`, `no`) turns off drafting from the context",
                    "on")
KERNELS = Setting("LOCALS_KERNELS", bool, True,
                  "`0` (or `off`, `false`, `no`) keeps MLX's own ops: no tuned or fused kernels",
                  "on")
CONSTRAINT_TIMEOUT = Setting("LOCALS_CONSTRAINT_TIMEOUT", float, 20.0,
                             "seconds a tool or JSON schema may take to compile before the request is refused", "`20`",
                             minimum=0.1)
API_KEY = Setting("LOCALS_API_KEY", str, None, "the key `locals serve --api-key` requires, when the flag is not given",
                  "unset")
MAX_TOKENS = Setting("LOCALS_MAX_TOKENS", int, None,
                     "the cap on every reply, and the limit of requests that name none (4096 when unset), "
                     "that `locals serve --max-tokens` sets when the flag is not given (`locals start` "
                     "passes it on)", "unset", minimum=1)
OVERFLOW = Setting("LOCALS_OVERFLOW", str, "refuse",
                   "what a conversation longer than the model's context gets: `refuse` (a 400) or `trim` (the oldest "
                   "tool results dropped); `locals serve --overflow` and `locals start --overflow` set it", "`refuse`")
NO_OPENBLAS = Setting("LOCALS_NO_OPENBLAS", bool, False,
                      "on Linux, do not restart with Debian's OpenBLAS preloaded", "unset")
# Set by locals itself in the process it re-executes with OpenBLAS preloaded.
BLAS_REEXEC = Setting("LOCALS_BLAS_REEXEC", bool, False, "set by locals when it restarts with OpenBLAS",
                      internal=True)
# Set by the team runner on the commands its agents and --check run, to find their processes.
COMMAND_TAG = Setting("LOCALS_COMMAND_TAG", str, None, "marks the processes of a command the runner started",
                      internal=True)

ALL: tuple[Setting, ...] = (HOME, KV_BUDGET_MB, PREFIX_CACHE_MB, MAX_BATCH, SPECULATE, KERNELS, CONSTRAINT_TIMEOUT,
                            API_KEY, MAX_TOKENS, OVERFLOW, NO_OPENBLAS, BLAS_REEXEC, COMMAND_TAG)

# Other programs' variables a background server needs as the user's shell has them (a launchd
# or systemd unit does not inherit the caller's environment).
FOREIGN_PASSED = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_ENDPOINT", "XDG_CACHE_HOME", "XDG_STATE_HOME",
                  "XDG_CONFIG_HOME", "PATH", "LD_PRELOAD", "MLX_PTX_CACHE_DIR", "MLX_CUDA_GRAPH_CACHE_SIZE", "CUDA_HOME",
                  "CUDA_PATH", "MLX_USE_CUDA_GRAPHS")


def foreign(name: str, default: str | None = None) -> str | None:
    """Another program's environment variable (XDG_*, a tool's config folder, MLX's own), or `default`."""
    return os.environ.get(name) or default


def passed_to_daemon() -> dict[str, str]:
    """The variables `locals start` hands to the server it starts: every LOCALS_* setting
    that is set (not locals' own process markers), and the foreign ones the server reads."""
    names = [s.name for s in ALL if not s.internal] + list(FOREIGN_PASSED)
    return {name: os.environ[name] for name in names if name in os.environ}


def markdown_table() -> str:
    """The table of locals' own variables in docs/how-it-works.md (a test keeps them equal)."""
    lines = ["| Variable | Default | Effect |", "|---|---|---|"]
    for s in ALL:
        if s.internal:
            continue
        default = s.shown_default or f"`{s.default}`"
        lines.append(f"| `{s.name}` | {default} | {s.meaning} |")
    return "\n".join(lines)
