"""Constrained decoding: tool calls and JSON outputs that always parse and match their schema.

`build_constraint` is the one entry point (the server and the CLI call it): it compiles
a request's tools or JSON schema into a TokenConstraint (contract.py) that the
engine applies each step. Only this package imports outlines-core.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from locals.engine.constrain import compile as compiler
from locals.engine.constrain.automaton import JsonConstraint, ToolCallConstraint
from locals.engine.constrain.formats import tool_format
from locals.engine.constrain.schema import schema_regex
from locals.engine.constrain.tools import DeviceRow, ToolSet, token_row, tool_schemas
from locals.engine.constrain.vocab import token_vocab
from locals.errors import RequestError

__all__ = ["build_constraint", "warm_up", "JsonConstraint", "ToolCallConstraint"]

TOOLSET_ENTRIES = 32
_toolsets: "OrderedDict[tuple, ToolSet]" = OrderedDict()
_toolsets_lock = threading.Lock()


def _choice(tool_choice) -> tuple[str, str | None]:
    """("auto" | "none" | "required", named function or None) from OpenAI/Anthropic shapes."""
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        mode = {"any": "required"}.get(tool_choice, tool_choice)
        if mode not in ("auto", "none", "required"):
            raise RequestError(f"tool_choice {tool_choice!r} is not one of auto, none, required or a named function")
        return mode, None
    if isinstance(tool_choice, dict):
        kind = tool_choice.get("type")
        if kind in ("auto", "none", "required", "any"):
            return _choice(kind)
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        if kind in ("function", "tool") and isinstance(name, str):
            return "required", name
    raise RequestError('tool_choice must be "auto", "none", "required" or '
                       '{"type": "function", "function": {"name": …}}')


def _tool_set(loaded, vocab, fmt, schemas: dict[str, dict]) -> ToolSet:
    key = (vocab.fingerprint, fmt.parser, json.dumps(schemas, sort_keys=True))
    with _toolsets_lock:
        hit = _toolsets.get(key)
        if hit is not None:
            _toolsets.move_to_end(key)
            return hit
    built = ToolSet(vocab, fmt, schemas)
    with _toolsets_lock:
        _toolsets[key] = built
        while len(_toolsets) > TOOLSET_ENTRIES:
            _toolsets.popitem(last=False)
    return built


def _fits_budget(constraint, max_tokens: int | None, what: str):
    """The constraint, or a RequestError when even the shortest valid output exceeds max_tokens."""
    if max_tokens is not None:
        need = len(constraint.closing_tokens())
        if need > max_tokens:
            raise RequestError(f"max_tokens={max_tokens} is too small for {what}: its shortest valid "
                               f"output takes {need} tokens; raise max_tokens")
    return constraint


def _reply_or_call(vocab, fmt, schemas: dict[str, dict], json_schema: dict, max_tokens: int | None,
                   strict: bool) -> JsonConstraint:
    """Tools on "auto" beside a response schema: the output is the schema's JSON value, or one
    call. One automaton over both, without the tool head's lazy compile: a rare pairing (an
    agent framework's typed output beside its tools)."""
    reply = schema_regex(json_schema, label="the response JSON schema", strict=strict)
    calls = "|".join(f"(?:{fmt.call_regex(name, fmt.arguments_regex(schema, f'tool {name!r} parameters'))})"
                     for name, schema in schemas.items())
    regex = f"(?:{reply})|(?:{calls})"
    index = compiler.compile_regex(regex, vocab, label="the response JSON schema or a tool call")
    constraint = JsonConstraint(index, DeviceRow(token_row(vocab, vocab.eos_ids)), max_tokens=max_tokens)
    return _fits_budget(constraint, max_tokens, "the response JSON schema")


def build_constraint(loaded, *, tools: list[dict] | None = None, tool_choice="auto",
                     json_schema: dict | None = None, parallel_tool_calls: bool = True,
                     max_tokens: int | None = None, strict_schema: bool = False):
    """The TokenConstraint for a request, or None when nothing is constrained.

    `tools` are OpenAI-shaped; `tool_choice` is "auto" (free text until a call starts),
    "required", "none" or a named function (exactly one call of it). `json_schema`
    constrains the whole output to one JSON value; with tools on "auto", to that value or one
    call ("required" and a named tool leave no reply to hold to it).
    With `max_tokens`, the last tokens are spent on the shortest valid completion, so an
    output cut off by the limit still parses (the constraint's `closed_by_budget` is then
    True). Raises RequestError naming the schema part that cannot be enforced or takes too long
    (with `strict_schema`, also the rules the automaton would drop: schema.UNENFORCED).
    """
    mode, named = _choice(tool_choice)
    vocab = token_vocab(loaded.tokenizer, loaded.vocab_size)
    if tools and mode != "none":
        schemas = tool_schemas(tools)
        if named is not None:
            if named not in schemas:
                raise RequestError(f"tool_choice names {named!r}, which is not among the offered tools")
            schemas = {named: schemas[named]}
        fmt = tool_format(getattr(loaded, "tool_format", None))
        if fmt is None:
            if mode == "auto":
                return None  # calls are still parsed after generation, just not enforced
            raise RequestError(f"tool_choice {tool_choice!r} needs constrained tool calls, which the "
                               f"{loaded.tool_format!r} tool-call format of this model does not support")
        if json_schema is not None and mode == "auto":
            return _reply_or_call(vocab, fmt, schemas, json_schema, max_tokens, strict_schema)
        toolset = _tool_set(loaded, vocab, fmt, schemas)
        max_calls = 1 if named is not None or not parallel_tool_calls or not fmt.parallel else None
        constraint = ToolCallConstraint(toolset, required=mode == "required", max_calls=max_calls,
                                        max_tokens=max_tokens)
        return _fits_budget(constraint, max_tokens, "a tool call") if mode == "required" else constraint
    if json_schema is not None:
        regex = schema_regex(json_schema, label="the response JSON schema", strict=strict_schema)
        index = compiler.compile_regex(regex, vocab, label="the response JSON schema")
        constraint = JsonConstraint(index, DeviceRow(token_row(vocab, vocab.eos_ids)), max_tokens=max_tokens)
        return _fits_budget(constraint, max_tokens, "the response JSON schema")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("tools must be a list of {\"type\": \"function\", \"function\": …} objects")
    return None


def warm_up(loaded) -> None:
    """Build the tokenizer's byte vocabulary now and compile the json_object automaton in the
    background (from disk when cached), so the first constrained request does not wait."""
    vocab = token_vocab(loaded.tokenizer, loaded.vocab_size)
    vocab.outlines_vocabulary()
    compiler.submit(schema_regex({"type": "object"}, label="json_object"), vocab)
