"""A patched model's twin on MLX's ops (kernels/twin.py): the peer of the benchmarks and of an
engine without kernels runs MLX's ops on the same arrays, and the patched model keeps its kernels."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from locals.engine.kernels.registry import TunedQuantizedEmbedding, TunedQuantizedLinear
from locals.engine.kernels.twin import mlx_ops_twin
from tests.helpers.kernel_models import CountingPad, tiny_qwen3


def _patch_everything(model, kernel) -> None:
    """Every quantized linear and the tied head routed to `kernel` at 3 rows, a fused kernel attached."""
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            for name, child in list(block.items()):
                if isinstance(child, nn.QuantizedLinear):
                    block[name] = TunedQuantizedLinear(child, {3: kernel})
        layer.self_attn.head_prep = "a fused kernel"
        layer.input_layernorm.add_norm = "a fused kernel"
    model.model.embed_tokens = TunedQuantizedEmbedding(model.model.embed_tokens, {3: kernel})


def test_the_twin_runs_mlx_ops_on_the_same_arrays():
    model = tiny_qwen3(True, seed=5, vocab=320)
    tokens = mx.array([[3, 17, 250]], dtype=mx.int32)
    expected = model(tokens)
    kernel = CountingPad()
    _patch_everything(model, kernel)
    twin = mlx_ops_twin(model)
    assert mx.allclose(twin(tokens), expected, rtol=1e-5, atol=1e-5) and kernel.calls == 0
    layer, original = twin.model.layers[0], model.model.layers[0]
    assert type(layer.self_attn.q_proj) is nn.QuantizedLinear and type(twin.model.embed_tokens) is nn.QuantizedEmbedding
    assert layer.self_attn.q_proj["weight"] is original.self_attn.q_proj["weight"]  # shared, not copied
    assert getattr(layer.self_attn, "head_prep", None) is None
    assert getattr(layer.input_layernorm, "add_norm", None) is None
    # The patched model is as it was: its kernels route, its fused kernels stay attached.
    assert isinstance(original.self_attn.q_proj, TunedQuantizedLinear) and original.self_attn.head_prep
    model(tokens)
    assert kernel.calls > 0


def test_changing_the_twin_leaves_the_model_alone():
    model = tiny_qwen3(True, seed=5, vocab=320)
    twin = mlx_ops_twin(model)
    twin.model.layers[0].mlp.down_proj = nn.Identity()
    twin.model.layers[0].freeze()
    assert isinstance(model.model.layers[0].mlp.down_proj, nn.QuantizedLinear)
    assert not model.model.layers[0].input_layernorm._no_grad  # freezing the twin froze nothing of the model's
