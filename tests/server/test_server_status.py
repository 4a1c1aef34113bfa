"""Health, status JSON, Prometheus metrics, the dashboard page, loading state, and
cancellation of a request whose client hangs up."""

from __future__ import annotations

import asyncio

from locals.server.state import ServerState

from tests.helpers.server_fakes import ScriptedEngine, make_state, start_client

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


async def test_health_status_and_metrics_follow_requests():
    engine = ScriptedEngine(replies=["one", "two"])
    client = await start_client(make_state(engine))
    try:
        health = await (await client.get("/health")).json()
        assert health["status"] == "ok" and health["service"] == "locals" and health["model"] == "fake"
        before = await (await client.get("/v1/locals/status")).json()
        assert before["requests"]["total"] == 0 and before["status"] == "ready"
        await client.post("/v1/chat/completions", json=CHAT)
        await client.post("/api/chat", json=CHAT | {"stream": False})
        status = await (await client.get("/v1/locals/status")).json()
        assert status["requests"]["total"] == 2 and status["requests"]["in_flight"] == 0
        assert [r["api"] for r in status["requests"]["recent"]] == ["ollama", "openai"]
        assert status["engine"]["decode_tokens_per_s"] == 12.5 and status["memory_rss_bytes"] > 0
        text = await (await client.get("/metrics")).text()
        assert 'locals_up{model="fake"} 1' in text
        assert 'locals_http_requests_total{api="openai",finish="stop"} 1' in text
        assert "# TYPE locals_generated_tokens_total counter" in text
        from locals.server.metrics import _number
        assert _number(1234567) == "1234567" and _number(0.25) == "0.25"  # counters keep every digit
        page = await (await client.get("/dashboard")).text()
        assert 'id="requests-total"' in page and 'src="/static/dashboard.js"' in page
    finally:
        await client.close()


async def test_a_broken_engine_is_not_healthy():
    engine = ScriptedEngine(replies=["one"])
    engine.broken = "the engine failed (RuntimeError: a bug); restart locals (`locals stop`)"
    client = await start_client(make_state(engine))
    try:
        resp = await client.get("/health")
        assert resp.status == 503 and "a bug" in (await resp.json())["error"]
        status = await (await client.get("/v1/locals/status")).json()
        assert status["status"] == "failed" and "a bug" in status["error"]
        assert 'locals_up{model="fake"} 0' in await (await client.get("/metrics")).text()
    finally:
        await client.close()


async def test_loading_state_answers_503_in_each_shape():
    client = await start_client(ServerState(model="qwen"))
    try:
        resp = await client.get("/health")
        assert resp.status == 503 and (await resp.json())["status"] == "loading"
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 503 and "still loading" in (await resp.json())["error"]["message"]
        assert resp.headers["Retry-After"] == "5"  # the SDKs' retries wait for it
        resp = await client.post("/v1/messages", json=CHAT)
        assert (await resp.json())["error"]["type"] == "overloaded_error"
        assert "locals_up{model=\"qwen\"} 0" in await (await client.get("/metrics")).text()
    finally:
        await client.close()


async def test_client_hang_up_cancels_the_request_in_the_engine():
    engine = ScriptedEngine(replies=["x" * 3000], delay=0.02)
    state = make_state(engine)
    client = await start_client(state)
    try:
        resp = await client.post("/v1/chat/completions", json=CHAT | {"stream": True})
        await resp.content.readline()  # the stream is running
        resp.close()  # hang up
        for _ in range(100):
            if engine.cancelled:
                break
            await asyncio.sleep(0.02)
        assert engine.cancelled == [engine.requests[0].id]
        record = state.backend.activity.recent[0]
        assert record.finish == "cancelled" and state.backend.activity.in_flight == 0
    finally:
        await client.close()


async def test_a_running_request_shows_its_output_so_far():
    engine = ScriptedEngine(replies=["x" * 3000], delay=0.02)
    client = await start_client(make_state(engine))
    try:
        resp = await client.post("/v1/chat/completions", json=CHAT | {"stream": True})
        for _ in range(4):
            await resp.content.readline()  # a few chunks are out
        row = (await (await client.get("/v1/locals/status")).json())["requests"]["recent"][0]
        assert row["finish"] == "running" and row["completion_tokens"] >= 3
        resp.close()
    finally:
        await client.close()
