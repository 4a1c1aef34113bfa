"""Repetition guard on real code and on loops; tool-call loop detection on conversations."""

from __future__ import annotations

import inspect
import json

import pytest

from locals import toolloop
from locals.engine.rows.repetition import LOOP, RepetitionGuard, RepetitionSettings, repetition_guard_factory
from locals.protocol import GenerationRequest


def _feed(tokens: list[int]) -> int | None:
    """Index at which the guard trips, or None."""
    guard = RepetitionGuard()
    for i, t in enumerate(tokens):
        if guard.on_token(t) == LOOP:
            return i
    return None


def _real_code_texts() -> list[str]:
    import argparse
    import collections
    import json.decoder
    import string
    import textwrap as tw

    texts = [inspect.getsource(m) for m in (argparse, collections, json.decoder, string, tw)]
    braces = "".join("    " * d + "if (x%d) {\n" % d for d in range(12)) + "".join(
        "    " * d + "}\n" for d in reversed(range(12)))
    table = "| name | value |\n|---|---|\n" + "".join(f"| row{i} | {i * 7} |\n" for i in range(120))
    yaml_like = "".join(f"  - id: {i}\n    enabled: true\n    retries: 3\n" for i in range(60))
    return texts + [braces * 6, table, yaml_like]


def test_real_code_never_trips(smollm2):
    for text in _real_code_texts():
        tokens = smollm2.tokenizer.encode(text, add_special_tokens=False)
        assert _feed(tokens) is None, text[:80]


def test_single_token_run_trips():
    assert _feed([7] * 400) == RepetitionSettings().min_span - 1


def test_phrase_loop_trips_within_span(smollm2):
    prefix = smollm2.tokenizer.encode("Here is the answer. ", add_special_tokens=False)
    phrase = smollm2.tokenizer.encode(" I will now read the file again.", add_special_tokens=False)
    tokens = prefix + phrase * 60
    tripped = _feed(tokens)
    assert tripped is not None
    assert tripped < len(prefix) + RepetitionSettings().min_span + len(phrase)


def test_long_period_needs_enough_repeats():
    period = list(range(100, 160))  # 60 tokens
    assert _feed(period * 3) is None  # 180 tokens, 3 repeats: not yet a loop
    assert _feed(period * 5) is not None


def test_factory_respects_opt_out():
    factory = repetition_guard_factory()
    assert factory(GenerationRequest([1])) is not None
    assert factory(GenerationRequest([1], meta={"repetition_guard": False})) is None


def _assistant_call(name: str, args: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _tool(text: str) -> dict:
    return {"role": "tool", "tool_call_id": "x", "content": text}


def test_tool_loop_counts_identical_calls_in_a_row():
    msgs = [{"role": "user", "content": "fix it"}]
    for _ in range(3):
        msgs += [_assistant_call("read_file", {"path": "a.py"}), _tool("print(1)")]
    state, loop = toolloop.check(msgs)
    assert state == "steer" and loop.count == 3 and loop.name == "read_file"
    assert "a.py" in loop.steering_note()
    for _ in range(2):
        msgs += [_assistant_call("read_file", {"path": "a.py"}), _tool("print(1)")]
    assert toolloop.check(msgs)[0] == "stop"


def test_tool_loop_ignores_argument_order_and_whitespace():
    a = _assistant_call("run", {"cmd": "pytest", "timeout": 5})
    b = {"role": "assistant", "tool_calls": [{"function": {"name": "run", "arguments": '{"timeout":5,  "cmd":"pytest"}'}}]}
    assert toolloop.find_tool_loop([a, _tool("ok"), b, _tool("ok")]).count == 2


def test_a_call_whose_result_changes_is_polling_not_a_loop():
    msgs = [{"role": "user", "content": "build it"}]
    for done in range(0, 400, 40):  # a background build's output, read again and again
        msgs += [_assistant_call("BashOutput", {"bash_id": "bash_1"}), _tool(f"compiling crate {done}/400")]
    assert toolloop.check(msgs) == ("ok", None)
    for _ in range(4):  # then the same output every time: stuck
        msgs += [_assistant_call("BashOutput", {"bash_id": "bash_1"}), _tool("compiling crate 360/400")]
    state, loop = toolloop.check(msgs)
    assert state == "stop" and loop.count == 5  # the last changing read and 4 more the same


def test_results_are_matched_to_parallel_calls_by_id():
    def two(a_id, b_id):
        return {"role": "assistant", "tool_calls": [
            {"id": a_id, "function": {"name": "read", "arguments": '{"p": "a"}'}},
            {"id": b_id, "function": {"name": "read", "arguments": '{"p": "a"}'}}]}
    # the results come back in the other order: matched by id, both calls got "same"
    msgs = [two("1", "2"), {"role": "tool", "tool_call_id": "2", "content": "same"},
            {"role": "tool", "tool_call_id": "1", "content": "same"}]
    assert toolloop.find_tool_loop(msgs).count == 2


def test_progress_between_calls_is_not_a_loop():
    msgs = []
    for i in range(6):  # run tests, edit, run tests, edit ...: an agent making progress
        msgs += [_assistant_call("run", {"cmd": "pytest"}), _tool("1 failed"),
                 _assistant_call("edit_file", {"path": "a.py", "old": str(i), "new": str(i + 1)}), _tool("ok")]
    assert toolloop.check(msgs)[0] == "ok"
    msgs += [{"role": "assistant", "content": "done"}]
    assert toolloop.find_tool_loop(msgs) is None


@pytest.mark.parametrize("messages", [[], [{"role": "user", "content": "hi"}]])
def test_no_calls_no_loop(messages):
    assert toolloop.check(messages) == ("ok", None)
