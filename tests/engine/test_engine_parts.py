"""The engine's small parts alone: stop-string holdback, the in-memory prefix cache, the
step scheduler's token budget, device-side masks/sampling, the ragged forward pass and its shared
decode batch (the batch's storage alone: test_decode_batch.py)."""

from __future__ import annotations

import functools

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from locals.engine.forward import host_attention
from locals.engine.forward.forward import CompiledBlocks, RowInput, forward
from locals.engine.forward.forward import forward as forward_pass
from locals.engine.forward.kv import DecodeBatch, RowKV
from locals.engine.cache.prefix_cache import MemoryPrefixCache, NoPrefixCache
from locals.engine.rows.sampling import RowSampling, apply_masks, sample
from locals.engine.scheduler import Scheduler
from locals.engine.rows.stops import StopText

from tests.helpers.engine_runs import kv_blocks


def test_stop_text_holds_back_possible_start_and_drops_stop():
    st = StopText(["</end>", "STOP"])
    assert st.feed("Hello </") == "Hello "
    assert st.feed("e") == ""
    assert st.feed("x") == "</ex"
    assert st.feed(" and </en") == " and "
    assert st.feed("d> tail") == "" and st.hit
    assert st.flush() == ""


def test_stop_text_names_the_string_that_matched_first():
    st = StopText(["END", "xy"])
    assert st.feed("abxy and END") == "ab" and st.hit and st.matched == "xy"
    assert StopText(["END"]).matched is None


def test_stop_text_never_matches_text_fed_unwatched():
    st = StopText(["Paris"])
    assert st.feed("I check Par") == "I check "
    # A tool call opens: the held-back tail goes out, and the call's text is never matched.
    assert st.feed('<call>{"city": "Paris"}', watched=False) == 'Par<call>{"city": "Paris"}'
    assert st.feed("</call>", watched=False) == "</call>" and not st.hit
    # Free text after it is watched again, but never across into the unwatched text.
    assert st.feed("is") == "is" and not st.hit
    assert st.feed(" Paris") == " " and st.hit


@pytest.mark.model
def test_a_stop_string_never_cuts_a_tool_call_on_the_embedded_model(smollm2):
    import json

    from locals.engine.constrain import build_constraint
    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig
    from locals.protocol import GenerationRequest, SamplingParams
    from tests.helpers.engine_runs import Collector

    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
    prompt = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "Read main.py"}],
                                                   add_generation_prompt=True)
    engine = Engine(smollm2, EngineConfig(prefix_cache_bytes=0))
    engine.start()
    try:
        c = Collector()
        rid = c.submit(engine, GenerationRequest(prompt, SamplingParams(max_tokens=48, stop=['"', "{", "path"]),
                                                 constraint=build_constraint(smollm2, tools=tools,
                                                                             tool_choice="required",
                                                                             max_tokens=48)))
        c.wait(300)
    finally:
        engine.stop()
    text = c.text(rid)
    body = text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
    assert json.loads(body)["name"] == "read_file" and "path" in json.loads(body)["arguments"]
    assert c.finish(rid).detail == {}  # no stop string matched


def test_a_continuation_keeps_its_first_leading_space(smollm2):
    from locals.engine.load.tokenizer import continuation_detokenizer

    tokens = smollm2.tokenizer.encode(" Paris is big", add_special_tokens=False)
    texts = []
    for detok in (smollm2.tokenizer.detokenizer, continuation_detokenizer(smollm2.tokenizer)):
        for t in tokens:
            detok.add_token(t)
        detok.finalize()
        texts.append(detok.text)
    assert texts == ["Paris is big", " Paris is big"]  # a chat reply drops it; a completion keeps it


def test_stop_text_flushes_held_text_without_match():
    st = StopText(["STOP"])
    assert st.feed("abc ST") == "abc "
    assert not st.hit and st.flush() == "ST"
    assert StopText([]).feed("anything") == "anything"


def test_memory_prefix_cache_longest_prefix_and_supersede():
    cache = MemoryPrefixCache(budget_bytes=1 << 20)
    cache.insert([1, 2, 3], kv_blocks(3))
    cache.insert([1, 2, 3, 4, 5], kv_blocks(5))  # covers the first entry, which goes
    assert len(cache) == 1
    n, kv = cache.lookup([1, 2, 3, 4, 9])
    assert n == 4 and kv[0][0].shape[2] == 5
    assert cache.lookup([7, 8])[0] == 0
    cache.insert([1, 2], kv_blocks(2))  # already covered: nothing new stored
    assert len(cache) == 1


