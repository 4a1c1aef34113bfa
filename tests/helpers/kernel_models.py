"""Tiny random models for kernel and forward tests, and kernels' contracts computed with
MLX's ops (what a device kernel must match), shared by tests/kernels/ and tests/engine/."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import qwen3

from locals.engine.forward.choices import COMPILE_MAX_TOKENS, ForwardChoices
from locals.engine.forward.forward import RowInput, forward
from locals.engine.forward.kv import RowKV
from locals.engine.kernels.decode_attention import DecodeAttention
from locals.engine.kernels.decode_attention import reference as attention_reference
from locals.engine.kernels.headprep import HeadPrep, reference, reference_into_cache
from locals.engine.kernels.reference import PaddedCandidate


def tiny_qwen3(quantize: bool, seed: int = 3, head_dim: int = 32, vocab: int = 300, tied: bool = True):
    """A 2-layer random Qwen3 of hidden size 128, 4-bit if `quantize`."""
    mx.random.seed(seed)
    args = qwen3.ModelArgs(model_type="qwen3", hidden_size=128, num_hidden_layers=2, intermediate_size=192,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, rms_norm_eps=1e-6,
                           vocab_size=vocab, max_position_embeddings=512, rope_theta=10000.0,
                           tie_word_embeddings=tied)
    model = qwen3.Model(args)
    if quantize:
        nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    return model


class OpsAttention(DecodeAttention):
    """The kernel's contract computed with MLX's ops."""

    def __call__(self, q, cache, meta, longest, scale):
        return attention_reference(q, cache, meta, scale, longest=longest).reshape(q.shape[0], -1)


class OpsHeadPrep(HeadPrep):
    """The kernel's contract computed with MLX's ops: q/k/v read at their column offsets."""

    def __call__(self, q_src, k_src, v_src, offsets, q_weight, k_weight, positions):
        return reference(*self._sources(q_src, k_src, v_src, offsets), self.spec, q_weight, k_weight, positions)

    def into_cache(self, q_src, k_src, v_src, offsets, q_weight, k_weight, positions, cache, slots):
        return reference_into_cache(*self._sources(q_src, k_src, v_src, offsets), self.spec, q_weight, k_weight,
                                    positions, cache, slots)

    def _sources(self, q_src, k_src, v_src, offsets):
        s = self.spec
        (q_off, k_off, v_off), kv_cols = offsets, s.kv_heads * s.head_dim
        q = q_src[:, q_off:q_off + s.heads * s.head_dim]
        return q, k_src[:, k_off:k_off + kv_cols], v_src[:, v_off:v_off + kv_cols]


def as_on_a_gpu(**changes) -> ForwardChoices:
    """The forward choices a GPU serves with: passes of up to COMPILE_MAX_TOKENS compiled (the CPU's
    default compiles none, so tests of the compiled graphs ask for them)."""
    return ForwardChoices(compile_max_tokens=COMPILE_MAX_TOKENS, **changes)


def run_forward(model, prompt, compiled, choices: ForwardChoices | None = None):
    """Logits of a prompt chunk, then of two decode steps (through compiled seams if given)."""
    choices = choices or as_on_a_gpu()
    kv = RowKV(len(model.model.layers))
    out = [forward(model, [RowInput(mx.array(prompt, dtype=mx.int32), len(prompt), kv, True, len(prompt))],
                   choices=choices)]
    for token in (7, 11):
        out.append(forward(model, [RowInput(mx.array([token], dtype=mx.int32), 1, kv, True)], compiled, choices))
    return [np.array(o.astype(mx.float32)) for o in out]


class CountingPad(PaddedCandidate):
    """MLX's op on rows zero-padded to 8 (a real candidate), counting its calls."""

    def __init__(self):
        super().__init__(8)
        self.calls = 0

    def __call__(self, x, w, scales, biases, group_size, bits):
        self.calls += 1
        return super().__call__(x, w, scales, biases, group_size, bits)
