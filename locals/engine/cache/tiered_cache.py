"""Prefix cache in two tiers: memory first, then disk for prefixes that proved shared.

A prefix goes to disk when a later request reuses it from memory (a system prompt, a
conversation continued), so one-off prompts never cost a disk write; a conversation is
written again only once it has doubled past what disk holds of it, so a growing one costs
at most twice its final size in writes, not a copy per turn. After a restart the memory
tier is empty and the first request whose prefix is on disk loads it from there instead
of reading it again. A lookup that decides a write only records it: the engine's loop
copies it to host memory in bounded slices (`pump`) and a background thread writes it, so
no request waits on a disk write; `flush` at shutdown waits for what is left. A prefix on
disk is loaded only where that is expected to be quicker than reading its tokens again
(`Throughput`: both rates measured in this process as it runs).
"""

from __future__ import annotations

import time

from locals.engine.cache.disk_cache import DiskEntry, DiskPrefixStore
from locals.engine.forward.kv import LayerKV
from locals.engine.cache.prefix_cache import MemoryPrefixCache, NoPrefixCache, PrefixCache

# Host copy per engine-loop turn while requests run: at most this many bytes, and past this many
# seconds no further head's rows. Into host pages already touched (by HostCopy.prepare, off this
# thread), one slice of a 4B model's bf16 KV (8k tokens, 1.2 GB) took a median 1.7-2.1 ms at 16 MiB
# on a busy 2-core x86 VM (8 MiB: 1.0 ms, 32 MiB: 6.6 ms). On CUDA, reading MLX's buffers from the
# host costs more: in a burst of 16 agents on an H200 the copy took 19% of the engine thread
# (docs/benchmarks-log.md, "An H100 table shipped; 1, 8 and 16 agents served"): hence the time
# bound, so a slow host read takes a bounded share of a busy step.
BUSY_SLICE_BYTES = 16 << 20
BUSY_SLICE_S = 0.001
# With no request running, larger slices between checks of the inbox, so a request that
# arrives waits at most one slice (26-35 ms here).
IDLE_SLICE_BYTES = 256 << 20


# How much each new measurement moves a rate: a few passes or loads make it this process's own.
RATE_WEIGHT = 0.3


class Throughput:
    """A moving rate (amount per second) of what was measured so far; None before anything was."""

    def __init__(self):
        self.per_s: float | None = None

    def add(self, amount: float, seconds: float) -> None:
        if amount <= 0 or seconds <= 0:
            return
        rate = amount / seconds
        self.per_s = rate if self.per_s is None else (1 - RATE_WEIGHT) * self.per_s + RATE_WEIGHT * rate

    def seconds_for(self, amount: float) -> float | None:
        return None if self.per_s is None else amount / self.per_s


def prefix_cache_of(budget_bytes: int, disk: DiskPrefixStore | None = None) -> PrefixCache:
    """The engine's prefix cache: in memory under `budget_bytes` (0: none at all), with `disk`
    behind it where given."""
    if budget_bytes <= 0:
        return NoPrefixCache()
    memory = MemoryPrefixCache(budget_bytes)
    return TieredPrefixCache(memory, disk) if disk is not None else memory


class TieredPrefixCache(PrefixCache):
    """The engine's PrefixCache over a memory cache and a disk store."""

    def __init__(self, memory: MemoryPrefixCache, disk: DiskPrefixStore):
        self.memory, self.disk = memory, disk
        self.disk_hits = 0
        self.disk_skipped = 0  # prefixes on disk read again instead, as the quicker way
        self.prefill = Throughput()  # prompt tokens a second, as the engine reads them
        self.loads = Throughput()  # bytes a second, as files are loaded

    def note_prefill(self, tokens: int, seconds: float) -> None:
        self.prefill.add(tokens, seconds)

    def lookup(self, tokens: list[int]) -> tuple[int, list[LayerKV] | None]:
        n_mem, kv = self.memory.lookup(tokens)
        n_disk, entry = self._disk_entry(tokens, n_mem)
        if entry is not None:
            began = time.perf_counter()
            loaded = self.disk.load(entry)
            if loaded is not None:
                self.loads.add(entry.nbytes, time.perf_counter() - began)
                self.disk_hits += 1
                self.memory.insert([int(t) for t in entry.tokens], loaded)
                return n_disk, loaded
        if kv is not None and n_mem >= max(self.disk.min_tokens, 2 * self.disk.covered(tokens)):
            self.disk.save(list(tokens[:n_mem]), [(k[..., :n_mem, :], v[..., :n_mem, :]) for k, v in kv])
        return n_mem, kv

    def _disk_entry(self, tokens: list[int], n_mem: int, count: bool = True) -> tuple[int, DiskEntry | None]:
        """(prefix length, entry) of the file worth loading for `tokens` beyond memory's
        `n_mem`, else (n_mem, None); `count` records a skip in `disk_skipped`."""
        n_disk, entry = self.disk.longest(tokens)
        # Reading a file pays only when it saves a real stretch of prefill over memory.
        if entry is None or n_disk < n_mem + self.disk.min_tokens:
            return n_mem, None
        if self._quicker_to_read_again(n_disk - n_mem, entry.nbytes):
            if count:
                self.disk_skipped += 1
            return n_mem, None
        return n_disk, entry

    def _quicker_to_read_again(self, tokens: int, nbytes: int) -> bool:
        """Whether prefill would read `tokens` sooner than a file of `nbytes` loads, by the rates
        measured so far (no: load, while either is unknown). On an H200 a 4-5k-token prompt read
        again came to its first token in 0.80 s, loaded from disk in 1.35 s (docs/benchmarks-log.md,
        "CUDA graphs off, served; 1, 8 and 16 agents on an H200"); on a CPU or a Mac prefill is the slower by far."""
        read, load = self.prefill.seconds_for(tokens), self.loads.seconds_for(nbytes)
        return read is not None and load is not None and read < load

    def insert(self, tokens: list[int], kv: list[LayerKV]) -> None:
        self.memory.insert(tokens, kv)

    def pump(self, idle: bool, everything: bool = False) -> bool:
        """One bounded slice of the disk tier's host copy (on the MLX thread, once per engine
        loop turn), or all of it (`everything`: at shutdown); True while more can go now."""
        if everything:
            return self.disk.pump(None)
        return self.disk.pump(IDLE_SLICE_BYTES) if idle else self.disk.pump(BUSY_SLICE_BYTES, BUSY_SLICE_S)

    def flush(self, timeout: float) -> tuple[int, int]:
        """Wait for pending disk writes: (written, abandoned at the timeout)."""
        return self.disk.flush(timeout)

    def longest(self, tokens: list[int]) -> int:
        """What a lookup would find: a prefix on disk counts only where it would be loaded (a
        request skipping it is better off waiting for a row that reads it, `SharedPrefill`)."""
        return self._disk_entry(tokens, self.memory.longest(tokens), count=False)[0]

    def disk_writes(self) -> dict:
        return {"written": self.disk.written, "failed": self.disk.write_failures,
                "last_failure": self.disk.last_failure}

    @property
    def nbytes(self) -> int:
        return self.memory.nbytes

    @property
    def hits(self) -> int:
        return self.memory.hits

    @property
    def lookups(self) -> int:
        return self.memory.lookups
