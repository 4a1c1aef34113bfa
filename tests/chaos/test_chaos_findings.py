"""Each body the fuzzer found answered with a 5xx (or not at all), now a 400 in the API's shape."""

from __future__ import annotations

import json

import pytest

from tests.chaos.chaos_checks import error_shape_ok
from tests.helpers.server_fakes import client, constraints, engine  # noqa: F401 (shared fixtures)


PATHS = [("/v1/chat/completions", "openai"), ("/v1/completions", "openai"),
         ("/v1/responses", "openai"), ("/v1/messages", "anthropic"),
         ("/v1/messages/count_tokens", "anthropic"), ("/api/chat", "ollama"),
         ("/api/generate", "ollama"), ("/api/show", "ollama")]


def message_of(api: str, payload: dict) -> str:
    return payload["error"] if api == "ollama" else payload["error"]["message"]


async def post_raw(client, path: str, data: bytes):
    resp = await client.post(path, data=data, headers={"Content-Type": "application/json"})
    return resp.status, await resp.json()


@pytest.mark.parametrize("path,api", PATHS)
async def test_a_hundred_thousand_brackets_get_a_400(client, path, api):
    """Python's JSON parser runs out of recursion on it (was a 500)."""
    status, payload = await post_raw(client, path, b"[" * 100_000)
    assert status == 400 and error_shape_ok(api, payload)
    assert "levels deep" in message_of(api, payload)


async def test_nesting_that_parses_but_is_too_deep_gets_a_400(client, engine):
    """Deep enough to parse, deep enough to break the recursive code behind (templates, schemas)."""
    content = "[" * 150 + "]" * 150
    body = b'{"messages": [{"role": "user", "content": "hi", "extra": ' + content.encode() + b"}]}"
    status, payload = await post_raw(client, "/v1/chat/completions", body)
    assert status == 400 and "levels deep" in payload["error"]["message"]
    assert engine.requests == []


async def test_nesting_a_real_request_uses_is_served(client):
    schema: dict = {"type": "string"}
    for _ in range(30):  # a tool schema 30 objects deep
        schema = {"type": "object", "properties": {"inner": schema}}
    tools = [{"type": "function", "function": {"name": "deep", "parameters": schema}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 200


@pytest.mark.parametrize("path,api", PATHS[:7])
async def test_a_lone_surrogate_gets_a_400(client, path, api):
    """No tokenizer encodes `\\ud800` alone (was a 500 from the tokenizer on the real model)."""
    body = {"messages": [{"role": "user", "content": "hi \ud800"}], "prompt": "hi \ud800",
            "input": "hi \ud800", "max_tokens": 3}
    status, payload = await post_raw(client, path, json.dumps(body).encode())
    assert status == 400 and error_shape_ok(api, payload)
    assert "lone surrogate (\\ud800)" in message_of(api, payload)


async def test_a_lone_surrogate_in_a_key_gets_a_400(client):
    status, payload = await post_raw(client, "/api/show", b'{"model": "m", "\\udc00": 1}')
    assert status == 400 and "lone surrogate" in payload["error"]


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
async def test_nan_and_infinity_are_not_json(client, engine, constant):
    status, payload = await post_raw(client, "/v1/chat/completions",
                                     b'{"messages": [{"role": "user", "content": "hi"}], "temperature": '
                                     + constant + b"}")
    assert status == 400 and constant.decode() in payload["error"]["message"]
    assert engine.requests == []


async def test_a_content_length_over_the_limit_is_refused_before_the_body(client):
    """A client that declares more than the limit gets a 413 at once, not after sending it all."""
    reader_writer = await __import__("asyncio").open_connection("127.0.0.1", client.port)
    reader, writer = reader_writer
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000000000000\r\n\r\n{}")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    writer.close()


@pytest.mark.parametrize("path,field", [("/v1/chat/completions", "temperature"),
                                        ("/v1/messages", "top_p"), ("/api/chat", "options.top_p")])
async def test_an_integer_too_large_for_a_float_gets_a_400(client, engine, path, field):
    """`float(10**400)` raises OverflowError (was a 500 from Ollama's options.top_p)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    if field.startswith("options."):
        body["options"] = {field.removeprefix("options."): 10**400}
    else:
        body[field] = 10**400
    resp = await client.post(path, data=json.dumps(body), headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert "too large a number" in json.dumps(await resp.json())
    assert engine.requests == []


@pytest.mark.parametrize("prompt", ['""', '[""]'])
async def test_an_empty_completions_prompt_gets_a_400(client, engine, prompt):
    """A model without a start token has no token to continue from (was a 500 from the engine)."""
    body = b'{"model": "m", "prompt": ' + prompt.encode() + b', "max_tokens": 3}'
    status, payload = await post_raw(client, "/v1/completions", body)
    assert status == 400 and error_shape_ok("openai", payload)
    assert "`prompt` is empty" in message_of("openai", payload)
    assert not engine.requests


async def test_a_large_body_is_parsed_off_the_event_loop(client, engine, monkeypatch):
    # A 30 MB body of empty arrays held every stream and /health for 9 s when parsed in place,
    # long enough for `locals start` to take the server for a stale one.
    import asyncio

    from locals.server import wire

    threaded = []
    real = asyncio.to_thread

    async def recording(fn, *args):
        threaded.append(fn.__name__)
        return await real(fn, *args)

    monkeypatch.setattr(wire.asyncio, "to_thread", recording)
    pad = [[] for _ in range(wire.THREAD_PARSE_BYTES // 3)]
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "pad": pad})
    assert resp.status == 200 and threaded.count("_parse") == 1
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 200 and threaded.count("_parse") == 1  # a small body is parsed in place
