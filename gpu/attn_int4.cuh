/* gpu/attn_int4.cuh - the INT4 path of decode attention: included by
 * attn_kernels.cu once its shared helpers (MMA, conversions, cp.async,
 * softmax_tile, tile_addr) are defined, inside namespace kvt_attn_dev. Not a
 * header of its own: one translation unit, split by responsibility. */
#ifndef KVT_ATTN_INT4_CUH
#define KVT_ATTN_INT4_CUH

/* ---- INT4 ----
 * An int4 tile is small (16 tokens x 2 x (D/2 + 2 D/32) bytes) and its
 * arithmetic per byte is the highest of the formats, so INT4 has its own
 * path (measured limits: docs/ATTENTION.md):
 *
 * - Tiles stream through NS stages of shared memory with cp.async, in the
 *   cache's own order (16-byte chunks); the lanes share the copies and read
 *   back what their fragments need. An INT4 row of one kv head is 64 bytes
 *   or less: read head by head, every request to L2 takes half a 128-byte
 *   line, and the cache is read at about 0.75 of copy bandwidth (H100,
 *   measured with a plain strided read, no kernel). So where kv_heads is
 *   even a CTA serves two neighbouring heads (kv_group 2): warps w and w + 2
 *   share stages holding both heads' rows, one copies both heads' K, the
 *   other both heads' V (whole lines), and a barrier of the pair hands each
 *   tile over. Otherwise (kv_group 1) every warp has stages of its own.
 * - Code rows are padded to a stride of 16 x odd bytes, so the reads back
 *   are free of bank conflicts and every address is a per-lane base plus a
 *   constant. Pages come from page_stream, 32 tiles ahead.
 * - Only a warp's last tile can be partial: full tiles run a copy of the
 *   tile code without masks.
 * - MMA tiles are group-pure: every 16 values of the reduction (keys) or of
 *   the output rows (values) lie in one group of 32, so a group's scale and
 *   zero can be applied outside the MMA instead of to every element.
 * - Codes enter the MMA as they are: nibble n in the low bits of an fp16
 *   with a zero exponent is the subnormal n * 2^-24, exact, and tensor cores
 *   take subnormals (tests/test_gpu_attn.c checks against the CPU codec).
 *   An AND makes 2 codes an operand, no per-element convert, subtract or
 *   fma: the even code of each byte as n, the odd one in place as 16 n (the
 *   16 is undone in q for keys, see i4_load_q, and at the end for values,
 *   see i4_out_scale), and a shift by 8 gives the next two.
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
 * Row r of a stage: K codes at KO + r S (head h of the stage at + h RB), V
 * codes at VO + r S, K and V (scale, zero) words at KSO / VSO + h 16 (4 NG)
 * + r 4 NG. */

/* The stages of KG kv heads (1 or 2) for head dim D. */
template <int D, int KG> struct i4 {
  static constexpr int NG = D / 32; /* groups of a row = its 16-byte chunks */
  static constexpr int RB = D / 2;  /* code bytes of a row of one head */
  static constexpr int RW = KG * RB; /* code bytes of a stage row */
  /* A stage row's stride: 16 x odd bytes, so the 8 rows one read
   * instruction touches (rows g, or rows 2t + i) start 4 banks apart. */
  static constexpr int S = RW + 16;
  static constexpr int SCB = 16 * 4 * NG; /* scale bytes of a tile's head */
  static constexpr int KO = 0, VO = 16 * S, KSO = 32 * S,
                       VSO = 32 * S + KG * SCB;
  static constexpr int SB = 32 * S + 2 * KG * SCB; /* bytes of a stage */
  /* chunks of a stage: K rows, K scales (the K half), V rows, V scales */
  static constexpr int HCH = (16 * RW + KG * SCB) / 16;
  static constexpr int SETS = NWARPS / KG; /* warps, or pairs of warps */
  static constexpr int NS0 = 45056 / (SETS * SB);
  /* 2 stages: 5% faster than 4 on an H200 (pairs of kv heads, 112
   * against 118 us at 32 x 8K; the copies of the next tile still overlap
   * the current one's arithmetic, and less shared memory leaves more L1). */
  static constexpr int NS = NS0 > 2 ? 2 : NS0;
  static constexpr int BUF = SETS * NS * SB;
  static_assert(NS >= 2, "int4 stages");
  static_assert((S / 16) % 2 == 1 && S % 16 == 0, "int4 row stride");
};
template <int D>
constexpr int i4_buf = i4<D, 1>::BUF > i4<D, 2>::BUF ? i4<D, 1>::BUF
                                                     : i4<D, 2>::BUF;

