"""Cline CLI (`cline`): an `openai-compatible` provider pointing at locals.

A launch keeps Cline's settings in a config folder of our own (Cline's `--config`),
filled by Cline's own `cline auth`, so ~/.cline is untouched; `locals setup cline`
writes the same provider into ~/.cline/data/settings/providers.json instead.
"""

from __future__ import annotations

from pathlib import Path

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

    def config_dir(self, ctx: LaunchContext) -> Path:
        return ctx.own_dir("cline")

    def prepare(self, ctx: LaunchContext) -> list[list[str]]:
        return [[
            self.executable, "auth", "-p", PROVIDER, "-k", API_KEY, "-b", ctx.v1,
            "-m", ctx.model, "--config", str(self.config_dir(ctx)),
        ]]

    def command(self, ctx: LaunchContext, args: list[str]) -> list[str]:
        options = ["--config", str(self.config_dir(ctx)), "-c", str(ctx.workdir)]
        if ctx.task:
            return [self.executable, ctx.task, *options, "--json", *args]
        return [self.executable, *options, *args]

    def setup_values(self, ctx: LaunchContext) -> list[ConfigChange]:
        home = Path(settings.foreign("CLINE_DIR") or Path.home() / ".cline")
        provider = {"provider": PROVIDER, "apiKey": API_KEY, "model": ctx.model, "baseUrl": ctx.v1}
        values = {
            ("version",): 1,
            ("lastUsedProvider",): PROVIDER,
            ("providers", PROVIDER): {"settings": provider, "tokenSource": "manual"},
        }
        return [ConfigChange(home / "data" / "settings" / "providers.json", values,
                             "makes locals Cline's provider")]
