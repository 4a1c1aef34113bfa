"""Codex CLI (`@openai/codex`): a `locals` model provider on the Responses API.

A launch passes the provider as `-c` overrides (nothing written to ~/.codex), with the
model's window and the prompt size past which Codex compacts its history (the window less
the reply's room); `locals setup codex` writes the same into ~/.codex/config.toml.
"""

from __future__ import annotations

import json
from pathlib import Path

from locals import settings
from integrations.base import API_KEY, ConfigChange, LaunchContext, Tool, register

KEY_ENV = "LOCALS_API_KEY"


@register
class Codex(Tool):
    name = "codex"
    title = "Codex CLI"
    executable = "codex"
    install = "npm install -g @openai/codex"
    api = "OpenAI Responses"
    context_wanted = 32768
    first_prompt = 6436  # codex-cli 0.171.0, `exec`

    def provider(self, ctx: LaunchContext) -> dict[str, str]:
        return {"name": "locals", "base_url": ctx.v1, "wire_api": "responses", "env_key": KEY_ENV}

    def env(self, ctx: LaunchContext) -> dict[str, str | None]:
        return {KEY_ENV: API_KEY}

    def overrides(self, ctx: LaunchContext) -> list[str]:
        """`-c key=value` pairs; values are TOML, and a JSON string is a valid TOML string."""
        pairs = {"model_provider": "locals", "model": ctx.model, **self.window_keys(ctx)}
        pairs.update({f"model_providers.locals.{k}": v for k, v in self.provider(ctx).items()})
        argv: list[str] = []
        for key, value in pairs.items():
            argv += ["-c", f"{key}={json.dumps(value)}"]
        return argv

    def window_keys(self, ctx: LaunchContext) -> dict[str, int]:
        """The window, and the prompt size past which Codex compacts its history (room for a reply)."""
        window = ctx.context_window(self.context_wanted)
        return {"model_context_window": window, "model_auto_compact_token_limit": window - ctx.reply_tokens(window, self.first_prompt)}

    def command(self, ctx: LaunchContext, args: list[str]) -> list[str]:
        if ctx.task:
            return [self.executable, "exec", "--skip-git-repo-check", "-C", str(ctx.workdir),
                    *self.overrides(ctx), *args, ctx.task]
        return [self.executable, "-C", str(ctx.workdir), *self.overrides(ctx), *args]

    def setup_values(self, ctx: LaunchContext) -> list[ConfigChange]:
        home = Path(settings.foreign("CODEX_HOME") or Path.home() / ".codex")
        provider = {k: v for k, v in self.provider(ctx).items() if k != "env_key"}
        values = {
            ("model_provider",): "locals",
            ("model",): ctx.model,
            **{(key,): value for key, value in self.window_keys(ctx).items()},
            ("model_providers", "locals"): provider,
        }
        return [ConfigChange(home / "config.toml", values, "makes locals Codex's model provider")]
