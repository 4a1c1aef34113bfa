"""Engine correctness: batched greedy output equals each request alone, across mixed prompt
lengths, staggered arrivals, chunked prefill, cancellation and stop strings."""

from __future__ import annotations

import time

import pytest

from locals.engine.engine import Engine
from locals.engine.settings import EngineConfig
from locals.protocol import GenerationRequest, SamplingParams

from tests.helpers.engine_runs import Collector, make_prompts, run_alone, wait_for


def test_batched_greedy_equals_alone_mixed_lengths_staggered(engine, tiny_llama):
    prompts = make_prompts(tiny_llama.tokenizer, [3, 17, 60, 9, 41])
    alone = [run_alone(engine, p, max_tokens=20)[0] for p in prompts]
    c = Collector()
    ids = []
    for i, p in enumerate(prompts):
        ids.append(c.submit(engine, GenerationRequest(p, SamplingParams(max_tokens=20))))
        time.sleep(0.01 * i)  # arrivals while the others decode
    c.wait()
    for rid, expected in zip(ids, alone):
        assert c.tokens(rid) == expected
        assert c.finish(rid).reason == "length"
        assert c.finish(rid).usage.completion_tokens == 20
    # Decoding rows shared the batched KV; once all finished it holds nothing.
    assert wait_for(lambda: not engine.decode_batch.members)
    assert engine.decode_batch.nbytes == 0


def test_unpipelined_engine_matches_pipelined(tiny_llama, engine):
    prompts = make_prompts(tiny_llama.tokenizer, [5, 30])
    pipelined = [run_alone(engine, p, max_tokens=12)[0] for p in prompts]
    plain = Engine(tiny_llama, EngineConfig(pipeline=False, prefix_cache_bytes=0))
    plain.start()
    try:
        assert [run_alone(plain, p, max_tokens=12)[0] for p in prompts] == pipelined
    finally:
        plain.stop()


def test_cancel_mid_stream_leaves_others_identical(engine, tiny_llama):
    prompts = make_prompts(tiny_llama.tokenizer, [8, 12, 20])
    alone = [run_alone(engine, p, max_tokens=25)[0] for p in prompts]
    c = Collector()
    ids = [c.submit(engine, GenerationRequest(p, SamplingParams(max_tokens=25))) for p in prompts]
    assert wait_for(lambda: len(c.tokens(ids[1])) >= 3)
    engine.cancel(ids[1])
    c.wait()
    assert c.finish(ids[1]).reason == "cancelled"
    assert 3 <= len(c.tokens(ids[1])) < 25
    assert c.tokens(ids[1]) == alone[1][: len(c.tokens(ids[1]))]
    assert c.tokens(ids[0]) == alone[0]
    assert c.tokens(ids[2]) == alone[2]


def test_cancel_frees_the_slot(tiny_llama):
    eng = Engine(tiny_llama, EngineConfig(max_batch=1, prefix_cache_bytes=0))
    eng.start()
    try:
        c = Collector()
        first = c.submit(eng, GenerationRequest([1, 2, 3], SamplingParams(max_tokens=10_000)))
        second = c.submit(eng, GenerationRequest([4, 5, 6], SamplingParams(max_tokens=5)))
        assert wait_for(lambda: len(c.tokens(first)) >= 2)
        assert not c.done.is_set()
        assert eng.stats().waiting == 1  # the only slot is taken
        assert eng.stats().extra["generating_tokens"] >= 2  # counted before the request ends
        eng.cancel(first)
        c.wait()
        assert c.finish(first).reason == "cancelled"
        assert c.finish(second).reason == "length"
        assert len(c.tokens(second)) == 5
        # Rows are freed right after their FinishEvent is sent.
        assert wait_for(lambda: eng.stats().running == 0 and eng.stats().kv_bytes == 0)
        assert eng.stats().extra["generating_tokens"] == 0
        assert eng.stats().generated_tokens_total == len(c.tokens(first)) + 5
    finally:
        eng.stop()


def test_cancel_waiting_request(tiny_llama):
    eng = Engine(tiny_llama, EngineConfig(max_batch=1, prefix_cache_bytes=0))
    eng.start()
    try:
        c = Collector()
        busy = c.submit(eng, GenerationRequest([1, 2, 3], SamplingParams(max_tokens=10_000)))
        queued = c.submit(eng, GenerationRequest([4, 5], SamplingParams(max_tokens=5)))
        eng.cancel(queued)
        eng.cancel(busy)
        c.wait()
        assert c.finish(queued).reason == "cancelled" and c.tokens(queued) == []
    finally:
        eng.stop()


def test_any_integer_seed_is_taken_and_a_request_that_cannot_start_fails_alone(engine, monkeypatch):
    for seed in (-1, 2**64, 7):
        tokens, _, fin = run_alone(engine, [1, 2, 3], temperature=1.0, seed=seed, max_tokens=3)
        assert fin.reason == "length" and len(tokens) == 3
    assert run_alone(engine, [1, 2], temperature=1.0, seed=-1, max_tokens=4)[0] == \
        run_alone(engine, [1, 2], temperature=1.0, seed=2**64 - 1, max_tokens=4)[0]  # the same key
    real = engine._new_sequence
    monkeypatch.setattr(engine, "_new_sequence",
                        lambda request, *a: (_ for _ in ()).throw(ValueError("no")) if request.meta.get("bad")
                        else real(request, *a))
    c = Collector()
    bad = c.submit(engine, GenerationRequest([1, 2], SamplingParams(max_tokens=3), meta={"bad": True}))
    good = c.submit(engine, GenerationRequest([1, 2], SamplingParams(max_tokens=3)))
    c.wait()
    assert c.finish(bad).reason == "error" and "could not start" in c.finish(bad).error
    assert c.finish(good).reason == "length" and not engine.broken


