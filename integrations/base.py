"""The contract every agent-tool integration fulfils, the shared launch context, and the registry.

A tool module defines one `Tool` subclass: `detect()` (installed? runtime ok?),
`env()`/`command()` (settings injected at launch), `configure()` (first-run answers a
launch needs in the tool's own files) and `setup_values()` (what `locals setup` writes).
Tools talk to the server only through the URLs in `LaunchContext`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from locals import settings

API_KEY = "locals"  # the server accepts any key; tools insist on having one
# Fewest tokens a tool is told to keep for the reply, and fewest left for its turns beside its
# fixed first prompt: a model whose window leaves less is refused for that tool.
MIN_REPLY = 1024


@dataclass
class Detection:
    """What `locals launch list` shows for one tool."""

    installed: bool
    path: str | None = None
    version: str | None = None
    problem: str | None = None  # a missing runtime or similar: the tool cannot run as is

    @property
    def usable(self) -> bool:
        return self.installed and self.problem is None


@dataclass
class LaunchContext:
    """Where the server is and what the tool should assume about the model."""

    base_url: str  # http://127.0.0.1:8321, no /v1
    model: str  # the served model's name, e.g. "smollm2"
    context_length: int | None = None  # the model's own limit, when the server says
    workdir: Path = field(default_factory=Path.cwd)
    task: str | None = None  # headless: run this one task and exit
    state_dir: Path | None = None  # where a tool may keep config files of our own

    @property
    def v1(self) -> str:
        return self.base_url.rstrip("/") + "/v1"

    @property
    def provider_model(self) -> str:
        return f"locals/{self.model}"

    def context_window(self, wanted: int) -> int:
        """The window a tool should assume: its preferred size, capped by the model's."""
        return min(wanted, self.context_length) if self.context_length else wanted

    @staticmethod
    def reply_tokens(window: int, first_prompt: int = 0) -> int:
        """What a tool keeps free for the model's reply (and the next tool result): a quarter of
        the window, at most 8,192; where the tool's fixed first prompt (`first_prompt` tokens)
        leaves less than twice that, half of what it leaves (so that the tool's own turns fit
        beside it), but not under MIN_REPLY. Tools compact their history once the rest is full."""
        return min(8192, window // 4, max(MIN_REPLY, (window - first_prompt) // 2))

    @staticmethod
    def first_prompt_fits(window: int, first_prompt: int) -> bool:
        """Whether the window holds the tool's fixed first prompt, its reply and at least
        MIN_REPLY tokens of its own turns; a tool for which it does not is not started."""
        return first_prompt + LaunchContext.reply_tokens(window, first_prompt) + MIN_REPLY <= window

    def own_dir(self, tool: str) -> Path:
        base = self.state_dir or Path(settings.foreign("TMPDIR", "/tmp")) / "locals-tools"
        path = base / tool
        path.mkdir(parents=True, exist_ok=True)
        return path


@dataclass
class ConfigChange:
    """Keys to set in one of the tool's own config files (applied with backup + manifest)."""

    path: Path
    values: dict[tuple[str, ...], Any]
    why: str
    fmt: str | None = None  # "json5" where the tool reads JSON5; else the file name says


class Tool:
    """One agent tool. Subclasses set the class attributes and override what they need."""

    name: ClassVar[str]
    title: ClassVar[str]
    executable: ClassVar[str | None] = None
    install: ClassVar[str] = ""
    api: ClassVar[str] = "OpenAI chat completions"
    context_wanted: ClassVar[int] = 32768
    launches: ClassVar[bool] = True  # False: `launch` prints or serves instead of exec'ing
    runtime: ClassVar[tuple[str, int] | None] = None  # e.g. ("node", 24)
    port: ClassVar[int | None] = None  # a port locals must serve on for this tool (Ollama's)
    min_context: ClassVar[int | None] = None  # the tool refuses models with a shorter window
    # Tokens of the tool's fixed first prompt (system prompt and tool definitions), measured with
    # the embedded model's tokenizer (docs/long-window.md): no compaction can shrink it.
    first_prompt: ClassVar[int] = 0

    def detect(self) -> Detection:
        path = shutil.which(self.executable) if self.executable else None
        if self.executable and path is None:
            return Detection(False)
        return Detection(True, path, _version(path) if path else None, self.runtime_problem())

    def runtime_problem(self) -> str | None:
        if self.runtime is None:
            return None
        exe, major = self.runtime
        found = _runtime_major(exe)
        if found is None:
            return f"needs {exe} >= {major}, and {exe} is not installed"
        if found < major:
            return f"needs {exe} >= {major}; this machine has {exe} {found}"
        return None

    def env(self, ctx: LaunchContext) -> dict[str, str | None]:
        """Environment for the tool's process; None removes a variable."""
        return {}

    def command(self, ctx: LaunchContext, args: list[str]) -> list[str]:
        """The argv to exec; `args` are the user's extra arguments, passed through."""
        return [self.executable or self.name, *args]

    def prepare(self, ctx: LaunchContext) -> list[list[str]]:
        """Commands to run before the tool (e.g. its own `auth` step into our config dir)."""
        return []

    def configure(self, ctx: LaunchContext) -> list[ConfigChange]:
        """Changes to the tool's own files that a launch cannot do without (first-run screens)."""
        return []

    def setup_values(self, ctx: LaunchContext) -> list[ConfigChange]:
        """What `locals setup TOOL` writes so the tool uses locals without `locals launch`."""
        return []

    def settings(self, ctx: LaunchContext) -> dict[str, str]:
        """The settings a person types into the tool (shown by `launch editor` and in errors)."""
        return {
            "Base URL": ctx.v1,
            "API key": API_KEY,
            "Model": ctx.provider_model,
            "Context window": str(ctx.context_window(self.context_wanted)),
        }


def _version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\d+\.\d+(?:\.\d+)?", out.stdout + out.stderr)
    return match.group(0) if match else None


def _runtime_major(exe: str) -> int | None:
    path = shutil.which(exe)
    if path is None:
        return None
    version = _version(path)
    return int(version.split(".")[0]) if version else None


_REGISTRY: dict[str, Tool] = {}


def register(tool_cls: type[Tool]) -> type[Tool]:
    """Class decorator: make a tool known to `locals launch`."""
    _REGISTRY[tool_cls.name] = tool_cls()
    return tool_cls


def all_tools() -> list[Tool]:
    from integrations import load_all

    load_all()
    return list(_REGISTRY.values())


def get_tool(name: str) -> Tool:
    from integrations import load_all
    from locals.errors import LocalsError

    load_all()
    key = ALIASES.get(name.lower(), name.lower())
    if key not in _REGISTRY:
        names = ", ".join(sorted(_REGISTRY))
        raise LocalsError(f"unknown tool {name!r}; `locals launch list` shows them all ({names})")
    return _REGISTRY[key]


ALIASES = {
    "claude-code": "claude",
    "kilocode": "kilo",
    "kilo-code": "kilo",
    "hermes-agent": "hermes",
    "vscode": "editor",
    "continue": "editor",
    "zed": "editor",
}
