/* gpu/attn_kernels.cu - decode attention over a compressed paged KV cache
 * (kvtier/attn.h) and its cache writer.
 *
 * Decode is flash-decoding on tensor cores. Grid: (split, kv head x head
 * chunk, sequence); a CTA of 4 warps serves up to 8 query heads of one KV
 * head (GQA) over one contiguous slice of the context. Each warp walks its
 * own 16-token tiles of the slice (tiles w, w+4, ...) with its own online
 * softmax state, and the 4 warps are combined through shared memory at the
 * end, so the tile loop has no CTA barrier. INT4 CTAs serve a pair of kv
 * heads where kv_heads is even (kv_group 2: two warps per head, tiles w,
 * w+2, ..., and a barrier per pair of warps; see gpu/attn_int4.cuh).
 *
 * Per tile, with mma.m16n8k16 (fp32 accumulate):
 *   S^T[16 tokens][8 heads] = K[16 tokens][D] . Q^T[D][8 heads]
 *   O^T[D][8 heads]       += V^T[D][16 tokens] . P^T[16 tokens][8 heads]
 * The reduction dimension of each product may be enumerated in any order as
 * long as both operands agree, so each lane's fragments are made to cover
 * whole 16-byte pieces of a row (its "slice"): K and V are read from global
 * memory straight into registers in fragment order with 16-byte loads, whole
 * 32-byte sectors per warp instruction, and dequantized there. 16-bit K
 * needs no conversion at all (the K16V8 point); e4m3 becomes fp16 by the
 * paired hardware conversion and its per-token K scale multiplies the
 * scores, its V scale the converted values. FP8 at head_dim 128 streams
 * its tiles through shared memory first on sm_90 devices of 4 TB/s or more
 * (the staged path, below) and reads them back into the same registers. INT4 has a path of its own (see
 * gpu/attn_int4.cuh): group-pure tiles through shared memory, raw codes into the
 * MMA as fp16 subnormals, scales and zero points applied per group. Keys of
 * e4m3/int4 caches are multiplied with an fp16 copy of q; values of e4m3/int4
 * caches with fp16 probabilities. P goes from the score fragment layout to
 * the operand layout by movmatrix (softmax_tile).
 *
 * Splits write fp32 (normalised output, max, sum) to the workspace and a
 * combine kernel merges them; with one split the CTA writes the output.
 *
 * The writer (gpu/attn_append.cuh) quantizes with serde/FORMAT.md section
 * 4's arithmetic, the store kernels' own (gpu/codec_device.cuh: explicit
 * round-to-nearest intrinsics, no contraction): the codes and scales equal
 * the CPU codec's. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "codec_device.cuh" /* the append's quantization */
#include "kvt_attn_layout.h"
#include "kvtier/attn.h"
#include "kvtier/codec.h"

#define NWARPS KVT_ATTN_WARPS
#define TILE 16
/* Registers of K/V codes a lane loads per loop iteration: more tiles at once
 * for compressed formats, within the 128 registers of 4 CTAs per SM (40: no
 * spills for any format and head_dim, checked with ptxas -v). */
#ifndef KVT_ATTN_LOAD_REGS
#define KVT_ATTN_LOAD_REGS 40
#endif

namespace kvt_attn_dev {

/* ---- formats at compile time ---- */

template <int FMT> struct fmt_traits {
  /* bytes of a K / V row are D * num / den */
  static constexpr int k_num =
      (FMT == KVT_ATTN_RAW || FMT == KVT_ATTN_K16V8) ? 2 : 1;
  static constexpr int k_den = FMT == KVT_ATTN_INT4 ? 2 : 1;
  static constexpr int v_num = FMT == KVT_ATTN_RAW ? 2 : 1;
  static constexpr int v_den = FMT == KVT_ATTN_INT4 ? 2 : 1;
  static constexpr bool k16 = FMT == KVT_ATTN_RAW || FMT == KVT_ATTN_K16V8;
  static constexpr bool v16 = FMT == KVT_ATTN_RAW;
};

template <int N> struct words { uint32_t w[N]; };

/* KVT_ATTN_L2_HINT 128 or 256: K/V loads ask L2 to fetch that many bytes
 * around each miss (ld / cp.async .L2::NB), 0: no hint. The fp8 and 16-bit
 * loads take half a line per instruction (4 lanes x 16 bytes of a row);
 * with 128 raw, K16/V8 and FP8 decode ran 1.5% faster on an H100 (INT4, which
 * copies whole lines, the same), 256 was no better. */
#ifndef KVT_ATTN_L2_HINT
#define KVT_ATTN_L2_HINT 128
#endif

/* N bytes (4, 8 or 16) at an N-aligned address into N/4 words. */
template <int N>
__device__ __forceinline__ void ld_unit(const uint8_t *p, uint32_t *w) {
  if constexpr (N == 16) {
#if KVT_ATTN_L2_HINT == 128
    asm("ld.global.nc.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
        : "l"(p));
#elif KVT_ATTN_L2_HINT == 256
    asm("ld.global.nc.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
        : "l"(p));
#else
    const uint4 u = __ldg(reinterpret_cast<const uint4 *>(p));
    w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
#endif
  } else if constexpr (N == 8) {
    const uint2 u = __ldg(reinterpret_cast<const uint2 *>(p));
    w[0] = u.x, w[1] = u.y;
  } else {
    w[0] = __ldg(reinterpret_cast<const unsigned int *>(p));
  }
}

template <bool BF>
__device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1,
                                         uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  if constexpr (BF)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t h2u(__half2 h) {
  return *reinterpret_cast<uint32_t *>(&h);
}
__device__ __forceinline__ __half2 u2h(uint32_t u) {
  return *reinterpret_cast<__half2 *>(&u);
}

/* Two e4m3 codes (low byte first) as an fp16 pair: exact. */
__device__ __forceinline__ uint32_t e4m3x2_to_h2(uint32_t pair16) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
      (__nv_fp8x2_storage_t)(pair16 & 0xFFFFu), __NV_E4M3);
  return (uint32_t)r.x | ((uint32_t)r.y << 16);
}

