"""Whole decode steps as one compiled graph: the same logits as compiled seams around eager
attention whatever the rows' order and slots, one graph per batch shape, a bounded number kept."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from locals.engine.forward import compiled as compiled_mod
from locals.engine.forward.choices import ForwardChoices
from locals.engine.forward.compiled import CompiledBlocks
from locals.engine.forward.forward import RowInput, forward, step_rows
from locals.engine.forward.fuse import fuse_projections
from locals.engine.kernels import registry
from locals.engine.kernels.headprep import cache_verified, spec_of
from locals.engine.forward.kv import DecodeBatch, RowKV
from tests.helpers.kernel_models import OpsAttention, OpsHeadPrep, as_on_a_gpu, tiny_qwen3


def _batch(model, lengths=(5, 9, 14)) -> list[RowKV]:
    """Rows that read prompts of `lengths` tokens and joined a decode batch."""
    batch = DecodeBatch(len(model.model.layers))
    kv = [RowKV(len(model.model.layers), batch) for _ in lengths]
    prompts = [[(7 * i + 3 * j) % 250 + 1 for j in range(n)] for i, n in enumerate(lengths)]
    forward(model, [RowInput(mx.array(p, dtype=mx.int32), len(p), c, False) for p, c in zip(prompts, kv)])
    forward(model, [RowInput(mx.array([1 + i], dtype=mx.int32), 1, c, True) for i, c in enumerate(kv)])
    assert all(c.resident for c in kv)
    return kv


def _steps(model, picks: list[list[int]], whole: bool, lengths=(5, 9, 14),
           caches: list | None = None) -> tuple[list[np.ndarray], list[int]]:
    """Decode steps over the rows `picks` names, in that order: each step's logits, then the rows'
    lengths; the decode batch's K/V arrays afterwards go to `caches` when given."""
    kv, compiled, out = _batch(model, lengths), CompiledBlocks(), []
    for step, pick in enumerate(picks):
        rows = [RowInput(mx.array([20 + step + i], dtype=mx.int32), 1, kv[i], True) for i in pick]
        choices = as_on_a_gpu(whole_steps=whole)
        out.append(np.array(forward(model, rows, compiled, choices).astype(mx.float32)))
    if caches is not None:
        caches.extend(np.array(a) for a in kv[0].batch.kv)
    return out, [c.length for c in kv]


@pytest.mark.parametrize("picks", [[[0, 1, 2]] * 3, [[2, 0, 1], [1, 2, 0]], [[0, 2], [2, 0], [1]]],
                         ids=["in-slot-order", "rows-reordered", "some-members-wait"])
@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "4bit"])
def test_whole_steps_compute_what_seams_compute(picks, quantized):
    model = tiny_qwen3(quantized, head_dim=32)
    seams, seam_lengths = _steps(model, picks, whole=False)
    whole, whole_lengths = _steps(model, picks, whole=True)
    assert whole_lengths == seam_lengths
    for a, b in zip(whole, seams):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4)


class WritesInto(OpsHeadPrep):
    """The fused q/k kernel's contracts by MLX's ops, noting each write into the cache."""

    def into_cache(self, *args):
        self.writes.append(args[-1].shape)
        return super().into_cache(*args)


@pytest.mark.parametrize("picks", [[[0, 1, 2]] * 3, [[2, 0, 1], [1, 2, 0]], [[0, 2], [2, 0], [1]]],
                         ids=["in-slot-order", "rows-reordered", "some-members-wait"])
