"""Decode attention over each row's own cache length, split along the keys (flash-decoding).

Rows of a decode batch sit at different lengths (agents' conversations differ). MLX's
attention then needs a mask, and on CUDA (0.32) its one-query vector kernel takes none:
it composes the attention from several ops a layer (matmuls, the mask, softmax) over the
padded length. These kernels read each row's own length instead, straight from the shared
cache (kv.py's `DecodeBatch`: keys of slot s at row s, values at rows_cap + s), so they need
no mask, no gathered view and no copy.

Two kernels a layer. The first gives each (row, key head, split of C keys, query head of the
group) a threadgroup of W warps (simdgroups) of 32 lanes: lane l holds head_dim / 32 of the
query's values; warp w takes the split's keys w, w + W, ... two at a time (their loads in
flight together), each key's score a warp sum folded into the warp's running max, sum and
output (online softmax); the warps meet in shared memory and the threadgroup writes its
split's max, sum and unnormalized output. The query heads of one group sit in neighbouring
threadgroups, so their shared keys are read from L2. The second kernel combines each (row,
head)'s splits. One threadgroup per (row, head) walking every key, as before, took a third
longer for 8-16 rows at thousands of keys, where agents are, and half as long for one short row
(docs/benchmarks-log.md, "Decode attention at agents' lengths"). A kernel is used only after
`verified` matched it against a float32 ground truth (MLX's masked attention on the CPU) on
this device.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from locals.engine.kernels.jit import attach_verified, first_failure, jit_kernel, remembered, source_tag
from locals.engine.kernels.resident import float_constant
from locals.engine.kernels.tuning.verify import matches

# Split kernel. Template: T (dtype), D (head dim, a multiple of 32), W (warps a threadgroup), C (keys a
# split, a multiple of 2 W). Inputs: q (B, HQ, 1, D); cache (2R, HK, t_cap, D); meta (2B,) int32, each
# row's slot then its length; scale (1,) float32. The grid holds B * HK * S * G threadgroups (G = HQ / HK
# query heads a key head, S splits). Output: part (B * HQ, S, D + 2) float32: each split's unnormalized
# output, then its max and its sum (-inf and 0 where the split holds none of the row's keys).
CUDA_SPLIT = r"""
  constexpr int E = D / 32;
  __shared__ float s_max[W];
  __shared__ float s_sum[W];
  __shared__ float s_out[W * D];
  const int HQ = q_shape[1];
  const int HK = cache_shape[1];
  const int t_cap = cache_shape[2];
  const int R = cache_shape[0] / 2;
  const int B = q_shape[0];
  const int G = HQ / HK;
  const int S = gridDim.x / (B * HQ);
  const int g = blockIdx.x % G;
  const int rest = blockIdx.x / G;
  const int split = rest % S;
  const int row = rest / S / HK;
  const int kvh = rest / S - row * HK;
  const int head = kvh * G + g;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int slot = meta[row];
  const int begin = split * C;
  const int end = min(meta[B + row], begin + C);
  const T* qp = q + (size_t(row) * HQ + head) * D + lane * E;
  const T* kp = cache + (size_t(slot) * HK + kvh) * size_t(t_cap) * D + lane * E;
  const T* vp = cache + (size_t(R + slot) * HK + kvh) * size_t(t_cap) * D + lane * E;
  float qv[E];
  float o[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    qv[e] = static_cast<float>(qp[e]) * scale[0];
    o[e] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  for (int j = begin + warp; j < end; j += 2 * W) {  // two keys an iteration: their loads overlap
    const bool two = j + W < end;
    const T* k0 = kp + size_t(j) * D;
    const T* k1 = kp + size_t(two ? j + W : j) * D;
    float s0 = 0.0f;
    float s1 = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      s0 += qv[e] * static_cast<float>(k0[e]);
      s1 += qv[e] * static_cast<float>(k1[e]);
    }
    s0 = locals_warp_sum(s0);
    s1 = locals_warp_sum(s1);
    s1 = two ? s1 : -INFINITY;
    const float m_new = fmaxf(m, fmaxf(s0, s1));
    const float a = expf(m - m_new);
    const float p0 = expf(s0 - m_new);
    const float p1 = two ? expf(s1 - m_new) : 0.0f;
    l = l * a + p0 + p1;
    const T* v0 = vp + size_t(j) * D;
    const T* v1 = vp + size_t(two ? j + W : j) * D;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      o[e] = o[e] * a + p0 * static_cast<float>(v0[e]) + p1 * static_cast<float>(v1[e]);
    }
    m = m_new;
  }
  if (lane == 0) {
    s_max[warp] = m;
    s_sum[warp] = l;
  }
  __syncthreads();
  float top = -INFINITY;
