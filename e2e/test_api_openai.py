"""The official `openai` client against a real daemon: chat (plain, streamed, tools), completions,
models and the Responses API, with usage figures."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(locals_server):
    return openai.OpenAI(base_url=locals_server.openai_url, api_key="local", max_retries=0, timeout=300)


def test_plain_chat_with_usage(client):
    reply = client.chat.completions.create(
        model="anything", temperature=0, max_tokens=30,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage.prompt_tokens > 10 and 0 < usage.completion_tokens <= 30
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_streamed_chat_with_usage(client):
    stream = client.chat.completions.create(
        model="anything", temperature=0, max_tokens=30, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].usage.completion_tokens > 0 and not chunks[-1].choices


def test_tool_call_round_trip(client):
    first = client.chat.completions.create(model="m", temperature=0, max_tokens=80, messages=QUESTION,
                                           tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    messages = QUESTION + [choice.message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"}]
    second = client.chat.completions.create(model="m", temperature=0, max_tokens=40, messages=messages,
                                            tools=[WEATHER], tool_choice="none")
    assert second.choices[0].message.content
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_streamed_tool_call(client):
    stream = client.chat.completions.create(model="m", temperature=0, max_tokens=80, messages=QUESTION,
                                            tools=[WEATHER], tool_choice="required", stream=True)
    calls = [tc for c in stream if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather"
    assert "city" in json.loads(calls[0].function.arguments)


def test_json_schema_response_format(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"]}
    reply = client.chat.completions.create(
        model="m", temperature=0, max_tokens=60,
        messages=[{"role": "user", "content": "Name a city and its country as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    data = json.loads(reply.choices[0].message.content)
    assert set(data) == {"city", "country"}


def test_completions_and_models(client):
    reply = client.completions.create(model="m", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert reply.choices[0].text and reply.usage.completion_tokens > 0
    assert reply.choices[0].text.startswith(" ")  # " Paris": the continuation keeps its leading space
    ids = [m.id for m in client.models.list().data]
    assert "locals/smollm2" in ids and client.models.retrieve("locals/smollm2").id == "locals/smollm2"


def test_responses_streaming(client):
    stream = client.responses.create(model="m", input="What is the capital of France?",
                                     max_output_tokens=30, temperature=0, stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert "Paris" in text
    assert events[-1].response.output[0].content[0].text == text
    assert events[-1].response.usage.output_tokens > 0


def test_responses_function_call(client):
    tool = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
            "parameters": WEATHER["function"]["parameters"]}
    reply = client.responses.create(model="m", input="What is the weather in Paris?", tools=[tool],
                                    tool_choice="required", max_output_tokens=80, temperature=0)
    calls = [item for item in reply.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments)
