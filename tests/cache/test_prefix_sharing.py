"""Shared prefill: requests that start together with one long prefix read it once, and each
output stays token-identical to running it alone; a cancelled reader never strands its waiters."""

from __future__ import annotations

from locals.engine.engine import Engine
from locals.engine.cache.prefix_cache import MemoryPrefixCache
from locals.engine.settings import EngineConfig
from locals.engine.cache.shared_prefill import SharedPrefill, common_prefix
from locals.protocol import GenerationRequest, SamplingParams

from tests.helpers.engine_runs import Collector, kv_blocks, run_alone, wait_for

PREFIX = 400
SUFFIX = 12


def count_prefill(engine: Engine) -> dict:
    """Counts the prompt tokens `engine`'s forward passes read (each launched step's share)."""
    counter = {"prefill": 0}
    real = engine.runner.launch

    def launch(slots):
        step = real(slots)
        counter["prefill"] += step.prefill_tokens if step is not None else 0
        return step

    engine.runner.launch = launch
    return counter


def shared_prompts(tokenizer, n: int) -> list[list[int]]:
    text = " ".join(f"rule {i}: keep functions short and name things clearly." for i in range(80))
    prefix = tokenizer.encode(text, add_special_tokens=False)[:PREFIX]
    assert len(prefix) == PREFIX
    return [prefix + tokenizer.encode(f" Agent {i} asks about module {i * 7}: what does it do?",
                                      add_special_tokens=False)[:SUFFIX] for i in range(n)]


def cached_engine(loaded, **config) -> Engine:
    return Engine(loaded, EngineConfig(step_token_budget=64, **config), prefix_cache=MemoryPrefixCache(1 << 30))


def alone_outputs(loaded, prompts, max_tokens):
    plain = Engine(loaded, EngineConfig(step_token_budget=64, prefix_cache_bytes=0))
    plain.start()
    try:
        return [run_alone(plain, p, max_tokens=max_tokens)[0] for p in prompts]
    finally:
        plain.stop()


def test_eight_agents_at_once_read_the_prefix_once(tiny_llama):
    prompts = shared_prompts(tiny_llama.tokenizer, 8)
    expected = alone_outputs(tiny_llama, prompts, 6)
    eng = cached_engine(tiny_llama)
    fed = count_prefill(eng)
    c = Collector()
    ids = [c.submit(eng, GenerationRequest(p, SamplingParams(max_tokens=6))) for p in prompts]
    eng.start()  # all 8 are in the inbox already: they arrive at once
    try:
        c.wait()
    finally:
        eng.stop()
    # One prefix and eight suffixes (a waiter's suffix starts after the longest shared run).
    assert PREFIX + SUFFIX <= fed["prefill"] <= PREFIX + 8 * SUFFIX
    for rid, tokens in zip(ids, expected):
        assert c.tokens(rid) == tokens
    cached = [c.finish(rid).usage.cached_tokens for rid in ids]
    assert cached[0] == 0 and all(n >= PREFIX for n in cached[1:])
    assert eng.stats().extra["shared_prefill_waits"] == 7


def test_without_sharing_every_agent_reads_the_prefix(tiny_llama):
    """The baseline the test above improves on: with the cache off each request reads it all."""
    prompts = shared_prompts(tiny_llama.tokenizer, 4)
    eng = Engine(tiny_llama, EngineConfig(step_token_budget=64, prefix_cache_bytes=0))
    fed = count_prefill(eng)
    c = Collector()
    for p in prompts:
        c.submit(eng, GenerationRequest(p, SamplingParams(max_tokens=2)))
    eng.start()
    try:
        c.wait()
    finally:
        eng.stop()
    assert fed["prefill"] == 4 * (PREFIX + SUFFIX)
    assert eng.shared_prefill.waits == 0


