/* gpu/gpu_kernels.cu - the fused store and load kernels and their launchers,
 * which the C side (gpu_store.c, gpu_load.c) calls through kvt_gpu_layout.h
 * (the runtime wrappers are in gpu_runtime.cu, the checksum kernels in
 * gpu_checksum.cu).
 *
 * The arithmetic is serde/FORMAT.md section 4's (the quantization in
 * codec_device.cuh, shared with the attention cache writer), written with explicit
 * round-to-nearest intrinsics (__fmul_rn, __fadd_rn, __fdiv_rn) so nvcc can
 * neither contract into FMA nor approximate a division: each value equals the
 * CPU reference codec's bit for bit. The element conversions are the ones
 * tests/test_gpu_convert.c checks against the CPU on all 2^32 inputs.
 *
 * Work split: one grid row (blockIdx.y) per section; within it, units that
 * need a reduction (a scale over a row or a block of rows, an i4 group along
 * head dim) go to a sub-warp of R lanes (R a power of two, up to 32, covering
 * a head_dim row in chunks of C elements); everything else is one thread per
 * chunk of C consecutive elements of a (token, head) row. C is 8 (16-byte
 * engine accesses; 16 for stores and 32 or 16 for loads of quantized
 * sections, so each PCIe request of a warp is larger) when sizes and
 * alignment allow, else 2 or 1. */
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "codec_device.cuh"
#include "kvt_gpu_layout.h"
#include "kvtier/codec.h"
#include "kvtier/error.h"

#define THREADS 256

/* ---- elements ---- */

template <int DT> __device__ __forceinline__ float h2f(uint16_t h) {
  if (DT == KVT_DTYPE_BF16)
    return __uint_as_float((uint32_t)h << 16);
  return __half2float(__ushort_as_half(h));
}

template <int DT> __device__ __forceinline__ uint16_t f2h(float f) {
  if (DT == KVT_DTYPE_BF16)
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  return __half_as_ushort(__float2half_rn(f));
}

/* C consecutive 16-bit elements, as raw bits. */
template <int C> struct vec16 {
  uint16_t h[C];
};

template <int C> __device__ __forceinline__ vec16<C> ld16(const uint16_t *p) {
  vec16<C> v;
  if (C >= 8) {
#pragma unroll
    for (int i = 0; i < C / 8; i++) {
      uint4 u = reinterpret_cast<const uint4 *>(p)[i];
      memcpy(v.h + 8 * i, &u, 16);
    }
  } else if (C == 2) {
    uint32_t u = *reinterpret_cast<const uint32_t *>(p);
    memcpy(v.h, &u, 4);
  } else {
    v.h[0] = *p;
  }
  return v;
}

template <int C> __device__ __forceinline__ void st16(uint16_t *p, const vec16<C> &v) {
  if (C >= 8) {
#pragma unroll
    for (int i = 0; i < C / 8; i++) {
      uint4 u;
      memcpy(&u, v.h + 8 * i, 16);
      reinterpret_cast<uint4 *>(p)[i] = u;
    }
  } else if (C == 2) {
    uint32_t u;
    memcpy(&u, v.h, 4);
    *reinterpret_cast<uint32_t *>(p) = u;
  } else {
    *p = v.h[0];
  }
}

/* N bytes (1, 2, 4, 8 or a multiple of 16) at an N-aligned (at most
 * 16-aligned) address. */
template <int N> __device__ __forceinline__ void st_bytes(uint8_t *p, const uint8_t *b) {
  if (N >= 16) {
#pragma unroll
    for (int i = 0; i < N / 16; i++) {
      uint4 u;
      memcpy(&u, b + 16 * i, 16);
      reinterpret_cast<uint4 *>(p)[i] = u;
    }
  } else if (N == 8) {
    uint2 u;
    memcpy(&u, b, 8);
    *reinterpret_cast<uint2 *>(p) = u;
  } else if (N == 4) {
    uint32_t u;
    memcpy(&u, b, 4);
    *reinterpret_cast<uint32_t *>(p) = u;
  } else if (N == 2) {
    uint16_t u;
    memcpy(&u, b, 2);
    *reinterpret_cast<uint16_t *>(p) = u;
  } else {
    *p = b[0];
  }
}

template <int N> __device__ __forceinline__ void ld_bytes(const uint8_t *p, uint8_t *b) {
  if (N >= 16) {
#pragma unroll
    for (int i = 0; i < N / 16; i++) {
      uint4 u = reinterpret_cast<const uint4 *>(p)[i];
      memcpy(b + 16 * i, &u, 16);
    }
  } else if (N == 8) {
    uint2 u = *reinterpret_cast<const uint2 *>(p);
    memcpy(b, &u, 8);
  } else if (N == 4) {
    uint32_t u = *reinterpret_cast<const uint32_t *>(p);
    memcpy(b, &u, 4);
  } else if (N == 2) {
    uint16_t u = *reinterpret_cast<const uint16_t *>(p);
    memcpy(b, &u, 2);
  } else {
    b[0] = *p;
  }
}

__device__ __forceinline__ float ld_f32(const uint8_t *p) {
  return *reinterpret_cast<const float *>(p);
}

/* ---- the formats' arithmetic (FORMAT.md section 4) ----
 * Quantization: codec_device.cuh (scale_for, q_e4m3, q_i8, q_i4, i4_params).
 * Dequantization, which only the load kernels do, follows. */

__device__ __forceinline__ float dq_e4m3(uint8_t b) {
  __nv_fp8_e4m3 v;
  v.__x = (__nv_fp8_storage_t)b;
  return (float)v;
}

/* The load kernels' element steps, two elements per instruction where the
 * hardware has it: bit-identical to the scalar forms above (e4m3 -> fp16 is
 * exact, small integers are exact in fp32, and the paired conversions round
 * to nearest even as the single ones do), but a third of the instructions,
 * which the HBM load (bandwidth of device memory, not of PCIe) needs. */
