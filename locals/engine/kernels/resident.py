"""Small constant inputs for the kernels, kept in device memory.

On CUDA, MLX keeps arrays of 8 bytes or less, and arrays made from host data, in managed
memory, which a kernel reaches across the bus: an atomic on one made the folded kernels many
times slower (docs/benchmarks-log.md, "The residual add and norm inside o_proj and down_proj").
Arrays computed on the device and larger than 8 bytes get device memory. Elsewhere this is
just a small array.
"""

from __future__ import annotations

import mlx.core as mx

MIN_BYTES = 16  # more than MLX's 8-byte small-array pool


def device_array(values: list, dtype) -> mx.array:
    """`values` as a 1-D array of `dtype` computed on the default device, zero-padded to at
    least 16 bytes; made once by the caller and never read on the host afterwards."""
    host = mx.array(values, dtype=dtype)
    pad = max(0, -(-MIN_BYTES // dtype.size) - host.size)
    out = mx.concatenate([host, mx.zeros((pad,), dtype=dtype)]) if pad else host + mx.zeros_like(host)
    mx.eval(out)
    return out


_FLOATS: dict[float, mx.array] = {}


def float_constant(value: float) -> mx.array:
    """`value` as a float32 `device_array`, made once per value (an eps, a softmax scale)."""
    if value not in _FLOATS:
        _FLOATS[value] = device_array([value], mx.float32)
    return _FLOATS[value]
