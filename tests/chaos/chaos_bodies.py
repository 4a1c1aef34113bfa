"""Hypothesis strategies for hostile request bodies, one valid base body per endpoint.

A generated case is an endpoint plus the raw bytes to POST: the base body with a few
fields replaced, removed or added (wrong types, huge numbers, NaN/Infinity, enormous
strings, absurd or cyclic JSON schemas and tools, malformed messages), or a body broken
below JSON (deep nesting, invalid UTF-8, truncation, a top-level non-object). The checks
that every answer must pass live in `chaos_checks.py`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

from hypothesis import strategies as st


@dataclass(frozen=True)
class Endpoint:
    path: str
    api: str  # whose error shape the path answers with: "openai", "anthropic" or "ollama"
    base: dict  # a valid body (a short reply)
    fields: tuple[str, ...]  # the top-level fields the API reads
    streams: bool = True  # whether `stream` is a field of this endpoint


_USER = [{"role": "user", "content": "Say hi."}]
ENDPOINTS = (
    Endpoint("/v1/chat/completions", "openai", {"model": "m", "messages": _USER, "max_tokens": 3},
             ("model", "messages", "tools", "tool_choice", "response_format", "stream",
              "stream_options", "max_tokens", "max_completion_tokens", "temperature", "top_p",
              "top_k", "min_p", "seed", "stop", "logprobs", "top_logprobs", "n",
              "parallel_tool_calls")),
    Endpoint("/v1/completions", "openai", {"model": "m", "prompt": "Hello", "max_tokens": 3},
             ("model", "prompt", "stream", "max_tokens", "temperature", "top_p", "seed", "stop",
              "logprobs", "n")),
    Endpoint("/v1/responses", "openai", {"model": "m", "input": "Say hi.", "max_output_tokens": 3},
             ("model", "input", "instructions", "tools", "tool_choice", "text", "stream",
              "max_output_tokens", "temperature", "top_p", "parallel_tool_calls", "store",
              "previous_response_id", "reasoning")),
    Endpoint("/v1/messages", "anthropic", {"model": "m", "max_tokens": 3, "messages": _USER},
             ("model", "messages", "system", "tools", "tool_choice", "stream", "max_tokens",
              "temperature", "top_p", "top_k", "stop_sequences", "metadata", "thinking")),
    Endpoint("/v1/messages/count_tokens", "anthropic", {"model": "m", "messages": _USER},
             ("model", "messages", "system", "tools"), streams=False),
    Endpoint("/api/chat", "ollama",
             {"model": "m", "messages": _USER, "stream": False, "options": {"num_predict": 3}},
             ("model", "messages", "tools", "format", "stream", "options", "keep_alive", "think")),
    Endpoint("/api/generate", "ollama",
             {"model": "m", "prompt": "Hello", "stream": False, "options": {"num_predict": 3}},
             ("model", "prompt", "system", "raw", "format", "stream", "options", "images",
              "keep_alive")),
    Endpoint("/api/show", "ollama", {"model": "m"}, ("model", "name", "verbose"), streams=False),
    # Not offered: Ollama clients that try them must get Ollama's 404 shape.
    Endpoint("/api/embed", "ollama", {"model": "m", "input": "Hello"}, ("model", "input"),
             streams=False),
    Endpoint("/api/embeddings", "ollama", {"model": "m", "prompt": "Hello"}, ("model", "prompt"),
             streams=False),
)
OPTION_FIELDS = ("num_predict", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "num_ctx")

HUGE_NUMBERS = st.sampled_from([10**400, -(10**400), 2**63, 2**64, -(2**63) - 1, 2**31, 1e308,
                                -1e308, 5e-324, -1, 0, float("nan"), float("inf"), float("-inf")])
NUMBERS = HUGE_NUMBERS | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
TEXT = st.text(max_size=24) | st.sampled_from(["", " ", "\x00", "\ud800", "\udfff", "a\ud83dz",
                                               "<|im_end|>", "<tool_call>", "\u202e", "\ufeff"])
# Over the model's context (a 400) or just long (a prompt to read): both happen to agents.
ENORMOUS = st.builds(lambda char, n: char * n, st.sampled_from(["x", "é", "🙂", " ", "\n", "{"]),
                     st.sampled_from([4_000, 60_000, 400_000, 2_000_000]))
LEAVES = st.none() | st.booleans() | NUMBERS | TEXT
JSON = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(TEXT, inner, max_size=4), max_leaves=10)

_SCHEMA_KEYS = ("type", "properties", "items", "required", "enum", "const", "anyOf", "oneOf",
                "allOf", "not", "$ref", "$defs", "definitions", "pattern", "format", "minLength",
                "maxLength", "minItems", "maxItems", "minimum", "maximum", "additionalProperties",
                "prefixItems", "multipleOf", "uniqueItems", "minProperties", "maxProperties")
_TYPES = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null",
                          "nonsense"]) | st.lists(st.sampled_from(["string", "integer", "null"]),
                                                  max_size=3)
ABSURD_SCHEMAS = st.sampled_from([
    {"$ref": "#"},
    {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
    {"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]},
    {"$ref": "#/definitions/missing"}, {"$ref": "http://example.com/schema.json"},
    {"type": "string", "maxLength": 10**12}, {"type": "string", "minLength": 10**9},
    {"type": "array", "minItems": 10**9}, {"type": "array", "items": {"type": "array", "minItems": 50,
                                                                     "items": {"minItems": 50}}},
    {"type": "integer", "minimum": 10, "maximum": 1}, {"type": "number", "multipleOf": 0},
    {"type": "string", "pattern": "(a|aa)*(b|bb)*{1000}"}, {"type": "string", "pattern": "[z-a]"},
    {"type": "string", "pattern": "(" * 500}, {"type": "string", "format": "no-such-format"},
    {"enum": []}, {"anyOf": []}, {"allOf": [{"type": "string"}, {"type": "integer"}]},
    {"not": {}}, {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)},
                  "required": [f"p{i}" for i in range(300)]},
    {"type": "object", "additionalProperties": {"$ref": "#"}}, False, True, [], "object",
])


def _schema_node(children):
    return st.dictionaries(st.sampled_from(_SCHEMA_KEYS), _TYPES | children | HUGE_NUMBERS | TEXT
                           | st.lists(children, max_size=3)
                           | st.dictionaries(TEXT, children, max_size=3), max_size=5)


SCHEMAS = ABSURD_SCHEMAS | st.recursive(st.builds(dict, type=_TYPES), _schema_node, max_leaves=8)


def _openai_tool(name, schema):
    return {"type": "function", "function": {"name": name, "description": "d", "parameters": schema}}


def _anthropic_tool(name, schema):
    return {"name": name, "description": "d", "input_schema": schema}


TOOL_NAMES = st.sampled_from(["get_weather", "", "a" * 300, "with space", "ünï", "x.y"]) | TEXT
TOOL_LISTS = (st.lists(st.builds(_openai_tool, TOOL_NAMES, SCHEMAS), max_size=4)
              | st.lists(st.builds(_anthropic_tool, TOOL_NAMES, SCHEMAS), max_size=4)
              | st.lists(JSON, max_size=3)
              | st.builds(lambda tool, n: [tool] * n, st.builds(_openai_tool, TOOL_NAMES, SCHEMAS),
                          st.integers(50, 400)))
ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "",
                         "SYSTEM"]) | TEXT
CONTENT = (TEXT | ENORMOUS | JSON
           | st.lists(st.fixed_dictionaries({"type": st.sampled_from(
               ["text", "input_text", "image_url", "image", "tool_use", "tool_result", "refusal",
                "document", "thinking"]) | TEXT}, optional={"text": TEXT | JSON, "content": JSON,
                                                           "input": JSON, "id": TEXT | JSON,
                                                           "source": JSON}), max_size=3))
TOOL_CALLS = st.lists(st.fixed_dictionaries({}, optional={
    "id": TEXT | JSON, "type": TEXT, "function": st.fixed_dictionaries(
        {}, optional={"name": TOOL_NAMES | JSON, "arguments": TEXT | JSON
                      | st.sampled_from(['{"a": 1}', "{", "[]", '"s"', "null", "NaN"])})}), max_size=3)
MESSAGE = st.fixed_dictionaries({"role": ROLES}, optional={
    "content": CONTENT, "tool_calls": TOOL_CALLS | JSON, "tool_call_id": TEXT | JSON,
    "name": TEXT | JSON, "images": JSON})
SHORT_MESSAGE = st.fixed_dictionaries({"role": ROLES, "content": TEXT})
# Long conversations repeat a short message: a repeated enormous one would not fit in memory.
MESSAGES = st.lists(MESSAGE, max_size=5) | JSON | st.builds(
    lambda m, n: [m] * n, SHORT_MESSAGE, st.integers(100, 2000))

# Values for any field: anything JSON, plus the shapes of the fields that carry structure.
ANY_VALUE = (JSON | NUMBERS | ENORMOUS | MESSAGES | TOOL_LISTS | SCHEMAS
             | st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}, SCHEMAS)
             | st.builds(lambda s: {"format": {"type": "json_schema", "schema": s}}, SCHEMAS)
             | st.dictionaries(st.sampled_from(OPTION_FIELDS), NUMBERS | TEXT | JSON, max_size=4))


@st.composite
def mutated_body(draw, endpoint: Endpoint) -> dict:
    """The endpoint's base body with one to four fields replaced, removed or added."""
    body = copy.deepcopy(endpoint.base)
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["set", "set", "set", "remove", "extra", "option"]))
        if action == "remove" and body:
            body.pop(draw(st.sampled_from(sorted(body))))
        elif action == "extra":
            body[draw(TEXT)] = draw(ANY_VALUE)
        elif action == "option":
            options = body.get("options") if isinstance(body.get("options"), dict) else {}
            options[draw(st.sampled_from(OPTION_FIELDS))] = draw(NUMBERS | TEXT | JSON)
            body["options"] = options
        else:
            body[draw(st.sampled_from(endpoint.fields))] = draw(ANY_VALUE)
    if endpoint.streams and draw(st.booleans()):
        body["stream"] = True
    return body