/* The upper two e4m3 codes of a word as an fp16 pair: on sm_89 and later
 * the conversion reads the upper half itself (a 16-bit PTX operand; SASS
 * F2FP ... R.H1) instead of after a shift, one instruction less per pair
 * (32 per FP8 tile); before, the library's conversion of the shifted word. */
__device__ __forceinline__ uint32_t e4m3x2_hi_to_h2(uint32_t w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t d;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\n"
      "cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n"
      : "=r"(d)
      : "r"(w));
  return d;
#else /* no e4m3 conversion instruction before sm_89 */
  return e4m3x2_to_h2(w >> 16);
#endif
}

template <int DT> __device__ __forceinline__ float h16_to_f(uint16_t h) {
  if constexpr (DT == KVT_DTYPE_BF16)
    return __uint_as_float((uint32_t)h << 16);
  else
    return __half2float(__ushort_as_half(h));
}

template <int DT> __device__ __forceinline__ uint16_t f_to_h16(float f) {
  if constexpr (DT == KVT_DTYPE_BF16)
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  else
    return __half_as_ushort(__float2half_rn(f));
}

/* Two fp32 as a pair of the MMA's 16-bit type (bf16 when BF). */
template <bool BF>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (BF) {
    const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&r);
  } else {
    return h2u(__floats2half2_rn(lo, hi));
  }
}

/* 2^x, the hardware approximation (relative error about 2^-22; -inf gives
 * 0), without exp2f's scaling around it for subnormal results. */
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* The 8 x 8 matrix of 16-bit values held as an MMA fragment (lane 4 r + c:
 * row r, columns 2c and 2c + 1), transposed. */
__device__ __forceinline__ uint32_t transpose8x8(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n"
               : "=r"(d)
               : "r"(a));
  return d;
}

/* ---- decode ---- */

template <int FMT, int DT, int D> struct geo {
  using tr = fmt_traits<FMT>;
  static constexpr int RBK = D * tr::k_num / tr::k_den; /* bytes of a K row */
  static constexpr int RBV = D * tr::v_num / tr::v_den;
  /* K: lane t (of 4) holds D/4 elements of rows g and g+8, in units of UK
   * bytes at row units t, t+4, ... */
  static constexpr int UK = RBK / 4 < 16 ? RBK / 4 : 16;
  static constexpr int NUK = RBK / 4 / UK;
  static constexpr int EPUK =
      UK * tr::k_den / tr::k_num;     /* elements per unit */
  static constexpr int KW = RBK / 16; /* words per row per lane */
  /* V: lane g (of 8) holds D/8 elements of tokens 2t, 2t+1, 2t+8, 2t+9, in
   * units of UV bytes at row units g, g+8, ... */
  static constexpr int UV = RBV / 8 < 16 ? RBV / 8 : 16;
  static constexpr int NUV = RBV / 8 / UV;
  static constexpr int EPUV = UV * tr::v_den / tr::v_num;
  static constexpr int VW = RBV / 32;
  static constexpr int NT = D / 16; /* k tiles of S, m tiles of O */
  static constexpr bool KBF =
      tr::k16 && DT == KVT_DTYPE_BF16; /* S MMA in bf16 */
  static constexpr bool VBF =
      tr::v16 && DT == KVT_DTYPE_BF16; /* PV MMA in bf16 */
  static_assert(KW >= 1 && VW >= 1, "rows too short");
};

/* Physical dim of element e of a lane's slice. */
template <int EPU, int LANES>
__device__ __forceinline__ int slice_dim(int lane_idx, int e) {
  return (lane_idx + LANES * (e / EPU)) * EPU + e % EPU;
}

/* Loads in flight per warp: each iteration loads U tiles' K and V (up to
 * KVT_ATTN_LOAD_REGS registers of codes per lane) before computing any of
 * them, so compressed formats keep more tiles in flight. Caches whose tile
 * takes more than 64 registers (16-bit, head_dim 256) load V after the
 * scores instead, to stay in registers. */
template <int FMT, int DT, int D> struct plan {
  using G = geo<FMT, DT, D>;
  static constexpr int R =
      2 * G::KW + 4 * G::VW; /* registers of one tile's codes */
  static constexpr int U = R >= KVT_ATTN_LOAD_REGS ? 1
                           : KVT_ATTN_LOAD_REGS / R > 4
                               ? 4
                               : KVT_ATTN_LOAD_REGS / R;
  static constexpr bool early_v = R <= 64;
};

struct tile_addr {
  uint64_t
      row0; /* (page * block_size + offset of tile token 0) * kv_heads + head */
  uint64_t sc0; /* scale index of tile token 0: (page * kv_heads + head) *
                   block_size + offset */
  int last;     /* tile-relative index of the last valid token */
};

/* One tile's codes and scales in registers, in fragment order. */
template <int FMT, int DT, int D> struct tile_regs {
  using G = geo<FMT, DT, D>;
  uint32_t kw[2][G::KW];                 /* rows g, g+8 */
  uint32_t vw[4][G::VW];                 /* tokens 2t, 2t+1, 2t+8, 2t+9 */
  float ks[2], vs[4];                    /* e4m3 scales */
};

