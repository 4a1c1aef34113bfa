"""Plain-MLX versions of every kernel: what candidates are checked against and fall back to.

`quantized_matmul` is MLX's own op (the engine's default); `dequantized_matmul` expands
the weights and multiplies in float32, the ground truth the verifier measures errors by.
"""

from __future__ import annotations

import itertools
import os

import mlx.core as mx
import numpy as np


def quantized_matmul(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array,
                     group_size: int, bits: int) -> mx.array:
    """MLX's affine quantized matmul, `x @ dequantize(w).T`, in x's dtype."""
    return mx.quantized_matmul(x, w, scales=scales, biases=biases, transpose=True,
                               group_size=group_size, bits=bits)


def dequantized_matmul(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array,
                       group_size: int, bits: int) -> mx.array:
    """The same product in float32 from explicitly dequantized weights, on the CPU: MLX
    dequantizes, numpy multiplies.

    The CPU because GPU float32 matmuls may run in TF32 (~1e-3 relative error), which
    would make the yardstick less exact than the kernels it judges. numpy because its wheels
    bring OpenBLAS and MLX's Linux wheels a reference BLAS: a 4B model's gate/up at 32 rows took
    2.5 s against 0.6, the dequantize included, on two x86 cores (docs/tune.md).
    """
    cpu = mx.cpu
    dense = mx.dequantize(w, scales.astype(mx.float32, stream=cpu), biases.astype(mx.float32, stream=cpu),
                          group_size=group_size, bits=bits, stream=cpu)
    rows = x.astype(mx.float32, stream=cpu)
    mx.eval(dense, rows)
    return mx.array(np.asarray(rows) @ np.asarray(dense).T)


class DequantizedCandidate:
    """Dequantize the weights to x's dtype, then a dense matmul: a plain-MLX candidate that
    wins where MLX's quantized op is slow (its CPU backend; CUDA from ~256 rows, registry.WIDE_ROWS)
    and loses on GPUs at a decode step's few rows."""

    name = "mlx-dequant"
    launches = 2  # kernels a call queues (tuning weighs their host cost on CUDA)

    def supports(self, rows: int, bits: int, group_size: int, dtype, scales_dtype) -> bool:
        return True

    def __call__(self, x, w, scales, biases, group_size: int, bits: int) -> mx.array:
        dense = mx.dequantize(w, scales, biases, group_size=group_size, bits=bits).astype(x.dtype)
        return x @ dense.T


class DenseCopy:
    """One layer's weights dequantized once to the scales' dtype and kept: a dense matmul with
    nothing expanded per call. Each layer has its own (registry.route_wide_passes, where the
    copies fit); the arguments after x are the quantized weights' and go unread."""

    name = "dense-copy"
    launches = 1

    def __init__(self, w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int):
        self.weight = mx.dequantize(w, scales, biases, group_size=group_size, bits=bits).astype(scales.dtype)
        mx.eval(self.weight)  # one layer at a time: no model-sized peak of pending copies

    def __call__(self, x, w, scales, biases, group_size: int, bits: int) -> mx.array:
        return x @ self.weight.T


class PaddedCandidate:
    """MLX's own op with the rows zero-padded to `rows_to`: on CUDA, MLX 0.32's quantized
    matmul re-reads the weights per row below 8 rows but not at 8, so padding 2..7 rows
    up to 8 buys its tiled path for the price of a pad and a slice."""

    def __init__(self, rows_to: int = 8):
        self.rows_to = rows_to
        self.name = f"mlx-pad{rows_to}"
        self.launches = 3  # pad, matmul, slice

    def supports(self, rows: int, bits: int, group_size: int, dtype, scales_dtype) -> bool:
        return 1 < rows < self.rows_to

    def compiled_rows(self, rows: int) -> int:
        """Every row count it takes runs as `rows_to` rows."""
        return self.rows_to

    def __call__(self, x, w, scales, biases, group_size: int, bits: int) -> mx.array:
        *lead, k = x.shape
        flat = x.reshape(-1, k)
        rows = flat.shape[0]
        padded = mx.concatenate([flat, mx.zeros((self.rows_to - rows, k), dtype=x.dtype)])
        y = quantized_matmul(padded, w, scales, biases, group_size, bits)[:rows]
        return y.reshape(*lead, y.shape[-1])


