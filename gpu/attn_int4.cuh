/* gpu/attn_int4.cuh - the INT4 path of decode attention: included by
 * attn_kernels.cu once its shared helpers (MMA, conversions, cp.async,
 * softmax_tile, tile_addr) are defined, inside namespace kvt_attn_dev. Not a
 * header of its own: one translation unit, split by responsibility. */
#ifndef KVT_ATTN_INT4_CUH
#define KVT_ATTN_INT4_CUH

/* ---- INT4 ----
 * An int4 tile is small (16 tokens x 2 x (D/2 + 2 D/32) bytes), and its
 * arithmetic, not its bytes, bounds the kernel. So INT4 has its own path:
 *
 * - Each warp streams its tiles through NS stages of shared memory with
 *   cp.async, in the cache's own order (16-byte chunks, whole sectors); the
 *   32 lanes share the copies and read back what their fragments need.
 *   Chunk c of row r is stored at chunk c ^ i4_sw(r), so those reads are
 *   free of bank conflicts.
 * - MMA tiles are group-pure: every 16 values of the reduction (keys) or of
 *   the output rows (values) lie in one group of 32, so a group's scale and
 *   zero can be applied outside the MMA instead of to every element.
 * - Codes enter the MMA as they are: nibble n in the low bits of an fp16
 *   with a zero exponent is the subnormal n * 2^-24, exact, and tensor cores
 *   take subnormals (tests/test_gpu_attn.c checks against the CPU codec).
 *   A shift and an AND make 2 codes an operand: no per-element convert,
 *   subtract or fma. (Taking high nibbles in place, as 16 n, and undoing
 *   the 16 elsewhere saves some shifts but measured 3% slower on an H200.)
 * - Keys: S = sum over groups G of s_G * (2^-24 sum_d n_d q_d) * 2^24 +
 *   sum_G z_G Q_G, where Q_G is the sum of q over group G. The first part is
 *   one fp32 fma per group and accumulator, the second one more MMA per tile
 *   (zeros in k columns, Q_G split into fp16 hi + lo parts for fp32
 *   accuracy).
 * - Values: O = sum_tok (s_tok,G n) P + sum_tok z_tok,G P. The scale goes
 *   into the probabilities (P' = P s per group: 2 hmul2), the zero point
 *   into a per-(group, head) accumulator filled by one more MMA per tile,
 *   added to every output dim of the group at the end.
 *
 * Row r of a stage: K codes at KO + r RB, V codes at VO + r RB, K and V
 * (scale, zero) words at KSO / VSO + r 4 NG. */
template <int D> struct i4 {
  static constexpr int NG = D / 32; /* groups of a row = its 16-byte chunks */
  static constexpr int RB = D / 2;  /* code bytes of a row */
  static constexpr int KO = 0, VO = 16 * RB, KSO = 32 * RB,
                       VSO = 32 * RB + 64 * NG;
  static constexpr int SB = 32 * RB + 128 * NG; /* bytes of a stage */
  static constexpr int NCH = SB / 16;           /* its 16-byte chunks */
  static constexpr int NS0 = 45056 / (NWARPS * SB);
  static constexpr int NS = NS0 > 4 ? 4 : NS0;
  static constexpr int BUF = NWARPS * NS * SB;
  static_assert(NS >= 2, "int4 stages");
};

/* The chunk swizzle of row r: the 8 rows a warp's reads touch at once (rows
 * g, and rows 2t + i) fall in distinct banks. */
template <int D> __device__ __forceinline__ int i4_sw(int r) {
  if constexpr (D == 64)
    return (r >> 2) & 1;
  else if constexpr (D == 128)
    return (r >> 1) & 3;
  else
    return r & 7;
}

/* A warp's walk over its tiles (every NWARPS-th): the block-table index and
 * offset of the next one, advanced without a division per tile. */
struct i4_cursor {
  int32_t idx, off, step_idx, step_off, bs;
  __device__ __forceinline__ void init(int32_t first, int32_t block_size) {
    bs = block_size;
    idx = first / bs, off = first % bs;
    step_idx = (NWARPS * TILE) / bs, step_off = (NWARPS * TILE) % bs;
  }
  __device__ __forceinline__ void next() {
    idx += step_idx, off += step_off;
    if (off >= bs)
      off -= bs, idx++;
  }
};

