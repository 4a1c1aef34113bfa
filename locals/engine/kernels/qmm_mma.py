"""The tensor-core (mma) small-batch quantized matmul source: CUDA, 4-bit, fp16/bf16, 1-32 rows.

The CUDA-core kernels in qmm.py accumulate every row's products in float32 FMAs: at 8
rows that is 8 FMAs per weight value, more than an SM issues per weight byte it can
read, so from ~4 rows they are bound by instructions, not by memory (docs/benchmarks-log.md,
the per-M table). Here each weight value is dequantized once (two bf16x2 or f16x2
instructions per pair of values) and the products run on the tensor cores: one
`mma.m16n8k16` multiplies 16 weight columns by 16 k values for 8 batch rows.

Layout. A block owns 16·NC output columns; its S warps split K in chunks of 128 values
(each warp takes every S-th chunk) and sum through shared memory at the end. With KS > 1,
KS blocks share a column tile (each warp takes every (S·KS)-th chunk) and write float32
partial sums that a second small kernel adds in a fixed order: an H200 decode step's
o_proj and down_proj (2560 columns, 160 tiles of 16 for 132 SMs) read their weights at half
the rate of gate/up (docs/benchmarks-log.md, "Fused layer kernels, joined every pass"): too
few warps in flight, and some SMs do two tiles while others do one. In a chunk,
lane (g, t) = (lane / 4, lane % 4) loads 16 bytes (32 values) of weight columns g and
g + 8 at k = 32·t .. 32·t + 31, and the same 32 values of batch rows g, g + 8, … (one per
8-row tile: 1, 2 or 4 tiles). The dot product does not depend on the order of k, so each
mma's 16 k positions are the lane's own values, paired as the dequantization trick leaves
them: `word & 0x000F000F` holds nibbles 0 and 4, `>> 4` nibbles 1 and 5, and so on; x's
pairs are rearranged to match with one byte-permute each. The next chunk's loads are issued before this chunk's
arithmetic (two register stages of U chunks each: more bytes in flight per warp).

With GATED, w is an MLP's joined [gate | up] weight (N = 2I rows) and the kernel writes
silu(gate) * up (M, I) instead of the product: a 16-column tile takes 8 gate columns and the
same 8 columns of up (the mma's rows g and g + 8), so every output's two sums end in one
block, and the epilogue rounds each to T as the product would be, then applies the
activation in float and rounds once. The activation's own kernel goes (glu.py verifies it).

Compiled with QMMA_ADD_NORM (the `qmman` kernel: inputs res, nw, eps and count, outputs h
and xn after out), the product is a sublayer's output d and the kernel also adds it to the
residual stream and normalizes the sum for the next sublayer: h = T(res + d) and
xn = T(nw * T(h * rsqrt(mean(h^2) + eps))), as addnorm.py computes them. A norm needs whole
rows and a block owns 16·NC columns, so the block that finishes last does it: every block
writes its part of d, fences, and counts itself in `count`; the last one reads d back from
L2, writes h and xn, and sets `count` back to 0 for the next launch (one counter per layer;
normfold.py verifies the kernel before the engine uses it). No K split (KS = 1). A warp
takes a row with all of its loads issued before the first is used: a loop that used each
load as it came left o_proj and down_proj a fifth slower (docs/benchmarks-log.md, "The
residual add and norm inside o_proj and down_proj").
"""

from __future__ import annotations

import mlx.core as mx

from locals.engine.kernels.jit import jit_kernel, source_tag


def tensor_tile(rows: int) -> int:
    """The rows the tensor-core kernel is compiled for (8-row tiles): 8, 16 or 32."""
    return 8 if rows <= 8 else (16 if rows <= 16 else 32)


CUDA_MMA_HEADER = r"""
#ifndef QMMA_ADD_NORM
#define QMMA_ADD_NORM 0
#endif
// Eight 2-byte values from L2, past this SM's L1 (written by other blocks of this launch).
__device__ inline uint4 locals_load_l2(const void* p) {
  return __ldcg(reinterpret_cast<const uint4*>(p));
}
// Eight values of h = T(r + d); their squares added to *q in float.
template <typename U>
__device__ inline uint4 locals_add_sq(uint4 rv, uint4 dv, float* q) {
  uint4 out;
  const U* r = reinterpret_cast<const U*>(&rv);
  const U* d = reinterpret_cast<const U*>(&dv);
  U* o = reinterpret_cast<U*>(&out);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    o[j] = static_cast<U>(static_cast<float>(r[j]) + static_cast<float>(d[j]));
    const float v = static_cast<float>(o[j]);
    *q += v * v;
  }
  return out;
}
// Eight values of T(w * T(h * inv)), as MLX's rms_norm rounds them.
template <typename U>
__device__ inline uint4 locals_norm8(uint4 hv, uint4 wv, float inv) {
  uint4 out;
  const U* hh = reinterpret_cast<const U*>(&hv);
  const U* w = reinterpret_cast<const U*>(&wv);
  U* o = reinterpret_cast<U*>(&out);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float n = static_cast<float>(static_cast<U>(static_cast<float>(hh[j]) * inv));
    o[j] = static_cast<U>(static_cast<float>(w[j]) * n);
  }
  return out;
}
__device__ inline void locals_store(float* p, size_t i, float v) { p[i] = v; }
template <typename U>
__device__ inline void locals_store(U* p, size_t i, float v) { p[i] = static_cast<U>(v); }
"""

