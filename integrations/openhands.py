"""OpenHands CLI (`openhands`, Python 3.12): LLM_* environment with --override-with-envs.

The CLI reads LLM_MODEL / LLM_BASE_URL / LLM_API_KEY only when asked to, so a launch
passes the flag; nothing of the user's ~/.openhands is written.
"""

from __future__ import annotations

from integrations.base import API_KEY, LaunchContext, Tool, register


@register
class OpenHands(Tool):
    name = "openhands"
    title = "OpenHands CLI"
    executable = "openhands"
    install = "uv tool install --python 3.12 openhands"
    context_wanted = 32768
    first_prompt = 8504  # OpenHands CLI 1.16.0, `--headless -t`

    def env(self, ctx: LaunchContext) -> dict[str, str | None]:
        return {
            "LLM_MODEL": f"openai/{ctx.model}",  # litellm's prefix for an OpenAI-compatible server
            "LLM_BASE_URL": ctx.v1,
            "LLM_API_KEY": API_KEY,
            "OPENHANDS_SUPPRESS_BANNER": "1",
        }

    def command(self, ctx: LaunchContext, args: list[str]) -> list[str]:
        argv = [self.executable, "--override-with-envs"]
        if ctx.task:
            argv += ["--headless", "--always-approve", "-t", ctx.task]
        return [*argv, *args]
