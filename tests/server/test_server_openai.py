"""OpenAI Chat Completions, Completions and Models on a scripted engine."""

from __future__ import annotations

import json

import pytest

from locals.server.state import STATE
from tests.helpers.server_fakes import client, constraints, engine  # noqa: F401 (shared fixtures)
from tests.helpers.server_fakes import sse_events


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


async def chat(client, **body):
    body.setdefault("model", "anything")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return await client.post("/v1/chat/completions", json=body)


async def test_plain_reply_with_usage(client, engine):
    engine.replies = ["The capital of France is Paris."]
    engine.cached = 3
    resp = await chat(client, temperature=0.2, seed=7, top_p=0.9, unknown_field={"x": 1})
    assert resp.status == 200
    data = await resp.json()
    assert data["object"] == "chat.completion" and data["model"] == "anything"
    choice = data["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "The capital of France is Paris."}
    assert choice["finish_reason"] == "stop"
    usage = data["usage"]
    prompt_len = len(engine.requests[0].prompt_tokens)
    assert usage["prompt_tokens"] == prompt_len and usage["completion_tokens"] == 31
    assert usage["total_tokens"] == prompt_len + 31
    assert usage["prompt_tokens_details"]["cached_tokens"] == 3
    sampling = engine.requests[0].sampling
    assert (sampling.temperature, sampling.seed, sampling.top_p) == (0.2, 7, 0.9)


async def test_stream_with_usage_chunk(client, engine):
    engine.replies = ["Hello from the stream."]
    resp = await chat(client, stream=True, stream_options={"include_usage": True})
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    events = [data for _, data in sse_events(await resp.text())]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hello from the stream."
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finals] == ["stop"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 22


async def test_tool_call_reply_is_parsed_and_constrained(client, engine, constraints):
    engine.replies = ["\n" + CALL]  # the newline before a forced call is not a reply
    resp = await chat(client, tools=TOOLS, tool_choice="auto")
    data = await resp.json()
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert choice["message"]["content"] is None
    assert constraints.calls[0]["tools"][0]["function"]["name"] == "get_weather"
    assert constraints.calls[0]["tool_choice"] == "auto"


async def test_streamed_tool_call_holds_back_markup(client, engine):
    engine.replies = ["Let me check. " + CALL]
    resp = await chat(client, tools=TOOLS, stream=True)
    chunks = [json.loads(d) for _, d in sse_events(await resp.text())[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    text = "".join(d.get("content", "") for d in deltas)
    assert text == "Let me check."  # the space before the call separates, it is not the reply's
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert len(calls) == 1 and calls[0]["index"] == 0 and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_tool_result_round_trip_reaches_the_prompt(client, engine):
    engine.replies = ["It is sunny in Paris."]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ]
    resp = await chat(client, messages=messages, tools=TOOLS)
    data = await resp.json()
    assert data["choices"][0]["message"]["content"] == "It is sunny in Paris."
    prompt = "".join(chr(t) for t in engine.requests[0].prompt_tokens)
    assert "tool: sunny, 21C" in prompt and '"city": "Paris"' in prompt and "get_weather" in prompt


async def test_tool_choice_none_leaves_text_alone(client, engine, constraints):
    engine.replies = [CALL]
    data = await (await chat(client, tools=TOOLS, tool_choice="none")).json()
    assert data["choices"][0]["message"]["content"] == CALL
    assert constraints.calls == []


@pytest.mark.parametrize("fmt, schema, strict", [
    ({"type": "json_object"}, {"type": "object"}, False),
    ({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {
        "a": {"type": "integer"}}}}}, {"type": "object", "properties": {"a": {"type": "integer"}}}, False),
    ({"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": {"type": "object"}}},
     {"type": "object"}, True),
])
async def test_response_format_builds_a_schema_constraint(client, engine, constraints, fmt, schema, strict):
    engine.replies = ['{"a": 1}']
    data = await (await chat(client, response_format=fmt)).json()
    assert data["choices"][0]["message"]["content"] == '{"a": 1}'
    assert constraints.calls[0]["json_schema"] == schema and engine.requests[0].constraint is not None
    assert constraints.calls[0]["strict_schema"] is strict