def test_a_broken_engine_answers_every_request_and_says_why(tiny_llama, monkeypatch):
    eng = Engine(tiny_llama, EngineConfig(max_batch=1, prefix_cache_bytes=0))
    monkeypatch.setattr(eng, "_admit", lambda: (_ for _ in ()).throw(RuntimeError("a bug")))
    eng.start()
    try:
        c = Collector()
        first = c.submit(eng, GenerationRequest([1, 2, 3], SamplingParams(max_tokens=5)))
        c.wait(30)
        assert c.finish(first).reason == "error" and "a bug" in c.finish(first).error
        assert "a bug" in eng.broken
        later = c.submit(eng, GenerationRequest([4, 5], SamplingParams(max_tokens=5)))  # answered at once
        assert c.finish(later).reason == "error" and "restart locals" in c.finish(later).error
    finally:
        eng.stop()


@pytest.mark.model
@pytest.mark.parametrize("route", ["fused", "composed", "host"])
def test_smollm2_batched_greedy_equals_alone(smollm2, route, monkeypatch):
    from locals.engine.forward import chunk_attention, host_attention
    from locals.engine.load.templates import render_prompt

    monkeypatch.setattr(chunk_attention, "ON_CUDA", route == "composed")  # prompt chunks as a CUDA GPU attends them
    monkeypatch.setattr(host_attention, "SOFTMAX_ON_HOST", route == "host")  # as the CPU does

    questions = ["What is the capital of France?", "Write a haiku about the sea.",
                 "Count from 1 to 10.", "Name three colors."]
    prompts = [smollm2.tokenizer.encode(render_prompt(smollm2, [{"role": "user", "content": q}]),
                                        add_special_tokens=False) for q in questions]
    eng = Engine(smollm2, EngineConfig(step_token_budget=32, prefix_cache_bytes=0))
    eng.start()
    try:
        alone = [run_alone(eng, p, max_tokens=24) for p in prompts]
        assert "Paris" in alone[0][1]
        c = Collector()
        ids = [c.submit(eng, GenerationRequest(p, SamplingParams(max_tokens=24))) for p in prompts]
        c.wait()
        for rid, (tokens, text, fin) in zip(ids, alone):
            assert c.tokens(rid) == tokens
            assert c.text(rid) == text
            assert c.finish(rid).reason == fin.reason
    finally:
        eng.stop()


@pytest.mark.model
def test_smollm2_stop_string_held_back_and_batched(smollm2):
    from locals.engine.load.templates import render_prompt

    prompt = smollm2.tokenizer.encode(
        render_prompt(smollm2, [{"role": "user", "content": "Count from 1 to 10, one per line."}]),
        add_special_tokens=False)
    other = smollm2.tokenizer.encode(
        render_prompt(smollm2, [{"role": "user", "content": "What is 2+2?"}]), add_special_tokens=False)
    eng = Engine(smollm2, EngineConfig(prefix_cache_bytes=0))
    eng.start()
    try:
        _, full, _ = run_alone(eng, prompt, max_tokens=40)
        assert "4" in full
        stop = full[full.index("4") - 1 : full.index("4") + 1]  # e.g. "\n4" or " 4"
        tokens, text, fin = run_alone(eng, prompt, max_tokens=40, stop=[stop, "never-appears"])
        assert fin.reason == "stop" and fin.detail == {"stop_sequence": stop}
        assert text == full[: full.index(stop)]
        c = Collector()
        a = c.submit(eng, GenerationRequest(prompt, SamplingParams(max_tokens=40, stop=[stop])))
        b = c.submit(eng, GenerationRequest(other, SamplingParams(max_tokens=10)))
        c.wait()
        assert c.text(a) == text and c.finish(a).reason == "stop"
        assert c.tokens(b) == run_alone(eng, other, max_tokens=10)[0]
    finally:
        eng.stop()


def test_a_cancelled_prompt_read_is_resumed_by_the_same_prompt_again(tiny_llama):
    """A client that timed out while its long prompt was read sends it again: the second read
    starts where the first stopped, and the reply is the same as a cold one."""
    prompt = make_prompts(tiny_llama.tokenizer, [200])[0]
    settings = dict(step_token_budget=4, min_prefill_chunk=4, solo_prefill_factor=8)  # 32-token chunks alone: 7 steps
    cold = Engine(tiny_llama, EngineConfig(**settings, prefix_cache_bytes=0))
    cold.start()
    try:
        expected, _, _ = run_alone(cold, prompt, max_tokens=6)
    finally:
        cold.stop()
    eng = Engine(tiny_llama, EngineConfig(**settings))
    c = Collector()
    request = GenerationRequest(prompt, SamplingParams(max_tokens=6))
    rid = request.id
    process, steps = eng._process, []

    def cancel_after_two_steps(step):
        process(step)
        steps.append(step)
        if len(steps) == 2:
            eng.cancel(rid)

    eng._process = cancel_after_two_steps
    eng.start()
    try:
        c.submit(eng, request)
        c.wait()
        assert c.finish(rid).reason == "cancelled" and c.tokens(rid) == []
        tokens, _, finish = run_alone(eng, prompt, max_tokens=6)
    finally:
        eng.stop()
    assert 32 <= finish.usage.cached_tokens < len(prompt) - 1
    assert tokens == expected
