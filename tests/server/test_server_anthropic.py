"""Anthropic Messages API, including the request shape Claude Code sends (`?beta=true`)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.server_fakes import client, constraints, engine  # noqa: F401 (shared fixtures)
from tests.helpers.server_fakes import events_of


BASH_TOOL = {"name": "Bash", "description": "Run a bash command",
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                              "required": ["command"], "additionalProperties": False,
                              "$schema": "http://json-schema.org/draft-07/schema#"}}


def claude_code_request(messages):
    """What Claude Code posts: system blocks with cache_control, thinking, context_management,
    metadata, server tools next to client tools, stream on."""
    return {
        "model": "claude-sonnet-4-5-20250929", "max_tokens": 32000, "temperature": 1, "stream": True,
        "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                    "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "Work in /p.", "cache_control": {"type": "ephemeral"}}],
        "messages": messages,
        "tools": [BASH_TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
        "metadata": {"user_id": "user_abc_account__session_1"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    }


HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
           "x-api-key": "anything", "x-app": "cli"}


async def test_plain_message(client, engine):
    engine.replies = ["Paris."]
    engine.cached = 2
    body = {"model": "claude-x", "max_tokens": 100, "system": "Be brief.",
            "messages": [{"role": "user", "content": "Capital of France?"}]}
    resp = await client.post("/v1/messages", json=body)
    data = await resp.json()
    assert data["type"] == "message" and data["role"] == "assistant" and data["model"] == "claude-x"
    assert data["content"] == [{"type": "text", "text": "Paris."}]
    assert data["stop_reason"] == "end_turn"
    prompt_len = len(engine.requests[0].prompt_tokens)
    assert data["usage"]["input_tokens"] + data["usage"]["cache_read_input_tokens"] == prompt_len
    assert data["usage"]["cache_read_input_tokens"] == 2 and data["usage"]["output_tokens"] == 6


async def test_claude_code_stream_with_tool_use(client, engine, constraints):
    engine.replies = ['I will look. <tool_call>{"name": "Bash", "arguments": {"command": "ls"}}</tool_call>']
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>context</system-reminder>"},
        {"type": "text", "text": "list files", "cache_control": {"type": "ephemeral"}}]}]
    resp = await client.post("/v1/messages?beta=true", json=claude_code_request(messages), headers=HEADERS)
    assert resp.status == 200
    events = events_of(await resp.text())
    kinds = [e["type"] for i, e in enumerate(events) if i == 0 or e["type"] != events[i - 1]["type"]]
    assert kinds == ["message_start", "ping", "content_block_start", "content_block_delta",
                     "content_block_stop", "content_block_start", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
                   and e["delta"]["type"] == "text_delta")
    assert text == "I will look."  # the space before the call separates, it is not the reply's
    tool_start = next(e for e in events if e["type"] == "content_block_start"
                      and e["content_block"]["type"] == "tool_use")
    assert tool_start["content_block"]["name"] == "Bash" and tool_start["index"] == 1
    partial = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"
                      and e["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"command": "ls"}
    assert events[0]["message"]["usage"]["input_tokens"] == len(engine.requests[0].prompt_tokens)
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] > 0
    assert [t["function"]["name"] for t in constraints.calls[0]["tools"]] == ["Bash"]
    prompt = "".join(chr(t) for t in engine.requests[0].prompt_tokens)
    assert "system: You are Claude Code, Anthropic's official CLI for Claude.Work in /p." in prompt


async def test_a_stop_sequence_is_named(client, engine):
    engine.replies = ["Hello there.", "Hello there."]
    body = {"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": [" there"]}
    data = await (await client.post("/v1/messages", json=body)).json()
    assert data["content"][0]["text"] == "Hello"
    assert data["stop_reason"] == "stop_sequence" and data["stop_sequence"] == " there"
    text = await (await client.post("/v1/messages", json={**body, "stream": True})).text()
    assert '"stop_reason": "stop_sequence", "stop_sequence": " there"' in text


async def test_tool_result_round_trip(client, engine):
    engine.replies = ["Two files."]
    messages = [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "x"},
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a b"}]},
            {"type": "text", "text": "and?"}]},
    ]
    body = claude_code_request(messages) | {"stream": False}
    data = await (await client.post("/v1/messages?beta=true", json=body)).json()
    assert data["content"] == [{"type": "text", "text": "Two files."}]
    prompt = "".join(chr(t) for t in engine.requests[0].prompt_tokens)
    assert 'assistant: Looking.[{"id": "toolu_1"' in prompt
    assert "tool: a b\nuser: and?" in prompt


async def test_count_tokens(client):
    body = {"model": "x", "messages": [{"role": "user", "content": "hello"}], "tools": [BASH_TOOL]}
    data = await (await client.post("/v1/messages/count_tokens?beta=true", json=body)).json()
    assert data["input_tokens"] > len("hello")


@pytest.mark.parametrize("body, needle", [
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "text only"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, "`max_tokens`"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1, "stream": True}, "`temperature`"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": ["plain"]}]}]},
     "blocks must be objects"),
    ({"messages": [{"role": "user", "content": "x"}], "system": 5}, "`system` must be"),
    # Wrongly typed fields inside blocks: 400s, not 500s.
    ({"messages": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]}, "string `type`"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": {"x": 1},
                                                 "content": "ok"}]}]}, "`tool_use_id`"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": ["x"], "name": "f",
                                                      "input": {}}]}]}, "`id`"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": "abc"}]}]}, "text only"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": 1}}]}]},
     "`data`"),
    ({"messages": [{"role": "user", "content": "x"}], "truncation": {}}, "`truncation`"),
])
async def test_errors_use_the_anthropic_shape(client, body, needle):
    resp = await client.post("/v1/messages", json=body)
    assert resp.status == 400
    data = await resp.json()
    assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    assert needle in data["error"]["message"]


async def test_system_role_inside_messages_is_folded_into_the_system_prompt():
    """Claude Code sends its environment notes as a `system` message among the messages."""
    from tests.helpers.server_fakes import ScriptedEngine, make_state, start_client

    engine = ScriptedEngine()
    client = await start_client(make_state(engine))
    try:
        resp = await client.post("/v1/messages?beta=true", json={
            "model": "claude-sonnet", "max_tokens": 20, "system": "You are Claude Code.",
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "system", "content": [{"type": "text", "text": "cwd: /tmp/p"}]},
                         {"role": "user", "content": "go on"}]})
        assert resp.status == 200, await resp.text()
        prompt = "".join(chr(t) for t in engine.requests[-1].prompt_tokens)
        assert prompt.startswith("system: You are Claude Code.\n\ncwd: /tmp/p\nuser: hi")
    finally:
        await client.close()


async def test_an_assistant_prefill_is_continued(client, engine):
    body = {"max_tokens": 10, "messages": [{"role": "user", "content": "Capital of France? JSON."},
                                           {"role": "assistant", "content": '{"capital": "'}]}
    await client.post("/v1/messages", json=body)
    request = engine.requests[-1]
    prompt = "".join(chr(t) for t in request.prompt_tokens)
    assert prompt.endswith('assistant: {"capital": "') and request.meta["raw"]  # left open, not a new turn


def test_a_prefill_renders_open_on_the_embedded_model(smollm2):
    from locals.engine.load.templates import render_prompt

    messages = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "The capital is"}]
    assert render_prompt(smollm2, messages, continue_final=True).endswith("The capital is")
    assert not render_prompt(smollm2, messages).endswith("The capital is")


PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.mark.parametrize("field", [{"output_config": {"format": {"type": "json_schema", "schema": PERSON}}},
                                   {"output_format": {"type": "json_schema", "schema": PERSON}}])
async def test_structured_outputs_constrain_the_reply(client, engine, constraints, field):
    engine.replies = ['{"name": "Ada"}']
    resp = await client.post("/v1/messages", json={
        "model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "Who?"}], **field})
    assert resp.status == 200 and (await resp.json())["content"] == [{"type": "text", "text": '{"name": "Ada"}'}]
    assert constraints.calls[0]["json_schema"] == PERSON and constraints.calls[0]["strict_schema"] is True


async def test_a_malformed_output_format_is_refused_not_ignored(client, engine):
    resp = await client.post("/v1/messages", json={
        "model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "Who?"}],
        "output_config": {"format": {"type": "json", "schema": PERSON}}})
    body = await resp.json()
    assert resp.status == 400 and "output_config.format" in body["error"]["message"] and not engine.requests


async def test_an_image_a_tool_returned_is_named_not_refused(client, engine):
    # A refusal would stay in Claude Code's history and fail every later turn of the session.
    engine.replies = ["I cannot see it."]
    resp = await client.post("/v1/messages", json={"model": "m", "max_tokens": 50, "messages": [
        {"role": "user", "content": "look at shot.png"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "shot.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "shot.png:"}, {"type": "image", "source": {"type": "base64", "data": "aGk="}}]}]}]})
    assert resp.status == 200
    prompt = "".join(chr(t) for t in engine.requests[-1].prompt_tokens)
    assert "shot.png:[an image or document the tool returned: this model reads text only" in prompt