@pytest.mark.parametrize("joined", [True, False], ids=["joined", "parts"])
def test_whole_steps_write_keys_through_the_head_kernel_where_the_scatter_writes_them(picks, joined):
    # The fused q/k kernel's write into the shared cache (its contract, by MLX's ops) leaves the
    # decode batch's K/V exactly as the scatter of seams does, and the logits follow.
    model = tiny_qwen3(False, head_dim=64)
    if joined:
        fuse_projections(model)
    expected_caches, caches = [], []
    seams, _ = _steps(model, picks, whole=False, caches=expected_caches)
    writes = _attach_writing_head_kernel(model)
    for layer in model.model.layers:  # the step's reader of the cache takes q: the kernel's contract
        layer.self_attn.decode_attention = OpsAttention("cpu", 4, 2, 64, mx.float32)
    whole, _ = _steps(model, picks, whole=True, caches=caches)
    # Traced once per batch shape, each layer writing every row's slot (meta: slots, then lengths).
    # Three rows fill the batch's four slots (step_rows); two of the three members cannot (one
    # slot is free) and run as two; one row runs alone.
    in_step = {3: 4, 2: 2, 1: 1}
    assert step_rows(3, 4) == 4 and step_rows(1, 4) == 1
    assert sorted(set(writes)) == sorted({(2 * in_step[len(p)],) for p in picks})
    assert len(writes) == len(model.model.layers) * len({len(p) for p in picks})
    for a, b in zip(whole, seams):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4)
    members, rows_cap = 3, caches[0].shape[0] // 2  # the padding rows' slots hold nothing of anyone's
    for a, b in zip(caches, expected_caches):
        for part in (slice(0, members), slice(rows_cap, rows_cap + members)):
            np.testing.assert_allclose(a[part], b[part], rtol=1e-5, atol=1e-5)


def _attach_writing_head_kernel(model) -> list:
    """WritesInto on every layer, verified as attach() verifies it; returns the list of its writes."""
    writes = []
    for layer in model.model.layers:
        prep = layer.self_attn.head_prep = WritesInto("cpu", spec_of(layer.self_attn), mx.float32)
        object.__setattr__(prep, "writes", [])
        assert cache_verified(prep) == "" and prep.writes_cache()
        object.__setattr__(prep, "writes", writes)
    return writes


def test_whole_steps_attending_by_mlx_ops_keep_the_scatter():
    # MLX's attention gathers the rows' keys apart from q, so nothing would order that read after
    # a write MLX cannot see: without the decode attention kernel the head kernel writes no cache.
    model = tiny_qwen3(False, head_dim=64)
    picks = [[0, 2], [2, 0], [1]]
    expected_caches, caches = [], []
    seams, _ = _steps(model, picks, whole=False, caches=expected_caches)
    writes = _attach_writing_head_kernel(model)
    whole, _ = _steps(model, picks, whole=True, caches=caches)
    assert writes == []
    for a, b in zip(whole + caches, seams + expected_caches):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4)


def test_a_pass_that_is_not_a_pure_decode_step_runs_as_seams(monkeypatch):
    # A row with two tokens (a forced pair) or one not sampled: never the whole-step graph.
    model = tiny_qwen3(False, head_dim=32)
    kv, compiled = _batch(model), CompiledBlocks()
    monkeypatch.setattr(compiled_mod, "compile_step", lambda *a: pytest.fail("whole step compiled"))
    forward(model, [RowInput(mx.array([3, 4], dtype=mx.int32), 2, kv[0], True, logits=2),
                    RowInput(mx.array([5], dtype=mx.int32), 1, kv[1], True)], compiled)
    forward(model, [RowInput(mx.array([6], dtype=mx.int32), 1, kv[0], False),
                    RowInput(mx.array([7], dtype=mx.int32), 1, kv[1], True)], compiled)
    assert [c.length for c in kv[:2]] == [5 + 1 + 3, 9 + 1 + 2]


def test_one_graph_per_batch_shape_the_most_recent_kept(monkeypatch):
    model = tiny_qwen3(False, head_dim=32)
    monkeypatch.setattr(compiled_mod, "STEP_GRAPHS", 2)
    blocks = CompiledBlocks()
    choices = ForwardChoices()

    def step(attention, shape, with_choices=choices):
        return blocks.step(model, attention, shape, with_choices)

    first = step(("mask", True), (3, 4, 256))
    assert step(("mask", True), (3, 4, 256)) is first
    second = step(("mask", True), (2, 4, 256))
    assert second is not first
    assert step(("mask", True), (3, 4, 256)) is first  # now the most recent
    step(("mask", False), (3, 4, 256))  # a third: the least recent (second) goes
    assert step(("mask", True), (3, 4, 256)) is first
    latest = step(("mask", True), (2, 4, 256))
    assert latest is not second
    # Other forward choices trace a graph of their own; an equal value finds the same one.
    assert step(("mask", True), (2, 4, 256), ForwardChoices()) is latest
    assert step(("mask", True), (2, 4, 256), ForwardChoices(gated=False)) is not latest
    # Modules swapped since: graphs tracing the old ones are dropped, not kept for reuse.
    registry.modules_swapped()
    assert step(("mask", True), (3, 4, 256)) is not first
    assert len(blocks._steps) == 1