/* A warp's walk over its tiles (every wph-th): the offset in its block of
 * the next tile to copy, advanced without a division, and the pages. */
struct i4_cursor {
  int32_t off, step_off, bs;
  int m; /* the next tile to copy, of the warp's */
  page_stream<1> pages;
  __device__ __forceinline__ void init(const int32_t *table, int32_t first,
                                       int32_t ce, int32_t block_size,
                                       int wph, int lane) {
    bs = block_size;
    off = first % bs;
    step_off = (wph * TILE) % bs;
    m = 0;
    pages.init(table, first, wph * TILE, ce, block_size, lane);
  }
  __device__ __forceinline__ void next() {
    m++;
    off += step_off;
    if (off >= bs)
      off -= bs;
  }
};

/* Copies chunks [C0, C1) of the cursor's tile (K rows, K scales, V rows, V
 * scales of the stage's KG heads, kv heads kvh, kvh + 1) into a stage;
 * ADV: and advances the cursor. Which chunk a lane copies is fixed, so its
 * offsets are computed once (hoisted out of the loop); per tile there is one
 * base address per section. */
template <int D, int KG, int C0, int C1, bool ADV>
__device__ __forceinline__ void i4_issue(const kvt_attn_kparams &p,
                                         const int32_t *table, uint32_t kvh,
                                         i4_cursor &cur, int lane,
                                         uint8_t *st) {
  using I = i4<D, KG>;
  constexpr int RCH = I::RW / 16, SCH = I::SCB / 16; /* per row, per head */
  const uint32_t page = cur.pages.page(cur.m, lane);
  const uint64_t row0 =
      ((uint64_t)page * (uint32_t)cur.bs + (uint32_t)cur.off) * p.kv_heads +
      kvh;
  const uint64_t sc0 =
      ((uint64_t)page * p.kv_heads + kvh) * (uint32_t)cur.bs + (uint32_t)cur.off;
  const uint32_t bs = (uint32_t)cur.bs;
  if constexpr (ADV)
    cur.next();
  const uint8_t *kb = reinterpret_cast<const uint8_t *>(p.k) + row0 * I::RB;
  const uint8_t *vb = reinterpret_cast<const uint8_t *>(p.v) + row0 * I::RB;
  const uint8_t *ks =
      reinterpret_cast<const uint8_t *>(p.k_scale) + sc0 * (4 * I::NG);
  const uint8_t *vs =
      reinterpret_cast<const uint8_t *>(p.v_scale) + sc0 * (4 * I::NG);
  const uint32_t rstride = p.kv_heads * I::RB; /* bytes between tokens */
  const uint32_t hstride = bs * (4 * I::NG);   /* between heads' scales */
#pragma unroll
  for (int i = 0; i < (C1 - C0 + 31) / 32; i++) {
    const int q = C0 + lane + 32 * i;
    const bool isv = q >= I::HCH;
    const int qh = isv ? q - I::HCH : q; /* within its half */
    if (q >= C1) {
    } else if (qh < 16 * RCH) { /* a row's chunk */
      const int r = qh / RCH, c = qh % RCH;
      cp_async<16>(st + (isv ? I::VO : I::KO) + r * I::S + c * 16,
                   (isv ? vb : kb) + (r * rstride + c * 16));
    } else { /* a scale chunk of head h */
      const int qs = qh - 16 * RCH, h = qs / SCH, c = qs % SCH;
      cp_async<16>(st + (isv ? I::VSO : I::KSO) + h * I::SCB + c * 16,
                   (isv ? vs : ks) + (h * hstride + c * 16));
    }
  }
}

