"""The constraint automata driven by scripted tokens on the embedded model's tokenizer."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from locals.engine.constrain import JsonConstraint, ToolCallConstraint, build_constraint
from locals.engine.constrain.automaton import Phase
from locals.engine.constrain.vocab import token_vocab
from locals.errors import RequestError

from tests.helpers.constrain_tools import TOOLS, allowed, feed, fn

pytestmark = pytest.mark.model

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                                           "email": {"type": "string"}}, "required": ["name", "age"]}
S = {"type": "string"}


def test_vocab_bytes_round_trip(smollm2):
    vocab = token_vocab(smollm2.tokenizer, smollm2.vocab_size)
    text = 'x = {"café": [1, 2]}\n\t<tool_call>'
    ids = smollm2.tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(vocab.bytes_of(i) for i in ids).decode() == text
    assert vocab.bytes_of(smollm2.tokenizer.eos_token_id) == b""


def test_json_constraint_accepts_valid_and_refuses_invalid(smollm2):
    c = build_constraint(smollm2, json_schema=PERSON)
    assert isinstance(c, JsonConstraint)
    feed(c, '{"name": "Ann", "age": 31}', smollm2.tokenizer)
    assert c.is_complete() and c.closing_tokens() == []
    eos = smollm2.tokenizer.eos_token_id
    assert allowed(c.mask(), eos)
    bad = build_constraint(smollm2, json_schema=PERSON)
    with pytest.raises(ValueError):
        bad.accept(smollm2.tokenizer.encode("hello", add_special_tokens=False)[0])


def test_forced_tokens_are_canonical_and_valid(smollm2):
    tok = smollm2.tokenizer
    c = build_constraint(smollm2, json_schema={"type": "object", "properties": {"path": S, "mode": {"enum": ["r"]}},
                                               "required": ["path", "mode"]})
    forced = c.forced_tokens()
    assert tok.decode(forced) == '{"path":'  # the trailing ' "' is left to the model
    for t in forced:
        c.accept(t)
    feed(c, ' "a.txt"', tok)
    rest = c.forced_tokens()
    for t in rest:
        c.accept(t)
    assert c.is_complete()


def test_closing_completes_any_prefix(smollm2):
    tok = smollm2.tokenizer
    text = '{"name": "Ann \\u00e9", "age": 31, "email": "a@b"}'
    ids = tok.encode(text, add_special_tokens=False)
    for cut in range(len(ids)):
        c = build_constraint(smollm2, json_schema=PERSON)
        for t in ids[:cut]:
            c.accept(t)
        out = tok.decode(ids[:cut] + c.closing_tokens())
        value = json.loads(out)
        assert isinstance(value["name"], str) and value["age"] >= 0


def test_tool_choice_none_and_no_tools_give_no_constraint(smollm2):
    assert build_constraint(smollm2, tools=TOOLS, tool_choice="none") is None
    assert build_constraint(smollm2) is None


def test_a_response_schema_beside_tools_on_auto_holds_the_reply_or_allows_calls(smollm2):
    tok, eos = smollm2.tokenizer, smollm2.tokenizer.eos_token_id
    call = '<tool_call>\n{"name": "run", "arguments": {"command": "ls"}}\n</tool_call>'
    for text in ('{"name": "Ann", "age": 31}', call):
        c = build_constraint(smollm2, tools=TOOLS, json_schema=PERSON)
        feed(c, text, tok)
        assert c.is_complete() and allowed(c.mask(), eos), text
    for text in ("Hello", '{"name": "Ann"}', '<tool_call>\n{"name": "delete"'):
        c = build_constraint(smollm2, tools=TOOLS, json_schema=PERSON)
        with pytest.raises(AssertionError):
            feed(c, text, tok)
            assert allowed(c.mask(), eos)  # a prefix the schema allows must not be allowed to end
    # "required" leaves no reply for the schema: calls only.
    assert isinstance(build_constraint(smollm2, tools=TOOLS, tool_choice="required", json_schema=PERSON),
                      ToolCallConstraint)


def test_auto_mode_is_free_until_the_marker(smollm2):
    tok = smollm2.tokenizer
    c = build_constraint(smollm2, tools=TOOLS)
    assert isinstance(c, ToolCallConstraint) and c.mask() is None and c.unmasked()
    feed(c, "Let me look. a < b and", tok)
    assert c.phase is Phase.FREE and c.mask() is None and c.unmasked()
    feed(c, " <", tok)  # perhaps a marker begun: still free text, where stop strings are matched
    assert c.writes_free_text()
    feed(c, "tool_call>", tok)
    assert c.phase is Phase.HEAD and not c.unmasked()  # the engine syncs this row again
    assert not c.writes_free_text() and not build_constraint(smollm2, json_schema=PERSON).writes_free_text()
    assert not build_constraint(smollm2, tools=TOOLS, tool_choice="required").unmasked()
    forced = c.forced_tokens()
    assert tok.decode(forced) == '\n{"name": "'  # every offered name starts with "r"
    for t in forced:
        c.accept(t)
    feed(c, 'read', tok)
    assert c.phase is Phase.HEAD  # "read" and "read_file" both still possible
    feed(c, '_', tok)
    assert c.phase is Phase.CALL
    assert tok.decode(c.forced_tokens()).startswith('file", "arguments":')
    out = '<tool_call>\n{"name": "read_file", "arguments": {"path": "x.py", "limit": 5}}\n</tool_call>'
    done = '\n{"name": "read_file", "arguments": {"path": "x.py", "limit": 5}}\n</tool_call>'
    c2 = build_constraint(smollm2, tools=TOOLS)
    feed(c2, "Sure. " + out, tok)
    assert c2.phase is Phase.BETWEEN and not c2.is_complete()
    assert allowed(c2.mask(), tok.eos_token_id)
    c2.accept(tok.eos_token_id)
    assert c2.is_complete() and done in out


def test_marker_followed_by_garbage_is_blocked(smollm2):
    c = build_constraint(smollm2, tools=TOOLS)
    feed(c, "ok <tool_call", smollm2.tokenizer)
    mask = c.mask()
    assert mask is not None
    good = smollm2.tokenizer.encode(">", add_special_tokens=False)
    assert len(good) == 1 and allowed(mask, good[0])


def test_invalid_names_and_arguments_are_refused(smollm2):
    tok = smollm2.tokenizer
    c = build_constraint(smollm2, tools=TOOLS, tool_choice="required")
    feed(c, '<tool_call>\n{"name": "r', tok)
    w = tok.encode("w", add_special_tokens=False)[0]
    assert not allowed(c.mask(), w)
    with pytest.raises(ValueError):
        c.accept(w)
    c = build_constraint(smollm2, tools=TOOLS, tool_choice="required")
    feed(c, '<tool_call>\n{"name": "read_file", "arguments": {"path": "a", "limit": ', tok)
    assert not allowed(c.mask(), tok.encode("0", add_special_tokens=False)[0])


def test_named_tool_choice_forces_the_name_and_one_call(smollm2):
    tok = smollm2.tokenizer
    c = build_constraint(smollm2, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "run"}})
    text = tok.decode(c.forced_tokens())
    assert c.phase is Phase.CALL and text == ""  # first token: "<" or the optional newline
    feed(c, '<tool_call>', tok)
    assert tok.decode(c.forced_tokens()).startswith('\n{"name": "run", "arguments": {"command":')
    feed(c, '\n{"name": "run", "arguments": {"command": "ls"}}\n</tool_call>', tok)
    assert c.is_complete()
    with pytest.raises(RequestError, match="not among the offered tools"):
        build_constraint(smollm2, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})


def test_bad_tools_are_refused_by_name(smollm2):
    with pytest.raises(RequestError, match="offered twice"):
        build_constraint(smollm2, tools=[TOOLS[0], TOOLS[0]])
    with pytest.raises(RequestError, match="'bad'"):
        build_constraint(smollm2, tools=[fn("bad", {"x": {"not": {}}}, [])])
    with pytest.raises(RequestError, match="not valid"):
        build_constraint(smollm2, tools=[fn('quote"d', {}, [])])


def test_budget_closes_the_call_in_time(smollm2):
    tok = smollm2.tokenizer
    for budget in (40, 45, 60):
        c = build_constraint(smollm2, tools=TOOLS, tool_choice="required", max_tokens=budget)
        out = []
        filler = tok.encode("a", add_special_tokens=False)[0]
        while len(out) < budget and not c.is_complete():
            forced = c.forced_tokens()
            token = forced[0] if forced else None
            if token is None:  # a model that never closes its string
                token = filler if allowed(c.mask(), filler) else int(np.argmax(_bits(c.mask())))
            c.accept(token)
            out.append(token)
        text = tok.decode(out)
        body = text.split("<tool_call>")[1].split("</tool_call>")[0]
        assert json.loads(body)["name"] in {"read_file", "read", "run"}
        assert c.closed_by_budget


def _bits(mask):
    row = np.array(mask).astype(np.uint32)
    return np.unpackbits(row.view(np.uint8), bitorder="little")


def test_first_seen_24_tools_wait_only_for_the_head(smollm2):
    # What keeps a first-seen tool set fast (benchmarks/constraint.py times it: well under
    # the 1 s target): only the small head over the names is compiled before the first
    # mask; each tool's call automaton compiles in the background until its name is chosen.
    tag = uuid.uuid4().hex[:6]
    tools = [fn(f"tool_{tag}_{i}", {"path": S, "n": {"type": "integer", "minimum": 0},
                                    "mode": {"enum": ["a", "b", "c"]}, "tags": {"type": "array", "items": S}},
                ["path"]) for i in range(24)]
    c = build_constraint(smollm2, tools=tools, tool_choice="required")
    assert c.mask() is not None
    toolset = c._tools
    assert toolset._calls == {} and len(toolset._futures) == 24
    name = f"tool_{tag}_7"
    assert toolset.call(name).index is not None and list(toolset._calls) == [name]


def test_compiling_now_never_cancels_a_future_other_requests_wait_on(smollm2, locals_home):
    import threading
    import time

    from locals.engine.constrain import compile as compiler

    vocab = token_vocab(smollm2.tokenizer, smollm2.vocab_size)
    release = threading.Event()
    # Keep both workers busy so the next submit stays queued, as a prefetch behind others does.
    blockers = [compiler._run_detached(release.wait, 30) for _ in range(2)]
    deadline = time.monotonic() + 30
    while not all(b.running() for b in blockers) and time.monotonic() < deadline:
        time.sleep(0.01)  # both slots taken before the next submit
    try:
        regex = '"shared-' + str(threading.get_ident()) + '"'
        queued = compiler.submit(regex, vocab)  # what a second request with the same tools waits on
        assert not queued.running() and not queued.done()
        mine = compiler.compile_now(regex, vocab, queued, "test tool")
        assert not queued.cancelled()
    finally:
        release.set()
    for b in blockers:
        b.result(timeout=30)
    theirs = compiler.wait(queued, "test tool", timeout=60)
    assert theirs is mine  # the worker found the request's own build cached


def test_a_compile_past_its_limit_never_keeps_the_process_alive():
    """`locals generate` printed its "takes too long" error and then waited minutes for the
    compile: a still-running compile must not hold the interpreter at exit."""
    import subprocess
    import sys
    import time

    script = ("import time, types\n"
              "from locals.engine.constrain import compile as c\n"
              "from locals.errors import RequestError\n"
              "c._build = lambda *args: time.sleep(600)  # a compile that runs for minutes\n"
              "try:\n"
              "    c.compile_regex('x', types.SimpleNamespace(fingerprint='f'), 'the schema', timeout=0.2)\n"
              "except RequestError as exc:\n"
              "    print(exc)\n")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "takes too long to compile" in done.stdout, done.stderr
    assert time.monotonic() - t0 < 60  # not the 600 s the compile would take
