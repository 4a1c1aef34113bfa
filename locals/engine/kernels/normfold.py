"""The residual add and RMSNorm folded into the matmul before them: `d = x @ dequantize(w).T`,
`h = res + d` and `rms_norm(h) * nw` as one tensor-core kernel (qmm_mma.py, QMMA_ADD_NORM),
checked on this device before the engine uses it.

Each layer adds the attention output (o_proj's) to the residual stream and normalizes it
for the MLP, then adds the MLP output (down_proj's) and normalizes it for the next layer:
with the add + norm kernel (addnorm.py) that is two kernels a layer after two matmuls. A
small-batch decode step on the H200 is host work, paid per kernel queued, so the matmul's
last block to finish does the add and norm. Reading the norm's input in every block instead
(before the product) was measured first: the per-block work on x made the joined projections
several times slower (docs/benchmarks-log.md, "The residual add and norm inside o_proj and
down_proj").
"""

from __future__ import annotations

import mlx.core as mx

from locals.engine.kernels.jit import remembered
from locals.engine.kernels.reference import dequantized_matmul, random_problem, random_rows
from locals.engine.kernels.resident import device_array, float_constant
from locals.engine.kernels.tuning.verify import matches, passing_rows

DTYPES = (mx.float16, mx.bfloat16)
_VERDICTS: dict[tuple, str] = {}  # (kernel name, rows, n, k, bits, group, dtype, eps) -> "" or why not


def counter() -> mx.array:
    """A layer's own launch counter for the kernel: a uint32 zero (count[0]) in device memory
    (resident.py: its atomics crossed the bus from managed memory) that the kernel leaves at
    zero. Launches that share one must not overlap: there is one per layer a pass, and the
    engine evaluates each pass on its own (MLX runs them in order on one stream). Never read
    it on the host."""
    return device_array([0], mx.uint32)


def reference(x: mx.array, res: mx.array, nw: mx.array, eps: float, w: mx.array, scales: mx.array,
              biases: mx.array, group_size: int, bits: int) -> tuple[mx.array, mx.array]:
    """The float32 truth on the CPU: h = res + the dequantized matmul, and rms_norm(h) * nw."""
    cpu = mx.cpu
    h = mx.add(res.astype(mx.float32, stream=cpu), dequantized_matmul(x, w, scales, biases, group_size, bits),
               stream=cpu)
    return h, mx.fast.rms_norm(h, nw.astype(mx.float32, stream=cpu), eps, stream=cpu)


def check(kernel, rows: int, n: int, k: int, bits: int, group_size: int, dtype, eps: float) -> str:
    """"" when `kernel.add_norm` matches the truth on fresh random data of this shape, twice
    on one counter that it leaves at zero; otherwise why not."""
    _x, w, scales, biases = random_problem(1, n, k, bits, group_size, dtype)
    count = counter()
    for _launch in range(2):
        x = random_rows(rows, k, dtype)  # fresh data every run
        res = (4 * random_rows(rows, n, mx.float32)).astype(dtype)
        nw = (1 + random_rows(1, n, mx.float32)[0]).astype(dtype)
        truth = reference(x, res, nw, eps, w, scales, biases, group_size, bits)
        why = matches(lambda: kernel.add_norm(x, res, nw, float_constant(eps), count, w, scales, biases, group_size),
                      truth, dtype)
        if why:
            return why
    left = count[0].item()  # this check's own counter: reading it moves it to managed memory
    return "" if left == 0 else f"left its launch counter at {left}"


def verified(kernel, rows: int, n: int, k: int, bits: int, group_size: int, dtype, eps: float) -> str:
    """`check` once per process for each (kernel, rows, shape, quantization, dtype, eps)."""
    return remembered(_VERDICTS, "norm folded", (kernel.name, rows, n, k, bits, group_size, str(dtype), eps),
                      lambda: check(kernel, rows, n, k, bits, group_size, dtype, eps))


def foldable_rows(routes: dict[int, object], n: int, k: int, bits: int, group_size: int, dtype,
                  eps: float) -> set[int]:
    """The row counts of `routes` (rows -> kernel) whose kernel takes the add and norm and passed."""
    if dtype not in DTYPES or n % 8:
        return set()
    return passing_rows(routes, lambda kernel: getattr(kernel, "takes_norm", False),
                        lambda kernel, rows: verified(kernel, rows, n, k, bits, group_size, dtype, eps))