async def test_stop_and_max_tokens(client, engine):
    engine.replies = ["one two three four", "abcdefghijkl"]
    data = await (await chat(client, stop="three")).json()
    assert data["choices"][0]["message"]["content"] == "one two "
    assert engine.requests[0].sampling.stop == ["three"]
    data = await (await chat(client, max_completion_tokens=6)).json()
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["choices"][0]["message"]["content"] == "abcdef"


async def test_logprobs(client, engine):
    engine.replies = ["ab"]
    data = await (await chat(client, logprobs=True, top_logprobs=2)).json()
    content = data["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["a", "b"]
    assert content[0]["logprob"] == -0.5 and len(content[0]["top_logprobs"]) == 2
    assert engine.requests[0].sampling.top_logprobs == 2


async def test_completions_plain_and_streamed(client, engine):
    engine.replies = ["and so on", "streamed text"]
    resp = await client.post("/v1/completions", json={"model": "x", "prompt": "Once upon", "max_tokens": 20})
    data = await resp.json()
    assert data["object"] == "text_completion" and data["choices"][0]["text"] == "and so on"
    assert "".join(chr(t) for t in engine.requests[0].prompt_tokens) == "Once upon"
    assert engine.requests[0].meta["raw"]  # continued as is: the engine keeps a leading space
    resp = await client.post("/v1/completions", json={"prompt": ["Once"], "stream": True})
    events = sse_events(await resp.text())
    assert events[-1][1] == "[DONE]"
    text = "".join(json.loads(d)["choices"][0]["text"] for _, d in events[:-1])
    assert text == "streamed text"


async def test_completions_logprobs_plain_and_streamed(client, engine):
    engine.replies = ["ab", "ab"]
    plain = (await (await client.post("/v1/completions", json={"prompt": "x", "logprobs": 2})).json())
    resp = await client.post("/v1/completions", json={"prompt": "x", "logprobs": 2, "stream": True})
    chunks = [json.loads(d)["choices"][0] for _, d in sse_events(await resp.text())[:-1]]
    streamed = [c["logprobs"] for c in chunks if c["text"]]
    assert plain["choices"][0]["logprobs"]["tokens"] == ["a", "b"]
    assert [t for lp in streamed for t in lp["tokens"]] == ["a", "b"]
    assert [p for lp in streamed for p in lp["token_logprobs"]] == plain["choices"][0]["logprobs"]["token_logprobs"]


async def test_a_failed_generation_is_an_error_in_every_stream(client, engine):
    async def fails(request):
        from locals.protocol import FinishEvent, Usage
        yield FinishEvent(request.id, "error", Usage(len(request.prompt_tokens)), error="the engine failed (a bug)")

    engine.stream = fails
    for path, body in (("/v1/completions", {"prompt": "Once", "stream": True}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True})):
        events = sse_events(await (await client.post(path, json=body)).text())
        errors = [json.loads(d)["error"] for _, d in events if d != "[DONE]" and "error" in json.loads(d)]
        assert errors and "a bug" in errors[0]["message"], (path, events)
        assert not any('"finish_reason": "stop"' in d for _, d in events)


async def test_models_lists_the_loaded_model(client):
    data = await (await client.get("/v1/models")).json()
    ids = [m["id"] for m in data["data"]]
    assert ids == ["locals/fake", "fake", "test/fake-model"] and data["object"] == "list"
    client.server.app[STATE].backend.loaded.model_id = "/home/me/models/fake"  # weights from a folder
    ids = [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]]
    assert ids == ["locals/fake", "fake"]  # a path is no name to pick
    client.server.app[STATE].backend.loaded.editor_name = "locals/fake-1b"  # an alias's editor name
    ids = [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]]
    assert ids == ["locals/fake", "locals/fake-1b", "fake"]  # as `locals models` shows it
    one = await (await client.get("/v1/models/locals/fake")).json()
    assert one["id"] == "locals/fake" and one["object"] == "model"


