"""Attention for a prompt chunk read against its row's cache: MLX's fused attention; on CUDA at
shapes from a few buckets, or for small chunks the same attention composed of two matmuls and a
softmax; on the CPU, composed with the softmax in numpy.

On CUDA MLX runs a chunk's attention through cuDNN, which builds a graph for each new shape of
queries and keys: 40–48 ms on an H200, then 0.2 ms a layer once built. Agents' prompts start
their chunks at whatever length their cached prefix left, so nearly every chunk would meet a new
shape. A chunk whose caches were sized in buckets (kv.PromptKV: multiples of ROOM_STEP positions)
attends over the whole buffer with its queries padded to a power of two and the positions it may
not see masked, so its shape is one of a few the warm-up built (`prebuild`): at 248 tokens after
4,096 its attention took 3.7 ms (36 layers, H100) against 11.6 composed, and served steps with a
chunk halved (docs/benchmarks-log.md, "Prompt chunks attend at bucketed shapes"). Other chunks whose
scores are small are composed (no build; docs/benchmarks-log.md,
"Attention graphs built per prompt length"); the rest stay with MLX's causal attention. A decode
batch whose rows bring several tokens composes its attention the same way (`composes`,
batch_plan.py). Metal builds nothing per shape: MLX's fused kernel always.

On the CPU a chunk's time is its softmax, which numpy runs faster than MLX there (host_attention.py).
"""

from __future__ import annotations

import mlx.core as mx

from locals.engine.forward import host_attention as host
from locals.engine.forward.kv import ROOM_STEP
from locals.engine.load.backend import detect

# Queries x keys per head up to which a CUDA chunk is composed: about where the scores' extra
# reads and writes (36 layers) cost what one cuDNN graph build does, 1,024 queries at 8k keys.
COMPOSED_MAX_SCORES = 1 << 23
# Chunks of more than half this many queries and at most BUCKET_MAX_QUERIES are bucketed, padded
# to a power of two from this: smaller ones are composed (their scores are few); larger ones are
# prompts read alone, whose attention over the whole buffer would cost more than their builds.
BUCKET_MIN_QUERIES = 64
BUCKET_MAX_QUERIES = 256  # EngineConfig.step_token_budget's default on a GPU: every chunk read beside decoding rows


ON_CUDA = detect().kind == "cuda"


def chunk_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float,
                    buffers: tuple[mx.array, mx.array] | None = None) -> mx.array:
    """q (1, heads, n, dim) against keys/values (1, kv_heads, L, dim), the n queries being the
    last n of the L positions (causal): (1, heads, n, dim). `buffers`: the caches' whole key and
    value arrays, whose first L positions keys/values are."""
    n, length = q.shape[2], keys.shape[2]
    if n > 1 and host.SOFTMAX_ON_HOST:
        return host.host_attention(q, keys, values, scale, causal=True)
    if n > 1 and ON_CUDA:
        if (BUCKET_MIN_QUERIES // 2 < n <= BUCKET_MAX_QUERIES and buffers is not None
                and buffers[0].shape[2] % ROOM_STEP == 0):
            return bucketed_attention(q, *buffers, length, scale)
        if composes(n, length):
            return composed_attention(q, keys, values, scale)
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask="causal" if n > 1 else None)


def query_bucket(n: int) -> int:
    """Queries a chunk of `n` is padded to: the next power of two, BUCKET_MIN_QUERIES at least."""
    return max(BUCKET_MIN_QUERIES, 1 << (n - 1).bit_length())


def bucketed_attention(q: mx.array, key_buffer: mx.array, value_buffer: mx.array, length: int,
                       scale: float) -> mx.array:
    """`chunk_attention` over the whole buffers (positions past `length` masked), the queries
    padded to `query_bucket(n)`: cuDNN meets the buffer's and the bucket's shape, not the chunk's."""
    n = q.shape[2]
    width = query_bucket(n)
    padded = mx.concatenate([q, mx.zeros((*q.shape[:2], width - n, q.shape[3]), q.dtype)], axis=2)
    out = mx.fast.scaled_dot_product_attention(padded, key_buffer, value_buffer, scale=scale,
                                               mask=_visible_bias(n, width, length, key_buffer.shape[2], q.dtype))
    return out[:, :, :n]


_last_bias: tuple[tuple, mx.array] | None = None  # every layer of a pass meets the same one


def _visible_bias(n: int, width: int, length: int, positions: int, dtype) -> mx.array:
    """(1, 1, width, positions): 0 where query i (at position length - n + i) may look, -inf elsewhere;
    a padded query (i >= n) looks at position 0 only, so its softmax stays finite."""
    global _last_bias
    key = (n, width, length, positions, dtype)
    if _last_bias is None or _last_bias[0] != key:
        rows, cols = mx.arange(width)[:, None], mx.arange(positions)[None]
        visible = mx.where(rows < n, cols <= length - n + rows, cols == 0)
        bias = mx.where(visible, mx.array(0, dtype), mx.array(-float("inf"), dtype))
        _last_bias = key, bias[None, None]
    return _last_bias[1]


def prebuild(heads: int, kv_heads: int, dim: int, dtype, chunk: int, up_to: int) -> None:
    """Run the bucketed attention of chunks of up to `chunk` tokens, at every bucket up to its own
    (a prompt's last chunk has any length) and every buffer size up to `up_to` positions, once, so
    cuDNN has built those graphs before a request meets them (CUDA only; nothing for a chunk that
    is not bucketed)."""
    if not BUCKET_MIN_QUERIES // 2 < chunk <= BUCKET_MAX_QUERIES:
        return
    width = BUCKET_MIN_QUERIES
    while width <= query_bucket(chunk):
        for positions in range(ROOM_STEP, up_to + 1, ROOM_STEP):
            buffers = [mx.zeros((1, kv_heads, positions, dim), dtype) for _ in range(2)]
            q = mx.zeros((1, heads, width, dim), dtype)
            mx.eval(bucketed_attention(q, *buffers, positions, dim ** -0.5))
        width *= 2


def composes(queries: int, keys: int) -> bool:
    """Whether attention of `queries` (all rows') over `keys` positions is composed on CUDA rather
    than sent to cuDNN, which would build a graph for its shape (COMPOSED_MAX_SCORES)."""
    return ON_CUDA and queries * keys <= COMPOSED_MAX_SCORES


def composed_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float,
                       visible: mx.array | None = None) -> mx.array:
    """Attention as MLX composes it where it has no fused kernel: the queries scaled, scores in the
    inputs' dtype, a softmax in float32, grouped-query heads by reshaping. `visible` (B, 1, n, L):
    which keys each query sees; None: causal, the n queries being the last n of the L positions."""
    n, length = q.shape[2], keys.shape[2]
    scores = host.grouped_scores(q, keys, scale)
    if visible is None:  # query i sits at position L - n + i and sees keys up to it
        visible = mx.arange(length - n, length)[:, None] >= mx.arange(length)[None]
    else:
        visible = visible[:, :, None]  # (B, 1, 1, n, L) against the scores' (B, kv_heads, group, n, L)
    scores = mx.where(visible, scores, mx.array(-float("inf"), scores.dtype))
    return host.weighted_values(mx.softmax(scores, axis=-1, precise=True), values)
