"""Fused q/k head preparation: RMSNorm (Qwen3's q_norm/k_norm, when the model has them) and
RoPE for every query and key head of a pass, in one kernel that also places the values.

MLX runs this as up to six kernels a layer: two norms, two RoPEs, and on CUDA two copies,
because the q and k slices of a joined q/k/v output are strided and MLX's CUDA rms_norm
copies inputs that are not contiguous (docs/benchmarks-log.md, "Fused layer kernels, joined
every pass"). The kernel reads q, k and v where they lie (one
joined output at three column offsets, or three separate outputs) and writes q in the
layout decode attention takes, (T, heads, 1, dim), and the keys with the values after them
in one (2T, kv_heads, 1, dim) array, which the decode batch stores with one scatter a
layer instead of two (kv.py) — or, in a whole decode step (compiled.py), straight into the
decode batch's shared K/V array at each row's slot and position (`into_cache`): no scatter,
no reshape, two primitives a layer fewer for MLX to queue.

One threadgroup per (token, head), one thread per rotated pair: the pair's two values are
normalized with the head's sum of squares, rounded to the dtype as MLX's norm rounds them,
then rotated as MLX's RoPE rotates them (same inverse-frequency formula). A kernel is used
only after `verify_spec` matched it against a float32 ground truth on this device.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from locals.engine.kernels.jit import attach_verified, first_failure, jit_kernel, remembered, source_tag
from locals.engine.kernels.resident import device_array
from locals.engine.kernels.tuning.verify import matches

log = logging.getLogger(__name__)

# Template: T (dtype), D (head dim; D / 2 a multiple of 32), NORM, TRAD (traditional RoPE).
# dims = [q heads, kv heads, q, k and v column offsets]; params = [log2 base, scale, eps].
# Outputs: qout (T, q heads, 1, D), and where the keys and values go (KEY_AT / VALUE_AT, `DESTINATIONS`).
CUDA_SOURCE = r"""
  constexpr int P = D / 2;  // threads a head: one rotated pair each
  __shared__ float part[32];
  const int HQ = dims[0];
  const int HK = dims[1];
  const int heads = HQ + 2 * HK;
  const int tok = blockIdx.x / heads;
  const int head = blockIdx.x - tok * heads;
  const int i = threadIdx.x;
  if (head >= HQ + HK) {  // a value head: copied as it is, after the T tokens' keys
    const int hv = head - HQ - HK;
    const T* vs = vsrc + size_t(tok) * vsrc_shape[1] + dims[4] + hv * D;
    T* vd = VALUE_AT;
    vd[i] = vs[i];
    vd[i + P] = vs[i + P];
    return;
  }
  const bool is_q = head < HQ;
  const int h = is_q ? head : head - HQ;
  const T* src = is_q ? qsrc + size_t(tok) * qsrc_shape[1] + dims[2] + h * D
                      : ksrc + size_t(tok) * ksrc_shape[1] + dims[3] + h * D;
  T* dst = is_q ? qout + (size_t(tok) * HQ + h) * D : KEY_AT;
  const int i1 = TRAD ? 2 * i : i;
  const int i2 = TRAD ? 2 * i + 1 : i + P;
  float x1 = static_cast<float>(src[i1]);
  float x2 = static_cast<float>(src[i2]);
  if (NORM) {
    const float ss = locals_block_sum(x1 * x1 + x2 * x2, part, P / 32);
    const float inv = rsqrtf(ss / float(D) + params[2]);
    const float w1 = is_q ? static_cast<float>(qw[i1]) : static_cast<float>(kw[i1]);
    const float w2 = is_q ? static_cast<float>(qw[i2]) : static_cast<float>(kw[i2]);
    // As MLX's norm: w * T(x * inv), the product rounded to T.
    x1 = static_cast<float>(static_cast<T>(w1 * static_cast<float>(static_cast<T>(x1 * inv))));
    x2 = static_cast<float>(static_cast<T>(w2 * static_cast<float>(static_cast<T>(x2 * inv))));
  }
  // As MLX's RoPE: inv_freq = 2^(-i/P * log2 base), theta = (scale * position) * inv_freq.
  // exp2, sin and cos in double: the runtime compiler's fast float versions are a few ulp off,
  // which angles in the thousands of radians multiply (float32 outputs were 1.4e-4 off on an
  // H200 with float exp2 and sin/cos; MLX's own kernel is exact there).
  const float inv_freq = static_cast<float>(
      exp2(static_cast<double>(-(static_cast<float>(i) / static_cast<float>(P)) * params[0])));
  const float theta = (params[1] * static_cast<float>(pos[tok])) * inv_freq;
  double sd, cd;
  sincos(static_cast<double>(theta), &sd, &cd);
  const float c = static_cast<float>(cd);
  const float s = static_cast<float>(sd);
  dst[i1] = static_cast<T>(x1 * c - x2 * s);
  dst[i2] = static_cast<T>(x1 * s + x2 * c);
