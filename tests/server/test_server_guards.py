"""The tool-call loop guard through the API: steered at 3 identical calls, stopped at 5."""

from __future__ import annotations

import json

import pytest

from tests.helpers.server_fakes import CutReply, ScriptedEngine, make_state, sse_events, start_client


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


# A reply the limit ended inside a call: the constraint closed it (from `closing_at` on), so it
# parses, but the command is cut short and must not run as if whole.
WHOLE = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'
CUT_TEXT = 'Cleaning up. <tool_call>{"name": "read_file", "arguments": {"path": "/home"}}</tool_call>'
CUT = CutReply(CUT_TEXT, closing_at=CUT_TEXT.index('/home') + len('/home'))


async def test_call_cut_by_max_tokens_is_not_returned(client, engine):
    engine.replies = [CUT]
    resp = await client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "clean"}], "tools": TOOLS})
    body = await resp.json()
    choice = body["choices"][0]
    assert resp.status == 200 and choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"] and choice["message"]["content"] == "Cleaning up."
    assert body["locals"] == {"cut_tool_call": "read_file"}


async def test_whole_call_before_the_cut_one_is_kept(client, engine):
    text = WHOLE + CUT_TEXT
    engine.replies = [CutReply(text, closing_at=len(WHOLE) + CUT.closing_at)]
    resp = await client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS, "stream": True})
    events = [json.loads(data) for _, data in sse_events(await resp.text()) if data != "[DONE]"]
    calls = [c for e in events for ch in e["choices"] for c in ch["delta"].get("tool_calls") or []]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"path": "a.py"}]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["locals"] == {"cut_tool_call": "read_file"}


async def test_call_cut_by_a_guard_in_anthropic_stream(client, engine):
    engine.replies = [CutReply(CUT.text, CUT.closing_at, reason="loop")]
    resp = await client.post("/v1/messages", json={
        "model": "m", "max_tokens": 500, "stream": True, "messages": [{"role": "user", "content": "go"}],
        "tools": [{"name": "read_file", "input_schema": TOOLS[0]["function"]["parameters"]}]})
    events = [json.loads(data) for _, data in sse_events(await resp.text())]
    blocks = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert blocks == ["text"]
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["locals"] == {"finish_reason": "loop", "cut_tool_call": "read_file"}


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"stream": True}),
    ("/v1/messages", {"stream": True, "max_tokens": 50}),
    ("/api/chat", {"stream": True}),
    ("/v1/responses", {"stream": True, "input": "go"}),
])
async def test_a_streamed_request_that_can_never_fit_ends_in_an_error_event(client, engine, path, body):
    # Unstreamed it is a 413; streamed, the headers are out: an error event, not an empty finish.
    engine.replies = [CutReply("", 0, reason="memory")]
    resp = await client.post(path, json={"model": "m", "messages": [{"role": "user", "content": "go"}], **body})
    text = await resp.text()
    assert resp.status == 200 and "can never fit in the memory budget" in text
    assert '"request_too_large"' in text or path == "/api/chat"
    assert "finish_reason\": \"length\"" not in text and "message_stop" not in text


async def test_a_cut_call_is_named_in_the_responses_api_too(client, engine):
    engine.replies = [CUT]
    resp = await client.post("/v1/responses", json={"model": "m", "input": "clean", "tools": [
        {"type": "function", "name": "read_file", "parameters": TOOLS[0]["function"]["parameters"]}]})
    body = await resp.json()
    assert body["status"] == "incomplete" and body["locals"] == {"cut_tool_call": "read_file"}
    assert [item["type"] for item in body["output"]] == ["message"]