def test_seam_passes_pad_to_powers_of_two_then_to_steps_of_64():
    assert [compiled_mod.padded_length(n) for n in (1, 3, 5, 33, 64, 65, 200, 256, 257)] == \
        [1, 4, 8, 64, 64, 128, 256, 256, 320]
    assert compiled_mod.seam_lengths(64) == [1, 2, 4, 8, 16, 32, 64]
    assert compiled_mod.seam_lengths(320) == [1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 320]


@pytest.mark.parametrize("chunk", [70, 190], ids=["pads-to-128", "pads-to-256"])
def test_a_prompt_chunk_beside_decoding_rows_through_seams_matches_eager(monkeypatch, chunk):
    # Past 64 tokens a pass pads to a multiple of 64; the chunk's own caches and the batch's rows
    # read what the eager pass reads, and the throwaway row changes nothing of theirs.
    model = tiny_qwen3(True, head_dim=32)
    traced = []
    seams = CompiledBlocks.seams
    monkeypatch.setattr(CompiledBlocks, "seams", lambda self, layers, choices, n: traced.append(n) or
                        seams(self, layers, choices, n))

    def mixed(compiled):
        kv, prompt = _batch(model), RowKV(len(model.model.layers))
        forward(model, [RowInput(mx.arange(1, 11, dtype=mx.int32), 10, prompt, False)])
        rows = [RowInput(mx.array([30 + i], dtype=mx.int32), 1, c, True) for i, c in enumerate(kv)]
        rows.append(RowInput((mx.arange(chunk, dtype=mx.int32) * 7) % 250 + 1, chunk, prompt, True))
        logits = forward(model, rows, compiled, ForwardChoices(compile_max_tokens=320))
        after = forward(model, [RowInput(mx.array([5], dtype=mx.int32), 1, prompt, True)])
        return np.array(logits.astype(mx.float32)), np.array(after.astype(mx.float32)), prompt.offset

    eager, compiled = mixed(None), mixed(CompiledBlocks())
    assert traced == [compiled_mod.padded_length(3 + chunk)]
    assert compiled[2] == eager[2] == 10 + chunk + 1
    for a, b in zip(compiled[:2], eager[:2]):
        np.testing.assert_allclose(a, b, atol=2e-3, rtol=2e-3)


def test_a_whole_step_with_placeholder_rows_makes_only_its_own_index_and_the_heads_part_once():
    # On CUDA an array made from the host can cost ~1 ms while the device runs (host_arrays.py):
    # a padded step makes its own index and meta, not the plan's too, and every pass of as many
    # tokens shares one heads index.
    from locals.engine.forward.batch_plan import BatchPlan

    model = tiny_qwen3(False)
    kv = _batch(model)  # 3 rows: a whole step runs them in 4 slots, one a placeholder
    plan = BatchPlan([RowInput(mx.array([1]), 1, c, True) for c in kv])
    positions, index, meta = plan.padded_step(4)
    assert plan._index is None and plan._meta is None
    assert index[0].shape == index[1].shape == index[2].shape == (8, model.args.num_key_value_heads, 1)
    np.testing.assert_array_equal(np.array(positions), [c.length for c in kv] + [0])
    again = BatchPlan([RowInput(mx.array([1]), 1, c, True) for c in kv]).padded_step(4)[1]
    assert again[1] is index[1] and plan.index[1] is not index[1]  # 4 rows' heads part, then 3 rows'
    np.testing.assert_array_equal(np.array(index[1])[:, :, 0], np.tile(np.arange(index[1].shape[1]), (8, 1)))
