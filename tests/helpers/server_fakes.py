"""Test doubles for the server tests: a scripted engine and a character-level model.

The engine fake follows the Engine surface (stream/cancel/stats) and emits scripted text
as TokenEvents, then one FinishEvent; the model fake carries mlx-lm's hermes tool parser.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest

from mlx_lm.tool_parsers import json_tools

from locals.protocol import EngineStats, FinishEvent, TokenEvent, TokenLogprob, Usage


class CharTokenizer:
    """One token per character; carries the tool-call markers as mlx-lm's TokenizerWrapper does."""

    tool_call_start = json_tools.tool_call_start
    tool_call_end = json_tools.tool_call_end
    tool_parser = staticmethod(json_tools.parse_tool_call)
    has_tool_calling = True

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class FakeLoaded:
    name = "fake"
    model_id = "test/fake-model"
    context_length = 8192
    tool_format = "hermes"
    tokenizer = CharTokenizer()


def render(loaded, messages, tools=None, add_generation_prompt=True, continue_final=False, thinking=None):
    """A plain transcript, tools first, so tests can see what reached the prompt; `continue_final`
    leaves the last message open; a request's thinking switch shows as a first line."""
    head = f"tools: {json.dumps(tools)}\n" if tools else ""
    head = (f"thinking: {thinking}\n" if thinking is not None else "") + head
    text = head + "".join(f"{m['role']}: {m.get('content') or ''}"
                          f"{json.dumps(m['tool_calls']) if m.get('tool_calls') else ''}\n"
                          for m in messages)
    return text[:-1] if continue_final else text + "assistant:"


class Constraints:
    """Records build_constraint calls; returns a marker object."""

    def __init__(self):
        self.calls = []

    def __call__(self, loaded, *, tools=None, tool_choice="auto", json_schema=None, parallel_tool_calls=True,
                 max_tokens=None, strict_schema=False):
        self.calls.append({"tools": tools, "tool_choice": tool_choice, "json_schema": json_schema,
                           "strict_schema": strict_schema,
                           "parallel_tool_calls": parallel_tool_calls, "max_tokens": max_tokens})
        return object()


@dataclass
class CutReply:
    """A scripted reply the limit or a guard ended: the text from `closing_at` on is the ending
    the constraint forced (its events marked `closing`), and the request finishes with `reason`."""

    text: str
    closing_at: int
    reason: str = "length"


class ScriptedEngine:
    """Replies with the next scripted text (3 characters per event, `delay` s apart); a
    `CutReply` ends as the constraint's forced ending does."""

    def __init__(self, replies=None, delay=0.0, cached=0):
        self.replies = list(replies or [])
        self.delay = delay
        self.cached = cached
        self.requests = []
        self.cancelled = []
        self.finished = 0
        self.broken = None  # as Engine: why the engine thread ended, None while it runs

    def cancel(self, request_id):
        self.cancelled.append(request_id)

    def stats(self):
        return EngineStats(model="fake", requests_total=len(self.requests),
                           requests_finished=self.finished, decode_tokens_per_s=12.5,
                           generated_tokens_total=7, cached_tokens_total=self.cached)

    async def stream(self, request):
        self.requests.append(request)
        text = self.replies.pop(0) if self.replies else "Hello there."
        cut = text if isinstance(text, CutReply) else None
        text = cut.text if cut else text
        sampling = request.sampling
        matched = None
        for stop in sampling.stop:
            if stop in text:
                text, matched = text[: text.index(stop)], stop
        reason, produced = "stop", 0
        try:
            while produced < len(text):
                if produced >= sampling.max_tokens:
                    reason = "length"
                    break
                chunk = text[produced:produced + min(3, sampling.max_tokens - produced)]
                produced += len(chunk)
                if self.delay:
                    await asyncio.sleep(self.delay)
                logprobs = ([TokenLogprob(ord(c), -0.5, [(ord(c), -0.5), (ord("x"), -1.5)])
                             for c in chunk] if sampling.logprobs else None)
                closing = cut is not None and produced > cut.closing_at
                yield TokenEvent(request.id, [ord(c) for c in chunk], chunk, logprobs, closing=closing)
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled.append(request.id)
            raise
        self.finished += 1
        reason = cut.reason if cut else reason
        detail = {"stop_sequence": matched} if matched and reason == "stop" else {}
        yield FinishEvent(request.id, reason, Usage(len(request.prompt_tokens), produced, self.cached), None, detail)


def make_state(engine, *, constraints=None, **settings):
    """A ServerState serving the fake model through `engine`."""
    from locals.server.backend import Backend
    from locals.server.state import ServerState

    backend = Backend(FakeLoaded(), engine, render=render, constrain=constraints or Constraints(),
                      boundaries=lambda loaded, messages, tools, tokens, encode=None: [])
    return ServerState(model="fake", backend=backend, **settings)


async def start_client(state):
    """An aiohttp TestClient on 127.0.0.1 for the app of `state` (caller closes it)."""
    from aiohttp.test_utils import TestClient, TestServer

    from locals.server.app import create_app

    client = TestClient(TestServer(create_app(state), host="127.0.0.1"))
    await client.start_server()
    return client


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) pairs of an SSE body."""
    out = []
    for block in text.strip().split("\n\n"):
        event, data = None, []
        for line in block.splitlines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if event is not None or data:  # a block of comments only (": keep-alive") is no event
            out.append((event, "\n".join(data)))
    return out


# Fixtures shared by the API test modules (each imports them by name).
@pytest.fixture
def engine():
    return ScriptedEngine()


@pytest.fixture
def constraints():
    return Constraints()


@pytest.fixture
async def client(engine, constraints):
    client = await start_client(make_state(engine, constraints=constraints))
    yield client
    await client.close()


def events_of(text: str) -> list[dict]:
    """The JSON payloads of an SSE body whose event names repeat each payload's type."""
    out = []
    for name, data in sse_events(text):
        payload = json.loads(data)
        assert payload["type"] == name
        out.append(payload)
    return out