/* Q fragments of the S product: per k tile, two registers. */
template <int FMT, int DT, int D>
__device__ __forceinline__ void load_q(const kvt_attn_kparams &p, uint32_t b,
                                       uint32_t qh0, int nheads, int g, int t,
                                       uint32_t (&qb)[geo<FMT, DT, D>::NT][2]) {
  using G = geo<FMT, DT, D>;
  const uint16_t *q = reinterpret_cast<const uint16_t *>(p.q);
  const bool ok = g < nheads;
  const uint16_t *row = q + ((uint64_t)b * p.q_heads + qh0 + (ok ? g : 0)) * D;
#pragma unroll
  for (int j = 0; j < G::NT; j++) {
    const int d = slice_dim<G::EPUK, 4>(t, 4 * j);
    uint2 u = make_uint2(0, 0);
    if (ok)
      u = __ldg(reinterpret_cast<const uint2 *>(row + d));
    if constexpr (fmt_traits<FMT>::k16) {
      qb[j][0] = u.x;
      qb[j][1] = u.y;
    } else {
      qb[j][0] =
          pack2<false>(h16_to_f<DT>(u.x & 0xFFFF), h16_to_f<DT>(u.x >> 16));
      qb[j][1] =
          pack2<false>(h16_to_f<DT>(u.y & 0xFFFF), h16_to_f<DT>(u.y >> 16));
    }
  }
}

template <int FMT, int DT, int D>
__device__ __forceinline__ void load_k(const kvt_attn_kparams &p,
                                       const tile_addr &ta, int g, int t,
                                       tile_regs<FMT, DT, D> &r) {
  using G = geo<FMT, DT, D>;
  const uint8_t *kb = reinterpret_cast<const uint8_t *>(p.k);
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int tok = g + 8 * i, rr = tok < ta.last ? tok : ta.last;
    const uint8_t *row = kb + (ta.row0 + (uint64_t)rr * p.kv_heads) * G::RBK;
#pragma unroll
    for (int u = 0; u < G::NUK; u++)
      ld_unit<G::UK>(row + (t + 4 * u) * G::UK, &r.kw[i][u * (G::UK / 4)]);
    if constexpr (FMT == KVT_ATTN_FP8)
      r.ks[i] = __ldg(reinterpret_cast<const float *>(p.k_scale) + ta.sc0 + rr);
  }
}

template <int FMT, int DT, int D>
__device__ __forceinline__ void load_v(const kvt_attn_kparams &p,
                                       const tile_addr &ta, int g, int t,
                                       tile_regs<FMT, DT, D> &r) {
  using G = geo<FMT, DT, D>;
  const uint8_t *vb = reinterpret_cast<const uint8_t *>(p.v);
#pragma unroll
  for (int i = 0; i < 4;
       i++) { /* tokens 2t, 2t+1, 2t+8, 2t+9, clamped to the last valid */
    const int tok = 2 * t + (i & 1) + 8 * (i >> 1),
              rr = tok < ta.last ? tok : ta.last;
    const uint8_t *row = vb + (ta.row0 + (uint64_t)rr * p.kv_heads) * G::RBV;
#pragma unroll
    for (int u = 0; u < G::NUV; u++)
      ld_unit<G::UV>(row + (g + 8 * u) * G::UV, &r.vw[i][u * (G::UV / 4)]);
    if constexpr (FMT == KVT_ATTN_K16V8 || FMT == KVT_ATTN_FP8)
      r.vs[i] = __ldg(reinterpret_cast<const float *>(p.v_scale) + ta.sc0 + rr);
  }
}

/* Scores of one tile: c[0..3] = S[tok g][head 2t], [tok g][2t+1],
 * [tok g+8][2t], [tok g+8][2t+1], scaled to log2 units, masked. */
template <int FMT, int DT, int D>
__device__ __forceinline__ void
tile_scores(const kvt_attn_kparams &p, const tile_addr &ta, int g,
            const tile_regs<FMT, DT, D> &r,
            const uint32_t (&qb)[geo<FMT, DT, D>::NT][2], float c[4]) {
  using G = geo<FMT, DT, D>;
  c[0] = c[1] = c[2] = c[3] = 0.0f;
  if constexpr (FMT == KVT_ATTN_RAW || FMT == KVT_ATTN_K16V8) {
#pragma unroll
    for (int j = 0; j < G::NT; j++)
      mma16816<G::KBF>(c, r.kw[0][2 * j], r.kw[1][2 * j], r.kw[0][2 * j + 1],
                       r.kw[1][2 * j + 1], qb[j][0], qb[j][1]);
  } else { /* FP8 */
#pragma unroll
    for (int j = 0; j < G::NT; j++)
      mma16816<false>(c, e4m3x2_to_h2(r.kw[0][j]), e4m3x2_to_h2(r.kw[1][j]),
                      e4m3x2_hi_to_h2(r.kw[0][j]),
                      e4m3x2_hi_to_h2(r.kw[1][j]), qb[j][0], qb[j][1]);
    c[0] *= r.ks[0], c[1] *= r.ks[0], c[2] *= r.ks[1], c[3] *= r.ks[1];
  }
  const float sl = p.scale_log2;
  c[0] = g <= ta.last ? c[0] * sl : -INFINITY;
  c[1] = g <= ta.last ? c[1] * sl : -INFINITY;
  c[2] = g + 8 <= ta.last ? c[2] * sl : -INFINITY;
  c[3] = g + 8 <= ta.last ? c[3] * sl : -INFINITY;
}

