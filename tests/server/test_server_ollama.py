"""Ollama API: NDJSON streaming by default, tools, format, and the model listing endpoints."""

from __future__ import annotations

import json

from tests.helpers.server_fakes import client, constraints, engine  # noqa: F401 (shared fixtures)


TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]


async def test_chat_streams_ndjson_by_default(client, engine):
    engine.replies = ["Hi there!"]
    body = {"model": "llama3.2:latest", "messages": [{"role": "user", "content": "hi"}],
            "options": {"temperature": 0, "num_predict": 50, "seed": 3}, "keep_alive": "5m"}
    resp = await client.post("/api/chat", json=body)
    assert resp.headers["Content-Type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in (await resp.text()).splitlines()]
    assert "".join(line["message"]["content"] for line in lines) == "Hi there!"
    assert all(line["model"] == "llama3.2:latest" for line in lines)
    final = lines[-1]
    assert final["done"] is True and final["done_reason"] == "stop"
    assert final["eval_count"] == 9 and final["prompt_eval_count"] == len(engine.requests[0].prompt_tokens)
    sampling = engine.requests[0].sampling
    assert (sampling.temperature, sampling.max_tokens, sampling.seed) == (0.0, 50, 3)


async def test_durations_split_prompt_reading_from_decoding(client, engine):
    engine.replies, engine.delay = ["abcdefghi"], 0.05  # 3 events: first token after 50 ms
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    final = await (await client.post("/api/chat", json=body)).json()
    prompt, decode, total = final["prompt_eval_duration"], final["eval_duration"], final["total_duration"]
    assert prompt >= 0.04e9 and decode >= 0.09e9  # first event after 50 ms, two more 50 ms apart
    assert prompt + decode == total


async def test_chat_tool_call_and_format(client, engine, constraints):
    engine.replies = ['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', '{"x": 1}']
    body = {"model": "m", "stream": False, "tools": TOOLS,
            "messages": [{"role": "user", "content": "1+2?"}]}
    data = await (await client.post("/api/chat", json=body)).json()
    (call,) = data["message"]["tool_calls"]
    assert call["function"] == {"name": "add", "arguments": {"a": 1, "b": 2}}
    assert constraints.calls[0]["tools"][0]["function"]["name"] == "add"
    round_trip = {"model": "m", "stream": False, "format": "json", "messages": [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "content": "3", "tool_name": "add"}]}
    data = await (await client.post("/api/chat", json=round_trip)).json()
    assert data["message"]["content"] == '{"x": 1}' and data["done"] is True
    assert constraints.calls[1]["json_schema"] == {"type": "object"}
    prompt = "".join(chr(t) for t in engine.requests[1].prompt_tokens)
    assert "tool: 3" in prompt


async def test_generate(client, engine):
    engine.replies = ["blue", "raw reply"]
    resp = await client.post("/api/generate", json={"model": "x", "prompt": "Sky color?", "system": "Short."})
    lines = [json.loads(line) for line in (await resp.text()).splitlines()]
    assert "".join(line["response"] for line in lines) == "blue" and lines[-1]["done"]
    data = await (await client.post("/api/generate", json={"prompt": "P:", "raw": True, "stream": False})).json()
    assert data["response"] == "raw reply"
    assert "".join(chr(t) for t in engine.requests[1].prompt_tokens) == "P:"
    data = await (await client.post("/api/generate", json={"model": "x"})).json()
    assert data["done_reason"] == "load"
    data = await (await client.post("/api/generate", json={"model": "x", "keep_alive": 0})).json()
    assert data["done_reason"] == "unload"


async def test_an_empty_chat_loads_the_model_as_ollama_run_does(client, engine):
    for body, reason in (({"model": "x", "messages": []}, "load"), ({"model": "x"}, "load"),
                         ({"model": "x", "messages": [], "keep_alive": 0}, "unload")):
        resp = await client.post("/api/chat", json=body)
        data = await resp.json()
        assert resp.status == 200 and data["done"] and data["done_reason"] == reason
        assert data["message"] == {"role": "assistant", "content": ""}
    assert engine.requests == []  # nothing was generated
    resp = await client.post("/api/chat", json={"messages": [], "options": []})
    assert resp.status == 400 and "options" in (await resp.json())["error"]


async def test_listing_endpoints(client):
    assert (await (await client.get("/api/version")).json())["version"]
    tags = await (await client.get("/api/tags")).json()
    assert tags["models"][0]["name"] == "fake:latest"
    ps = await (await client.get("/api/ps")).json()
    assert ps["models"][0]["context_length"] == 8192
    show = await (await client.post("/api/show", json={"model": "whatever"})).json()
    assert "tools" in show["capabilities"] and show["details"]["format"] == "mlx"
    resp = await client.get("/")
    assert await resp.text() == "Ollama is running"
    resp = await client.get("/", headers={"Accept": "text/html"})
    assert "<title>locals</title>" in await resp.text()


async def test_errors_use_the_ollama_shape(client):
    resp = await client.post("/api/chat", json={"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})
    assert resp.status == 400 and "text only" in (await resp.json())["error"]
    resp = await client.post("/api/chat", json={"messages": [{"role": "user", "content": "x"}],
                                                "options": {"temperature": "warm"}})
    assert resp.status == 400 and "temperature" in (await resp.json())["error"]
    resp = await client.post("/api/generate", json={"prompt": "x", "options": {"top_p": -0.5}})
    assert resp.status == 400 and "top_p" in (await resp.json())["error"]
    resp = await client.post("/api/generate", json={"prompt": "x", "images": ["aGk="]})
    assert resp.status == 400 and "text only" in (await resp.json())["error"]
    resp = await client.post("/api/generate", json={"prompt": "def f(", "suffix": "    return x"})
    assert resp.status == 400 and "`suffix` is not supported" in (await resp.json())["error"]  # not ignored
    resp = await client.post("/api/chat", json={"messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": {"function": {}}}]})
    assert resp.status == 400 and "tool_calls" in (await resp.json())["error"]
    resp = await client.post("/api/embed", json={})
    assert resp.status == 404 and isinstance((await resp.json())["error"], str)
