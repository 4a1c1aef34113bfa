"""The attention paths beside MLX's fused one equal it: the composed and the bucketed attention a
CUDA prompt chunk may take, and the CPU's with its softmax in numpy (prompt chunks and decode
batches' masks)."""

import mlx.core as mx
import numpy as np
import pytest

from locals.engine.forward import chunk_attention as ca
from locals.engine.forward import host_attention as host


def _close(got: mx.array, want: mx.array, tol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)), atol=tol, rtol=tol)


def _qkv(batch, heads, kv_heads, n, length, dtype, seed):
    mx.random.seed(seed)
    return (mx.random.normal((batch, heads, n, 64)).astype(dtype),
            mx.random.normal((batch, kv_heads, length, 64)).astype(dtype),
            mx.random.normal((batch, kv_heads, length, 64)).astype(dtype))


@pytest.mark.parametrize("dtype,tol", [(mx.float32, 1e-5), (mx.bfloat16, 3e-2)])
@pytest.mark.parametrize("heads,kv_heads,n,length", [(8, 2, 5, 37), (4, 4, 16, 16), (6, 3, 1, 9), (9, 3, 64, 300)])
@pytest.mark.parametrize("way", ["composed", "host"])
def test_a_chunks_attention_equals_mlx_fused(dtype, tol, heads, kv_heads, n, length, way):
    q, k, v = _qkv(1, heads, kv_heads, n, length, dtype, n + length)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal" if n > 1 else None)
    got = (ca.composed_attention(q, k, v, 0.125) if way == "composed"
           else host.host_attention(q, k, v, 0.125, causal=True))
    _close(got, want, tol)


@pytest.mark.parametrize("n", [1, 3])
def test_the_hosts_attention_hides_what_a_batchs_mask_hides(n):
    # Rows of a decode batch at different lengths (one query each), or bringing n tokens (drafts):
    # each query sees the positions up to its own.
    rows, length = 4, 50
    q, k, v = _qkv(rows, 9, 3, n, length, mx.float32, n)
    seen = np.array([10, 49, 23, 37])[:, None] - np.arange(n)[::-1][None]  # (rows, n)
    visible = (np.arange(length)[None, None] <= seen[:, :, None])[:, None]  # (rows, 1, n, L)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mx.array(visible))
    _close(host.host_attention(q, k, v, 0.125, hidden=~visible), want, 1e-5)


@pytest.mark.parametrize("dtype,tol", [(mx.float32, 1e-5), (mx.bfloat16, 3e-2)])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_a_batchs_rows_bringing_several_tokens_attend_composed_as_mlx_fused(dtype, tol, n):
    # Drafts or forced tokens: each row's queries see the positions up to their own, rows at different lengths.
    rows, length = 4, 60
    q, k, v = _qkv(rows, 8, 2, n, length, dtype, 7 * n)
    seen = np.array([10, 59, 23, 41])[:, None] - np.arange(n)[::-1][None]
    visible = mx.array((np.arange(length)[None, None] <= seen[:, :, None])[:, None])
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=visible)
    _close(ca.composed_attention(q, k, v, 0.125, visible), want, tol)


def test_on_cuda_a_batch_with_several_tokens_a_row_composes_its_attention(monkeypatch):
    from locals.engine.forward.batch_plan import BatchPlan

    calls = []
    monkeypatch.setattr(host, "SOFTMAX_ON_HOST", False)
    monkeypatch.setattr(ca, "composed_attention", lambda q, k, v, s, visible: calls.append(visible.shape) or q)
    plan = BatchPlan.__new__(BatchPlan)
    plan.width, plan._mask = 3, mx.ones((2, 1, 3, 40), mx.bool_)
    q, k = mx.zeros((2, 4, 3, 32)), mx.zeros((2, 2, 40, 32))
    for on_cuda, limit in ((False, ca.COMPOSED_MAX_SCORES), (True, ca.COMPOSED_MAX_SCORES), (True, 2 * 3 * 40 - 1)):
        monkeypatch.setattr(ca, "ON_CUDA", on_cuda)
        monkeypatch.setattr(ca, "COMPOSED_MAX_SCORES", limit)
        assert plan._attention(q, k, k, 1.0).shape == q.shape
    assert calls == [(2, 1, 3, 40)]  # only on CUDA and within the scores' limit; else MLX's fused attention


