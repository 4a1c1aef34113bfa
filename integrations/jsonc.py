"""Edit JSON-with-comments (or JSON5) text in place: set or delete one key path, keep every other byte.

A small scanner maps each object member to its character span; edits splice text into
those spans, so comments, key order, trailing commas and the user's formatting survive.
Values are decoded by the json5 library; the scanner only finds spans (neither json5 nor
json keeps them). JSON5 (unquoted keys, single quotes, hex and Infinity) is accepted only where
asked for: a JSON tool's file with `'x'` in it is broken for that tool.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import json5

MISSING = object()


class JsoncError(ValueError):
    """Text that is not JSON with comments."""


@dataclass
class Node:
    """A value's span [start, end); objects also keep their members in order."""

    start: int
    end: int
    members: list["Member"] = field(default_factory=list)
    is_object: bool = False


@dataclass
class Member:
    key: str
    key_start: int
    value: Node


_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


class _Scanner:
    def __init__(self, text: str, allow_json5: bool = False):
        self.text = text
        self.pos = 0
        self.json5 = allow_json5
        self.quotes = "\"'" if allow_json5 else '"'
        self.spaces = " \t\r\n\ufeff" + ("\v\f\u00a0\u2028\u2029" if allow_json5 else "")

    def skip(self) -> None:
        """Skip whitespace and // or /* */ comments."""
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            if ch in self.spaces:
                self.pos += 1
            elif text.startswith("//", self.pos):
                nl = text.find("\n", self.pos)
                self.pos = len(text) if nl < 0 else nl + 1
            elif text.startswith("/*", self.pos):
                close = text.find("*/", self.pos + 2)
                if close < 0:
                    raise JsoncError("unterminated /* comment")
                self.pos = close + 2
            else:
                return

    def value(self) -> Node:
        self.skip()
        if self.pos >= len(self.text):
            raise JsoncError("unexpected end of text")
        ch = self.text[self.pos]
        if ch == "{":
            return self._object()
        if ch == "[":
            return self._array()
        if ch in self.quotes:
            start = self.pos
            self._string()
            return Node(start, self.pos)
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in ",]}/" + self.spaces:
            self.pos += 1
        if start == self.pos:
            raise JsoncError(f"unexpected {ch!r} at offset {start}")
        try:  # a bare value is a number, true, false or null; `tru` or 'x' is no JSON a tool reads
            (json5.loads if self.json5 else json.loads)(self.text[start:self.pos])
        except ValueError:
            raise JsoncError(f"{self.text[start:self.pos]!r} at offset {start} is not a JSON value") from None
        return Node(start, self.pos)

    def _string(self) -> str:
        start, quote = self.pos, self.text[self.pos]
        self.pos += 1
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch == "\\":
                self.pos += 2
            elif ch == quote:
                self.pos += 1
                try:
                    return (json5.loads if self.json5 else json.loads)(self.text[start : self.pos])
                except ValueError as exc:
                    raise JsoncError(f"bad string at offset {start} ({exc})") from None
            else:
                self.pos += 1
        raise JsoncError("unterminated string")

    def _object(self) -> Node:
        node = Node(self.pos, -1, is_object=True)
        self.pos += 1
        while True:
            self.skip()
            if self._take("}"):
                node.end = self.pos
                return node
            key_start = self.pos
            key = self._key()
            self.skip()
            if not self._take(":"):
                raise JsoncError(f"expected ':' at offset {self.pos}")
            node.members.append(Member(key, key_start, self.value()))
            self.skip()
            if not self._take(",") and not self.text.startswith("}", self.pos):
                raise JsoncError(f"expected ',' or '}}' at offset {self.pos}")

    def _key(self) -> str:
        if self.pos < len(self.text) and self.text[self.pos] in self.quotes:
            return self._string()
        name = _IDENTIFIER.match(self.text, self.pos) if self.json5 else None
        if name is None:
            raise JsoncError(f"expected a key at offset {self.pos}")
        self.pos = name.end()
        return name.group()

    def _array(self) -> Node:
        node = Node(self.pos, -1)
        self.pos += 1
        while True:
            self.skip()
            if self._take("]"):
                node.end = self.pos
                return node
            self.value()
            self.skip()
            if not self._take(",") and not self.text.startswith("]", self.pos):
                raise JsoncError(f"expected ',' or ']' at offset {self.pos}")

    def _take(self, ch: str) -> bool:
        if self.text.startswith(ch, self.pos):
            self.pos += 1
            return True
        return False


def parse_tree(text: str, allow_json5: bool = False) -> Node:
    """The span tree of a JSONC (or, with `allow_json5`, JSON5) document whose top level is an object."""
    scanner = _Scanner(text, allow_json5)
    root = scanner.value()
    scanner.skip()
    if scanner.pos != len(text):
        raise JsoncError(f"unexpected text after the document at offset {scanner.pos}")
    if not root.is_object:
        raise JsoncError("the top level is not an object")
    return root


def loads(text: str, allow_json5: bool = False) -> Any:
    """The document's value, comments and trailing commas ignored."""
    return _value_of(text, parse_tree(text, allow_json5))


