"""Affine 4/8-bit quantized matmul for 1..16 rows that reads each packed weight once.

`x (M, K) @ dequantize(w).T` for w packed as MLX's affine format (uint32 words, low bits
first, one scale and bias per `group_size` values). One warp (CUDA) or simdgroup (Metal)
owns R output columns; its lanes walk K one packed word at a time, unpack the word once
and apply it to all M rows, so the weights cross the memory bus once per call whatever
M is. On CUDA two variants share the algorithm: staged (a block's warps read x from shared
memory) and split (a block's warps split K for the same columns). The CUDA and Metal
sources are the same algorithm; neither is used before it has verified itself on the
device (see verify.py and tuning.py). The CUDA tensor-core variant (4-bit, fp16/bf16)
lives in qmm_mma.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from locals.engine.kernels import qmm_mma
from locals.engine.kernels.jit import CUDA_HELPERS, jit_kernel, source_tag

MAX_ROWS = 16
# The tensor-core kernel's wide candidates take 17..32 rows (four 8-row tiles); the others,
# and MLX's own tiled kernel past 32, keep the rest.
WIDE_MAX_ROWS = 32
# Row counts are compiled in buckets (the kernel predicates rows past the real M), so a
# tuning run compiles 5 variants per configuration instead of 16.
ROW_BUCKETS = (1, 2, 4, 8, 16)
SUPPORTED_BITS = (4, 8)
SUPPORTED_GROUPS = (32, 64, 128)
SUPPORTED_DTYPES = (mx.float16, mx.bfloat16, mx.float32)

def cuda_word_step(x_row: str) -> str:
    """What a CUDA lane does with one packed word `wi` of its R columns: unpack it once and apply
    it to all MB rows; `x_row` reads row m's VPW values of x at that word (a locals_vec)."""
    return r"""    float q[R][VPW];
    float s[R];
    float b[R];
    const int g = wi / WPG;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // Columns past N repeat the last one; their sums are never written.
      const int n = min(n0 + r, N - 1);
      const uint32_t word = w[size_t(n) * KW + wi];
      s[r] = static_cast<float>(scales[size_t(n) * G + g]);
      b[r] = static_cast<float>(biases[size_t(n) * G + g]);
#pragma unroll
      for (int j = 0; j < VPW; ++j) {
        q[r][j] = static_cast<float>((word >> (BITS * j)) & MASK);
      }
    }
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      if (m < M) {
        const auto xw = """ + x_row + r""";
        float xv[VPW];
        float xsum = 0.0f;
#pragma unroll
        for (int j = 0; j < VPW; ++j) {
          xv[j] = static_cast<float>(xw[j]);
          xsum += xv[j];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float dot = 0.0f;
#pragma unroll
          for (int j = 0; j < VPW; ++j) {
            dot = fmaf(q[r][j], xv[j], dot);
          }
          acc[r][m] += s[r] * dot + b[r] * xsum;
        }
      }
    }
"""


# The plain and split-K variants read x from global memory: one vector load per row (the
# helper falls back to scalar loads if unaligned).
CUDA_WORD_STEP = cuda_word_step("locals_load_vector<VPW>(x + size_t(m) * K, wi)")

# What every CUDA variant begins with: the packing constants, the problem's sizes, the lane.
CUDA_SIZES = r"""
  constexpr int VPW = 32 / BITS;   // values per packed word
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  constexpr int WPG = GS / VPW;    // packed words per quantization group
  const int M = x_shape[0];
  const int N = w_shape[0];
  const int KW = w_shape[1];
  const int K = KW * VPW;
  const int G = K / GS;
  const int lane = threadIdx.x & 31;
"""

# Each lane's sums for its R columns and MB rows, from zero.
CUDA_ZERO_SUMS = r"""  float acc[R][MB];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      acc[r][m] = 0.0f;
    }
  }
"""


def cuda_warp_sums(condition: str, store: str) -> str:
    """The epilogue: each acc[r][m] summed over the warp's lanes (jit.py's locals_warp_sum) as `v`,
    then `store` where `condition` holds."""
    return f"""#pragma unroll
  for (int r = 0; r < R; ++r) {{
#pragma unroll
    for (int m = 0; m < MB; ++m) {{
      const float v = locals_warp_sum(acc[r][m]);
      if ({condition}) {{
        {store}
      }}
    }}
  }}
"""


# Lane 0 writes a column's sum for a row, where both exist.
CUDA_STORE_SUMS = cuda_warp_sums("lane == 0 && m < M && n0 + r < N",
                                 "out[size_t(m) * N + n0 + r] = static_cast<T>(v);")

