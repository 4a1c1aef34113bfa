"""Claude Code (`@anthropic-ai/claude-code`) through locals' Anthropic Messages API.

Everything is injected as environment (base URL, bearer token, every model slot, the
reply's room and when to compact the session), and again as `--settings` so that a user's
settings file cannot point the launch elsewhere; the one thing Claude Code only reads from its own file is `hasCompletedOnboarding` in
~/.claude.json: without it the first run stops at a login screen, so a launch sets it
(backed up and undone by `locals disconnect claude`).
"""

from __future__ import annotations

import json
from pathlib import Path

from locals import settings
from integrations.base import API_KEY, ConfigChange, LaunchContext, Tool, register

MODEL_SLOTS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)


def global_state_file() -> Path:
    """Claude Code's own state file (it moves with CLAUDE_CONFIG_DIR)."""
    folder = settings.foreign("CLAUDE_CONFIG_DIR")
    return Path(folder) / ".claude.json" if folder else Path.home() / ".claude.json"


# Claude Code takes no auto-compact window under 100k tokens, and arms its compaction for a
# model it does not know only when that window is set; the threshold is then a percentage of
# (window - reply), which is how a smaller real window is expressed.
COMPACT_WINDOW_FLOOR = 100_000


def compaction_env(window: int, reply: int) -> dict[str, str]:
    """Claude Code's auto-compaction set to fire once a session's prompt passes window - reply."""
    share = 100 * (window - reply) / (COMPACT_WINDOW_FLOOR - reply)
    return {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(COMPACT_WINDOW_FLOOR),
            "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": f"{share:.2f}"}


@register
class Claude(Tool):
    name = "claude"
    title = "Claude Code"
    executable = "claude"
    install = "npm install -g @anthropic-ai/claude-code"
    api = "Anthropic Messages"
    context_wanted = 32768
    # Claude Code 2.1.332, `-p`, as served on a 16,384 window: it sends 10 of its 21 tools there,
    # with ToolSearch for the rest; ~20,250 tokens where it sends all 21, ~11,000 once the server
    # cuts their descriptions to the first paragraph (server/overflow.py).
    first_prompt = 12333

    def env(self, ctx: LaunchContext) -> dict[str, str | None]:
        window = ctx.context_window(self.context_wanted)
        reply = ctx.reply_tokens(window, self.first_prompt)
        env: dict[str, str | None] = {
            "ANTHROPIC_BASE_URL": ctx.base_url,
            # A bearer token needs no interactive "use this API key?" approval; an
            # inherited ANTHROPIC_API_KEY would take precedence, so it is dropped.
            "ANTHROPIC_AUTH_TOKEN": API_KEY,
            "ANTHROPIC_API_KEY": None,
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(window),  # what its notice on unknown models asks for
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(reply),
            **compaction_env(window, reply),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
        env.update({slot: ctx.model for slot in MODEL_SLOTS})
        return env

    def command(self, ctx: LaunchContext, args: list[str]) -> list[str]:
        # The same values as settings on the command line too: an `env` in ~/.claude/settings.json
        # (an earlier `locals setup claude` for another port, a user's own ANTHROPIC_BASE_URL)
        # outranks the process's environment, while command-line settings outrank it.
        ours = json.dumps({"env": {key: value for key, value in self.env(ctx).items() if value is not None}})
        head = [self.executable, "--settings", ours]
        if ctx.task:  # the prompt first: a variadic flag among `args` would swallow it
            return [*head, "-p", ctx.task, *args]
        return [*head, *args]

    def configure(self, ctx: LaunchContext) -> list[ConfigChange]:
        path = global_state_file()
        try:
            done = json.loads(path.read_text()).get("hasCompletedOnboarding") is True
        except (OSError, ValueError, AttributeError):
            done = False
        if done:
            return []
        return [ConfigChange(path, {("hasCompletedOnboarding",): True}, "skips the first-run login screen")]

    def setup_values(self, ctx: LaunchContext) -> list[ConfigChange]:
        settings_file = Path(settings.foreign("CLAUDE_CONFIG_DIR") or Path.home() / ".claude") / "settings.json"
        values = {("env", key): value for key, value in self.env(ctx).items() if value is not None}
        return [ConfigChange(settings_file, values, "points plain `claude` at locals")]