def random_rows(rows: int, k: int, dtype) -> mx.array:
    """A fresh random activation x (rows, k)."""
    x = mx.random.normal((rows, k), key=mx.random.key(_fresh_seed())).astype(dtype)
    mx.eval(x)
    return x


def random_problem(rows: int, n: int, k: int, bits: int, group_size: int, dtype,
                   key: mx.array | None = None) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Fresh random (x, w, scales, biases) shaped like one linear layer of a quantized model."""
    kx, kw = mx.random.split(key if key is not None else mx.random.key(_fresh_seed()))
    x = mx.random.normal((rows, k), key=kx).astype(dtype)
    dense = (mx.random.normal((n, k), key=kw) * (k ** -0.5)).astype(dtype)
    w, scales, biases = mx.quantize(dense, group_size=group_size, bits=bits)
    mx.eval(x, w, scales, biases)
    return x, w, scales, biases


# Timing rotates through copies of a layer's weights until they span this many bytes: more
# than any GPU's last-level cache (H200: 50 MB; Apple's system-level cache: up to 96 MB),
# so each call reads its weights from memory, as each layer of a model's step does. One copy
# stays in cache and times MLX's op faster than a model's step runs it (docs/benchmarks-log.md,
# "With the weights read from memory").
COLD_BYTES = 256 << 20
MAX_COPIES = 64


def cold_problems(rows: int, n: int, k: int, bits: int, group_size: int, dtype,
                  cold_bytes: int = COLD_BYTES) -> tuple[mx.array, list[tuple[mx.array, mx.array, mx.array]]]:
    """One x and enough (w, scales, biases) copies to span `cold_bytes` (at most MAX_COPIES)."""
    x, w, scales, biases = random_problem(rows, n, k, bits, group_size, dtype)
    copies = [(w, scales, biases)]
    size = w.nbytes + scales.nbytes + biases.nbytes
    while len(copies) < MAX_COPIES and len(copies) * size < cold_bytes:
        copies.append(random_problem(1, n, k, bits, group_size, dtype)[1:])
    return x, copies


def rotating(fn, x: mx.array, copies: list, group_size: int, bits: int, turn=None):
    """A call of `fn(x, w, scales, biases, group_size, bits)` on the next copy, whose input
    waits for the previous call's output (or for `after`, when given): the calls run one
    after another on the device, as a model's layers do. Independent calls may run side by
    side on CUDA (MLX builds a graph of them), which flatters a kernel that fills few of the
    GPU's SMs, as MLX's 8-row matrix kernel does (one block per 128 output columns: 20 of the
    H200's 132 SMs for N = 2560): it took far longer inside a model's step than side by side
    (docs/benchmarks-log.md, "Kernels of one engine step (ncu)"). Functions given one shared
    `turn` (a cycle over `copies`) take the copies in turn between them: none re-reads a copy
    another just left in cache."""
    turn = itertools.cycle(copies) if turn is None else turn
    zero = mx.array(0, dtype=x.dtype)
    last: list[mx.array] = []

    def call(after: mx.array | None = None) -> mx.array:
        before = after if after is not None else (last[0] if last else None)
        start = _link(x, before, zero) if before is not None else x
        out = fn(start, *next(turn), group_size, bits)
        last[:] = [out]
        return out
    return call


@mx.compile
def _link(x: mx.array, previous: mx.array, zero: mx.array) -> mx.array:
    # x itself, made to depend on `previous` (one small fused kernel; zero is an input, so
    # nothing folds it away).
    return x + previous[..., :1] * zero


def _fresh_seed() -> int:
    # New data every run: a kernel must not pass because it was tuned to one input.
    return int.from_bytes(os.urandom(4), "little")