/* O^T += V^T P^T for one tile, V^T fragments made from the registers. */
template <int FMT, int DT, int D>
__device__ __forceinline__ void tile_pv(const tile_regs<FMT, DT, D> &r, int g,
                                        uint32_t pb0, uint32_t pb1,
                                        float (&o)[geo<FMT, DT, D>::NT][4]) {
  using G = geo<FMT, DT, D>;
  if constexpr (FMT == KVT_ATTN_RAW) {
#pragma unroll
    for (int j = 0; j < G::NT; j++)
      mma16816<G::VBF>(o[j], __byte_perm(r.vw[0][j], r.vw[1][j], 0x5410),
                       __byte_perm(r.vw[0][j], r.vw[1][j], 0x7632),
                       __byte_perm(r.vw[2][j], r.vw[3][j], 0x5410),
                       __byte_perm(r.vw[2][j], r.vw[3][j], 0x7632), pb0, pb1);
  } else if constexpr (FMT == KVT_ATTN_K16V8 || FMT == KVT_ATTN_FP8) {
    const __half2 s01 = __floats2half2_rn(r.vs[0], r.vs[1]);
    const __half2 s89 = __floats2half2_rn(r.vs[2], r.vs[3]);
#pragma unroll
    for (int i = 0; i < G::VW; i++) {
      const uint32_t lo01 = __byte_perm(r.vw[0][i], r.vw[1][i], 0x5140);
      const uint32_t hi01 = __byte_perm(r.vw[0][i], r.vw[1][i], 0x7362);
      const uint32_t lo89 = __byte_perm(r.vw[2][i], r.vw[3][i], 0x5140);
      const uint32_t hi89 = __byte_perm(r.vw[2][i], r.vw[3][i], 0x7362);
      mma16816<false>(o[2 * i], h2u(__hmul2(u2h(e4m3x2_to_h2(lo01)), s01)),
                      h2u(__hmul2(u2h(e4m3x2_hi_to_h2(lo01)), s01)),
                      h2u(__hmul2(u2h(e4m3x2_to_h2(lo89)), s89)),
                      h2u(__hmul2(u2h(e4m3x2_hi_to_h2(lo89)), s89)), pb0,
                      pb1);
      mma16816<false>(o[2 * i + 1], h2u(__hmul2(u2h(e4m3x2_to_h2(hi01)), s01)),
                      h2u(__hmul2(u2h(e4m3x2_hi_to_h2(hi01)), s01)),
                      h2u(__hmul2(u2h(e4m3x2_to_h2(hi89)), s89)),
                      h2u(__hmul2(u2h(e4m3x2_hi_to_h2(hi89)), s89)), pb0,
                      pb1);
    }
  }
}

/* Online softmax over one tile's masked scores c (tile_scores' layout): the
 * running maxima and sums, o (and the NX extra accumulators ex, in o's
 * layout) rescaled, and P returned as the B operand of O^T += V^T P^T
 * (tokens 2t, 2t+1 and 2t+8, 2t+9 of head g). The accumulators are rescaled
 * only when a maximum of the warp moved: after the first tiles it rarely
 * does, and multiplying by exp2(0) = 1 changes nothing. */
template <int NT, int NX, bool VBF>
__device__ __forceinline__ void
softmax_tile(const float c[4], float (&o)[NT][4], float *ex, float &m0,
             float &m1, float &l0, float &l1, uint32_t &pb0, uint32_t &pb1) {
  float mt0 = fmaxf(c[0], c[2]), mt1 = fmaxf(c[1], c[3]);
#pragma unroll
  for (int x = 4; x < 32; x <<= 1) {
    mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, x));
    mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, x));
  }
  const float mn0 = fmaxf(m0, mt0), mn1 = fmaxf(m1, mt1);
  const bool moved = mn0 != m0 || mn1 != m1;
  const float al0 = ex2(m0 - mn0), al1 = ex2(m1 - mn1);
  m0 = mn0, m1 = mn1;
  const float p0 = ex2(c[0] - mn0), p1 = ex2(c[1] - mn1);
  const float p2 = ex2(c[2] - mn0), p3 = ex2(c[3] - mn1);
  l0 = l0 * al0 + (p0 + p2);
  l1 = l1 * al1 + (p1 + p3);
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int j = 0; j < NT; j++) {
      o[j][0] *= al0, o[j][1] *= al1, o[j][2] *= al0, o[j][3] *= al1;
    }
#pragma unroll
    for (int j = 0; j < NX; j++) {
      ex[4 * j + 0] *= al0, ex[4 * j + 1] *= al1;
      ex[4 * j + 2] *= al0, ex[4 * j + 3] *= al1;
    }
  }
  /* P from (token, head) fragments to (head, token) operand pairs: the two
   * 8 x 8 blocks (tokens 0-7, 8-15) transposed in registers */
  pb0 = transpose8x8(pack2<VBF>(p0, p1));
  pb1 = transpose8x8(pack2<VBF>(p2, p3));
}

/* Online softmax over one tile's scores, then O += P V. */
template <int FMT, int DT, int D>
__device__ __forceinline__ void
tile_step(const kvt_attn_kparams &p, const tile_addr &ta, int g, int t,
          tile_regs<FMT, DT, D> &r,
          const uint32_t (&qb)[geo<FMT, DT, D>::NT][2],
          float (&o)[geo<FMT, DT, D>::NT][4], float &m0, float &m1, float &l0,
          float &l1) {
  using G = geo<FMT, DT, D>;
  float c[4];
  tile_scores<FMT, DT, D>(p, ta, g, r, qb, c);
  if constexpr (!plan<FMT, DT, D>::early_v)
    load_v<FMT, DT, D>(p, ta, g, t, r);
  uint32_t pb0, pb1;
  softmax_tile<G::NT, 0, G::VBF>(c, o, nullptr, m0, m1, l0, l1, pb0, pb1);
  tile_pv<FMT, DT, D>(r, g, pb0, pb1, o);
}

/* ---- cp.async (INT4 streams its tiles through shared memory) ---- */
template <int N>
__device__ __forceinline__ void cp_async(void *smem, const void *gmem) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  if constexpr (N == 16)
#if KVT_ATTN_L2_HINT == 128
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(s),
                 "l"(gmem)
                 : "memory");
