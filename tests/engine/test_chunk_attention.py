"""The composed attention a CUDA prompt chunk may take, and the CPU's with its softmax in numpy,
equal MLX's fused attention."""

import mlx.core as mx
import numpy as np
import pytest

from locals.engine.forward import chunk_attention as ca


@pytest.mark.parametrize("dtype,tol", [(mx.float32, 1e-5), (mx.bfloat16, 3e-2)])
@pytest.mark.parametrize("heads,kv_heads,n,length", [(8, 2, 5, 37), (4, 4, 16, 16), (6, 3, 1, 9), (9, 3, 64, 300)])
@pytest.mark.parametrize("way", ["composed_attention", "host_softmax_attention"])
def test_composed_attention_equals_mlx_fused(dtype, tol, heads, kv_heads, n, length, way):
    mx.random.seed(n + length)
    q = mx.random.normal((1, heads, n, 64)).astype(dtype)
    k = mx.random.normal((1, kv_heads, length, 64)).astype(dtype)
    v = mx.random.normal((1, kv_heads, length, 64)).astype(dtype)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal" if n > 1 else None)
    got = getattr(ca, way)(q, k, v, 0.125)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)), atol=tol, rtol=tol)


def test_only_cuda_chunks_with_small_scores_are_composed(monkeypatch):
    calls = []
    monkeypatch.setattr(ca, "SOFTMAX_ON_HOST", False)
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


def test_cpu_chunks_normalize_on_the_host_and_leave_their_inputs_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(ca, "host_softmax_attention", lambda *a: calls.append(a[0].shape[2]) or a[0])
    q, k = mx.zeros((1, 4, 8, 32)), mx.zeros((1, 2, 100, 32))
    monkeypatch.setattr(ca, "SOFTMAX_ON_HOST", True)
    ca.chunk_attention(q, k, k, 1.0)
    ca.chunk_attention(q[:, :, :1], k, k, 1.0)  # one query: MLX's vector kernel
    assert calls == [8]
    monkeypatch.undo()
    mx.random.seed(3)
    q, k, v = (mx.random.normal(shape) for shape in ((1, 4, 8, 32), (1, 2, 20, 32), (1, 2, 20, 32)))
    before = [np.array(a) for a in (q, k, v)]
    ca.host_softmax_attention(q, k, v, 0.5)  # rewrites its own scores in place, nothing else
    for a, b in zip((q, k, v), before):
        np.testing.assert_array_equal(np.array(a), b)