def _value_of(text: str, node: Node) -> Any:
    if node.is_object:
        return {m.key: _value_of(text, m.value) for m in node.members}
    return json5.loads(text[node.start : node.end])  # the scanner vetted its syntax


def _find(root: Node, path: tuple[str, ...]) -> tuple[list[Node], Member | None]:
    """Objects walked along `path` and the last member reached (None when absent).

    The member is the one at `path` itself only when len(chain) == len(path); otherwise it
    is a non-object value standing where a parent object was expected.
    """
    chain, node = [root], root
    for depth, key in enumerate(path):
        member = next((m for m in node.members if m.key == key), None)
        if member is None or depth == len(path) - 1 or not member.value.is_object:
            return chain, member
        node = member.value
        chain.append(node)
    return chain, None


def _line_indent(text: str, pos: int) -> str:
    line_start = text.rfind("\n", 0, pos) + 1
    indent = text[line_start:pos]
    return indent if not indent.strip() else indent[: len(indent) - len(indent.lstrip())]


def _render(value: Any, indent: str, step: str) -> str:
    rendered = json.dumps(value, indent=len(step) or 2, ensure_ascii=False)
    return rendered.replace("\n", "\n" + indent)


def get(text: str, path: tuple[str, ...], allow_json5: bool = False) -> Any:
    """The value at `path`, or MISSING."""
    chain, member = _find(parse_tree(text, allow_json5), path)
    if member is None or len(chain) != len(path):
        return MISSING
    return _value_of(text, member.value)


def set_value(text: str, path: tuple[str, ...], value: Any, allow_json5: bool = False) -> str:
    """`text` with `path` set to `value`; missing parent objects are created."""
    if not text.strip():
        text = "{}\n"
    root = parse_tree(text, allow_json5)
    chain, member = _find(root, path)
    if member is not None and len(chain) == len(path):
        indent = _line_indent(text, member.key_start)
        rendered = _render(value, indent, _indent_step(text))
        return text[: member.value.start] + rendered + text[member.value.end :]
    if member is not None:  # a non-object sits where a parent object is needed: replace it
        depth = len(chain)
        nested: Any = value
        for key in reversed(path[depth:]):
            nested = {key: nested}
        return set_value(text, path[:depth], nested, allow_json5)
    parent, depth = chain[-1], len(chain) - 1
    nested: Any = value
    for key in reversed(path[depth + 1 :]):
        nested = {key: nested}
    return _insert_member(text, parent, path[depth], nested)


def _indent_step(text: str) -> str:
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and len(stripped) < len(line):
            return line[: len(line) - len(stripped)]
    return "  "


def _insert_member(text: str, obj: Node, key: str, value: Any) -> str:
    step = _indent_step(text)
    if obj.members:
        # Insert before the first member: no trailing-comma bookkeeping at the end.
        first = obj.members[0]
        indent = _line_indent(text, first.key_start)
        entry = f"{json.dumps(key)}: {_render(value, indent, step)}"
        on_own_line = text[text.rfind("\n", 0, first.key_start) + 1 : first.key_start].strip() == ""
        sep = ",\n" + indent if on_own_line else ", "
        return text[: first.key_start] + entry + sep + text[first.key_start :]
    outer = _line_indent(text, obj.start)
    inner = outer + step
    entry = f"\n{inner}{json.dumps(key)}: {_render(value, inner, step)}"
    close = obj.end - 1
    body = text[obj.start + 1 : close]
    tail = body if body.strip() else ""
    return text[: obj.start + 1] + entry + (tail.rstrip(" \t") if tail else "\n" + outer) + text[close:]


def delete(text: str, path: tuple[str, ...], allow_json5: bool = False) -> str:
    """`text` without the member at `path` (unchanged when absent)."""
    root = parse_tree(text, allow_json5)
    chain, member = _find(root, path)
    if member is None or len(chain) != len(path):
        return text
    parent = chain[-1]
    index = parent.members.index(member)
    start, end = member.key_start, member.value.end
    scanner = _Scanner(text)
    scanner.pos = end
    while scanner.pos < len(text) and text[scanner.pos] in " \t":
        scanner.pos += 1
    if text.startswith(",", scanner.pos):
        end = scanner.pos + 1
    elif index > 0:  # last member: drop the comma that precedes it instead
        prev_end = parent.members[index - 1].value.end
        comma = text.find(",", prev_end, start)
        if comma >= 0:
            start = comma
            return text[:start] + text[end:]
    line_start = text.rfind("\n", 0, start) + 1
    if not text[line_start:start].strip():
        rest_nl = text.find("\n", end)
        rest = text[end : rest_nl if rest_nl >= 0 else len(text)]
        if not rest.strip():
            start, end = line_start, (rest_nl + 1 if rest_nl >= 0 else len(text))
            return text[:start] + text[end:]
    while end < len(text) and text[end] in " \t":  # an inline member: drop the space after it
        end += 1
    return text[:start] + text[end:]
