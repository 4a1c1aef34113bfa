"""JSON schema -> regex for outlines-core, with rewrites that fix its known gaps.

Gaps fixed here (each has a test): `allOf` is merged into one schema (outlines-core
concatenates the parts, which is not JSON); integer `minimum`/`maximum` become an exact
range regex (outlines-core ignores them); strings also accept `\\uXXXX` escapes; the
whitespace is pinned to `json.dumps` style (`{"a": 1, "b": [1, 2]}`) so key names and
separators are forced (jump-forward) instead of optional; string `pattern`s are rewritten
to what a JSON string carries raw (pattern.py). Keywords that cannot be
expressed are refused with the JSON path of the part that uses them.
"""

from __future__ import annotations

import json
import math

import jsonschema
from outlines_core.json_schema import NUMBER, STRING, STRING_INNER, build_regex_from_schema

from locals.engine.constrain.freetext import json_string_body
from locals.engine.constrain.pattern import intersect_patterns, pattern_regex
from locals.errors import RequestError

UNSUPPORTED = ("not", "if", "then", "else", "contains", "dependentSchemas", "propertyNames",
               "unevaluatedProperties", "unevaluatedItems")
# Rules outlines-core drops without a word. A strict response format (`--schema`, OpenAI's
# `strict: true`) refuses them, since its reply promises to be valid; other schemas keep them
# unenforced (pydantic writes `uniqueItems` for a set; the value still has the right shape).
UNENFORCED = ("multipleOf", "minProperties", "maxProperties", "dependentRequired", "dependencies")
# A private-use character marks whitespace slots; `_pin_whitespace` replaces it.
_WS = "\ue000"
_ESCAPES_OLD = r'\\["\\/bfnrt]'
_ESCAPES_NEW = r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})'
_PLACEHOLDER = "__locals_rx_{}__"
_STRING = STRING.replace(_ESCAPES_OLD, _ESCAPES_NEW)
_STRING_INNER = STRING_INNER.replace(_ESCAPES_OLD, _ESCAPES_NEW)
_SCALAR = f"({_STRING}|{NUMBER}|true|false|null)"


def free_json_regex(depth: int, top: str = "value") -> str:
    """Any JSON value (or object) nested at most `depth` containers deep, json.dumps spacing.
    outlines-core's own free-form regex nests much deeper and takes tens of seconds to build."""
    inner = _SCALAR if depth <= 1 else free_json_regex(depth - 1)
    array = rf"\[({inner}(, {inner})*)?\]"
    obj = rf"\{{({_STRING}: {inner}(, {_STRING}: {inner})*)?\}}"
    return obj if top == "object" else f"({_SCALAR}|{array}|{obj})"


# A length or count bound becomes a bounded repetition the automaton unrolls: 2**31 (found by
# the fuzzed-request suite) asked outlines-core for more memory than the machine had. Bounds
# this large are never meant literally; a request that sends one gets a 400 instead.
BOUNDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
MAX_BOUND = 10_000
# Each unit of a maximum is one more copy of what it bounds in the automaton, times every token
# that fits there: Claude Code's ListAgents (three strings of maxLength 256) made 10,863 states
# and 44M transitions, 40 s to compile. Outside strict schemas, maxima over these are left to the
# reply's token limit and the client's own check (docs/arch/constraint.md, "Bounds").
LOOSE_MAXIMA = {"maxLength": 64, "maxItems": 8}


