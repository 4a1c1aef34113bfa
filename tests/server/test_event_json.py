"""Streamed events stay one line each (server/streaming.py): a reply's text may hold characters
that `str.splitlines()` breaks at, and a client that splits a stream that way must still read
whole events. Found by the fuzzed-daemon test: a token held one."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st

from locals.server.streaming import event_json


def test_line_and_paragraph_separators_are_escaped_and_the_text_survives():
    text = "a\u2028b\x85c\u2029d é ✓"
    line = event_json({"text": text})
    assert line.splitlines() == [line] and "\u2028" not in line
    assert json.loads(line) == {"text": text} and "é ✓" in line  # other non-ASCII stays as is


@given(st.text())
def test_any_text_makes_one_line_that_reads_back(text):
    line = event_json({"choices": [{"text": text}]})
    assert len(line.splitlines()) == 1
    assert json.loads(line)["choices"][0]["text"] == text