template <int DT> __device__ __forceinline__ uint32_t f2h2(float a, float b) {
  if (DT == KVT_DTYPE_BF16) {
    const __nv_bfloat162 r = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&r);
  }
  const __half2 r = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t *>(&r);
}

/* y[0..C) as C 16-bit elements. */
template <int DT, int C> __device__ __forceinline__ void pack_c(const float *y, vec16<C> &v) {
  if constexpr (C >= 2) {
#pragma unroll
    for (int j = 0; j < C; j += 2) {
      const uint32_t u = f2h2<DT>(y[j], y[j + 1]);
      v.h[j] = (uint16_t)(u & 0xffffu);
      v.h[j + 1] = (uint16_t)(u >> 16);
    }
  } else {
    v.h[0] = f2h<DT>(y[0]);
  }
}

template <int C> __device__ __forceinline__ void dq_e4m3_c(const uint8_t *q, float *y) {
  if constexpr (C >= 2) {
#pragma unroll
    for (int j = 0; j < C; j += 2) {
      const __nv_fp8x2_storage_t pair = (__nv_fp8x2_storage_t)(q[j] | (q[j + 1] << 8));
      const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&hr));
      y[j] = f.x;
      y[j + 1] = f.y;
    }
  } else {
    y[0] = dq_e4m3(q[0]);
  }
}

/* Small integers as floats by their bits (exact): 2^23 + n, minus 2^23. */
__device__ __forceinline__ float u_small(uint32_t n) {
  return __fsub_rn(__uint_as_float(0x4B000000u | n), 8388608.0f);
}

__device__ __forceinline__ float i8_small(uint8_t b) {
  return __fsub_rn(__uint_as_float(0x4B000000u | (uint32_t)(b ^ 0x80u)), 8388736.0f);
}

/* ---- addressing ---- */

/* n / divisor for the launch's fixed divisors (n < 2^32: gpu_layout.c checks). */
__device__ __forceinline__ uint32_t fdq(const kvt_gpu_fdiv &f, uint64_t n) {
  return kvt_gpu_fdiv_q(f, (uint32_t)n);
}

struct sec_ctx {
  uint32_t li, kind, fmt;
  uint8_t *dst;         /* section byte 0 */
  uint64_t size;        /* section bytes */
  uint64_t base;        /* engine address of layout layer's (block 0, off 0, head 0) */
  const int64_t *slots; /* the chunk's slots */
  uint32_t item;        /* the payload's index in its batch (0 unbatched) */
  uint32_t *codes;      /* a batched store: per payload, its first error (NULL) */
};

/* The section of blockIdx.y of the payload at `payload` whose tokens are at
 * `slots` (p's own, or a batched launch's item). */
__device__ __forceinline__ sec_ctx section(const kvt_gpu_kparams &p, uint8_t *payload,
                                           const int64_t *slots) {
  sec_ctx s;
  s.li = p.first + blockIdx.y / 2;
  s.kind = blockIdx.y & 1;
  const uint32_t abs = p.layer_begin + s.li;
  s.fmt = kvt_gpu_sec_fmt(&p, abs, s.kind);
  s.dst = payload + kvt_gpu_sec_offset(&p, s.li, s.kind);
  s.size = kvt_gpu_sec_size(&p, abs, s.kind);
  s.base = p.ptrs[s.kind * p.layout_layers + (abs - p.layout_begin)];
  s.slots = slots;
  s.item = 0;
  s.codes = nullptr;
  return s;
}

__device__ __forceinline__ sec_ctx section(const kvt_gpu_kparams &p) {
  return section(p, p.payload, p.slots);
}

/* The engine row of token t, head h; NULL for a slot outside the cache. */
__device__ __forceinline__ uint16_t *engine_row(const kvt_gpu_kparams &p, const sec_ctx &s,
                                                uint32_t t, uint32_t h) {
  const int64_t slot = s.slots[t];
  if (slot < 0 || (uint64_t)slot >= p.slot_limit)
    return nullptr;
  uint64_t blk, off;
  if (slot < (int64_t)1 << 31) {
    blk = fdq(p.fd_block_size, (uint64_t)slot);
    off = (uint64_t)slot - blk * p.block_size;
  } else {
    blk = (uint64_t)slot / p.block_size;
    off = (uint64_t)slot % p.block_size;
  }
  return reinterpret_cast<uint16_t *>(s.base) + (int64_t)blk * p.stride_block +
         (int64_t)off * p.stride_token + (int64_t)h * p.stride_head;
}

template <int DT, int C> __device__ __forceinline__ void load_x(const uint16_t *row, uint32_t d,
                                                                float *x) {
  if (!row) {
#pragma unroll
    for (int j = 0; j < C; j++)
      x[j] = 0.0f;
    return;
  }
  vec16<C> v = ld16<C>(row + d);
#pragma unroll
  for (int j = 0; j < C; j++)
    x[j] = h2f<DT>(v.h[j]);
}

/* The layer-scale maximum of this CTA's section (of its payload, in a
 * batched store: one per section of each payload). */
__device__ __forceinline__ float *amax_of(const kvt_gpu_kparams &p) {
  return p.amax + (uint64_t)blockIdx.z * gridDim.y + blockIdx.y;
}

__device__ void report(const kvt_gpu_kparams &p, int code, const sec_ctx &s, uint32_t t,
                       uint32_t h, uint32_t d) {
  if (s.codes) /* which payloads of a batch failed: finish seals the others */
    atomicCAS(&s.codes[s.item], 0u, (unsigned)code);
  if (atomicCAS(&p.status->code, 0, code) == 0) {
    p.status->item = s.item;
    p.status->layer = p.layer_begin + s.li;
    p.status->kind = s.kind;
    p.status->token = t;
    p.status->head = h;
    p.status->dim = d;
  }
}