/* Copies the cursor's tile (K and V codes, K and V scale words) into a
 * stage and advances the cursor. Which chunk a lane copies is fixed, so its
 * offsets are computed once (hoisted out of the loop); per tile there is a
 * page lookup and one base address per section. */
template <int D>
__device__ __forceinline__ void i4_issue(const kvt_attn_kparams &p,
                                         const int32_t *table, uint32_t kvh,
                                         i4_cursor &cur, int lane,
                                         uint8_t *st) {
  using I = i4<D>;
  const uint32_t page = (uint32_t)__ldg(table + cur.idx);
  const uint64_t row0 =
      ((uint64_t)page * (uint32_t)cur.bs + (uint32_t)cur.off) * p.kv_heads +
      kvh;
  const uint64_t sc0 =
      ((uint64_t)page * p.kv_heads + kvh) * (uint32_t)cur.bs + (uint32_t)cur.off;
  cur.next();
  const uint8_t *kb = reinterpret_cast<const uint8_t *>(p.k) + row0 * I::RB;
  const uint8_t *vb = reinterpret_cast<const uint8_t *>(p.v) + row0 * I::RB;
  const uint8_t *ks =
      reinterpret_cast<const uint8_t *>(p.k_scale) + sc0 * (4 * I::NG);
  const uint8_t *vs =
      reinterpret_cast<const uint8_t *>(p.v_scale) + sc0 * (4 * I::NG);
  const uint32_t rstride = p.kv_heads * I::RB; /* bytes between tokens */
#pragma unroll
  for (int i = 0; i < (I::NCH + 31) / 32; i++) {
    const int q = lane + 32 * i;
    if (q < 32 * I::NG) { /* codes: K rows, then V rows */
      const bool isv = q >= 16 * I::NG;
      const int qq = isv ? q - 16 * I::NG : q;
      const int r = qq / I::NG, c = qq % I::NG;
      cp_async<16>(st + (isv ? I::VO : I::KO) + r * I::RB +
                       (c ^ i4_sw<D>(r)) * 16,
                   (isv ? vb : kb) + (r * rstride + c * 16));
    } else if (q < 36 * I::NG) {
      const int qq = q - 32 * I::NG;
      cp_async<16>(st + I::KSO + qq * 16, ks + qq * 16);
    } else if (q < I::NCH) {
      const int qq = q - 36 * I::NG;
      cp_async<16>(st + I::VSO + qq * 16, vs + qq * 16);
    }
  }
}

/* NG scale words of row r of a scale section. */
template <int D>
__device__ __forceinline__ void i4_words(const uint8_t *sec, int r,
                                         uint32_t (&w)[D / 32]) {
  const uint8_t *a = sec + r * (D / 8);
  if constexpr (D / 32 >= 4) {
#pragma unroll
    for (int k = 0; k < D / 32; k += 4) {
      const uint4 u = *reinterpret_cast<const uint4 *>(a + 4 * k);
      w[k] = u.x, w[k + 1] = u.y, w[k + 2] = u.z, w[k + 3] = u.w;
    }
  } else {
    const uint2 u = *reinterpret_cast<const uint2 *>(a);
    w[0] = u.x, w[1] = u.y;
  }
}

/* Q as the B operand of the group-pure key tiles (k tile 2G + e holds dims
 * 32 G + 8 t + {e, e + 4} at columns 2t, 2t+1 and {e + 1, e + 5} at 2t + 8,
 * 2t + 9, see i4_tile), and the B operand of the zero-point MMA: sums of q
 * over groups 2t and 2t + 1 for head g, fp16 hi in qz0 and lo in qz1. */
