"""What the server has done: counters per API and outcome, and the last requests, for the
dashboard, /metrics and `locals status`. Touched only from the event loop thread.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field


@dataclass
class RequestRecord:
    """One request as the dashboard lists it."""

    id: str
    api: str
    started: float = field(default_factory=time.time)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    duration_s: float | None = None
    finish: str = "running"
    tool_calls: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class Activity:
    """Counters since start plus a ring of the most recent requests."""

    def __init__(self, keep: int = 50):
        self.started = time.time()
        self.recent: deque[RequestRecord] = deque(maxlen=keep)
        self.requests = Counter()  # (api, finish reason) -> count
        self.in_flight = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0

    def begin(self, request_id: str, api: str, prompt_tokens: int) -> RequestRecord:
        record = RequestRecord(id=request_id, api=api, prompt_tokens=prompt_tokens)
        self.recent.appendleft(record)
        self.in_flight += 1
        return record

    def first_token(self, record: RequestRecord) -> None:
        if record.ttft_s is None:
            record.ttft_s = time.time() - record.started
            self.ttft_sum += record.ttft_s
            self.ttft_count += 1

    def end(self, record: RequestRecord, finish: str, completion_tokens: int,
            cached_tokens: int) -> None:
        record.finish = finish
        record.completion_tokens = completion_tokens
        record.cached_tokens = cached_tokens
        record.duration_s = time.time() - record.started
        self.in_flight -= 1
        self.requests[(record.api, finish)] += 1

    @property
    def total(self) -> int:
        return sum(self.requests.values()) + self.in_flight

    @property
    def uptime_s(self) -> float:
        return time.time() - self.started
