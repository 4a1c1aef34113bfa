"""Prompt-lookup speculative decoding: drafts from the context, the rejection rule that keeps
sampling exact, KV rollback, and greedy output identical with drafts on and off."""

from __future__ import annotations

import collections
import json

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from locals.engine.engine import Engine
from locals.engine.forward.kv import DecodeBatch, RowKV
from locals.engine.rows.lookup import DraftPolicy, NgramIndex, Speculation
from locals.engine.rows.sampling import RowSampling, sample
from locals.engine.settings import EngineConfig
from locals.protocol import GenerationRequest, SamplingParams
from tests.helpers.engine_runs import Collector


def test_ngram_index_proposes_what_followed_the_latest_longest_match():
    index = NgramIndex()
    index.extend([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3])
    # [1, 2, 3] last occurred at the start (followed by 4, 5); the 2-gram [2, 3] later (by 7).
    assert index.propose(2) == [4, 5]
    index.extend([4])
    assert index.propose(3) == [5, 9, 2]
    index.extend([6])  # [..., 4, 6] never occurred, nor did [6]
    assert index.propose(4) == [] and not index.has_match()
    assert index.propose(0) == []


def _latest_continuation(tokens: list[int], k: int) -> list[int]:
    """What the index must propose, by brute force: after the latest earlier occurrence of the
    longest tail (4, 3, then 2 tokens) that has a continuation."""
    for n in (4, 3, 2):
        tail = tokens[-n:]
        for j in range(len(tokens) - 1, n - 1, -1):
            if len(tokens) >= n and tokens[j - n : j] == tail:
                return tokens[j : j + k]
    return []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=300), st.lists(st.integers(0, 300), max_size=4),
       st.integers(1, 8))
def test_ngram_index_built_at_once_in_pieces_or_a_token_at_a_time_proposes_the_latest_match(tokens, cuts, k):
    # A small alphabet makes many matches; pieces past 64 tokens are hashed by numpy, shorter ones token by token.
    bounds = [0, *sorted(c for c in cuts if c < len(tokens)), len(tokens)]
    index = NgramIndex()
    for a, b in zip(bounds, bounds[1:]):
        index.extend(tokens[a:b])
        assert index.propose(k) == _latest_continuation(tokens[:b], k)
    single = NgramIndex()
    for t in tokens:
        single.extend([t])
    assert single.propose(k) == index.propose(k)


def test_draft_length_adapts_and_pauses_after_misses():
    spec = Speculation([1, 2, 1, 2, 1], DraftPolicy(max_draft=8, start_draft=4, misses_before_pause=2,
                                                     first_pause=3, max_pause=6))
    assert spec.draft(100) == [2, 1]  # only two tokens followed the match
    spec.verified(4, 4)
    assert spec.k == 6
    spec.verified(6, 2)
    assert spec.k == 3
    spec.verified(3, 0)
    spec.verified(3, 0)  # second miss in a row: pause 3 steps
    assert spec.pause == 3 and spec.draft(10) == [] and not spec.wants_draft
    for _ in range(3):
        spec.skipped_step()
    assert spec.pause == 0 and spec.draft(1) == [2]
    spec.verified(1, 0)
    spec.verified(1, 0)
    assert spec.pause == 6  # the next pause doubles
    assert spec.proposed == 4 + 6 + 3 + 3 + 1 + 1 and spec.accepted == 6


def _draws(logits: list[float], draft: int, n: int, **params) -> collections.Counter:
    rows = [RowSampling(params.get("temperature", 1.0), params.get("top_p", 1.0), params.get("top_k", 0),
                        0.0, mx.random.key(i), draft=draft) for i in range(n)]
    out = sample(mx.array([logits] * n), rows)
    return collections.Counter(out.tokens.tolist())


def _softmax(xs: list[float]) -> list[float]:
    e = mx.softmax(mx.array(xs)).tolist()
    return e


@pytest.mark.parametrize("draft", [0, 2, 4])
def test_rejection_rule_keeps_the_sampling_distribution(draft):
    logits = [1.0, 0.2, 2.0, -1.0, 0.5]
    n = 4000
    counts = _draws(logits, draft, n)
    expected = _softmax(logits)
    tv = 0.5 * sum(abs(counts[t] / n - p) for t, p in enumerate(expected))
    assert tv < 0.04, (counts, expected)


