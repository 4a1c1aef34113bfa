"""A reply the engine cuts off because the server stops is an error on every API, never a
plain finish a client would take for the whole answer."""

from __future__ import annotations

import json

import pytest


from locals.protocol import FinishEvent, TokenEvent, Usage
from locals.server.backend import STOPPED_MESSAGE

from tests.helpers.server_fakes import ScriptedEngine, make_state, sse_events, start_client


class StoppingEngine(ScriptedEngine):
    """Writes half a reply, then finishes it "cancelled" as `Engine.stop()` does."""

    async def stream(self, request):
        self.requests.append(request)
        yield TokenEvent(request.id, [ord(c) for c in "The ans"], "The ans")
        yield FinishEvent(request.id, "cancelled", Usage(len(request.prompt_tokens), 7), "engine stopped")


@pytest.fixture
async def client():
    client = await start_client(make_state(StoppingEngine()))
    yield client
    await client.close()


MESSAGES = [{"role": "user", "content": "hi"}]


async def test_openai_stream_ends_in_an_error_not_a_finish(client):
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True})
    chunks = [json.loads(data) for _, data in sse_events(await resp.text()) if data != "[DONE]"]
    assert chunks[-1]["error"]["message"] == STOPPED_MESSAGE
    assert not any(c.get("choices") and c["choices"][0].get("finish_reason") for c in chunks)


async def test_openai_reply_is_a_server_error(client):
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert resp.status == 503 and STOPPED_MESSAGE in (await resp.json())["error"]["message"]


async def test_anthropic_stream_ends_in_an_error(client):
    resp = await client.post("/v1/messages", json={"model": "m", "max_tokens": 20, "messages": MESSAGES,
                                                   "stream": True})
    events = sse_events(await resp.text())
    assert events[-1][0] == "error" and STOPPED_MESSAGE in events[-1][1]
    assert "message_stop" not in [name for name, _ in events]


async def test_ollama_stream_ends_in_an_error(client):
    resp = await client.post("/api/chat", json={"model": "m", "messages": MESSAGES})
    lines = [json.loads(line) for line in (await resp.text()).splitlines() if line.strip()]
    assert lines[-1] == {"error": STOPPED_MESSAGE}
    assert not any(line.get("done") for line in lines)
