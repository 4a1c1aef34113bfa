"""Shared prefill: a waiting request whose long prefix another row is reading right now waits
for that row's KV to land in the prefix cache instead of reading the same tokens itself.

Eight agents that start together with one 3k-token system prompt read it once: the first
is admitted and reads it; the others are held until it has passed the shared prefix (which
becomes one of its cache points, so an entry is inserted there), then admitted with a hit.
A hold never outlives its reader: when it ends (finished, cancelled, failed) the waiters go, the
first of them taking over the read where the reader left it and the others waiting for it.
Only the engine thread calls this.
"""

from __future__ import annotations

import bisect

import numpy as np

from locals.engine.cache.prefix_cache import NoPrefixCache, PrefixCache
from locals.engine.rows.sequence import Sequence
from locals.protocol import GenerationRequest

# Holding a request back is worth it only when it saves at least this many prompt tokens.
MIN_SHARED_TOKENS = 256


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common leading run of two token lists."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


class SharedPrefill:
    """Decides, per waiting request, whether to wait for another row's prefill of its prefix."""

    def __init__(self, cache: PrefixCache, insert, min_tokens: int = MIN_SHARED_TOKENS):
        self.cache = cache
        self.insert = insert  # insert(seq, n): put seq's first n tokens' KV into the cache
        self.min_tokens = min_tokens
        # A cache that keeps nothing gains nothing from waiting.
        self.enabled = not isinstance(cache, NoPrefixCache) and min_tokens > 0
        self._holds: dict[str, tuple[Sequence, int]] = {}
        self.waits = 0  # requests that waited for another row's prefill
        self.shared_now = 0  # requests served at once from a row that had already read it

    def hold(self, request: GenerationRequest, active: list[Sequence]) -> bool:
        """True while `request` should stay waiting for a reader of its prefix."""
        if not self.enabled:
            return False
        held = self._holds.get(request.id)
        if held is not None:
            reader, n = held
            if reader.finished and reader.kv is not None:
                return True  # ended, not yet reaped: what it read goes into the cache first
            if _reading(reader) and reader.kv.offset < n:
                return True
            del self._holds[request.id]
            if _reading(reader):
                return False  # it passed n: its cache point inserted the entry
            # It ended before n (a client that left): the first waiter admitted takes over the
            # read from what reached the cache, and the others wait for it instead of each
            # reading the prefix again.
        self._forget_ended_readers()
        prompt = request.prompt_tokens
        reader, n = self._best_source(prompt, active)
        if reader is None or n - self.cache.longest(prompt) < self.min_tokens:
            return False
        if reader.kv.offset >= n:
            # Already read (the reader is further on, or decoding): share its KV right away.
            self.insert(reader, n)
            self.shared_now += 1
            return False
        if n not in reader.cache_points:
            bisect.insort(reader.cache_points, n)
        self._holds[request.id] = (reader, n)
        self.waits += 1
        return True

    def _best_source(self, prompt: list[int], active: list[Sequence]) -> tuple[Sequence | None, int]:
        """The live row sharing the longest prompt prefix with `prompt` (ties: the furthest read)."""
        best, best_n, k = None, 0, self.min_tokens
        for seq in active:
            if not _reading(seq) or seq.prompt[:k] != prompt[:k]:
                continue  # the cheap check rules out rows with another system prompt
            n = common_prefix(seq.prompt, prompt)
            if (n, seq.kv.offset) > (best_n, best.kv.offset if best is not None else -1):
                best, best_n = seq, n
        return best, best_n

    def _forget_ended_readers(self) -> None:
        # Entries of requests cancelled while held go once their reader has ended and been reaped.
        for rid in [rid for rid, (reader, _) in self._holds.items() if reader.kv is None]:
            del self._holds[rid]


def _reading(seq: Sequence) -> bool:
    """A row whose KV can still be shared: not finished and still holding its KV."""
    return not seq.finished and seq.kv is not None
