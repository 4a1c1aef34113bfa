"""Totals per conversation (a client and its session or prefix identity, see callers.py):
requests, tokens, prompt tokens served from the prefix cache, tool calls and guard events.

A bounded book, least recently seen out, touched only from the event loop thread (Activity
calls it as requests begin and end).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

KEEP = 64  # conversations remembered; an agent team of 16 over a few runs fits


@dataclass
class Conversation:
    key: str
    client: str
    session: str | None
    title: str
    first_seen: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    requests: int = 0
    in_flight: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    guards: Counter = field(default_factory=Counter)  # guard event -> count
    last_finish: str = "running"

    def as_dict(self) -> dict:
        hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None
        return {"key": self.key, "client": self.client, "session": self.session, "title": self.title,
                "first_seen": self.first_seen, "last_seen": self.last_seen, "requests": self.requests,
                "in_flight": self.in_flight, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "cache_hit": hit,
                "completion_tokens": self.completion_tokens, "tool_calls": self.tool_calls,
                "guards": dict(self.guards), "last_finish": self.last_finish}


class Conversations:
    """The last KEEP conversations by when they were last seen."""

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._book: OrderedDict[str, Conversation] = OrderedDict()

    def begin(self, key: str, client: str, session: str | None, title: str) -> Conversation:
        conv = self._book.pop(key, None) or Conversation(key, client, session, title)
        self._book[key] = conv
        while len(self._book) > self.keep:
            self._book.popitem(last=False)
        conv.last_seen = time.time()
        conv.requests += 1
        conv.in_flight += 1
        return conv

    @staticmethod
    def end(conv: Conversation, *, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
            tool_calls: int, finish: str, guards: list[str]) -> None:
        conv.in_flight -= 1
        conv.last_seen = time.time()
        conv.prompt_tokens += prompt_tokens
        conv.cached_tokens += cached_tokens
        conv.completion_tokens += completion_tokens
        conv.tool_calls += tool_calls
        conv.last_finish = finish
        conv.guards.update(guards)

    def rows(self) -> list[dict]:
        """Newest first."""
        return [c.as_dict() for c in reversed(self._book.values())]