def nested(opener: bytes, depth: int, closed: bool) -> bytes:
    closer = {b"[": b"]", b'{"a":': b"}"}[opener]
    return opener * depth + ((b"1" + closer * depth) if closed else b"")


RAW_BREAKS = st.one_of(
    st.builds(nested, st.sampled_from([b"[", b'{"a":']), st.sampled_from([100, 1_000, 5_000, 100_000]),
              st.booleans()),
    st.sampled_from([b"", b" ", b"null", b"[]", b'"text"', b"42", b"NaN", b"{", b"}", b"\xff\xfe",
                     b"\xef\xbb\xbf{}", b'{"a":1}{"b":2}', b"{'single': 'quotes'}"]),
    st.binary(max_size=64),
)


def serialize(body: dict, ascii_only: bool) -> bytes:
    """JSON as Python writes it, NaN and Infinity included (other clients write those too); a
    lone surrogate becomes a `\\ud800` escape when `ascii_only`, else invalid UTF-8 bytes."""
    text = json.dumps(body, allow_nan=True, ensure_ascii=ascii_only)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def request_case(draw, endpoints=ENDPOINTS) -> tuple[Endpoint, bytes]:
    """(endpoint, raw body): mostly mutated JSON bodies, some corrupted below JSON."""
    endpoint = draw(st.sampled_from(endpoints))
    kind = draw(st.sampled_from(["json"] * 6 + ["raw", "invalid-utf8", "truncated"]))
    if kind == "raw":
        return endpoint, draw(RAW_BREAKS)
    data = serialize(draw(mutated_body(endpoint)), draw(st.booleans()))
    if kind == "invalid-utf8":
        at = draw(st.integers(0, len(data)))
        return endpoint, data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"])) + data[at:]
    if kind == "truncated":
        return endpoint, data[:draw(st.integers(0, max(0, len(data) - 1)))]
    return endpoint, data