#elif KVT_ATTN_L2_HINT == 256
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s),
                 "l"(gmem)
                 : "memory");
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s),
                 "l"(gmem)
                 : "memory");
#endif
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s),
                 "l"(gmem), "n"(N)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Where tile ts of sequence table lives. */
__device__ __forceinline__ tile_addr tile_at(const kvt_attn_kparams &p,
                                             const int32_t *table, uint32_t kvh,
                                             int32_t ts, int32_t ce) {
  tile_addr ta;
  const uint32_t page = (uint32_t)__ldg(table + ts / (int32_t)p.block_size);
  const uint32_t off0 = (uint32_t)ts % p.block_size;
  ta.row0 = ((uint64_t)page * p.block_size + off0) * p.kv_heads + kvh;
  ta.sc0 = ((uint64_t)page * p.kv_heads + kvh) * p.block_size + off0;
  ta.last = min(TILE - 1, ce - 1 - ts);
  return ta;
}

/* The pages of a warp's tiles, read from the block table 32 tiles at a
 * time (lane l: the page of tile base + l) and 32 tiles ahead of their use.
 * Tile m of the warp is at token t0 + (m / U) gstride + (m % U) TILE.
 * Reading each tile's entry just before its loads put a dependent global
 * read in front of every tile: ncu showed warps waiting on it more than on
 * the cache itself, even with the entry loaded a tile ahead. Entries past
 * the sequence's last block read that block's instead (never used). */
template <int U> struct page_stream {
  const int32_t *table;
  int32_t t0, gstride, bs, last_idx;
  int base;
  uint32_t cur, nxt;
  __device__ __forceinline__ uint32_t load(int m0, int lane) const {
    const int m = m0 + lane;
    const int32_t tok = t0 + m / U * gstride + m % U * TILE;
    return (uint32_t)__ldg(table + min(tok / bs, last_idx));
  }
  __device__ __forceinline__ void init(const int32_t *tab, int32_t first,
                                       int32_t group_stride, int32_t ce,
                                       int32_t block_size, int lane) {
    table = tab, t0 = first, gstride = group_stride, bs = block_size;
    last_idx = ce > 0 ? (ce - 1) / bs : 0;
    base = 0;
    cur = load(0, lane);
    nxt = load(32, lane);
  }
  /* The page of tile m; m never decreases and is the same in every lane. */
  __device__ __forceinline__ uint32_t page(int m, int lane) {
    if (m >= base + 32) {
      base += 32;
      cur = nxt;
      nxt = load(base + 32, lane);
    }
    return (uint32_t)__shfl_sync(0xffffffffu, cur, m - base);
  }
};

#include "attn_staged.cuh" /* FP8's staged path (see there) */
#include "attn_int4.cuh"   /* the INT4 path (see there) */

#ifdef KVT_ATTN_TRACE
/* Diagnostic build only (-DKVT_ATTN_TRACE for CUDA and C): per decode CTA
 * (linear index, the first 65536) its multiprocessor and the global timer
 * at its start, at the end of warp 0's tile loop and at its end; read by
 * kvt_attnrt_trace_read, written to a file by `kvtier bench attn` with
 * KVT_ATTN_TRACE_FILE set, summarized by bench/attn_trace.py. */
