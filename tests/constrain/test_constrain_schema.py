"""Schema -> regex rewrites that fix outlines-core's gaps, and refusals that name the part."""

from __future__ import annotations

import json
import re

import pytest

from locals.engine.constrain.schema import integer_range_regex, schema_regex
from locals.errors import RequestError


def _matches(schema, text: str) -> bool:
    return re.fullmatch(schema_regex(schema, label="test"), text) is not None


@pytest.mark.parametrize("low,high", [(None, None), (0, None), (1, None), (-5, 5), (7, 1234),
                                      (None, -3), (-120, -7), (10, 99), (0, 0), (None, 55)])
def test_integer_range_regex_is_exact(low, high):
    rx = re.compile(integer_range_regex(low, high))
    for n in range(-1500, 1500):
        expected = (low is None or n >= low) and (high is None or n <= high)
        assert bool(rx.fullmatch(str(n))) == expected, n
    assert not rx.fullmatch("-0") and not rx.fullmatch("007")


def test_integer_bounds_are_enforced():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 12}},
              "required": ["n"]}
    assert _matches(schema, '{"n": 12}') and _matches(schema, '{"n": 1}')
    assert not _matches(schema, '{"n": 13}') and not _matches(schema, '{"n": 0}')
    exclusive = {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}
    assert [n for n in range(-2, 6) if _matches(exclusive, str(n))] == [1, 2]


def test_unicode_escapes_are_accepted_in_strings():
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    text = '{"s": "caf\\u00e9 \\n \\"q\\""}'
    assert json.loads(text)["s"] == 'café \n "q"'
    assert _matches(schema, text)
    assert not _matches(schema, '{"s": "bad \\u00g1"}')


def test_all_of_is_merged_into_valid_json():
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                        {"$ref": "#/$defs/b"}],
              "$defs": {"b": {"properties": {"b": {"type": "integer"}}, "required": ["b"]}}}
    assert _matches(schema, '{"a": "x", "b": 3}')
    assert not _matches(schema, '{"a": "x"}{"b": 3}')


def test_whitespace_is_json_dumps_style():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
              "required": ["a"]}
    assert _matches(schema, json.dumps({"a": [1, 2]}))
    assert not _matches(schema, '{"a":[1,2]}')
    assert not _matches(schema, '{ "a": [1, 2] }')


@pytest.mark.parametrize("schema,where,keyword", [
    ({"type": "object", "properties": {"x": {"not": {"type": "string"}}}}, "/properties/x", "not"),
    ({"if": {"type": "string"}, "then": {"minLength": 1}}, "/", "if"),
    ({"type": "array", "contains": {"type": "integer"}}, "/", "contains"),
])
def test_unsupported_keywords_are_refused_by_path(schema, where, keyword):
    with pytest.raises(RequestError) as err:
        schema_regex(schema, label="tool 'x' parameters")
    message = str(err.value)
    assert "tool 'x' parameters" in message and where in message and f"'{keyword}'" in message


def test_conflicting_all_of_and_invalid_schemas_are_refused():
    with pytest.raises(RequestError, match="allOf"):
        schema_regex({"allOf": [{"type": "string"}, {"type": "integer"}]}, label="s")
    with pytest.raises(RequestError, match="invalid JSON schema"):
        schema_regex({"type": "object", "properties": {"a": {"type": 5}}}, label="s")
    with pytest.raises(RequestError, match="no integer"):
        schema_regex({"type": "integer", "minimum": 5, "maximum": 2}, label="s")


def test_free_form_objects_get_a_shallow_regex():
    assert _matches({"type": "object"}, '{"a": [1, "x"], "b": {"c": null}}')
    assert not _matches({"type": "object"}, '[1]')
    assert _matches({}, '[1, {"a": true}]')
    nested = {"type": "object", "properties": {"opts": {"type": "object"}}, "required": ["opts"]}
    assert _matches(nested, '{"opts": {"k": 1}}') and not _matches(nested, '{"opts": {"k": {"d": 1}}}')


