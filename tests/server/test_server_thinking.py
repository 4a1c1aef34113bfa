"""A thinking model's reasoning split from its answer, in each API's own field."""

from __future__ import annotations

import json

import pytest

from locals.server.thinking import ThinkMarkers, Thinking, ThinkingSplitter

from tests.helpers.server_fakes import CharTokenizer, ScriptedEngine, events_of, make_state, start_client

MARKERS = ThinkMarkers("<think>", "</think>")
REPLY = "<think>\nThe user wants the capital.\n</think>\n\nParis."
CALL = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
ASK = [{"role": "user", "content": "Capital of France?"}]


def split(pieces, open_in_prompt=False):
    splitter = ThinkingSplitter(MARKERS, open_in_prompt)
    out = [p for piece in pieces for p in splitter.feed(piece)] + splitter.finish()
    thought = "".join(p.text for p in out if isinstance(p, Thinking))
    return thought, "".join(p for p in out if isinstance(p, str))


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_markers_split_anywhere_across_pieces(size):
    pieces = [REPLY[i:i + size] for i in range(0, len(REPLY), size)]
    assert split(pieces) == ("\nThe user wants the capital.\n", "Paris.")


def test_a_block_the_template_opened_and_replies_without_one():
    assert split(["I weigh it.</think>\n\nDone."], open_in_prompt=True) == ("I weigh it.", "Done.")
    assert split(["Paris. <think>not a block</think>"]) == ("", "Paris. <think>not a block</think>")
    assert split(["\n<think>cut off"]) == ("cut off", "")  # never closed: all thinking
    assert ThinkingSplitter.opens_in("<|im_start|>assistant\n<think>\n", MARKERS)
    assert not ThinkingSplitter.opens_in("<think>\n\n</think>\n\n", MARKERS)


class ThinkingTokenizer(CharTokenizer):
    has_thinking, think_start, think_end = True, "<think>", "</think>"


async def _serve(named_thinking: bool):
    engine = ScriptedEngine()
    state = make_state(engine)
    state.backend.loaded.tokenizer = ThinkingTokenizer()
    state.backend.loaded.thinking = named_thinking
    return await start_client(state), engine


@pytest.fixture
async def served():
    client, engine = await _serve(named_thinking=True)
    yield client, engine
    await client.close()


async def test_openai_gives_reasoning_content(served):
    client, engine = served
    engine.replies = [REPLY, REPLY]
    message = (await (await client.post("/v1/chat/completions", json={"messages": ASK})).json())["choices"][0]["message"]
    assert message["content"] == "Paris." and message["reasoning_content"].strip() == "The user wants the capital."
    resp = await client.post("/v1/chat/completions", json={"messages": ASK, "stream": True})
    chunks = [json.loads(c) for c in (await resp.text()).split("data: ")[1:] if not c.startswith("[DONE]")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas).strip() == "The user wants the capital."
    assert "".join(d.get("content", "") for d in deltas) == "Paris."


async def test_anthropic_gives_a_thinking_block_then_the_call(served):
    client, engine = served
    engine.replies = ["<think>read it first</think>" + CALL]
    resp = await client.post("/v1/messages", json={
        "max_tokens": 500, "stream": True, "messages": ASK,
        "tools": [{"name": "read_file", "input_schema": TOOLS[0]["function"]["parameters"]}]})
    events = events_of(await resp.text())
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "tool_use"]
    thought = "".join(e["delta"]["thinking"] for e in events if e.get("delta", {}).get("type") == "thinking_delta")
    assert thought == "read it first" and starts[1]["name"] == "read_file"


async def test_ollama_and_responses_give_their_own_fields(served):
    client, engine = served
    engine.replies = [REPLY, REPLY]
    chat = await (await client.post("/api/chat", json={"messages": ASK, "stream": False})).json()
    assert chat["message"]["content"] == "Paris." and "capital" in chat["message"]["thinking"]
    response = await (await client.post("/v1/responses", json={"input": "Capital of France?"})).json()
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
    assert "capital" in response["output"][0]["content"][0]["text"]
    assert response["output"][1]["content"][0]["text"] == "Paris."


async def test_a_raw_prompt_keeps_the_markers(served):
    client, engine = served
    engine.replies = [REPLY]
    data = await (await client.post("/v1/completions", json={"prompt": "Q: capital?\nA:"})).json()
    assert data["choices"][0]["text"] == REPLY


