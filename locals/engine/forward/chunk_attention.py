"""Attention for a prompt chunk read against its row's cache: MLX's fused attention; on CUDA, for
chunks whose scores are small, the same attention composed of two matmuls and a softmax; on the
CPU, composed with the softmax in numpy.

On CUDA MLX runs a chunk's attention through cuDNN, which builds a graph for each new shape of
queries and keys: 40–48 ms on an H200, then 0.2 ms a layer once built. Agents' prompts start
their chunks at whatever length their cached prefix left, so nearly every chunk meets a new
shape, and a step reading one beside decoding rows took 93 ms at the median, against 49 ms
with the composed attention (0.6 ms a layer at 248 x 8k, no build). For large chunks (a prompt
read alone in 2,048-token chunks) the scores outgrow the build: 3.2 ms a layer at 2,048 x 8k
against cuDNN's 0.8, so those stay with MLX (docs/benchmarks-log.md, "Attention graphs built
per prompt length"). Metal builds nothing per shape: MLX's fused kernel always.

On the CPU a chunk's time is its softmax, which numpy runs faster than MLX there (host_attention.py).
"""

from __future__ import annotations

import mlx.core as mx

from locals.engine.forward import host_attention as host
from locals.engine.load.backend import detect

# Queries x keys per head up to which a CUDA chunk is composed: about where the scores' extra
# reads and writes (36 layers) cost what one cuDNN graph build does, 1,024 queries at 8k keys.
COMPOSED_MAX_SCORES = 1 << 23


ON_CUDA = detect().kind == "cuda"


def chunk_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
    """q (1, heads, n, dim) against keys/values (1, kv_heads, L, dim), the n queries being the
    last n of the L positions (causal): (1, heads, n, dim)."""
    n, length = q.shape[2], keys.shape[2]
    if n > 1 and host.SOFTMAX_ON_HOST:
        return host.host_attention(q, keys, values, scale, causal=True)
    if n > 1 and ON_CUDA and n * length <= COMPOSED_MAX_SCORES:
        return composed_attention(q, keys, values, scale)
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask="causal" if n > 1 else None)


def composed_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
    """Causal attention as MLX composes it where it has no fused kernel: the queries scaled,
    scores in the inputs' dtype, a softmax in float32, grouped-query heads by reshaping."""
    n, length = q.shape[2], keys.shape[2]
    scores = host.grouped_scores(q, keys, scale)
    # Query i sits at position L - n + i and sees keys up to it.
    visible = mx.arange(length - n, length)[:, None] >= mx.arange(length)[None]
    scores = mx.where(visible, scores, mx.array(-float("inf"), scores.dtype))
    return host.weighted_values(mx.softmax(scores, axis=-1, precise=True), values)
