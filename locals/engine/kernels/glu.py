"""SwiGLU folded into a tensor-core kernel (qmm_mma.py), checked on this device before the
engine uses it: after the MLP's joined gate/up matmul (template GATED: the kernel writes
silu(gate) * up, the default) or, opt-in, before the down projection (template GLU: it
takes the joined gate/up output as it loads x).

A B = 8 decode step on the H200 is host work, about 10 us per kernel queued
(docs/benchmarks.md, the seventh set of runs); the activation between the joined gate/up
matmul and down_proj is one of a layer's kernels. The registry folds it for the row
counts whose kernel passed its check on the layer's own shape here; other row counts, and
every other backend, keep MLX's activation and the plain matmuls.
"""

from __future__ import annotations

import mlx.core as mx

from locals.engine.kernels.reference import dequantized_matmul, random_problem, random_rows
from locals.engine.kernels.tuning.verify import matches, passing_rows

_VERDICTS: dict[tuple, str] = {}  # (form, kernel name, rows, n, k, bits, group, dtype) -> "" or why not


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


def gated_reference(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int,
                    bits: int) -> mx.array:
    """The float32 truth on the CPU of the gated form: [gate | up] = x @ dequantize(w).T, then silu(gate) * up."""
    cpu = mx.cpu
    gate, up = mx.split(dequantized_matmul(x, w, scales, biases, group_size, bits), 2, axis=-1, stream=cpu)
    return mx.multiply(mx.multiply(gate, mx.sigmoid(gate, stream=cpu), stream=cpu), up, stream=cpu)


def check_gated(kernel, rows: int, n: int, k: int, bits: int, group_size: int, dtype) -> str:
    """"" when `kernel(x, …, gated=True)` matches the truth for an (n, k) [gate | up] weight on
    fresh random data, otherwise why not."""
    x, w, scales, biases = random_problem(rows, n, k, bits, group_size, dtype)
    truth = gated_reference(x, w, scales, biases, group_size, bits)
    return matches(lambda: kernel(x, w, scales, biases, group_size, bits, gated=True), truth, dtype)


def verified(kernel, rows: int, n: int, k: int, bits: int, group_size: int, dtype, gated: bool = False) -> str:
    """`check` (or `check_gated`) once per process for each (kernel, rows, shape, quantization, dtype)."""
    key = ("gated" if gated else "glu", kernel.name, rows, n, k, bits, group_size, str(dtype))
    if key not in _VERDICTS:
        _VERDICTS[key] = (check_gated if gated else check)(kernel, rows, n, k, bits, group_size, dtype)
    return _VERDICTS[key]


def foldable_rows(routes: dict[int, object], n: int, k: int, bits: int, group_size: int, dtype) -> set[int]:
    """The row counts of `routes` (rows -> kernel) whose kernel takes a joined gate/up input and passed."""
    return passing_rows(routes, lambda kernel: getattr(kernel, "takes_glu", False),
                        lambda kernel, rows: verified(kernel, rows, n, k, bits, group_size, dtype))


def gated_rows(routes: dict[int, object], n: int, k: int, bits: int, group_size: int, dtype) -> set[int]:
    """The row counts of `routes` whose kernel writes silu(gate) * up for a joined weight and passed."""
    if n % 2:
        return set()
    return passing_rows(routes, lambda kernel: getattr(kernel, "takes_gated", False),
                        lambda kernel, rows: verified(kernel, rows, n, k, bits, group_size, dtype, gated=True))
