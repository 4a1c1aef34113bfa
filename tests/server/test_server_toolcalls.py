"""Splitting streamed model text into text and tool calls with mlx-lm's parsers."""

from __future__ import annotations

import json
from types import SimpleNamespace

from locals.server.toolcalls import ToolCall, ToolCallSplitter, tool_format_of


def hermes():
    # A model whose template has no tools (like the embedded SmolLM2): the format comes by name.
    return tool_format_of(SimpleNamespace(tokenizer=SimpleNamespace(), tool_format="json_tools"))


def feed_all(splitter, pieces):
    out = []
    for piece in pieces:
        out += splitter.feed(piece)
    return out + splitter.finish()


def test_marker_split_across_pieces_is_held_back():
    splitter = ToolCallSplitter(hermes())
    pieces = ["Sure. <to", "ol_c", 'all>{"name": "f", "argu', 'ments": {"x": 1}}</tool', "_call> done"]
    out = feed_all(splitter, pieces)
    assert "".join(p for p in out if isinstance(p, str)) == "Sure. done"
    (call,) = [p for p in out if isinstance(p, ToolCall)]
    assert (call.name, call.arguments) == ("f", {"x": 1}) and call.id.startswith("call_")
    assert not any("<" in p for p in out if isinstance(p, str))


def test_text_that_only_looks_like_a_marker_is_released():
    out = feed_all(ToolCallSplitter(hermes()), ["a < b and <t", "able>"])
    assert "".join(out) == "a < b and <table>"


def test_unparsable_call_stays_text_and_unclosed_call_is_parsed_at_the_end():
    out = feed_all(ToolCallSplitter(hermes()), ["<tool_call>not json</tool_call>"])
    assert out == ["<tool_call>not json</tool_call>"]
    out = feed_all(ToolCallSplitter(hermes()), ['<tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}'])
    assert isinstance(out[0], ToolCall) and out[0].arguments == {"y": 2}


def test_no_format_means_plain_text():
    assert feed_all(ToolCallSplitter(None), ["<tool_call>{}</tool_call>"]) == ["<tool_call>{}</tool_call>"]


def test_tokenizer_parser_wins():
    tok = SimpleNamespace(tool_call_start="[CALL]", tool_call_end="[/CALL]",
                          tool_parser=lambda text, tools: {"name": text.strip(), "arguments": {}})
    fmt = tool_format_of(SimpleNamespace(tokenizer=tok, tool_format="json_tools"))
    out = feed_all(ToolCallSplitter(fmt), ["x[CALL] ping [/CALL]"])
    assert out[0] == "x" and out[1].name == "ping"


def test_end_marker_inside_an_argument_does_not_end_the_call():
    # An agent writing a file that itself contains the marker (e.g. a test of this splitter).
    content = 'x = "<tool_call>"\ny = "</tool_call>"\n'
    call = '<tool_call>{"name": "write_file", "arguments": {"path": "t.py", "content": %s}}</tool_call>' % json.dumps(content)
    for cut in (5, 37, 60, len(call) - 12):  # streamed in two pieces, cut anywhere
        out = feed_all(ToolCallSplitter(hermes()), ["ok ", call[:cut], call[cut:], " bye"])
        calls = [p for p in out if isinstance(p, ToolCall)]
        assert len(calls) == 1 and calls[0].arguments == {"path": "t.py", "content": content}, (cut, out)
        assert "".join(p for p in out if isinstance(p, str)) == "ok bye"


def test_xml_call_with_the_marker_in_a_parameter_stays_whole():
    fmt = tool_format_of(SimpleNamespace(tokenizer=SimpleNamespace(), tool_format="qwen3_coder"))
    body = ("<tool_call>\n<function=write_file>\n<parameter=content>\na </tool_call> b\n</parameter>\n"
            "</function>\n</tool_call>")
    out = feed_all(ToolCallSplitter(fmt), [body[:30], body[30:]])
    calls = [p for p in out if isinstance(p, ToolCall)]
    assert len(calls) == 1 and calls[0].arguments == {"content": "a </tool_call> b"}, out