def test_cancelled_reader_releases_its_waiters(tiny_llama):
    prompts = shared_prompts(tiny_llama.tokenizer, 3)
    expected = alone_outputs(tiny_llama, prompts[1:], 5)
    # A tiny step budget keeps the reader inside the prefix for many steps.
    eng = Engine(tiny_llama, EngineConfig(step_token_budget=8, min_prefill_chunk=8),
                 prefix_cache=MemoryPrefixCache(1 << 30))
    fed = count_prefill(eng)
    c = Collector()
    reader = c.submit(eng, GenerationRequest(prompts[0], SamplingParams(max_tokens=5)))
    waiters = [c.submit(eng, GenerationRequest(p, SamplingParams(max_tokens=5))) for p in prompts[1:]]
    eng.start()
    try:
        assert wait_for(lambda: eng.shared_prefill.waits == 2)
        eng.cancel(reader)
        c.wait()
    finally:
        eng.stop()
    assert c.finish(reader).reason == "cancelled"
    for rid, tokens in zip(waiters, expected):
        assert c.finish(rid).reason == "length" and c.tokens(rid) == tokens
    # What the reader read reached the cache before its waiters went, and the first took over the
    # read: the second waited for it, or read only what was left (each read it all, before).
    assert fed["prefill"] < 2 * (PREFIX + SUFFIX)


def test_a_row_that_already_read_the_prefix_shares_it_at_once(tiny_llama):
    """A request arriving while another decodes (no cache point at the shared prefix) still hits."""
    prompts = shared_prompts(tiny_llama.tokenizer, 2)
    expected = alone_outputs(tiny_llama, prompts[1:], 4)[0]
    eng = cached_engine(tiny_llama)
    eng.start()
    try:
        c = Collector()
        first = c.submit(eng, GenerationRequest(prompts[0], SamplingParams(max_tokens=400)))
        assert wait_for(lambda: len(c.tokens(first)) > 2)
        tokens, _, fin = run_alone(eng, prompts[1], max_tokens=4)
        eng.cancel(first)
        c.wait()
    finally:
        eng.stop()
    assert tokens == expected
    assert fin.usage.cached_tokens == common_prefix(prompts[0], prompts[1]) >= PREFIX
    assert eng.shared_prefill.shared_now == 1 and eng.shared_prefill.waits == 0


def test_short_shared_prefix_is_not_worth_waiting(tiny_llama):
    cache = MemoryPrefixCache(1 << 30)
    sharing = SharedPrefill(cache, insert=lambda seq, n: None)
    eng = Engine(tiny_llama, EngineConfig(), prefix_cache=cache)
    reader = eng._new_sequence(GenerationRequest(list(range(300)), SamplingParams()), lambda ev: None, 0.0)
    assert not sharing.hold(GenerationRequest(list(range(100)) + [7] * 200), [reader])
    assert sharing.hold(GenerationRequest(list(range(280)) + [7] * 5), [reader])
    assert 280 in reader.cache_points
    # A cache that already holds most of the prefix leaves too little to gain.
    cache.insert(list(range(100)), kv_blocks(100))
    assert not sharing.hold(GenerationRequest(list(range(290)) + [9]), [reader])


def test_a_hold_ends_with_its_reader(tiny_llama):
    cache = MemoryPrefixCache(1 << 30)
    sharing = SharedPrefill(cache, insert=lambda seq, n: None)
    eng = Engine(tiny_llama, EngineConfig(), prefix_cache=cache)
    reader = eng._new_sequence(GenerationRequest(list(range(300)), SamplingParams()), lambda ev: None, 0.0)
    waiter = GenerationRequest(list(range(300)) + [5])
    assert sharing.hold(waiter, [reader]) and sharing.hold(waiter, [reader])
    reader.finish("cancelled")
    assert sharing.hold(waiter, [reader])  # until the engine reaped it (its read put in the cache)
    reader.kv.release()
    reader.kv = None
    assert not sharing.hold(waiter, [reader])  # never stranded behind a reader that is gone


def test_prompts_are_read_in_bigger_chunks_while_nothing_decodes():
    from locals.engine.scheduler import Scheduler

    class Row:
        def __init__(self, prefilling, input_len):
            self.prefilling, self.input_len, self.can_sample_more = prefilling, input_len, True

    s = Scheduler(token_budget=64, min_prefill_chunk=8, solo_factor=8)
    prompt = Row(True, 5000)
    assert [sl.n for sl in s.next_step([prompt])] == [512]
    assert [sl.n for sl in s.next_step([Row(False, 1), prompt])] == [1, 63]  # a stream decodes: budget
