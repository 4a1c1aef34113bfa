"""The shared decode batch's storage (forward/kv.py): rows joining, leaving and growing it keep
their K/V, and its writes stay in place (no copy of a layer's whole array)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from locals.engine.engine import Engine
from locals.engine.forward import kv
from locals.engine.forward.kv import DecodeBatch, RowKV
from locals.engine.settings import EngineConfig


def _join_rows(batch: DecodeBatch, lengths: list[int]) -> tuple[list[RowKV], list, list[int]]:
    """Rows of 2 layers with random K/V of these lengths joined to `batch` in turn, and their
    snapshots from before they joined; `batch.rows_cap` after each join, in the last item."""
    rows, kept, caps = [], [], []
    for n in lengths:
        row = RowKV(2, batch)
        for cache in row.layers:
            cache.update_and_fetch(mx.random.normal((1, 2, n, 8)), mx.random.normal((1, 2, n, 8)))
        kept.append(row.snapshot())
        batch.join(row)
        rows.append(row)
        caps.append(batch.rows_cap)
    return rows, kept, caps


def _same_kv(row, snap) -> bool:
    return all(mx.array_equal(a, b) for pair, again in zip(snap, row.snapshot()) for a, b in zip(pair, again))


def test_decode_batch_keeps_every_row_through_growing_and_shrinking():
    mx.random.seed(9)
    batch = DecodeBatch(2)
    rows, kept, _ = _join_rows(batch, [5 + i for i in range(6)])  # the sixth row doubles the slots (4 -> 8)
    assert batch.rows_cap == 8 and batch.kv[0].shape == (16, 2, 256, 8)
    assert all(_same_kv(r, s) for r, s in zip(rows, kept))
    batch.reserve(6, 300)  # positions grow to the next capacity (kv.token_capacity)
    assert batch.t_cap == 384 and all(_same_kv(r, s) for r, s in zip(rows, kept))
    for row in rows[:4]:  # two members left of eight slots: the rows shrink (positions only below half)
        row.release()
    assert (batch.rows_cap, batch.t_cap) == (4, 384)
    assert [r.slot for r in rows[4:]] == [1, 0] and all(_same_kv(r, s) for r, s in zip(rows[4:], kept[4:]))


@pytest.mark.parametrize("settled", [True, False])
def test_a_row_leaving_moves_the_last_one_without_copying_the_batch(settled, monkeypatch):
    """The last member moves into the freed slot in place: MLX's memory grows by the moved row's
    K/V, not by a copy of a layer's whole array (which a write from a slice of itself made). Its
    copy queued (as on a GPU) moves the same K/V; on the CPU it is settled first (kv.settle)."""
    monkeypatch.setattr(kv, "SETTLE_COPIES", settled)
    mx.random.seed(4)
    batch = DecodeBatch(2, least_slots=1)
    rows, kept, _ = _join_rows(batch, [1500, 1400, 1300, 1200])
    mx.eval(batch.kv)
    layer_bytes = batch.kv[0].nbytes
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    rows[1].release()
    mx.eval(batch.kv)
    assert (batch.rows_cap, batch.t_cap) == (4, 1536)  # nothing shrank: the arrays were written, not remade
    assert mx.get_peak_memory() - before < layer_bytes / 2 or not settled
    assert rows[3].slot == 1 and all(_same_kv(r, s) for r, s in zip([rows[0], rows[2], rows[3]], [kept[0], kept[2], kept[3]]))


def test_a_members_snapshot_leaves_the_next_kv_write_in_place(monkeypatch):
    """A finishing row's snapshot for the prefix cache, then the next step's K/V write into the
    batch: the write takes no copy of a layer's array (on the CPU a snapshot left queued made it
    take one; settled, as there, it takes none)."""
    monkeypatch.setattr(kv, "SETTLE_COPIES", True)
    mx.random.seed(5)
    batch = DecodeBatch(2, least_slots=1)
    rows = []
    for n in (1500, 1400, 1300, 1200):
        row = RowKV(2, batch)
        for cache in row.layers:
            cache.update_and_fetch(mx.random.normal((1, 4, n, 16)), mx.random.normal((1, 4, n, 16)))
        batch.join(row)
        rows.append(row)
    mx.eval(batch.kv)
    layer_bytes = batch.kv[0].nbytes
    snap = rows[1].snapshot()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    index = tuple(mx.array(np.asarray(i, np.int32)) for i in ([[[0]], [[4]]], [[[0], [1], [2], [3]]], [[[1500]], [[1500]]]))
    for li in range(2):
        batch.write(li, index, mx.ones((2, 4, 1, 16)))
    mx.eval(batch.kv)
    assert mx.get_peak_memory() - before < layer_bytes / 4
    assert snap[0][0].shape == (1, 4, 1400, 16) and mx.array_equal(batch.kv[1][4, :, 1500], mx.ones((4, 16)))


def test_where_nothing_compiles_a_batch_holds_as_many_slots_as_rows(tiny_llama):
    """The CPU's batch: one row in one slot (a batch of four cost a row's second token ~95 ms
    to allocate there), doubling as rows join and halving once a quarter is used, no K/V lost."""
    mx.random.seed(3)
    batch = DecodeBatch(2, least_slots=1)
    rows, kept, caps = _join_rows(batch, [7, 8, 9])
    assert caps == [1, 2, 4]
    rows[0].release()
    rows[1].release()
    assert batch.rows_cap == 2 and rows[2].slot == 0 and _same_kv(rows[2], kept[2])
    engine = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0))
    assert engine.decode_batch.least_slots == (4 if engine.config.forward.compile_max_tokens else 1)
