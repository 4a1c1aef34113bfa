"""Free text without closing markers, and the XML parameter regexes checked against mlx-lm's parser."""

from __future__ import annotations

import itertools
import random
import re

import jsonschema
import pytest
from mlx_lm.tool_parsers import qwen3_coder

from locals.engine.constrain.freetext import Avoiding, json_string_body
from locals.engine.constrain.xml_args import parameters_regex
from locals.errors import RequestError

MARKERS = ("</ab>", "</cd>")
ALPHABET = "</abcdnNuU[ \n>é"


def _partial(text: str) -> bool:
    """True when `text` ends inside a marker (a `<` plus a proper prefix of a marker's tail)."""
    at = text.rfind("<")
    return at >= 0 and any(m[1:].startswith(text[at + 1:]) for m in MARKERS)


def _ascii_rule(text: str, word: str | None) -> bool:
    """Non-ASCII characters never follow a partial marker nor a non-empty prefix of `word`."""
    for j, ch in enumerate(text):
        if ord(ch) > 127 and (_partial(text[:j]) or (word and 0 < j <= len(word)
                                                     and word.startswith(text[:j].lower()))):
            return False
    return True


def _texts():
    rng = random.Random(0)
    for size in range(6):
        if size <= 4:
            yield from ("".join(t) for t in itertools.product(ALPHABET, repeat=size))
        else:
            yield from ("".join(rng.choice(ALPHABET) for _ in range(size)) for _ in range(20000))


def test_avoiding_regexes_are_exact():
    free = Avoiding(MARKERS)
    any_rx, null_rx, json_rx = (re.compile(r) for r in (free.any(), free.not_word("nu"), free.not_container()))
    for text in _texts():
        clean = not any(m in text for m in MARKERS)
        assert bool(any_rx.fullmatch(text)) == (clean and _ascii_rule(text, None)), text
        assert bool(null_rx.fullmatch(text)) == (clean and _ascii_rule(text, "nu") and text.lower() != "nu"), text
        starts_container = text.lstrip(" \t\n\r")[:1] in ("[", "{")
        assert bool(json_rx.fullmatch(text)) == (clean and _ascii_rule(text, None) and not starts_container), text


def test_json_strings_avoid_markers_but_can_escape_them():
    rx = re.compile('"' + json_string_body(["</ab>"]) + '"')
    for ok in ['"x</a"', '"</ab\\u003e"', '"<\\/ab>"', '"<<</a"', '"a\\"b"']:
        assert rx.fullmatch(ok), ok
    for bad in ['"</ab>"', '"x</ab>y"', '"a"b"']:
        assert not rx.fullmatch(bad), bad


S = {"type": "string"}
TOOL = {"type": "object", "properties": {
    "path": S, "limit": {"type": "integer", "minimum": 1, "maximum": 500}, "n": {"type": "integer"},
    "ratio": {"type": "number"}, "force": {"type": "boolean"}, "mode": {"type": "string", "enum": ["r", "w"]},
    "code": {"type": "string", "maxLength": 6}, "tags": {"type": "array", "items": S},
    "meta": {"type": "object", "properties": {"k": S}, "required": ["k"]},
    "note": {"anyOf": [S, {"type": "null"}]}, "level": {"enum": [1, 2, "x"]}},
    "required": ["path", "mode"]}
CANDIDATES = ["null", "NULL", "Null", "nul", "nulll", "", "a", "</parameter>", "x</parameter", "<b>",
              "0", "-0", "12", "1.5", "1e3", "1e999", "12345678901234567890", "true", "False", "r", "w",
              "[1, 2]", '["a"]', '{"k": "v"}', "{}", " [1]", "abcdef", "abcdefg", "1", "2", "x",
              "naïve", "line\nbreak", "<\u00e9"]


def _param_values(text: str):
    params = qwen3_coder.parse_tool_call(f"<function=t>\n{text}</function>", [{"function": {
        "name": "t", "parameters": TOOL}}])
    return params["arguments"]


def test_every_xml_value_the_regex_allows_parses_and_validates():
    rx = re.compile(parameters_regex(TOOL, label="t"))
    base = "<parameter=path>\nsrc/a.py\n</parameter>\n"
    mode = "<parameter=mode>\nr\n</parameter>\n"
    accepted = 0
    for name in TOOL["properties"]:
        for value in CANDIDATES:
            block = f"<parameter={name}>\n{value}\n</parameter>\n"
            order = list(TOOL["properties"])
            blocks = {"path": base, "mode": mode, name: block}
            text = "".join(blocks[k] for k in order if k in blocks)
            if rx.fullmatch(text):
                accepted += 1
                args = _param_values(text)
                jsonschema.validate(args, TOOL)
    assert accepted > 30
    assert not rx.fullmatch(mode + base)  # property order is the schema's
    assert not rx.fullmatch(base)  # required `mode` missing


@pytest.mark.parametrize("schema,match", [
    ({"type": "object", "properties": {"a b": S}}, "rename it"),
    ({"type": "object", "properties": {"x": {"type": ["string", "integer"]}}}, "several types"),
    ({"type": "object", "properties": {"x": {"anyOf": [S, {"type": "integer"}]}}}, "no single 'type'"),
    ({"type": "object", "properties": {"x": {"enum": ["null"]}}}, "reads back differently"),
])
def test_xml_refuses_what_its_parser_cannot_carry(schema, match):
    with pytest.raises(RequestError, match=match):
        parameters_regex(schema, label="tool 't' parameters")
