"""The composed attention a CUDA prompt chunk may take equals MLX's fused attention."""

import mlx.core as mx
import numpy as np
import pytest

from locals.engine.forward import chunk_attention as ca


@pytest.mark.parametrize("dtype,tol", [(mx.float32, 1e-5), (mx.bfloat16, 3e-2)])
@pytest.mark.parametrize("heads,kv_heads,n,length", [(8, 2, 5, 37), (4, 4, 16, 16), (6, 3, 1, 9), (9, 3, 64, 300)])
def test_composed_attention_equals_mlx_fused(dtype, tol, heads, kv_heads, n, length):
    mx.random.seed(n + length)
    q = mx.random.normal((1, heads, n, 64)).astype(dtype)
    k = mx.random.normal((1, kv_heads, length, 64)).astype(dtype)
    v = mx.random.normal((1, kv_heads, length, 64)).astype(dtype)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal" if n > 1 else None)
    got = ca.composed_attention(q, k, v, 0.125)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)), atol=tol, rtol=tol)


def test_only_cuda_chunks_with_small_scores_are_composed(monkeypatch):
    calls = []
    monkeypatch.setattr(ca, "composed_attention", lambda *a: calls.append(a[0].shape[2]) or a[0])
    q, k = mx.zeros((1, 4, 8, 32)), mx.zeros((1, 2, 100, 32))
    monkeypatch.setattr(ca, "ON_CUDA", False)
    ca.chunk_attention(q, k, k, 1.0)
    assert calls == []  # not on CUDA: MLX's fused attention
    monkeypatch.setattr(ca, "ON_CUDA", True)
    ca.chunk_attention(q, k, k, 1.0)
    ca.chunk_attention(q[:, :, :1], k, k, 1.0)  # one query: MLX's vector kernel
    monkeypatch.setattr(ca, "COMPOSED_MAX_SCORES", 8 * 100 - 1)
    ca.chunk_attention(q, k, k, 1.0)  # scores past the limit: fused
    assert calls == [8]
