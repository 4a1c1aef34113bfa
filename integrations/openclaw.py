"""OpenClaw (`openclaw`, Node >= 24): a `locals` entry in models.providers of openclaw.json.

OpenClaw reads providers only from its config file, so both launch and setup add the
provider and make it the agents' primary model there (backed up, undone by
`locals disconnect openclaw`), with a 64k window capped by the model's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from locals import settings
from integrations.base import API_KEY, ConfigChange, LaunchContext, Tool, register


def config_file() -> Path:
    explicit = settings.foreign("OPENCLAW_CONFIG_PATH")
    if explicit:
        return Path(explicit)
    state = Path(settings.foreign("OPENCLAW_STATE_DIR") or Path.home() / ".openclaw")
    return state / "openclaw.json"


@register
class OpenClaw(Tool):
    name = "openclaw"
    title = "OpenClaw"
    executable = "openclaw"
    install = "npm install -g openclaw"
    runtime = ("node", 24)
    context_wanted = 65536

    def provider(self, ctx: LaunchContext) -> dict[str, Any]:
        window = ctx.context_window(self.context_wanted)
        return {
            "baseUrl": ctx.v1,
            "apiKey": API_KEY,
            "api": "openai-completions",
            "models": [{
                "id": ctx.model,
                "name": f"{ctx.model} (locals)",
                "contextWindow": window,
                "maxTokens": min(8192, window // 4),
            }],
        }

    def setup_values(self, ctx: LaunchContext) -> list[ConfigChange]:
        values = {
            ("models", "providers", "locals"): self.provider(ctx),
            ("agents", "defaults", "model", "primary"): ctx.provider_model,
        }
        return [ConfigChange(config_file(), values, "adds locals to OpenClaw's providers", fmt="json5")]

    def configure(self, ctx: LaunchContext) -> list[ConfigChange]:
        return self.setup_values(ctx)

    def command(self, ctx: LaunchContext, args: list[str]) -> list[str]:
        if ctx.task:
            return [self.executable, "agent", "--local", "--message", ctx.task, *args]
        return [self.executable, *(args or ["tui"])]
