"""A request's offered tools as automata: one small head over all names, one call automaton per tool.

The head (start marker, name, a few bytes past it) is compiled before the request runs;
each tool's call automaton (its arguments' schema) is compiled in the background and
awaited only when the model has chosen that name, so a first-seen set of many tools is
ready as soon as the head is. Also holds the rows that are not states of one automaton:
the free-text guard (auto mode) and the between-calls row.
"""

from __future__ import annotations

from concurrent.futures import Future

from locals.engine.constrain import compile as compiler
from locals.engine.constrain.formats import ToolFormat, check_name
from locals.engine.constrain.holes import CallRuntime
from locals.engine.constrain.index import CompiledIndex, DeviceRow, ones_row, token_row
from locals.engine.constrain.values import segment_tokens, supports_holes
from locals.engine.constrain.vocab import TokenVocab
from locals.errors import RequestError

BLANKS = b" \t\n\r"
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


def _function(tool) -> dict:
    if not isinstance(tool, dict):
        raise RequestError(f"each tool must be an object, got {type(tool).__name__}")
    fn = tool.get("function", tool)
    if not isinstance(fn, dict) or "name" not in fn:
        raise RequestError("each tool needs a function name: {\"type\": \"function\", \"function\": {\"name\": …}}")
    return fn


def tool_schemas(tools: list[dict]) -> dict[str, dict]:
    """name -> parameters schema of OpenAI-shaped tools, refusing bad or repeated names."""
    out: dict[str, dict] = {}
    for tool in tools:
        fn = _function(tool)
        name = check_name(fn["name"])
        if name in out:
            raise RequestError(f"tool name {name!r} is offered twice; tool names must be unique")
        params = fn.get("parameters")
        out[name] = NO_ARGUMENTS if params is None else params
    return out


def guard_rows(head: CompiledIndex, fmt: ToolFormat) -> tuple[list, list]:
    """Per length p of the marker prefix the free text ends with, two rows: tokens allowed
    while a call may start (all but those completing the marker with bytes the head would
    refuse; None when all are), and tokens allowed when no call may start any more."""
    cached = getattr(head, "_guard_rows", None)
    if cached is not None:
        return cached
    vocab, marker = head.vocab, fmt.marker
    after_marker = head.walk(head.initial, marker)
    candidates = [(i, b) for i, b in enumerate(vocab.token_bytes) if b and marker[-1:] in b]
    open_rows: list[DeviceRow | None] = []
    closed_rows: list[DeviceRow] = []
    for p in range(len(marker)):
        completing, refused = [], []
        for token, data in candidates:
            text = marker[:p] + data
            at = text.find(marker)
            if at >= 0 and not (fmt.start_only and text[:at].strip(BLANKS)):
                completing.append(token)
                if head.walk(after_marker, text[at + len(marker):]) is None:
                    refused.append(token)
        open_rows.append(DeviceRow(ones_row(vocab) & ~token_row(vocab, refused)) if refused else None)
        closed_rows.append(DeviceRow(ones_row(vocab) & ~token_row(vocab, completing)))
    head._guard_rows = (open_rows, closed_rows)
    return head._guard_rows


