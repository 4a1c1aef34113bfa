"""Hermes Agent (`hermes-agent`): its `custom` provider aimed at locals.

A launch selects the provider with flags and CUSTOM_BASE_URL (Hermes reads the
endpoint from config.yaml or that variable); `locals setup hermes` writes the model
block, with a 64k context length (capped by the model's), into ~/.hermes/config.yaml.
"""

from __future__ import annotations

from pathlib import Path

from locals import settings
from integrations.base import API_KEY, ConfigChange, LaunchContext, Tool, register


@register
class Hermes(Tool):
    name = "hermes"
    title = "Hermes Agent"
    executable = "hermes"
    install = "uv tool install hermes-agent"
    context_wanted = 65536
    min_context = 64000  # Hermes refuses to start below this

    def env(self, ctx: LaunchContext) -> dict[str, str | None]:
        return {
            "HERMES_INFERENCE_PROVIDER": "custom",
            "CUSTOM_BASE_URL": ctx.v1,
            "OPENAI_API_KEY": API_KEY,
        }

    def command(self, ctx: LaunchContext, args: list[str]) -> list[str]:
        argv = [self.executable, "chat", "--provider", "custom", "-m", ctx.model]
        if ctx.task:
            argv += ["-q", ctx.task, "-Q"]
        return [*argv, *args]

    def setup_values(self, ctx: LaunchContext) -> list[ConfigChange]:
        home = Path(settings.foreign("HERMES_HOME") or Path.home() / ".hermes")
        values = {
            ("model", "provider"): "custom",
            ("model", "default"): ctx.model,
            ("model", "base_url"): ctx.v1,
            ("model", "api_key"): API_KEY,
            ("model", "context_length"): ctx.context_window(self.context_wanted),
        }
        return [ConfigChange(home / "config.yaml", values, "makes locals Hermes' model")]
