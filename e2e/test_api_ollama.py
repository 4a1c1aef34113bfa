"""The official `ollama` client against a real daemon: chat (plain, streamed, tools),
generate, and the listing endpoints. Any model name is served by the loaded model."""

from __future__ import annotations

import json

import ollama
import pytest

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
OPTIONS = {"temperature": 0, "num_predict": 30}


@pytest.fixture(scope="module")
def client(locals_server):
    return ollama.Client(host=locals_server.url, timeout=300)


def test_chat_plain_and_streamed(client):
    question = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat(model="llama3.2", messages=question, options=OPTIONS)
    assert "Paris" in reply.message.content and reply.done
    assert reply.eval_count > 0 and reply.prompt_eval_count > 10
    parts = list(client.chat(model="qwen3:4b", messages=question, options=OPTIONS, stream=True))
    assert "Paris" in "".join(p.message.content for p in parts) and parts[-1].done


def test_tool_call(client):
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat(model="m", messages=question, tools=[WEATHER], options={"temperature": 0, "num_predict": 80})
    calls = first.message.tool_calls or []
    if not calls:
        pytest.skip("the model answered in text; Ollama's API has no tool_choice to require a call")
    assert calls[0].function.name == "get_weather" and "city" in calls[0].function.arguments


def test_tool_result_round_trip(client):
    # The history an Ollama client sends after running a call: the call, then its result.
    call = ollama.Message.ToolCall(function=ollama.Message.ToolCall.Function(
        name="get_weather", arguments={"city": "Paris"}))
    messages = [{"role": "user", "content": "What is the weather in Paris?"},
                ollama.Message(role="assistant", content="", tool_calls=[call]),
                {"role": "tool", "content": "Sunny, 24 C", "tool_name": "get_weather"}]
    reply = client.chat(model="m", messages=messages, tools=[WEATHER], options=OPTIONS)
    assert reply.done and (reply.message.content or reply.message.tool_calls)
    assert reply.prompt_eval_count > 100  # the call and its result reached the prompt


def test_generate_and_format(client):
    reply = client.generate(model="m", prompt="What is the capital of France?", options=OPTIONS)
    assert "Paris" in reply.response
    reply = client.chat(model="m", format="json", options={"temperature": 0, "num_predict": 60},
                        messages=[{"role": "user", "content": "Give a JSON object with a key city."}])
    assert isinstance(json.loads(reply.message.content), dict)


def test_listing(client):
    assert client.list().models[0].model == "smollm2:latest"
    assert "tools" in client.show("anything").capabilities
    assert client.ps().models[0].model == "smollm2:latest"