#pragma unroll
  for (int w = 0; w < W; ++w) {
    top = fmaxf(top, s_max[w]);
  }
  const float mine = m == -INFINITY ? 0.0f : expf(m - top);  // a warp that saw no key adds nothing
#pragma unroll
  for (int e = 0; e < E; ++e) {
    s_out[warp * D + lane * E + e] = o[e] * mine;
  }
  __syncthreads();
  float* p = part + ((size_t(row) * HQ + head) * S + split) * (D + 2);
  for (int d = threadIdx.x; d < D; d += W * 32) {
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      acc += s_out[w * D + d];
    }
    p[d] = acc;
  }
  if (threadIdx.x == 0) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      total += s_max[w] == -INFINITY ? 0.0f : s_sum[w] * expf(s_max[w] - top);
    }
    p[D] = top;
    p[D + 1] = total;
  }
"""

# Combine kernel. Template: T, D. Input: part (B * HQ, S, D + 2) from the split kernel. One threadgroup of
# D threads per (row, head). Output: out (B, HQ * D), row-major as (B, HQ, D): the layout o_proj reads.
CUDA_COMBINE = r"""
  const int S = part_shape[1];
  const float* p = part + size_t(blockIdx.x) * S * (D + 2);
  const int d = threadIdx.x;
  float top = -INFINITY;
  for (int s = 0; s < S; ++s) {
    top = fmaxf(top, p[s * (D + 2) + D]);
  }
  float total = 0.0f;
  float acc = 0.0f;
  for (int s = 0; s < S; ++s) {
    const float m = p[s * (D + 2) + D];
    if (m != -INFINITY) {
      const float w = expf(m - top);
      total += p[s * (D + 2) + D + 1] * w;
      acc += p[s * (D + 2) + d] * w;
    }
  }
  out[size_t(blockIdx.x) * D + d] = static_cast<T>(acc / total);
