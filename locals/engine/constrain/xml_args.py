"""A tool's JSON-schema parameters as the regex of Qwen3-Coder's XML parameter blocks.

`<parameter=NAME>\\nVALUE\\n</parameter>\\n` per argument, in the schema's property order,
required ones always present. mlx-lm's qwen3_coder parser turns VALUE back into a Python
value by the property's JSON-schema `type`, so each VALUE is limited to the texts that
parser converts into something the schema accepts: strings are free text without the
closing markers (and never "null", which it reads as None), numbers and booleans exact,
enums the texts the parser maps onto their members, objects and arrays JSON.
With `holes`, each free-text value is one hole byte instead (values.py checks the text
at runtime), which keeps the automaton about the size of the JSON format's.
"""

from __future__ import annotations

import math
import re

from mlx_lm.tool_parsers.qwen3_coder import _convert_param_value

from locals.engine.constrain.freetext import Avoiding
from locals.engine.constrain.pattern import pattern_regex
from locals.engine.constrain.schema import MAX_BOUND, integer_bound, integer_range_regex, schema_regex
from locals.engine.constrain.values import ANY, HOLE_BYTES, HOLE_CLASS, NOT_CONTAINER, NOT_NULL
from locals.errors import RequestError

# What ends a value for the parser.
CLOSING_MARKERS = ("</parameter>",)
_NAME = re.compile(r"^[^\s<>]+$")
_INTEGER_DIGITS = 15  # the parser goes through float(): longer integers would lose digits
_NUMBER = r"-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?([eE][+-]?[0-9]{1,2})?"
_NOTES = {"description", "title", "default", "examples"}
_HOLE_CHARS = re.compile(f"[{HOLE_CLASS}]")
HOLE_CHARS = "".join(map(chr, HOLE_BYTES.values()))


def _text(value) -> str:
    return value if isinstance(value, str) else "true" if value is True else "false" \
        if value is False else "null" if value is None else str(value)


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b or (type(a) in (int, float) and type(b) in (int, float) and a == b)


