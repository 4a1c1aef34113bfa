"""Llama 3.1 JSON calls in auto mode: a call starts only at the start of the reply (or after
<|python_tag|>), so prose that shows `{"name": "…"` stays free text."""

from __future__ import annotations

import dataclasses

import pytest

from locals.engine.constrain import build_constraint
from locals.engine.constrain.automaton import Phase

from tests.helpers.constrain_tools import TOOLS, allowed, feed

pytestmark = pytest.mark.model


def auto(loaded):
    return build_constraint(dataclasses.replace(loaded, tool_format="llama3_json"), tools=TOOLS, tool_choice="auto")


def test_a_reply_that_starts_with_a_call_is_constrained_to_the_offered_tools(smollm2):
    tok = smollm2.tokenizer
    c = auto(smollm2)
    feed(c, '\n {"name": "', tok)
    assert c.phase is Phase.HEAD
    assert not allowed(c.mask(), tok.encode("delete", add_special_tokens=False)[0])
    feed(c, 'run", "parameters": {"command": "ls"}}', tok)
    assert c.phase is Phase.DONE
    other = auto(smollm2)
    feed(other, '{"name', tok)
    feed(other, '": "', tok)  # the marker across tokens also starts the call
    assert other.phase is Phase.HEAD


def test_json_later_in_prose_stays_free_text(smollm2):
    tok = smollm2.tokenizer
    c = auto(smollm2)
    feed(c, 'A call looks like {"name": "x", "parameters": {}} and {"name": "delete"', tok)
    assert c.phase is Phase.FREE and c.mask() is None
    c.accept(tok.eos_token_id)
    assert c.is_complete()
