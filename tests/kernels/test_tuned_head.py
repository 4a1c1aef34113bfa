"""A tied model's lm_head (embed_tokens.as_linear) as a tuning problem and a routed layer."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from locals.engine.forward.forward import CompiledBlocks, RowInput, forward
from locals.engine.kernels.registry import TunedQuantizedEmbedding, patch_model
from locals.engine.kernels.tuning.tuner import TuningTable, model_problems, problem_of, tied_head
from locals.engine.forward.kv import RowKV

from tests.helpers.kernel_models import CountingPad, tiny_qwen3

VOCAB, HIDDEN = 320, 128


def _head_table(model, kernel, rows) -> TuningTable:
    key = problem_of(tied_head(model)).key
    return TuningTable(chip="test", mlx=mx.__version__, kernels="test", complete=True,
                       choices={key: {str(m): kernel.name for m in rows}})


def _patched(model, kernel, rows, monkeypatch) -> int:
    from locals.engine.kernels import registry

    monkeypatch.setattr(registry, "_candidates_by_name", lambda: {kernel.name: kernel})
    return patch_model(model, _head_table(model, kernel, rows))


def test_a_tied_head_is_a_tuning_problem_first_in_line():
    model = tiny_qwen3(True, seed=5, vocab=VOCAB, tied=True)
    head = tied_head(model)
    assert head is model.model.embed_tokens
    problems = model_problems(model)
    assert problems[0] == problem_of(head)  # the largest weight: tuned first
    assert (problems[0].n, problems[0].k) == (VOCAB, HIDDEN)


def test_an_untied_or_unquantized_model_has_no_tied_head():
    untied = tiny_qwen3(True, seed=5, vocab=VOCAB, tied=False)
    assert tied_head(untied) is None
    assert (VOCAB, HIDDEN) in {(p.n, p.k) for p in model_problems(untied)}  # its lm_head is a QuantizedLinear
    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=1, intermediate_size=128,
                           num_attention_heads=2, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=100,
                           tie_word_embeddings=True)
    assert tied_head(llama.Model(args)) is None  # float embedding: nothing to tune


def test_patching_routes_the_head_by_row_count_and_keeps_lookups(monkeypatch):
    model = tiny_qwen3(True, seed=5, vocab=VOCAB)
    kernel = CountingPad()
    embed = model.model.embed_tokens
    tokens = mx.array([3, 17, 250], dtype=mx.int32)
    x = mx.random.normal((3, HIDDEN))
    expected_lookup, expected_head = embed(tokens), embed.as_linear(x)
    one = mx.random.normal((1, HIDDEN))
    expected_one = embed.as_linear(one)

    assert _patched(model, kernel, [3], monkeypatch) == 1
    tuned = model.model.embed_tokens
    assert isinstance(tuned, TunedQuantizedEmbedding) and tuned["weight"] is embed["weight"]
    assert mx.array_equal(tuned(tokens), expected_lookup)  # lookups stay MLX's
    assert mx.allclose(tuned.as_linear(x), expected_head, rtol=1e-4, atol=1e-4)
    assert kernel.calls == 1
    assert mx.array_equal(tuned.as_linear(one), expected_one) and kernel.calls == 1  # 1 row: not tuned
    assert _patched(model, kernel, [3], monkeypatch) == 0  # already swapped


def test_no_choice_for_the_head_leaves_it_alone(monkeypatch):
    model = tiny_qwen3(True, seed=5, vocab=VOCAB)
    assert _patched(model, CountingPad(), [], monkeypatch) == 0
    assert type(model.model.embed_tokens) is nn.QuantizedEmbedding


def test_a_decode_pass_reads_its_logits_through_the_tuned_head(monkeypatch):
    # The engine's ragged forward (compiled seams, three rows decoding) with the head routed.
    model = tiny_qwen3(True, seed=5, vocab=VOCAB)
    kernel = CountingPad()

    def logits(m):
        kv = [RowKV(2) for _ in range(3)]
        prompts = [mx.array(list(range(5 + 7 * i, 16 + 7 * i)), dtype=mx.int32) for i in range(3)]
        out = [forward(m, [RowInput(p, p.size, c, True) for p, c in zip(prompts, kv)])]
        for step in range(2):
            rows = [RowInput(mx.array([40 + step + i], dtype=mx.int32), 1, c, True) for i, c in enumerate(kv)]
            out.append(forward(m, rows, CompiledBlocks()))
        return out

    expected = logits(model)
    assert _patched(model, kernel, [3], monkeypatch) == 1
    got = logits(model)
    assert kernel.calls == 3  # the prompt pass and both decode steps sample three rows each
    for g, e in zip(got, expected):
        assert mx.allclose(g, e, rtol=1e-3, atol=1e-3)