def test_memory_prefix_cache_evicts_least_recently_used():
    entry = sum(k.nbytes + v.nbytes for k, v in kv_blocks(4))
    cache = MemoryPrefixCache(budget_bytes=2 * entry)
    cache.insert([1, 1, 1, 1], kv_blocks(4))
    cache.insert([2, 2, 2, 2], kv_blocks(4))
    cache.lookup([1, 1, 1, 1])  # touch the first
    cache.insert([3, 3, 3, 3], kv_blocks(4))
    assert cache.lookup([2, 2, 2, 2])[0] == 0
    assert cache.lookup([1, 1, 1, 1])[0] == 4 and cache.lookup([3, 3, 3, 3])[0] == 4
    assert cache.nbytes <= 2 * entry
    assert NoPrefixCache().lookup([1]) == (0, None)


class _Seq:
    """The attributes of a Sequence that the scheduler reads."""

    def __init__(self, prefilling: bool, input_len: int, can_sample_more: bool = True):
        self.prefilling, self.input_len, self.can_sample_more = prefilling, input_len, can_sample_more


def test_scheduler_decodes_everyone_and_chunks_prompts_with_the_rest():
    s = Scheduler(token_budget=64, min_prefill_chunk=8)
    decoding = [_Seq(False, 1) for _ in range(6)] + [_Seq(False, 3)]  # one with forced tokens
    long_prompt, short_prompt = _Seq(True, 1000), _Seq(True, 10)
    slots = s.next_step(decoding + [long_prompt, short_prompt])
    assert [sl.n for sl in slots[:7]] == [1, 1, 1, 1, 1, 1, 3] and all(sl.sample for sl in slots[:7])
    assert slots[7].seq is long_prompt and slots[7].n == 64 - 9 and not slots[7].sample
    assert len(slots) == 8  # the budget is spent; the short prompt waits a step
    done = _Seq(False, 1, can_sample_more=False)
    crowded = s.next_step([_Seq(False, 1) for _ in range(70)] + [done, short_prompt])
    assert crowded[-1].seq is short_prompt and crowded[-1].n == 8  # prefill always advances
    assert all(sl.seq is not done for sl in crowded)


def test_masks_unpack_bits_per_row():
    logits = mx.zeros((2, 70))
    words = mx.array([1 << 5, 0, 1 << 3], dtype=mx.uint32)  # tokens 5 and 67
    out = apply_masks(logits, [words, None])
    allowed = np.flatnonzero(np.isfinite(np.array(out[0])))
    assert allowed.tolist() == [5, 67]
    assert np.isfinite(np.array(out[1])).all()


def test_sampling_respects_mask_and_top_k():
    logits = mx.array([[0.0, 5.0, 1.0, 3.0]] * 3)
    key = mx.random.key(0)
    rows = [RowSampling(0.0, 1.0, 0, 0.0, key),
            RowSampling(1.0, 1.0, 0, 0.0, key, mask=mx.array([0b0100], dtype=mx.uint32)),
            RowSampling(5.0, 1.0, 1, 0.0, key)]
    for _ in range(5):
        out = sample(logits, rows)
        assert out.tokens.tolist() == [1, 2, 1]
        rows = [RowSampling(r.temperature, r.top_p, r.top_k, r.min_p, k, r.mask) for r, k in zip(rows, out.keys)]


def test_a_vanishing_temperature_is_greedy_not_garbage():
    logits = mx.array([[0.0, 5.0, 1.0, 3.0]] * 2)
    key = mx.random.key(0)
    for temperature in (1e-45, 1e-9):  # 1e-45, a denormal, flushed to zero: every logit became inf
        out = sample(logits, [RowSampling(temperature, 1.0, 0, 0.0, key), RowSampling(1e-45, 0.9, 2, 0.0, key)])
        assert out.tokens.tolist() == [1, 1]
    mixed = mx.array([[0.0, 5.0, 1.0, 3.0], [0.0, 50.0, 1.0, 3.0]])  # one row samples, one is greedy
    out = sample(mixed, [RowSampling(1e-45, 1.0, 0, 0.0, key), RowSampling(1.0, 1.0, 0, 0.0, key)])
    assert out.tokens.tolist() == [1, 1]