template <int DT, int D>
__device__ __forceinline__ void i4_load_q(const kvt_attn_kparams &p, uint32_t b,
                                          uint32_t qh0, int nheads, int g,
                                          int t, uint32_t (&qb)[D / 16][2],
                                          uint32_t &qz0, uint32_t &qz1) {
  constexpr int NG = D / 32;
  const uint16_t *q = reinterpret_cast<const uint16_t *>(p.q);
  const bool ok = g < nheads;
  const uint16_t *row = q + ((uint64_t)b * p.q_heads + qh0 + (ok ? g : 0)) * D;
  /* q[d] as the MMA sees it (fp16) */
  auto qh = [&](uint32_t w, int hi) {
    return __float2half_rn(h16_to_f<DT>((uint16_t)(w >> (16 * hi))));
  };
#pragma unroll
  for (int G = 0; G < NG; G++) {
    const uint16_t *e = row + 32 * G + 8 * t;
    uint2 u0 = make_uint2(0, 0), u1 = make_uint2(0, 0);
    if (ok) {
      u0 = __ldg(reinterpret_cast<const uint2 *>(e));
      u1 = __ldg(reinterpret_cast<const uint2 *>(e + 4));
    }
    qb[2 * G][0] = h2u(__halves2half2(qh(u0.x, 0), qh(u1.x, 0)));
    qb[2 * G][1] = h2u(__halves2half2(qh(u0.x, 1), qh(u1.x, 1)));
    qb[2 * G + 1][0] = h2u(__halves2half2(qh(u0.y, 0), qh(u1.y, 0)));
    qb[2 * G + 1][1] = h2u(__halves2half2(qh(u0.y, 1), qh(u1.y, 1)));
  }
  /* sums over groups 2t and 2t + 1 (read again: a register array indexed by
   * t would go to local memory) */
  float z[2] = {0.0f, 0.0f};
#pragma unroll
  for (int x = 0; x < 2; x++) {
    if (ok && 2 * t + x < NG) {
      const uint16_t *e = row + 32 * (2 * t + x);
#pragma unroll
      for (int k = 0; k < 32; k += 4) {
        const uint2 u = __ldg(reinterpret_cast<const uint2 *>(e + k));
        z[x] += __half2float(qh(u.x, 0)) + __half2float(qh(u.x, 1)) +
                __half2float(qh(u.y, 0)) + __half2float(qh(u.y, 1));
      }
    }
  }
  const __half h0 = __float2half_rn(z[0]), h1 = __float2half_rn(z[1]);
  qz0 = h2u(__halves2half2(h0, h1));
  qz1 = h2u(__floats2half2_rn(z[0] - __half2float(h0), z[1] - __half2float(h1)));
}

/* One int4 tile from its stage: scores, softmax, O += P V. o holds the
 * output in units of 2^-24 (codes are subnormals), za the zero-point sums
 * (row g: group g % NG; heads 2t, 2t+1). */