def test_rejection_rule_respects_top_k_and_greedy():
    logits = [3.0, 2.9, 0.0, -1.0, 1.0]
    counts = _draws(logits, 2, 2000, top_k=2)  # the draft lies outside the top 2: never kept
    assert set(counts) <= {0, 1} and min(counts[0], counts[1]) > 700
    greedy = _draws(logits, 1, 5, temperature=0.0)
    assert greedy == {0: 5}  # greedy rows ignore drafts (the engine compares)


def test_row_kv_trim_own_caches_and_batch_slot():
    kv = RowKV(2, DecodeBatch(2))
    k = mx.ones((1, 2, 5, 4))
    for cache in kv.layers:
        cache.update_and_fetch(k, k)
    kv.trim(2)
    assert kv.offset == 3
    kv.batch.join(kv)
    kv.trim(1)
    assert kv.resident and kv.offset == 2


def _run_all(loaded, prompts, config, **sampling) -> tuple[list[list[int]], dict]:
    engine = Engine(loaded, config)
    engine.start()
    try:
        c = Collector()
        ids = [c.submit(engine, GenerationRequest(p, SamplingParams(**sampling))) for p in prompts]
        c.wait(300)
        return [c.tokens(i) for i in ids], engine.stats().extra
    finally:
        engine.stop()


def _repetitive_prompts(tokenizer) -> list[list[int]]:
    text = "def add(a, b):\n    return a + b\n\n" * 6
    return [tokenizer.encode(text, add_special_tokens=False),
            tokenizer.encode("Once upon a time in a quiet town", add_special_tokens=False)]


def test_greedy_identical_with_drafts_tiny_model(tiny_llama):
    prompts = _repetitive_prompts(tiny_llama.tokenizer)
    off, _ = _run_all(tiny_llama, prompts, EngineConfig(prefix_cache_bytes=0, speculate=False), max_tokens=48)
    on, extra = _run_all(tiny_llama, prompts, EngineConfig(prefix_cache_bytes=0), max_tokens=48)
    assert on == off
    assert extra["drafted_tokens"] > 0


def _eight_token_model(reference):
    """A random 1-layer llama over 8 tokens (no EOS): small enough to compute its exact distribution."""
    import copy
    import dataclasses

    from mlx_lm.models import llama

    mx.random.seed(7)
    args = llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=8,
                           rope_traditional=True, tie_word_embeddings=True, max_position_embeddings=256)
    model = llama.Model(args)
    mx.eval(model.parameters())
    tok = copy.copy(reference.tokenizer)
    tok._eos_token_ids = set()
    return dataclasses.replace(reference, model=model, tokenizer=tok, vocab_size=8, name="eight", model_id="random")


def _exact_marginals(model, prompt: list[int], temperature: float, positions: int) -> list[list[float]]:
    """P(token at position i) for i < positions, summing over every path (8 ** i of them)."""
    marginals = []
    paths = {(): 1.0}
    for _ in range(positions):
        nxt, marginal = {}, [0.0] * 8
        for path, p_path in paths.items():
            logits = model(mx.array([prompt + list(path)]))[0, -1] / temperature
            probs = mx.softmax(logits).tolist()
            for t, p in enumerate(probs):
                nxt[path + (t,)] = p_path * p
                marginal[t] += p_path * p
        marginals.append(marginal)
        paths = nxt
    return marginals


