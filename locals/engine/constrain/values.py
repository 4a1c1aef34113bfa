"""Free-text XML parameter values checked at runtime instead of by automaton states.

A Qwen3-Coder string value may hold any text except `</parameter>` (and, for strings,
never "null" in any case, which mlx-lm's parser reads as None). Encoding that in a regex
gives every state inside a possible marker its own full token row, so the call regex
carries a one-byte *hole* instead (HOLE_BYTES, never allowed to the model) and the value
is walked here byte by byte: `feed` is the exact rule, `ValueTables` its per-vocabulary
token tables. A value ends where `\\n</parameter>` is written; the compiled automaton
continues from the state after the hole and that marker.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from locals.engine.constrain.vocab import TokenVocab

# One hole byte per kind of value; no compiled XML regex allows these bytes otherwise.
ANY, NOT_NULL, NOT_CONTAINER = 0, 1, 2
HOLE_BYTES = {ANY: 0x01, NOT_NULL: 0x00, NOT_CONTAINER: 0x02}
HOLE_KIND = {b: k for k, b in HOLE_BYTES.items()}
HOLE_CLASS = r"\x00-\x02"  # the hole bytes as a regex class range
_HOLE_SPLIT = re.compile(rb"[\x00-\x02]")
MARKER = b"</parameter>"
END = b"\n" + MARKER
_NULL = b"null"
_BLANKS = frozenset(b" \t\n\r")
_CONTAINERS = frozenset(b"[{")


def _utf8_table() -> list[list[int]]:
    """UTF-8 validity as a byte automaton: state -> byte -> state (-1: invalid). States:
    0 ready, 1/2/3 continuation bytes owed, 4 after E0, 5 after ED, 6 after F0, 7 after F4
    (those four restrict the next byte: no overlongs, surrogates or code points past U+10FFFF)."""
    table = [[-1] * 256 for _ in range(8)]
    for b in range(0x03, 0x80):  # hole bytes are never value text
        table[0][b] = 0
    for lo, hi, state in ((0xC2, 0xDF, 1), (0xE1, 0xEC, 2), (0xEE, 0xEF, 2), (0xE0, 0xE0, 4),
                          (0xED, 0xED, 5), (0xF1, 0xF3, 3), (0xF0, 0xF0, 6), (0xF4, 0xF4, 7)):
        for b in range(lo, hi + 1):
            table[0][b] = state
    for state, lo, hi, nxt in ((1, 0x80, 0xBF, 0), (2, 0x80, 0xBF, 1), (3, 0x80, 0xBF, 2), (4, 0xA0, 0xBF, 1),
                               (5, 0x80, 0x9F, 1), (6, 0x90, 0xBF, 2), (7, 0x80, 0x8F, 2)):
        for b in range(lo, hi + 1):
            table[state][b] = nxt
    return table


UTF8 = _utf8_table()
# Bytes that finish a pending character (shortest closing of a value cut inside one).
UTF8_FINISH = {0: b"", 1: b"\x80", 2: b"\x80\x80", 3: b"\x80\x80\x80", 4: b"\xa0\x80", 5: b"\x80\x80",
               6: b"\x90\x80\x80", 7: b"\x80\x80\x80"}


class ValueState(NamedTuple):
    """What the rule needs to know of the value text `v` written so far (small, hashable)."""

    kind: int
    j: int = 0  # v ends with MARKER[:j] (a proper prefix)
    nl: bool = False  # ... and the byte before that prefix is "\n"
    utf8: int = 0
    null: int = 0  # NOT_NULL: v is "null"[:null] in some case; -1 once it cannot be
    null_cut: int = -1  # NOT_NULL, nl: the same for v without its trailing "\n" + MARKER[:j]
    blank: bool = False  # NOT_CONTAINER: v is all blanks so far


def start(kind: int) -> ValueState:
    return ValueState(kind, null=0 if kind == NOT_NULL else -1, blank=kind == NOT_CONTAINER)


def feed(vs: ValueState, data: bytes) -> tuple[ValueState, int | None] | None:
    """Write `data` into the value: (new state, None) while the value goes on; (state, k)
    when `data[:k]` ends it with `\\n</parameter>` (the rest belongs to the call frame);
    None when the value would hold the marker, be invalid UTF-8, be "null" (NOT_NULL) or
    start like a JSON container (NOT_CONTAINER)."""
    kind, j, nl, utf8, null, null_cut, blank = vs
    for i, c in enumerate(data):
        utf8 = UTF8[utf8][c]
        if utf8 < 0:
            return None
        if blank and c not in _BLANKS:
            if c in _CONTAINERS:
                return None
            blank = False
        if j and c == MARKER[j]:
            j += 1
            if j == len(MARKER):
                if not nl or null_cut == len(_NULL):
                    return None
                return ValueState(kind, utf8=utf8), i + 1
        elif c == 0x3C:  # "<": a new marker prefix (the marker holds no other "<")
            nl, j = j == 0 and nl, 1
            null_cut = null_cut if nl else -1
        else:
            j, nl = 0, c == 0x0A
            null_cut = null if nl and kind == NOT_NULL else -1
        if null >= 0:
            null = null + 1 if null < len(_NULL) and c | 0x20 == _NULL[null] and c >= 0x41 else -1
    return ValueState(kind, j, nl, utf8, null, null_cut, blank), None


def closing_text(vs: ValueState) -> bytes:
    """The shortest bytes that end the value validly: finish a pending character, step off
    an exact "null", then the end marker (which also breaks any partial marker)."""
    text = UTF8_FINISH[vs.utf8]
    if vs.kind == NOT_NULL and vs.null == len(_NULL) and not text:
        text = b"."
    return text + END


class ValueTables:
    """Per-vocabulary tables for value rows: UTF-8 state after each token from each state,
    each token's first non-blank byte, and the tokens that may complete the marker."""

    def __init__(self, vocab: TokenVocab):
        self.vocab = vocab
        size = vocab.width_tokens
        lengths = np.array([len(b or b"") for b in vocab.token_bytes], dtype=np.int64)
        width = int(lengths.max())
        grid = np.zeros((size, width), dtype=np.uint8)
        for i, b in enumerate(vocab.token_bytes):
            if b:
                grid[i, : len(b)] = np.frombuffer(b, dtype=np.uint8)
        table = np.array(UTF8 + [[-1] * 256], dtype=np.int64)  # row 8: invalid stays invalid
        table[table < 0] = 8
        # after[u, t]: UTF-8 state after token t from state u (8: invalid; empty tokens invalid).
        self.after = np.empty((8, size), dtype=np.int8)
        for u in range(8):
            state = np.full(size, u, dtype=np.int64)
            for pos in range(width):
                live = pos < lengths
                state = np.where(live, table[state, grid[:, pos]], state)
            state[lengths == 0] = 8
            self.after[u] = state
        first = [(b or b"").lstrip(b" \t\n\r")[:1] for b in vocab.token_bytes]
        self.opens_container = np.array([f in (b"[", b"{") for f in first], dtype=bool)
        self.gt_tokens = [i for i, b in enumerate(vocab.token_bytes) if b and b">" in b]

    def row_bits(self, vs: ValueState, rest_ok) -> np.ndarray:
        """Allowed tokens (bool per token) in state `vs`; `rest_ok(bytes)` says whether the call
        frame accepts what a value-ending token writes after the marker."""
        bits = self.after[vs.utf8] != 8
        if vs.blank:
            bits &= ~self.opens_container
        for token in self.gt_tokens:
            data = self.vocab.token_bytes[token]
            result = feed(vs, data)
            bits[token] = result is not None and (result[1] is None or rest_ok(data[result[1]:]))
        return bits


def value_tables(vocab: TokenVocab) -> ValueTables:
    """The tables of `vocab`, built on first use (a fraction of a second) and kept with it."""
    tables = getattr(vocab, "_value_tables", None)
    if tables is None:
        tables = vocab._value_tables = ValueTables(vocab)
    return tables


def supports_holes(vocab: TokenVocab) -> bool:
    """Holes need a token of its own for each hole byte (byte-level and byte-fallback vocabularies)."""
    return all(vocab.byte_ids[b] >= 0 for b in HOLE_BYTES.values())


def segment_tokens(vocab: TokenVocab, text: bytes) -> list[int] | None:
    """Tokens writing `text` (an automaton's closing, hole bytes standing for empty values):
    each piece between holes encoded on its own, so no token spans into a value."""
    out: list[int] = []
    for piece in _HOLE_SPLIT.split(text):
        if piece:
            tokens = vocab.encode(piece) or vocab.split_bytes(piece)
            if tokens is None:
                return None
            out += tokens
    return out