__device__ __forceinline__ uint64_t div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* The divisor head_dim / C (chunks per row) for a kernel instantiated at C. */
template <int C> __device__ __forceinline__ const kvt_gpu_fdiv &cpr_fd(const kvt_gpu_kparams &p) {
  if (C == 16 && p.chunk != 16)
    return p.fd_cpr16;
  if (C == 8 && p.chunk != 8)
    return p.fd_cpr8;
  return p.fd_cpr;
}

/* Splits a chunk index i into its row (token * heads + head) and the first
 * element d of the chunk, then the row into token and head. */
template <int C> __device__ __forceinline__ void split_chunk(const kvt_gpu_kparams &p, uint64_t i,
                                                             uint32_t *row, uint32_t *d,
                                                             uint32_t *t, uint32_t *h) {
  const kvt_gpu_fdiv &fc = cpr_fd<C>(p);
  const uint32_t r = fdq(fc, i);
  *d = ((uint32_t)i - r * fc.div) * C;
  *row = r;
  *t = fdq(p.fd_heads, r);
  *h = r - *t * p.heads;
}

__device__ __forceinline__ uint64_t n_scales(const kvt_gpu_kparams &p) {
  if (p.scale == KVT_SCALE_BLOCK)
    return div_up(p.tokens, p.block) * p.heads;
  if (p.scale == KVT_SCALE_LAYER)
    return 1;
  return (uint64_t)p.tokens * p.heads;
}

__device__ __forceinline__ bool kivi(const kvt_gpu_kparams &p, const sec_ctx &s) {
  return s.kind == 0 && p.k_axis == KVT_AXIS_TOKEN;
}

__device__ __forceinline__ uint64_t n_i4_groups(const kvt_gpu_kparams &p, const sec_ctx &s) {
  if (kivi(p, s))
    return div_up(p.tokens, p.group) * p.heads * p.head_dim;
  return (uint64_t)p.tokens * p.heads * (p.head_dim / p.group);
}

/* Bytes before the codes: scales or i4 parameters, 16-byte aligned. */
__device__ __forceinline__ uint64_t codes_at(const kvt_gpu_kparams &p, const sec_ctx &s) {
  if (s.fmt == KVT_FMT_E4M3 || s.fmt == KVT_FMT_I8)
    return kvt_gpu_align(4 * n_scales(p), 16);
  if (s.fmt == KVT_FMT_I4)
    return kvt_gpu_align(4 * n_i4_groups(p, s), 16);
  return 0;
}

/* Sub-warp width: lanes that share one head_dim row. */
__device__ __forceinline__ uint32_t row_lanes(uint32_t chunks) {
  if (chunks >= 32)
    return 32;
  return chunks <= 1 ? 1 : 1u << (32 - __clz(chunks - 1));
}