"""

METAL_SPLIT = r"""
  constexpr int E = D / 32;
  threadgroup float s_max[W];
  threadgroup float s_sum[W];
  threadgroup float s_out[W * D];
  const int HQ = q_shape[1];
  const int HK = cache_shape[1];
  const int t_cap = cache_shape[2];
  const int R = cache_shape[0] / 2;
  const int B = q_shape[0];
  const int G = HQ / HK;
  const int S = int(threadgroups_per_grid.x) / (B * HQ);
  const int blk = int(threadgroup_position_in_grid.x);
  const int g = blk % G;
  const int rest = blk / G;
  const int split = rest % S;
  const int row = rest / S / HK;
  const int kvh = rest / S - row * HK;
  const int head = kvh * G + g;
  const int warp = int(simdgroup_index_in_threadgroup);
  const int lane = int(thread_index_in_simdgroup);
  const int tid = int(thread_position_in_threadgroup.x);
  const int slot = meta[row];
  const int begin = split * C;
  const int end = metal::min(meta[B + row], begin + C);
  const size_t q_at = (size_t(row) * HQ + head) * D + lane * E;
  const size_t k_at = (size_t(slot) * HK + kvh) * size_t(t_cap) * D + lane * E;
  const size_t v_at = (size_t(R + slot) * HK + kvh) * size_t(t_cap) * D + lane * E;
  float qv[E];
  float o[E];
  for (int e = 0; e < E; ++e) {
    qv[e] = float(q[q_at + e]) * scale[0];
    o[e] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  for (int j = begin + warp; j < end; j += 2 * W) {  // two keys an iteration: their loads overlap
    const bool two = j + W < end;
    const size_t k0 = k_at + size_t(j) * D;
    const size_t k1 = k_at + size_t(two ? j + W : j) * D;
    float s0 = 0.0f;
    float s1 = 0.0f;
    for (int e = 0; e < E; ++e) {
      s0 += qv[e] * float(cache[k0 + e]);
      s1 += qv[e] * float(cache[k1 + e]);
    }
    s0 = simd_sum(s0);
    s1 = two ? simd_sum(s1) : -INFINITY;
    const float m_new = metal::max(m, metal::max(s0, s1));
    const float a = metal::precise::exp(m - m_new);
    const float p0 = metal::precise::exp(s0 - m_new);
    const float p1 = two ? metal::precise::exp(s1 - m_new) : 0.0f;
    l = l * a + p0 + p1;
    const size_t v0 = v_at + size_t(j) * D;
    const size_t v1 = v_at + size_t(two ? j + W : j) * D;
    for (int e = 0; e < E; ++e) {
      o[e] = o[e] * a + p0 * float(cache[v0 + e]) + p1 * float(cache[v1 + e]);
    }
    m = m_new;
  }
  if (lane == 0) {
    s_max[warp] = m;
    s_sum[warp] = l;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float top = -INFINITY;
  for (int w = 0; w < W; ++w) {
    top = metal::max(top, s_max[w]);
  }
  const float mine = m == -INFINITY ? 0.0f : metal::precise::exp(m - top);
  for (int e = 0; e < E; ++e) {
    s_out[warp * D + lane * E + e] = o[e] * mine;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const size_t p_at = ((size_t(row) * HQ + head) * S + split) * (D + 2);
  for (int d = tid; d < D; d += W * 32) {
    float acc = 0.0f;
    for (int w = 0; w < W; ++w) {
      acc += s_out[w * D + d];
    }
    part[p_at + d] = acc;
  }
  if (tid == 0) {
    float total = 0.0f;
    for (int w = 0; w < W; ++w) {
      total += s_max[w] == -INFINITY ? 0.0f : s_sum[w] * metal::precise::exp(s_max[w] - top);
    }
    part[p_at + D] = top;
    part[p_at + D + 1] = total;
  }
"""

METAL_COMBINE = r"""
  const int S = part_shape[1];
  const size_t at = size_t(threadgroup_position_in_grid.x) * S * (D + 2);
  const int d = int(thread_position_in_threadgroup.x);
  float top = -INFINITY;
  for (int s = 0; s < S; ++s) {
    top = metal::max(top, part[at + s * (D + 2) + D]);
  }
  float total = 0.0f;
  float acc = 0.0f;
  for (int s = 0; s < S; ++s) {
    const float m = part[at + s * (D + 2) + D];
    if (m != -INFINITY) {
      const float w = metal::precise::exp(m - top);
      total += part[at + s * (D + 2) + D + 1] * w;
      acc += part[at + s * (D + 2) + d] * w;
    }
  }
  out[size_t(threadgroup_position_in_grid.x) * D + d] = T(acc / total);
"""

SOURCES = {"cuda": (CUDA_SPLIT, CUDA_COMBINE), "metal": (METAL_SPLIT, METAL_COMBINE)}
TAG = source_tag(CUDA_SPLIT, CUDA_COMBINE, METAL_SPLIT, METAL_COMBINE)
DTYPES = (mx.float16, mx.bfloat16, mx.float32)
WARPS = 4  # a split's threadgroup
SPLIT_KEYS = 256  # keys a split: WARPS warps x 32 iterations of two keys


def splits_for(longest: int) -> int:
    """Splits a (row, head) for keys up to `longest`."""
    return max(1, -(-longest // SPLIT_KEYS))


def _kernels(backend: str):
    split, combine = SOURCES[backend]
    return (jit_kernel(backend, f"locals_decode_attention_split_{TAG}", split, ["q", "cache", "meta", "scale"], ["part"]),
            jit_kernel(backend, f"locals_decode_attention_combine_{TAG}", combine, ["part"], ["out"]))


@dataclass(frozen=True)
class DecodeAttention:
    """The kernel for one head layout and dtype on one backend ("cuda" or "metal")."""

    backend: str
    heads: int
    kv_heads: int
    head_dim: int
    dtype: mx.Dtype

    def __call__(self, q: mx.array, cache: mx.array, meta: mx.array, longest: int, scale: float) -> mx.array:
        """q (B, heads, 1, dim) against the shared cache (2R, kv_heads, t_cap, dim); meta (2B,)
        int32: each row's slot, then how many of its keys count; `longest` the largest of
        those (or more) -> (B, heads * dim), the layout o_proj reads (no reshape after it)."""
        rows, splits = q.shape[0], splits_for(longest)
        split, combine = _kernels(self.backend)
        blocks = rows * self.heads * splits
        part = split(inputs=[q, cache, meta, float_constant(scale)],
                     template=[("T", q.dtype), ("D", self.head_dim), ("W", WARPS), ("C", SPLIT_KEYS)],
                     grid=(blocks * WARPS * 32, 1, 1), threadgroup=(WARPS * 32, 1, 1),
                     output_shapes=[(rows * self.heads, splits, self.head_dim + 2)], output_dtypes=[mx.float32])[0]
        return combine(inputs=[part], template=[("T", q.dtype), ("D", self.head_dim)],
                       grid=(rows * self.heads * self.head_dim, 1, 1), threadgroup=(self.head_dim, 1, 1),
                       output_shapes=[(rows, self.heads * self.head_dim)], output_dtypes=[q.dtype])[0]


def reference(q: mx.array, cache: mx.array, meta: mx.array, scale: float, stream=None,
              longest: int | None = None) -> mx.array:
    """The same with MLX's ops: the rows' first `longest` keys and values gathered (by default
    as many as the longest row has), the padding masked."""
    rows, rows_cap = q.shape[0], cache.shape[0] // 2
    slots, lengths = meta[:rows], meta[rows:]
    longest = int(mx.max(lengths).item()) if longest is None else longest
    keys = mx.take(cache, slots, axis=0, stream=stream)[:, :, :longest]
    values = mx.take(cache, slots + rows_cap, axis=0, stream=stream)[:, :, :longest]
    mask = (mx.arange(longest)[None] < lengths[:, None])[:, None, None, :]
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask, stream=stream)


# (rows, cache positions) a kernel must get right before use: one row, odd counts, each warp count.
VERIFY_CASES = ((1, 40), (3, 200), (8, 700), (5, 2100))
_VERDICTS: dict[DecodeAttention, str] = {}


def _random_case(kernel: DecodeAttention, rows: int, t_cap: int) -> tuple[mx.array, mx.array, mx.array]:
    """Fresh q, a cache with spare slots and positions, and meta: slots shuffled, lengths from 1
    to t_cap (the first row the longest, the second a single key)."""
    rng = np.random.default_rng()
    mx.random.seed(int.from_bytes(rng.bytes(4), "little"))
    rows_cap = rows + 3
    q = (2 * mx.random.normal((rows, kernel.heads, 1, kernel.head_dim))).astype(kernel.dtype)
    cache = mx.random.normal((2 * rows_cap, kernel.kv_heads, t_cap, kernel.head_dim)).astype(kernel.dtype)
    slots = rng.permutation(rows_cap)[:rows]
    if (slots == np.arange(rows)).all():  # never the identity: the slot lookup is always exercised
        slots = slots + 1
    lengths = rng.integers(1, t_cap + 1, rows)
    lengths[0] = t_cap
    if rows > 1:
        lengths[1] = 1
    meta = mx.array(np.concatenate([slots, lengths]).astype(np.int32))
    return q, cache, meta


def check(kernel: DecodeAttention, rows: int, t_cap: int) -> str:
    """"" when the kernel matches a float32 ground truth (MLX's ops on the CPU) on fresh data,
    otherwise why not."""
    q, cache, meta = _random_case(kernel, rows, t_cap)
    scale = kernel.head_dim ** -0.5
    f32 = [a.astype(mx.float32, stream=mx.cpu) for a in (q, cache)]
    truth = reference(*f32, meta, scale, stream=mx.cpu).reshape(rows, -1)
    return matches(lambda: kernel(q, cache, meta, int(mx.max(meta[rows:]).item()), scale), truth, kernel.dtype)


def verified(kernel: DecodeAttention) -> str:
    """"" when `kernel` passed every case on this device (checked once per process), otherwise
    the first failure."""
    return remembered(_VERDICTS, "decode attention", kernel, lambda: first_failure(
        (f"{rows} rows of up to {t}", lambda rows=rows, t=t: check(kernel, rows, t)) for rows, t in VERIFY_CASES))


def active_for(attn: nn.Module, q: mx.array) -> DecodeAttention | None:
    """The kernel attached to `attn` when it may run on q (q in its dtype and head size)."""
    kernel = getattr(attn, "decode_attention", None)
    if kernel is None or q.dtype != kernel.dtype or q.shape[-1] != kernel.head_dim:
        return None
    return kernel


def _head_dim(attn: nn.Module) -> int | None:
    """The module's head size: its own attribute, its q norm's width, or from mlx-lm's scale
    (head_dim ** -0.5); a wrong guess is harmless, the kernel runs only on queries of its size."""
    norm = getattr(getattr(attn, "q_norm", None), "weight", None)
    scale = getattr(attn, "scale", None)
    return getattr(attn, "head_dim", None) or (norm.shape[0] if norm is not None else None) or (
        round(scale ** -2) if scale else None)


def attach(model: nn.Module, backend: str, dtype) -> int:
    """Give each attention module of a llama/qwen-family model a verified `decode_attention`
    (batch_plan.py uses it); returns how many. Nothing on a CPU."""
    if backend not in SOURCES or dtype not in DTYPES:
        return 0
    pairs = ((attn, DecodeAttention(backend, *layout, dtype)) for attn, layout in _layouts(model))
    return attach_verified(pairs, "decode_attention", verified, "decode attention kernel")


def _layouts(model: nn.Module):
    """(attention module, (heads, kv heads, head size)) of each layer whose layout the kernel takes."""
    for layer in getattr(getattr(model, "model", None), "layers", None) or []:
        attn = getattr(layer, "self_attn", None)
        heads, kv_heads = getattr(attn, "n_heads", None), getattr(attn, "n_kv_heads", None)
        head_dim = _head_dim(attn)
        if heads and kv_heads and head_dim and not head_dim % 32 and not heads % kv_heads:
            yield attn, (heads, kv_heads, head_dim)
