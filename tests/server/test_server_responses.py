"""OpenAI Responses API, replaying the request shapes Codex sends."""

from __future__ import annotations

import json

import pytest

from tests.helpers.server_fakes import client, constraints, engine  # noqa: F401 (shared fixtures)
from tests.helpers.server_fakes import events_of as shared_events_of


SHELL_TOOL = {"type": "function", "name": "shell", "description": "Runs a shell command", "strict": False,
              "parameters": {"type": "object", "properties": {
                  "command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"},
                  "timeout_ms": {"type": "number"}}, "required": ["command"], "additionalProperties": False}}


def codex_request(extra_input=()):
    """The shape Codex (codex-rs) posts each turn: instructions + developer/user items, stream on."""
    return {
        "model": "gpt-5-codex", "instructions": "You are Codex, a coding agent.",
        "input": [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "<permissions instructions>sandbox</permissions instructions>"}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context><cwd>/p</cwd></environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
            *extra_input],
        "tools": [SHELL_TOOL,
                  {"type": "custom", "name": "apply_patch", "description": "patch files",
                   "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
                  {"type": "web_search"}],
        "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199-abc",
        "text": {"verbosity": "medium"},
    }


def events_of(text):
    """Responses events, numbered 0, 1, 2… by `sequence_number`."""
    out = shared_events_of(text)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


async def test_codex_turn_streams_a_function_call(client, engine, constraints):
    engine.replies = ['<tool_call>{"name": "shell", "arguments": {"command": ["ls", "-la"]}}</tool_call>']
    resp = await client.post("/v1/responses", json=codex_request())
    assert resp.status == 200
    events = events_of(await resp.text())
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    item = events[5]["item"]
    assert item["type"] == "function_call" and item["name"] == "shell"
    assert json.loads(item["arguments"]) == {"command": ["ls", "-la"]}
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["output"] == [item]
    assert done["usage"]["input_tokens"] == len(engine.requests[0].prompt_tokens)
    assert done["usage"]["input_tokens_details"] == {"cached_tokens": 0}
    # Only the function tool is offered to the model; custom and built-in tools are skipped.
    assert [t["function"]["name"] for t in constraints.calls[0]["tools"]] == ["shell"]
    prompt = "".join(chr(t) for t in engine.requests[0].prompt_tokens)
    assert prompt.startswith("tools: ") and "system: You are Codex" in prompt
    assert "system: <permissions instructions>" in prompt


async def test_codex_follow_up_with_tool_output_streams_text(client, engine):
    engine.replies = ["There are two files."]
    follow = [{"type": "reasoning", "summary": [], "encrypted_content": None},
              {"type": "function_call", "name": "shell", "arguments": "{\"command\": [\"ls\"]}", "call_id": "call_9"},
              {"type": "function_call_output", "call_id": "call_9", "output": "a.txt\nb.txt"}]
    resp = await client.post("/v1/responses", json=codex_request(follow))
    events = events_of(await resp.text())
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "There are two files."
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    message = events[-1]["response"]["output"][0]
    assert message["content"][0]["text"] == "There are two files."
    prompt = "".join(chr(t) for t in engine.requests[0].prompt_tokens)
    assert "tool: a.txt\nb.txt" in prompt and '"command": ["ls"]' in prompt


async def test_non_streamed_response_and_length(client, engine):
    engine.replies = ["abcdefghij"]
    body = {"model": "m", "input": "hello", "max_output_tokens": 4}
    data = await (await client.post("/v1/responses", json=body)).json()
    assert data["object"] == "response" and data["status"] == "incomplete"
    assert data["incomplete_details"] == {"reason": "max_output_tokens"}
    assert data["output"][0]["content"][0]["text"] == "abcd" and data["output"][0]["status"] == "incomplete"
    body["stream"] = True
    engine.replies = ["abcdefghij"]
    events = events_of(await (await client.post("/v1/responses", json=body)).text())
    item = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert item["status"] == "incomplete" and events[-1]["type"] == "response.incomplete"


async def test_text_format_json_schema(client, engine, constraints):
    engine.replies = ['{"ok": true}']
    body = {"input": "x", "text": {"format": {"type": "json_schema", "name": "r",
                                               "schema": {"type": "object"}, "strict": True}}}
    data = await (await client.post("/v1/responses", json=body)).json()
    assert data["output"][0]["content"][0]["text"] == '{"ok": true}'
    assert constraints.calls[0]["json_schema"] == {"type": "object"}


@pytest.mark.parametrize("items, needle", [
    ([{"role": ["user"], "content": "hi"}], ".role"),
    ([{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": ["x"], "output": "ok"}],
     ".call_id"),
    ([{"role": "user", "content": "hi"}, {"type": "function_call", "call_id": {}, "name": "f"}], "`id`"),
    ([{"type": "mesage", "role": "user", "content": "hi"}], "'mesage'"),
    ([{"type": 5}], ".type"),
])
async def test_wrongly_typed_input_items_are_400s(client, items, needle):
    resp = await client.post("/v1/responses", json={"input": items})
    assert resp.status == 400 and needle in (await resp.json())["error"]["message"]


async def test_bad_input_is_a_400_before_streaming(client):
    resp = await client.post("/v1/responses", json={"input": 5, "stream": True})
    assert resp.status == 400 and "`input`" in (await resp.json())["error"]["message"]
    resp = await client.post("/v1/responses", json={"input": "hi", "previous_response_id": "resp_1"})
    assert resp.status == 400 and "whole conversation" in (await resp.json())["error"]["message"]