CUDA_MMA_SOURCE = r"""
  constexpr int S = NT / 32;                // warps per block
  constexpr int TILES = MB / 8;             // 8-row tiles of x (MB is 8, 16 or 32)
  constexpr int CH = 128;                   // k values per chunk: 4 lanes x 32
  constexpr uint32_t MAGIC = F16 ? 0x64006400u : 0x43004300u;  // 1024.0 / 128.0, twice
  __shared__ float part[S][16 * NC][8 * TILES];
  const int M = x_shape[0];
  const int N = w_shape[0];
  const int KW = w_shape[1];
  const int K = KW * 8;
  const int G = K / GS;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  // KS > 1: the KS blocks of a column tile take interleaved chunks of K each and write
  // float32 partial sums (KS, M, N) that a second kernel adds up.
  // GATED: each 16-column tile is 8 gate columns and their 8 up columns; a block writes 8·NC
  // outputs of silu(gate) * up, of NO = N / 2.
  constexpr int TC = GATED ? 8 * NC : 16 * NC;  // output columns a block writes
  const int NO = GATED ? N / 2 : N;
  const int tiles = (NO + TC - 1) / TC;
  const int split = blockIdx.x / tiles;
  const int n0 = (blockIdx.x - split * tiles) * TC;
  constexpr int SW = S * KS;                // warps over K, across a tile's KS blocks
  const int gw = split * S + warp;          // this warp's first chunk
  const int chunks = (K + CH - 1) / CH;
  const uint16_t* sbits = reinterpret_cast<const uint16_t*>(scales);
  const uint16_t* bbits = reinterpret_cast<const uint16_t*>(biases);

  // One chunk's loads for this lane: weight words, scale and bias pairs, x pairs.
  struct Chunk {
    uint4 wv[NC][2];
    uint32_t s2[NC][2];
    uint32_t b2[NC][2];
    uint4 xv[TILES][4];
  };
  auto load = [&](int c, Chunk& st) {
    const int k0 = c * CH + 32 * t;
    const bool kin = c < chunks && k0 < K;  // K is a multiple of 32
#pragma unroll
    for (int nc = 0; nc < NC; ++nc) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Columns past N (past NO, GATED) repeat the last one; their sums are never written.
        const int j = min(n0 + (GATED ? 8 : 16) * nc + g + (GATED ? 0 : 8 * h), NO - 1);
        const int n = GATED && h ? NO + j : j;
        if (kin) {
          st.wv[nc][h] = *reinterpret_cast<const uint4*>(w + size_t(n) * KW + k0 / 8);
          const uint32_t sb = sbits[size_t(n) * G + k0 / GS];
          const uint32_t bb = bbits[size_t(n) * G + k0 / GS];
          st.s2[nc][h] = sb | (sb << 16);
          st.b2[nc][h] = bb | (bb << 16);
        } else {
          st.wv[nc][h] = make_uint4(0u, 0u, 0u, 0u);
          st.s2[nc][h] = 0u;
          st.b2[nc][h] = 0u;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
      const int m = g + 8 * i;
      const uint4* xp = reinterpret_cast<const uint4*>(x + size_t(m) * K + k0);
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        if (kin && m < M) {
          st.xv[i][v] = xp[v];
        } else {
          st.xv[i][v] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
  };
  // Four values of a word (nibble pairs p, p + 4 and p + 1, p + 5 after shifting) as
  // dequantized half pairs: (128 + q) - 128 is exact, then one rounding in q * s + b.
  auto dequant = [&](uint32_t word, uint32_t s2, uint32_t b2) -> uint32_t {
    uint32_t u = (word & 0x000F000Fu) | MAGIC;
    uint32_t r;
    if (F16) {
      asm("sub.f16x2 %0, %1, %2;" : "=r"(u) : "r"(u), "r"(MAGIC));
      asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(u), "r"(s2), "r"(b2));
    } else {
      asm("sub.bf16x2 %0, %1, %2;" : "=r"(u) : "r"(u), "r"(MAGIC));
      asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(u), "r"(s2), "r"(b2));
    }
    return r;
  };
  float acc[NC][TILES][4];
#pragma unroll
  for (int nc = 0; nc < NC; ++nc) {
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[nc][i][e] = 0.0f;
      }
    }
  }
  // U chunks an iteration, the next U in flight while these are multiplied.
  Chunk cur[U];
  Chunk nxt[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    load(gw + u * SW, cur[u]);
  }
  for (int c = gw; c < chunks; c += U * SW) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      load(c + (U + u) * SW, nxt[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const Chunk& ch = cur[u];
#pragma unroll
      for (int j = 0; j < 4; ++j) {        // the lane's four words
#pragma unroll
        for (int h = 0; h < 2; ++h) {      // two mma steps per word
          uint32_t xb[TILES][2];
#pragma unroll
          for (int i = 0; i < TILES; ++i) {
            const uint32_t* xr = reinterpret_cast<const uint32_t*>(&ch.xv[i][0]);
            xb[i][0] = __byte_perm(xr[4 * j + h], xr[4 * j + h + 2], 0x5410);
            xb[i][1] = __byte_perm(xr[4 * j + h], xr[4 * j + h + 2], 0x7632);
          }
#pragma unroll
          for (int nc = 0; nc < NC; ++nc) {
            const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&ch.wv[nc][0]);
            const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&ch.wv[nc][1]);
            const int sh = 8 * h;
            const uint32_t a0 = dequant(w0[j] >> sh, ch.s2[nc][0], ch.b2[nc][0]);
            const uint32_t a1 = dequant(w1[j] >> sh, ch.s2[nc][1], ch.b2[nc][1]);
            const uint32_t a2 = dequant(w0[j] >> (sh + 4), ch.s2[nc][0], ch.b2[nc][0]);
            const uint32_t a3 = dequant(w1[j] >> (sh + 4), ch.s2[nc][1], ch.b2[nc][1]);
#pragma unroll
            for (int i = 0; i < TILES; ++i) {
              float* d = acc[nc][i];
              if (F16) {
                asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(xb[i][0]), "r"(xb[i][1]));
              } else {
                asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(xb[i][0]), "r"(xb[i][1]));
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      cur[u] = nxt[u];
    }
  }
  // acc[nc][i] = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}: column n0 + 16nc + g (+8),
  // batch row 8i + 2t (+1).
#pragma unroll
  for (int nc = 0; nc < NC; ++nc) {
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        part[warp][16 * nc + g + 8 * (e >> 1)][8 * i + 2 * t + (e & 1)] = acc[nc][i][e];
      }
    }
  }
  __syncthreads();
  if (GATED) {  // column p of the block's outputs: gate at tile row p % 8, up 8 rows below
    for (int idx = threadIdx.x; idx < TC * 8 * TILES; idx += NT) {
      const int p = idx / (8 * TILES);
      const int m = idx - p * (8 * TILES);
      const int col = 16 * (p >> 3) + (p & 7);
      if (m < M && n0 + p < NO) {
        float gs = 0.0f;
        float us = 0.0f;
#pragma unroll
        for (int k = 0; k < S; ++k) {
          gs += part[k][col][m];
          us += part[k][col + 8][m];
        }
        const float a = static_cast<float>(static_cast<T>(gs));
        locals_store(out, size_t(m) * NO + n0 + p, a / (1.0f + expf(-a)) * static_cast<float>(static_cast<T>(us)));
      }
    }
    return;
  }
  for (int idx = threadIdx.x; idx < 16 * NC * 8 * TILES; idx += NT) {
    const int col = idx / (8 * TILES);
    const int m = idx - col * (8 * TILES);
    const int n = n0 + col;
    if (m < M && n < N) {
      float v = 0.0f;
#pragma unroll
      for (int k = 0; k < S; ++k) {
        v += part[k][col][m];
      }
      // out is float (partial sums, KS > 1) or T: the overloads in CUDA_MMA_HEADER.
      locals_store(out, KS > 1 ? (size_t(split) * M + m) * N + n : size_t(m) * N + n, v);
    }
  }
#if QMMA_ADD_NORM
  // The last block to finish adds d to the residual stream and normalizes each row.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int* c = const_cast<unsigned int*>(count);
    last = atomicAdd(c, 1u) == gridDim.x - 1;
    if (last) {
      *c = 0u;
    }
  }
  __syncthreads();
  if (!last) {
    return;
  }
  __threadfence();
  const float e = eps[0];
  // A warp a row: its lane holds TV groups of eight values (TV = N / 256 rounded up), all
  // loaded before any is used, since one block does this while the others have finished.
  for (int m = warp; m < M; m += S) {
    const size_t row = size_t(m) * N;
    uint4 dv[TV];
    uint4 hv[TV];
#pragma unroll
    for (int it = 0; it < TV; ++it) {
      const int i = 8 * lane + 256 * it;
      if (i < N) {
        dv[it] = locals_load_l2(out + row + i);
        hv[it] = *reinterpret_cast<const uint4*>(res + row + i);
      }
    }
    float q = 0.0f;
#pragma unroll
    for (int it = 0; it < TV; ++it) {
      if (8 * lane + 256 * it < N) {
        hv[it] = locals_add_sq<T>(hv[it], dv[it], &q);
      }
    }
#pragma unroll
    for (int it = 0; it < TV; ++it) {  // the norm's weights, in flight while the sums meet
      const int i = 8 * lane + 256 * it;
      if (i < N) {
        dv[it] = *reinterpret_cast<const uint4*>(nw + i);
      }
    }
    q = locals_warp_sum(q);
    const float inv = rsqrtf(q / float(N) + e);
#pragma unroll
    for (int it = 0; it < TV; ++it) {
      const int i = 8 * lane + 256 * it;
      if (i < N) {
        *reinterpret_cast<uint4*>(h + row + i) = hv[it];
        *reinterpret_cast<uint4*>(xn + row + i) = locals_norm8<T>(hv[it], dv[it], inv);
      }
    }
  }
#endif
"""