class ToolSet:
    """The automata of one request's tools in one format (shared by requests with the same tools)."""

    def __init__(self, vocab: TokenVocab, fmt: ToolFormat, schemas: dict[str, dict], *,
                 prefetch: bool = True):
        self.vocab = vocab
        self.fmt = fmt
        self.names = list(schemas)
        # XML free-text values as runtime-checked holes (values.py) where the vocabulary allows.
        self.holed = fmt.arguments == "xml" and supports_holes(vocab)
        # Args regexes first: a schema that cannot be enforced is refused before anything runs.
        self._regexes = {name: fmt.call_regex(name, fmt.arguments_regex(s, f"tool {name!r} parameters",
                                                                        holes=self.holed))
                         for name, s in schemas.items()}
        self.head = compiler.compile_regex(fmt.head_regex(self.names), vocab, label="the tool-call frame")
        self._futures: dict[str, Future] = {}
        if prefetch:
            for name, regex in self._regexes.items():
                self._futures[name] = compiler.submit(regex, vocab)
        self._calls: dict[str, CallRuntime] = {}
        self._shortest: int | None = None
        self._longest: int | None = None
        self.between = DeviceRow(self.head.rows[self.head.row_of[self.head.initial]] | token_row(vocab, vocab.eos_ids))
        self.eos_only = DeviceRow(token_row(vocab, vocab.eos_ids))
        # Tokens after which a start-only format's call may start again (Llama's <|python_tag|>).
        self.reopen_ids = frozenset(i for i, b in enumerate(vocab.token_bytes) if fmt.reopen and b == fmt.reopen)

    def call(self, name: str) -> CallRuntime:
        """The call automaton of `name`, compiling it now if the background has not yet."""
        run = self._calls.get(name)
        if run is None:
            index = compiler.compile_now(self._regexes[name], self.vocab, self._futures.get(name),
                                         label=f"tool {name!r} parameters")
            run = self._calls[name] = CallRuntime(index, self.holed)
        return run

    def guard(self) -> list[DeviceRow | None]:
        """Free-text rows while a call may still start (see guard_rows)."""
        return guard_rows(self.head, self.fmt)[0]

    def guard_closed(self) -> list[DeviceRow]:
        """Free-text rows once no call fits in the budget."""
        return guard_rows(self.head, self.fmt)[1]

    def closing_from_head(self, head_bytes: bytes, state: int) -> list[int]:
        """Tokens that finish a call from head state `state` (after `head_bytes`): the
        shortest name, then the shortest arguments and frame end of that tool."""
        head_text = self.head.closing_text(state) or b""
        name = chosen_name(self, head_bytes + head_text)
        if name is None:
            return []
        run = self.call(name)
        index = run.index
        start = index.walk(index.initial, head_bytes)
        end = index.walk(start, head_text) if start is not None else None
        rest = index.closing_text(end) if end is not None else None
        if rest is None:
            return []
        tokens = segment_tokens(self.vocab, head_text + rest)
        if tokens is None or run.walk_tokens(run.settle(start), tokens) is None:
            tokens = (segment_tokens(self.vocab, head_text) or []) + run.closing(run.settle(end))
        return tokens

    def longest_call(self) -> int:
        """Tokens in the longest of the tools' shortest calls: while the name is still open, a
        budget shorter than this could let the model pick a tool it has no room to finish."""
        if self._longest is None:
            frame = self.head.closing_text(self.head.initial) or b""
            at = frame.find(self.fmt.name_intro)
            prefix = frame[: at + len(self.fmt.name_intro)] if at >= 0 else b""
            lengths = [self.shortest_call()]
            for name in self.names:
                head = prefix + name.encode()
                state = self.head.walk(self.head.initial, head)
                if state is not None:
                    start = self.vocab.encode(head) or self.vocab.split_bytes(head) or []
                    lengths.append(len(start) + len(self.closing_from_head(head, state)))
            self._longest = max(lengths)
        return self._longest

    def shortest_call(self) -> int:
        """Tokens in the shortest complete call (a new call only starts when that much budget is left)."""
        if self._shortest is None:
            self._shortest = len(self.closing_from_head(b"", self.head.initial))
        return self._shortest


def chosen_name(tools: ToolSet, data: bytes) -> str | None:
    """The function name once `data` (the head so far) leaves only one offered name."""
    names, fmt = tools.names, tools.fmt
    at = data.find(fmt.name_intro)
    if at < 0:
        return names[0] if len(names) == 1 else None
    part = data[at + len(fmt.name_intro):]
    end = part.find(fmt.name_end)
    if end >= 0:
        return part[:end].decode()
    matches = [n for n in names if n.encode().startswith(part)]
    return matches[0] if len(matches) == 1 else None