__device__ unsigned long long kvt_attn_trace[4 * 65536];
__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
#define TRACE_CTA()                                                            \
  ((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x)
#endif

/* STG: the staged path (FP8 at head dim 128 only; see stg). */
template <int FMT, int DT, int D, bool STG>
__global__ void __launch_bounds__(NWARPS * 32,
                                  D == 256 ? 2 : KVT_ATTN_CTAS_PER_SM)
    decode_kernel(const kvt_attn_kparams p) {
  static_assert(!STG || stg<FMT, DT, D>::can, "no staged path");
  using G = geo<FMT, DT, D>;
  constexpr int U = plan<FMT, DT, D>::U;
  __shared__ float sh_m[NWARPS][8], sh_l[NWARPS][8];
  constexpr int OBYTES = NWARPS * 8 * D * 4;
  /* INT4: its stages, and after the loop sh_o and the zero-point sums */
  constexpr int ZBYTES = FMT == KVT_ATTN_INT4 ? NWARPS * 8 * 8 * 4 : 0;
  constexpr int IBUF = FMT == KVT_ATTN_INT4 ? i4_buf<D> : 0;
  /* FP8 at head dim 128: the staged path's stages */
  constexpr int SBUF = STG ? stg<FMT, DT, D>::BUF : 0;
  constexpr int BUF0 = IBUF > OBYTES + ZBYTES ? IBUF : OBYTES + ZBYTES;
  constexpr int BUF = SBUF > BUF0 ? SBUF : BUF0;
  static_assert(BUF <= 48 * 1024, "static shared memory");
  __shared__ __align__(16) uint8_t sh_buf[BUF];
  float(*sh_o)[8][D] = reinterpret_cast<float(*)[8][D]>(sh_buf);

#ifdef KVT_ATTN_TRACE
  if (threadIdx.x == 0 && TRACE_CTA() < 65536) {
    unsigned smid;
    asm volatile("mov.u32 %0, %smid;" : "=r"(smid));
    kvt_attn_trace[4 * TRACE_CTA()] = smid;
    kvt_attn_trace[4 * TRACE_CTA() + 1] = gtime();
  }
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* the combine may launch once every CTA of this kernel has started; it
   * waits for this kernel's end before it reads anything */
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const uint32_t b = blockIdx.z;
  const uint32_t split = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  /* the CTA serves kv heads kvh0 .. kvh0 + kv_group - 1 (one but for INT4),
   * wph warps each; this warp is warp ww of head kvh */
  const int wph = NWARPS / (int)p.kv_group;
  const int ww = warp % wph;
  const uint32_t kvh0 = blockIdx.y / p.head_chunks * p.kv_group,
                 chunk = blockIdx.y % p.head_chunks;
  const uint32_t kvh = kvh0 + (uint32_t)(warp / wph);
  const uint32_t qh0 = kvh * p.gqa + chunk * 8;
  const int nheads = (int)min(8u, p.gqa - chunk * 8);

  const int32_t len = __ldg(reinterpret_cast<const int32_t *>(p.seq_lens) + b);
  const int32_t per =
      ((len + (int32_t)p.splits - 1) / (int32_t)p.splits + TILE - 1) / TILE *
      TILE;
  const int32_t cs = (int32_t)split * per;
  const int32_t ce = min(len, cs + per);

  uint32_t qb[G::NT][2];
  uint32_t qz0 = 0, qz1 = 0; /* INT4: the zero-point MMA's B operand */
  if constexpr (FMT == KVT_ATTN_INT4)
    i4_load_q<DT, D>(p, b, qh0, nheads, g, t, qb, qz0, qz1);
  else
    load_q<FMT, DT, D>(p, b, qh0, nheads, g, t, qb);
  float za[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* INT4: zero-point sums */

  float o[G::NT][4];
#pragma unroll
  for (int j = 0; j < G::NT; j++)
    o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const int32_t *table = reinterpret_cast<const int32_t *>(p.block_table) +
                         (uint64_t)b * p.max_blocks;

  if constexpr (FMT == KVT_ATTN_INT4) {
    if (p.kv_group == 2)
      i4_loop<D, 2>(p, table, kvh0, warp / wph, cs, ce, ww, wph, lane,
                    sh_buf + ww * i4<D, 2>::NS * i4<D, 2>::SB, qb, qz0, qz1,
                    o, za, m0, m1, l0, l1);
    else
      i4_loop<D, 1>(p, table, kvh, 0, cs, ce, ww, wph, lane,
                    sh_buf + warp * i4<D, 1>::NS * i4<D, 1>::SB, qb, qz0,
                    qz1, o, za, m0, m1, l0, l1);
  } else if constexpr (STG) {
    stg_loop<FMT, DT, D>(p, table, kvh, cs, ce, warp, lane,
                         sh_buf + warp * stg<FMT, DT, D>::NS *
                                      stg<FMT, DT, D>::SB,
                         qb, o, m0, m1, l0, l1);
  } else {
    /* warp w takes groups of U consecutive tiles: w, w + NWARPS, ... */
    page_stream<U> pages;
    const int32_t gfirst = cs + warp * U * TILE;
    if (gfirst < ce)
      pages.init(table, gfirst, NWARPS * U * TILE, ce, (int32_t)p.block_size,
                 lane);
    int m = 0; /* the warp's tile */
    for (int32_t gs = gfirst; gs < ce; gs += NWARPS * U * TILE, m += U) {
      tile_addr ta[U];
      tile_regs<FMT, DT, D> r[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int32_t ts = gs + u * TILE;
        /* every lane takes part in the shuffle, whatever ts */
        const uint32_t page = pages.page(m + u, lane);
        if (ts < ce) {
          const uint32_t off0 = (uint32_t)ts % p.block_size;
          ta[u].row0 =
              ((uint64_t)page * p.block_size + off0) * p.kv_heads + kvh;
          ta[u].sc0 = ((uint64_t)page * p.kv_heads + kvh) * p.block_size + off0;
          ta[u].last = min(TILE - 1, ce - 1 - ts);
          load_k<FMT, DT, D>(p, ta[u], g, t, r[u]);
          if constexpr (plan<FMT, DT, D>::early_v)
            load_v<FMT, DT, D>(p, ta[u], g, t, r[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++)
        if (gs + u * TILE < ce)
          tile_step<FMT, DT, D>(p, ta[u], g, t, r[u], qb, o, m0, m1, l0, l1);
    }
  }
#ifdef KVT_ATTN_TRACE
  if (threadIdx.x == 0 && TRACE_CTA() < 65536)
    kvt_attn_trace[4 * TRACE_CTA() + 2] = gtime();
#endif
  __syncthreads(); /* the pipeline's buffer becomes sh_o */

  /* the warp's sums over its lanes' tokens */
#pragma unroll
  for (int x = 4; x < 32; x <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
  if (g == 0) {
    sh_m[warp][2 * t] = m0, sh_m[warp][2 * t + 1] = m1;
    sh_l[warp][2 * t] = l0, sh_l[warp][2 * t + 1] = l1;
  }
  float(*sh_z)[8][8] = reinterpret_cast<float(*)[8][8]>(sh_buf + OBYTES);
  if constexpr (FMT == KVT_ATTN_INT4) {
#pragma unroll
    for (int j = 0; j < G::NT; j++) {
      const int d0 = i4_dim(j, g), d1 = i4_dim(j, g + 8);
      const float e0 = i4_out_scale(g), e1 = i4_out_scale(g + 8);
      sh_o[warp][2 * t][d0] = o[j][0] * e0;
      sh_o[warp][2 * t + 1][d0] = o[j][1] * e0;
      sh_o[warp][2 * t][d1] = o[j][2] * e1;
      sh_o[warp][2 * t + 1][d1] = o[j][3] * e1;
    }
    if (g < D / 32) {
      sh_z[warp][g][2 * t] = za[0];
      sh_z[warp][g][2 * t + 1] = za[1];
    }
  } else {
#pragma unroll
    for (int j = 0; j < G::NT; j++) {
      const int d0 = slice_dim<G::EPUV, 8>(g, 2 * j),
                d1 = slice_dim<G::EPUV, 8>(g, 2 * j + 1);
      sh_o[warp][2 * t][d0] = o[j][0];
      sh_o[warp][2 * t + 1][d0] = o[j][1];
      sh_o[warp][2 * t][d1] = o[j][2];
      sh_o[warp][2 * t + 1][d1] = o[j][3];
    }
  }
  __syncthreads();

  /* each kv head's wph warps combined */
  for (int idx = threadIdx.x; idx < (int)p.kv_group * nheads * D;
       idx += NWARPS * 32) {
    const int hg = idx / (nheads * D), h = idx / D % nheads, d = idx % D;
    const int w0 = hg * wph;
    float mx = -INFINITY;
    for (int w = w0; w < w0 + wph; w++)
      mx = fmaxf(mx, sh_m[w][h]);
    float L = 0.0f, acc = 0.0f;
    for (int w = w0; w < w0 + wph; w++) {
      const float e = sh_m[w][h] == -INFINITY ? 0.0f : exp2f(sh_m[w][h] - mx);
      L += sh_l[w][h] * e;
      float ow = sh_o[w][h][d];
      if constexpr (FMT == KVT_ATTN_INT4)
        ow += sh_z[w][d >> 5][h];
      acc += ow * e;
    }
    const float val = L > 0.0f ? acc / L : 0.0f;
    const uint64_t qrow =
        (uint64_t)b * p.q_heads + (kvh0 + hg) * p.gqa + chunk * 8 + h;
    if (p.splits == 1) {
      reinterpret_cast<uint16_t *>(p.out)[qrow * D + d] = f_to_h16<DT>(val);
    } else {
      const uint64_t prow = qrow * p.splits + split;
      reinterpret_cast<float *>(p.part_o)[prow * D + d] = val;
      if (d == 0) {
        reinterpret_cast<float *>(p.part_ml)[2 * prow] = mx;
        reinterpret_cast<float *>(p.part_ml)[2 * prow + 1] = L;
      }
    }
  }
#ifdef KVT_ATTN_TRACE
  __syncthreads();
  if (threadIdx.x == 0 && TRACE_CTA() < 65536)
    kvt_attn_trace[4 * TRACE_CTA() + 3] = gtime();
#endif
}

/* Merges the splits of one (sequence, q head) row: blockDim.x = head_dim.
 * Warp 0 turns the splits' (max, sum) pairs into weights in shared memory
 * (lanes over splits, shuffles for the max and the total), then each thread
 * sums its dim over the splits with the loads unrolled: a loop over the
 * splits per thread with a max pass first took 5.7 us at 16 splits on an
 * H200, most of it waiting on one load at a time. Launched as a dependent
 * of the decode kernel (programmatic dependent launch where the device has
 * it), it waits here until that kernel has ended and its writes are
 * visible. */
template <int DT> __global__ void combine_kernel(const kvt_attn_kparams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  static_assert(KVT_ATTN_MAX_SPLITS <= 64, "two splits per lane of warp 0");
  __shared__ float sw[KVT_ATTN_MAX_SPLITS];
  __shared__ float sL;
  const uint64_t row = blockIdx.x;
  const uint32_t S = p.splits, D = p.head_dim;
  const float *ml = reinterpret_cast<const float *>(p.part_ml) + row * S * 2;
  if (threadIdx.x < 32) {
    const uint32_t lane = threadIdx.x;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (lane + 32 * i < S) {
        const float2 x =
            *reinterpret_cast<const float2 *>(ml + 2 * (lane + 32 * i));
        m[i] = x.x, l[i] = x.y;
      }
    float mx = fmaxf(m[0], m[1]);
#pragma unroll
    for (int x = 16; x > 0; x >>= 1)
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    float L = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const float w = m[i] == -INFINITY ? 0.0f : l[i] * exp2f(m[i] - mx);
      if (lane + 32 * i < S)
        sw[lane + 32 * i] = w;
      L += w;
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1)
      L += __shfl_xor_sync(0xffffffffu, L, x);
    if (lane == 0)
      sL = L;
  }
  __syncthreads();
  const float *po =
      reinterpret_cast<const float *>(p.part_o) + row * S * D + threadIdx.x;
  float acc = 0.0f;
#pragma unroll 8
  for (uint32_t s = 0; s < S; s++)
    acc += sw[s] * po[(uint64_t)s * D];
  const float L = sL;
  reinterpret_cast<uint16_t *>(p.out)[row * D + threadIdx.x] =
      f_to_h16<DT>(L > 0.0f ? acc / L : 0.0f);
}

/* A yes/no property of the current device, probed once per device ordinal
 * (known: 0 unknown, 1 yes, -1 no); false without a current device. */
template <class F>
static bool per_device(std::atomic<int> (&known)[64], F probe) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (dev >= 0 && dev < 64 && known[dev].load(std::memory_order_relaxed))
    return known[dev].load(std::memory_order_relaxed) > 0;
  const bool ok = probe(dev);
  (void)cudaGetLastError();
  if (dev >= 0 && dev < 64)
    known[dev].store(ok ? 1 : -1, std::memory_order_relaxed);
  return ok;
}

/* Whether the combine for dtype DT may be launched as a programmatic
 * dependent on the current device: the device is sm_90 or later and the
 * code it runs was compiled for compute_90 or later, so that it has the
 * griddepcontrol.wait (an sm_80-only build JIT-compiled on an H100 has
 * not, and its combine must wait for the decode kernel the ordinary way).
 * Cached per device ordinal. */
template <int DT> static bool have_pdl() {
  static std::atomic<int> known[64];
  return per_device(known, [](int dev) {
    int major = 0;
    cudaFuncAttributes fa;
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                  dev) == cudaSuccess &&
           major >= 9 &&
           cudaFuncGetAttributes(&fa, combine_kernel<DT>) == cudaSuccess &&
           fa.ptxVersion >= 90;
  });
}

/* Which FP8 path kvt_attnrt_set_fp8_path or KVT_ATTN_FP8_PATH asked for:
 * -2 not read yet, -1 by the device, 0 registers, 1 staged. */
static std::atomic<int> fp8_path{-2};

/* Whether an FP8 decode at head dim 128 takes the staged path on the
 * current device (see stg): as asked, else on sm_90 devices whose memory
 * bandwidth is at least 4 TB/s. Cached per device ordinal. Values of
 * KVT_ATTN_FP8_PATH other than registers / staged leave it to the device. */
static bool fp8_staged() {
  int f = fp8_path.load(std::memory_order_relaxed);
  if (f == -2) {
    const char *e = getenv("KVT_ATTN_FP8_PATH");
    const int v = e && !strcmp(e, "registers") ? 0
                  : e && !strcmp(e, "staged")  ? 1
                                               : -1;
    fp8_path.compare_exchange_strong(f, v, std::memory_order_relaxed);
    f = fp8_path.load(std::memory_order_relaxed);
  }
  if (f >= 0)
    return f == 1;
  static std::atomic<int> known[64];
  return per_device(known, [](int dev) {
    int major = 0, khz = 0, bits = 0;
    /* measured on sm_90 only (H100, H200); double data rate: bytes/s =
     * 2 x clock x bus width / 8 */
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                  dev) == cudaSuccess &&
           major == 9 &&
           cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) ==
               cudaSuccess &&
           cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth,
                                  dev) == cudaSuccess &&
           2.0 * khz * 1e3 * bits / 8.0 >= 4.0e12;
  });
}

