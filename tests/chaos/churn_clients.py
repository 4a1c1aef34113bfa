"""Clients that come and go: each loops over connect, stream, and one way of leaving.

Ways of leaving, picked at random each turn: read the whole stream ("complete"), hang up
after a random number of events ("hangup"), read slowly to the end ("slow"), or send the
request and give up before any answer, while it is still queued ("abandon"). Requests
rotate over the OpenAI, Anthropic and Ollama streaming APIs and a few system prompts (so
the prefix cache settles early and memory drift means a leak). Each connection is its own
(no pooling): a hang-up closes a socket, as a killed agent does.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

# Few prompts: every one is cached within the first minute, so later memory growth is a leak.
SYSTEM_PROMPTS = [f"You are agent {i}. Answer in one short sentence. " + "Be careful and precise. " * (4 * i)
                  for i in range(1, 4)]
QUESTIONS = ["What is a list?", "Name a color.", "Count to five."]
BEHAVIOURS = ("complete", "hangup", "slow", "abandon")
WEIGHTS = (3, 4, 2, 1)


@dataclass
class ChurnTally:
    started: int = 0
    in_flight: int = 0
    served: int = 0  # read to their last event
    hangups: int = 0
    abandoned: int = 0
    failures: list[str] = field(default_factory=list)  # answers that were not a 200 stream
    ttfts: list[float] = field(default_factory=list)

    def p(self, q: float) -> float | None:
        if not self.ttfts:
            return None
        ordered = sorted(self.ttfts)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _request(api: str, rng: random.Random) -> tuple[str, dict]:
    system, question = rng.choice(SYSTEM_PROMPTS), rng.choice(QUESTIONS)
    max_tokens = rng.randint(8, 40)
    if api == "anthropic":
        return "/v1/messages", {"model": "m", "system": system, "max_tokens": max_tokens,
                                "stream": True, "messages": [{"role": "user", "content": question}]}
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    if api == "ollama":
        return "/api/chat", {"model": "m", "messages": messages, "stream": True,
                             "options": {"num_predict": max_tokens}}
    return "/v1/chat/completions", {"model": "m", "messages": messages, "stream": True,
                                    "max_tokens": max_tokens}


def _text_of(api: str, line: bytes) -> str:
    """The reply text one stream line carries ("" for events with none)."""
    line = line.strip()
    if api != "ollama":
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            return ""
        line = line[6:]
    if not line:
        return ""
    event = json.loads(line)
    if api == "ollama":
        return (event.get("message") or {}).get("content", "")
    if api == "anthropic":
        return (event.get("delta") or {}).get("text", "") if event.get("type") == "content_block_delta" else ""
    choices = event.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or ""


async def _stream(session: aiohttp.ClientSession, url: str, api: str, behaviour: str,
                  rng: random.Random, tally: ChurnTally) -> None:
    path, body = _request(api, rng)
    sent, first, lines = time.monotonic(), None, 0
    leave_after = rng.randint(0, 12)
    async with session.post(url + path, json=body) as resp:
        if resp.status != 200:
            tally.failures.append(f"{path}: {resp.status} {(await resp.text())[:200]}")
            return
        async for line in resp.content:
            if first is None and _text_of(api, line):
                first = time.monotonic()
                tally.ttfts.append(first - sent)
            lines += 1
            if behaviour == "hangup" and lines > leave_after:
                resp.close()  # drops the connection mid-stream
                tally.hangups += 1
                return
            if behaviour == "slow":
                await asyncio.sleep(rng.uniform(0.1, 0.6))
    if behaviour == "hangup":
        tally.hangups += 1  # the reply ended before the client's moment to leave came
    else:
        tally.served += 1


async def _abandon(session: aiohttp.ClientSession, url: str, api: str, rng: random.Random,
                   tally: ChurnTally) -> None:
    path, body = _request(api, rng)
    task = asyncio.ensure_future(session.post(url + path, json=body))
    await asyncio.sleep(rng.uniform(0.0, 0.3))
    task.cancel()
    try:
        resp = await task
        resp.close()  # the answer came first: hang up on it
    except asyncio.CancelledError:
        pass
    tally.abandoned += 1


async def client(url: str, seed: int, deadline: Callable[[], float], tally: ChurnTally,
                 gate: asyncio.Event) -> None:
    """One client looping until `deadline()` (time.monotonic; it moves while the gate is shut),
    starting a request only while `gate` is set."""
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        while True:
            await gate.wait()
            if time.monotonic() >= deadline():
                return
            behaviour = rng.choices(BEHAVIOURS, WEIGHTS)[0]
            api = rng.choice(("openai", "anthropic", "ollama"))
            tally.started += 1
            tally.in_flight += 1
            try:
                if behaviour == "abandon":
                    await _abandon(session, url, api, rng, tally)
                else:
                    await _stream(session, url, api, behaviour, rng, tally)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                tally.failures.append(f"{behaviour} {api}: {type(exc).__name__}: {exc}")
            finally:
                tally.in_flight -= 1
