"""Fused residual add + RMSNorm: `h = a + b` and `rms_norm(h) * w` in one kernel.

Each layer adds the attention output to the residual stream and normalizes it for the MLP,
then adds the MLP output and normalizes it for the next layer's attention: four kernels a
layer with MLX's ops (two adds, two norms), two with this one (docs/benchmarks-log.md, "Fused
layer kernels, joined every pass").

One threadgroup per token, each thread holding its values in registers. The sum is rounded
to the dtype (the residual stream is kept in it), squared and summed in float32, then each
value is normalized and rounded as MLX's norm does: `w * T(h * rsqrt(mean(h^2) + eps))`.
A kernel is used only after `verified` matched it against a float32 ground truth on this
device.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from locals.engine.kernels.jit import attach_verified, first_failure, jit_kernel, remembered, source_tag
from locals.engine.kernels.resident import float_constant
from locals.engine.kernels.tuning.verify import matches

THREADS = 256  # a threadgroup: 8 warps/simdgroups; 2560 values are 10 a thread

# Template: T (dtype), VPT (values a thread: width / 256 rounded up). Inputs a, b (T, D);
# w (D,); eps (1,) float32. Outputs h, x (T, D). Every load is issued before the first
# store: with the stores in the loop (h might alias a or b for all the compiler knows) each
# value cost a memory latency (docs/benchmarks-log.md, "Add+norm with its loads first").
CUDA_SOURCE = r"""
  constexpr int NT = 256;
  __shared__ float part[NT / 32];
  const int D = a_shape[1];
  const size_t row = size_t(blockIdx.x) * D;
  const int i0 = threadIdx.x;
  const float e = eps[0];
  float hv[VPT];
  float wv[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = i0 + j * NT;
    hv[j] = i < D ? static_cast<float>(a[row + i]) + static_cast<float>(b[row + i]) : 0.0f;
    wv[j] = i < D ? static_cast<float>(w[i]) : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    hv[j] = static_cast<float>(static_cast<T>(hv[j]));
    ss += hv[j] * hv[j];
  }
  ss = locals_block_sum(ss, part, NT / 32);
  const float inv = rsqrtf(ss / float(D) + e);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = i0 + j * NT;
    if (i < D) {
      h[row + i] = static_cast<T>(hv[j]);
      x[row + i] = static_cast<T>(wv[j] * static_cast<float>(static_cast<T>(hv[j] * inv)));
    }
  }
"""

METAL_SOURCE = r"""
  constexpr int NT = 256;
  threadgroup float part[NT / 32];
  const int D = a_shape[1];
  const size_t row = size_t(threadgroup_position_in_grid.x) * D;
  const int i0 = int(thread_position_in_threadgroup.x);
  const float e = eps[0];
  float hv[VPT];
  float wv[VPT];
  for (int j = 0; j < VPT; ++j) {
    const int i = i0 + j * NT;
    hv[j] = i < D ? float(a[row + i]) + float(b[row + i]) : 0.0f;
    wv[j] = i < D ? float(w[i]) : 0.0f;
  }
  float ss = 0.0f;
  for (int j = 0; j < VPT; ++j) {
    hv[j] = float(T(hv[j]));
    ss += hv[j] * hv[j];
  }
  ss = simd_sum(ss);
  if (thread_index_in_simdgroup == 0) {
    part[simdgroup_index_in_threadgroup] = ss;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  ss = 0.0f;
  for (int w8 = 0; w8 < NT / 32; ++w8) {
    ss += part[w8];
  }
  const float inv = metal::precise::rsqrt(ss / float(D) + e);
  for (int j = 0; j < VPT; ++j) {
    const int i = i0 + j * NT;
    if (i < D) {
      h[row + i] = T(hv[j]);
      x[row + i] = T(wv[j] * float(T(hv[j] * inv)));
    }
  }
"""

SOURCES = {"cuda": CUDA_SOURCE, "metal": METAL_SOURCE}
TAG = source_tag(CUDA_SOURCE, METAL_SOURCE)
DTYPES = (mx.float16, mx.bfloat16, mx.float32)
VERIFY_TOKENS = (1, 3, 8, 33)
_VERDICTS: dict[object, str] = {}


def _kernel(backend: str):
    return jit_kernel(backend, f"locals_addnorm_{TAG}", SOURCES[backend], ["a", "b", "w", "eps"], ["h", "x"])


@dataclass(frozen=True)
class AddNorm:
    """The fused kernel for one width, eps and dtype on one backend ("cuda" or "metal")."""

    backend: str
    width: int
    eps: float
    dtype: mx.Dtype

    def __call__(self, a: mx.array, b: mx.array, weight: mx.array) -> tuple[mx.array, mx.array]:
        """(a + b, rms_norm(a + b) * weight) for a, b (T, width)."""
        tokens = a.shape[0]
        return tuple(_kernel(self.backend)(
            inputs=[a, b, weight, float_constant(self.eps)],
            template=[("T", a.dtype), ("VPT", -(-self.width // THREADS))],
            grid=(tokens * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
            output_shapes=[a.shape, a.shape], output_dtypes=[a.dtype, a.dtype],
        ))


def reference(a: mx.array, b: mx.array, weight: mx.array, eps: float, stream=None) -> tuple[mx.array, mx.array]:
    """The same with MLX's ops."""
    h = mx.add(a, b, stream=stream)
    return h, mx.fast.rms_norm(h, weight, eps, stream=stream)


def check(fused: AddNorm, tokens: int) -> str:
    """"" when the kernel matches a float32 ground truth (MLX's ops on the CPU) on fresh data,
    otherwise why not."""
    mx.random.seed(int.from_bytes(np.random.default_rng().bytes(4), "little"))
    a = (4 * mx.random.normal((tokens, fused.width))).astype(fused.dtype)
    b = mx.random.normal((tokens, fused.width)).astype(fused.dtype)
    w = (1 + mx.random.normal((fused.width,))).astype(fused.dtype)
    truth = reference(*(t.astype(mx.float32, stream=mx.cpu) for t in (a, b, w)), fused.eps, stream=mx.cpu)
    return matches(lambda: fused(a, b, w), truth, fused.dtype)


def verified(fused: AddNorm) -> str:
    """"" when `fused` passed every token count on this device (checked once per process),
    otherwise the first failure."""
    return remembered(_VERDICTS, "add and norm", fused, lambda: first_failure(
        (f"{n} tokens", lambda n=n: check(fused, n)) for n in VERIFY_TOKENS))


def attach(model: nn.Module, backend: str, dtype) -> int:
    """Give each layer's two RMSNorms a verified `add_norm` (forward.py uses it); returns how
    many layers. Nothing on a CPU."""
    if backend not in SOURCES or dtype not in DTYPES:
        return 0
    pairs = ((norm, AddNorm(backend, norm.weight.shape[0], float(norm.eps), dtype)) for norm in _plain_norms(model))
    return attach_verified(pairs, "add_norm", verified, "fused residual add and norm") // 2


def _plain_norms(model: nn.Module):
    """Both RMSNorms of each layer whose two norms are plain RMSNorms, in order."""
    for layer in getattr(getattr(model, "model", None), "layers", None) or []:
        norms = [getattr(layer, n, None) for n in ("input_layernorm", "post_attention_layernorm")]
        if all(type(n) is nn.RMSNorm and n.weight.ndim == 1 for n in norms):
            yield from norms
