"""Kilo Code CLI (`@kilocode/cli`): an OpenCode descendant, configured the same way.

It reads KILO_CONFIG_CONTENT at launch and ~/.config/kilo/kilo.json for `locals setup`;
Kilo is told a 64k window (capped by the model's).
"""

from __future__ import annotations

from integrations.base import register
from integrations.opencode import OpenCode


@register
class Kilo(OpenCode):
    name = "kilo"
    title = "Kilo Code CLI"
    executable = "kilo"
    # 7.8.1's Linux binary package is missing from the registry; 7.7.7 has it.
    install = "npm install -g @kilocode/cli"
    context_wanted = 65536
    first_prompt = 12508  # kilo 7.7.7, `run`
    config_env = "KILO_CONFIG_CONTENT"
    app = "kilo"

    def env(self, ctx):
        env = super().env(ctx)
        env.pop("OPENCODE_DISABLE_MODELS_FETCH", None)
        env["KILO_DISABLE_MODELS_FETCH"] = "1"
        return env
