"""Cline CLI (`cline`): an `openai-compatible` provider pointing at locals.

A launch keeps Cline's settings in a config folder of our own (Cline's `--config`): the
providers file `cline auth` would write there, plus the model's input budget (`contextWindow`,
which Cline takes as the most input it may send, compacting at 90% of it) and the reply's
room (`maxTokens`), so ~/.cline is untouched; `locals setup cline` writes the same provider
into ~/.cline/data/settings/providers.json instead.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from locals import settings
from integrations.base import API_KEY, ConfigChange, LaunchContext, Tool, register

PROVIDER = "openai-compatible"


@register
class Cline(Tool):
    name = "cline"
    title = "Cline CLI"
    executable = "cline"
    install = "npm install -g cline"
    context_wanted = 32768
    first_prompt = 5432  # cline 3.0.65, a task with `--json`

    def config_dir(self, ctx: LaunchContext) -> Path:
        return ctx.own_dir("cline")

    def provider_settings(self, ctx: LaunchContext) -> dict[str, Any]:
        window = ctx.context_window(self.context_wanted)
        reply = ctx.reply_tokens(window, self.first_prompt)
        return {"provider": PROVIDER, "apiKey": API_KEY, "model": ctx.model, "baseUrl": ctx.v1,
                "contextWindow": window - reply, "maxTokens": reply}

    def providers_file(self, ctx: LaunchContext) -> Path:
        """Our config folder's providers file, written afresh for this launch."""
        path = self.config_dir(ctx) / "data" / "settings" / "providers.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"version": 1, "lastUsedProvider": PROVIDER,
                                    "providers": {PROVIDER: self.provider_entry(ctx)}}, indent=2))
        return path

    def provider_entry(self, ctx: LaunchContext) -> dict[str, Any]:
        """The provider as `cline auth` writes it. Cline 3.0.65 ignores an entry without
        `updatedAt` and falls back to its own hosted provider."""
        stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return {"settings": self.provider_settings(ctx), "updatedAt": stamp, "tokenSource": "manual"}

    def command(self, ctx: LaunchContext, args: list[str]) -> list[str]:
        self.providers_file(ctx)
        options = ["--config", str(self.config_dir(ctx)), "-c", str(ctx.workdir)]
        if ctx.task:
            return [self.executable, ctx.task, *options, "--json", *args]
        return [self.executable, *options, *args]

    def setup_values(self, ctx: LaunchContext) -> list[ConfigChange]:
        home = Path(settings.foreign("CLINE_DIR") or Path.home() / ".cline")
        values = {
            ("version",): 1,
            ("lastUsedProvider",): PROVIDER,
            ("providers", PROVIDER): self.provider_entry(ctx),
        }
        return [ConfigChange(home / "data" / "settings" / "providers.json", values,
                             "makes locals Cline's provider")]