__device__ __forceinline__ float sub_max(float v, uint32_t R) {
  for (uint32_t o = 1; o < R; o <<= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float sub_min(float v, uint32_t R) {
  for (uint32_t o = 1; o < R; o <<= 1)
    v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* ---- store ---- */

/* Zero padding owned by a section: the gap before its codes and the gap up
 * to the next section (none after the payload's last section). */
__device__ void store_padding(const kvt_gpu_kparams &p, const sec_ctx &s) {
  if (blockIdx.x != 0 || threadIdx.x >= 64)
    return;
  const uint64_t ca = codes_at(p, s);
  uint64_t pre = 0;
  if (s.fmt == KVT_FMT_E4M3 || s.fmt == KVT_FMT_I8)
    pre = 4 * n_scales(p);
  else if (s.fmt == KVT_FMT_I4)
    pre = 4 * n_i4_groups(p, s);
  if (pre + threadIdx.x < ca)
    s.dst[pre + threadIdx.x] = 0;
  const bool last = s.li + 1 == p.payload_layers && s.kind == 1;
  if (!last && s.size + threadIdx.x < kvt_gpu_align(s.size, 64))
    s.dst[s.size + threadIdx.x] = 0;
}

/* Chunks a thread of store_n16 has in flight: with one, a thread waits a
 * whole memory round trip per 16 bytes. Four: sealed stores of raw into
 * device memory 4-14% faster on an H200 (bench/results/gpu_n16_unroll_h200.txt);
 * the same unrolling of the load's n16 rows was 7-27% slower there, and
 * slowed the other formats' load kernels (more registers), so the load
 * keeps load_rows. */
#define N16_UNROLL 4

template <int DT, int C> __device__ void store_n16(const kvt_gpu_kparams &p, const sec_ctx &s) {
  const uint32_t cpr = p.head_dim / C;
  const uint64_t n = (uint64_t)p.tokens * p.heads * cpr;
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  uint16_t *out = reinterpret_cast<uint16_t *>(s.dst);
  for (uint64_t i0 = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < n;
       i0 += N16_UNROLL * stride) {
    vec16<C> v[N16_UNROLL];
    uint64_t at[N16_UNROLL];
#pragma unroll
    for (int u = 0; u < N16_UNROLL; u++) {
      const uint64_t i = i0 + u * stride;
      if (i >= n)
        break;
      uint32_t row, d, t, h;
      split_chunk<C>(p, i, &row, &d, &t, &h);
      const uint16_t *src = engine_row(p, s, t, h);
      if (src)
        v[u] = ld16<C>(src + d);
      else
#pragma unroll
        for (int j = 0; j < C; j++)
          v[u].h[j] = 0;
      at[u] = (uint64_t)row * p.head_dim + d;
    }
#pragma unroll
    for (int u = 0; u < N16_UNROLL; u++)
      if (i0 + u * stride < n)
        st16<C>(out + at[u], v[u]);
  }
}

/* Quantizes C elements with one inv into codes[]. */
template <int C> __device__ __forceinline__ void quant_c(int fmt, const float *x, float inv,
                                                       uint8_t *codes) {
#pragma unroll
  for (int j = 0; j < C; j++)
    codes[j] = fmt == KVT_FMT_E4M3 ? q_e4m3(x[j], inv) : q_i8(x[j], inv);
}

/* e4m3/i8 with one scale per token or per block of tokens, per head: a
 * sub-warp per (span, head) unit: amax over the span, then quantize. */
template <int DT, int C> __device__ void store_scaled(const kvt_gpu_kparams &p,
                                                      const sec_ctx &s) {
  const uint32_t cpr = p.head_dim / C, R = row_lanes(cpr), per_warp = 32 / R;
  const uint32_t lane = threadIdx.x & 31, sub = lane % R;
  const uint32_t span = p.scale == KVT_SCALE_TOKEN ? 1 : p.block;
  const uint64_t units = div_up(p.tokens, span) * p.heads;
  const float qmax = s.fmt == KVT_FMT_E4M3 ? 448.0f : 127.0f;
  uint8_t *codes = s.dst + codes_at(p, s);
  const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32;
  for (uint64_t u0 = warp * per_warp; u0 < units; u0 += nwarps * per_warp) {
    const uint64_t u = u0 + lane / R;
    const bool active = u < units;
    const uint32_t uh = fdq(p.fd_heads, u);
    const uint32_t h = active ? (uint32_t)u - uh * p.heads : 0;
    const uint32_t t0 = active ? uh * span : 0;
    const uint32_t t1 = active ? min(p.tokens, t0 + span) : 0;
    float m = 0.0f;
    int bad_t = -1, bad_d = 0;
    for (uint32_t t = t0; t < t1; t++) {
      const uint16_t *row = engine_row(p, s, t, h);
      for (uint32_t c = sub; c < cpr; c += R) {
        float x[C];
        load_x<DT, C>(row, c * C, x);
#pragma unroll
        for (int j = 0; j < C; j++) {
          if (!isfinite(x[j]) && bad_t < 0) {
            bad_t = (int)t;
            bad_d = (int)(c * C + j);
          }
          m = fmaxf(m, fabsf(x[j]));
        }
      }
    }
    m = sub_max(m, R);
    if (bad_t >= 0)
      report(p, KVT_ENONFINITE, s, (uint32_t)bad_t, h, (uint32_t)bad_d);
    if (!active)
      continue;
    float scale, inv;
    scale_for(m, qmax, &scale, &inv);
    if (sub == 0)
      *reinterpret_cast<float *>(s.dst + 4 * u) = scale; /* [span][head] order is u's */
    for (uint32_t t = t0; t < t1; t++) {
      const uint16_t *row = engine_row(p, s, t, h);
      uint8_t *out = codes + ((uint64_t)t * p.heads + h) * p.head_dim;
      for (uint32_t c = sub; c < cpr; c += R) {
        float x[C];
        uint8_t q[C];
        load_x<DT, C>(row, c * C, x);
        quant_c<C>(s.fmt, x, inv, q);
        st_bytes<C>(out + c * C, q);
      }
    }
  }
}

/* e4m3/i8 with one scale per layer: amax from the pre-pass; per chunk. */
template <int DT, int C> __device__ void store_layer_scaled(const kvt_gpu_kparams &p,
                                                            const sec_ctx &s) {
  const float qmax = s.fmt == KVT_FMT_E4M3 ? 448.0f : 127.0f;
  float scale, inv;
  scale_for(*amax_of(p), qmax, &scale, &inv);
  if (blockIdx.x == 0 && threadIdx.x == 0)
    *reinterpret_cast<float *>(s.dst) = scale;
  uint8_t *codes = s.dst + codes_at(p, s);
  const uint32_t cpr = p.head_dim / C;
  const uint64_t n = (uint64_t)p.tokens * p.heads * cpr;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint32_t row, d, t, h;
    split_chunk<C>(p, i, &row, &d, &t, &h);
    float x[C];
    uint8_t q[C];
    load_x<DT, C>(engine_row(p, s, t, h), d, x);
    quant_c<C>(s.fmt, x, inv, q);
    st_bytes<C>(codes + (uint64_t)row * p.head_dim + d, q);
  }
}

template <int C> __device__ __forceinline__ void pack_i4(const float *x, const float *zero,
                                                       const float *inv, uint8_t *nib) {
#pragma unroll
  for (int j = 0; j < C / 2; j++)
    nib[j] = (uint8_t)(q_i4(x[2 * j], zero[2 * j], inv[2 * j]) |
                       (q_i4(x[2 * j + 1], zero[2 * j + 1], inv[2 * j + 1]) << 4));
}

/* i4 groups of G along head dim: a sub-warp per (token, head) row. When a
 * group's chunks are a power of two dividing the sub-warp, its lanes reduce
 * by shuffles; otherwise each lane walks whole groups alone. */
template <int DT, int C> __device__ void store_i4_dim(const kvt_gpu_kparams &p,
                                                      const sec_ctx &s) {
  const uint32_t D = p.head_dim, G = p.group, NG = D / G, cpr = D / C, cpg = G / C;
  const uint32_t R = row_lanes(cpr), per_warp = 32 / R;
  const bool shuffled = (cpg & (cpg - 1)) == 0 && cpg <= R;
  const uint32_t lane = threadIdx.x & 31, sub = lane % R;
  const uint64_t rows = (uint64_t)p.tokens * p.heads;
  uint8_t *params = s.dst, *codes = s.dst + codes_at(p, s);
  const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32;
  for (uint64_t r0 = warp * per_warp; r0 < rows; r0 += nwarps * per_warp) {
    const uint64_t r = r0 + lane / R;
    const bool active = r < rows;
    const uint32_t rt = fdq(p.fd_heads, r);
    const uint32_t t = active ? rt : 0;
    const uint32_t h = active ? (uint32_t)r - rt * p.heads : 0;
    const uint16_t *row = active ? engine_row(p, s, t, h) : nullptr;
    if (shuffled) {
      for (uint32_t c0 = 0; c0 < cpr; c0 += R) { /* uniform within the warp: cpr is */
        const uint32_t c = c0 + sub;
        const bool on = active && c < cpr;
        float x[C], mn = INFINITY, mx = -INFINITY;
        load_x<DT, C>(on ? row : nullptr, on ? c * C : 0, x);
        int bad = -1;
#pragma unroll
        for (int j = 0; j < C; j++) {
          if (on && !isfinite(x[j]) && bad < 0)
            bad = (int)(c * C + j);
          mn = fminf(mn, x[j]);
          mx = fmaxf(mx, x[j]);
        }
        if (!on) {
          mn = INFINITY;
          mx = -INFINITY;
        }
        mn = sub_min(mn, cpg);
        mx = sub_max(mx, cpg);
        if (bad >= 0)
          report(p, KVT_ENONFINITE, s, t, h, (uint32_t)bad);
        if (!on)
          continue;
        uint32_t packed = 0;
        float zero = 0.0f, inv = 0.0f;
        if (!i4_params<true>(mn, mx, &packed, &zero, &inv)) {
          report(p, KVT_ERANGE, s, t, h, (c / cpg) * G);
          continue;
        }
        if (c % cpg == 0)
          *reinterpret_cast<uint32_t *>(params + 4 * (r * NG + c / cpg)) = packed;
        float zs[C], is[C];
        uint8_t nib[C / 2 > 0 ? C / 2 : 1];
#pragma unroll
        for (int j = 0; j < C; j++) {
          zs[j] = zero;
          is[j] = inv;
        }
        pack_i4<C>(x, zs, is, nib);
        st_bytes<C / 2>(codes + (r * D + c * C) / 2, nib);
      }
      continue;
    }
    if (!active)
      continue;
    for (uint32_t g = sub; g < NG; g += R) {
      float mn = INFINITY, mx = -INFINITY;
      int bad = -1;
      for (uint32_t c = g * cpg; c < (g + 1) * cpg; c++) {
        float x[C];
        load_x<DT, C>(row, c * C, x);
#pragma unroll
        for (int j = 0; j < C; j++) {
          if (!isfinite(x[j]) && bad < 0)
            bad = (int)(c * C + j);
          mn = fminf(mn, x[j]);
          mx = fmaxf(mx, x[j]);
        }
      }
      if (bad >= 0) {
        report(p, KVT_ENONFINITE, s, t, h, (uint32_t)bad);
        continue;
      }
      uint32_t packed;
      float zero, inv;
      if (!i4_params<true>(mn, mx, &packed, &zero, &inv)) {
        report(p, KVT_ERANGE, s, t, h, g * G);
        continue;
      }
      *reinterpret_cast<uint32_t *>(params + 4 * (r * NG + g)) = packed;
      float zs[C], is[C];
#pragma unroll
      for (int j = 0; j < C; j++) {
        zs[j] = zero;
        is[j] = inv;
      }
      for (uint32_t c = g * cpg; c < (g + 1) * cpg; c++) {
        float x[C];
        uint8_t nib[C / 2 > 0 ? C / 2 : 1];
        load_x<DT, C>(row, c * C, x);
        pack_i4<C>(x, zs, is, nib);
        st_bytes<C / 2>(codes + (r * D + c * C) / 2, nib);
      }
    }
  }
}

/* i4 keys grouped along tokens (KIVI): one thread per (token group, head,
 * chunk of C channels); each channel has its own parameters. */
template <int DT, int C> __device__ void store_i4_tok(const kvt_gpu_kparams &p,
                                                      const sec_ctx &s) {
  const uint32_t D = p.head_dim, G = p.group, cpr = D / C;
  const uint64_t n = div_up(p.tokens, G) * p.heads * cpr;
  uint8_t *params = s.dst, *codes = s.dst + codes_at(p, s);
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    const uint32_t gh = fdq(cpr_fd<C>(p), i); /* (token group, head) */
    const uint32_t c = (uint32_t)i - gh * cpr, gt = fdq(p.fd_heads, gh), h = gh - gt * p.heads;
    const uint32_t t0 = gt * G, t1 = min(p.tokens, t0 + G);
    float mn[C], mx[C], zs[C], is[C];
#pragma unroll
    for (int j = 0; j < C; j++) {
      mn[j] = INFINITY;
      mx[j] = -INFINITY;
    }
    bool bad = false;
    for (uint32_t t = t0; t < t1 && !bad; t++) {
      float x[C];
      load_x<DT, C>(engine_row(p, s, t, h), c * C, x);
#pragma unroll
      for (int j = 0; j < C; j++) {
        if (!isfinite(x[j]) && !bad) {
          bad = true;
          report(p, KVT_ENONFINITE, s, t, h, c * C + j);
        }
        mn[j] = fminf(mn[j], x[j]);
        mx[j] = fmaxf(mx[j], x[j]);
      }
    }
    if (bad)
      continue;
    uint32_t packed[C];
    for (int j = 0; j < C && !bad; j++)
      if (!i4_params<true>(mn[j], mx[j], &packed[j], &zs[j], &is[j])) {
        bad = true;
        report(p, KVT_ERANGE, s, t0, h, c * C + j);
      }
    if (bad)
      continue;
    uint32_t *pp = reinterpret_cast<uint32_t *>(params + 4 * (gh * D + c * C));
#pragma unroll
    for (int j = 0; j < C; j++)
      pp[j] = packed[j];
    for (uint32_t t = t0; t < t1; t++) {
      float x[C];
      uint8_t nib[C / 2 > 0 ? C / 2 : 1];
      load_x<DT, C>(engine_row(p, s, t, h), c * C, x);
      pack_i4<C>(x, zs, is, nib);
      st_bytes<C / 2>(codes + (((uint64_t)t * p.heads + h) * D + c * C) / 2, nib);
    }
  }
}

/* What a launch takes besides p: nothing, or a batch's items (payload
 * blockIdx.z's address and slots). */
template <bool B> struct launch_items {};
template <> struct launch_items<true> {
  kvt_gpu_items v;
};

/* The section of this CTA: of p's payload, or of its batch item's. */
template <bool B>
__device__ __forceinline__ sec_ctx section_of(const kvt_gpu_kparams &p,
                                              const launch_items<B> &items) {
  if constexpr (B) {
    const kvt_gpu_item &it = items.v.it[blockIdx.z];
    sec_ctx s = section(p, it.payload, it.slots);
    s.item = items.v.base + blockIdx.z;
    s.codes = items.v.codes;
    return s;
  }
  (void)items;
  return section(p);
}

template <int DT, int C, bool B> __global__ void __launch_bounds__(THREADS)
    store_kernel(const kvt_gpu_kparams p, const launch_items<B> items) {
  const sec_ctx s = section_of(p, items);
  store_padding(p, s);
  switch (s.fmt) {
  case KVT_FMT_N16:
    store_n16<DT, (C > 8 ? 8 : C)>(p, s); /* 32 bytes a thread is too many for n16 */
    break;
  case KVT_FMT_E4M3:
  case KVT_FMT_I8:
    if (p.scale == KVT_SCALE_LAYER)
      store_layer_scaled<DT, C>(p, s);
    else
      store_scaled<DT, C>(p, s);
    break;
  default:
    if constexpr (C >= 2) {
      if (kivi(p, s))
        store_i4_tok<DT, C>(p, s);
      else
        store_i4_dim<DT, C>(p, s);
    }
    break;
  }
}

/* Layer-scale pre-pass: the largest |x| of each e4m3/i8 section into
 * p.amax[section] (zeroed before), by atomicMax on the bits of non-negative
 * floats (their order is the integers' order). */
template <int DT, int C, bool B> __global__ void __launch_bounds__(THREADS)
    amax_kernel(const kvt_gpu_kparams p, const launch_items<B> items) {
  const sec_ctx s = section_of(p, items);
  if (s.fmt != KVT_FMT_E4M3 && s.fmt != KVT_FMT_I8)
    return;
  const uint32_t cpr = p.head_dim / C;
  const uint64_t n = (uint64_t)p.tokens * p.heads * cpr;
  float m = 0.0f;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint32_t row, d, t, h;
    split_chunk<C>(p, i, &row, &d, &t, &h);
    float x[C];
    load_x<DT, C>(engine_row(p, s, t, h), d, x);
#pragma unroll
    for (int j = 0; j < C; j++) {
      if (!isfinite(x[j]))
        report(p, KVT_ENONFINITE, s, t, h, d + j);
      m = fmaxf(m, fabsf(x[j]));
    }
  }
  m = sub_max(m, 32);
  if ((threadIdx.x & 31) == 0)
    atomicMax(reinterpret_cast<unsigned *>(amax_of(p)), __float_as_uint(m));
}

