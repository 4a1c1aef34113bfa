"""OpenCode (`opencode-ai`): locals as an OpenAI-compatible provider, injected at launch.

`locals code DIR` runs OpenCode with OPENCODE_CONFIG_CONTENT holding a `locals`
provider, so the user's own opencode.json is untouched; `locals setup` writes the same
provider into it (with a backup) so plain `opencode` and the desktop app use it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from locals import settings
from integrations.base import API_KEY, ConfigChange, LaunchContext, Tool, register

SCHEMA = "https://opencode.ai/config.json"


def provider_block(ctx: LaunchContext, window: int, first_prompt: int) -> dict[str, Any]:
    """An `@ai-sdk/openai-compatible` provider named locals with the served model in it. OpenCode
    compacts a session once its last request's tokens pass `context` minus `output`."""
    return {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Locals",
        "options": {"baseURL": ctx.v1, "apiKey": API_KEY},
        "models": {
            ctx.model: {
                "name": f"{ctx.model} (locals)",
                "tool_call": True,
                "limit": {"context": window, "output": ctx.reply_tokens(window, first_prompt)},
            }
        },
    }


def global_config(app: str) -> Path:
    """The app's global config file: an existing .jsonc/.json/config.json, else <app>.json."""
    root = Path(settings.foreign("XDG_CONFIG_HOME") or Path.home() / ".config") / app
    for name in (f"{app}.jsonc", f"{app}.json", "config.json"):
        if (root / name).exists():
            return root / name
    return root / f"{app}.json"


@register
class OpenCode(Tool):
    name = "opencode"
    title = "OpenCode"
    executable = "opencode"
    install = "npm install -g opencode-ai"
    context_wanted = 32768
    first_prompt = 7625  # opencode 1.18.33, `run`
    config_env = "OPENCODE_CONFIG_CONTENT"
    app = "opencode"

    def inline_config(self, ctx: LaunchContext) -> dict[str, Any]:
        window = ctx.context_window(self.context_wanted)
        return {
            "$schema": SCHEMA,
            "provider": {"locals": provider_block(ctx, window, self.first_prompt)},
            "model": ctx.provider_model,
            "small_model": ctx.provider_model,
        }

    def env(self, ctx: LaunchContext) -> dict[str, str | None]:
        # The locals provider needs no models.dev catalogue; skipping it keeps launch offline.
        return {self.config_env: json.dumps(self.inline_config(ctx)), "OPENCODE_DISABLE_MODELS_FETCH": "1"}

    def command(self, ctx: LaunchContext, args: list[str]) -> list[str]:
        if ctx.task:
            return [self.executable, "run", ctx.task, "--dir", str(ctx.workdir), *args]
        return [self.executable, *args, str(ctx.workdir)]

    def setup_values(self, ctx: LaunchContext) -> list[ConfigChange]:
        window = ctx.context_window(self.context_wanted)
        values = {
            ("provider", "locals"): provider_block(ctx, window, self.first_prompt),
            ("model",): ctx.provider_model,
        }
        return [ConfigChange(global_config(self.app), values, f"makes locals {self.title}'s default model")]
