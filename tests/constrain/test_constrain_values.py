"""Qwen3-Coder XML values checked at runtime (holes): the rule against mlx-lm's parser, masks
against steps, closings from every prefix, and automata small enough for a 24-tool set."""

from __future__ import annotations

import dataclasses
import random
import uuid

import jsonschema
import numpy as np
import pytest
from mlx_lm.tool_parsers import qwen3_coder

from locals.engine.constrain import build_constraint
from locals.engine.constrain.automaton import Phase
from locals.engine.constrain.values import ANY, END, MARKER, NOT_CONTAINER, NOT_NULL, feed, start

S = {"type": "string"}
PIECES = [p.encode() for p in ["</parameter>", "</param", "</", "<", "\n", "\n<", "null", "NuLl", "nul", "[",
                                 "{", " ", "a", "é", "日", "\x00", ">", "\r", "\t"]] + [b"\xe2\x82", b"\xff"]
SCHEMA = {ANY: {}, NOT_NULL: S, NOT_CONTAINER: {"anyOf": [S, {"type": "null"}]}}


def _values(n: int):
    rng = random.Random(3)
    for _ in range(n):
        yield b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 5)))


def _oracle(kind: int, raw: bytes) -> bool:
    """What the parser needs of a value: no end marker, text, not "null" for strings, no JSON
    container for Optional[str]; plus what the rule adds: valid UTF-8 without hole bytes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if MARKER in raw or any(b in raw for b in b"\x00\x01\x02"):
        return False
    if kind == NOT_NULL and text.lower() == "null":
        return False
    return not (kind == NOT_CONTAINER and text.lstrip(" \t\n\r")[:1] in ("[", "{"))


def _feed_chunks(kind: int, data: bytes, rng: random.Random):
    vs, pos = start(kind), 0
    while pos < len(data):
        size = rng.randint(1, 6)
        result = feed(vs, data[pos:pos + size])
        if result is None:
            return None
        vs, cut = result
        if cut is not None:
            return pos + cut
        pos += size
    return vs


@pytest.mark.parametrize("kind", [ANY, NOT_NULL, NOT_CONTAINER])
def test_value_rule_is_exact_and_the_parser_reads_values_back(kind):
    rng = random.Random(kind)
    checked = 0
    for raw in _values(4000):
        ends = _feed_chunks(kind, raw + END + b"\n</function>", rng)
        assert (ends == len(raw) + len(END)) == _oracle(kind, raw), raw
        if ends == len(raw) + len(END):
            text = raw.decode()
            call = qwen3_coder.parse_tool_call(f"<function=t>\n<parameter=p>\n{text}\n</parameter>\n</function>",
                                               [{"function": {"name": "t", "parameters": {
                                                   "type": "object", "properties": {"p": SCHEMA[kind]}}}}])
            value = call["arguments"]["p"]
            assert value == text or (value is None and text.lower() == "null" and kind != NOT_NULL)
            jsonschema.validate(call["arguments"], {"type": "object", "properties": {"p": SCHEMA[kind]}})
            checked += 1
    assert checked > 300


def fn(name, props, required):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": required}}}


EDIT = [fn("edit_file", {"path": S, "old": S, "new": S, "n": {"type": "integer"}}, ["path", "old", "new"])]
CALL = ("<tool_call>\n<function=edit_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
        "<parameter=old>\n    return x  # </param <b>\n</parameter>\n<parameter=new>\n\n\nnull\n</parameter>\n"
        "<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>")


def _qwen(loaded):
    return dataclasses.replace(loaded, tool_format="qwen3_coder")


def _allowed(mask, token: int) -> bool:
    return bool((int(np.array(mask)[token >> 5]) >> (token & 31)) & 1)


def test_masks_agree_with_steps_along_a_call(smollm2):
    """At every position of a canonical call, the mask allows exactly the tokens `step` takes
    (checked on the tokens that can end a value or span into one, and a random sample)."""
    loaded = _qwen(smollm2)
    tok = loaded.tokenizer
    c = build_constraint(loaded, tools=EDIT, tool_choice="required")
    vocab = c._tools.vocab
    rng = random.Random(0)
    interesting = [t for t, b in enumerate(vocab.token_bytes) if b and (b">" in b or b"\n" in b)]
    seen_value = False
    for token in tok.encode(CALL, add_special_tokens=False):
        if c.phase in (Phase.CALL, Phase.VALUE):
            seen_value |= c.phase is Phase.VALUE
            mask = c.mask()
            for t in interesting[::7] + rng.sample(range(vocab.width_tokens), 200):
                assert _allowed(mask, t) == (c._run.step(c._pos, t) is not None), (c.phase, t, vocab.bytes_of(t))
        assert c.mask() is None or _allowed(c.mask(), token), token
        c.accept(token)
    assert seen_value and c.phase is Phase.BETWEEN


def test_closing_from_every_prefix_parses_and_validates(smollm2):
    loaded = _qwen(smollm2)
    tok = loaded.tokenizer
    ids = tok.encode(CALL, add_special_tokens=False)
    schema = EDIT[0]["function"]["parameters"]
    for cut in range(1, len(ids)):
        c = build_constraint(loaded, tools=EDIT, tool_choice="required")
        for t in ids[:cut]:
            c.accept(t)
        fork = c.fork()
        closing = c.closing_tokens()
        for t in closing:
            c.accept(t)
        assert c.phase is Phase.BETWEEN, (cut, tok.decode(ids[:cut] + closing))
        assert fork.phase is not Phase.BETWEEN or cut == len(ids)  # the fork did not move
        text = tok.decode(ids[:cut] + closing)
        call = qwen3_coder.parse_tool_call(text.split("<tool_call>")[1].split("</tool_call>")[0], EDIT)
        jsonschema.validate(call["arguments"], schema)


def test_indented_values_keep_the_tokenizers_own_tokens(smollm2):
    """`>\\n` followed by indentation is one token run the model writes itself: allowed as is."""
    loaded = _qwen(smollm2)
    tok = loaded.tokenizer
    c = build_constraint(loaded, tools=EDIT, tool_choice="required")
    text = "<tool_call>\n<function=edit_file>\n<parameter=path>\n    a.py\n</parameter>\n"
    for token in tok.encode(text, add_special_tokens=False):
        assert c.mask() is None or _allowed(c.mask(), token), tok.decode([token])
        c.accept(token)
    assert c.phase is Phase.CALL
    null_call = build_constraint(loaded, tools=EDIT, tool_choice="required")
    with pytest.raises(ValueError):
        for token in tok.encode("<tool_call>\n<function=edit_file>\n<parameter=path>\nNULL\n</parameter>",
                                add_special_tokens=False):
            null_call.accept(token)


def test_a_24_tool_qwen3_coder_set_stays_small(smollm2):
    """24 tools with four free-text strings each: inline, every string cost ~1.9M transitions
    (~180M for the set, out of reach); with holes the set is ~5.6M, below the hermes JSON
    format's ~8.5M for the same tools (the array of strings is most of it)."""
    loaded = _qwen(smollm2)
    tag = uuid.uuid4().hex[:6]
    tools = [fn(f"t{tag}_{i}", {"path": S, "old": S, "new": S, "glob": S, "limit": {"type": "integer", "minimum": 0},
                                "mode": {"enum": ["a", "b"]}, "tags": {"type": "array", "items": S}}, ["path"])
             for i in range(24)]
    c = build_constraint(loaded, tools=tools, tool_choice="required")
    total = 0
    for name in c._tools.names:
        index = c._tools.call(name).index
        total += sum(len(row) for row in index.index.get_transitions().values())
    assert total < 24 * 400_000, total
