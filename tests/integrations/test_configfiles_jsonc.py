"""The JSONC span editor: values read through comments, edits leave other bytes alone."""

from __future__ import annotations

import pytest

from integrations import jsonc

DOC = """{
  // comment
  "a": 1, /* block */
  "b": {"c": [1, 2,], "d": "x//not a comment"},
  "e": "last",
}
"""


def test_loads_ignores_comments_and_trailing_commas():
    assert jsonc.loads(DOC) == {"a": 1, "b": {"c": [1, 2], "d": "x//not a comment"}, "e": "last"}


def test_replace_nested_value_changes_only_its_span():
    out = jsonc.set_value(DOC, ("b", "d"), "y")
    assert out == DOC.replace('"x//not a comment"', '"y"')


def test_insert_then_delete_is_identity():
    for path in [("new",), ("b", "new"), ("deep", "er", "key")]:
        out = jsonc.set_value(DOC, path, {"k": [1, "two"]})
        assert jsonc.get(out, path) == {"k": [1, "two"]}
        assert "// comment" in out and "/* block */" in out
        top = path[:1] if path[0] != "b" else path
        assert jsonc.delete(out, top) == DOC


def test_delete_last_member_drops_the_comma_before_it():
    text = '{\n  "a": 1,\n  "b": 2\n}\n'
    assert jsonc.delete(text, ("b",)) == '{\n  "a": 1\n}\n'
    assert jsonc.loads(jsonc.delete(text, ("a",))) == {"b": 2}


def test_set_through_a_scalar_replaces_it_with_an_object():
    out = jsonc.set_value('{"theme": 3}', ("theme", "x"), 1)
    assert jsonc.loads(out) == {"theme": {"x": 1}}


def test_empty_text_becomes_an_object():
    assert jsonc.loads(jsonc.set_value("", ("a", "b"), True)) == {"a": {"b": True}}


def test_get_missing_and_bad_text():
    assert jsonc.get(DOC, ("nope",)) is jsonc.MISSING
    assert jsonc.get(DOC, ("a", "deeper")) is jsonc.MISSING
    with pytest.raises(jsonc.JsoncError):
        jsonc.loads('{"a": 1')
    with pytest.raises(jsonc.JsoncError):
        jsonc.loads("[1, 2]")


JSON5_DOC = """// OpenClaw's own style
{
  agents: { defaults: { workspace: '~/.openclaw/workspace', }, },
  gateway: { port: 0x4b1, ratio: .5, 'quoted key': 'it\\'s', },
}
"""


def test_json5_is_read_only_where_asked_for():
    assert jsonc.loads(JSON5_DOC, allow_json5=True) == {
        "agents": {"defaults": {"workspace": "~/.openclaw/workspace"}},
        "gateway": {"port": 1201, "ratio": 0.5, "quoted key": "it's"}}
    with pytest.raises(jsonc.JsoncError, match="expected a key"):
        jsonc.loads(JSON5_DOC)  # a JSON tool's file with unquoted keys is broken for that tool


def test_json5_edits_keep_the_users_bytes():
    path = ("agents", "defaults", "model", "primary")
    out = jsonc.set_value(JSON5_DOC, path, "locals/smollm2", allow_json5=True)
    assert jsonc.get(out, path, allow_json5=True) == "locals/smollm2"
    assert "workspace: '~/.openclaw/workspace'" in out and "port: 0x4b1" in out
    assert jsonc.delete(out, ("agents", "defaults", "model"), allow_json5=True).replace(" ", "") == \
        JSON5_DOC.replace(" ", "")
