"""The tool-call loop guard: an agent calling the same tool with the same arguments again and again.

It reads the conversation a client sends (OpenAI-shaped messages; the Anthropic and
Responses handlers convert theirs first). A call repeated `steer_after` times in a row,
with no other call in between, gets a note that steers the model away; at `stop_after`
the request ends with finish reason "stop" and a `locals` detail of "tool_loop".
No MLX here: it works on JSON only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

STEER_AFTER = 3
STOP_AFTER = 5


@dataclass(frozen=True)
class ToolLoop:
    """The call being repeated and how many times in a row it was made."""

    name: str
    arguments: str  # canonical JSON
    count: int

    def steering_note(self) -> str:
        return (f"Note: you have called {self.name} with the same arguments {self.count} times in a "
                f"row ({self.arguments}) and got the same kind of result. Do not call it again with "
                "these arguments: use the result you have, try something different, or finish.")

    def stop_message(self) -> str:
        return (f"locals stopped a tool-call loop: {self.name}({self.arguments}) was requested "
                f"{self.count} times in a row with the same arguments.")


def _canonical(arguments) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _calls(message: dict) -> list[tuple[str, str]]:
    out = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        out.append((fn.get("name", ""), _canonical(fn.get("arguments", {}))))
    return out


def find_tool_loop(messages: list[dict]) -> ToolLoop | None:
    """The trailing run of identical tool calls in `messages`, if it is 2 or longer."""
    run: list[tuple[str, str]] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        calls = _calls(message)
        if not calls:
            run = []  # a plain answer breaks the run
            continue
        for call in calls:
            run = run + [call] if run and run[-1] == call else [call]
    if len(run) < 2:
        return None
    name, arguments = run[-1]
    return ToolLoop(name, arguments, len(run))


def check(messages: list[dict], steer_after: int = STEER_AFTER, stop_after: int = STOP_AFTER):
    """('ok' | 'steer' | 'stop', loop or None) for the conversation a client sent."""
    loop = find_tool_loop(messages)
    if loop is None or loop.count < steer_after:
        return "ok", loop
    return ("stop" if loop.count >= stop_after else "steer"), loop