def test_top_p_and_min_p_cut_the_tail():
    logits = mx.log(mx.array([[0.6, 0.3, 0.1]] * 2))
    draws = set()
    key = mx.random.key(1)
    for _ in range(40):
        out = sample(logits, [RowSampling(1.0, 0.5, 0, 0.0, key), RowSampling(1.0, 1.0, 0, 0.4, key)])
        draws.update((i, t) for i, t in enumerate(out.tokens.tolist()))
        key = out.keys[0]
    assert {t for i, t in draws if i == 0} == {0}
    assert {t for i, t in draws if i == 1} <= {0, 1}


def test_top_p_zero_keeps_the_most_likely_token():
    logits = mx.log(mx.array([[0.2, 0.5, 0.3]]))
    key = mx.random.key(2)
    for _ in range(10):
        out = sample(logits, [RowSampling(1.0, 0.0, 0, 0.0, key)])
        assert out.tokens.tolist() == [1]  # was every token cut: -inf everywhere, a meaningless draw
        key = out.keys[0]


@pytest.mark.parametrize("top_p", [0.0, 0.5, 0.9])
def test_top_p_on_the_host_keeps_the_same_tokens_as_on_the_device(monkeypatch, top_p):
    from locals.engine.rows import sampling

    scaled = mx.random.normal((4, 5000), key=mx.random.key(3)) * 3
    kept = {}
    for on_host in (False, True):
        monkeypatch.setattr(sampling, "SORT_ON_HOST", on_host)
        kept[on_host] = ~mx.isinf(sampling._top_p(scaled, [top_p] * 4))
    assert mx.array_equal(kept[False], kept[True])
    assert kept[True].sum(axis=-1).min().item() >= 1


def test_sampling_params_name_the_value_out_of_range():
    from locals.protocol import SamplingParams

    assert SamplingParams(temperature=0.7, top_p=0.0, top_k=40, min_p=0.1).problem() is None
    assert "max_tokens" in SamplingParams(max_tokens=0).problem()
    assert "temperature" in SamplingParams(temperature=-1).problem()
    assert "top_p" in SamplingParams(top_p=1.5).problem()
    assert "top_p" in SamplingParams(top_p=float("nan")).problem()
    assert SamplingParams(top_k=-1).problem() is None  # off, as vLLM's -1
    assert "min_p" in SamplingParams(min_p=2).problem()


@pytest.mark.parametrize("route", ["fused", "composed", "bucketed", "host"])
def test_ragged_forward_matches_plain_model(tiny_llama, route, monkeypatch):
    from locals.engine.forward import chunk_attention

    monkeypatch.setattr(chunk_attention, "ON_CUDA", route in ("composed", "bucketed"))  # as a CUDA GPU attends
    if route == "bucketed":  # these chunks (8, 12 tokens) at mlx-lm's cache sizes (256) as if buckets
        monkeypatch.setattr(chunk_attention, "BUCKET_MIN_QUERIES", 8)
        monkeypatch.setattr(chunk_attention, "ROOM_STEP", 256)
    monkeypatch.setattr(host_attention, "SOFTMAX_ON_HOST", route == "host")  # as the CPU does
    model = tiny_llama.model
    a, b = mx.array(list(range(10, 30))), mx.array([5, 6, 7])
    ka, kb = RowKV(len(model.layers)), RowKV(len(model.layers))
    first = forward(model, [RowInput(a[:12], 12, ka, False), RowInput(b, 3, kb, True)])
    second = forward(model, [RowInput(a[12:], 8, ka, True)])
    ref_a, ref_b = model(a[None])[0, -1], model(b[None])[0, -1]
    assert mx.allclose(first[0], ref_b, atol=1e-4) and mx.allclose(second[0], ref_a, atol=1e-4)
    assert ka.offset == 20 and kb.offset == 3


def _plain_last_logits(model, tokens: list[int]) -> mx.array:
    return model(mx.array(tokens)[None])[0, -1]


