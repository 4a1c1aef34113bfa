"""Aider (`aider-chat`): flags for an OpenAI-compatible model plus a model-metadata file.

The metadata file (ours, passed by path) tells aider the input budget (the window less the
reply's room), the reply's room and that the model costs nothing; `locals setup aider` writes the same flags into ~/.aider.conf.yml.
"""

from __future__ import annotations

import json
from pathlib import Path

from integrations.base import API_KEY, ConfigChange, LaunchContext, Tool, register


@register
class Aider(Tool):
    name = "aider"
    title = "Aider"
    executable = "aider"
    install = "python3 -m pip install aider-install && aider-install"
    context_wanted = 32768
    first_prompt = 649  # aider 0.86.2, `--message`

    def model_name(self, ctx: LaunchContext) -> str:
        return f"openai/{ctx.model}"  # litellm's prefix for any OpenAI-compatible server

    def metadata_file(self, ctx: LaunchContext) -> Path:
        window = ctx.context_window(self.context_wanted)
        reply = ctx.reply_tokens(window, self.first_prompt)
        entry = {
            "max_tokens": reply,
            "max_input_tokens": window - reply,
            "max_output_tokens": reply,
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
            "litellm_provider": "openai",
            "mode": "chat",
        }
        path = ctx.own_dir("aider") / "model-metadata.json"
        path.write_text(json.dumps({self.model_name(ctx): entry}, indent=2))
        return path

    def command(self, ctx: LaunchContext, args: list[str]) -> list[str]:
        argv = [
            self.executable,
            "--model", self.model_name(ctx),
            "--openai-api-base", ctx.v1,
            "--openai-api-key", API_KEY,
            "--model-metadata-file", str(self.metadata_file(ctx)),
            "--no-show-model-warnings",
            "--no-check-update",
            "--analytics-disable",
        ]
        if ctx.task:
            argv += ["--message", ctx.task, "--yes-always", "--no-pretty"]
        return [*argv, *args]

    def setup_values(self, ctx: LaunchContext) -> list[ConfigChange]:
        values = {
            ("model",): self.model_name(ctx),
            ("openai-api-base",): ctx.v1,
            ("openai-api-key",): API_KEY,
            ("model-metadata-file",): str(self.metadata_file(ctx)),
            ("show-model-warnings",): False,
        }
        return [ConfigChange(Path.home() / ".aider.conf.yml", values, "makes locals aider's model")]