/* ---- load ---- */

/* The 4C parameter bytes of each lane's chunk (at pp; on: the lane has one),
 * read by the whole warp in 16-byte pieces so that one instruction reads
 * neighbouring lanes' blocks together (one PCIe request, not 32 strided
 * ones), through a warp-private staging area. C >= 4. */
template <int C> __device__ __forceinline__ void ld_params_warp(const uint8_t *pp, bool on,
                                                               uint32_t *pr) {
  constexpr int PB = C / 4; /* pieces per lane */
  __shared__ uint4 stage[THREADS / 32][32 * PB];
  const uint32_t lane = threadIdx.x & 31, w = threadIdx.x / 32;
  const unsigned long long addr = on ? (unsigned long long)(uintptr_t)pp : 0ull;
#pragma unroll
  for (int k = 0; k < PB; k++) {
    const uint32_t owner = (k * 32 + lane) / PB, piece = (k * 32 + lane) % PB;
    const unsigned long long a = __shfl_sync(0xffffffffu, addr, owner);
    if (a)
      stage[w][owner * PB + piece] = reinterpret_cast<const uint4 *>((uintptr_t)a)[piece];
  }
  __syncwarp();
  if (on)
    memcpy(pr, &stage[w][lane * PB], 4 * C);
  __syncwarp();
}

