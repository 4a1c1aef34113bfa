"""Tool-call formats under random sampling: Qwen3-Coder XML and Llama 3 JSON on a tiny random model.

A random model at temperature 1.5 writes whatever its logits say, so every call it makes is
what the automaton allowed. Each reply goes through the server's own splitter and mlx-lm's
parser for the format; every call must parse, name an offered tool and validate against
that tool's schema, also when the token budget cuts it off (the closing is then forced).
"""

from __future__ import annotations

import dataclasses
import json
import random

import jsonschema
import pytest

from locals.engine.constrain import build_constraint
from locals.engine.constrain.formats import FORMATS
from locals.server.toolcalls import ToolCall, ToolCallSplitter, tool_format_of

from tests.helpers.constrain_tools import CODING_TOOLS, generate

pytestmark = pytest.mark.model
S = {"type": "string"}
TYPED_TOOLS = [
    {"type": "function", "function": {"name": "configure", "parameters": {"type": "object", "properties": {
        "mode": {"type": "string", "enum": ["fast", "safe"]}, "level": {"type": "integer", "minimum": 0, "maximum": 9},
        "ratio": {"type": "number"}, "dry_run": {"type": "boolean"}, "label": {"anyOf": [S, {"type": "null"}]},
        "paths": {"type": "array", "items": S, "maxItems": 2},
        "owner": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
        "required": ["mode", "level", "dry_run", "owner"]}}},
]
TOOLS = CODING_TOOLS + TYPED_TOOLS
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PROMPT = "Read README.md, then configure the build and run the tests."


def with_format(loaded, parser: str):
    return dataclasses.replace(loaded, tool_format=parser)


def parse_reply(loaded, text: str) -> tuple[list[ToolCall], str]:
    """The reply as the server reads it: calls (mlx-lm's parser) and the plain text left."""
    splitter = ToolCallSplitter(tool_format_of(loaded), TOOLS)
    pieces = splitter.feed(text) + splitter.finish()
    return [p for p in pieces if isinstance(p, ToolCall)], "".join(p for p in pieces if isinstance(p, str))


def run_format(loaded, choice: str, n: int, budgets: list[int], seed: int) -> list[tuple[list[ToolCall], str]]:
    prompt = loaded.tokenizer.encode(PROMPT, add_special_tokens=False)
    replies = []
    for start in range(0, n, 26):
        rows = budgets[start:start + 26]
        cs = [build_constraint(loaded, tools=TOOLS, tool_choice=choice, max_tokens=b) for b in rows]
        texts = generate(loaded, prompt, cs, rows, seed=seed + start)
        replies += [parse_reply(loaded, t) for t in texts]
    return replies


def check(replies, fmt: str, *, required: bool) -> int:
    calls = 0
    marker = FORMATS[fmt].marker.decode()
    for found, rest in replies:
        assert marker not in rest, f"an unparsed call was left as text: {rest!r}"
        assert not required or found, "tool_choice=required produced no call"
        if fmt == "llama3_json":
            assert len(found) <= 1  # its template holds one call per reply
        for call in found:
            assert call.name in SCHEMAS, call.name
            jsonschema.validate(call.arguments, SCHEMAS[call.name])
            calls += 1
    return calls


@pytest.mark.slow  # ~20-30 s each on 2 CPU cores
@pytest.mark.parametrize("fmt", ["qwen3_coder", "llama3_json"])
def test_required_calls_parse_and_validate_over_52_generations(tiny_llama, fmt):
    loaded = with_format(tiny_llama, fmt)
    rng = random.Random(5)
    shortest = len(build_constraint(loaded, tools=TOOLS, tool_choice="required").closing_tokens())
    # Longest of the shortest calls, so some budgets cut calls off and some leave room to roam.
    budgets = [rng.choice([rng.randint(60, 110), 160]) for _ in range(52)]
    assert min(budgets) > shortest
    replies = run_format(loaded, "required", 52, budgets, seed=21)
    assert check(replies, fmt, required=True) >= 52


@pytest.mark.parametrize("fmt", ["qwen3_coder", "llama3_json"])
def test_auto_replies_parse_and_none_never_constrains(tiny_llama, fmt):
    loaded = with_format(tiny_llama, fmt)
    replies = run_format(loaded, "auto", 26, [48] * 26, seed=31)
    check(replies, fmt, required=False)
    assert build_constraint(loaded, tools=TOOLS, tool_choice="none") is None


def test_a_named_tool_is_the_only_call(tiny_llama):
    loaded = with_format(tiny_llama, "qwen3_coder")
    choice = {"type": "function", "function": {"name": "configure"}}
    cs = [build_constraint(loaded, tools=TOOLS, tool_choice=choice, max_tokens=160) for _ in range(8)]
    texts = generate(loaded, loaded.tokenizer.encode(PROMPT), cs, [160] * 8, seed=41)
    for text in texts:
        found, _ = parse_reply(loaded, text)
        assert [c.name for c in found] == ["configure"], text
        jsonschema.validate(found[0].arguments, SCHEMAS["configure"])


def xml_value(value) -> str:
    """A value as Qwen3-Coder's chat template writes it (strings raw, containers as JSON)."""
    if isinstance(value, str):
        return value
    return "null" if value is None else json.dumps(value)


def test_template_formats_round_trip_through_the_automaton(tiny_llama):
    """What each model's chat template writes for a call is accepted token by token."""
    from tests.helpers.constrain_tools import feed

    args = {"mode": "safe", "level": 3, "ratio": 0.5, "dry_run": False, "label": None,
            "paths": ["a.py"], "owner": {"id": 7}}
    blocks = "".join(f"<parameter={k}>\n{xml_value(v)}\n</parameter>\n" for k, v in args.items())
    xml = f"<tool_call>\n<function=configure>\n{blocks}</function>\n</tool_call>"
    llama = '<|python_tag|>{"name": "configure", "parameters": ' + json.dumps(args) + "}"
    for fmt, text in (("qwen3_coder", xml), ("llama3_json", llama)):
        loaded = with_format(tiny_llama, fmt)
        c = build_constraint(loaded, tools=TOOLS, tool_choice="required")
        feed(c, text, loaded.tokenizer)
        c.accept(loaded.tokenizer.eos_token_id)
        assert c.is_complete()
        found, rest = parse_reply(loaded, text)
        assert [(f.name, f.arguments) for f in found] == [("configure", args)], (fmt, rest)