class _Values:
    """Value regexes for one tool's properties (`label` names the tool in errors)."""

    def __init__(self, root: dict, label: str, holes: bool):
        self.root = root
        self.label = label
        self.free = Avoiding(CLOSING_MARKERS)
        self.holes = holes

    def hole(self, kind: int, inline: str) -> str:
        return f"\\x{HOLE_BYTES[kind]:02x}" if self.holes else inline

    def fail(self, name: str, why: str) -> RequestError:
        return RequestError(f"{self.label}: parameter {name!r} {why}, which the Qwen3-Coder XML tool-call "
                            "format cannot carry; give it one plain JSON-schema 'type'")

    def resolve(self, schema):
        seen = 0
        while isinstance(schema, dict) and "$ref" in schema and seen < 32:
            ref, seen = schema["$ref"], seen + 1
            target = self.root
            for part in ref.removeprefix("#/").split("/") if ref.startswith("#/") else [None]:
                target = target.get(part, {}) if isinstance(target, dict) and part else {}
            schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return schema

    def value(self, name: str, schema) -> str:
        schema = self.resolve(schema)
        if schema is True or schema == {} or (isinstance(schema, dict) and not set(schema) - _NOTES):
            return self.hole(ANY, self.free.any())  # anything the parser returns is valid for an empty schema
        if not isinstance(schema, dict):
            raise self.fail(name, "has a schema that is not an object")
        if "enum" in schema or "const" in schema:
            return self.choices(name, schema)
        kind = schema.get("type")
        if kind is None:
            return self.untyped(name, schema)
        if not isinstance(kind, str):
            raise self.fail(name, f"has several types {kind!r}")
        if kind == "string":
            return self.string(name, schema)
        if kind == "integer":
            return self.integer(schema)
        if kind == "number":
            return _NUMBER
        if kind == "boolean":
            return "(true|false)"
        if kind == "null":
            return "null"
        if kind in ("object", "array"):
            sub = {**schema, **{k: self.root[k] for k in ("$defs", "definitions") if k in self.root}}
            # With holes, JSON strings in these values write `</` as `<\/` (same JSON text): one
            # extra state per string instead of one per character of `</parameter>`.
            avoid = ("</",) if self.holes else CLOSING_MARKERS
            return schema_regex(sub, label=f"{self.label} parameter {name!r}", avoid=avoid)
        raise self.fail(name, f"has type {kind!r}")

    def choices(self, name: str, schema: dict) -> str:
        """The texts the parser converts back into exactly each enum member."""
        members = schema["enum"] if "enum" in schema else [schema["const"]]
        config = {name: schema}
        texts = []
        for member in members:
            text = _text(member)
            try:
                ok = _same(_convert_param_value(text, name, config), member)
            except (ValueError, TypeError, OverflowError):
                ok = False
            if ok and not any(m in text for m in CLOSING_MARKERS) and not _HOLE_CHARS.search(text):
                texts.append(text)
        if not texts:
            raise self.fail(name, f"allows only values ({members!r}) that its parser reads back differently")
        return "(" + "|".join(re.escape(t) for t in texts) + ")"

    def string(self, name: str, schema: dict) -> str:
        low, high = schema.get("minLength"), schema.get("maxLength")
        if "pattern" in schema:
            if low is not None or high is not None:
                raise self.fail(name, "combines 'pattern' with minLength/maxLength (one automaton cannot "
                                      "enforce both)")
            try:  # no `<` (it could start `</parameter>`), no hole bytes, never "null" (read as None)
                return f"({pattern_regex(schema['pattern'], '<' + HOLE_CHARS, no_null=True)})"
            except ValueError as exc:
                raise RequestError(f"{self.label}: parameter {name!r} cannot be enforced in the Qwen3-Coder "
                                   f"XML tool-call format: {exc}") from None
        if low is None and high is None:
            return self.hole(NOT_NULL, self.free.not_word("null"))
        if max(low or 0, high or 0) > MAX_BOUND:  # unrolled by the automaton (schema.MAX_BOUND)
            raise RequestError(f"{self.label}: parameter {name!r} has a length bound over {MAX_BOUND:,}: its "
                               "automaton would not fit in memory; lower it or leave it out")
        # Bounded: no `<` at all (it could start a closing marker), and never "null".
        return _bounded_not_null(low or 0, high)

    def integer(self, schema: dict) -> str:
        low = integer_bound(schema, "minimum", "exclusiveMinimum", math.ceil, 1)
        high = integer_bound(schema, "maximum", "exclusiveMaximum", math.floor, -1)
        if low is not None and high is not None and low > high:
            raise RequestError(f"{self.label}: an integer parameter allows no value (minimum {low} > maximum {high})")
        regex = integer_range_regex(low, high)
        # Open-ended ranges end in `{d,}`: cap the digits so the parser's float() keeps them exact.
        return re.sub(r"\{(\d+),\}", lambda m: f"{{{m.group(1)},{max(int(m.group(1)), _INTEGER_DIGITS - 1)}}}",
                      regex)

    def untyped(self, name: str, schema: dict) -> str:
        """anyOf/oneOf of a plain string and null (Optional[str]): the parser json.loads the text
        first, so it must not start like a JSON container; "null" is fine (None is allowed)."""
        branches = schema.get("anyOf") or schema.get("oneOf") or []
        kinds = {self.resolve(b).get("type") if isinstance(b, dict) and not set(self.resolve(b)) - _NOTES - {"type"}
                 else "complex" for b in branches}
        if kinds == {"string", "null"}:
            return self.hole(NOT_CONTAINER, self.free.not_container())
        raise self.fail(name, "has no single 'type'")


def _bounded_not_null(low: int, high: int | None) -> str:
    """Text of `low`..`high` characters without `<` (nor hole bytes), except "null" in any case."""
    top = "" if high is None else str(high)
    c = f"[^<{HOLE_CLASS}"
    if not low <= 4 <= (high if high is not None else 4):
        return f"({c}]{{{low},{top}}})"
    parts = [f"{c}]{{{low},3}}"] if low <= 3 else []
    if high is None or high >= 5:
        parts.append(f"{c}]{{5,{top}}}")
    parts += [f"{c}nN]{c}]{{3}}", f"[nN]{c}uU]{c}]{{2}}", f"[nN][uU]{c}lL]{c}]", f"[nN][uU][lL]{c}lL]"]
    return "(" + "|".join(parts) + ")"


def parameters_regex(schema, *, label: str, holes: bool = False) -> str:
    """The regex of the XML parameter blocks for a tool whose parameters are `schema`
    (`holes`: free-text values as hole bytes, checked at runtime by values.py)."""
    if schema is True or schema is None:
        schema = {"type": "object"}
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise RequestError(f"{label}: tool parameters must be a JSON schema of type object")
    values = _Values(schema, label, holes)
    required = set(schema.get("required", []))
    parts = []
    for name, sub in (schema.get("properties") or {}).items():
        if not _NAME.match(name):
            raise RequestError(f"{label}: parameter name {name!r} has spaces or '<'/'>', which the "
                               "Qwen3-Coder XML tool-call format cannot carry; rename it")
        block = f"<parameter={re.escape(name)}>\n{values.value(name, sub)}\n</parameter>\n"
        parts.append(f"({block})" + ("" if name in required else "?"))
    missing = required - set(schema.get("properties") or {})
    if missing:
        raise RequestError(f"{label}: required parameters {sorted(missing)} have no schema in 'properties'")
    return "".join(parts)
