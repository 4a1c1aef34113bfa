"""The tool-call loop guard: an agent calling the same tool with the same arguments again and
again, and getting the same result each time.

It reads the conversation a client sends (OpenAI-shaped messages; the Anthropic and
Responses handlers convert theirs first). A call repeated `steer_after` times in a row, with
no other call in between and the same result each time, gets a note that steers the model
away; at `stop_after` the request ends with finish reason "stop" and a `locals` detail of
"tool_loop". A call whose result changes (polling a build's output, a test run after edits
elsewhere) is progress, not a loop. No MLX here: it works on JSON only.
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


def _text(content) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True, ensure_ascii=False)


def _calls(messages: list[dict]) -> list[list]:
    """Every call in order as [name, canonical arguments, result text or None], a "plain
    answer" marker (None) where an assistant message made no call."""
    out: list = []
    pending: list[tuple[str, list]] = []  # the last assistant message's calls still without a result
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            calls = message.get("tool_calls") or []
            pending = []
            if not calls:
                out.append(None)  # a plain answer breaks a run
            for call in calls:
                fn = call.get("function", call)
                entry = [fn.get("name", ""), _canonical(fn.get("arguments", {})), None]
                out.append(entry)
                pending.append((call.get("id") or "", entry))
        elif role == "tool" and pending:
            call_id = message.get("tool_call_id") or ""
            at = next((i for i, (pid, _) in enumerate(pending) if call_id and pid == call_id), 0)
            pending.pop(at)[1][2] = _text(message.get("content"))
    return out


def find_tool_loop(messages: list[dict]) -> ToolLoop | None:
    """The trailing run of identical tool calls with identical results in `messages`, if it is
    2 or longer."""
    run: list[tuple] = []
    for call in _calls(messages):
        key = tuple(call) if call is not None else None
        run = run + [key] if key is not None and run and run[-1] == key else ([key] if key else [])
    if len(run) < 2:
        return None
    name, arguments, _ = run[-1]
    return ToolLoop(name, arguments, len(run))


def check(messages: list[dict], steer_after: int = STEER_AFTER, stop_after: int = STOP_AFTER):
    """('ok' | 'steer' | 'stop', loop or None) for the conversation a client sent."""
    loop = find_tool_loop(messages)
    if loop is None or loop.count < steer_after:
        return "ok", loop
    return ("stop" if loop.count >= stop_after else "steer"), loop
