"""Finds tool calls in streamed model text, in the model's own format, with mlx-lm's parsers.

The parser comes from the loaded model's tokenizer (mlx-lm's TokenizerWrapper carries
`tool_call_start`, `tool_call_end` and `tool_parser`). While streaming, text that may be
the start of a call is held back; a call is emitted whole when its end marker arrives.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1's "a call follows"


@dataclass
class ToolFormat:
    """How one model writes a tool call: markers around it and mlx-lm's parse function."""

    start: str
    end: str
    parse: Callable[[str, Any], Any]
    # Llama 3.1: a call is the whole reply (after blanks) or follows `<|python_tag|>`;
    # the same marker later in prose is text (the constraint leaves it free too).
    start_only: bool = False


@dataclass
class ToolCall:
    """One parsed call; `arguments` is always a JSON object."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


def tool_format_of(loaded: Any) -> ToolFormat | None:
    """The tool-call format of a loaded model (mlx-lm's parser, found by the engine facade);
    models whose tools the server renders itself use json_tools."""
    from locals.engine import tool_parser

    found = tool_parser(loaded)
    if found is None:
        return None
    start, end, parse, start_only = found
    return ToolFormat(start=start, end=end, parse=parse, start_only=start_only)


def _to_calls(parsed: Any) -> list[ToolCall]:
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"not a tool call: {item!r}")
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        if not isinstance(args, dict):
            raise ValueError("tool call arguments are not an object")
        calls.append(ToolCall(name=item["name"], arguments=args))
    return calls


class ToolCallSplitter:
    """Feed model text in pieces; get back plain text (str) and complete ToolCall objects."""

    def __init__(self, fmt: ToolFormat | None, tools: list[dict] | None = None):
        self.fmt = fmt
        self.tools = tools
        self.calls: list[ToolCall] = []
        self._buf = ""
        self._in_call = False
        self._emitted = ""  # text given out so far (start-only formats look back at it)
        self._space = ""  # trailing whitespace held back (_settle)
        self._after_call = False  # the last piece given out was a call

    def feed(self, text: str) -> list[str | ToolCall]:
        if self.fmt is None:
            return [text] if text else []
        return self._settle(self._split(text), final=False)

    def finish(self) -> list[str | ToolCall]:
        """Flush at the end of generation: a call left open (no end marker) is parsed as is."""
        rest, self._buf = self._buf, ""
        if self._in_call and rest:
            self._in_call = False
            return self._settle(self._parse(rest), final=True)
        return self._settle([rest] if rest else [], final=True)

    def _settle(self, pieces: list[str | ToolCall], final: bool) -> list[str | ToolCall]:
        """Text's trailing whitespace is held until text follows (given out with it) or a call
        does (dropped): the spaces and newlines a model writes around its calls are not a reply
        of their own, streamed or not, however the text was cut into pieces. Whitespace that
        ends a reply after its last text is kept."""
        out: list[str | ToolCall] = []
        for piece in pieces:
            if isinstance(piece, ToolCall):
                out.append(piece)
                self._space, self._after_call = "", True
                continue
            text = self._space + piece
            body = text.rstrip()
            self._space = text[len(body):]
            if body:
                out.append(body)
                self._after_call = False
        if final:
            if self._space and not self._after_call:
                out.append(self._space)
            self._space = ""
        return out

    def _split(self, text: str) -> list[str | ToolCall]:
        self._buf += text
        out: list[str | ToolCall] = []
        while True:
            if self._in_call:
                end = self._call_end()
                if end < 0:
                    return out
                body, self._buf = self._buf[:end], self._buf[end + len(self.fmt.end):]
                self._in_call = False
                out.extend(self._parse(body))
                continue
            start = self._buf.find(self.fmt.start)
            while start >= 0 and not self._may_start(self._buf[:start]):
                start = self._buf.find(self.fmt.start, start + 1)
            if start < 0:
                keep = partial_suffix(self._buf, self.fmt.start)
                if keep and not self._may_start(self._buf[: len(self._buf) - keep]):
                    keep = 0
                emit, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                if emit:
                    out.append(emit)
                    self._emitted += emit
                return out
            if start:
                out.append(self._buf[:start])
                self._emitted += self._buf[:start]
            self._buf = self._buf[start + len(self.fmt.start):]
            self._in_call = True

    def _may_start(self, before: str) -> bool:
        """Whether a call may start after `before` (text not yet given out) in this reply."""
        if not self.fmt.start_only:
            return True
        text = self._emitted + before
        tag = text.rfind(PYTHON_TAG)
        return not text[tag + len(PYTHON_TAG):].strip() if tag >= 0 else not text.strip()

    def _call_end(self) -> int:
        """Where the open call's end marker is, -1 while it has not arrived.

        An end marker inside an argument (a file that contains `</tool_call>`) is not the
        end: the first marker before which the call parses is. When none does yet, a later
        marker may still come; `finish` handles a call that never completes.
        """
        if not self.fmt.end:
            return -1
        at = self._buf.find(self.fmt.end)
        first = at
        while at >= 0:
            if _parses(self.fmt, self._buf[:at], self.tools):
                return at
            at = self._buf.find(self.fmt.end, at + 1)
        # Nothing parses before any marker: wait for more text, unless the model is not
        # writing a call at all (then the first marker ends it, as before).
        return -1 if first >= 0 and _looks_open(self._buf[:first]) else first

    def _parse(self, body: str) -> list[str | ToolCall]:
        try:
            calls = _to_calls(self.fmt.parse(body, self.tools))
        except (ValueError, KeyError, TypeError) as exc:
            # Not a valid call: the text is the model's reply, keep it rather than drop it.
            log.warning("unparsable tool call (%s): %.200s", exc, body)
            return [self.fmt.start + body + self.fmt.end]
        self.calls.extend(calls)
        return list(calls)


def _parses(fmt: ToolFormat, body: str, tools) -> bool:
    # An XML call cut inside a parameter lacks its closing tag (mlx-lm's parser is lenient).
    if "<function=" in body and not body.rstrip().endswith("</function>"):
        return False
    try:
        _to_calls(fmt.parse(body, tools))
    except Exception:
        return False
    return True


def _looks_open(body: str) -> bool:
    """Whether `body` reads like a call still being written: an unterminated JSON string or
    an XML parameter not closed yet (so a marker seen so far sits inside an argument)."""
    if "<parameter=" in body:
        return body.count("<parameter=") > body.count("</parameter>")
    quotes = 0
    escaped = False
    for ch in body:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quotes += 1
    return quotes % 2 == 1


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