CUDA_SOURCE = CUDA_SIZES + r"""  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int n0 = warp * R;
  if (n0 >= N) {
    return;  // warp-uniform, so the shuffles below stay converged
  }
""" + CUDA_ZERO_SUMS + r"""  for (int wi = lane; wi < KW; wi += 32) {
""" + CUDA_WORD_STEP + "  }\n" + CUDA_STORE_SUMS

# The staged variant: a block's warps share x through shared memory, loaded once per
# block and chunk of K, so x is read from L2 once per block instead of once per warp
# (the per-warp re-reads cost ~2.5 us per extra row on a 9728x2560 weight).
CUDA_STAGED_SOURCE = CUDA_SIZES + r"""  constexpr int E = 16 / int(sizeof(T));  // values per 16-byte copy
  // Chunk of K (in packed words) whose x slice fits 32 KB of shared memory.
  constexpr int FIT = 32768 / (MB * int(sizeof(T)) * VPW);
  constexpr int CHW = FIT >= 256 ? 256 : (FIT >= 128 ? 128 : (FIT >= 64 ? 64 : 32));
  constexpr int CHV = CHW * VPW;
  __shared__ __align__(32) uint4 xs_raw[(MB * CHV * int(sizeof(T)) + 15) / 16];
  T* xs = reinterpret_cast<T*>(xs_raw);
  const int n0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * R;
  const bool active = n0 < N;  // idle warps still take part in the barriers
""" + CUDA_ZERO_SUMS + r"""  for (int c0 = 0; c0 < KW; c0 += CHW) {
    const int cw = min(CHW, KW - c0);
    const int units = cw * VPW / E;
    __syncthreads();
    for (int i = threadIdx.x; i < M * units; i += blockDim.x) {
      const int m = i / units;
      const int u = i - m * units;
      reinterpret_cast<locals_vec<T, E>*>(xs + m * CHV)[u] =
          locals_load_vector<E>(x + size_t(m) * K + size_t(c0) * VPW, u);
    }
    __syncthreads();
    if (!active) {
      continue;
    }
    for (int wl = lane; wl < cw; wl += 32) {
      const int wi = c0 + wl;
""" + cuda_word_step("reinterpret_cast<const locals_vec<T, VPW>*>(xs + m * CHV)[wl]") + r"""    }
  }
  if (!active) {
    return;
  }
""" + CUDA_STORE_SUMS

# The split-K variant: a block's warps share R output columns and each walks its own slice
# of K, their sums meeting in shared memory. For N = 2560 outputs the one-warp-per-column
# kernels run 1280 warps that each walk all of K (38 dependent loads for K = 9728), and
# inside a model's 8-row step they read the weights at a small part of the memory's rate
# (docs/benchmarks-log.md, "Kernels of one engine step (ncu)"). Splitting K gives the SMs S
# times the warps, each with S times fewer loads in a row.
CUDA_SPLIT_SOURCE = CUDA_SIZES + r"""  constexpr int S = NT / 32;  // warps per block, each over its own slice of K
  __shared__ float part[S][R][MB];
  const int warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * R;
  if (n0 >= N) {
    return;  // the whole block: no barrier is left waiting
  }
""" + CUDA_ZERO_SUMS + r"""#pragma unroll 2
  for (int wi = warp * 32 + lane; wi < KW; wi += NT) {
""" + CUDA_WORD_STEP + "  }\n" + cuda_warp_sums("lane == 0", "part[warp][r][m] = v;") + r"""  __syncthreads();
  for (int i = threadIdx.x; i < R * MB; i += NT) {
    const int r = i / MB;
    const int m = i - r * MB;
    if (m < M && n0 + r < N) {
      float v = 0.0f;
#pragma unroll
      for (int k = 0; k < S; ++k) {
        v += part[k][r][m];
      }
      out[size_t(m) * N + n0 + r] = static_cast<T>(v);
    }
  }
"""