class _Rewriter:
    """One schema's rewrite: resolves local $refs met inside allOf and collects regex placeholders."""

    def __init__(self, root: dict, label: str, avoid=(), strict: bool = False):
        self.root = root
        self.label = label
        self.strict = strict
        # Characters a pattern may not write raw inside a JSON string (and `<` when markers are avoided).
        self.banned = '"\\' + "".join(map(chr, range(0x20))) + ("<" if avoid else "")
        self.regexes: list[str] = []

    def fail(self, path: str, why: str) -> RequestError:
        return RequestError(f"{self.label}: the schema part at {path or '/'} {why}")

    def rewrite(self, node, path: str = ""):
        if isinstance(node, list):
            return [self.rewrite(v, f"{path}/{i}") for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        for key in UNSUPPORTED:
            if key in node:
                raise self.fail(path, f"uses '{key}', which constrained decoding does not support; "
                                      "remove it or describe the rule in the description instead")
        node = self.large_bounds(node, path)
        if "allOf" in node:
            node = self.merge_all_of(node, path)
        if self.strict:  # after the merge: a rule inside an allOf part counts too
            self.refuse_unenforced(node, path)
        out = {}
        for key, value in node.items():
            if key in ("properties", "$defs", "definitions", "patternProperties"):
                out[key] = {k: self.rewrite(v, f"{path}/{key}/{k}") for k, v in value.items()}
            elif key in ("enum", "const", "default", "examples", "required"):
                out[key] = value
            else:
                out[key] = self.rewrite(value, f"{path}/{key}")
        return self.free_form(self.integer_range(self.pattern(out, path), path), path)

    def large_bounds(self, node: dict, path: str) -> dict:
        """A length or count bound over MAX_BOUND would be unrolled into an automaton too large
        to build (`maxLength` 2**31 exhausted memory). A minimum is refused; a maximum is left to
        the reply's token limit (Claude Code's Workflow tool: `maxLength` 524,288), except in a
        strict schema, which refuses what it does not enforce. Outside strict schemas, so are
        maxima over LOOSE_MAXIMA, which compile for too long to wait on."""
        numbers = {key: node[key] for key in BOUNDS
                   if isinstance(node.get(key), (int, float)) and not isinstance(node[key], bool)}
        large = [key for key, value in numbers.items() if value > MAX_BOUND]
        refused = [key for key in large if self.strict or key.startswith("min")]
        if refused:
            raise self.fail(path, f"has {refused[0]} {node[refused[0]]}, over {MAX_BOUND:,}: its automaton "
                                  "would not fit in memory; lower it or leave it out")
        if not self.strict:
            large += [key for key, most in LOOSE_MAXIMA.items() if numbers.get(key, 0) > most]
        return {k: v for k, v in node.items() if k not in large} if large else node

    def refuse_unenforced(self, node: dict, path: str) -> None:
        """Rules a strict schema states that the automaton would silently not enforce."""
        used = [key for key in UNENFORCED if key in node]
        if node.get("uniqueItems") is True:
            used.append("uniqueItems")
        used += [key for key in ("exclusiveMinimum", "exclusiveMaximum") if isinstance(node.get(key), bool)]
        kinds = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
        if "number" in kinds:  # integer bounds are enforced (integer_range), a number's are not
            used += [key for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if key in node]
        if used:
            raise self.fail(path, f"uses '{used[0]}', which constrained decoding cannot enforce; remove it "
                                  "(and check the rule on the reply) or describe it in the description")
        missing = [name for name in node.get("required") or [] if name not in (node.get("properties") or {})]
        described = "properties" in node or node.get("type") == "object"  # not a branch of a parent's
        if missing and described and not any(key in node for key in ("anyOf", "oneOf", "$ref")):
            raise self.fail(path, f"requires {missing[0]!r} without a schema for it in 'properties'; add one")
        if node.get("enum") == []:
            raise self.fail(path, "has an empty 'enum', which no value matches")

    def pattern(self, node: dict, path: str) -> dict:
        """outlines-core inserts a pattern verbatim (a `.` could write `"`) and drops it when
        minLength/maxLength are present: rewrite it to the texts a JSON string carries raw."""
        if not isinstance(node.get("pattern"), str):
            return node
        if "minLength" in node or "maxLength" in node:
            raise self.fail(path, "combines 'pattern' with minLength/maxLength, which one automaton cannot "
                                  "enforce together; keep one of them")
        try:
            return {**node, "pattern": pattern_regex(node["pattern"], self.banned)}
        except ValueError as exc:
            raise self.fail(path, f"has a pattern constrained decoding cannot enforce: {exc}") from None

    def free_form(self, node: dict, path: str) -> dict:
        """Schema-less objects and values get a shallow free-form regex (2 levels at the top, 1 inside)."""
        depth = 2 if path == "" else 1
        keys = set(node) - {"description", "title", "default", "examples", "$schema", "$id"}
        if not keys:
            self.regexes.append(free_json_regex(depth))
        elif keys == {"type"} and node["type"] == "object" or (
                node.get("type") == "object" and keys <= {"type", "additionalProperties"}
                and node.get("additionalProperties", True) is True):
            self.regexes.append(free_json_regex(depth, top="object"))
        else:
            return node
        return {"const": _PLACEHOLDER.format(len(self.regexes) - 1)}

    def resolve(self, node: dict, path: str, seen: tuple = ()) -> dict:
        ref = node.get("$ref")
        if ref is None:
            return node
        if not ref.startswith("#/"):
            raise self.fail(path, f"refers to {ref!r}; only local references (#/...) are supported")
        if ref in seen:
            raise self.fail(path, f"refers to itself through {' -> '.join((*seen, ref))}; no value can be built")
        target = self.root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, dict) else {}
        return self.resolve(target, path, (*seen, ref))

    def merge_all_of(self, node: dict, path: str) -> dict:
        merged = {k: v for k, v in node.items() if k != "allOf"}
        for i, part in enumerate(node["allOf"]):
            part = self.resolve(part, f"{path}/allOf/{i}")
            if "allOf" in part:
                part = self.merge_all_of(part, f"{path}/allOf/{i}")
            for key, value in part.items():
                if key == "properties":
                    props = dict(merged.get("properties", {}))
                    for name, sub in value.items():
                        props[name] = {"allOf": [props[name], sub]} if name in props else sub
                    merged["properties"] = props
                elif key == "required":
                    merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
                elif key == "pattern" and key in merged and merged[key] != value and \
                        (both := intersect_patterns(merged[key], value, None if self.strict
                                                    else LOOSE_MAXIMA["maxLength"])) is not None:
                    merged[key] = both
                elif key in merged and merged[key] != value and key not in ("description", "title"):
                    raise self.fail(f"{path}/allOf/{i}", f"sets '{key}' differently from another allOf "
                                                         "part; merge the parts by hand")
                else:
                    merged.setdefault(key, value)
        return merged

    def integer_range(self, node: dict, path: str) -> dict:
        if node.get("type") != "integer":
            return node
        low, high = integer_bound(node, "minimum", "exclusiveMinimum", math.ceil, 1), \
            integer_bound(node, "maximum", "exclusiveMaximum", math.floor, -1)
        if low is None and high is None:
            return node
        if low is not None and high is not None and low > high:
            raise self.fail(path, f"allows no integer (minimum {low} > maximum {high})")
        self.regexes.append(integer_range_regex(low, high))
        return {"const": _PLACEHOLDER.format(len(self.regexes) - 1)}