@pytest.mark.parametrize("dtype,tol", [(mx.float32, 1e-5), (mx.bfloat16, 3e-2)])
@pytest.mark.parametrize("n,length", [(33, 33), (100, 700), (200, 1024), (256, 1500)])
def test_a_bucketed_chunk_equals_mlx_causal_attention_over_its_prefix(dtype, tol, n, length):
    # The buffers hold the prefix and then garbage (a longer prompt's, rejected drafts): masked.
    positions = -(-length // ca.ROOM_STEP) * ca.ROOM_STEP
    q, k, v = _qkv(1, 8, 2, n, positions, dtype, n)
    k, v = (mx.where(mx.arange(positions)[:, None] < length, a, mx.array(1e4, dtype)) for a in (k, v))
    want = mx.fast.scaled_dot_product_attention(q, k[:, :, :length], v[:, :, :length], scale=0.125, mask="causal")
    got = ca.bucketed_attention(q, k, v, length, 0.125)
    _close(got, want, tol)
    assert ca.query_bucket(n) in (64, 128, 256) and ca.query_bucket(n) >= n


def test_cuda_chunks_go_bucketed_composed_or_fused_by_their_size(monkeypatch):
    calls = []
    monkeypatch.setattr(host, "SOFTMAX_ON_HOST", False)
    monkeypatch.setattr(ca, "composed_attention", lambda *a: calls.append(("composed", a[0].shape[2])) or a[0])
    monkeypatch.setattr(ca, "bucketed_attention", lambda *a: calls.append(("bucketed", a[0].shape[2])) or a[0])
    q, k = mx.zeros((1, 4, 8, 32)), mx.zeros((1, 2, 100, 32))
    buffers = (mx.zeros((1, 2, ca.ROOM_STEP, 32)),) * 2
    monkeypatch.setattr(ca, "ON_CUDA", False)
    ca.chunk_attention(q, k, k, 1.0)
    ca.chunk_attention(mx.zeros((1, 4, 100, 32)), k, k, 1.0, buffers)
    assert calls == []  # not on CUDA: MLX's fused attention
    monkeypatch.setattr(ca, "ON_CUDA", True)
    ca.chunk_attention(q, k, k, 1.0)
    ca.chunk_attention(q[:, :, :1], k, k, 1.0)  # one query: MLX's vector kernel
    ca.chunk_attention(mx.zeros((1, 4, 100, 32)), k, k, 1.0, buffers)  # a bucketed cache: cuDNN at a bucket
    ca.chunk_attention(mx.zeros((1, 4, 100, 32)), k, k, 1.0, (k, k))  # a cache of another size: composed
    ca.chunk_attention(q, k, k, 1.0, buffers)  # few queries: composed
    monkeypatch.setattr(ca, "COMPOSED_MAX_SCORES", 8 * 100 - 1)
    ca.chunk_attention(q, k, k, 1.0)  # scores past the limit: fused
    ca.chunk_attention(mx.zeros((1, 4, 300, 32)), k, k, 1.0, buffers)  # a prompt read alone: fused
    assert calls == [("composed", 8), ("bucketed", 100), ("composed", 100), ("composed", 8)]


def test_cpu_chunks_normalize_on_the_host_and_leave_their_inputs_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(host, "host_attention", lambda *a, **kw: calls.append((a[0].shape[2], kw)) or a[0])
    q, k = mx.zeros((1, 4, 8, 32)), mx.zeros((1, 2, 100, 32))
    monkeypatch.setattr(host, "SOFTMAX_ON_HOST", True)
    ca.chunk_attention(q, k, k, 1.0)
    ca.chunk_attention(q[:, :, :1], k, k, 1.0)  # one query: MLX's vector kernel
    assert calls == [(8, {"causal": True})]
    monkeypatch.undo()
    q, k, v = _qkv(1, 4, 2, 8, 20, mx.float32, 3)
    before = [np.array(a) for a in (q, k, v)]
    host.host_attention(q, k, v, 0.5, causal=True)  # rewrites its own scores in place, nothing else
    for a, b in zip((q, k, v), before):
        np.testing.assert_array_equal(np.array(a), b)


def test_the_warm_up_builds_every_bucket_up_to_a_chunks_at_every_buffer_size(monkeypatch):
    seen = []
    real = ca.bucketed_attention
    monkeypatch.setattr(ca, "bucketed_attention",
                        lambda q, k, v, *a: seen.append((q.shape[2], k.shape[2])) or real(q, k, v, *a))
    ca.prebuild(4, 2, 32, mx.float32, 248, 2 * ca.ROOM_STEP)
    assert seen == [(width, size) for width in (64, 128, 256) for size in (ca.ROOM_STEP, 2 * ca.ROOM_STEP)]
    ca.prebuild(4, 2, 32, mx.float32, 2048, 2 * ca.ROOM_STEP)  # a prompt read alone: not bucketed
    assert len(seen) == 6
