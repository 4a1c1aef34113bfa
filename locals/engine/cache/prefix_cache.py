"""Prefix cache: KV of token prefixes kept so a prompt that starts the same skips that prefill.

`lookup(tokens)` returns how many leading tokens have stored KV and that KV (per-layer
arrays at least that long); `insert(tokens, kv)` stores the KV of exactly `tokens`;
`longest(tokens)` only measures what `lookup` would find (no LRU touch, no counters).
`MemoryPrefixCache` keeps entries in memory under a byte budget, least recently used out.
A cache subclasses `PrefixCache`; the members with defaults there are for a disk tier
(tiered_cache.py), and the engine calls them on any cache without probing.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import numpy as np

from locals.engine.forward.kv import LayerKV


class PrefixCache(Protocol):
    """What the engine asks of a prompt cache (see the module docstring)."""

    nbytes: int = 0  # bytes of KV held in memory, for the engine's stats
    disk_hits: int = 0  # lookups answered from disk
    disk_skipped: int = 0  # lookups that read a prefix on disk again instead, as the quicker way

    def disk_writes(self) -> dict:
        """The disk tier's writes since the start (`written`, `failed`, `last_failure`); empty without one."""
        return {}

    def lookup(self, tokens: list[int]) -> tuple[int, list[LayerKV] | None]: ...

    def insert(self, tokens: list[int], kv: list[LayerKV]) -> None: ...

    def longest(self, tokens: list[int]) -> int: ...

    def pump(self, idle: bool, everything: bool = False) -> bool:
        """Move a bounded slice of what is bound for disk along (the engine calls it between
        steps; `everything` at shutdown); True while more can go now. Nothing by default."""
        return False

    def note_prefill(self, tokens: int, seconds: float) -> None:
        """A pass read `tokens` prompt tokens in `seconds` (a disk tier weighs loads against it)."""
        return None

    def flush(self, timeout: float) -> tuple[int, int]:
        """Wait up to `timeout` s for pending disk writes: (written, abandoned). None by default."""
        return 0, 0


class NoPrefixCache(PrefixCache):
    """Keeps nothing (prefix reuse off)."""

    def lookup(self, tokens: list[int]) -> tuple[int, list[LayerKV] | None]:
        return 0, None

    def insert(self, tokens: list[int], kv: list[LayerKV]) -> None:
        return None

    def longest(self, tokens: list[int]) -> int:
        return 0


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class MemoryPrefixCache(PrefixCache):
    """Longest-prefix reuse over in-memory entries; LRU eviction under `budget_bytes`.

    Any entry serves any prompt up to their common prefix, because a token's KV depends
    only on the tokens before it.
    """

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[np.ndarray, list[LayerKV], int]] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, tokens: list[int]) -> int:
        return self._best(tokens)[0]

    def _best(self, tokens: list[int]) -> tuple[int, tuple[int, ...] | None]:
        query = np.asarray(tokens, dtype=np.int64)
        best_n, best_key = 0, None
        for key, (arr, _, _) in self._entries.items():
            n = _common_prefix(arr, query)
            if n > best_n:
                best_n, best_key = n, key
        return best_n, best_key

    def lookup(self, tokens: list[int]) -> tuple[int, list[LayerKV] | None]:
        self.lookups += 1
        best_n, best_key = self._best(tokens)
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        return best_n, self._entries[best_key][1]

    def insert(self, tokens: list[int], kv: list[LayerKV]) -> None:
        size = sum(k.nbytes + v.nbytes for k, v in kv)
        if not tokens or size > self.budget_bytes:
            return
        arr = np.asarray(tokens, dtype=np.int64)
        for key, (old, _, _) in list(self._entries.items()):
            common = _common_prefix(old, arr)
            if common == len(arr):  # already covered by a longer (or equal) entry
                self._entries.move_to_end(key)
                return
            if common == len(old):  # the new entry covers the old one
                self._drop(key)
        self._entries[tuple(tokens)] = (arr, kv, size)
        self.nbytes += size
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        _, _, size = self._entries.pop(key)
        self.nbytes -= size
