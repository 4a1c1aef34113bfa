"""Walking one tool's call automaton whose free-text values are holes (values.py).

A `Position` is an automaton state, or a hole plus the `ValueState` of the value being
written there. `CallRuntime.step` moves a position by one token across any boundary
(frame -> value -> frame); masks, jump-forward and closings come per position and are
memoised, so a step inside a value costs a dict lookup like one in the automaton.
Without holes (JSON formats) it is a thin layer over the CompiledIndex.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from locals.engine.constrain.index import CompiledIndex, DeviceRow, token_row
from locals.engine.constrain.values import (END, HOLE_BYTES, HOLE_KIND, ValueState, closing_text, feed,
                                            segment_tokens, start, value_tables)

_HOLE_SET = frozenset(HOLE_BYTES.values())


class Hole(NamedTuple):
    kind: int
    state: int  # the automaton state where the value starts
    end: int  # the state after the hole byte and `\n</parameter>`


class Position(NamedTuple):
    state: int
    hole: Hole | None = None
    value: ValueState | None = None


class Span(NamedTuple):
    """From a state whose frame text up to a hole is forced, the tokens that write that text
    and go on into the value (`>\\n    ` before an indented value): the tokenizer's own."""

    text: bytes
    hole: Hole
    tokens: frozenset


class CallRuntime:
    """Positions, masks and closings of one call automaton (`holed`: its regex has holes)."""

    def __init__(self, index: CompiledIndex, holed: bool):
        self.index = index
        self.vocab = index.vocab
        self.holed = holed
        self._hole_free = self.vocab.tokens_free_of(bytes(_HOLE_SET))
        self._holes: dict[int, Hole | None] = {}
        self._spans: dict[int, Span | None] = {}
        self._masks: dict[int, DeviceRow] = {}
        self._value_rows: dict[tuple, DeviceRow] = {}
        self._closings: dict[tuple, list[int]] = {}

    # -- positions --

    def hole(self, state: int) -> Hole | None:
        if not self.holed:
            return None
        if state not in self._holes:
            found, hole = self.index.hole(state), None
            if found is not None:
                end = self.index.walk(found[1], END)
                if end is None:
                    raise ValueError("a value hole is not followed by the end of its parameter")
                hole = Hole(HOLE_KIND[found[0]], state, end)
            self._holes[state] = hole
        return self._holes[state]

    def settle(self, state: int) -> Position:
        """The position at automaton state `state` (inside a value when it is a hole)."""
        hole = self.hole(state)
        return Position(state, hole, start(hole.kind) if hole else None)

    def step(self, pos: Position, token: int) -> Position | None:
        """The position after `token`, None when the token is not allowed there."""
        if not (0 <= token < len(self._hole_free)) or not self._hole_free[token]:
            return None
        data = self.vocab.bytes_of(token)
        if not data:  # control tokens (EOS included) never go inside a call
            return None
        if pos.hole is not None:
            return self._in_value(pos.hole, pos.value, data)
        nxt = self.index.index.get_next_state(pos.state, token)
        if nxt is not None:
            return self.settle(nxt)
        span = self.span(pos.state)
        if span is None or token not in span.tokens:
            return None
        return self._in_value(span.hole, start(span.hole.kind), data[len(span.text):])

    def walk_tokens(self, pos: Position, tokens: list[int]) -> Position | None:
        for token in tokens:
            pos = self.step(pos, token)
            if pos is None:
                return None
        return pos

    def is_closed(self, pos: Position) -> bool:
        return pos.hole is None and self.index.is_closed(pos.state)

    def _in_value(self, hole: Hole, vs: ValueState, data: bytes) -> Position | None:
        result = feed(vs, data)
        if result is None:
            return None
        vs, cut = result
        if cut is None:
            return Position(hole.state, hole, vs)
        state = self._after_value(hole, data[cut:])
        return None if state is None else self.settle(state)

    def _after_value(self, hole: Hole, rest: bytes) -> int | None:
        """The automaton state after a value's end marker and `rest` (no hole byte in it)."""
        if not rest:
            return hole.end
        if any(b in _HOLE_SET for b in rest):
            return None
        return self.index.walk(hole.end, rest)

    def span(self, state: int) -> Span | None:
        if not self.holed:
            return None
        if state not in self._spans:
            text, end = self.index.forced_text(state)
            hole = self.hole(end) if text else None
            span = None
            if hole is not None:
                first = start(hole.kind)
                tokens = frozenset(t for t in self.vocab.tokens_with_prefix(text)
                                   if len(self.vocab.token_bytes[t]) > len(text) and self._hole_free[t]
                                   and self._in_value(hole, first, self.vocab.token_bytes[t][len(text):]))
                span = Span(text, hole, tokens) if tokens else None
            self._spans[state] = span
        return self._spans[state]

    # -- TokenConstraint pieces --

    def mask(self, pos: Position):
        if pos.hole is not None:
            return self._value_row(pos.hole, pos.value).get()
        span = self.span(pos.state)
        if span is None:
            return self.index.mask(pos.state)
        row = self._masks.get(pos.state)
        if row is None:
            row = self._masks[pos.state] = DeviceRow(self.index.rows[self.index.row_of[pos.state]]
                                                     | token_row(self.vocab, span.tokens))
        return row.get()

    def _value_row(self, hole: Hole, vs: ValueState) -> DeviceRow:
        key = (hole, vs)
        row = self._value_rows.get(key)
        if row is None:
            bits = value_tables(self.vocab).row_bits(vs, lambda rest: self._after_value(hole, rest) is not None)
            padded = np.zeros(self.vocab.words * 32, dtype=bool)
            padded[: len(bits)] = bits
            row = self._value_rows[key] = DeviceRow(np.packbits(padded, bitorder="little").view(np.uint32))
        return row

    def forced(self, pos: Position) -> list[int]:
        return [] if pos.hole is not None else self.index.forced(pos.state)

    def closing(self, pos: Position) -> list[int]:
        """Tokens of the shortest completion: the value's own closing, then the automaton's
        (later holes left empty, which every kind of value allows)."""
        if pos.hole is None and not self.holed:
            return self.index.closing(pos.state)
        vs = pos.value
        key = (pos.state,) if pos.hole is None else (pos.hole, vs.utf8, closing_text(vs))
        tokens = self._closings.get(key)
        if tokens is None:
            state = pos.state if pos.hole is None else pos.hole.end
            rest = self.index.closing_text(state)
            head = b"" if pos.hole is None else closing_text(vs)
            tokens = [] if rest is None else segment_tokens(self.vocab, head + rest) or []
            if tokens and self.walk_tokens(pos, tokens) is None:
                tokens = self._split_closing(pos, head + rest)
            self._closings[key] = tokens
        return list(tokens)

    def _split_closing(self, pos: Position, text: bytes) -> list[int]:
        """Byte-wise tokens of `text` (the fallback when the canonical ones do not walk)."""
        out = []
        for byte in text:
            if byte in _HOLE_SET:
                continue
            token = int(self.vocab.byte_ids[byte])
            pos = self.step(pos, token) if token >= 0 else None
            if pos is None:
                return []
            out.append(token)
        return out
