"""Who sent a request, from what it really carries, for the dashboard's conversations view.

The client is the User-Agent's first product token (`claude-cli/1.0.83`, `OpenAI/Python`,
`locals-run/0.1`). The conversation is, in this order: a session header the client sends
(`X-Session-Id`, which `locals run` sets per agent; Claude Code's `X-Claude-Code-Session-Id`;
Codex's `session_id` / `conversation_id`), a body field naming one (`prompt_cache_key`,
Anthropic's `metadata.user_id`, OpenAI's `user`), else the conversation's prefix identity:
a hash of its messages up to the first user message, which every later turn repeats
unchanged, just as the prefix cache sees it. No header is trusted for anything but this.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from aiohttp import web

SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id", "session_id", "conversation_id")
_MAX_LEN = 80
_REMINDERS = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


@dataclass(frozen=True)
class Caller:
    """The client program and, when the request names one, its session."""

    client: str = "unknown"
    session: str | None = None


def _clip(value: str) -> str:
    return "".join(c for c in value.strip() if c.isprintable())[:_MAX_LEN]


def _body_session(body: dict) -> str | None:
    metadata = body.get("metadata")
    candidates = [body.get("prompt_cache_key"),
                  metadata.get("user_id") if isinstance(metadata, dict) else None, body.get("user")]
    return next((_clip(c) for c in candidates if isinstance(c, str) and c.strip()), None)


def caller_of(request: web.Request, body: dict) -> Caller:
    """The caller as its headers and body name it."""
    agent = request.headers.get("User-Agent", "").split(" ", 1)[0]
    session = next((_clip(request.headers[h]) for h in SESSION_HEADERS
                    if request.headers.get(h, "").strip()), None)
    return Caller(client=_clip(agent) or "unknown", session=session or _body_session(body))


def opening(messages: list[dict] | None, prompt: str | None) -> list[dict] | str:
    """What every turn of a conversation starts with: its messages up to the first user one
    (a raw prompt: its first 512 characters)."""
    if messages is None:
        return (prompt or "")[:512]
    head = []
    for message in messages:
        head.append({"role": message.get("role"), "content": message.get("content")})
        if message.get("role") == "user":
            break
    return head


def conversation_key(caller: Caller, messages: list[dict] | None, prompt: str | None) -> str:
    """The key a request's conversation is counted under."""
    if caller.session:
        return f"{caller.client}|session:{caller.session}"
    digest = hashlib.sha1(json.dumps(opening(messages, prompt), sort_keys=True, default=str).encode())
    return f"{caller.client}|prefix:{digest.hexdigest()[:10]}"


def title_of(messages: list[dict] | None, prompt: str | None) -> str:
    """A line a person recognises the conversation by: its first user message (or prompt)."""
    if messages is None:
        return _clip(prompt or "")
    first = next((m for m in messages if m.get("role") == "user"), None)
    content = first.get("content") if first else ""
    if isinstance(content, list):  # content parts: their text
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    # Claude Code opens the user's turn with notes of its own: the title is what the user wrote.
    words = _REMINDERS.sub(" ", str(content or "")).split() or str(content or "").split()
    return _clip(" ".join(words))
