"""Prefix cache in two tiers: memory first, then disk for prefixes that proved shared.

A prefix goes to disk when a later request reuses it from memory (a system prompt, a
conversation continued), so one-off prompts never cost a disk write; a conversation is
written again only once it has doubled past what disk holds of it, so a growing one costs
at most twice its final size in writes, not a copy per turn. After a restart the memory
tier is empty and the first request whose prefix is on disk loads it from there instead
of reading it again.
"""

from __future__ import annotations

from locals.engine.disk_cache import DiskPrefixStore
from locals.engine.kv import LayerKV
from locals.engine.prefix_cache import MemoryPrefixCache


class TieredPrefixCache:
    """Implements the engine's PrefixCache protocol over a memory cache and a disk store."""

    def __init__(self, memory: MemoryPrefixCache, disk: DiskPrefixStore):
        self.memory, self.disk = memory, disk
        self.disk_hits = 0

    def lookup(self, tokens: list[int]) -> tuple[int, list[LayerKV] | None]:
        n_mem, kv = self.memory.lookup(tokens)
        n_disk, entry = self.disk.longest(tokens)
        # Reading a file pays only when it saves a real stretch of prefill over memory.
        if entry is not None and n_disk >= n_mem + self.disk.min_tokens:
            loaded = self.disk.load(entry)
            if loaded is not None:
                self.disk_hits += 1
                self.memory.insert([int(t) for t in entry.tokens], loaded)
                return n_disk, loaded
        if kv is not None and n_mem >= max(self.disk.min_tokens, 2 * self.disk.covered(tokens)):
            self.disk.save(list(tokens[:n_mem]), [(k[..., :n_mem, :], v[..., :n_mem, :]) for k, v in kv])
        return n_mem, kv

    def insert(self, tokens: list[int], kv: list[LayerKV]) -> None:
        self.memory.insert(tokens, kv)

    def longest(self, tokens: list[int]) -> int:
        return max(self.memory.longest(tokens), self.disk.longest(tokens)[0])

    @property
    def nbytes(self) -> int:
        return self.memory.nbytes

    @property
    def hits(self) -> int:
        return self.memory.hits

    @property
    def lookups(self) -> int:
        return self.memory.lookups
