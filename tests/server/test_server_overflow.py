"""The overflow policy: a conversation past the model's context is refused (the default, naming
the policy) or trimmed (oldest tool results first, then old exchanges), through each API."""

from __future__ import annotations

import logging
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from locals.server import overflow

from tests.helpers.server_fakes import CharTokenizer, ScriptedEngine, make_state, render, start_client

CONTEXT = 4000  # characters: the fake model has one token per character
TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {}}}}]


def agent_session(results: int, size: int = 700) -> list[dict]:
    """A system prompt, one task, then `results` rounds of a `read` call and its result."""
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix the bug in calc.py."}]
    for i in range(results):
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": f'{{"path": "f{i}.py"}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"<result {i}>" + "x" * size})
    return messages


@pytest.fixture
async def served():
    """(client, engine, state) on a fake model with a CONTEXT-token window."""
    engine = ScriptedEngine()
    state = make_state(engine)
    state.backend.loaded.context_length = CONTEXT
    client = await start_client(state)
    yield client, engine, state
    await client.close()


def prompt_of(engine) -> str:
    return CharTokenizer().decode(engine.requests[-1].prompt_tokens)


async def test_refuse_is_the_default_and_the_400_names_the_policy(served):
    client, engine, _ = served
    resp = await client.post("/v1/chat/completions", json={"messages": agent_session(8), "tools": TOOLS})
    error = (await resp.json())["error"]
    message = error["message"]
    assert resp.status == 400 and not engine.requests
    # OpenAI's wording and code, which OpenCode, Codex and litellm read as "compact and retry"
    assert error["code"] == "context_length_exceeded"
    assert re.match(rf"This model's maximum context length is {CONTEXT} tokens\. However, your messages "
                    r"resulted in \d+ tokens", message)
    assert "overflow policy is `refuse`" in message and "--overflow trim" in message and '"truncation": "auto"' in message


async def test_the_refusal_in_anthropic_and_ollama_wording(served):
    client, _, _ = served
    resp = await client.post("/v1/messages", json={
        "max_tokens": 100, "messages": [{"role": "user", "content": "x" * (CONTEXT + 10)}]})
    body = await resp.json()
    assert resp.status == 400 and body["error"]["type"] == "invalid_request_error"
    assert re.match(rf"prompt is too long: \d+ tokens > {CONTEXT} maximum; ", body["error"]["message"])
    resp = await client.post("/api/chat", json={"messages": [{"role": "user", "content": "x" * (CONTEXT + 10)}]})
    assert resp.status == 400 and "maximum context length is" in (await resp.json())["error"]


async def test_a_raw_prompt_past_the_context_is_refused_without_a_trim_hint(served):
    client, engine, _ = served
    resp = await client.post("/v1/completions", json={"prompt": "x" * (CONTEXT + 10), "truncation": "auto"})
    message = (await resp.json())["error"]["message"]
    assert resp.status == 400 and not engine.requests
    assert "never trimmed" in message and "truncation" not in message and "--overflow" not in message


async def test_trim_stubs_the_oldest_tool_results_and_keeps_the_rest(served, caplog):
    client, engine, _ = served
    with caplog.at_level(logging.WARNING, logger="locals.server.backend"):
        resp = await client.post("/v1/chat/completions", json={
            "messages": agent_session(8), "tools": TOOLS, "truncation": "auto"})
    assert resp.status == 200
    prompt = prompt_of(engine)
    assert len(engine.requests[-1].prompt_tokens) <= overflow.TRIM_TO * CONTEXT
    assert prompt.startswith("tools: ") and "system: You are a coding agent." in prompt
    assert "user: Fix the bug in calc.py." in prompt
    kept = [i for i in range(8) if f"<result {i}>" in prompt]
    assert kept == list(range(8 - len(kept), 8)) and len(kept) >= 1  # the newest ones, in order
    assert prompt.count(f"to fit the model's {CONTEXT}-token context]") == 8 - len(kept)
    assert prompt.count('"name": "read"') >= 8  # every call stays; only old results' text went
    assert "overflow policy trim" in caplog.text and "tool result of read #3" in caplog.text


async def test_the_server_setting_trims_and_a_request_can_refuse(served):
    client, engine, state = served
    state.backend.overflow = "trim"
    resp = await client.post("/v1/chat/completions", json={"messages": agent_session(8), "tools": TOOLS})
    assert resp.status == 200 and "<result 0>" not in prompt_of(engine)
    resp = await client.post("/v1/chat/completions", json={
        "messages": agent_session(8), "tools": TOOLS, "truncation": "disabled"})
    assert resp.status == 400 and "overflow policy is `refuse`" in (await resp.json())["error"]["message"]


async def test_a_prompt_that_fits_is_never_trimmed(served):
    client, engine, _ = served
    resp = await client.post("/v1/chat/completions", json={
        "messages": agent_session(3), "tools": TOOLS, "truncation": "auto", "max_tokens": 100})
    assert resp.status == 200 and all(f"<result {i}>" in prompt_of(engine) for i in range(3))


async def test_without_tool_results_old_exchanges_go_whole(served):
    client, engine, _ = served
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(10):
        messages += [{"role": "user", "content": f"<question {i}>" + "q" * 300},
                     {"role": "assistant", "content": f"<answer {i}>" + "a" * 300}]
    messages.append({"role": "user", "content": "And now?"})
    resp = await client.post("/v1/chat/completions", json={"messages": messages, "truncation": "auto"})
    assert resp.status == 200
    prompt = prompt_of(engine)
    assert "system: Be brief." in prompt and prompt.endswith("user: And now?\nassistant:")
    assert "<question 0>" not in prompt and "<answer 9>" in prompt
    assert "earlier messages to fit the model's" in prompt


