"""Prefix reuse on the embedded model: greedy output with a cache hit is token-identical to a
cold run (exact, shorter and longer prefixes), also after a restart that loads it from disk."""

from __future__ import annotations

import pytest

from locals.engine.assemble import create_engine
from locals.engine.engine import Engine
from locals.engine.settings import EngineConfig
from locals.engine.load.templates import cache_points, render_prompt
from locals.protocol import GenerationRequest, SamplingParams

from tests.helpers.engine_runs import Collector

pytestmark = pytest.mark.model

SYSTEM = ("You are a careful coding agent working in a Python repository. Read files before editing "
          "them, keep functions short, explain each change in one sentence, and never invent APIs. "
          "When a test fails, read its output, find the cause, and fix the code rather than the test. "
          "Answer briefly and precisely.")
MAX_TOKENS = 12


def request(loaded, messages: list[dict]) -> GenerationRequest:
    tokens = loaded.tokenizer.encode(render_prompt(loaded, messages), add_special_tokens=False)
    return GenerationRequest(tokens, SamplingParams(max_tokens=MAX_TOKENS),
                             cache_points=cache_points(loaded, messages, None, tokens))


def conversation(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def run(engine: Engine, req: GenerationRequest) -> tuple[list[int], int]:
    """Greedy tokens and cached_tokens of one request run alone."""
    c = Collector()
    rid = c.submit(engine, GenerationRequest(req.prompt_tokens, req.sampling, cache_points=req.cache_points))
    c.wait()
    return c.tokens(rid), c.finish(rid).usage.cached_tokens


@pytest.fixture(scope="module")
def cold(smollm2):
    """Outputs of an engine with no prefix cache: the reference every hit must reproduce."""
    eng = Engine(smollm2, EngineConfig(prefix_cache_bytes=0))
    eng.start()
    yield lambda req: run(eng, req)[0]
    eng.stop()


def test_hits_are_token_identical_to_cold_runs(smollm2, cold):
    eng = Engine(smollm2, EngineConfig(step_token_budget=64))
    eng.start()
    try:
        first = request(smollm2, conversation("What does a linter do?"))
        reference = cold(first)
        assert run(eng, first) == (reference, 0)
        # Exact: the same prompt again reuses all but its last token.
        assert run(eng, first) == (reference, len(first.prompt_tokens) - 1)
        # Shorter: another question shares only the system prompt part of the stored entry.
        other = request(smollm2, conversation("Why write tests?"))
        tokens, cached = run(eng, other)
        system_end = cache_points(smollm2, conversation("x"), None, other.prompt_tokens)[0]
        assert system_end <= cached < len(other.prompt_tokens) - 1
        assert tokens == cold(other)
        # Longer: the next turn of the first conversation starts with all of the first one.
        reply = smollm2.tokenizer.decode(reference)
        turn2 = request(smollm2, conversation("What does a linter do?") + [
            {"role": "assistant", "content": reply}, {"role": "user", "content": "Name one for Python."}])
        tokens, cached = run(eng, turn2)
        assert cached >= len(first.prompt_tokens)
        assert tokens == cold(turn2)
    finally:
        eng.stop()


def test_restart_loads_the_system_prompt_from_disk(smollm2, cold, locals_home):
    config = EngineConfig(step_token_budget=64)
    before = create_engine(smollm2, config)
    before.start()
    try:
        run(before, request(smollm2, conversation("What is a unit test?")))
        _, cached = run(before, request(smollm2, conversation("What is a mock?")))
        assert cached > 0  # a reused prefix: this is what goes to disk
        before.prefix_cache.disk.flush()
    finally:
        before.stop()
    assert list((locals_home).rglob("*.kv"))

    after = create_engine(smollm2, config)  # a new process would see the same files
    after.start()
    try:
        third = request(smollm2, conversation("What is a fixture?"))
        tokens, cached = run(after, third)
        stats = after.stats()
    finally:
        after.stop()
    assert stats.extra["prefix_disk_hits"] == 1
    assert cached >= cache_points(smollm2, conversation("x"), None, third.prompt_tokens)[0]
    assert tokens == cold(third)
