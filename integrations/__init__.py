"""Agent-tool integrations: one module per tool, each registering a `Tool` (see base.py).

Only locals.client, locals.config, locals.protocol and locals.errors are imported from
locals; everything a tool needs about the server arrives in a `LaunchContext`.
"""

from __future__ import annotations

import importlib

TOOL_MODULES = (
    "opencode", "claude", "cline", "kilo", "aider", "openhands",
    "hermes", "openclaw", "codex", "ollama", "editor",
)


def load_all() -> None:
    """Import every tool module so its `@register` runs (idempotent)."""
    for name in TOOL_MODULES:
        importlib.import_module(f"integrations.{name}")
