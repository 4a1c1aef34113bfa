"""Decode attention over each row's own length: the reference against plain attention per row,
the verifier that gates the kernel, and the decode batch's use of its contract.

The CUDA and Metal kernels run only on their devices (tests/kernels/test_kernels_cuda.py); here a
candidate built from MLX's ops stands in, honouring the same contract."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from locals.engine.forward.forward import CompiledBlocks, RowInput, forward
from locals.engine.kernels import decode_attention as da
from locals.engine.kernels.decode_attention import check, reference, splits_for, verified
from locals.engine.forward.kv import DecodeBatch, RowKV

from tests.helpers.kernel_models import OpsAttention, as_on_a_gpu, tiny_qwen3


def _per_row(q, cache, slots, lengths, scale) -> np.ndarray:
    """Plain softmax attention in numpy, one row and head at a time."""
    q, cache = np.array(q.astype(mx.float32)), np.array(cache.astype(mx.float32))
    rows_cap, group = cache.shape[0] // 2, q.shape[1] // cache.shape[1]
    out = np.zeros_like(q)
    for r, (slot, n) in enumerate(zip(slots, lengths)):
        for h in range(q.shape[1]):
            keys, values = cache[slot, h // group, :n], cache[rows_cap + slot, h // group, :n]
            scores = keys @ q[r, h, 0] * scale
            weights = np.exp(scores - scores.max())
            out[r, h, 0] = weights @ values / weights.sum()
    return out


def test_reference_is_each_rows_attention_over_its_own_keys():
    mx.random.seed(1)
    q = mx.random.normal((3, 6, 1, 32))
    cache = mx.random.normal((2 * 5, 2, 40, 32))  # 5 slots, 2 key/value heads, 40 positions
    slots, lengths = [4, 0, 2], [40, 1, 17]
    meta = mx.array(slots + lengths, dtype=mx.int32)
    got = np.array(reference(q, cache, meta, 0.2))
    np.testing.assert_allclose(got, _per_row(q, cache, slots, lengths, 0.2), rtol=1e-4, atol=1e-5)


def test_verifier_passes_the_contract_and_rejects_wrong_kernels():
    for dtype in (mx.float16, mx.bfloat16, mx.float32):
        assert verified(OpsAttention("cpu", 6, 2, 64, dtype)) == ""

    class AllPositions(OpsAttention):  # reads the padding past each row's length
        def __call__(self, q, cache, meta, longest, scale):
            full = mx.concatenate([meta[: q.shape[0]], mx.full((q.shape[0],), cache.shape[2], mx.int32)])
            return reference(q, cache, full, scale).reshape(q.shape[0], -1)

    class SlotOrder(OpsAttention):  # row i read from slot i, not from its own slot
        def __call__(self, q, cache, meta, longest, scale):
            rows = q.shape[0]
            own = mx.concatenate([mx.arange(rows, dtype=mx.int32), meta[rows:]])
            return reference(q, cache, own, scale).reshape(rows, -1)

    class Raises(OpsAttention):
        def __call__(self, *args):
            raise RuntimeError("launch failed")

    class FourD(OpsAttention):
        def __call__(self, q, cache, meta, longest, scale):
            return reference(q, cache, meta, scale)

    class NaN(OpsAttention):
        def __call__(self, *args):
            return super().__call__(*args) * float("nan")

    assert check(AllPositions("cpu", 6, 2, 64, mx.float32), 3, 200).startswith("error ")
    assert check(SlotOrder("cpu", 6, 2, 64, mx.float32), 3, 200).startswith("error ")
    assert check(Raises("cpu", 6, 2, 64, mx.float32), 1, 40) == "raised RuntimeError: launch failed"
    assert check(NaN("cpu", 6, 2, 64, mx.float16), 1, 40) == "non-finite output"
    # The output is (rows, heads * dim), the layout o_proj reads: (rows, heads, 1, dim) is rejected.
    assert check(FourD("cpu", 6, 2, 64, mx.float32), 3, 200).startswith("shape/dtype (3, 6, 1, 64)")


def test_splits_cover_the_longest_row_in_256_key_parts():
    assert [splits_for(n) for n in (1, 256, 257, 12_288)] == [1, 1, 2, 48]


def _decode(model, steps: int = 3, lengths=(5, 9, 14), whole: bool = False,
            attention_kernel: bool = True) -> list[np.ndarray]:
    """Three rows with prompts of `lengths` tokens, then `steps` decode steps in a decode batch,
    each a compiled whole step (`whole`) or compiled seams around eager attention; without
    `attention_kernel`, MLX's attention where the kernel is attached (the benchmarks' baseline)."""
    choices = as_on_a_gpu(whole_steps=whole, decode_attention=attention_kernel)
    batch = DecodeBatch(len(model.model.layers))
    kv = [RowKV(len(model.model.layers), batch) for _ in range(3)]
    prompts = [[(7 * i + 3 * j) % 250 + 1 for j in range(n)] for i, n in enumerate(lengths)]
    forward(model, [RowInput(mx.array(p, dtype=mx.int32), len(p), c, False) for p, c in zip(prompts, kv)])
    out, compiled = [], CompiledBlocks()
    for step in range(steps):
        rows = [RowInput(mx.array([11 + step + i], dtype=mx.int32), 1, c, True) for i, c in enumerate(kv)]
        out.append(np.array(forward(model, rows, compiled, choices).astype(mx.float32)))
    assert [c.length for c in kv] == [n + steps for n in lengths] and all(c.resident for c in kv)
    return out


def _recording(monkeypatch, model, dtype=mx.float32) -> list:
    """Give every layer an `OpsAttention` kernel; each call appends (meta or None when traced, longest)."""
    calls = []
    for layer in model.model.layers:
        layer.self_attn.decode_attention = OpsAttention("cpu", 4, 2, 32, dtype)
    real = OpsAttention.__call__

    def recording(self, q, cache, meta, longest, scale):
        traced = isinstance(q, mx.array) and _tracing(q)
        calls.append((None if traced else np.array(meta), longest))
        return real(self, q, cache, meta, longest, scale)

    monkeypatch.setattr(OpsAttention, "__call__", recording)
    return calls


def _tracing(a: mx.array) -> bool:
    try:
        np.array(a)
        return False
    except ValueError:  # MLX refuses to evaluate while compiling
        return True


def test_decode_steps_through_the_contract_compute_what_masked_attention_computes(monkeypatch):
    model = tiny_qwen3(False, head_dim=32)
    before = _decode(model)
    calls = _recording(monkeypatch, model)
    after = _decode(model)
    for a, b in zip(after, before):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # Once a layer a step, with each row's slot and its length after the step's write.
    assert len(calls) == 3 * len(model.model.layers)
    slots_lengths = {(tuple(m[:3]), tuple(m[3:]), n) for m, n in calls}
    assert slots_lengths == {((0, 1, 2), (6 + s, 10 + s, 15 + s), 15 + s) for s in range(3)}
    # Not chosen (benchmarks' baseline), and for queries not of its dtype, MLX's attention runs.
    calls.clear()
    np.testing.assert_allclose(_decode(model, 1, attention_kernel=False)[0], before[0], rtol=1e-5, atol=1e-5)
    for layer in model.model.layers:
        layer.self_attn.decode_attention = OpsAttention("cpu", 4, 2, 32, mx.float16)
    _decode(model, 1)
    assert calls == []
    # Rows all at one length need no mask: MLX's own kernel runs.
    for layer in model.model.layers:
        layer.self_attn.decode_attention = OpsAttention("cpu", 4, 2, 32, mx.float32)
    _decode(model, 1, lengths=(6, 6, 6))
    assert calls == []


@pytest.mark.parametrize("lengths", [(5, 9, 14), (6, 6, 6)])
def test_whole_decode_steps_attend_through_the_kernel_traced_once(monkeypatch, lengths):
    model = tiny_qwen3(False, head_dim=32)
    before = _decode(model, lengths=lengths)
    whole_with_mask = _decode(model, lengths=lengths, whole=True)  # no kernel: MLX's attention, lengths masked
    calls = _recording(monkeypatch, model)
    whole_with_kernel = _decode(model, lengths=lengths, whole=True)
    for steps in (whole_with_mask, whole_with_kernel):
        for a, b in zip(steps, before):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # Three steps of one shape: traced once (a call a layer, inside the trace), then replayed;
    # the kernel is told the batch's capacity (256 positions), at equal lengths too.
    assert calls == [(None, 256)] * len(model.model.layers)
    calls.clear()
    without = _decode(model, 1, lengths=lengths, whole=True, attention_kernel=False)
    np.testing.assert_allclose(without[0], before[0], rtol=1e-5, atol=1e-5)
    assert calls == []


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_attach_never_gives_a_kernel_that_cannot_run(backend, caplog):
    model = tiny_qwen3(False, head_dim=32)
    if backend == "cuda" and hasattr(mx, "cuda") and mx.cuda.is_available():
        pytest.skip("the CUDA kernel runs on this machine (tests/kernels/test_kernels_cuda.py)")
    assert da.attach(model, backend, mx.float32) == 0
    assert all(getattr(layer.self_attn, "decode_attention", None) is None for layer in model.model.layers)
    if backend == "cuda":
        assert "decode attention kernel not used" in caplog.text