async def test_what_cannot_fit_even_trimmed_is_a_400_naming_a_larger_model(served):
    client, _, _ = served
    messages = [{"role": "system", "content": "s" * (CONTEXT + 10)}, {"role": "user", "content": "hi"}]
    resp = await client.post("/v1/chat/completions", json={"messages": messages, "truncation": "auto"})
    message = (await resp.json())["error"]["message"]
    assert resp.status == 400 and "overflow policy `trim`" in message and "--model qwen" in message


async def test_a_bad_truncation_value_is_a_400(served):
    client, _, _ = served
    resp = await client.post("/v1/chat/completions", json={"messages": agent_session(1), "truncation": "yes"})
    assert resp.status == 400 and "`truncation`" in (await resp.json())["error"]["message"]


LONG_TURNS = [{"role": "user", "content": f"<old {i}>" + "z" * 900} for i in range(5)]


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"max_tokens": 50, "messages": [
        {"role": "user", "content": "<old 0>" + "z" * 2000}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "<old 1>" + "z" * 2000}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "last"}]}),
    ("/api/chat", {"stream": False, "messages": [
        {"role": "user", "content": "<old 0>" + "z" * 2000}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "<old 1>" + "z" * 2000}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "last"}]}),
    ("/v1/responses", {"input": [
        {"role": "user", "content": "<old 0>" + "z" * 2000}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "<old 1>" + "z" * 2000}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "last"}]}),
])
async def test_every_chat_api_takes_the_truncation_field(served, path, body):
    client, engine, _ = served
    resp = await client.post(path, json={"model": "fake", **body})
    assert resp.status == 400
    resp = await client.post(path, json={"model": "fake", "truncation": "auto", **body})
    assert resp.status == 200 and "<old 0>" not in prompt_of(engine) and "last" in prompt_of(engine)


def _conversation(shape: list[tuple[str, int]]) -> list[dict]:
    """Messages from (kind, size) pairs: "u" user, "a" assistant text, "c" a call plus its result."""
    messages = [{"role": "system", "content": "sys"}]
    for i, (kind, size) in enumerate(shape):
        if kind == "c":
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": str(i), "type": "function", "function": {"name": "read", "arguments": {"path": str(i)}}}]})
            messages.append({"role": "tool", "tool_call_id": str(i), "name": "read", "content": "r" * size})
        else:
            messages.append({"role": "user" if kind == "u" else "assistant", "content": kind * size})
    return messages


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("uac"), st.integers(0, 900)), min_size=1, max_size=14),
       st.integers(300, 3000))
def test_trimming_keeps_what_it_promises(shape, context):
    messages = _conversation(shape)

    def encode(ms):
        return CharTokenizer().encode(render(None, ms))

    fitted = overflow.fit(messages, encode, len, context)
    out, kept = fitted.messages, overflow._kept(messages)
    assert out[0] == messages[0]  # the system prompt
    assert out[-1]["content"].endswith(messages[-1]["content"])  # the newest message (maybe after a note)
    for before, message in zip(out, out[1:]):  # a tool result still follows its call
        if message["role"] == "tool":
            assert before["role"] in ("assistant", "tool")
    assert fitted.tokens == encode(out)
    if len(fitted.tokens) > overflow.TRIM_TO * context:  # over the target only when nothing more may go
        dropped = {d.index for d in fitted.dropped}
        assert all(i in dropped for i in range(len(messages)) if i not in kept)


def long_tools(count: int, usage: int) -> list[dict]:
    """Tools whose descriptions are a first paragraph and `usage` characters of notes after it."""
    return [{"type": "function", "function": {
        "name": f"tool{i}", "description": f"Does thing {i}.\n\nUsage notes: " + "n" * usage,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}} for i in range(count)]


def test_briefed_keeps_first_paragraphs_and_says_when_nothing_is_cut():
    tools = long_tools(2, 10) + TOOLS
    brief = overflow.briefed(tools)
    assert [t["function"]["description"] for t in brief] == ["Does thing 0.", "Does thing 1.", "Read a file"]
    assert brief[0]["function"]["parameters"] == tools[0]["function"]["parameters"]  # schemas untouched
    assert tools[0]["function"]["description"].startswith("Does thing 0.\n\n")  # the request's own copy kept
    assert overflow.briefed(TOOLS) is None


async def test_tools_that_push_a_prompt_past_the_window_are_briefed_before_any_policy(served, caplog):
    """Claude Code's 21 tools take ~16k tokens of a 16k window, most of it usage notes: under the
    default policy the request is served with the descriptions' first paragraphs, logged, and the
    conversation untouched; a prompt that fits keeps its tools whole."""
    client, engine, _ = served
    messages = agent_session(2)
    with caplog.at_level(logging.WARNING, logger="locals.server.backend"):
        resp = await client.post("/v1/chat/completions", json={"messages": messages, "tools": long_tools(6, 700)})
    assert resp.status == 200, await resp.text()
    prompt = prompt_of(engine)
    assert "Does thing 5." in prompt and "Usage notes" not in prompt and "<result 0>" + "x" * 700 in prompt
    assert "cut to their first paragraph" in caplog.text
    resp = await client.post("/v1/chat/completions", json={"messages": messages, "tools": long_tools(1, 700)})
    assert resp.status == 200 and "Usage notes" in prompt_of(engine)
