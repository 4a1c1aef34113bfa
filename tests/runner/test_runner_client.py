"""locals.client: chat completions with tools against any OpenAI-compatible endpoint."""

from __future__ import annotations

import pytest
from aiohttp import web

from locals.client import ChatClient, ClientError, parse_reply, recover_text_tool_calls, v1_url
from locals.errors import DaemonNotRunning

from tests.helpers.fake_openai import FakeOpenAI, call, calls


def test_base_urls_are_normalised():
    assert v1_url("http://h:1") == v1_url("http://h:1/v1/") == "http://h:1/v1"


async def test_tool_calls_round_trip_and_model_is_discovered():
    fake = FakeOpenAI(lambda body: calls(call("read_file", path="a.py")), model="m1")
    async with fake as url, ChatClient(url) as client:
        reply = await client.chat([{"role": "user", "content": "hi"}], tools=[{"type": "function"}],
                                  tool_choice="required", temperature=0.5, seed=3)
    assert reply.tool_calls[0].name == "read_file" and reply.tool_calls[0].arguments == {"path": "a.py"}
    assert reply.finish_reason == "tool_calls" and reply.completion_tokens == 10
    body = fake.requests[0]
    assert body["model"] == "m1" and body["seed"] == 3 and body["tool_choice"] == "required"
    message = reply.assistant_message()
    assert message["tool_calls"][0]["function"]["arguments"] == '{"path": "a.py"}'


def test_hermes_blocks_left_in_text_become_calls():
    content, found = recover_text_tool_calls(
        'ok <tool_call>{"name": "finish", "arguments": {"summary": "done"}}</tool_call>')
    assert content == "ok" and found[0].name == "finish" and found[0].arguments == {"summary": "done"}
    reply = parse_reply({"choices": [{"message": {"content": "<tool_call>{bad json}</tool_call>"}}]})
    assert reply.tool_calls == [] and "bad json" in reply.content


async def test_server_errors_and_unreachable_servers_are_clear():
    async def fail(_request):
        return web.json_response({"error": {"message": "context too long"}}, status=400)

    async def page(_request):  # a web server that is not an OpenAI-compatible API
        return web.Response(text="<!DOCTYPE HTML>\n<html lang=en>\n<title>404</title>\n</html>", status=404,
                            content_type="text/html")

    async def plain(_request):
        return web.Response(text="hello\nworld")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", fail)
    app.router.add_post("/page/v1/chat/completions", page)
    app.router.add_post("/plain/v1/chat/completions", plain)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with ChatClient(f"http://127.0.0.1:{port}", model="m") as client:
            with pytest.raises(ClientError, match="400: context too long"):
                await client.chat([{"role": "user", "content": "hi"}])
        for path, needle in (("page", "404: an HTML page, not an OpenAI-compatible error"),
                             ("plain", "not JSON: 'hello world'; is --server the base URL")):
            async with ChatClient(f"http://127.0.0.1:{port}/{path}", model="m") as client:
                with pytest.raises(ClientError) as raised:
                    await client.chat([{"role": "user", "content": "hi"}])
            assert needle in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
    finally:
        await runner.cleanup()
    async with ChatClient(f"http://127.0.0.1:{port}", model="m") as client:
        with pytest.raises(DaemonNotRunning, match="locals start"):
            await client.chat([{"role": "user", "content": "hi"}])
