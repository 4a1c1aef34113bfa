"""Disk writes of the prompt cache off the request path: `save` only records a prefix, `pump`
copies it to host memory in bounded slices, and an engine's stop() waits for pending writes.
A prefix on disk is loaded only where that is quicker than reading it again, by measured rates."""

from __future__ import annotations

import logging
import threading

import mlx.core as mx
import numpy as np
import pytest

from locals.engine.cache.disk_cache import DiskPrefixStore
from locals.engine.engine import Engine
from locals.engine.cache.prefix_cache import MemoryPrefixCache
from locals.engine.settings import EngineConfig
from locals.engine.cache.tiered_cache import Throughput, TieredPrefixCache
from locals.protocol import GenerationRequest, SamplingParams

from tests.helpers.engine_runs import Collector


def _kv(n: int, layers: int = 3, dtype=mx.float32):
    mx.random.seed(7)
    kv = [(mx.random.normal((1, 2, n, 8)).astype(dtype), mx.random.normal((1, 2, n, 8)).astype(dtype))
          for _ in range(layers)]
    mx.eval(kv)
    return kv


def _same(a, b) -> bool:
    return all(mx.array_equal(x, y).item() for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def test_save_copies_nothing_and_pump_copies_in_bounded_slices(tmp_path):
    store = DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=1)
    kv = _kv(1000)
    total = sum(a.nbytes for pair in kv for a in pair)  # 6 arrays x 64,000 bytes
    store.save(list(range(1000)), kv)
    assert store.pending_copy_bytes == total and store.pending == 1  # recorded, not copied
    budget, calls, left = 10_000, 0, total
    while store.pending_copy_bytes:  # (a call copies nothing while host buffers are prepared)
        assert not list((tmp_path / "m").glob("*.kv"))  # nothing goes to the writer half-copied
        store.pump(budget)
        assert 0 <= left - store.pending_copy_bytes <= budget  # at most one bounded slice per call
        calls += left > store.pending_copy_bytes
        left = store.pending_copy_bytes
    assert calls >= total // budget
    assert store.flush(10) == (1, 0)
    restarted = DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=1)
    n, entry = restarted.longest(list(range(1000)) + [5])
    assert n == 1000 and _same(restarted.load(entry), kv)


def test_pump_stops_at_its_time_budget_after_one_heads_rows(tmp_path):
    store = DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=1)
    kv = _kv(1000)  # 3 layers x (K, V) x 2 heads of 1,000 rows of 8 float32: 32,000 bytes a head
    store.save(list(range(1000)), kv)
    left, steps = store.pending_copy_bytes, []
    while store.pending_copy_bytes:
        store.pump(10**9, budget_s=0.0)  # no time at all: one head's rows a call, never more
        if store.pending_copy_bytes < left:
            steps.append(left - store.pending_copy_bytes)
            left = store.pending_copy_bytes
    assert steps == [32_000] * 12
    assert store.flush(10) == (1, 0)
    n, entry = DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=1).longest(list(range(1000)))
    assert n == 1000 and _same(store.load(entry), kv)


def test_a_lookup_that_saves_returns_its_kv_untouched_and_the_file_matches(tmp_path):
    prompt, kv = list(range(300)), _kv(300, dtype=mx.bfloat16)
    tiered = TieredPrefixCache(MemoryPrefixCache(10**9), DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=64))
    tiered.insert(prompt, kv)
    n, hit = tiered.lookup(prompt[:200] + [999])  # reused: decides a write of 200 tokens
    assert n == 200 and hit is kv  # the request gets the memory entry itself, no copy in between
    assert tiered.disk.pending_copy_bytes == sum(a.nbytes for pair in kv for a in pair) * 200 // 300
    while tiered.disk.pending_copy_bytes:  # slices of the non-contiguous 200-token views
        tiered.disk.pump(4096)
    tiered.disk.flush(10)
    assert _same(hit, _kv(300, dtype=mx.bfloat16))  # the stored KV is unchanged by the copy
    restarted = TieredPrefixCache(MemoryPrefixCache(10**9), DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=64))
    n, loaded = restarted.lookup(prompt[:200] + [1])
    assert n == 200 and restarted.disk_hits == 1 and loaded[0][0].dtype == mx.bfloat16
    assert _same(loaded, [(k[..., :200, :], v[..., :200, :]) for k, v in kv])


def test_flush_from_another_thread_waits_for_the_owner_to_pump(tmp_path):
    store = DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=1)
    store.save(list(range(100)), _kv(100))
    result = []
    waiter = threading.Thread(target=lambda: result.append(store.flush(0.3)))
    waiter.start()
    waiter.join()
    assert result == [(0, 1)]  # not this thread's arrays to read: it waited, then gave up
    assert store.flush(10) == (1, 0)  # the saving thread copies and waits


