"""Sends Hypothesis-made batches of hostile bodies to a server and keeps the count.

Shared by the fast fuzz test (the app in-process on a scripted engine) and the slow one (a
real daemon on the embedded model). A batch's bodies go out at once, so the engine batches
the valid ones together; after each batch the server must still be healthy and answer a
normal request.
"""

from __future__ import annotations

import asyncio
import collections
import json
from dataclasses import dataclass, field

import aiohttp

from tests.chaos.chaos_bodies import Endpoint
from tests.chaos.chaos_checks import Answer, post, problem_of


NORMAL_CHAT = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}],
               "max_tokens": 3, "temperature": 0}


@dataclass
class FuzzTally:
    """What a fuzz run sent and got."""

    sent: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    problems: list[str] = field(default_factory=list)

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    def summary(self) -> str:
        return (f"{self.sent} bodies, answers {dict(sorted(self.statuses.items()))}, "
                f"{self.server_errors} 5xx, {len(self.problems)} problems")


class FuzzDriver:
    """Runs batches against `url` on one event loop of its own (Hypothesis tests are synchronous)."""

    def __init__(self, url: str):
        self.url = url
        self.tally = FuzzTally()
        self._loop = asyncio.new_event_loop()

    def close(self) -> None:
        self._loop.close()

    def batch(self, cases: list[tuple[Endpoint, bytes]]) -> list[str]:
        """Send `cases` at once, then check the server still serves; the problems found."""
        return self._loop.run_until_complete(self._batch(cases))

    async def _batch(self, cases: list[tuple[Endpoint, bytes]]) -> list[str]:
        async with aiohttp.ClientSession() as session:
            answers = await asyncio.gather(*(post(session, self.url + endpoint.path, body)
                                             for endpoint, body in cases))
            problems = [p for (endpoint, body), answer in zip(cases, answers)
                        if (p := self._count(endpoint, body, answer))]
            problems += await self._still_serving(session)
        self.tally.problems += problems
        return problems

    def _count(self, endpoint: Endpoint, body: bytes, answer: Answer) -> str | None:
        self.tally.sent += 1
        self.tally.statuses[answer.status] += 1
        return problem_of(endpoint, answer, body)

    async def _still_serving(self, session: aiohttp.ClientSession) -> list[str]:
        async with session.get(self.url + "/health") as resp:
            if resp.status != 200:
                return [f"after the batch /health answered {resp.status}: {await resp.text()}"]
        body = json.dumps(NORMAL_CHAT).encode()
        answer = await post(session, self.url + "/v1/chat/completions", body)
        if answer.status != 200:
            return [f"after the batch a normal chat got {answer.status}: {answer.body[:300]!r}"]
        return []
