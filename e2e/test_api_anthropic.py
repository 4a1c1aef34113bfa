"""The official `anthropic` client against a real daemon: messages (plain, streamed, beta),
a tool_use round trip, count_tokens and usage figures."""

from __future__ import annotations

import anthropic
import pytest

pytestmark = pytest.mark.slow

WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(locals_server):
    return anthropic.Anthropic(base_url=locals_server.url, api_key="local", max_retries=0, timeout=300)


def test_plain_message_with_usage(client):
    reply = client.messages.create(model="any-model", max_tokens=30, extra_body={"temperature": 0},
                                   system="You answer in one short sentence.",
                                   messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in reply.content[0].text
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert reply.usage.input_tokens > 10 and reply.usage.output_tokens > 0


def test_streamed_message(client):
    with client.messages.stream(model="any-model", max_tokens=30, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "What is the capital of France?"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert "Paris" in text and final.usage.output_tokens > 0


def test_beta_stream_like_claude_code(client):
    # client.beta sends ?beta=true and the anthropic-beta header, as Claude Code does.
    with client.beta.messages.stream(
            model="any-model", max_tokens=30, extra_body={"temperature": 0}, betas=["interleaved-thinking-2025-05-14"],
            system=[{"type": "text", "text": "You are a helpful assistant.", "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}],
            metadata={"user_id": "user_1"}) as stream:
        text = "".join(stream.text_stream)
    assert "Paris" in text


def test_tool_use_round_trip(client):
    first = client.messages.create(model="m", max_tokens=80, extra_body={"temperature": 0}, messages=QUESTION, tools=[WEATHER],
                                   tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input["city"], str)
    messages = QUESTION + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}]}]
    second = client.messages.create(model="m", max_tokens=40, extra_body={"temperature": 0}, messages=messages, tools=[WEATHER],
                                    tool_choice={"type": "none"})
    assert second.content and second.content[0].type == "text"
    assert second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0) > first.usage.input_tokens


def test_count_tokens(client):
    counted = client.messages.count_tokens(model="m", messages=QUESTION, tools=[WEATHER])
    assert counted.input_tokens > 20
