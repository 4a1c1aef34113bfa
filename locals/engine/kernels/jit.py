"""What every kernel of ours shares: its JIT kernel (CUDA: ours, cubin.py; Metal: mx.fast.metal_kernel)
built once per process under a name that carries its source's hash, a verdict on it remembered per
process (a pass also on disk: passed_checks.py), and attaching verified kernels to a model's modules
only while they pass.

A kernel's module keeps its source, its launch and its check; this module keeps the rest.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Hashable, Iterable

import mlx.core as mx
import mlx.nn as nn

from locals.engine.kernels import cubin, passed_checks

log = logging.getLogger(__name__)

# Device functions every CUDA kernel of ours may call: `jit_kernel` puts them before the kernel.
# (Metal has them built in: simd_sum.)
CUDA_HELPERS = r"""
// N values of T as one aligned vector, and their load (one vector load where `ptr` is aligned to
// it, else N scalar loads): MLX's AlignedVector and load_vector, which a kernel built with NVRTC
// alone (cubin.py) does not have.
template <typename T, int N>
struct alignas(sizeof(T) * N) locals_vec {
  T val[N];
  __device__ T& operator[](int i) { return val[i]; }
  __device__ T operator[](int i) const { return val[i]; }
};
template <int N, typename T>
__device__ __forceinline__ locals_vec<T, N> locals_load_vector(const T* ptr, unsigned int offset) {
  if (reinterpret_cast<size_t>(ptr) % (N * sizeof(T)) == 0) {
    return reinterpret_cast<const locals_vec<T, N>*>(ptr)[offset];
  }
  locals_vec<T, N> v;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = ptr[offset * N + i];
  }
  return v;
}
// v summed over the warp's 32 lanes, in every lane.
__device__ __forceinline__ float locals_warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, off);
  }
  return v;
}
// v summed over the block's `warps` warps, in every thread: the warps' sums meet in `part` (shared
// memory, a float a warp). Every thread of the block calls it.
__device__ __forceinline__ float locals_block_sum(float v, float* part, int warps) {
  v = locals_warp_sum(v);
  if (warps == 1) {
    return v;
  }
  if ((threadIdx.x & 31) == 0) {
    part[threadIdx.x >> 5] = v;
  }
  __syncthreads();
  v = 0.0f;
#pragma unroll
  for (int w = 0; w < warps; ++w) {
    v += part[w];
  }
  return v;
}
"""

_BUILT: dict[tuple[str, str], object] = {}


def source_tag(*sources: str) -> str:
    """A short hash of kernel sources: MLX caches compiled kernels by name, so a name that
    carries it never serves an older source."""
    return hashlib.sha1("".join(sources).encode()).hexdigest()[:10]


HELPERS_TAG = source_tag(CUDA_HELPERS)


def jit_kernel(backend: str, name: str, source: str | Callable[[], str], inputs: list[str], outputs: list[str],
               header: str = ""):
    """MLX's kernel `name` on `backend` ("cuda" or "metal"), built on first use (CUDA's after
    CUDA_HELPERS, its name tagged with theirs); `source` may be a callable that makes it (called
    only then)."""
    key = (backend, name)
    if key not in _BUILT:
        text = source() if callable(source) else source
        if backend == "cuda":
            _BUILT[key] = cuda_kernel(f"{name}_{HELPERS_TAG}", text, CUDA_HELPERS + header, inputs, outputs)
        else:
            _BUILT[key] = mx.fast.metal_kernel(name=name, source=text, header=header, input_names=inputs,
                                               output_names=outputs)
    return _BUILT[key]


def cuda_kernel(name: str, source: str, header: str, inputs: list[str], outputs: list[str]):
    """Our CUDA kernel `name`, compiled by us and kept on disk (cubin.py); MLX's own JIT kernel
    where NVRTC or the CUDA headers cannot be found (MLX then finds them its own way)."""
    store = cubin.shared_store()
    if store is None:
        return mx.fast.cuda_kernel(name=name, source=source, header=header, input_names=inputs, output_names=outputs)
    return cubin.CudaKernel(store, cubin.device_arch(), name, source, header, inputs, outputs)


def remembered(verdicts: dict, what: str, key: Hashable, check: Callable[[], str]) -> str:
    """`check()` once per process for `key` ("" when the kernel passed, otherwise why not), and
    not at all where the same check (`what`, the key's repr) passed at an earlier start on this
    machine with the same kernels and MLX (passed_checks.py)."""
    if key not in verdicts:
        kept, name = passed_checks.shared(), f"{what}: {key!r}"
        if kept is not None and kept.passed(name):
            verdicts[key] = ""
        else:
            verdicts[key] = check()
            if kept is not None and not verdicts[key]:
                kept.record(name)
    return verdicts[key]


def first_failure(checks: Iterable[tuple[str, Callable[[], str]]]) -> str:
    """"" when every (label, check) passes, otherwise "label: why" of the first that fails; the
    checks after it are not run."""
    return next((f"{label}: {why}" for label, check in checks if (why := check())), "")


def attach_verified(pairs: Iterable[tuple[nn.Module, object]], attribute: str, verified: Callable[[object], str],
                    what: str) -> int:
    """Set `module.<attribute> = kernel` for each (module, kernel) in turn while the kernels pass
    `verified`; the first that fails is logged ("<what> not used: it failed verification (why)")
    and ends it. Returns how many were attached."""
    attached = 0
    for module, kernel in pairs:
        why = verified(kernel)
        if why:
            log.warning("%s not used: it failed verification (%s)", what, why)
            return attached
        setattr(module, attribute, kernel)
        attached += 1
    return attached
