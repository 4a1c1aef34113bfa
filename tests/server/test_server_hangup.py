"""A client that hangs up the moment it reads a reply's last event (Codex does on an incomplete
response) was answered: the reply ends without waiting on the event loop again, so the request
finishes as it did, is not cancelled, and the access log records its 200. One that hangs up
mid-reply is cancelled, and the server's log says so (the access log has no line for it)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from contextlib import asynccontextmanager

import pytest
from aiohttp import web


from locals.server.app import create_app
from locals.server.backend import Done, Started, Text
from locals.server.run import RUNNER_OPTIONS
from locals.server.streaming import EventStream
from locals.protocol import Usage

from tests.helpers.server_fakes import ScriptedEngine, make_state

STALL_S = 0.05
MESSAGES = [{"role": "user", "content": "hi"}]
# API (as the status names it) -> path, request body, the bytes of the reply's last event (where the client hangs up)
CASES = {
    "openai": ("/v1/chat/completions", {"model": "m", "messages": MESSAGES, "max_tokens": 4, "stream": True},
               b'"finish_reason": "length"'),
    "responses": ("/v1/responses", {"model": "m", "input": "hi", "stream": True, "max_output_tokens": 4},
                  b"event: response.incomplete"),
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": MESSAGES, "stream": True},
                  b"event: message_stop"),
    "ollama": ("/api/chat", {"model": "m", "messages": MESSAGES, "options": {"num_predict": 4}},
               b'"done": true'),
}


@pytest.fixture
def starved_loop(monkeypatch):
    """After each event it writes, the server's loop stalls a moment (its thread waiting for the
    GIL while the engine works, say): long enough for the client to have hung up by its next poll."""
    send = EventStream.send

    async def send_then_stall(self, data, event=None):
        await send(self, data, event)
        time.sleep(STALL_S)

    monkeypatch.setattr(EventStream, "send", send_then_stall)


def _hang_up_after(port: int, request: bytes, marker: bytes) -> bytes:
    """Send `request`, read until `marker` has arrived, close at once; what was read."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        while marker not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    return received


@asynccontextmanager
async def _serving(engine):
    """The app on `engine`, served with the daemon's own runner settings: (state, port)."""
    state = make_state(engine)
    runner = web.AppRunner(create_app(state), **RUNNER_OPTIONS)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield state, runner.addresses[0][1]
    finally:
        await runner.cleanup()


def _http_post(path: str, body: dict, port: int) -> bytes:
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: keep-alive\r\n\r\n")
    return head.encode() + payload


@pytest.mark.parametrize("api", sorted(CASES))
async def test_hanging_up_on_the_last_event_is_an_answered_request(api, caplog, starved_loop):
    path, body, marker = CASES[api]
    engine = ScriptedEngine(replies=["Hello there, a reply cut at four tokens"])
    caplog.set_level(logging.INFO, logger="locals.server")
    async with _serving(engine) as (state, port):
        received = await asyncio.to_thread(_hang_up_after, port, _http_post(path, body, port), marker)
        assert marker in received
        for _ in range(100):  # the access line is written once the handler has returned
            if any(f"POST {path} " in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if f"POST {path} " in r.getMessage()]
    assert len(lines) == 1 and '" 200 ' in lines[0], lines
    assert engine.cancelled == [] and engine.finished == 1
    assert dict(state.backend.activity.requests) == {(api, "length"): 1}


async def test_hanging_up_mid_reply_cancels_it_and_says_so_in_the_log(caplog):
    engine = ScriptedEngine(replies=["a long reply " * 40], delay=0.02)
    caplog.set_level(logging.INFO, logger="locals.server")
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    async with _serving(engine) as (state, port):
        received = await asyncio.to_thread(_hang_up_after, port, _http_post("/v1/chat/completions", body, port),
                                           b'"content": "a l"')
        assert b'"content": "a l"' in received
        for _ in range(100):
            if engine.cancelled and state.backend.activity.in_flight == 0:
                break
            await asyncio.sleep(0.02)
    assert dict(state.backend.activity.requests) == {("openai", "cancelled"): 1}
    said = [r.getMessage() for r in caplog.records if "the client left" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"openai request {engine.requests[0].id} cancelled"), said


async def test_started_ends_at_done_without_resuming_the_chat():
    resumed = []

    async def chat():
        yield Text("hi")
        yield Done("stop", Usage())
        resumed.append("after done")  # where a second wait on the loop would have taken place

    started = Started(chat(), None)
    outs = [out async for out in started]
    await started.aclose()
    assert [type(o).__name__ for o in outs] == ["Text", "Done"]
    assert resumed == []



async def test_a_write_to_a_client_that_hung_up_logs_no_error(caplog):
    # Anthropic's ping and Responses' in_progress follow the first event at once; when the
    # client has already reset the connection, that write raises: a client gone, not a server
    # error with a traceback in `locals status --logs`.
    from aiohttp.test_utils import TestClient, TestServer

    from locals.server.app import json_errors

    async def hung_up(request):
        await EventStream(request).open()
        raise ConnectionResetError("Cannot write to closing transport")

    app = web.Application(middlewares=[json_errors])
    app.router.add_post("/v1/messages", hung_up)
    caplog.set_level(logging.INFO)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/v1/messages", json={})
        assert resp.status == 200
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