@pytest.mark.parametrize("compile_layers", [False, True], ids=["plain", "compiled"])
def test_decode_batch_forward_matches_plain_model(tiny_llama, compile_layers):
    model = tiny_llama.model
    n_layers = len(model.layers)
    batch = DecodeBatch(n_layers)
    seqs = [list(range(10, 10 + n)) for n in (5, 9, 3)]
    kvs = [RowKV(n_layers, batch) for _ in seqs]
    compiled = CompiledBlocks() if compile_layers else None
    forward = functools.partial(forward_pass, compiled=compiled)
    forward(model, [RowInput(mx.array(s[:-1]), len(s) - 1, kv, False) for s, kv in zip(seqs, kvs)])
    assert not any(kv.resident for kv in kvs)  # prompt chunks stay in the rows' own caches

    # One token each, different lengths: the rows join and attend in one masked call.
    out = forward(model, [RowInput(mx.array(s[-1:]), 1, kv, True) for s, kv in zip(seqs, kvs)])
    assert [kv.slot for kv in kvs] == [0, 1, 2] and [kv.offset for kv in kvs] == [5, 9, 3]
    for i, s in enumerate(seqs):
        assert mx.allclose(out[i], _plain_last_logits(model, s), atol=1e-4)

    # Two of three members decode (gathered, out of slot order); the third feeds forced tokens.
    seqs[0] += [40]
    seqs[1] += [42, 43]
    seqs[2] += [41]
    out = forward(model, [RowInput(mx.array([41]), 1, kvs[2], True), RowInput(mx.array([42, 43]), 2, kvs[1], True),
                          RowInput(mx.array([40]), 1, kvs[0], True)])
    for j, i in enumerate([2, 1, 0]):
        assert mx.allclose(out[j], _plain_last_logits(model, seqs[i]), atol=1e-4)
    assert [kv.offset for kv in kvs] == [6, 11, 4]

    # A row leaving moves the last member into its slot; the others keep decoding correctly.
    snap = kvs[2].snapshot()
    kvs[0].release()
    assert kvs[2].slot == 0 and len(batch.members) == 2
    assert all(mx.array_equal(a, b) for pair, again in zip(snap, kvs[2].snapshot()) for a, b in zip(pair, again))
    seqs[1] += [44]
    seqs[2] += [45]
    out = forward(model, [RowInput(mx.array([44]), 1, kvs[1], True), RowInput(mx.array([45]), 1, kvs[2], True)])
    assert mx.allclose(out[0], _plain_last_logits(model, seqs[1]), atol=1e-4)
    assert mx.allclose(out[1], _plain_last_logits(model, seqs[2]), atol=1e-4)
    kvs[1].release()
    kvs[2].release()
    assert batch.members == [] and batch.kv == [] and batch.nbytes == 0


@pytest.mark.parametrize("compile_layers", [False, True], ids=["plain", "compiled"])
def test_batch_rows_with_several_tokens_attend_in_one_call_per_layer(tiny_llama, compile_layers, monkeypatch):
    # Forced tokens and drafts: resident rows bring 3, 1 and 4 tokens in one pass, out of
    # slot order, each asking for logits at every one of its tokens; every logit matches
    # the plain model over the whole sequence, and attention is one call per layer.
    model = tiny_llama.model
    n_layers = len(model.layers)
    batch = DecodeBatch(n_layers)
    seqs = [list(range(20, 20 + n)) for n in (6, 11, 4)]
    kvs = [RowKV(n_layers, batch) for _ in seqs]
    forward = functools.partial(forward_pass, compiled=CompiledBlocks() if compile_layers else None)
    forward(model, [RowInput(mx.array(s[:-1]), len(s) - 1, kv, False) for s, kv in zip(seqs, kvs)])
    forward(model, [RowInput(mx.array(s[-1:]), 1, kv, False) for s, kv in zip(seqs, kvs)])
    assert all(kv.resident for kv in kvs)
    new = {0: [50, 51, 52], 1: [53], 2: [54, 55, 56, 57]}
    calls = []
    sdpa, on_host = mx.fast.scaled_dot_product_attention, host_attention.host_attention
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    monkeypatch.setattr(host_attention, "host_attention", lambda *a, **k: calls.append(1) or on_host(*a, **k))
    order = [2, 0, 1]
    out = forward(model, [RowInput(mx.array(new[i]), len(new[i]), kvs[i], True, logits=len(new[i])) for i in order])
    assert len(calls) == n_layers
    at = 0
    for i in order:
        seqs[i] += new[i]
        plain = model(mx.array(seqs[i])[None])[0, -len(new[i]):]
        assert mx.allclose(out[at : at + len(new[i])], plain, atol=1e-4)
        at += len(new[i])
    assert [kv.offset for kv in kvs] == [len(s) for s in seqs]
    # The next decode step reads the chunks' keys/values back from the batch.
    out = forward(model, [RowInput(mx.array([60]), 1, kv, True) for kv in kvs])
    for i, s in enumerate(seqs):
        assert mx.allclose(out[i], _plain_last_logits(model, s + [60]), atol=1e-4)


