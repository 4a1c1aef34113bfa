"""Attention with its softmax in numpy: the CPU's path for prompt chunks (chunk_attention.py) and
decode batches (batch_plan.py). Its two grouped-head matmuls are also the composed attention's
on CUDA (chunk_attention.py).

MLX's CPU backend runs exp one lane at a time on x86 (16 ns an element), and attention's softmax
is most of a prompt chunk's time there: 72 of 99 ms a layer at 256 x 2,048 keys. numpy's exp is
vectorized. So the scores come from MLX's matmul, are evaluated, normalized by numpy in place and
handed back for the second matmul: 29 against 99 ms a layer at 256 x 2,048, 298 against 631 at
2,048 x 2,048, equal to 5e-7; 8 decode rows at 1k tokens 71 against 62 tok/s (docs/benchmarks-log.md,
"CPU: attention's softmax in numpy"). The scores are evaluated while the pass is built, so a
step overlaps nothing on the CPU: the engine reads each step as soon as it is queued there.
"""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import numpy as np

from locals.engine.load.backend import detect

SOFTMAX_ON_HOST = detect().kind == "cpu"


def host_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float,
                   hidden: np.ndarray | None = None, causal: bool = False) -> mx.array:
    """q (B, heads, n, dim) against keys/values (B, kv_heads, L, dim) -> (B, heads, n, dim), float32
    scores. `hidden` (broadcastable to (B, 1, n, L)): True where a query may not see a key;
    `causal`: the n queries are the last n of the L positions (a prompt chunk)."""
    n, length = q.shape[2], keys.shape[2]
    scores = grouped_scores(q, keys, scale).astype(mx.float32)
    mx.eval(scores)
    host = np.asarray(scores)  # the scores' own buffer: no array but this one holds it, so rewritten in place
    if causal and n > 1:
        np.copyto(host[..., length - n:], -np.inf, where=_future(n))  # query i sits at L - n + i
    if hidden is not None:
        np.copyto(host, -np.inf, where=hidden[:, :, None])
    np.subtract(host, host.max(-1, keepdims=True), out=host)
    np.exp(host, out=host)
    host /= host.sum(-1, keepdims=True)
    return weighted_values(mx.array(host).astype(values.dtype), values)


def grouped_scores(q: mx.array, keys: mx.array, scale: float) -> mx.array:
    """q (B, heads, n, dim) x keys (B, kv_heads, L, dim), in the inputs' dtype: (B, kv_heads, group,
    n, L). A key head's group of query heads is one matrix of group x n rows, so no batch axis is
    broadcast: keys broadcast over the group took 2.8 against 0.7 ms a layer for 8 decode rows at
    1,400 keys on two x86 cores (docs/benchmarks-log.md, "CPU: grouped heads as one matrix")."""
    b, heads, n, dim = q.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    rows = (q * scale).reshape(b, kv_heads, heads // kv_heads * n, dim)
    return (rows @ keys.swapaxes(-1, -2)).reshape(b, kv_heads, heads // kv_heads, n, length)


def weighted_values(weights: mx.array, values: mx.array) -> mx.array:
    """`grouped_scores`-shaped weights x values (B, kv_heads, L, dim): (B, heads, n, dim)."""
    b, kv_heads, group, n, length = weights.shape
    out = weights.reshape(b, kv_heads, group * n, length) @ values
    return out.reshape(b, kv_heads * group, n, values.shape[-1])


@lru_cache(maxsize=8)
def _future(n: int) -> np.ndarray:
    """(n, n) True where the last n queries' i-th would see a key after its own position."""
    return np.triu(np.ones((n, n), bool), 1)