template <int D>
__device__ __forceinline__ void
i4_tile(const uint8_t *st, int last, float sl, int g, int t,
        const uint32_t (&qb)[D / 16][2], uint32_t qz0, uint32_t qz1,
        float (&o)[D / 16][4], float (&za)[4], float &m0, float &m1,
        float &l0, float &l1) {
  using I = i4<D>;
  constexpr int NG = I::NG;
  constexpr uint32_t M = 0x000F000Fu;
  const int sw = i4_sw<D>(g); /* = i4_sw(g + 8) */

  /* scores: the zero points' part by MMA, then each group's */
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  {
    uint32_t a0 = 0, a1 = 0;
    if (2 * t < NG) {
      const uint2 z0 = *reinterpret_cast<const uint2 *>(st + I::KSO +
                                                        g * (D / 8) + 8 * t);
      const uint2 z1 = *reinterpret_cast<const uint2 *>(
          st + I::KSO + (g + 8) * (D / 8) + 8 * t);
      a0 = __byte_perm(z0.x, z0.y, 0x7632);
      a1 = __byte_perm(z1.x, z1.y, 0x7632);
    }
    mma16816<false>(c, a0, a1, a0, a1, qz0, qz1);
  }
  uint32_t ks0[NG], ks1[NG];
  i4_words<D>(st + I::KSO, g, ks0);
  i4_words<D>(st + I::KSO, g + 8, ks1);
  float cs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int G = 0; G < NG; G++) {
    const int off = ((G ^ sw) * 16) + 4 * t;
    const uint32_t w0 =
        *reinterpret_cast<const uint32_t *>(st + I::KO + g * I::RB + off);
    const uint32_t w1 = *reinterpret_cast<const uint32_t *>(
        st + I::KO + (g + 8) * I::RB + off);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma16816<false>(acc, w0 & M, w1 & M, (w0 >> 4) & M, (w1 >> 4) & M,
                    qb[2 * G][0], qb[2 * G][1]);
    mma16816<false>(acc, (w0 >> 8) & M, (w1 >> 8) & M, (w0 >> 12) & M,
                    (w1 >> 12) & M, qb[2 * G + 1][0], qb[2 * G + 1][1]);
    const float s0 = __half2float(__ushort_as_half((uint16_t)ks0[G]));
    const float s1 = __half2float(__ushort_as_half((uint16_t)ks1[G]));
    cs[0] = fmaf(s0, acc[0], cs[0]);
    cs[1] = fmaf(s0, acc[1], cs[1]);
    cs[2] = fmaf(s1, acc[2], cs[2]);
    cs[3] = fmaf(s1, acc[3], cs[3]);
  }
  /* masked by selection: rows past the end hold whatever the page holds */
  c[0] = g <= last ? fmaf(cs[0], 16777216.0f, c[0]) * sl : -INFINITY;
  c[1] = g <= last ? fmaf(cs[1], 16777216.0f, c[1]) * sl : -INFINITY;
  c[2] = g + 8 <= last ? fmaf(cs[2], 16777216.0f, c[2]) * sl : -INFINITY;
  c[3] = g + 8 <= last ? fmaf(cs[3], 16777216.0f, c[3]) * sl : -INFINITY;

  uint32_t pb0, pb1;
  softmax_tile<D / 16, 1, false>(c, o, za, m0, m1, l0, l1, pb0, pb1);

  /* values of tokens 2t, 2t+1, 2t+8, 2t+9 */
  int tok[4];
#pragma unroll
  for (int i = 0; i < 4; i++)
    tok[i] = 2 * t + (i & 1) + 8 * (i >> 1);
  uint32_t vs[4][NG];
#pragma unroll
  for (int i = 0; i < 4; i++)
    i4_words<D>(st + I::VSO, tok[i], vs[i]);
  if (last < TILE - 1) { /* the page's words past the end may be anything */
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int G = 0; G < NG; G++)
        vs[i][G] = tok[i] <= last ? vs[i][G] : 0u;
  }
  {
    const int gz = g & (NG - 1);
    uint32_t zt[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      zt[i] = *reinterpret_cast<const uint16_t *>(st + I::VSO + tok[i] * (D / 8) +
                                                  4 * gz + 2);
      zt[i] = tok[i] <= last ? zt[i] : 0u;
    }
    mma16816<false>(za, zt[0] | (zt[1] << 16), 0u, zt[2] | (zt[3] << 16), 0u,
                    pb0, pb1);
  }
#pragma unroll
  for (int G = 0; G < NG; G++) {
    const uint32_t b0 = h2u(
        __hmul2(u2h(pb0), u2h(__byte_perm(vs[0][G], vs[1][G], 0x5410))));
    const uint32_t b1 = h2u(
        __hmul2(u2h(pb1), u2h(__byte_perm(vs[2][G], vs[3][G], 0x5410))));
    uint32_t h[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
      h[i] = *reinterpret_cast<const uint16_t *>(
          st + I::VO + tok[i] * I::RB + ((G ^ i4_sw<D>(tok[i])) * 16) + 2 * g);
    const uint32_t x01 = __byte_perm(h[0], h[1], 0x5410);
    const uint32_t x89 = __byte_perm(h[2], h[3], 0x5410);
    mma16816<false>(o[2 * G], x01 & M, (x01 >> 4) & M, x89 & M,
                    (x89 >> 4) & M, b0, b1);
    mma16816<false>(o[2 * G + 1], (x01 >> 8) & M, (x01 >> 12) & M,
                    (x89 >> 8) & M, (x89 >> 12) & M, b0, b1);
  }
}

/* Output dim of row `row` (0..15) of the int4 value m tile j. */
__device__ __forceinline__ int i4_dim(int j, int row) {
  return 32 * (j >> 1) + 4 * (row & 7) + 2 * (j & 1) + (row >> 3);
}

#endif