# The K-split kernel's second half: out (M, N) = the KS partial sums (KS, M, N) added in order.
CUDA_KSUM_SOURCE = r"""
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t mn = size_t(p_shape[1]) * p_shape[2];
  if (i < mn) {
    float v = 0.0f;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      v += p[s * mn + i];
    }
    out[i] = static_cast<T>(v);
  }
"""

# MLX caches compiled kernels by name, so the names carry a hash of the sources.
MMA_TAG = source_tag(CUDA_MMA_HEADER, CUDA_MMA_SOURCE, CUDA_KSUM_SOURCE)


def _kernel(variant: str):
    """The JIT kernel for "qmma", "qmman" (with the residual add and norm) or "ksum", built once per process."""
    if variant == "ksum":
        return jit_kernel("cuda", f"locals_ksum_{MMA_TAG}", CUDA_KSUM_SOURCE, ["p"], ["out"])
    norm = variant == "qmman"
    return jit_kernel("cuda", f"locals_{variant}_{MMA_TAG}", CUDA_MMA_SOURCE,
                      ["x", "w", "scales", "biases"] + (["res", "nw", "eps", "count"] if norm else []),
                      ["out"] + (["h", "xn"] if norm else []),
                      header=("#define QMMA_ADD_NORM 1\n" if norm else "") + CUDA_MMA_HEADER)