/* i4 keys grouped along tokens: one thread per (token group, head, chunk of
 * C channels) reads the chunk's C parameters once and walks the group's
 * tokens; consecutive threads read consecutive nibble words of one token.
 * The loop is warp-uniform (ld_params_warp is a warp collective). */
template <int DT, int C> __device__ void load_i4_tok(const kvt_gpu_kparams &p,
                                                     const sec_ctx &s) {
  const uint32_t D = p.head_dim, H = p.heads, G = p.group, cpr = D / C;
  const uint64_t groups = div_up(p.tokens, G) * H * cpr;
  /* Small loads split each group's tokens over threads (re-reading its
   * parameters) so that there are enough threads to hide PCIe latency. */
  const uint32_t part =
      p.part ? min(p.part, G) : groups * gridDim.y * gridDim.z < 8192 ? 8 : G;
  const uint32_t parts = (G + part - 1) / part;
  const uint64_t n = groups * parts;
  const uint8_t *codes = s.dst + codes_at(p, s);
  const uint32_t lane = threadIdx.x & 31;
  for (uint64_t i0 = (uint64_t)blockIdx.x * blockDim.x + (threadIdx.x & ~31u); i0 < n;
       i0 += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t i = i0 + lane;
    const bool on = i < n;
    const uint32_t pi = fdq(p.fd_groups, i), gi = (uint32_t)i - pi * (uint32_t)groups;
    const uint32_t gh = fdq(p.fd_cpr, gi); /* neighbours: neighbouring chunks */
    const uint32_t d = (gi - gh * cpr) * C, gt = fdq(p.fd_heads, gh), h = gh - gt * H;
    const uint32_t g0 = gt * G, t0 = g0 + pi * part;
    const uint32_t t1 = on ? min(min(p.tokens, g0 + G), t0 + part) : t0;
    uint32_t pr[C];
    const uint8_t *pp = s.dst + 4 * (gh * D + d);
    if constexpr (C >= 4)
      ld_params_warp<C>(pp, on, pr);
    else if (on)
      ld_bytes<4 * C>(pp, reinterpret_cast<uint8_t *>(pr));
    if (!on)
      continue;
    constexpr int B = C <= 16 ? 8 : 4; /* tokens whose nibbles are read before any is written */
    for (uint32_t tb = t0; tb < t1; tb += B) {
      uint8_t nib[B][C / 2];
#pragma unroll
      for (int b = 0; b < B; b++)
        if (tb + b < t1)
          ld_bytes<C / 2>(codes + (((uint64_t)(tb + b) * H + h) * D + d) / 2, nib[b]);
#pragma unroll
      for (int b = 0; b < B; b++) {
        uint16_t *out = tb + b < t1 ? engine_row(p, s, tb + b, h) : nullptr;
        if (!out)
          continue;
        vec16<C> v;
        float y[C];
#pragma unroll
        for (int j = 0; j < C; j++) {
          const uint32_t q = (nib[b][j / 2] >> (4 * (j & 1))) & 15u;
          const float sc = __half2float(__ushort_as_half((uint16_t)(pr[j] & 0xffffu)));
          const float z = __half2float(__ushort_as_half((uint16_t)(pr[j] >> 16)));
          y[j] = __fadd_rn(__fmul_rn(u_small(q), sc), z);
        }
        pack_c<DT, C>(y, v);
        st16<C>(out + d, v);
      }
    }
  }
}