METAL_SOURCE = r"""
  constexpr int VPW = 32 / BITS;
  constexpr uint MASK = (1u << BITS) - 1u;
  constexpr int WPG = GS / VPW;
  const int M = x_shape[0];
  const int N = w_shape[0];
  const int KW = w_shape[1];
  const int K = KW * VPW;
  const int G = K / GS;
  const int lane = int(thread_index_in_simdgroup);
  const int n0 = int(thread_position_in_grid.x / 32) * R;
  if (n0 >= N) {
    return;  // simdgroup-uniform, so simd_sum below sees every lane
  }
  float acc[R][MB];
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < MB; ++m) {
      acc[r][m] = 0.0f;
    }
  }
  for (int wi = lane; wi < KW; wi += 32) {
    float q[R][VPW];
    float s[R];
    float b[R];
    const int g = wi / WPG;
    for (int r = 0; r < R; ++r) {
      const int n = min(n0 + r, N - 1);
      const uint word = w[size_t(n) * KW + wi];
      s[r] = float(scales[size_t(n) * G + g]);
      b[r] = float(biases[size_t(n) * G + g]);
      for (int j = 0; j < VPW; ++j) {
        q[r][j] = float((word >> (BITS * j)) & MASK);
      }
    }
    for (int m = 0; m < MB; ++m) {
      if (m < M) {
        float xv[VPW];
        float xsum = 0.0f;
        for (int j = 0; j < VPW; ++j) {
          xv[j] = float(x[size_t(m) * K + size_t(wi) * VPW + j]);
          xsum += xv[j];
        }
        for (int r = 0; r < R; ++r) {
          float dot = 0.0f;
          for (int j = 0; j < VPW; ++j) {
            dot = fma(q[r][j], xv[j], dot);
          }
          acc[r][m] += s[r] * dot + b[r] * xsum;
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < MB; ++m) {
      float v = simd_sum(acc[r][m]);
      if (lane == 0 && m < M && n0 + r < N) {
        out[size_t(m) * N + n0 + r] = T(v);
      }
    }
  }
"""


CUDA_TAG = source_tag(CUDA_HELPERS, CUDA_SOURCE, CUDA_STAGED_SOURCE, CUDA_SPLIT_SOURCE,
                      qmm_mma.CUDA_MMA_HEADER, qmm_mma.CUDA_MMA_SOURCE, qmm_mma.CUDA_KSUM_SOURCE)
METAL_TAG = source_tag(METAL_SOURCE)
CUDA_VARIANTS = {"qmv": CUDA_SOURCE, "qmvs": CUDA_STAGED_SOURCE, "qmvk": CUDA_SPLIT_SOURCE}
MMA_DTYPES = (mx.float16, mx.bfloat16)


def _kernel(backend: str, variant: str):
    """The JIT kernel for a backend and variant (qmv, qmvs, qmvk; tensor-core: qmm_mma.py), built once."""
    names = (["x", "w", "scales", "biases"], ["out"])
    if backend == "cuda" and variant in CUDA_VARIANTS:
        return jit_kernel(backend, f"locals_{variant}_{CUDA_TAG}", CUDA_VARIANTS[variant], *names)
    if backend == "metal" and variant == "qmv":
        return jit_kernel(backend, f"locals_qmv_{METAL_TAG}", METAL_SOURCE, *names)
    raise ValueError(f"no {variant} quantized-matmul kernel for the {backend} backend")


def row_bucket(rows: int) -> int:
    """The compiled row count that serves `rows` (the smallest bucket >= rows)."""
    return next(b for b in ROW_BUCKETS if b >= rows)