def launch(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, *, cols: int, threads: int,
           unroll: int, k_split: int, group_size: int, gated: bool = False,
           add_norm: tuple[mx.array, ...] | None = None) -> list[mx.array]:
    """[d = x @ dequantize(w).T] for x (rows, K); with `gated`, w is [gate | up] (2I, K) and the
    output silu(gate) * up (rows, I). With `add_norm` = (res, nw, eps, count):
    [d, h = res + d, rms_norm(h) * nw] (k_split 1 only; count a uint32 zero that only this
    layer's launches use, one after another)."""
    rows, n = x.shape[0], w.shape[0]
    if add_norm is not None and (k_split > 1 or n % 8):
        raise ValueError("the residual add and norm take one block per column tile and N a multiple of 8")
    if gated and (k_split > 1 or add_norm is not None or n % 2):
        raise ValueError("the gated output takes one block per column tile, no add + norm, and an even N")
    template = [("T", x.dtype), ("MB", tensor_tile(rows)), ("NC", cols // 16), ("NT", threads),
                ("GS", group_size), ("F16", x.dtype == mx.float16), ("U", unroll), ("KS", k_split), ("GATED", gated)]
    if add_norm is not None:  # the finishing block's eight-value groups per lane
        template.append(("TV", -(-n // 256)))
    partial = k_split > 1
    outs = 1 if add_norm is None else 3
    result = _kernel("qmma" if add_norm is None else "qmman")(
        inputs=[x, w, scales, biases, *(add_norm or ())], template=template,
        grid=(-(-n // cols) * threads * k_split, 1, 1), threadgroup=(threads, 1, 1),
        output_shapes=[(k_split, rows, n) if partial else (rows, n // 2 if gated else n)] * outs,
        output_dtypes=[mx.float32 if partial else x.dtype] * outs,
    )
    if partial:
        return [_kernel("ksum")(
            inputs=[result[0]], template=[("T", x.dtype), ("KS", k_split)],
            grid=(-(-rows * n // 256) * 256, 1, 1), threadgroup=(256, 1, 1),
            output_shapes=[(rows, n)], output_dtypes=[x.dtype],
        )[0]]
    return list(result)
