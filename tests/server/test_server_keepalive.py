"""A streamed reply answers its headers once the request is accepted, and while no output
comes (a long prompt still being read) each API sends its keep-alive, so that clients' idle
timeouts (Codex: 300 s) do not give up and resend the request from scratch."""

from __future__ import annotations

import asyncio
import json

import pytest


from locals.protocol import FinishEvent, TokenEvent, Usage
from locals.server import backend as backend_module

from tests.helpers.server_fakes import ScriptedEngine, make_state, sse_events, start_client
from tests.helpers.server_fakes import client, constraints  # noqa: F401 (shared fixtures, on the engine below)

MESSAGES = [{"role": "user", "content": "hi"}]
SILENCE_S = 0.4  # the fake prompt read; the heartbeat is set far shorter


class SlowPromptEngine(ScriptedEngine):
    """Says nothing until `release` is set (or SILENCE_S passed), then replies "Hello"."""

    def __init__(self):
        super().__init__()
        self.release = asyncio.Event()
        self.waiting = asyncio.Event()

    async def stream(self, request):
        self.requests.append(request)
        self.waiting.set()
        try:
            try:
                await asyncio.wait_for(self.release.wait(), SILENCE_S)
            except asyncio.TimeoutError:
                pass
            yield TokenEvent(request.id, [ord(c) for c in "Hello"], "Hello")
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled.append(request.id)
            raise
        yield FinishEvent(request.id, "stop", Usage(len(request.prompt_tokens), 5))


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setattr(backend_module, "HEARTBEAT_S", 0.05)
    return SlowPromptEngine()


async def test_openai_stream_sends_comments_while_silent(client):
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True})
    body = await resp.text()
    assert resp.status == 200
    first_content = body.index('"content": "Hello"')
    assert 0 <= body.index(": keep-alive\n\n") < first_content
    chunks = [json.loads(d) for _, d in sse_events(body) if d != "[DONE]"]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Hello"


async def test_completions_stream_sends_comments_while_silent(client):
    resp = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "stream": True})
    body = await resp.text()
    assert body.index(": keep-alive\n\n") < body.index('"text": "Hello"')


async def test_responses_stream_repeats_in_progress(client):
    resp = await client.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True})
    events = [json.loads(d) for _, d in sse_events(await resp.text())]
    kinds = [e["type"] for e in events]
    first_delta = kinds.index("response.output_text.delta")
    # An event, not a comment: Codex's idle timer counts parsed events only.
    assert kinds[:first_delta].count("response.in_progress") >= 2
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert kinds[-1] == "response.completed"


async def test_anthropic_stream_sends_pings(client):
    resp = await client.post("/v1/messages", json={"model": "m", "max_tokens": 20, "messages": MESSAGES,
                                                   "stream": True})
    names = [name for name, _ in sse_events(await resp.text())]
    first_block = names.index("content_block_start")
    assert names[:first_block].count("ping") >= 2
    assert names[-1] == "message_stop"


async def test_ollama_stream_sends_empty_pieces(client):
    resp = await client.post("/api/chat", json={"model": "m", "messages": MESSAGES})
    lines = [json.loads(line) for line in (await resp.text()).splitlines() if line.strip()]
    contents = [line["message"]["content"] for line in lines if not line["done"]]
    assert contents[0] == "" and "Hello" in contents
    assert "".join(contents) == "Hello" and lines[-1]["done"] is True


async def test_headers_come_before_the_first_token(client, engine):
    """The 200 does not wait for the prompt read: a client's connect timeout is not its reply's."""
    engine_silence = asyncio.create_task(asyncio.sleep(SILENCE_S))
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True})
    assert resp.status == 200 and not engine_silence.done()
    engine.release.set()
    assert "Hello" in await resp.text()
    await engine_silence


async def test_a_client_gone_while_silent_cancels_the_request(client, engine):
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True})
    await engine.waiting.wait()
    resp.close()
    for _ in range(100):
        if engine.cancelled:
            break
        await asyncio.sleep(0.02)
    assert engine.cancelled == [engine.requests[0].id]


async def test_bad_input_is_still_a_4xx(client, engine):
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True,
                                                           "temperature": -1})
    assert resp.status == 400 and not engine.requests


async def test_the_openai_sdk_reads_a_stream_with_keep_alives(client):
    openai = pytest.importorskip("openai")
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="x")
    stream = await sdk.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert text == "Hello"
    await sdk.close()


async def test_the_anthropic_sdk_reads_a_stream_with_pings(client):
    anthropic = pytest.importorskip("anthropic")
    sdk = anthropic.AsyncAnthropic(base_url=str(client.make_url("")), api_key="x")
    async with sdk.messages.stream(model="m", max_tokens=20, messages=MESSAGES) as stream:
        text = "".join([piece async for piece in stream.text_stream])
    assert text == "Hello"
    await sdk.close()


async def test_the_servers_max_tokens_caps_every_reply():
    """`serve --max-tokens`: a request asking for more (or naming no limit) gets the cap."""
    engine = ScriptedEngine(replies=["a long reply", "another long reply"])
    state = make_state(engine)
    state.backend.max_tokens = 4
    client = await start_client(state)
    try:
        asked = await client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES,
                                                                "max_tokens": 100})
        unnamed = await client.post("/v1/responses", json={"model": "m", "input": "hi"})
        assert (await asked.json())["choices"][0]["finish_reason"] == "length"
        assert (await unnamed.json())["incomplete_details"] == {"reason": "max_output_tokens"}
    finally:
        await client.close()
    assert [r.sampling.max_tokens for r in engine.requests] == [4, 4]


async def test_the_servers_max_tokens_is_what_a_request_naming_none_gets():
    """`serve --max-tokens` above the 4,096 default raises it for clients that send no limit
    (Codex), in every API; a request's own smaller limit stands."""
    engine = ScriptedEngine()
    state = make_state(engine)
    state.backend.max_tokens = 6000
    client = await start_client(state)
    try:
        for path, body in [("/v1/responses", {"input": "hi"}), ("/v1/chat/completions", {"messages": MESSAGES}),
                           ("/v1/messages", {"messages": MESSAGES}), ("/api/chat", {"messages": MESSAGES}),
                           ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 50})]:
            resp = await client.post(path, json={"model": "m", "stream": False, **body})
            assert resp.status == 200, await resp.text()
    finally:
        await client.close()
    assert [r.sampling.max_tokens for r in engine.requests] == [6000, 6000, 6000, 6000, 50]