@dataclass(frozen=True)
class QmvKernel:
    """One launch configuration: R output columns per warp (per block when split or on the
    tensor cores), T threads a block, x staged in shared memory or not, K split across a
    block's warps or not, products on the tensor cores (CUDA, 4-bit, R = 16 or 32) or not,
    and there K split across `k_split` blocks a column tile or not."""

    backend: str  # "cuda" | "metal"
    cols_per_warp: int
    threads: int
    staged: bool = False
    split: bool = False
    tensor: bool = False
    unroll: int = 1  # tensor: chunks of K loaded together (and as many more in flight)
    wide: bool = False  # tensor: 17..WIDE_MAX_ROWS rows instead of 1..MAX_ROWS
    k_split: int = 1  # tensor: blocks per column tile, each over an interleaved part of K

    @property
    def takes_norm(self) -> bool:  # the residual add and RMSNorm after the product (qmm_mma.py)
        return self.tensor and self.k_split == 1

    takes_gated = takes_norm  # a joined [gate | up] weight, output silu(gate) * up (`gated=True`): the same kernels

    def compiled_rows(self, rows: int) -> int:
        """The rows it runs for `rows` (the rest predicated off: one tile's row counts cost alike)."""
        return qmm_mma.tensor_tile(rows) if self.tensor else row_bucket(rows)

    @property
    def launches(self) -> int:  # kernels a call queues: K split adds the one that sums the partials
        return 2 if self.k_split > 1 else 1

    @property
    def variant(self) -> str:
        if self.tensor:
            return "qmma"
        return "qmvk" if self.split else ("qmvs" if self.staged else "qmv")

    @property
    def name(self) -> str:
        more = ((f"-u{self.unroll}" if self.unroll > 1 else "") + (f"-k{self.k_split}" if self.k_split > 1 else "")
                + ("-wide" if self.wide else ""))
        return f"{self.backend}-{self.variant}-r{self.cols_per_warp}-t{self.threads}{more}"

    def supports(self, rows: int, bits: int, group_size: int, dtype, scales_dtype) -> bool:
        """Whether this kernel computes the given problem (otherwise MLX's op is used)."""
        if self.tensor and (bits != 4 or dtype not in MMA_DTYPES):
            return False
        low, high = (MAX_ROWS + 1, WIDE_MAX_ROWS) if self.wide else (1, MAX_ROWS)
        return (low <= rows <= high and bits in SUPPORTED_BITS and group_size in SUPPORTED_GROUPS
                and dtype in SUPPORTED_DTYPES and scales_dtype == dtype)

    def __call__(self, x: mx.array, w: mx.array, scales: mx.array, biases: mx.array,
                 group_size: int, bits: int, gated: bool = False) -> mx.array:
        """x @ dequantize(w).T; with `gated` (`takes_gated`), silu(gate) * up for
        x @ dequantize(w).T = [gate | up] (half as wide as w's N)."""
        if gated and not self.takes_gated:
            raise ValueError(f"{self.name} does not take a joined gate/up weight")
        *lead, k = x.shape
        rows = math.prod(lead)
        n = w.shape[0]
        x2 = x.reshape(rows, k)
        if self.tensor:  # one block per R columns (k_split blocks); 8-row tiles: three compiles in all
            out = qmm_mma.launch(x2, w, scales, biases, cols=self.cols_per_warp, threads=self.threads,
                                 unroll=self.unroll, k_split=self.k_split, group_size=group_size,
                                 gated=gated)[0]
            return out.reshape(*lead, n // 2 if gated else n)
        template = [("T", x.dtype), ("MB", row_bucket(rows)), ("R", self.cols_per_warp),
                    ("BITS", bits), ("GS", group_size)] + ([("NT", self.threads)] if self.split else [])
        # One block per R columns (split), or one warp per R columns.
        grid = -(-n // self.cols_per_warp) * (self.threads if self.split else 32)
        out = _kernel(self.backend, self.variant)(
            inputs=[x2, w, scales, biases], template=template,
            grid=(grid, 1, 1), threadgroup=(self.threads, 1, 1),
            output_shapes=[(rows, n)], output_dtypes=[x.dtype],
        )[0]
        return out.reshape(*lead, n)

    def add_norm(self, x: mx.array, res: mx.array, nw: mx.array, eps: mx.array, count: mx.array, w: mx.array,
                 scales: mx.array, biases: mx.array, group_size: int) -> tuple[mx.array, mx.array]:
        """(h, rms_norm(h) * nw) for h = res + x @ dequantize(w).T, x (rows, K), res (rows, N), in one
        kernel (`takes_norm`; eps read as eps[0]; count the layer's own, normfold.counter)."""
        if not self.takes_norm:
            raise ValueError(f"{self.name} does not take the residual add and norm")
        _d, h, xn = qmm_mma.launch(x, w, scales, biases, cols=self.cols_per_warp, threads=self.threads,
                                   unroll=self.unroll, k_split=1, group_size=group_size,
                                   add_norm=(res, nw, eps, count))
        return h, xn


def candidates(backend: str) -> list[QmvKernel]:
    """The launch configurations tuning tries on `backend` (none on the CPU)."""
    if backend not in ("cuda", "metal"):
        return []
    if backend == "metal":  # not timed on a Mac yet: every configuration
        return [QmvKernel(backend, r, t) for r in (1, 2, 4) for t in (128, 256)]
    # CUDA: each configuration costs a runtime compile per row tile when verified, so tuning
    # tries only the tensor-core configurations that won layers on the H200 (docs/tune.md,
    # "Candidates"): the vector kernels, staged and split variants and the K split never did
    # once the tensor-core kernels existed, and trying them made `locals tune` take over 5 minutes.
    tensor = [QmvKernel(backend, r, t, tensor=True, unroll=u) for r, t, u in ((16, 128, 1), (16, 256, 1), (32, 256, 1),
                                                                             (16, 128, 2))]
    # 17-32 rows: apart from the above so that one failing at 32 rows rejects only these.
    wide = [QmvKernel(backend, r, t, tensor=True, wide=True) for r, t in ((16, 128), (32, 256))]
    return tensor + wide