def test_optional_properties_keep_json_dumps_spacing():
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcd"}, "required": ["a", "c"]}
    for value in ({"a": 1, "c": 3}, {"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 2, "c": 3, "d": 4}):
        assert _matches(schema, json.dumps(value)), value
    assert not _matches(schema, '{"a": 1,"c": 3}')


@pytest.mark.parametrize("schema, needle", [
    ({"type": "integer", "multipleOf": 7}, "'multipleOf'"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems'"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1}, "'minProperties'"),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 5,
      "exclusiveMinimum": True}, "'exclusiveMinimum'"),
    ({"type": "object", "properties": {"x": {"type": "number", "maximum": 1}}}, "'maximum'"),
    ({"type": ["number", "null"], "exclusiveMinimum": 0}, "'exclusiveMinimum'"),
    ({"type": "object", "required": ["x"]}, "requires 'x'"),
    ({"type": "object", "properties": {"y": {"type": "integer"}}, "required": ["x"]}, "requires 'x'"),
    ({"enum": []}, "empty 'enum'"),
])
def test_a_response_format_refuses_rules_the_automaton_would_drop(schema, needle):
    with pytest.raises(RequestError, match=needle):
        schema_regex(schema, label="the response JSON schema", strict=True)
    schema_regex(schema, label="tool 'x'")  # without strict (tools, non-strict formats): kept, unenforced


@pytest.mark.parametrize("schema, needle", [
    ({"type": "integer", "allOf": [{"multipleOf": 5}]}, "'multipleOf'"),
    ({"type": "array", "allOf": [{"uniqueItems": True}]}, "'uniqueItems'"),
    ({"type": "object", "allOf": [{"properties": {"a": {}}}], "required": ["b"]}, "requires 'b'"),
])
def test_strict_checks_see_through_all_of(schema, needle):
    with pytest.raises(RequestError, match=needle):
        schema_regex(schema, label="r", strict=True)


def test_required_names_defined_in_branches_are_not_refused():
    branches = {"type": "object", "properties": {"a": {"type": "integer"}},
                "anyOf": [{"required": ["a"]}, {"properties": {"b": {"type": "string"}}, "required": ["b"]}]}
    schema_regex(branches, label="r", strict=True)


def test_a_response_format_keeps_what_it_can_enforce():
    ok = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                    "uniqueItems": False},
                                           "n": {"type": "integer", "minimum": 1, "maximum": 5}},
          "required": ["tags", "n"], "allOf": [{"required": ["tags"]}]}
    regex = schema_regex(ok, label="r", strict=True)
    assert re.fullmatch(regex, '{"tags": ["a", "b"], "n": 5}') and not re.fullmatch(regex, '{"tags": [], "n": 6}')


def test_a_reference_to_itself_is_refused_not_a_crash():
    loop = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]}
    with pytest.raises(RequestError, match="refers to itself"):
        schema_regex(loop, label="test")
    deeper = {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "allOf": [{"$ref": "#/$defs/a"}]}
    with pytest.raises(RequestError, match="refer back to themselves"):
        schema_regex(deeper, label="test")


def test_large_maxima_are_loose_outside_strict_schemas(smollm2):
    """Claude Code's ListAgents: three optional strings of maxLength 256 made 10,863 automaton
    states (44M transitions, 40 s to compile); SendMessage's `to` (one line, at most 300
    characters) 2,561. Outside strict schemas maxima over LOOSE_MAXIMA are left to the reply's
    token limit, so those automata stay small; a strict schema still enforces them."""
    from locals.engine.constrain.compile import compile_regex
    from locals.engine.constrain.schema import LOOSE_MAXIMA
    from locals.engine.constrain.vocab import token_vocab

    text = {"type": "string", "maxLength": 256}
    list_agents = {"type": "object", "additionalProperties": False,
                   "properties": {"channel": text, "q": text, "cursor": text}}
    one_line = {"type": "string", "allOf": [{"pattern": "^[^\\n\\r]*$"}, {"pattern": "^[\\s\\S]{0,300}$"}]}
    findings = {"type": "array", "maxItems": 32, "items": {"type": "string"}}
    vocab = token_vocab(smollm2.tokenizer, smollm2.vocab_size)
    for schema in (list_agents, one_line, findings):
        index = compile_regex(schema_regex(schema, label="tool"), vocab, label="tool")
        assert len(index.row_of) < 200, schema
    assert schema_regex(text, label="tool") == schema_regex({"type": "string"}, label="tool")
    assert schema_regex(findings, label="tool") == schema_regex({"type": "array", "items": {"type": "string"}},
                                                                label="tool")
    kept = {"type": "string", "maxLength": LOOSE_MAXIMA["maxLength"]}
    assert schema_regex(kept, label="tool") != schema_regex({"type": "string"}, label="tool")
    assert schema_regex(text, label="tool", strict=True) != schema_regex({"type": "string"}, label="tool")
