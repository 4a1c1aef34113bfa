"""RoPE stretches: what each scaling changes in a llama, that the engine's forward serves a
stretched model as mlx-lm's own model computes it, and the embedded model's served window."""

from __future__ import annotations

import dataclasses
import math

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import llama
from mlx_lm.models.rope_utils import YarnRoPE

from locals.engine.forward.forward import RowInput, forward
from locals.engine.forward.kv import RowKV
from locals.engine.load.window import SCALINGS, Stretch, stretched

TRAINED = 128


def _args(**changes) -> llama.ModelArgs:
    base = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=512,
                           rope_theta=10000.0, rope_traditional=True, max_position_embeddings=TRAINED)
    return dataclasses.replace(base, **changes)


def test_each_scaling_changes_only_the_rotary_embedding_and_the_window():
    ropes = {s: llama.Model(stretched(_args(), Stretch(s, 4 * TRAINED))).model.layers[0].self_attn.rope
             for s in SCALINGS}
    assert type(ropes["none"]) is nn.RoPE and (ropes["none"].base, ropes["none"].scale) == (10000.0, 1.0)
    assert ropes["linear"].scale == 0.25
    assert ropes["ntk"].base == pytest.approx(10000.0 * 4 ** (16 / 14))  # head size 16
    assert isinstance(ropes["yarn"], YarnRoPE) and ropes["yarn"].mscale == pytest.approx(1 + 0.1 * math.log(4))
    assert isinstance(ropes["parts"], YarnRoPE) and ropes["parts"].mscale == 1.0  # no attention temperature
    assert mx.array_equal(ropes["parts"]._freqs, ropes["yarn"]._freqs)
    assert all(stretched(_args(), Stretch(s, 4 * TRAINED)).max_position_embeddings == 4 * TRAINED for s in SCALINGS)
    with pytest.raises(ValueError, match="unknown RoPE scaling"):
        Stretch("dynamic", 4 * TRAINED)


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn", "parts"])
def test_the_engine_forward_serves_a_stretched_model_past_its_trained_window(scaling):
    mx.random.seed(3)
    model = llama.Model(stretched(_args(), Stretch(scaling, 4 * TRAINED)))
    mx.eval(model.parameters())
    tokens = mx.array([(7 * i) % 500 + 3 for i in range(3 * TRAINED)])  # positions up to 3x the trained window
    kv = RowKV(len(model.layers))
    forward(model, [RowInput(tokens[:200], 200, kv, False)])
    last = forward(model, [RowInput(tokens[200:], len(tokens) - 200, kv, True)])[0]
    assert mx.allclose(last, model(tokens[None])[0, -1], atol=1e-4)


def test_the_embedded_model_serves_its_stretched_window(smollm2):
    from locals.engine.load import gguf
    from locals.engine.load.models import EMBEDDED_WINDOW, embedded_gguf_path

    tensors, meta = gguf.read_gguf(embedded_gguf_path())
    trained = gguf.model_args(meta, tensors)
    assert trained.max_position_embeddings == 8192 < EMBEDDED_WINDOW.window == smollm2.context_length
    assert smollm2.model.args == stretched(trained, EMBEDDED_WINDOW)
