/* gpu/attn_staged.cuh - the staged path of FP8 decode attention: included by
 * attn_kernels.cu once its shared helpers (geo, plan, tile_regs, tile_step,
 * cp.async, page_stream) are defined, inside namespace kvt_attn_dev. Not a
 * header of its own: one translation unit, split by responsibility, like
 * attn_int4.cuh. */
#ifndef KVT_ATTN_STAGED_CUH
#define KVT_ATTN_STAGED_CUH

/* ---- staged path: FP8 at head_dim 128 ----
 * The register path loads half a K row per instruction (a row's fragment
 * belongs to 4 lanes) and waits for a tile's loads before computing it. The
 * staged path streams each warp's tiles through 2 stages of
 * shared memory with cp.async, whole 128-byte lines per 8 lanes, the next
 * tile in flight while one is computed, and reads each tile back into the
 * same fragment registers the register path loads (tile_regs), so the
 * arithmetic and the results are the register path's. Rows are padded so
 * that the reads back are free of bank conflicts (stg::KS, VS).
 * Measured in same-run A/Bs (bench/results/attn_staged_h200.txt): on H200s
 * the final kernel is 1.0-3.8% faster staged (ncu of a first version: its
 * long-scoreboard stalls fall from 3.2 to 0.1 cycles per issued instruction
 * and it becomes bound by issue, ALU pipe 62%); on an H100, with less
 * bandwidth to wait for, 3.8-4.8% slower, as the copies and reads back are
 * more instructions. So a decode takes the staged path on sm_90 devices
 * whose memory bandwidth (2 x memory clock x bus width) is at least 4 TB/s
 * (H200: 4.9 by this formula, H100 SXM: 3.35), or as KVT_ATTN_FP8_PATH or
 * kvt_attnrt_set_fp8_path says. Other devices were not measured. K16V8
 * (swizzled-chunk versions) was -0.2 to +0.8% on two H200s and 0.7-1.3%
 * slower on a third, so it keeps the register path, as do head dims 64 and
 * 256. Whole-line copies assume 128-byte aligned k/v (as cudaMalloc gives;
 * the API asks for 16). */
template <int FMT, int DT, int D> struct stg {
  using G = geo<FMT, DT, D>;
  static constexpr bool can = D == 128 && FMT == KVT_ATTN_FP8;
  static constexpr int NS = 2; /* 3: no faster, and over 48 KiB a CTA */
  static constexpr int KCH = G::RBK / 16, VCH = G::RBV / 16; /* chunks a row */
  /* Row strides: the reads back are free of bank conflicts, and every
   * address a lane reads is its base plus a constant. A K read takes rows
   * g and g + 8 at bytes 16 t + 64 u (a quarter warp: two rows of 64
   * bytes), so K rows lie 64 bytes off a multiple of 128; a V read takes
   * rows 2 t + i at bytes 16 g (a quarter warp: four rows of 32 bytes), so
   * V rows lie 16 bytes off one. */
  static constexpr int KS = G::RBK + 64, VS = G::RBV + 16;
  static constexpr bool SK = FMT == KVT_ATTN_FP8; /* K scales */
  static constexpr bool SV = FMT == KVT_ATTN_FP8 || FMT == KVT_ATTN_K16V8;
  static constexpr int KO = 0, VO = TILE * KS, SKO = VO + TILE * VS,
                       SVO = SKO + (SK ? 64 : 0);
  static constexpr int SB = SVO + (SV ? 64 : 0); /* bytes of a stage */
  static constexpr int BUF = NWARPS * NS * SB;
};

/* What a lane copies of every tile, fixed for the loop. Copy i of a lane
 * is 16-byte chunk lane + 32 i of the tile: K rows (KCH chunks each), then
 * V rows (VCH), then the scale blocks (4 chunks each, one copy by lanes
 * 0-7). The row of copy i is the lane's first row plus i 32 / KCH (V: 32 /
 * VCH), so a lane keeps its first chunk's offsets and steps from there. */