/* Every other section: one thread per chunk of C elements of a row. */
template <int DT, int C> __device__ void load_rows(const kvt_gpu_kparams &p, const sec_ctx &s) {
  const uint32_t D = p.head_dim, H = p.heads, cpr = D / C;
  const uint64_t n = (uint64_t)p.tokens * H * cpr;
  const uint8_t *src = s.dst;
  const uint8_t *codes = src + codes_at(p, s);
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint32_t row, d, t, h;
    split_chunk<C>(p, i, &row, &d, &t, &h);
    uint16_t *out = engine_row(p, s, t, h);
    if (!out)
      continue;
    vec16<C> v;
    if (s.fmt == KVT_FMT_N16) {
      v = ld16<C>(reinterpret_cast<const uint16_t *>(src) + (uint64_t)row * D + d);
    } else if (s.fmt == KVT_FMT_E4M3 || s.fmt == KVT_FMT_I8) {
      const uint64_t si = p.scale == KVT_SCALE_TOKEN   ? row
                          : p.scale == KVT_SCALE_BLOCK ? (uint64_t)fdq(p.fd_block, t) * H + h
                                                       : 0;
      const float scale = ld_f32(src + 4 * si);
      uint8_t q[C];
      float y[C];
      ld_bytes<C>(codes + (uint64_t)row * D + d, q);
      if (s.fmt == KVT_FMT_E4M3) {
        dq_e4m3_c<C>(q, y);
      } else {
#pragma unroll
        for (int j = 0; j < C; j++)
          y[j] = i8_small(q[j]);
      }
#pragma unroll
      for (int j = 0; j < C; j++)
        y[j] = __fmul_rn(y[j], scale);
      pack_c<DT, C>(y, v);
    } else {
      if constexpr (C >= 2) {
        uint8_t nib[C / 2];
        ld_bytes<C / 2>(codes + ((uint64_t)row * D + d) / 2, nib);
        const uint32_t one = *reinterpret_cast<const uint32_t *>(
            src + 4 * ((uint64_t)row * fdq(p.fd_group, D) + fdq(p.fd_group, d)));
        const float sc = __half2float(__ushort_as_half((uint16_t)(one & 0xffffu)));
        const float z = __half2float(__ushort_as_half((uint16_t)(one >> 16)));
        float y[C];
#pragma unroll
        for (int j = 0; j < C; j++) {
          const uint32_t q = (nib[j / 2] >> (4 * (j & 1))) & 15u;
          y[j] = __fadd_rn(__fmul_rn(u_small(q), sc), z);
        }
        pack_c<DT, C>(y, v);
      }
    }
    st16<C>(out + d, v);
  }
}

template <int DT, int C, bool B> __global__ void __launch_bounds__(THREADS)
    load_kernel(const kvt_gpu_kparams p, const launch_items<B> items) {
  uint8_t *payload = p.payload;
  const int64_t *slots = p.slots;
  const uint32_t *gate = p.gate;
  if constexpr (B) {
    const kvt_gpu_item &it = items.v.it[blockIdx.z];
    payload = it.payload;
    slots = it.slots;
    gate = it.gate;
  }
  if (gate && *gate != ~0u) /* a checksum of these layers did not match */
    return;
  const sec_ctx s = section(p, payload, slots);
  if constexpr (C >= 2) {
    if (s.fmt == KVT_FMT_I4 && kivi(p, s)) {
      load_i4_tok<DT, C>(p, s);
      return;
    }
  }
  if constexpr (C == 32) {
    if (s.fmt == KVT_FMT_N16) { /* 64 bytes a thread is too many for n16 */
      load_rows<DT, 16>(p, s);
      return;
    }
  }
  load_rows<DT, C>(p, s);
}