def llama3():
    return tool_format_of(SimpleNamespace(tokenizer=SimpleNamespace(), tool_format="llama3_json"))


def test_llama3_call_only_at_the_reply_start_or_after_the_python_tag():
    assert llama3().start_only and not hermes().start_only
    out = feed_all(ToolCallSplitter(llama3()), ['  {"name": "f", "para', 'meters": {"x": 1}}'])
    (call,) = [p for p in out if isinstance(p, ToolCall)]
    assert (call.name, call.arguments) == ("f", {"x": 1})
    # Prose that quotes a call stays prose, as the constraint left it free.
    prose = ['To call it, send {"na', 'me": "f", "parameters": {"x": 1}} to the API.']
    out = feed_all(ToolCallSplitter(llama3()), prose)
    assert out and all(isinstance(p, str) for p in out) and "".join(out) == "".join(prose)
    out = feed_all(ToolCallSplitter(llama3()), ['Sure.<|python_tag|>{"name": "g", "parameters": {}}'])
    assert out[0] == "Sure.<|python_tag|>" and isinstance(out[1], ToolCall) and out[1].name == "g"


def test_whitespace_around_calls_is_no_reply_but_leading_text_keeps_it():
    call = '<tool_call>{"name": "f", "arguments": {"x": %d}}</tool_call>'
    # Parallel calls with the model's newlines around them, streamed token by token: only calls.
    pieces = [call % 1, "\n", "\n", call % 2, "\n"]
    out = feed_all(ToolCallSplitter(hermes()), pieces)
    assert [p.arguments["x"] for p in out if isinstance(p, ToolCall)] == [1, 2]
    assert [p for p in out if isinstance(p, str)] == []
    # Whitespace before text is part of the text; a reply with no call keeps its trailing newline.
    assert "".join(feed_all(ToolCallSplitter(hermes()), ["\n", "\nHello", "\n"])) == "\n\nHello\n"
    for pieces in (["Sure.", "\n", call % 3], ["Sure.\n" + call % 3]):  # however the text was cut
        out = feed_all(ToolCallSplitter(hermes()), pieces)
        assert out[0] == "Sure." and isinstance(out[1], ToolCall) and len(out) == 2
    assert "".join(feed_all(ToolCallSplitter(hermes()), ["a ", "b", " c\n"])) == "a b c\n"


async def test_a_call_cut_by_max_tokens_on_the_embedded_model_is_not_returned(smollm2):
    # The real engine and constraint: a required call given room for its shortest form and a few
    # tokens more is cut inside its arguments and closed; the server hands on no call.
    from locals.engine import Engine, build_constraint
    from locals.engine.settings import EngineConfig
    from locals.protocol import SamplingParams
    from locals.server.backend import Backend, Chat
    from tests.helpers.constrain_tools import CODING_TOOLS

    shortest = len(build_constraint(smollm2, tools=CODING_TOOLS, tool_choice="required").closing_tokens())
    engine = Engine(smollm2, EngineConfig(prefix_cache_bytes=0))
    engine.start()
    try:
        backend = Backend(smollm2, engine)
        chat = Chat(api="openai", messages=[{"role": "user", "content": "Write a long poem into poem.txt"}],
                    tools=CODING_TOOLS, tool_choice="required",
                    sampling=SamplingParams(temperature=0, max_tokens=shortest + 4))
        result = await backend.complete(chat)
        whole = await backend.complete(Chat(api="openai", messages=chat.messages, tools=CODING_TOOLS,
                                            tool_choice="required", parallel_tool_calls=False,
                                            sampling=SamplingParams(temperature=0, max_tokens=400)))
    finally:
        engine.stop()
    assert result.done.reason == "length" and result.calls == []
    assert result.done.cut_call in {t["function"]["name"] for t in CODING_TOOLS}
    assert len(whole.calls) == 1 and whole.done.reason == "tool_calls" and whole.done.cut_call is None