def test_kv_write_indices_are_int32_and_full_shape(tiny_llama, monkeypatch):
    # Mixed index dtypes make MLX cast to a common one (two casts per scatter, kernels on a
    # GPU), and indices that need broadcasting add Broadcast ops to every layer's write.
    model = tiny_llama.model
    batch = DecodeBatch(len(model.layers))
    kvs = [RowKV(len(model.layers), batch) for _ in range(3)]
    forward(model, [RowInput(mx.array([3, 4, 5, 6][: n + 2]), n + 2, kv, False) for n, kv in enumerate(kvs)])
    forward(model, [RowInput(mx.array([8]), 1, kv, False) for kv in kvs])  # the rows join the batch
    assert all(kv.resident for kv in kvs) and [kv.offset for kv in kvs] == [3, 4, 5]
    seen = []
    write = DecodeBatch.write
    monkeypatch.setattr(DecodeBatch, "write", lambda self, li, index, kv: seen.append((index, kv.shape))
                        or write(self, li, index, kv))
    counts = (1, 3, 2)
    forward(model, [RowInput(mx.array([7] * n), n, kv, True, logits=n) for n, kv in zip(counts, kvs)])
    assert len(seen) == len(model.layers)  # keys and values in one scatter a layer
    for index, kv_shape in seen:
        assert [part.dtype for part in index] == [mx.int32] * 3
        assert kv_shape[0] == 2 * sum(counts)
        assert all(part.shape == (2 * sum(counts), kv_shape[1], 1) for part in index)
    rows, _heads, positions = (np.array(part[:, 0, 0]) for part in seen[0][0])
    # The keys' rows are the slots; the values' rows sit rows_cap (4) further.
    assert rows.tolist() == [0, 1, 1, 1, 2, 2, 4, 5, 5, 5, 6, 6]
    assert positions.tolist() == [3, 4, 5, 6, 5, 6] * 2


def test_compiled_layers_are_traced_again_when_modules_or_forward_choices_change(tiny_llama):
    from locals.engine.forward.choices import ForwardChoices
    from locals.engine.kernels.registry import modules_swapped

    layers = tiny_llama.model.model.layers
    blocks, served, baseline = CompiledBlocks(), ForwardChoices(), ForwardChoices(fused=False)
    seams = blocks.seams(layers, served, 1)
    assert len(seams) == len(layers) + 1 and blocks.seams(layers, served, 1) is seams
    other = blocks.seams(layers, baseline, 1)  # a trace that used a fused kernel must not serve MLX's ops
    assert other is not seams
    assert blocks.seams(layers, ForwardChoices(), 1) is seams  # an equal value: the same graphs
    modules_swapped()  # e.g. tuned-kernel patching swapped a layer's linears
    fresh = blocks.seams(layers, served, 1)
    assert fresh is not seams and fresh is not other
    assert blocks.seams(layers, baseline, 1) is not other  # stale graphs of either choice are dropped


def test_patching_a_model_counts_as_a_swap(tiny_llama, monkeypatch):
    from locals.engine.kernels import registry

    before = registry.swap_count()
    square = lambda layer, *_: nn.Linear(2, 2) if isinstance(layer, nn.Linear) and layer.weight.shape == (4, 4) else layer
    monkeypatch.setattr(registry, "tuned_linear", square)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 3))
    assert registry.patch_model(model, table=object()) == 1
    assert registry.swap_count() == before + 1
    assert registry.patch_model(nn.Sequential(nn.Linear(4, 3)), table=object()) == 0
    assert registry.swap_count() == before + 1  # nothing swapped: compiled graphs stay