def integer_bound(node: dict, inclusive: str, exclusive: str, rounding, step: int) -> int | None:
    values = []
    if isinstance(node.get(inclusive), (int, float)) and not isinstance(node.get(inclusive), bool):
        values.append(rounding(node[inclusive]))
    ex = node.get(exclusive)
    if isinstance(ex, (int, float)) and not isinstance(ex, bool):
        values.append(math.floor(ex) + 1 if step > 0 else math.ceil(ex) - 1)
    if not values:
        return None
    return max(values) if step > 0 else min(values)


def _digit_blocks(low: int, high: int) -> list[str]:
    """Regexes for the naturals in [low, high] (low >= 1), one per run of equal digit count."""
    out = []
    start = low
    while start <= high:
        k = 0
        while start % 10 ** (k + 1) == 0 and start + 10 ** (k + 1) - 1 <= high:
            k += 1
        step = 10 ** k
        block_end = min(high + 1, (start // (step * 10) + 1) * step * 10)
        end = start + (block_end - start) // step * step - 1
        s, e = str(start), str(end)
        digit = s[-k - 1] if s[-k - 1] == e[-k - 1] else f"[{s[-k - 1]}-{e[-k - 1]}]"
        out.append(s[: len(s) - k - 1] + digit + "[0-9]" * k)
        start = end + 1
    return out


def _naturals(low: int, high: int | None) -> list[str]:
    """Regexes for the integers in [low, high] with low >= 0 (high None: unbounded)."""
    parts = []
    if low == 0:
        parts.append("0")
        low = 1
    if high is None:
        digits = len(str(low))
        parts += _digit_blocks(low, 10 ** digits - 1)
        parts.append(f"[1-9][0-9]{{{digits},}}")
    elif low <= high:
        parts += _digit_blocks(low, high)
    return parts


def integer_range_regex(low: int | None, high: int | None) -> str:
    """A regex for the JSON integers in [low, high] (None: unbounded on that side)."""
    parts = []
    if high is None or high >= 0:
        parts += _naturals(max(low, 0) if low is not None else 0, high)
    if low is None or low < 0:
        negative = _naturals(max(1, -high) if high is not None and high < 0 else 1, None if low is None else -low)
        parts += [f"-{p}" for p in negative]
    return "(" + "|".join(parts) + ")"


def _pin_whitespace(regex: str) -> str:
    """json.dumps spacing: one space after ':' and ',' and none elsewhere."""
    # Optional properties put their comma at a group edge: `W,(W"b"…W,)?W"c"`.
    regex = regex.replace(f"{_WS},(", ", (").replace(f"{_WS},)?", ", )?")
    regex = regex.replace(f"{_WS}:{_WS}", ": ").replace(f"{_WS},{_WS}", ", ").replace(f",{_WS}", ", ")
    return regex.replace(_WS, "")


def _avoid_markers(regex: str, markers) -> str:
    """Strings that never hold `markers` unescaped: free strings avoid them exactly; strings
    with length bounds (counted in characters) write every `<` escaped instead."""
    regex = regex.replace(f"{_STRING_INNER}*", f"({json_string_body(markers)})")
    return regex.replace(_STRING_INNER, _STRING_INNER.replace('[^"', '[^<"', 1))


def schema_regex(schema, *, label: str, avoid=(), strict: bool = False) -> str:
    """The regex of the JSON texts `schema` accepts, or RequestError naming `label` and the part.

    `avoid`: markers (`</tool_call>`) no string may contain, since they would end the call early;
    `strict`: refuse the rules outlines-core would drop (UNENFORCED), for a reply promised valid."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise RequestError(f"{label}: a JSON schema must be an object, got {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/" + "/".join(str(p) for p in exc.path)
        raise RequestError(f"{label}: invalid JSON schema at {where}: {exc.message}") from None
    except RecursionError:  # checking a `pattern` parses it with Python's recursive regex parser
        raise RequestError(f"{label}: the schema or one of its patterns nests too deeply to check") from None
    rewriter = _Rewriter(schema, label, avoid, strict)
    try:
        rewritten = rewriter.rewrite(schema)
    except RecursionError:  # allOf parts whose $refs lead back to themselves
        raise RequestError(f"{label}: the schema's allOf/$ref parts refer back to themselves without end") from None
    try:
        regex = build_regex_from_schema(json.dumps(rewritten), whitespace_pattern=_WS)
    except (ValueError, TypeError) as exc:
        detail = str(exc).splitlines()[0]
        raise RequestError(f"{label}: this JSON schema cannot be enforced: {detail}") from None
    regex = _pin_whitespace(regex).replace(_ESCAPES_OLD, _ESCAPES_NEW)
    for i, sub in enumerate(rewriter.regexes):
        regex = regex.replace(json.dumps(_PLACEHOLDER.format(i)), sub)
    return _avoid_markers(regex, avoid) if avoid else regex