/* ---- launchers ---- */

/* x CTAs per section (of each of `items` payloads), 8192 CTAs in all at
 * most. */
static dim3 grid_for(const kvt_gpu_kparams *p, uint64_t threads_per_section,
                     uint32_t items = 1) {
  const uint32_t sections = 2 * p->count;
  uint64_t x = (threads_per_section + THREADS - 1) / THREADS;
  const uint64_t all = (uint64_t)sections * items;
  const uint64_t cap = 8192 / all > 0 ? 8192 / all : 1;
  x = x < 1 ? 1 : x > cap ? cap : x;
  return dim3((unsigned)x, sections, items);
}

template <int DT, bool B>
static int launch_store(const kvt_gpu_kparams *p, const launch_items<B> &items, uint32_t n,
                        cudaStream_t st) {
  const uint64_t threads = (uint64_t)p->tokens * p->heads * (p->head_dim / p->chunk);
  const dim3 grid = grid_for(p, threads, n);
  cudaError_t e = cudaSuccess;
  if (!(p->flags & KVT_GPU_KP_KEEP_STATUS) &&
      (e = cudaMemsetAsync(p->status, 0, sizeof(kvt_gpu_status), st)) != cudaSuccess)
    return (int)e;
  const bool scaled = p->fmt[0] == KVT_FMT_E4M3 || p->fmt[0] == KVT_FMT_I8 ||
                      p->fmt[1] == KVT_FMT_E4M3 || p->fmt[1] == KVT_FMT_I8;
  if (scaled && p->scale == KVT_SCALE_LAYER) {
    if ((e = cudaMemsetAsync(p->amax, 0, (size_t)2 * p->count * n * sizeof(float), st)) !=
        cudaSuccess)
      return (int)e;
    if (p->chunk == 16)
      amax_kernel<DT, 16, B><<<grid, THREADS, 0, st>>>(*p, items);
    else if (p->chunk == 8)
      amax_kernel<DT, 8, B><<<grid, THREADS, 0, st>>>(*p, items);
    else if (p->chunk == 2)
      amax_kernel<DT, 2, B><<<grid, THREADS, 0, st>>>(*p, items);
    else
      amax_kernel<DT, 1, B><<<grid, THREADS, 0, st>>>(*p, items);
  }
  if (p->chunk == 16)
    store_kernel<DT, 16, B><<<grid, THREADS, 0, st>>>(*p, items);
  else if (p->chunk == 8)
    store_kernel<DT, 8, B><<<grid, THREADS, 0, st>>>(*p, items);
  else if (p->chunk == 2)
    store_kernel<DT, 2, B><<<grid, THREADS, 0, st>>>(*p, items);
  else
    store_kernel<DT, 1, B><<<grid, THREADS, 0, st>>>(*p, items);
  return (int)cudaGetLastError();
}

template <int DT, bool B>
static int launch_load(const kvt_gpu_kparams *p, const launch_items<B> &items, uint32_t n,
                       cudaStream_t st) {
  const uint64_t threads = (uint64_t)p->tokens * p->heads * (p->head_dim / p->chunk);
  const dim3 grid = grid_for(p, threads, n);
  if (p->chunk == 32)
    load_kernel<DT, 32, B><<<grid, THREADS, 0, st>>>(*p, items);
  else if (p->chunk == 16)
    load_kernel<DT, 16, B><<<grid, THREADS, 0, st>>>(*p, items);
  else if (p->chunk == 8)
    load_kernel<DT, 8, B><<<grid, THREADS, 0, st>>>(*p, items);
  else if (p->chunk == 2)
    load_kernel<DT, 2, B><<<grid, THREADS, 0, st>>>(*p, items);
  else
    load_kernel<DT, 1, B><<<grid, THREADS, 0, st>>>(*p, items);
  return (int)cudaGetLastError();
}

extern "C" int kvt_gpurt_store(const kvt_gpu_kparams *p, void *stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const launch_items<false> none;
  return p->dtype == KVT_DTYPE_BF16 ? launch_store<KVT_DTYPE_BF16>(p, none, 1, st)
                                    : launch_store<KVT_DTYPE_F16>(p, none, 1, st);
}

extern "C" int kvt_gpurt_store_batch(const kvt_gpu_kparams *p, const kvt_gpu_items *items,
                                     void *stream) {
  if (!items)
    return kvt_gpurt_store(p, stream);
  if (items->n == 0 || items->n > KVT_GPU_BATCH_MAX)
    return (int)cudaErrorInvalidValue;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  launch_items<true> b;
  b.v = *items;
  return p->dtype == KVT_DTYPE_BF16 ? launch_store<KVT_DTYPE_BF16>(p, b, items->n, st)
                                    : launch_store<KVT_DTYPE_F16>(p, b, items->n, st);
}

extern "C" int kvt_gpurt_load(const kvt_gpu_kparams *p, void *stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const launch_items<false> none;
  return p->dtype == KVT_DTYPE_BF16 ? launch_load<KVT_DTYPE_BF16>(p, none, 1, st)
                                    : launch_load<KVT_DTYPE_F16>(p, none, 1, st);
}

extern "C" int kvt_gpurt_load_batch(const kvt_gpu_kparams *p, const kvt_gpu_items *items,
                                    void *stream) {
  if (!items)
    return kvt_gpurt_load(p, stream);
  if (items->n == 0 || items->n > KVT_GPU_BATCH_MAX)
    return (int)cudaErrorInvalidValue;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  launch_items<true> b;
  b.v = *items;
  return p->dtype == KVT_DTYPE_BF16 ? launch_load<KVT_DTYPE_BF16>(p, b, items->n, st)
                                    : launch_load<KVT_DTYPE_F16>(p, b, items->n, st);
}