def test_decode_batch_grows_past_a_block(tiny_llama):
    model = tiny_llama.model
    n_layers = len(model.layers)
    batch = DecodeBatch(n_layers)
    seqs = [list(range(3, 3 + 250)), list(range(7, 7 + 20))]
    kvs = [RowKV(n_layers, batch) for _ in seqs]
    forward(model, [RowInput(mx.array(s), len(s), kv, False) for s, kv in zip(seqs, kvs)])
    for step in range(8):  # the long row crosses the 256-position block while decoding
        for s in seqs:
            s.append(100 + step)
        out = forward(model, [RowInput(mx.array(s[-1:]), 1, kv, True) for s, kv in zip(seqs, kvs)])
    assert batch.t_cap == 384  # the next capacity after 256 (kv.token_capacity)
    for i, s in enumerate(seqs):
        assert mx.allclose(out[i], _plain_last_logits(model, s), atol=1e-4)


@pytest.mark.parametrize("cached", [0, 37], ids=["fresh", "after-a-stored-prefix"])
def test_a_prompt_read_in_chunks_allocates_its_caches_once_and_reads_what_an_unreserved_one_does(
        tiny_llama, cached):
    model = tiny_llama.model
    n_layers = len(model.layers)
    prompt = [(11 * i) % 500 + 3 for i in range(cached + 3 * 250 + 1)]
    reserved, plain = RowKV(n_layers), RowKV(n_layers)
    if cached:  # a stored prefix loaded first, as the prefix cache hands it over
        stored = RowKV(n_layers)
        forward(model, [RowInput(mx.array(prompt[:cached]), cached, stored, False)])
        for kv in (reserved, plain):
            kv.load(stored.snapshot(), cached)
    reserved.reserve(len(prompt))
    buffers = set()
    for start in range(cached, len(prompt), 250):  # chunks as a prompt is read beside decoding rows
        chunk = prompt[start:start + 250]
        out = [forward(model, [RowInput(mx.array(chunk), len(chunk), kv, True)]) for kv in (reserved, plain)]
        assert mx.allclose(out[0], out[1], atol=1e-5)
        buffers.add(reserved.layers[0].keys.shape[2])
    assert buffers == {1024}  # room for the whole prompt (751 or 788 positions, in kv.ROOM_STEP), taken once
    assert reserved.offset == plain.offset == len(prompt)
    assert mx.allclose(reserved.layers[1].keys[..., :len(prompt), :], plain.layers[1].keys[..., :len(prompt), :])


def test_long_row_decodes_on_its_own_caches_next_to_the_batch(tiny_llama):
    model = tiny_llama.model
    n_layers = len(model.layers)
    batch = DecodeBatch(n_layers)
    seqs = [list(range(10, 15)), list(range(20, 29)), [(7 * i) % 500 + 3 for i in range(600)]]
    kvs = [RowKV(n_layers, batch) for _ in seqs]
    forward(model, [RowInput(mx.array(s[:-1]), len(s) - 1, kv, False) for s, kv in zip(seqs, kvs)])
    out = forward(model, [RowInput(mx.array(s[-1:]), 1, kv, True) for s, kv in zip(seqs, kvs)])
    # Padding the two short rows to 600 positions would exceed the bound: the long row stays out.
    assert kvs[0].resident and kvs[1].resident and not kvs[2].resident
    assert not batch.fits(kvs[2].offset) and kvs[2].offset == 600
    for i, s in enumerate(seqs):
        assert mx.allclose(out[i], _plain_last_logits(model, s), atol=1e-4)


def test_engine_settings_from_the_environment(monkeypatch):
    from locals.engine.assemble import config_from_settings

    monkeypatch.setenv("LOCALS_KV_BUDGET_MB", "300")
    monkeypatch.setenv("LOCALS_PREFIX_CACHE_MB", "64")
    monkeypatch.setenv("LOCALS_MAX_BATCH", "5")
    monkeypatch.setenv("LOCALS_SPECULATE", "off")
    monkeypatch.setenv("LOCALS_KERNELS", "0")
    config = config_from_settings()
    assert (config.kv_budget_bytes, config.prefix_cache_bytes) == (300 * 2**20, 64 * 2**20)
    assert config.max_batch == 5 and config.speculate is False and config.tuned_kernels is False
    for name in ("LOCALS_KV_BUDGET_MB", "LOCALS_PREFIX_CACHE_MB", "LOCALS_MAX_BATCH", "LOCALS_SPECULATE",
                 "LOCALS_KERNELS"):
        monkeypatch.delenv(name)
    default = config_from_settings()
    assert default.speculate is True and default.tuned_kernels is True
    assert default.prefix_cache_bytes is None and default.resolved_prefix_cache_bytes() >= 256 * 2**20
