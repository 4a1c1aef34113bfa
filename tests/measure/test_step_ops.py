"""benchmarks/step_ops.py's count of a queued graph's primitives, read from MLX's dot export."""

from __future__ import annotations


import mlx.core as mx

from benchmarks.step_ops import OpNames


def test_each_queued_graph_is_counted_by_primitive_name():
    names = OpNames()  # the step runner's on_queue hook
    x = mx.arange(6, dtype=mx.float32)
    names(mx.sin(x) * 2 + x)  # not counting yet: a warm-up run
    names.on = True
    names(mx.sin(x) * 2 + x)
    names(x.reshape(2, 3).sum(axis=0))
    first, second = names.steps
    assert first["Sin"] == 1 and first["Multiply"] + first["Add"] >= 1
    assert second["Reshape"] == 1 and "Sin" not in second
    assert names.median_step() == max(names.steps, key=lambda c: sum(c.values()))