@pytest.mark.parametrize("body, needle", [
    ({"messages": "hi"}, "`messages`"),
    ({"messages": []}, "`messages`"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "`temperature`"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "`n`"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 5}, "`top_p`"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "no `tools`"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": "f"}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": [1], "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "`id`"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]}, "tool_call_id"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "`max_tokens`"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "`max_completion_tokens`"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1, "stream": True}, "`temperature`"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]}, "name"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "text only"),
    ({"messages": [{"role": "user", "content": [{"type": "weird", "text": "x"}]}]}, "'weird'"),
    ({"messages": [{"role": "user"}]}, "content is required"),
    ({"messages": [{"role": "user", "content": [{"type": "foo"}]}]}, "'foo'"),
    ({"messages": [{"role": "user", "content": [{"type": [], "text": "x"}]}]}, "`type`"),
    ({"messages": [{"role": "user", "content": "x"}], "truncation": {}}, "`truncation`"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}]}, 'of type "object"'),
    # Fields that would change the reply but are not applied: refused, not ignored; zeros pass (below).
    ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": "x"}, "`presence_penalty`"),
    ({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 5}, "between -2 and 2"),
    ({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 0.5}, "not supported"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"50256": -100}}, "`logit_bias`"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": "x"}, "`logit_bias`"),
])
async def test_bad_requests_get_openai_error_bodies(client, body, needle):
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error" and needle in error["message"]
    assert (await client.get("/health")).status == 200


async def test_bad_json_and_unknown_route(client):
    resp = await client.post("/v1/chat/completions", data=b"{not json",
                             headers={"Content-Type": "application/json"})
    assert resp.status == 400 and "not valid JSON" in (await resp.json())["error"]["message"]
    resp = await client.get("/v1/nothing-here")
    error = (await resp.json())["error"]
    assert resp.status == 404 and "no such endpoint" in error["message"] and error["type"] == "invalid_request_error"
    resp = await client.get("/v1/chat/completions")
    assert resp.status == 405 and (await resp.json())["error"]["type"] == "invalid_request_error"
    assert "POST" in resp.headers["Allow"]


async def test_a_request_that_can_never_fit_is_a_413(client, engine):
    async def never_fits(request):
        from locals.protocol import FinishEvent, Usage
        yield FinishEvent(request.id, "memory", Usage(len(request.prompt_tokens)), error="needs 9 GB of KV, budget 2 GB")

    engine.stream = never_fits
    resp = await chat(client)
    assert resp.status == 413 and "9 GB" in (await resp.json())["error"]["message"]


async def test_prompt_longer_than_the_context_is_a_400(client):
    resp = await chat(client, messages=[{"role": "user", "content": "x" * 9000}])
    assert resp.status == 400 and "context" in (await resp.json())["error"]["message"]


async def test_neutral_sampling_fields_pass(client, engine):
    engine.replies = ["ok"]
    body = {"messages": [{"role": "user", "content": "x"}], "presence_penalty": 0, "frequency_penalty": 0.0,
            "logit_bias": {}}
    assert (await client.post("/v1/chat/completions", json=body)).status == 200


@pytest.mark.parametrize("field, needle", [
    ({"echo": True}, "`echo`"), ({"suffix": "}"}, "`suffix`"), ({"best_of": 3}, "`best_of`"),
    ({"logprobs": -3}, "`logprobs` must be between"),
])
async def test_completions_refuse_what_they_would_not_do(client, field, needle):
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, **field})
    assert resp.status == 400 and needle in (await resp.json())["error"]["message"]