template <int FMT, int DT, int D> struct stg_lane {
  using S = stg<FMT, DT, D>;
  using G = geo<FMT, DT, D>;
  static_assert(S::KCH == 8 && S::VCH == 8, "rows of 8 chunks");
  uint32_t gk, gv; /* global offsets of the lane's first K and V chunk */
  uint32_t sk, sv; /* their offsets in a stage */
  int rk;          /* the first row (K and V alike) */
  __device__ __forceinline__ void init(int lane, uint32_t kv_heads) {
    const int c = lane % 8;
    rk = lane / 8;
    gk = (uint32_t)rk * kv_heads * G::RBK + c * 16;
    gv = (uint32_t)rk * kv_heads * G::RBV + c * 16;
    sk = S::KO + rk * S::KS + c * 16;
    sv = S::VO + rk * S::VS + c * 16;
  }
};

/* Copies tile (row0, sc0, last) into stage st. FULL: all 16 rows valid;
 * otherwise rows past `last` repeat row `last` (the register path's clamp).
 * The scales of all 16 rows are copied (the page holds them; stg_loop
 * overwrites those past `last` before they are read). */
template <int FMT, int DT, int D, bool FULL>
__device__ __forceinline__ void
stg_issue(const kvt_attn_kparams &p, const stg_lane<FMT, DT, D> &ln,
          uint64_t row0, uint64_t sc0, int last, int lane, uint8_t *st) {
  using S = stg<FMT, DT, D>;
  using G = geo<FMT, DT, D>;
  constexpr int NSC = (S::SK ? 4 : 0) + (S::SV ? 4 : 0); /* scale chunks */
  const uint8_t *kt = reinterpret_cast<const uint8_t *>(p.k) + row0 * G::RBK;
  const uint8_t *vt = reinterpret_cast<const uint8_t *>(p.v) + row0 * G::RBV;
  const uint32_t rsk = p.kv_heads * G::RBK * 4, rsv = p.kv_heads * G::RBV * 4;
#pragma unroll
  for (int i = 0; i < 4; i++) { /* rows rk + 4 i */
    uint32_t gok = ln.gk + i * rsk, gov = ln.gv + i * rsv;
    if (!FULL) {
      const int r = ln.rk + 4 * i;
      if (r > last) {
        gok -= (uint32_t)(r - last) * p.kv_heads * G::RBK;
        gov -= (uint32_t)(r - last) * p.kv_heads * G::RBV;
      }
    }
    cp_async<16>(st + ln.sk + 4 * i * S::KS, kt + gok);
    cp_async<16>(st + ln.sv + 4 * i * S::VS, vt + gov);
  }
  if (lane < NSC) {
    const bool isk = S::SK && lane < 4;
    const uint8_t *sb = reinterpret_cast<const uint8_t *>(
        isk ? p.k_scale : p.v_scale);
    cp_async<16>(st + S::SKO + lane * 16, sb + sc0 * 4 + (lane & 3) * 16);
  }
}

/* A staged tile into fragment registers, as load_k / load_v would: K rows
 * g, g + 8 at chunks t + 4 u, V rows 2 t + (i & 1) + 8 (i >> 1) at chunk g,
 * the scales of those rows (every row's is valid: see stg_loop). kb, vb,
 * ksb, vsb: the lane's bases in a stage (stg_loop). */
template <int FMT, int DT, int D>
__device__ __forceinline__ void stg_read(const uint8_t *st, uint32_t kb,
                                         uint32_t vb, uint32_t ksb,
                                         uint32_t vsb,
                                         tile_regs<FMT, DT, D> &r) {
  using S = stg<FMT, DT, D>;
  using G = geo<FMT, DT, D>;
  static_assert(G::UK == 16 && G::UV == 16 && G::NUV == 1, "16-byte units");
  const uint8_t *k = st + kb, *v = st + vb;
  const float *sk = reinterpret_cast<const float *>(st + ksb);
  const float *sv = reinterpret_cast<const float *>(st + vsb);
#pragma unroll
  for (int i = 0; i < 2; i++) {
#pragma unroll
    for (int u = 0; u < G::NUK; u++) {
      const uint4 w =
          *reinterpret_cast<const uint4 *>(k + 8 * i * S::KS + 64 * u);
      r.kw[i][4 * u] = w.x, r.kw[i][4 * u + 1] = w.y;
      r.kw[i][4 * u + 2] = w.z, r.kw[i][4 * u + 3] = w.w;
    }
    if constexpr (S::SK)
      r.ks[i] = sk[8 * i];
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int dr = (i & 1) + 8 * (i >> 1);
    const uint4 w = *reinterpret_cast<const uint4 *>(v + dr * S::VS);
    r.vw[i][0] = w.x, r.vw[i][1] = w.y, r.vw[i][2] = w.z, r.vw[i][3] = w.w;
    if constexpr (S::SV)
      r.vs[i] = sv[dr];
  }
}