async def test_responses_stream_a_reasoning_item_before_the_message(served):
    client, engine = served
    engine.replies = [REPLY]
    events = events_of(await (await client.post("/v1/responses", json={"input": "Capital?", "stream": True})).text())
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [item["type"] for item in done] == ["reasoning", "message"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert deltas.strip() == "The user wants the capital." == done[0]["content"][0]["text"].strip()
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def _prompt(engine) -> str:
    return "".join(chr(t) for t in engine.requests[-1].prompt_tokens)


@pytest.mark.parametrize("path, switch, on", [
    ("/v1/chat/completions", {"chat_template_kwargs": {"enable_thinking": True}}, True),
    ("/v1/chat/completions", {"reasoning_effort": "high"}, True),
    ("/v1/chat/completions", {"reasoning_effort": "none"}, False),
    ("/v1/responses", {"reasoning": {"effort": "low", "summary": "auto"}}, True),
    ("/v1/responses", {"reasoning": {"summary": "auto"}}, None),  # Codex on a model it does not know
    ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 2048}}, True),
    ("/v1/messages", {"thinking": {"type": "disabled"}}, False),
    ("/v1/messages", {"thinking": {"type": "adaptive", "display": "omitted"}}, None),  # Claude Code's default
    ("/api/chat", {"think": True}, True),
    ("/api/chat", {"think": "medium"}, True),
    ("/api/chat", {"think": False}, False),
])
async def test_each_apis_own_switch_reaches_the_template(served, path, switch, on):
    client, engine = served
    key = "input" if path == "/v1/responses" else "messages"
    body = {key: ASK, "max_tokens": 50, "stream": False, **switch}
    resp = await client.post(path, json=body)
    assert resp.status == 200, await resp.text()
    said = _prompt(engine).splitlines()[0]
    assert said == f"thinking: {on}" if on is not None else not said.startswith("thinking:")


async def test_a_request_turns_thinking_on_for_a_model_named_without_it():
    client, engine = await _serve(named_thinking=False)  # `qwen`, not `qwen-thinking`
    try:
        engine.replies = [REPLY, REPLY]
        plain = (await (await client.post("/v1/chat/completions", json={"messages": ASK})).json())["choices"][0]
        assert plain["message"]["content"] == REPLY and "reasoning_content" not in plain["message"]
        asked = await client.post("/v1/chat/completions", json={
            "messages": ASK, "chat_template_kwargs": {"enable_thinking": True}})
        message = (await asked.json())["choices"][0]["message"]
        assert message["content"] == "Paris." and message["reasoning_content"].strip() == "The user wants the capital."
    finally:
        await client.close()


@pytest.mark.parametrize("path, switch, words", [
    ("/v1/chat/completions", {"chat_template_kwargs": {"enable_thinking": "yes"}}, "enable_thinking"),
    ("/v1/chat/completions", {"chat_template_kwargs": {"reasoning_budget": 10}}, "enable_thinking` only"),
    ("/v1/chat/completions", {"reasoning_effort": "extreme"}, "reasoning_effort"),
    ("/v1/messages", {"thinking": {"type": "on"}}, "thinking.type"),
    ("/api/chat", {"think": "hard"}, "think"),
])
async def test_a_malformed_switch_is_a_400_naming_it(served, path, switch, words):
    client, _ = served
    resp = await client.post(path, json={"messages": ASK, "max_tokens": 50, "stream": False, **switch})
    assert resp.status == 400 and words in await resp.text()


async def test_ollama_refuses_think_on_a_model_that_cannot_and_the_others_ignore_it():
    engine = ScriptedEngine()
    client = await start_client(make_state(engine))  # CharTokenizer: no thinking markers
    try:
        resp = await client.post("/api/chat", json={"messages": ASK, "stream": False, "think": True})
        assert resp.status == 400 and "does not support thinking" in await resp.text()
        assert (await client.post("/api/chat", json={"messages": ASK, "stream": False, "think": False})).status == 200
        resp = await client.post("/v1/chat/completions", json={
            "messages": ASK, "chat_template_kwargs": {"enable_thinking": True}})
        assert resp.status == 200 and not _prompt(engine).startswith("thinking:")
    finally:
        await client.close()