def test_sampled_output_distribution_unchanged_by_drafts(smollm2):
    """Many seeded samples of a small random model's first tokens, drafts on: their marginal
    distribution per position matches the model's exact one."""
    loaded = _eight_token_model(smollm2)
    # A de Bruijn-like walk: nearly every pair of tokens occurs, so nearly every row drafts.
    prompt = [(i * 3 + i // 8) % 8 for i in range(70)]
    temperature, n = 2.0, 1200
    exact = _exact_marginals(loaded.model, prompt, temperature, 4)
    engine = Engine(loaded, EngineConfig(prefix_cache_bytes=0, max_batch=64, speculate_max_rows=64))
    engine.start()
    try:
        c = Collector()
        ids = [c.submit(engine, GenerationRequest(prompt, SamplingParams(temperature=temperature, seed=i,
                                                                         max_tokens=4)))
               for i in range(n)]
        c.wait(300)
        extra = engine.stats().extra
    finally:
        engine.stop()
    outputs = [c.tokens(i) for i in ids]
    assert all(len(o) == 4 for o in outputs)
    # Drafts were verified, and the rejection rule both kept and replaced some.
    assert extra["drafted_tokens"] > n // 2
    assert 0.1 < extra["accepted_draft_tokens"] / extra["drafted_tokens"] < 0.9
    for pos in range(4):
        seen = collections.Counter(o[pos] for o in outputs)
        tv = 0.5 * sum(abs(seen[t] / n - exact[pos][t]) for t in range(8))
        assert tv < 0.06, (pos, sorted(seen.items()), [round(p, 3) for p in exact[pos]])


def test_seeded_sampling_with_drafts_is_reproducible(tiny_llama):
    prompts = _repetitive_prompts(tiny_llama.tokenizer)[:1] * 2
    first, _ = _run_all(tiny_llama, prompts, EngineConfig(prefix_cache_bytes=0), temperature=0.7, seed=5,
                        max_tokens=32)
    again, _ = _run_all(tiny_llama, prompts, EngineConfig(prefix_cache_bytes=0), temperature=0.7, seed=5,
                        max_tokens=32)
    assert first == again and first[0] == first[1]


REWRITE = ("Copy this code exactly:\n\n```python\ndef area(w, h):\n    return w * h\n\n\n"
           "def perimeter(w, h):\n    return 2 * (w + h)\n\n\ndef volume(w, h, d):\n    return w * h * d\n```")


@pytest.mark.model
def test_smollm2_rewrite_and_unrelated_identical_in_a_mixed_batch(smollm2):
    tok = smollm2.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": REWRITE}], add_generation_prompt=True),
               tok.apply_chat_template([{"role": "user", "content": "Name three rivers."}],
                                       add_generation_prompt=True)]
    off, _ = _run_all(smollm2, prompts, EngineConfig(prefix_cache_bytes=0, speculate=False), max_tokens=60)
    on, extra = _run_all(smollm2, prompts, EngineConfig(prefix_cache_bytes=0), max_tokens=60)
    assert on == off
    assert extra["accepted_draft_tokens"] >= 10, extra


@pytest.mark.model
def test_smollm2_constrained_rows_draft_within_the_schema(smollm2):
    from locals.engine.constrain import build_constraint

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
              "required": ["name", "city"]}
    text = ('Return this as JSON: {"name": "Ada Lovelace of the Analytical Engine", '
            '"city": "London, United Kingdom"}')
    prompt = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    outputs = {}
    for speculate in (False, True):
        engine = Engine(smollm2, EngineConfig(prefix_cache_bytes=0, speculate=speculate))
        engine.start()
        try:
            c = Collector()
            rid = c.submit(engine, GenerationRequest(prompt, SamplingParams(max_tokens=80),
                                                     constraint=build_constraint(smollm2, json_schema=schema,
                                                                                 max_tokens=80)))
            c.wait(300)
            outputs[speculate] = (c.tokens(rid), c.text(rid), engine.stats().extra)
        finally:
            engine.stop()
    assert outputs[True][0] == outputs[False][0]
    value = json.loads(outputs[True][1])
    assert set(value) == {"name", "city"}
    assert outputs[True][2]["accepted_draft_tokens"] > 0


@pytest.mark.model
def test_constraint_fork_walks_ahead_without_moving_the_original(smollm2):
    from locals.engine.constrain import build_constraint

    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
    original = build_constraint(smollm2, tools=tools, tool_choice="required", max_tokens=64)
    before = (original.forced_tokens(), original.closing_tokens(), original.phase)
    fork = original.fork()
    for token in before[1]:  # the shortest complete call, walked on the fork
        fork.accept(token)
    assert fork.phase.value in ("between", "done") and fork.closing_tokens() == []
    assert (original.forced_tokens(), original.closing_tokens(), original.phase) == before
    assert not original.is_complete()
