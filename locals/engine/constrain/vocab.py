"""The token vocabulary as bytes, for outlines-core: one `TokenVocab` per tokenizer, built once.

Maps every token id to the bytes it writes (byte-level BPE `Ġ`-strings and SentencePiece
`▁`/`<0xNN>` pieces alike), keeps control tokens out of the automata (except the markers
of tool-call formats, which some models emit as single special tokens), and gives the
byte-walking and canonical-encoding helpers the automata need.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import weakref
from functools import lru_cache

import numpy as np
import outlines_core

# Control tokens that are nevertheless text of a tool-call format (Qwen's <tool_call>,
# Mistral's [TOOL_CALLS], Llama 3's <|python_tag|>).
FORMAT_MARKERS = frozenset({"<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>"})


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character stand-ins for raw bytes, reversed (char -> byte)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _decoder_kind(hf) -> str:
    backend = getattr(hf, "backend_tokenizer", None)
    text = repr(getattr(backend, "decoder", None))
    if "ByteLevel" in text:
        return "bytelevel"
    if "ByteFallback" in text or "▁" in text:
        return "sentencepiece"
    return "plain"


def _piece_bytes(piece: str, kind: str) -> bytes:
    if kind == "bytelevel":
        table = _byte_decoder()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return piece.encode("utf-8")
    if kind == "sentencepiece":
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("▁", " ").encode("utf-8")
    return piece.encode("utf-8")


class TokenVocab:
    """Token ids <-> bytes for one tokenizer, sized to the logits width `width_tokens`."""

    def __init__(self, tokenizer, width_tokens: int):
        hf = getattr(tokenizer, "_tokenizer", tokenizer)
        self.hf = hf
        self.width_tokens = width_tokens
        self.words = (width_tokens + 31) // 32
        eos = set(getattr(tokenizer, "eos_token_ids", None) or [])
        if getattr(hf, "eos_token_id", None) is not None:
            eos.add(hf.eos_token_id)
        if not eos:
            raise ValueError("tokenizer has no end-of-sequence token")
        self.eos_ids = frozenset(i for i in eos if i < width_tokens)
        self.eos_id = hf.eos_token_id if hf.eos_token_id in self.eos_ids else min(self.eos_ids)
        kind = _decoder_kind(hf)
        added_tokens = hf.added_tokens_decoder  # built anew on each read: once, not once a token
        special = {i for i, tok in added_tokens.items() if tok.special and tok.content not in FORMAT_MARKERS}
        special |= set(getattr(hf, "all_special_ids", []))
        self.token_bytes: list[bytes | None] = [None] * width_tokens
        for piece, i in hf.get_vocab().items():
            if i >= width_tokens or i in special or i in self.eos_ids:
                continue
            added = added_tokens.get(i)
            self.token_bytes[i] = added.content.encode() if added else _piece_bytes(piece, kind)
        self.ids_of: dict[bytes, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b:
                self.ids_of.setdefault(b, i)
        self.max_token_len = max(len(b) for b in self.ids_of)
        # Token id of each single byte (-1 when a byte has no token of its own).
        self.byte_ids = np.array([self.ids_of.get(bytes([b]), -1) for b in range(256)], dtype=np.int64)
        # Tokens starting with a byte that has no token of its own: byte-wise walks cannot
        # see them, so a state allowing any of them is never treated as forced.
        orphans = np.zeros(self.words * 32, dtype=bool)
        for i, b in enumerate(self.token_bytes):
            if b and self.byte_ids[b[0]] < 0:
                orphans[i] = True
        self.orphan_row = np.packbits(orphans, bitorder="little").view(np.uint32)
        self.fingerprint = self._fingerprint()
        self._outlines = None
        self._lock = threading.Lock()

    def _fingerprint(self) -> str:
        digest = hashlib.sha256()
        digest.update(f"{self.width_tokens}:{sorted(self.eos_ids)}".encode())
        for i, b in enumerate(self.token_bytes):
            if b:
                digest.update(i.to_bytes(4, "little") + len(b).to_bytes(2, "little") + b)
        return digest.hexdigest()[:24]

    def outlines_vocabulary(self) -> outlines_core.Vocabulary:
        """The outlines-core Vocabulary (built once, shared by every compile of this tokenizer)."""
        with self._lock:
            if self._outlines is None:
                grouped: dict[bytes, list[int]] = {}
                for i, b in enumerate(self.token_bytes):
                    if b:
                        grouped.setdefault(b, []).append(i)
                self._outlines = outlines_core.Vocabulary(self.eos_id, grouped)
            return self._outlines

    def tokens_free_of(self, forbidden: bytes) -> np.ndarray:
        """Bool per token id: True when the token writes none of the bytes in `forbidden`."""
        cache = self.__dict__.setdefault("_free_of", {})
        if forbidden not in cache:
            cache[forbidden] = np.array([not b or not any(c in b for c in forbidden)
                                         for b in self.token_bytes], dtype=bool)
        return cache[forbidden]

    def tokens_with_prefix(self, prefix: bytes) -> list[int]:
        """Ids of the tokens whose bytes start with `prefix` (one bisect in a sorted table)."""
        table = self.__dict__.get("_sorted")
        if table is None:
            table = self._sorted = sorted((b, i) for i, b in enumerate(self.token_bytes) if b)
        out = []
        for data, token in table[bisect.bisect_left(table, (prefix, -1)):]:
            if not data.startswith(prefix):
                break
            out.append(token)
        return out

    def bytes_of(self, token: int) -> bytes:
        """The bytes `token` writes (b"" for control tokens and ids outside the vocabulary)."""
        if 0 <= token < self.width_tokens:
            return self.token_bytes[token] or b""
        return b""

    def split_bytes(self, data: bytes) -> list[int] | None:
        """Some token sequence writing exactly `data` (greedy longest match), or None."""
        out, pos = [], 0
        while pos < len(data):
            for size in range(min(self.max_token_len, len(data) - pos), 0, -1):
                token = self.ids_of.get(data[pos:pos + size])
                if token is not None:
                    out.append(token)
                    pos += size
                    break
            else:
                return None
        return out

    def encode(self, data: bytes) -> list[int] | None:
        """The tokenizer's own (canonical) tokens for `data`, or None when not valid UTF-8."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return list(self.hf.encode(text, add_special_tokens=False))


_vocabs: "weakref.WeakKeyDictionary[object, dict[int, TokenVocab]]" = weakref.WeakKeyDictionary()
_vocabs_lock = threading.Lock()


def token_vocab(tokenizer, width_tokens: int) -> TokenVocab:
    """The TokenVocab of `tokenizer` at logits width `width_tokens`, built on first use."""
    with _vocabs_lock:
        per_width = _vocabs.setdefault(tokenizer, {})
        if width_tokens not in per_width:
            per_width[width_tokens] = TokenVocab(tokenizer, width_tokens)
        return per_width[width_tokens]