/* NG scale words at a (16-byte aligned). */
template <int D>
__device__ __forceinline__ void i4_words(const uint8_t *a,
                                         uint32_t (&w)[D / 32]) {
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
 * 32 G + 8 t + {2e, 2e + 4} at k 2t, 2t+1 and {2e + 1, 2e + 5} at k 2t + 8,
 * 2t + 9, see i4_tile), and the B operand of the zero-point MMA: sums of q
 * over groups 2t and 2t + 1 for head g, fp16 hi in qz0 and lo in qz1.
 * Limits: odd dims hold q / 16, subnormal in fp16 below |q| of about 2^-10
 * (a relative error of about 0.5% at |q| = 1e-4); a group sum of q above
 * 65504 overflows fp16 (NaN scores). Neither arises for q of ordinary
 * magnitude, and neither is tested. */
template <int DT, int D>
__device__ __forceinline__ void i4_load_q(const kvt_attn_kparams &p, uint32_t b,
                                          uint32_t qh0, int nheads, int g,
                                          int t, uint32_t (&qb)[D / 16][2],
                                          uint32_t &qz0, uint32_t &qz1) {
  constexpr int NG = D / 32;
  const uint16_t *q = reinterpret_cast<const uint16_t *>(p.q);
  const bool ok = g < nheads;
  const uint16_t *row = q + ((uint64_t)b * p.q_heads + qh0 + (ok ? g : 0)) * D;
  /* q[d] as the MMA sees it (fp16), and over 16 where it meets codes that
   * enter as 16 n (odd dims) */
  auto qh = [&](uint32_t w, int hi) {
    return __float2half_rn(h16_to_f<DT>((uint16_t)(w >> (16 * hi))));
  };
  auto qh16 = [&](uint32_t w, int hi) {
    return __float2half_rn(h16_to_f<DT>((uint16_t)(w >> (16 * hi))) *
                           0.0625f);
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
    qb[2 * G][1] = h2u(__halves2half2(qh16(u0.x, 1), qh16(u1.x, 1)));
    qb[2 * G + 1][0] = h2u(__halves2half2(qh(u0.y, 0), qh(u1.y, 0)));
    qb[2 * G + 1][1] = h2u(__halves2half2(qh16(u0.y, 1), qh16(u1.y, 1)));
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
 * (row g: group g % NG; heads 2t, 2t+1). FULL: all 16 tokens are valid
 * (last = 15), nothing is masked. */
template <int D, int KG, bool FULL>
__device__ __forceinline__ void
i4_tile(const uint8_t *st, int hw, int last, float sl, int g, int t,
        const uint32_t (&qb)[D / 16][2], uint32_t qz0, uint32_t qz1,
        float (&o)[D / 16][4], float (&za)[4], float &m0, float &m1,
        float &l0, float &l1) {
  using I = i4<D, KG>;
  constexpr int NG = I::NG;
  constexpr uint32_t M = 0x000F000Fu;
  /* this lane's bases in head hw of the stage: K rows g and g + 8, V rows
   * 2t, 2t + 1, 2t + 8, 2t + 9, their scale words; every read below is one
   * of these plus a constant */
  const uint8_t *kr = st + I::KO + hw * I::RB + g * I::S + 4 * t;
  const uint8_t *vr = st + I::VO + hw * I::RB + 2 * t * I::S + 2 * g;
  const uint8_t *ksr = st + I::KSO + hw * I::SCB + g * (D / 8);
  const uint8_t *vsr = st + I::VSO + hw * I::SCB + 2 * t * (D / 8);

  /* scores: the zero points' part by MMA, then each group's */
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  {
    uint32_t a0 = 0, a1 = 0;
    if (2 * t < NG) {
      const uint2 z0 = *reinterpret_cast<const uint2 *>(ksr + 8 * t);
      const uint2 z1 = *reinterpret_cast<const uint2 *>(ksr + 8 * (D / 8) +
                                                        8 * t);
      a0 = __byte_perm(z0.x, z0.y, 0x7632);
      a1 = __byte_perm(z1.x, z1.y, 0x7632);
    }
    mma16816<false>(c, a0, a1, a0, a1, qz0, qz1);
  }
  uint32_t ks0[NG], ks1[NG];
  i4_words<D>(ksr, ks0);
  i4_words<D>(ksr + 8 * (D / 8), ks1);
  float cs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int G = 0; G < NG; G++) {
    const uint32_t w0 = *reinterpret_cast<const uint32_t *>(kr + 16 * G);
    const uint32_t w1 =
        *reinterpret_cast<const uint32_t *>(kr + 8 * I::S + 16 * G);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t u0 = w0 >> 8, u1 = w1 >> 8;
    mma16816<false>(acc, w0 & M, w1 & M, w0 & (M << 4), w1 & (M << 4),
                    qb[2 * G][0], qb[2 * G][1]);
    mma16816<false>(acc, u0 & M, u1 & M, u0 & (M << 4), u1 & (M << 4),
                    qb[2 * G + 1][0], qb[2 * G + 1][1]);
    const float s0 = __half2float(__ushort_as_half((uint16_t)ks0[G]));
    const float s1 = __half2float(__ushort_as_half((uint16_t)ks1[G]));
    cs[0] = fmaf(s0, acc[0], cs[0]);
    cs[1] = fmaf(s0, acc[1], cs[1]);
    cs[2] = fmaf(s1, acc[2], cs[2]);
    cs[3] = fmaf(s1, acc[3], cs[3]);
  }
#pragma unroll
  for (int i = 0; i < 4; i++)
    c[i] = fmaf(cs[i], 16777216.0f, c[i]) * sl;
  if constexpr (!FULL) {
    /* masked by selection: rows past the end hold whatever the page holds */
    c[0] = g <= last ? c[0] : -INFINITY;
    c[1] = g <= last ? c[1] : -INFINITY;
    c[2] = g + 8 <= last ? c[2] : -INFINITY;
    c[3] = g + 8 <= last ? c[3] : -INFINITY;
  }

  uint32_t pb0, pb1;
  softmax_tile<D / 16, 1, false>(c, o, za, m0, m1, l0, l1, pb0, pb1);

  /* values of tokens 2t, 2t+1, 2t+8, 2t+9 */
  uint32_t vs[4][NG];
#pragma unroll
  for (int i = 0; i < 4; i++)
    i4_words<D>(vsr + ((i & 1) + 8 * (i >> 1)) * (D / 8), vs[i]);
  if constexpr (!FULL) { /* the page's words past the end may be anything */
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int G = 0; G < NG; G++)
        vs[i][G] = 2 * t + ((i & 1) + 8 * (i >> 1)) <= last ? vs[i][G] : 0u;
  }
  {
    const int gz = g & (NG - 1);
    uint32_t zt[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      zt[i] = *reinterpret_cast<const uint16_t *>(vsr + ((i & 1) + 8 * (i >> 1)) * (D / 8) +
                                                  4 * gz + 2);
      if constexpr (!FULL)
        zt[i] = 2 * t + ((i & 1) + 8 * (i >> 1)) <= last ? zt[i] : 0u;
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
      h[i] = *reinterpret_cast<const uint16_t *>(vr + ((i & 1) + 8 * (i >> 1)) * I::S + 16 * G);
    const uint32_t x01 = __byte_perm(h[0], h[1], 0x5410);
    const uint32_t x89 = __byte_perm(h[2], h[3], 0x5410);
    const uint32_t y01 = x01 >> 8, y89 = x89 >> 8;
    mma16816<false>(o[2 * G], x01 & M, x01 & (M << 4), x89 & M,
                    x89 & (M << 4), b0, b1);
    mma16816<false>(o[2 * G + 1], y01 & M, y01 & (M << 4), y89 & M,
                    y89 & (M << 4), b0, b1);
  }
}

/* What turns o into output units: 2^24 (codes are n 2^-24), over 16 for
 * rows 8-15 of an m tile (odd dims: their codes entered as 16 n). */
__device__ __forceinline__ float i4_out_scale(int row) {
  return row >= 8 ? 1048576.0f : 16777216.0f;
}

/* Named barrier 1 + pair of the 64 threads of a pair of warps (constant
 * ids: a register id makes ptxas reserve all 16). */
__device__ __forceinline__ void bar_pair(int pair) {
  if (pair == 0)
    asm volatile("bar.sync 1, 64;\n" ::: "memory");
  else
    asm volatile("bar.sync 2, 64;\n" ::: "memory");
}

/* The tiles of warp ww of the wph warps of its kv head: tiles ww, ww + wph,
 * ... of [cs, ce) (tile k at cs + (ww + wph k) TILE), streamed through the
 * stages at sbuf: the warp's own (KG 1, kvh its head, hw 0), or those of
 * its pair (KG 2: kvh the pair's first head, hw this warp's head in it; the
 * pair shares ww and so its tiles, and named barrier 1 + ww). */
template <int D, int KG>
__device__ __forceinline__ void
i4_loop(const kvt_attn_kparams &p, const int32_t *table, uint32_t kvh, int hw,
        int32_t cs, int32_t ce, int ww, int wph, int lane, uint8_t *sbuf,
        const uint32_t (&qb)[D / 16][2], uint32_t qz0, uint32_t qz1,
        float (&o)[D / 16][4], float (&za)[4], float &m0, float &m1,
        float &l0, float &l1) {
  using I = i4<D, KG>;
  constexpr int NS = I::NS, SB = I::SB;
  const int g = lane / 4, t = lane % 4;
  const int32_t first = cs + ww * TILE;
  const int32_t stride = wph * TILE;
  const int nt = first < ce ? (ce - first + stride - 1) / stride : 0;
  if (nt == 0)
    return;
  i4_cursor cur;
  cur.init(table, first, ce, (int32_t)p.block_size, wph, lane);
  /* KG 1: the warp copies whole stages; KG 2: head 0's warp the K half,
   * head 1's the V half */
  auto issue = [&](uint8_t *st) {
    if constexpr (KG == 1)
      i4_issue<D, KG, 0, 2 * I::HCH, true>(p, table, kvh, cur, lane, st);
    else if (hw == 0)
      i4_issue<D, KG, 0, I::HCH, true>(p, table, kvh, cur, lane, st);
    else
      i4_issue<D, KG, I::HCH, 2 * I::HCH, true>(p, table, kvh, cur, lane, st);
  };
  auto tile = [&](const uint8_t *st, int last) {
    if (last >= TILE - 1)
      i4_tile<D, KG, true>(st, hw, TILE - 1, p.scale_log2, g, t, qb, qz0, qz1,
                           o, za, m0, m1, l0, l1);
    else
      i4_tile<D, KG, false>(st, hw, last, p.scale_log2, g, t, qb, qz0, qz1, o,
                            za, m0, m1, l0, l1);
  };
#pragma unroll
  for (int k = 0; k < NS - 1; k++) {
    if (k < nt)
      issue(sbuf + k * SB);
    cp_commit();
  }
  int si = NS - 1, sc = 0; /* stages to fill and to compute */
  for (int k = 0; k < nt; k++) {
    if constexpr (KG == 1) {
      if (k + NS - 1 < nt)
        issue(sbuf + si * SB);
      cp_commit();
      cp_wait<NS - 1>();
      __syncwarp(); /* every lane's copies of tile k have landed */
    } else {
      cp_wait<NS - 2>(); /* this warp's copies of tile k have landed */
      /* and the partner's; both are done with tile k - 1's stage */
      bar_pair(ww);
      if (k + NS - 1 < nt)
        issue(sbuf + si * SB);
      cp_commit();
    }
    si = si == NS - 1 ? 0 : si + 1;
    tile(sbuf + sc * SB, ce - 1 - (first + k * stride));
    sc = sc == NS - 1 ? 0 : sc + 1;
    if constexpr (KG == 1)
      __syncwarp(); /* all reads of the stage done before it is refilled */
  }
  cp_wait<0>();
}

/* Output dim of row `row` (0..15) of the int4 value m tile j. */
__device__ __forceinline__ int i4_dim(int j, int row) {
  return 32 * (j >> 1) + 4 * (row & 7) + 2 * (j & 1) + (row >> 3);
}

#endif
