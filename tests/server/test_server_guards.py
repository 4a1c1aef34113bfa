"""The tool-call loop guard through the API: steered at 3 identical calls, stopped at 5."""

from __future__ import annotations

import json

import pytest

from tests.helpers.server_fakes import ScriptedEngine, make_state, start_client


TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def _conversation(repeats: int) -> list[dict]:
    msgs = [{"role": "user", "content": "fix the bug"}]
    for i in range(repeats):
        msgs += [{"role": "assistant", "content": None, "tool_calls": [{
                     "id": f"c{i}", "type": "function",
                     "function": {"name": "read_file", "arguments": json.dumps({"path": "a.py"})}}]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": "print(1)"}]
    return msgs


@pytest.fixture
def engine():
    return ScriptedEngine()


@pytest.fixture
async def client(engine):
    client = await start_client(make_state(engine))
    yield client
    await client.close()


async def test_repeated_call_is_steered_away(client, engine):
    resp = await client.post("/v1/chat/completions", json={
        "model": "m", "messages": _conversation(3), "tools": TOOLS})
    assert resp.status == 200
    prompt = "".join(chr(t) for t in engine.requests[-1].prompt_tokens)
    assert "Do not call it again with these arguments" in prompt
    body = await resp.json()
    assert "locals" not in body


async def test_loop_is_stopped_with_a_reason(client, engine):
    resp = await client.post("/v1/chat/completions", json={
        "model": "m", "messages": _conversation(5), "tools": TOOLS})
    body = await resp.json()
    assert resp.status == 200 and not engine.requests  # the model never ran
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["locals"] == {"finish_reason": "tool_loop"}
    assert "stopped a tool-call loop" in body["choices"][0]["message"]["content"]


async def test_loop_stop_in_anthropic_shape(client, engine):
    msgs = []
    for i in range(5):
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "read_file",
                                                    "input": {"path": "a.py"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "x"}]}]
    resp = await client.post("/v1/messages", json={
        "model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "go"}] + msgs,
        "tools": [{"name": "read_file", "input_schema": TOOLS[0]["function"]["parameters"]}]})
    body = await resp.json()
    assert resp.status == 200, body
    assert body["stop_reason"] == "end_turn" and body["locals"] == {"finish_reason": "tool_loop"}
