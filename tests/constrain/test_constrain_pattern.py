"""JSON-schema string patterns in the automata: exact languages by brute force, the Qwen3-Coder XML
values they allow read back by mlx-lm's parser, and the JSON path rewritten the same way."""

from __future__ import annotations

import dataclasses
import itertools
import re

import jsonschema
import pytest
from outlines_core import Index, Vocabulary

from locals.engine.constrain import build_constraint
from locals.engine.constrain.pattern import intersect_patterns, pattern_regex, strip_anchors
from locals.engine.constrain.schema import schema_regex
from locals.errors import RequestError

ALPHABET = "anulNUL.py<x\""
BANNED = "<\x00\x01\x02"


def language(regex: str, length: int) -> set[str]:
    """The texts up to `length` characters over ALPHABET that outlines-core's automaton accepts
    (followed by an end mark: with this toy vocabulary outlines-core 0.2 keeps no transition
    from a final state into a non-final one, which a value followed by its frame never needs)."""
    ids = {c: i for i, c in enumerate(ALPHABET)}
    end = len(ids)
    index = Index(f"({regex})#", Vocabulary(end + 1, {**{c: [i] for c, i in ids.items()}, "#": [end]}))
    found, frontier = set(), [("", index.get_initial_state())]
    while frontier:
        text, state = frontier.pop()
        after = index.get_next_state(state, end)
        if after is not None and index.is_final_state(after):
            found.add(text)
        if len(text) < length:
            for c, i in ids.items():
                nxt = index.get_next_state(state, i)
                if nxt is not None:
                    frontier.append((text + c, nxt))
    return found


def expected(pattern: str, banned: str, no_null: bool, length: int) -> set[str]:
    texts = ("".join(t) for n in range(length + 1) for t in itertools.product(ALPHABET, repeat=n))
    return {t for t in texts if re.fullmatch(strip_anchors(pattern), t) and not set(t) & set(banned)
            and not (no_null and t.lower() == "null")}


@pytest.mark.parametrize(("pattern", "no_null"), [
    *((p, False) for p in (r"[a-z]+\.py", ".*", "[^x]+", "a|<b", r"(nu|NU)(ll)?\.?", r"\w{2,4}", r"[^\d]*", r"\S+")),
    *((p, True) for p in (r"[a-z]+\.py", r"^[a-z]+$", r"(nu|NU)(ll)?\.?", r"\w{2,4}"))])
def test_pattern_regex_is_the_pattern_minus_banned_texts(pattern, no_null):
    regex = pattern_regex(pattern, BANNED, no_null=no_null)
    assert language(regex, 5) == expected(pattern, BANNED, no_null, 5)


def test_anchors_escapes_and_what_is_refused():
    assert strip_anchors(r"^a\$") == r"a\$" and strip_anchors(r"a\\$") == "a\\\\"
    assert strip_anchors(r"^a.py$") == "a.py" and strip_anchors("$") == ""
    for bad, why in (("<.*>", "no text"), ("a$b", "at"), ("a(?=b)", "assert"), ("(?i)a", "flags"),
                     ("(a)\\1", "groupref"), ("[", "not a valid regex")):
        with pytest.raises(ValueError, match=why):
            pattern_regex(bad, BANNED)
    with pytest.raises(ValueError, match="only the text 'null'"):
        pattern_regex("null", BANNED, no_null=True)


def test_json_path_patterns_stay_inside_a_json_string():
    schema = {"type": "object", "properties": {"p": {"type": "string", "pattern": "^.+$"}}, "required": ["p"]}
    found = language(schema_regex(schema, label="s").replace('\\{"p": ', "").replace("\\}", ""), 4)
    assert found and all('"' not in t[1:-1] for t in found)  # `.` no longer writes a raw quote
    with pytest.raises(RequestError, match="minLength/maxLength"):
        schema_regex({"type": "string", "pattern": "a+", "maxLength": 3}, label="s")
    with pytest.raises(RequestError, match=r"at /properties/p .*assert"):
        schema_regex({"type": "object", "properties": {"p": {"type": "string", "pattern": "a(?!b)"}}}, label="s")


def xml_tool(pattern: str) -> list[dict]:
    return [{"type": "function", "function": {"name": "open_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string", "pattern": pattern}}, "required": ["path"]}}}]


def xml_model(loaded):
    return dataclasses.replace(loaded, tool_format="qwen3_coder")


@pytest.mark.model
@pytest.mark.parametrize("pattern", ["<.*>", "a$b", "null"])
def test_xml_refuses_patterns_it_cannot_carry_naming_tool_and_parameter(tiny_llama, pattern):
    with pytest.raises(RequestError, match="tool 'open_file'.*parameter 'path'"):
        build_constraint(xml_model(tiny_llama), tools=xml_tool(pattern), tool_choice="required")


