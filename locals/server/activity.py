"""What the server has done: counters per API and outcome, the last requests, totals per
conversation, and the TTFTs of the current sampling interval, for the dashboard, /metrics
and `locals status`. Touched only from the event loop thread.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field

from locals.server.conversations import Conversation, Conversations

# Finish reasons that mean a guard of locals' own ended the reply (engine and tool-loop guards).
GUARD_FINISHES = {"loop", "tool_loop", "memory"}
STEERED = "tool_loop_steered"  # the tool-loop guard added a note and let the request run


@dataclass
class RequestRecord:
    """One request as the dashboard lists it."""

    id: str
    api: str
    client: str = "unknown"
    conversation: str = ""
    started: float = field(default_factory=time.time)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    duration_s: float | None = None
    finish: str = "running"
    tool_calls: int = 0
    guards: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class Activity:
    """Counters since start, a ring of the most recent requests and the conversations' totals."""

    def __init__(self, keep: int = 50):
        self.started = time.time()
        self.recent: deque[RequestRecord] = deque(maxlen=keep)
        self.requests = Counter()  # (api, finish reason) -> count
        self.in_flight = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.conversations = Conversations()
        self._open: dict[str, Conversation] = {}  # request id -> its conversation, while running
        self._interval_ttfts: list[float] = []  # first tokens since the history sampler last looked

    def begin(self, request_id: str, api: str, prompt_tokens: int, *, client: str = "unknown",
              session: str | None = None, conversation: str = "", title: str = "") -> RequestRecord:
        record = RequestRecord(id=request_id, api=api, prompt_tokens=prompt_tokens, client=client,
                               conversation=conversation or f"{client}|request:{request_id}")
        self.recent.appendleft(record)
        self.in_flight += 1
        self._open[request_id] = self.conversations.begin(record.conversation, client, session, title)
        return record

    def first_token(self, record: RequestRecord) -> None:
        if record.ttft_s is None:
            record.ttft_s = time.time() - record.started
            self.ttft_sum += record.ttft_s
            self.ttft_count += 1
            self._interval_ttfts.append(record.ttft_s)

    def end(self, record: RequestRecord, finish: str, completion_tokens: int,
            cached_tokens: int) -> None:
        record.finish = finish
        record.completion_tokens = completion_tokens
        record.cached_tokens = cached_tokens
        record.duration_s = time.time() - record.started
        if finish in GUARD_FINISHES:
            record.guards.append(finish)
        self.in_flight -= 1
        self.requests[(record.api, finish)] += 1
        conv = self._open.pop(record.id, None)
        if conv is not None:
            Conversations.end(conv, prompt_tokens=record.prompt_tokens, cached_tokens=cached_tokens,
                              completion_tokens=completion_tokens, tool_calls=record.tool_calls,
                              finish=finish, guards=record.guards)

    def take_interval_ttfts(self) -> list[float]:
        """The TTFTs measured since the last call (the history sampler's, once a second)."""
        ttfts, self._interval_ttfts = self._interval_ttfts, []
        return ttfts

    @property
    def total(self) -> int:
        return sum(self.requests.values()) + self.in_flight

    @property
    def uptime_s(self) -> float:
        return time.time() - self.started
