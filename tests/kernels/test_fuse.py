"""Joined q/k/v and gate/up linears: same outputs, each weight once, mlx-lm's forward intact."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import qwen2

from locals.engine.forward.forward import RowInput, forward
from locals.engine.forward.fuse import PartOf, fuse_projections
from locals.engine.kernels.tuning.tuner import model_problems
from locals.engine.forward.kv import RowKV, kv_bytes_per_token

from tests.helpers.kernel_models import tiny_qwen3


def _qwen2_with_biases(seed: int = 4):
    mx.random.seed(seed)
    args = qwen2.ModelArgs(model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=200,
                           max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=True)
    model = qwen2.Model(args)
    # Random biases (they start at zero) so a wrongly joined bias would show.
    for layer in model.model.layers:
        for name in ("q_proj", "k_proj", "v_proj"):
            proj = getattr(layer.self_attn, name)
            proj.bias = mx.random.normal(proj.bias.shape)
    mx.eval(model.parameters())
    return model


def _logits(model, tokens: list[int]) -> np.ndarray:
    return np.array(model(mx.array([tokens])).astype(mx.float32))


@pytest.mark.parametrize("build", [lambda: tiny_qwen3(True), lambda: tiny_qwen3(False), _qwen2_with_biases],
                         ids=["qwen3-4bit", "qwen3-dense", "qwen2-biases"])
def test_joined_model_computes_what_it_did_and_holds_each_weight_once(build):
    model = build()
    tokens = [5, 17, 42, 7, 99, 3]
    before = _logits(model, tokens)
    params_before = sum(v.size for _, v in tree_flatten(model.parameters()))
    kv_before = kv_bytes_per_token(model)

    assert fuse_projections(model) == 2 * len(model.model.layers)

    # mlx-lm's own forward now runs through the PartOf views: the same numbers.
    np.testing.assert_allclose(_logits(model, tokens), before, rtol=1e-5, atol=1e-5)
    assert sum(v.size for _, v in tree_flatten(model.parameters())) == params_before
    assert kv_bytes_per_token(model) == kv_before
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert isinstance(attn.q_proj, PartOf) and isinstance(mlp.up_proj, PartOf)
    assert attn.fused_qkv.weight.shape[0] == sum(p.weight.shape[0] for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    # Our ragged forward takes the joined matmuls and agrees with the plain model.
    rows = [RowInput(tokens=mx.array(tokens, dtype=mx.int32), n=len(tokens), kv=RowKV(len(model.model.layers)),
                     sample=True, logits=len(tokens))]
    ours = np.array(forward(model, rows).astype(mx.float32))
    np.testing.assert_allclose(ours, before[0], rtol=2e-4, atol=2e-4)
    # Joining again changes nothing.
    assert fuse_projections(model) == 0


def test_tuning_sees_the_joined_shapes():
    model = tiny_qwen3(True)
    before = {(p.n, p.k) for p in model_problems(model)}
    fuse_projections(model)
    after = {(p.n, p.k) for p in model_problems(model)}
    # The tied lm_head (vocab 300 x hidden 128) is a problem too, joined or not.
    assert before == {(128, 128), (64, 128), (192, 128), (128, 192), (300, 128)}
    # q (128) + k (64) + v (64) rows, gate + up (2 * 192) rows; o and down stay as they were.
    assert after == {(256, 128), (384, 128), (128, 128), (128, 192), (300, 128)}


def test_parts_of_different_kinds_or_settings_stay_apart():
    model = tiny_qwen3(False)
    attn = model.model.layers[0].self_attn
    # One part quantized at 8 bits, the others at 4: no single op runs them all.
    nn.quantize(model, group_size=64, bits=4)
    attn.v_proj = nn.QuantizedLinear.from_linear(nn.Linear(128, 64, bias=False), group_size=64, bits=8)
    mx.eval(model.parameters())
    joined = fuse_projections(model)
    assert "fused_qkv" not in attn and not isinstance(attn.q_proj, PartOf)
    assert "fused_gate_up" in model.model.layers[0].mlp
    assert joined == 2 * len(model.model.layers) - 1


def test_passes_longer_than_the_setting_run_the_parts(monkeypatch):
    from locals.engine.forward.choices import ForwardChoices

    model = tiny_qwen3(True)
    fuse_projections(model)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    calls = []
    plain_call = nn.QuantizedLinear.__call__

    def counting(self, x):
        if self is attn.fused_qkv or self is mlp.fused_gate_up:
            calls.append(x.shape[0])
        return plain_call(self, x)

    monkeypatch.setattr(nn.QuantizedLinear, "__call__", counting)
    choices = ForwardChoices(joined_qkv_max_tokens=3, joined_gate_up_max_tokens=3)
    expected = {}
    for n in (3, 5):
        tokens = list(range(7, 7 + n))
        expected[n] = _logits(model, tokens)[0]
        rows = [RowInput(tokens=mx.array(tokens, dtype=mx.int32), n=n, kv=RowKV(len(model.model.layers)),
                         sample=True, logits=n)]
        calls.clear()
        out = np.array(forward(model, rows, choices=choices).astype(mx.float32))
        np.testing.assert_allclose(out, expected[n], rtol=2e-4, atol=2e-4)
        assert calls == ([n, n] if n <= 3 else [])  # layer 0's joined q/k/v and gate/up, or neither


def test_joined_matmuls_run_every_pass_but_qkv_without_the_head_kernel_on_cuda(monkeypatch):
    from locals.engine.forward import layer_pass as fwd
    from locals.engine.forward.choices import ForwardChoices

    class FakeCuda:
        available = True

        @classmethod
        def is_available(cls):
            return cls.available

    monkeypatch.setattr(mx, "cuda", FakeCuda, raising=False)
    served = ForwardChoices()
    assert min(served.joined_qkv_max_tokens, served.joined_gate_up_max_tokens) > 1 << 20
    assert fwd._unfused_qkv_limit() == 4
    FakeCuda.available = False
    assert fwd._unfused_qkv_limit() > 1 << 20


def test_rope_gets_int32_offsets_so_no_cast_per_call(monkeypatch):
    # mx.fast.rope casts offsets of any other dtype to int32: one cast op per call (numpy's
    # default int64 positions cost two a layer, kernels on a GPU).
    from locals.engine.forward.forward import CompiledBlocks

    real, seen = mx.fast.rope, []

    def recording(x, dims, **kwargs):
        seen.append(kwargs["offset"].dtype)
        return real(x, dims, **kwargs)

    monkeypatch.setattr(mx.fast, "rope", recording)
    model = tiny_qwen3(False)
    rows = [RowInput(tokens=mx.array([5, 17, 42], dtype=mx.int32), n=3, kv=RowKV(len(model.model.layers)),
                     sample=True)]
    mx.eval(forward(model, rows))  # a prompt chunk, plain
    rows[0] = RowInput(tokens=mx.array([7], dtype=mx.int32), n=1, kv=rows[0].kv, sample=True)
    mx.eval(forward(model, rows, CompiledBlocks()))  # a decode step, through the compiled seams
    assert len(seen) >= 4 * len(model.model.layers) and set(seen) == {mx.int32}, seen