template <int FMT, int DT, int D, bool STG>
int launch_decode_k(const kvt_attn_kparams *p, cudaStream_t st) {
  const dim3 grid(p->splits, p->kv_heads / p->kv_group * p->head_chunks,
                  p->batch);
  decode_kernel<FMT, DT, D, STG><<<grid, NWARPS * 32, 0, st>>>(*p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || p->splits == 1)
    return (int)e;
  /* the combine is launched while the decode kernel runs and waits for it
   * in griddepcontrol.wait: the launch's latency is hidden behind the decode
   * kernel's last CTAs */
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p->batch * p->q_heads);
  cfg.blockDim = dim3(p->head_dim);
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = have_pdl<DT>() ? 1 : 0;
  e = cudaLaunchKernelEx(&cfg, combine_kernel<DT>, *p);
  if (e != cudaSuccess && cfg.numAttrs) {
    /* the attribute refused (a driver or capture that does not take it):
     * the decode kernel is queued, so the combine must follow it anyway */
    (void)cudaGetLastError();
    cfg.numAttrs = 0;
    e = cudaLaunchKernelEx(&cfg, combine_kernel<DT>, *p);
  }
  const cudaError_t last = cudaGetLastError(); /* leave none behind */
  return (int)(e != cudaSuccess ? e : last);
}

