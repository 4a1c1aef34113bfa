"""Local-only guard: Host and Origin checks, the optional API key, body limits, CORS."""

from __future__ import annotations

import pytest

import socket

from locals.server.security import host_allowed, is_loopback, origin_allowed

from tests.helpers.server_fakes import ScriptedEngine, make_state, start_client

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("host, ok", [
    ("localhost", True), ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True),
    ("app.localhost", True), ("LOCALHOST.", True),
    ("evil.example", False), ("192.168.1.5", False), ("0.0.0.0", False), ("localhost.evil.com", False), ("", False),
])
def test_is_loopback(host, ok):
    assert is_loopback(host) is ok


@pytest.mark.parametrize("host, ok", [
    ("localhost", True), ("host.docker.internal", True), ("studio.local", True), (socket.gethostname(), True),
    ("evil.example", False), ("internal.evil.com", False), ("local", False), ("", False),
])
def test_host_allowed(host, ok):
    # Names public DNS cannot point at this machine, as Ollama allows (Open WebUI in Docker).
    assert host_allowed(host) is ok


@pytest.mark.parametrize("origin, ok", [
    ("http://localhost:3000", True), ("http://127.0.0.1:8321", True), ("https://[::1]", True),
    ("vscode-webview://abc", True), ("https://evil.example", False), ("http://127.0.0.1.nip.io", False),
    ("null", False),
])
def test_origin_allowed(origin, ok):
    assert origin_allowed(origin) is ok


@pytest.fixture
async def client():
    client = await start_client(make_state(ScriptedEngine()))
    yield client
    await client.close()


async def test_foreign_host_is_refused(client):
    # DNS rebinding: a page on evil.example resolves its name to 127.0.0.1.
    resp = await client.post("/v1/chat/completions", json=CHAT, headers={"Host": "evil.example:8321"})
    assert resp.status == 403 and "Host" in (await resp.json())["error"]["message"]
    resp = await client.post("/api/chat", json=CHAT, headers={"Host": "evil.example"})
    assert resp.status == 403 and isinstance((await resp.json())["error"], str)
    resp = await client.get("/", headers={"Host": "evil.example", "Accept": "text/html"})
    assert resp.status == 403
    assert (await client.post("/v1/chat/completions", json=CHAT, headers={"Host": "localhost:8321"})).status == 200
    resp = await client.post("/api/chat", json=CHAT, headers={"Host": "host.docker.internal:8321"})
    assert resp.status == 200
    resp = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://studio.local"})
    assert resp.status == 403  # a web page on the network is still no page of this machine


async def test_foreign_origin_is_refused_and_local_origin_gets_cors(client):
    resp = await client.post("/v1/messages", json=CHAT, headers={"Origin": "https://evil.example"})
    assert resp.status == 403 and (await resp.json())["error"]["type"] == "permission_error"
    assert "Access-Control-Allow-Origin" not in resp.headers
    resp = await client.post("/v1/chat/completions", json=CHAT | {"stream": True},
                             headers={"Origin": "http://localhost:5173"})
    assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    await resp.read()
    resp = await client.options("/v1/chat/completions", headers={
        "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert resp.status == 204 and resp.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert resp.headers["Access-Control-Allow-Headers"] == "authorization, content-type"  # "*" omits Authorization
    resp = await client.options("/v1/chat/completions", headers={"Origin": "https://evil.example"})
    assert resp.status == 403


async def test_remote_mode_accepts_any_host_but_not_foreign_origins():
    client = await start_client(make_state(ScriptedEngine(), allow_remote=True))
    try:
        resp = await client.post("/v1/chat/completions", json=CHAT, headers={"Host": "studio.lan:8321"})
        assert resp.status == 200
        resp = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "https://evil.example"})
        assert resp.status == 403
    finally:
        await client.close()


async def test_api_key():
    client = await start_client(make_state(ScriptedEngine(), api_key="s3cret"))
    try:
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 401 and "API key" in (await resp.json())["error"]["message"]
        resp = await client.post("/v1/messages", json=CHAT, headers={"x-api-key": "wrong"})
        assert resp.status == 401 and (await resp.json())["error"]["type"] == "authentication_error"
        ok = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer s3cret"})
        assert ok.status == 200
        ok = await client.post("/v1/messages", json=CHAT, headers={"x-api-key": "s3cret"})
        assert ok.status == 200
        for path in ("/health", "/metrics", "/v1/locals/status"):  # monitoring needs no key
            assert (await client.get(path)).status == 200
        assert (await client.get("/api/tags")).status == 401
    finally:
        await client.close()


async def test_what_users_wrote_needs_the_key_from_another_machine():
    from unittest import mock

    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    from locals.server.app import create_app
    from locals.server.security import local_only

    app = create_app(make_state(ScriptedEngine(), api_key="s3cret", allow_remote=True))

    async def answered(request):
        return web.Response(status=200)

    async def status(path: str, peer: str) -> int:
        transport = mock.Mock()
        transport.get_extra_info.side_effect = lambda name, default=None: (peer, 5000) if name == "peername" else default
        request = make_mocked_request("GET", path, headers={"Host": "box.lan:8321"}, app=app, transport=transport)
        return (await local_only(request, answered)).status

    for path in ("/v1/locals/conversations", "/v1/locals/history", "/v1/locals/team"):
        assert await status(path, "192.168.1.7") == 401 and await status(path, "127.0.0.1") == 200
    assert await status("/v1/locals/status", "192.168.1.7") == 200  # figures only: open


async def test_huge_body_is_a_413_and_the_server_lives_on():
    client = await start_client(make_state(ScriptedEngine(), max_body_mb=1))
    try:
        big = {"messages": [{"role": "user", "content": "x" * (2 << 20)}]}
        resp = await client.post("/v1/chat/completions", json=big)
        assert resp.status == 413 and "--max-body-mb" in (await resp.json())["error"]["message"]
        resp = await client.post("/api/chat", json=big)
        assert resp.status == 413 and "1 MB" in (await resp.json())["error"]
        assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    finally:
        await client.close()
