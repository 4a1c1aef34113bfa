"""One compiled automaton: an outlines-core Index plus its per-state bitmask table.

Built once per (regex, tokenizer) and shared by every request using it; read-only after
construction except for memo tables (forced text, closings), which are filled on demand
and only ever hold values computed from the immutable Index. The device copy of the
table is made lazily by the engine thread (the thread that owns MLX). Tokens holding a
hole byte (values.HOLE_BYTES) are never in a row: a state whose only way on is a hole
byte is a *hole*, where a runtime-checked value goes (see values.py).
"""

from __future__ import annotations

from collections import deque

import mlx.core as mx
import numpy as np
import outlines_core

from locals.engine.constrain.values import HOLE_BYTES
from locals.engine.constrain.vocab import TokenVocab

# Bound on the states a closing search visits (a closing is a few dozen bytes in practice).
CLOSING_SEARCH_LIMIT = 50_000
FORCED_TEXT_LIMIT = 256


class CompiledIndex:
    """An Index with a (rows, W) uint32 table: `row_of[state]` is the row of allowed tokens."""

    def __init__(self, index: outlines_core.Index, vocab: TokenVocab):
        self.index = index
        self.vocab = vocab
        self.initial = index.get_initial_state()
        self.finals = frozenset(index.get_final_states())
        transitions = index.get_transitions()
        states = sorted(set(transitions) | self.finals | {self.initial})
        eos = np.fromiter(vocab.eos_ids, dtype=np.int64)
        hole_free = vocab.tokens_free_of(bytes(HOLE_BYTES.values()))
        # One state's row at a time, kept once per distinct allowed set (many states share one,
        # e.g. inside strings): no (states x vocabulary) table in memory, and no single numpy
        # call long enough to hold the GIL while the server answers (ReportFindings: 3,900 states).
        bits = np.zeros(vocab.words * 32, dtype=bool)
        distinct: dict[bytes, int] = {}
        self.row_of = {}
        self._text_states = set()
        for state in states:
            allowed = transitions.get(state, {})
            tokens = np.fromiter(allowed, dtype=np.int64, count=len(allowed))
            tokens = tokens[tokens < vocab.width_tokens]
            tokens = tokens[hole_free[tokens]]
            bits[:] = False
            bits[tokens] = True
            if vocab.eos_id in allowed:
                bits[eos] = True
            if len(tokens) > int(vocab.eos_id in allowed):
                self._text_states.add(state)
            self.row_of[state] = distinct.setdefault(np.packbits(bits, bitorder="little").tobytes(), len(distinct))
        self.rows = np.frombuffer(b"".join(distinct), dtype=np.uint32).reshape(len(distinct), vocab.words)
        self._device = None
        self._forced: dict[int, list[int]] = {}
        self._closing: dict[int, bytes | None] = {}
        self._closing_tokens: dict[int, list[int]] = {}
        self._holes: dict[int, tuple[int, int] | None] = {}

    # -- per-step queries (O(1) after the first visit of a state) --

    def device_rows(self) -> mx.array:
        """The table on the device; created on first use by the calling (engine) thread."""
        if self._device is None:
            self._device = mx.array(self.rows)
        return self._device

    def mask(self, state: int) -> mx.array:
        return self.device_rows()[self.row_of[state]]

    def next_state(self, state: int, token: int) -> int | None:
        """The state after `token`, or None when `token` is not allowed (EOS ids count as one)."""
        if token in self.vocab.eos_ids:
            token = self.vocab.eos_id
        return self.index.get_next_state(state, token)

    def walk(self, state: int | None, data: bytes) -> int | None:
        """The state after writing `data` (any tokenization reaches the same DFA state)."""
        tokens = self.vocab.split_bytes(data)
        if tokens is None:
            return None
        for token in tokens:
            if state is None:
                return None
            state = self.index.get_next_state(state, token)
        return state

    def hole(self, state: int) -> tuple[int, int] | None:
        """(hole byte, state after it) when `state` is a hole, else None."""
        if state not in self._holes:
            found = None
            if not self.rows[self.row_of[state]].any():
                for byte in HOLE_BYTES.values():
                    nxt = self.index.get_next_state(state, int(self.vocab.byte_ids[byte]))
                    if nxt is not None:
                        found = (byte, nxt)
            self._holes[state] = found
        return self._holes[state]

    def is_closed(self, state: int) -> bool:
        """Final with nothing more to write: only EOS may follow."""
        return state in self.finals and state not in self._text_states

    def allowed_bytes(self, state: int) -> np.ndarray:
        """The bytes that may come next (via the single-byte tokens)."""
        row = self.rows[self.row_of[state]]
        ids = self.vocab.byte_ids
        ok = ids >= 0
        bit = np.zeros(256, dtype=bool)
        bit[ok] = (row[ids[ok] >> 5] >> (ids[ok] & 31).astype(np.uint32)) & 1 == 1
        return np.flatnonzero(bit)

    # -- jump-forward --

    def forced_text(self, state: int) -> tuple[bytes, int]:
        """The bytes only one path allows from `state`, and the state after them."""
        out = bytearray()
        while len(out) < FORCED_TEXT_LIMIT and state not in self.finals:
            if (self.rows[self.row_of[state]] & self.vocab.orphan_row).any():
                break
            allowed = self.allowed_bytes(state)
            if len(allowed) != 1:
                break
            nxt = self.index.get_next_state(state, int(self.vocab.byte_ids[allowed[0]]))
            if nxt is None:
                break
            out.append(int(allowed[0]))
            state = nxt
        return bytes(out), state

    def forced(self, state: int) -> list[int]:
        """Canonical tokens of the forced text; the last one is left to the model when more
        text follows, so it may pick a token that spans the forced text and what comes next."""
        if state in self._forced:
            return self._forced[state]
        text, end = self.forced_text(state)
        tokens = (self.vocab.encode(text) or []) if text else []
        if tokens and self.walk_tokens(state, tokens) is None:
            tokens = []
        if tokens and not self.is_closed(end):
            tokens = tokens[:-1]
        self._forced[state] = tokens
        return tokens

    def walk_tokens(self, state: int, tokens: list[int]) -> int | None:
        for token in tokens:
            state = self.index.get_next_state(state, token)
            if state is None:
                return None
        return state

    # -- cut-off --

    def closing_text(self, state: int) -> bytes | None:
        """The shortest bytes from `state` to a final state (breadth-first over bytes; through
        a hole by its hole byte, which stands for an empty value)."""
        if state in self._closing:
            return self._closing[state]
        found = None
        parents: dict[int, tuple[int, int] | None] = {state: None}
        queue = deque([state])
        while queue and len(parents) < CLOSING_SEARCH_LIMIT:
            current = queue.popleft()
            if current in self.finals:
                found = current
                break
            hole = self.hole(current)
            for byte in [hole[0]] if hole else self.allowed_bytes(current):
                nxt = self.index.get_next_state(current, int(self.vocab.byte_ids[byte]))
                if nxt is not None and nxt not in parents:
                    parents[nxt] = (current, int(byte))
                    queue.append(nxt)
        text = None
        if found is not None:
            out = bytearray()
            while parents[found] is not None:
                found, byte = parents[found]
                out.append(byte)
            text = bytes(reversed(out))
        self._closing[state] = text
        return text

    def closing(self, state: int) -> list[int]:
        """Tokens of the shortest completion (canonical when the tokenizer's own split is valid)."""
        tokens = self._closing_tokens.get(state)
        if tokens is None:
            text = self.closing_text(state)
            tokens = self.vocab.encode(text) if text else []
            if tokens is None or self.walk_tokens(state, tokens) is None:
                tokens = self.vocab.split_bytes(text) or []
            self._closing_tokens[state] = tokens
        return list(tokens)


def ones_row(vocab: TokenVocab) -> np.ndarray:
    bits = np.zeros(vocab.words * 32, dtype=bool)
    bits[: vocab.width_tokens] = True
    return np.packbits(bits, bitorder="little").view(np.uint32)


def token_row(vocab: TokenVocab, tokens) -> np.ndarray:
    bits = np.zeros(vocab.words * 32, dtype=bool)
    bits[np.fromiter(tokens, dtype=np.int64)] = True
    return np.packbits(bits, bitorder="little").view(np.uint32)


class DeviceRow:
    """A host bitmask row copied to the device on first use (by the engine thread)."""

    def __init__(self, row: np.ndarray):
        self.host = row
        self._device = None

    def get(self) -> mx.array:
        if self._device is None:
            self._device = mx.array(self.host)
        return self._device