template <int FMT, int DT, int D>
int launch_decode_d(const kvt_attn_kparams *p, cudaStream_t st) {
  if constexpr (stg<FMT, DT, D>::can)
    if (fp8_staged())
      return launch_decode_k<FMT, DT, D, true>(p, st);
  return launch_decode_k<FMT, DT, D, false>(p, st);
}

template <int FMT, int DT>
int launch_decode_f(const kvt_attn_kparams *p, cudaStream_t st) {
  switch (p->head_dim) {
  case 64:
    return launch_decode_d<FMT, DT, 64>(p, st);
  case 128:
    return launch_decode_d<FMT, DT, 128>(p, st);
  default:
    return launch_decode_d<FMT, DT, 256>(p, st);
  }
}

template <int DT>
int launch_decode(const kvt_attn_kparams *p, cudaStream_t st) {
  switch (p->format) {
  case KVT_ATTN_RAW:
    return launch_decode_f<KVT_ATTN_RAW, DT>(p, st);
  case KVT_ATTN_K16V8:
    return launch_decode_f<KVT_ATTN_K16V8, DT>(p, st);
  case KVT_ATTN_FP8:
    return launch_decode_f<KVT_ATTN_FP8, DT>(p, st);
  default:
    return launch_decode_f<KVT_ATTN_INT4, DT>(p, st);
  }
}

#include "attn_append.cuh" /* the cache writer (see there) */

} // namespace kvt_attn_dev
using namespace kvt_attn_dev;

extern "C" int kvt_attnrt_decode(const kvt_attn_kparams *p, void *stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  return p->dtype == KVT_DTYPE_BF16 ? launch_decode<KVT_DTYPE_BF16>(p, st)
                                    : launch_decode<KVT_DTYPE_F16>(p, st);
}

extern "C" void kvt_attnrt_set_fp8_path(int mode) {
  /* -2: the environment is read again at the next decode */
  fp8_path.store(mode == 0 || mode == 1 ? mode : -2, std::memory_order_relaxed);
}

extern "C" int kvt_attnrt_append(const kvt_attn_aparams *p, void *stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  return p->dtype == KVT_DTYPE_BF16 ? launch_append<KVT_DTYPE_BF16>(p, st)
                                    : launch_append<KVT_DTYPE_F16>(p, st);
}

#ifdef KVT_ATTN_TRACE
extern "C" int kvt_attnrt_trace_read(unsigned long long *dst, size_t n) {
  return (int)cudaMemcpyFromSymbol(dst, kvt_attn_trace,
                                   n * sizeof(unsigned long long));
}
#endif

extern "C" int kvt_attnrt_sm_count(uint32_t *n) {
  int dev = 0, v = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return (int)e;
  }
  *n = (uint32_t)v;
  return 0;
}
