"""SwiGLU folded into the MLP's joined gate/up matmul: a tensor-core kernel (qmm_mma.py, template
GATED) writes silu(gate) * up instead of [gate | up], checked on this device before the engine
uses it.

A small-batch decode step on the H200 is host work, paid per kernel queued, and the
activation between the joined gate/up matmul and down_proj is one of a layer's kernels
(docs/benchmarks-log.md, "SwiGLU inside the gate/up kernel"). The registry folds it for the row
counts whose kernel passed its check on the layer's own shape here; other row counts, and
every other backend, keep MLX's activation.
"""

from __future__ import annotations

import mlx.core as mx

from locals.engine.kernels.jit import remembered
from locals.engine.kernels.reference import dequantized_matmul, random_problem
from locals.engine.kernels.tuning.verify import matches, passing_rows

_VERDICTS: dict[tuple, str] = {}  # (kernel name, rows, n, k, bits, group, dtype) -> "" or why not


def gated_reference(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int,
                    bits: int) -> mx.array:
    """The float32 truth on the CPU: [gate | up] = x @ dequantize(w).T, then silu(gate) * up."""
    cpu = mx.cpu
    gate, up = mx.split(dequantized_matmul(x, w, scales, biases, group_size, bits), 2, axis=-1, stream=cpu)
    return mx.multiply(mx.multiply(gate, mx.sigmoid(gate, stream=cpu), stream=cpu), up, stream=cpu)


def check_gated(kernel, rows: int, n: int, k: int, bits: int, group_size: int, dtype) -> str:
    """"" when `kernel(x, …, gated=True)` matches the truth for an (n, k) [gate | up] weight on
    fresh random data, otherwise why not."""
    x, w, scales, biases = random_problem(rows, n, k, bits, group_size, dtype)
    truth = gated_reference(x, w, scales, biases, group_size, bits)
    return matches(lambda: kernel(x, w, scales, biases, group_size, bits, gated=True), truth, dtype)


def verified(kernel, rows: int, n: int, k: int, bits: int, group_size: int, dtype) -> str:
    """`check_gated` once per process for each (kernel, rows, shape, quantization, dtype)."""
    return remembered(_VERDICTS, "gated", (kernel.name, rows, n, k, bits, group_size, str(dtype)),
                      lambda: check_gated(kernel, rows, n, k, bits, group_size, dtype))


def gated_rows(routes: dict[int, object], n: int, k: int, bits: int, group_size: int, dtype) -> set[int]:
    """The row counts of `routes` (rows -> kernel) whose kernel writes silu(gate) * up for a joined
    weight and passed."""
    if n % 2:
        return set()
    return passing_rows(routes, lambda kernel: getattr(kernel, "takes_gated", False),
                        lambda kernel, rows: verified(kernel, rows, n, k, bits, group_size, dtype))