/* The staged loop of one warp: tiles warp, warp + NWARPS, ... of [cs, ce). */
template <int FMT, int DT, int D>
__device__ __forceinline__ void
stg_loop(const kvt_attn_kparams &p, const int32_t *table, uint32_t kvh,
         int32_t cs, int32_t ce, int warp, int lane, uint8_t *sbuf,
         const uint32_t (&qb)[geo<FMT, DT, D>::NT][2],
         float (&o)[geo<FMT, DT, D>::NT][4], float &m0, float &m1, float &l0,
         float &l1) {
  using S = stg<FMT, DT, D>;
  constexpr int NS = S::NS;
  /* the register path's tile order (warp w: tiles w, w + NWARPS, ...) and
   * its V loads with the K loads, or the two paths' bits would differ */
  static_assert(plan<FMT, DT, D>::U == 1 && plan<FMT, DT, D>::early_v,
                "the staged path walks the register path's tiles");
  const int g = lane / 4, t = lane % 4;
  const int32_t first = cs + warp * TILE, stride = NWARPS * TILE;
  const int nt = first < ce ? (ce - first + stride - 1) / stride : 0;
  if (nt == 0)
    return;
  page_stream<1> pages;
  pages.init(table, first, stride, ce, (int32_t)p.block_size, lane);
  stg_lane<FMT, DT, D> ln;
  ln.init(lane, p.kv_heads);
  /* the lane's read bases in a stage (stg_read) */
  const uint32_t kb = S::KO + g * S::KS + 16 * t, vb = S::VO + 2 * t * S::VS + 16 * g;
  const uint32_t ksb = S::SKO + 4 * g, vsb = S::SVO + 8 * t;
  auto issue = [&](int k) {
    const int32_t ts = first + k * stride;
    const uint32_t page = pages.page(k, lane);
    const uint32_t off0 = (uint32_t)ts % p.block_size;
    const uint64_t row0 =
        ((uint64_t)page * p.block_size + off0) * p.kv_heads + kvh;
    const uint64_t sc0 =
        ((uint64_t)page * p.kv_heads + kvh) * p.block_size + off0;
    const int last = min(TILE - 1, ce - 1 - ts);
    uint8_t *st = sbuf + (k % NS) * S::SB;
    if (last == TILE - 1)
      stg_issue<FMT, DT, D, true>(p, ln, row0, sc0, last, lane, st);
    else
      stg_issue<FMT, DT, D, false>(p, ln, row0, sc0, last, lane, st);
  };
#pragma unroll
  for (int k = 0; k < NS - 1; k++) {
    if (k < nt)
      issue(k);
    cp_commit();
  }
  for (int k = 0; k < nt; k++) {
    if (k + NS - 1 < nt)
      issue(k + NS - 1);
    cp_commit();
    cp_wait<NS - 1>();
    __syncwarp(); /* every lane's copies of tile k have landed */
    const int32_t ts = first + k * stride;
    tile_addr ta;
    ta.row0 = 0, ta.sc0 = 0; /* unused: the tile is in registers */
    ta.last = min(TILE - 1, ce - 1 - ts);
    uint8_t *st = sbuf + (k % NS) * S::SB;
    if (ta.last < TILE - 1) { /* rows past the end take row last's scales */
      float *sc = reinterpret_cast<float *>(st + S::SKO);
      const int r = lane % 16;
      const bool v = lane >= 16;
      if (r > ta.last && (v ? S::SV : S::SK))
        sc[(v && S::SK ? 16 : 0) + r] = sc[(v && S::SK ? 16 : 0) + ta.last];
      __syncwarp();
    }
    tile_regs<FMT, DT, D> r;
    stg_read<FMT, DT, D>(st, kb, vb, ksb, vsb, r);
    __syncwarp(); /* the stage is read: the next iteration may refill it */
    tile_step<FMT, DT, D>(p, ta, g, t, r, qb, o, m0, m1, l0, l1);
  }
  cp_wait<0>();
}

#endif
