"""SwiGLU folded into the down projection: `down(silu(gate) * up)` as one tensor-core kernel
that takes the MLP's joined gate/up output (qmm_mma.py, template GLU), checked on this
device before the engine uses it.

A B = 8 decode step on the H200 is host work, about 10 us per kernel queued
(docs/benchmarks.md, the seventh set of runs); the activation between the joined gate/up
matmul and down_proj is one of a layer's 10 kernels. The registry folds it for the row
counts whose kernel passed `check` on the layer's own shape here; other row counts, and
every other backend, keep MLX's activation and the plain matmul.
"""

from __future__ import annotations

import mlx.core as mx

from locals.engine.kernels.reference import dequantized_matmul, random_problem, random_rows
from locals.engine.kernels.verify import matches, passing_rows

_VERDICTS: dict[tuple, str] = {}  # (kernel name, rows, n, k, bits, group, dtype) -> "" or why not


def reference(gu: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int,
              bits: int) -> mx.array:
    """The float32 truth on the CPU: silu(gate) * up for gu = [gate | up], then the dequantized matmul."""
    cpu = mx.cpu
    gate, up = mx.split(gu.astype(mx.float32, stream=cpu), 2, axis=-1, stream=cpu)
    act = mx.multiply(mx.multiply(gate, mx.sigmoid(gate, stream=cpu), stream=cpu), up, stream=cpu)
    return dequantized_matmul(act, w, scales, biases, group_size, bits)


def check(kernel, rows: int, n: int, k: int, bits: int, group_size: int, dtype) -> str:
    """"" when `kernel(gu, …, glu=True)` matches the truth on fresh random data of this shape,
    otherwise why not."""
    _x, w, scales, biases = random_problem(1, n, k, bits, group_size, dtype)
    gu = (2 * random_rows(rows, 2 * k, mx.float32)).astype(dtype)  # fresh data every run
    truth = reference(gu, w, scales, biases, group_size, bits)
    return matches(lambda: kernel(gu, w, scales, biases, group_size, bits, glu=True), truth, dtype)


def verified(kernel, rows: int, n: int, k: int, bits: int, group_size: int, dtype) -> str:
    """`check` once per process for each (kernel, rows, shape, quantization, dtype)."""
    key = (kernel.name, rows, n, k, bits, group_size, str(dtype))
    if key not in _VERDICTS:
        _VERDICTS[key] = check(kernel, rows, n, k, bits, group_size, dtype)
    return _VERDICTS[key]


def foldable_rows(routes: dict[int, object], n: int, k: int, bits: int, group_size: int, dtype) -> set[int]:
    """The row counts of `routes` (rows -> kernel) whose kernel takes a joined gate/up input and passed."""
    return passing_rows(routes, lambda kernel: getattr(kernel, "takes_glu", False),
                        lambda kernel, rows: verified(kernel, rows, n, k, bits, group_size, dtype))