@pytest.mark.model
@pytest.mark.parametrize("pattern", [r"[a-z]+\.py", r"^[a-z]+\.py$", r"[^x\s]+\.py"])
def test_xml_pattern_values_generate_parse_and_match(tiny_llama, pattern):
    from tests.helpers.constrain_tools import generate

    loaded = xml_model(tiny_llama)
    tools = xml_tool(pattern)
    schema = tools[0]["function"]["parameters"]
    cs = [build_constraint(loaded, tools=tools, tool_choice="required", max_tokens=40) for _ in range(8)]
    texts = generate(loaded, loaded.tokenizer.encode("Open a file."), cs, [40] * 8, seed=3)
    for text in texts:
        calls = _calls(loaded, tools, text)
        assert [c.name for c in calls] == ["open_file"], text
        value = calls[0].arguments["path"]
        jsonschema.validate(calls[0].arguments, schema)  # also re.search of the pattern
        assert "<" not in value and value.lower() != "null"


def _calls(loaded, tools, text):
    from locals.server.toolcalls import ToolCall, ToolCallSplitter, tool_format_of

    splitter = ToolCallSplitter(tool_format_of(loaded), tools)
    return [p for p in splitter.feed(text) + splitter.finish() if isinstance(p, ToolCall)]


@pytest.mark.model
def test_xml_pattern_refuses_null_and_angle_brackets_token_by_token(tiny_llama):
    from tests.helpers.constrain_tools import allowed, feed

    loaded, tok = xml_model(tiny_llama), tiny_llama.tokenizer
    frame = "<tool_call>\n<function=open_file>\n<parameter=path>\n"
    for value, ok in (("nulls", True), ("nul", True), ("null", False), ("a<b", False)):
        c = build_constraint(loaded, tools=xml_tool("[a-z<]+"), tool_choice="required")
        feed(c, frame, tok)
        ids = tok.encode(value + "\n</parameter>\n</function>\n</tool_call>", add_special_tokens=False)
        walked = True
        for token in ids:
            if not allowed(c.mask(), token):
                walked = False
                break
            c.accept(token)
        assert walked == ok, value


def test_a_pattern_nested_past_pythons_recursion_limit_is_refused_not_crashed():
    """Found by the fuzzed-request suite: 900 nested groups were a 500 (RecursionError)."""
    from locals.errors import RequestError

    deep = "(" * 900 + "a" + ")" * 900
    with pytest.raises(ValueError, match="nests groups too deeply"):
        pattern_regex(deep)
    with pytest.raises(RequestError, match="nests too deeply"):
        schema_regex({"type": "string", "pattern": deep}, label="format")


def test_a_bound_too_large_to_unroll_never_reaches_the_compiler():
    """Found by the fuzzed-request suite: maxLength 2**31 made outlines-core allocate until the
    system killed the server. A minimum that large is refused; a maximum is left to the reply's
    token limit (Claude Code's Workflow tool sets maxLength 524,288), but a strict schema, which
    refuses what it does not enforce, refuses it too."""
    from locals.errors import RequestError

    with pytest.raises(RequestError, match="minItems 2147483648, over 10,000"):
        schema_regex({"type": "array", "minItems": 2**31}, label="format")
    assert schema_regex({"type": "string", "maxLength": 2**31}, label="tool") == schema_regex({"type": "string"},
                                                                                             label="tool")
    with pytest.raises(RequestError, match="maxLength 2147483648, over 10,000"):
        schema_regex({"type": "string", "maxLength": 2**31}, label="format", strict=True)
    schema_regex({"type": "array", "minItems": 10_000}, label="format")  # the regex is written; compiling it is another matter
    with pytest.raises(ValueError, match="repeats a part 2147483647 times, over 10,000"):
        pattern_regex("a{2147483647}")


def test_allof_patterns_that_only_count_and_only_choose_characters_are_merged():
    # Claude Code's SendMessage `to`: one line, at most 300 characters, as two allOf patterns.
    parts = {"type": "string", "allOf": [{"pattern": "^[^\\n\\r]*$"}, {"pattern": "^[\\s\\S]{0,300}$"}]}
    merged = schema_regex(parts, label="tool", strict=True)
    assert merged == schema_regex({"type": "string", "pattern": "^[^\\n\\r]{0,300}$"}, label="tool", strict=True)
    # Outside a strict schema a count over LOOSE_MAXIMA["maxLength"] is left out, as maxLength is.
    assert schema_regex(parts, label="tool") == schema_regex({"type": "string", "pattern": "^[^\\n\\r]*$"},
                                                             label="tool")
    assert intersect_patterns("^[\\s\\S]{2,300}$", "^\\d+$", most=64) == "^\\d{2,}$"
    assert intersect_patterns("^[\\s\\S]{0,64}$", "^\\d*$", most=64) == "^\\d{0,64}$"
    assert intersect_patterns("^[\\s\\S]{2,5}$", "^\\d+$") == "^\\d{2,5}$"
    assert intersect_patterns("^[\\s\\S]{0,5}$", "^x+$") == "^x{1,5}$"
    assert intersect_patterns("^[\\s\\S]{0}$", "^x+$") is None  # nothing matches both
    assert intersect_patterns("^a*$", "^b*$") is None
    from locals.errors import RequestError

    with pytest.raises(RequestError, match="sets 'pattern' differently from another allOf part"):
        schema_regex({"type": "string", "allOf": [{"pattern": "^a*$"}, {"pattern": "^b*$"}]}, label="tool")
