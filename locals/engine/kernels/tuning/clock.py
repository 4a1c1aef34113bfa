"""Device timestamps on CUDA: how long a chain of calls ran on the GPU, whatever the host did.

Timed with the host clock, a chain of one-kernel calls measures the slower of host and
device; on the H200 MLX's host work per call from Python (40-100 us) is far slower than
a 4B model's matmuls (5-18 us each inside a step), so every candidate timed about the
same and tuning ranked them by host cost and noise. Here a one-thread kernel reads the GPU's global
nanosecond timer (`%globaltimer`) once its input is ready, and two of them bracket a
chain that MLX captures into one CUDA graph: the difference is device time, launch gaps
between the graph's nodes included, as in a model's step. Elsewhere (Metal, CPU) `timer`
returns None and callers keep the host clock.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from locals import settings
from locals.engine.kernels.jit import jit_kernel, source_tag

CUDA_STAMP_SOURCE = r"""
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    stamp[0] = static_cast<uint32_t>(t & 0xffffffffull);
    stamp[1] = static_cast<uint32_t>(t >> 32);
    zero[0] = static_cast<T>(0.0f);
  }
"""
# MLX ends a CUDA graph after this many nodes on most GPUs (100 on H100/H200-class ones;
# MLX_MAX_OPS_PER_BUFFER overrides both); a chain that spans two graphs could include host
# time between them.
MLX_NODES_PER_GRAPH = 20
NODES_PER_CALL = 3  # the link before a call, the call, and a second kernel for K-split calls

STAMP_TAG = source_tag(CUDA_STAMP_SOURCE)


def _stamp_kernel():
    return jit_kernel("cuda", f"locals_stamp_{STAMP_TAG}", CUDA_STAMP_SOURCE, ["dep"], ["stamp", "zero"])


def stamp(dep: mx.array, dtype=mx.float32) -> tuple[mx.array, mx.array]:
    """(the device time in ns as two uint32 words, a zero of `dtype` that later work can wait on),
    taken once `dep` is ready."""
    out = _stamp_kernel()(inputs=[dep], template=[("T", dtype)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                          output_shapes=[(2,), (1,)], output_dtypes=[mx.uint32, dtype])
    return out[0], out[1]


def nanoseconds(words: mx.array) -> int:
    low, high = (int(v) for v in words.tolist())
    return low | (high << 32)


def calls_per_graph() -> int:
    """How many timed calls fit in one CUDA graph with the two stamps."""
    limit = int(settings.foreign("MLX_MAX_OPS_PER_BUFFER", str(MLX_NODES_PER_GRAPH)))
    return max(1, (limit - 2) // NODES_PER_CALL)


def device_sample(fn: Callable[..., mx.array], calls: int, dtype=mx.float32) -> float:
    """Device seconds per call of `fn(after=...)` chained `calls` times, between two stamps."""
    t0, zero = stamp(mx.zeros((1,), dtype=dtype), dtype)
    out = fn(after=zero)
    for _ in range(calls - 1):
        out = fn()
    t1, _ = stamp(out, dtype)
    mx.eval(t0, t1)
    return (nanoseconds(t1) - nanoseconds(t0)) * 1e-9 / calls


def timer(dtype) -> Callable[[Callable[..., mx.array], int], float] | None:
    """A device timer `(fn, calls) -> seconds per call` on CUDA when the stamp kernel runs and
    moves forward; None elsewhere (callers time with the host clock)."""
    from locals.engine.load.backend import detect

    if detect().kind != "cuda":
        return None
    try:
        first, _ = stamp(mx.zeros((1,), dtype=dtype), dtype)
        second, _ = stamp(first, dtype)
        mx.eval(first, second)
        if not 0 <= nanoseconds(second) - nanoseconds(first) < 10**9:
            return None
    except Exception:  # a kernel that fails to compile or launch: the host clock it is
        return None
    return lambda fn, calls: device_sample(fn, calls, dtype)