"""

METAL_SOURCE = r"""
  constexpr int P = D / 2;
  threadgroup float part[32];
  const int HQ = dims[0];
  const int HK = dims[1];
  const int heads = HQ + 2 * HK;
  const int tok = int(threadgroup_position_in_grid.x) / heads;
  const int head = int(threadgroup_position_in_grid.x) - tok * heads;
  const int i = int(thread_position_in_threadgroup.x);
  if (head >= HQ + HK) {  // a value head: copied as it is, after the T tokens' keys
    const int hv = head - HQ - HK;
    const size_t from = size_t(tok) * vsrc_shape[1] + dims[4] + hv * D;
    device T* vd = VALUE_AT;
    vd[i] = vsrc[from + i];
    vd[i + P] = vsrc[from + i + P];
    return;
  }
  const bool is_q = head < HQ;
  const int h = is_q ? head : head - HQ;
  const size_t base_q = size_t(tok) * qsrc_shape[1] + dims[2] + h * D;
  const size_t base_k = size_t(tok) * ksrc_shape[1] + dims[3] + h * D;
  device T* dst = is_q ? qout + (size_t(tok) * HQ + h) * D : KEY_AT;
  const int i1 = TRAD ? 2 * i : i;
  const int i2 = TRAD ? 2 * i + 1 : i + P;
  float x1 = is_q ? float(qsrc[base_q + i1]) : float(ksrc[base_k + i1]);
  float x2 = is_q ? float(qsrc[base_q + i2]) : float(ksrc[base_k + i2]);
  if (NORM) {
    float ss = simd_sum(x1 * x1 + x2 * x2);
    if (P > 32) {
      if (thread_index_in_simdgroup == 0) {
        part[simdgroup_index_in_threadgroup] = ss;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      ss = 0.0f;
      for (int w = 0; w < P / 32; ++w) {
        ss += part[w];
      }
    }
    const float inv = metal::precise::rsqrt(ss / float(D) + params[2]);
    const float w1 = is_q ? float(qw[i1]) : float(kw[i1]);
    const float w2 = is_q ? float(qw[i2]) : float(kw[i2]);
    x1 = float(T(w1 * float(T(x1 * inv))));
    x2 = float(T(w2 * float(T(x2 * inv))));
  }
  const float inv_freq = metal::exp2(-(float(i) / float(P)) * params[0]);
  const float theta = (params[1] * float(pos[tok])) * inv_freq;
  const float c = metal::precise::cos(theta);
  const float s = metal::precise::sin(theta);
  dst[i1] = T(x1 * c - x2 * s);
  dst[i2] = T(x1 * s + x2 * c);
"""

# Where a token's key and value heads go, per mode: "array", an output kvout (2T, kv heads, 1, D),
# the T keys then the T values, which the decode batch writes with one scatter (kv.py); "cache",
# the decode batch's shared (2 * rows_cap, kv heads, t_cap, D) array itself, at the token's slot
# (slots[tok]; its values rows_cap slots on) and position (pos[tok]), written in place (`into_cache`).
DESTINATIONS = {
    "array": ("kvout + (size_t(tok) * HK + h) * D", "kvout + (size_t(qsrc_shape[0] + tok) * HK + hv) * D"),
    "cache": ("(PTR)cache + ((size_t(slots[tok]) * HK + h) * cache_shape[2] + pos[tok]) * D",
              "(PTR)cache + ((size_t(cache_shape[0] / 2 + slots[tok]) * HK + hv) * cache_shape[2] + pos[tok]) * D"),
}
SOURCES = {"cuda": CUDA_SOURCE, "metal": METAL_SOURCE}
POINTER = {"cuda": "T*", "metal": "device T*"}
TAG = source_tag(CUDA_SOURCE, METAL_SOURCE, repr(DESTINATIONS))
DTYPES = (mx.float16, mx.bfloat16, mx.float32)
_CONSTANTS: dict[tuple, tuple[mx.array, mx.array, mx.array]] = {}


@dataclass(frozen=True)
class HeadSpec:
    """What one attention module asks of the kernel: head counts and size, whether q/k are
    RMS-normalized (and with which eps), and its RoPE."""

    heads: int
    kv_heads: int
    head_dim: int
    norm: bool
    eps: float
    traditional: bool
    base: float
    scale: float


def spec_of(attn: nn.Module) -> HeadSpec | None:
    """The spec of an mlx-lm llama/qwen attention module, or None when the kernel does not
    cover it (a RoPE other than MLX's plain one, partial rotary dims, an odd head size)."""
    rope = getattr(attn, "rope", None)
    heads, kv_heads = getattr(attn, "n_heads", None), getattr(attn, "n_kv_heads", None)
    scale = getattr(attn, "scale", None)
    if type(rope) is not nn.RoPE or not heads or not kv_heads or not scale:
        return None
    dim = rope.dims
    if round(scale ** -2) != dim:  # mlx-lm's scale is head_dim ** -0.5: RoPE over part of each head
        return None
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    norm = q_norm is not None
    if norm and not (isinstance(q_norm, nn.RMSNorm) and isinstance(k_norm, nn.RMSNorm)
                     and q_norm.weight.shape == (dim,) and k_norm.weight.shape == (dim,)
                     and q_norm.eps == k_norm.eps):
        return None
    if dim % 64 or dim > 2048 or (not norm and k_norm is not None):
        return None
    return HeadSpec(heads, kv_heads, dim, norm, float(q_norm.eps) if norm else 0.0,
                    bool(rope.traditional), float(rope.base), float(rope.scale))


def _kernel(backend: str, mode: str):
    def source() -> str:
        key_at, value_at = (d.replace("PTR", POINTER[backend]) for d in DESTINATIONS[mode])
        return SOURCES[backend].replace("KEY_AT", key_at).replace("VALUE_AT", value_at)

    inputs = ["qsrc", "ksrc", "vsrc", "qw", "kw", "pos", "dims", "params"]
    inputs += ["cache", "slots"] if mode == "cache" else []
    outputs = ["qout"] + (["kvout"] if mode == "array" else [])
    return jit_kernel(backend, f"locals_headprep_{mode}_{TAG}", source, inputs, outputs)


@dataclass(frozen=True)
class HeadPrep:
    """The fused kernel for one spec and activation dtype on one backend ("cuda" or "metal")."""

    backend: str
    spec: HeadSpec
    dtype: mx.Dtype

    def __call__(self, q_src: mx.array, k_src: mx.array, v_src: mx.array, offsets: tuple[int, int, int],
                 q_weight: mx.array | None, k_weight: mx.array | None,
                 positions: mx.array) -> tuple[mx.array, mx.array]:
        """q (T, heads, 1, dim) and kv (2T, kv_heads, 1, dim) (the keys normed and rotated, then
        the values as they are) from q_src/k_src/v_src (T, width), whose heads start at the columns
        `offsets` (q, k, v); positions (T,) int32."""
        s = self.spec
        tokens = q_src.shape[0]
        return tuple(self._launch("array", [q_src, k_src, v_src, offsets, q_weight, k_weight, positions],
                                  [(tokens, s.heads, 1, s.head_dim), (2 * tokens, s.kv_heads, 1, s.head_dim)]))

    def into_cache(self, q_src: mx.array, k_src: mx.array, v_src: mx.array, offsets: tuple[int, int, int],
                   q_weight: mx.array | None, k_weight: mx.array | None, positions: mx.array,
                   cache: mx.array, slots: mx.array) -> mx.array:
        """q as `__call__` gives it, the keys and values written into the decode batch's `cache`
        (2 * rows_cap, kv_heads, t_cap, dim) in place: token i's at slot slots[i] (its values at
        rows_cap + slots[i]), position positions[i]. Saves a scatter and a reshape a layer.

        MLX does not see the write: a reader of `cache` in the same graph must take q too (the
        decode attention kernel does; compiled.py passes the cache only then), a reader outside
        it must be evaluated after it (step.py queues a pass before snapshotting its KV), and
        `cache` must be row-contiguous (DecodeBatch's arrays always are), or MLX would hand the
        kernel a copy. Callers check `writes_cache` first."""
        s = self.spec
        return self._launch("cache", [q_src, k_src, v_src, offsets, q_weight, k_weight, positions, cache, slots],
                            [(q_src.shape[0], s.heads, 1, s.head_dim)])[0]

    def writes_cache(self) -> bool:
        """Whether `into_cache` verified on this device (`attach` checks it; nothing runs here,
        so a compiled graph may ask while tracing)."""
        return _CACHE_VERDICTS.get(self) == ""

    def _launch(self, mode: str, args: list, shapes: list[tuple]) -> list[mx.array]:
        s = self.spec
        q_src, k_src, v_src, offsets, q_weight, k_weight, positions, *cache = args
        tokens, dtype = q_src.shape[0], q_src.dtype
        dims, params, unused = _constants(s, dtype, offsets)
        if not s.norm:  # every input needs an array
            q_weight = k_weight = unused
        return _kernel(self.backend, mode)(
            inputs=[q_src, k_src, v_src, q_weight, k_weight, positions.astype(mx.int32), dims, params, *cache],
            template=[("T", dtype), ("D", s.head_dim), ("NORM", s.norm), ("TRAD", s.traditional)],
            grid=(tokens * (s.heads + 2 * s.kv_heads) * (s.head_dim // 2), 1, 1),
            threadgroup=(s.head_dim // 2, 1, 1),
            output_shapes=shapes,
            output_dtypes=[dtype] * len(shapes),
        )


def _constants(spec: HeadSpec, dtype, offsets: tuple[int, int, int]) -> tuple[mx.array, mx.array, mx.array]:
    """The kernel's small inputs, made once per layout (not new arrays every layer of every step)."""
    key = (spec, dtype, offsets)
    if key not in _CONSTANTS:
        dims = device_array([spec.heads, spec.kv_heads, *offsets], mx.int32)  # in device memory (resident.py)
        params = device_array([math.log2(spec.base), spec.scale, spec.eps], mx.float32)
        unused = mx.zeros((1,), dtype=dtype)
        mx.eval(unused)
        _CONSTANTS[key] = (dims, params, unused)
    return _CONSTANTS[key]


def reference(q: mx.array, k: mx.array, v: mx.array, spec: HeadSpec, q_weight, k_weight, positions: mx.array,
              stream=None) -> tuple[mx.array, mx.array]:
    """The same with MLX's ops: q (T, heads*dim), k and v (T, kv_heads*dim) in; q (T, heads, 1, dim)
    and kv (2T, kv_heads, 1, dim) (keys, then values) out."""
    out = []
    for x, heads, weight in ((q, spec.heads, q_weight), (k, spec.kv_heads, k_weight)):
        x = x.reshape(x.shape[0], heads, 1, spec.head_dim)
        if spec.norm:
            x = mx.fast.rms_norm(x, weight, spec.eps, stream=stream)
        out.append(mx.fast.rope(x, spec.head_dim, traditional=spec.traditional, base=spec.base,
                                scale=spec.scale, offset=positions, stream=stream))
    values = v.reshape(v.shape[0], spec.kv_heads, 1, spec.head_dim)
    return out[0], mx.concatenate([out[1], values], stream=stream)


def reference_into_cache(q: mx.array, k: mx.array, v: mx.array, spec: HeadSpec, q_weight, k_weight,
                         positions: mx.array, cache: mx.array, slots: mx.array) -> mx.array:
    """`into_cache` with MLX's ops: q out, and the array object `cache` rebound to the cache with the
    keys and values written (a scatter), so its holder sees them as it sees the kernel's write."""
    q_out, kv = reference(q, k, v, spec, q_weight, k_weight, positions)
    tokens, rows_cap = q.shape[0], cache.shape[0] // 2
    slots = slots[:tokens]
    rows = mx.concatenate([slots, slots + rows_cap])[:, None]
    at = mx.concatenate([positions, positions]).astype(mx.int32)[:, None]
    cache[rows, mx.arange(spec.kv_heads)[None], at] = kv[:, :, 0, :]
    return q_out


# Token counts a kernel must get right before use: one decode row, odd counts, a batch, a chunk.
VERIFY_TOKENS = (1, 3, 8, 33)
CACHE_T = 40  # positions of a verification cache (`check_into_cache`)
_VERDICTS: dict[tuple, str] = {}
_CACHE_VERDICTS: dict[tuple, str] = {}


def _random_case(spec: HeadSpec, tokens: int, joined: bool, dtype, positions_below: int = 512) -> tuple:
    """Fresh inputs: q/k/v sources in the joined or the separate layout, norm weights, positions."""
    q_cols, k_cols = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    if joined:
        src = (3 * mx.random.normal((tokens, q_cols + 2 * k_cols))).astype(dtype)
        q_src = k_src = v_src = src
        offsets = (0, q_cols, q_cols + k_cols)
        q, k, v = src[:, :q_cols], src[:, q_cols:q_cols + k_cols], src[:, q_cols + k_cols:]
    else:
        q_src = q = (3 * mx.random.normal((tokens, q_cols))).astype(dtype)
        k_src = k = (3 * mx.random.normal((tokens, k_cols))).astype(dtype)
        v_src = v = (3 * mx.random.normal((tokens, k_cols))).astype(dtype)
        offsets = (0, 0, 0)
    q_weight = (1 + mx.random.normal((spec.head_dim,))).astype(dtype)
    k_weight = (1 + mx.random.normal((spec.head_dim,))).astype(dtype)
    # Positions stay below 512: a float32 angle is only as exact as its ulp times the position,
    # and MLX's CPU RoPE (the truth) derives its frequencies differently, so at 4096 float32
    # outputs differed by 1.1e-4 on an H200 (over float32's 1e-4 allowance) with both exact.
    positions = mx.random.randint(0, positions_below, (tokens,), dtype=mx.int32)
    return (q_src, k_src, v_src, offsets, q_weight, k_weight, positions), (q, k, v)


def check(prep: HeadPrep, tokens: int, joined: bool) -> str:
    """"" when the kernel matches a float32 ground truth (MLX's ops on the CPU) on fresh data,
    otherwise why not (error over the dtype's allowance, non-finite output, an exception)."""
    dtype = prep.dtype
    mx.random.seed(int.from_bytes(np.random.default_rng().bytes(4), "little"))
    args, (q, k, v) = _random_case(prep.spec, tokens, joined, dtype)
    f32 = [a.astype(mx.float32, stream=mx.cpu) for a in (q, k, v, args[4], args[5])]
    truth = reference(*f32[:3], prep.spec, *f32[3:], args[6], stream=mx.cpu)
    return matches(lambda: prep(*args), truth, dtype)


def check_into_cache(prep: HeadPrep, tokens: int, joined: bool) -> str:
    """`check` for `into_cache`: q and the whole cache after the write (a stray write shows as a
    changed entry elsewhere) against MLX's ops on the CPU, slots in random order among spare ones."""
    spec, dtype = prep.spec, prep.dtype
    mx.random.seed(int.from_bytes(np.random.default_rng().bytes(4), "little"))
    args, (q, k, v) = _random_case(spec, tokens, joined, dtype, positions_below=CACHE_T)
    rows_cap = tokens + 2
    cache = mx.random.normal((2 * rows_cap, spec.kv_heads, CACHE_T, spec.head_dim)).astype(dtype)
    slots = mx.array(np.random.default_rng().permutation(rows_cap)[:tokens].astype(np.int32))
    mx.eval(cache, slots)
    with mx.stream(mx.cpu):
        f32 = [a.astype(mx.float32) for a in (q, k, v, args[4], args[5])]
        truth_cache = cache.astype(mx.float32)
        truth_q = reference_into_cache(*f32[:3], spec, *f32[3:], args[6], truth_cache, slots)
        mx.eval(truth_q, truth_cache)

    def run():
        return prep.into_cache(*args, cache, slots), cache  # the kernel writes `cache` itself

    return matches(run, (truth_q, truth_cache), dtype)


def _first_failure(prep: HeadPrep, check_one) -> str:
    return first_failure((f"{n} tokens, {'joined' if joined else 'separate'}",
                          lambda n=n, joined=joined: check_one(prep, n, joined))
                         for n in VERIFY_TOKENS for joined in (True, False))


def verified(prep: HeadPrep) -> str:
    """"" when `prep` passed every token count in both layouts on this device (checked once per
    process), otherwise the first failure."""
    return remembered(_VERDICTS, "q/k norm and RoPE", prep, lambda: _first_failure(prep, check))


def cache_verified(prep: HeadPrep) -> str:
    """The same for `into_cache`."""
    return remembered(_CACHE_VERDICTS, "q/k norm and RoPE into the cache", prep,
                      lambda: _first_failure(prep, check_into_cache))


def attach(model: nn.Module, backend: str, dtype) -> int:
    """Give each attention module of a llama/qwen-family model whose spec the kernel covers a
    verified `head_prep` (forward.py uses it); returns how many. Nothing on a CPU."""
    if backend not in SOURCES or dtype not in DTYPES:
        return 0
    attns = [layer.self_attn for layer in getattr(getattr(model, "model", None), "layers", None) or []
             if spec_of(getattr(layer, "self_attn", None)) is not None]
    attached = attach_verified(((attn, HeadPrep(backend, spec_of(attn), dtype)) for attn in attns), "head_prep",
                               verified, "fused q/k norm and RoPE")
    if attached and (why := cache_verified(attns[0].head_prep)):  # then whole steps store K/V with a scatter
        log.warning("fused q/k kernel writes no cache: it failed verification (%s)", why)
    return attached