def test_engine_stop_finishes_a_queued_write(tiny_llama, tmp_path, caplog):
    store = DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=16)
    gate, real = threading.Event(), store._write
    store._write = lambda *args: (gate.wait(10), real(*args))  # a slow disk: still writing at stop
    real_flush = store.flush  # the disk frees up only once stop() flushes, however slow the join before it
    store.flush = lambda timeout: (threading.Timer(0.2, gate.set).start(), real_flush(timeout))[1]
    cache = TieredPrefixCache(MemoryPrefixCache(1 << 30), store)
    eng = Engine(tiny_llama, EngineConfig(step_token_budget=64), prefix_cache=cache)
    system = list(range(1000, 1100))
    eng.start()
    try:
        for suffix in ([5, 6], [7, 8]):  # the second request reuses the first one's prefix
            c = Collector()
            c.submit(eng, GenerationRequest(system + suffix, SamplingParams(max_tokens=3)))
            c.wait()
        assert store.pending == 1
    finally:
        with caplog.at_level(logging.INFO, logger="locals.engine.engine"):
            eng.stop()  # no flush before: stop() itself must land the file
    assert store.pending == 0 and "1 disk write(s) finished at stop, 0 abandoned" in caplog.text
    restarted = DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=16)
    n, entry = restarted.longest(system + [9])
    assert n >= len(system)
    memory_n, memory_kv = cache.memory.lookup(system + [9])
    on_disk = restarted.load(entry)
    assert np.array_equal(np.array(on_disk[0][0][..., :n, :]), np.array(memory_kv[0][0][..., :n, :]))


def test_a_rate_follows_what_was_measured_and_is_unknown_before():
    rate = Throughput()
    assert rate.per_s is None and rate.seconds_for(100) is None
    rate.add(1000, 1.0)
    assert rate.per_s == 1000 and rate.seconds_for(500) == 0.5
    rate.add(2000, 1.0)  # moves part of the way: 1000 + 0.3 x 1000
    assert rate.per_s == pytest.approx(1300)
    rate.add(0, 1.0)  # nothing measured: no change
    assert rate.per_s == pytest.approx(1300)


def test_a_prefix_on_disk_is_read_again_where_prefill_is_quicker_than_loading(tmp_path):
    prompt, kv = list(range(300)), _kv(300)
    first = TieredPrefixCache(MemoryPrefixCache(10**9), DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=64))
    first.insert(prompt, kv)
    first.lookup(prompt[:200] + [999])  # reused: written to disk
    while first.disk.pending_copy_bytes:
        first.disk.pump(None)
    first.disk.flush(10)

    def restarted() -> TieredPrefixCache:
        return TieredPrefixCache(MemoryPrefixCache(10**9), DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=64))

    unknown = restarted()  # neither rate measured yet: load
    assert unknown.lookup(prompt[:200] + [1])[0] == 200 and unknown.disk_hits == 1
    assert unknown.loads.per_s is not None  # the load timed itself
    fast_prefill = restarted()
    fast_prefill.loads.add(1, 1.0)  # a byte a second: any file loads slower than
    fast_prefill.note_prefill(10_000, 1.0)  # 10k tokens a second
    # What it would find counts no file it would skip: a request sharing the prefix with a row
    # reading it then waits for that row rather than reading it too (SharedPrefill).
    assert fast_prefill.longest(prompt[:200] + [1]) == 0 and fast_prefill.disk_skipped == 0
    n, hit = fast_prefill.lookup(prompt[:200] + [1])
    assert (n, hit) == (0, None) and fast_prefill.disk_skipped == 1 and fast_prefill.disk_hits == 0
    slow_prefill = restarted()
    slow_prefill.loads.add(10**9, 1.0)
    slow_prefill.note_prefill(1, 1.0)
    assert slow_prefill.longest(prompt[:200] + [1]) == 200
    assert slow_prefill.lookup(prompt[:200] + [1])[0] == 200 and slow_prefill.disk_hits == 1


def test_the_engine_times_its_prefill_for_the_prompt_cache(tiny_llama, tmp_path):
    cache = TieredPrefixCache(MemoryPrefixCache(1 << 30), DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=16))
    eng = Engine(tiny_llama, EngineConfig(step_token_budget=256), prefix_cache=cache)
    eng.start()
    try:
        c = Collector()
        c.submit(eng, GenerationRequest(list(range(1000, 1400)), SamplingParams(max_tokens=2)))
        c.wait()
    finally:
        eng.stop()
    assert cache.prefill.per_s is not None and cache.prefill.per_s > 0
    assert eng.stats().extra["prefix_disk_skipped"] == 0
