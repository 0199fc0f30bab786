/* codec/kernels_avx2.c - AVX2 + F16C element kernels, chosen at run time.
 * Each must give the same bytes as codec/kernels_scalar.c: the same IEEE
 * operations in the same order, eight or sixteen at a time. What a vector
 * cannot reproduce cheaply (the index of the first non-finite element, the
 * sign of a zero minimum, a NaN scale, a short tail) goes to scalar code. */
#include "codec_internal.h"

#ifdef KVT_HAVE_AVX2

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* Every helper takes the dtype as a constant after inlining, so each kernel
 * compiles to one loop per dtype with no branch inside. */
#define AVX2_INLINE static inline __attribute__((always_inline))

/* The "#pragma GCC unroll" lines: -O2 leaves short loops over arrays of
 * vectors rolled and spills the arrays to the stack; unrolled, they stay in
 * registers. */

static const kvt_kernels *scalar(void) { return kvt_kernels_scalar(); }

/* Smallest 16-bit magnitude pattern that is Inf or NaN. */
static uint16_t nonfinite_mag(int dtype) { return dtype == KVT_DTYPE_BF16 ? 0x7F80u : 0x7C00u; }

/* ---- 16-bit <-> fp32 ------------------------------------------------------ */

/* kvt_h2f for a finite element, inline: F16C converts fp16 exactly. */
static inline float h2f(uint16_t h, int dtype) {
  if (dtype != KVT_DTYPE_BF16)
    return _cvtsh_ss(h);
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Eight elements, in order. */
AVX2_INLINE __m256 ld8(const uint16_t *p, int bf16) {
  const __m128i h = _mm_loadu_si128((const __m128i *)p);
  if (bf16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

/* 32 elements as four vectors in "pack order": bf16 widens by interleaving
 * with zeros inside each 128-bit lane (one shuffle per eight), f16 in order;
 * pack32() undoes either arrangement. */
AVX2_INLINE void ld32(const uint16_t *p, int bf16, __m256 x[4]) {
  if (bf16) {
    const __m256i z = _mm256_setzero_si256();
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)p);
    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(p + 16));
    x[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v0));
    x[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v0));
    x[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v1));
    x[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v1));
    return;
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++)
    x[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8 * k)));
}

/* The dword order that undoes ld32()'s arrangement after two rounds of packs. */
AVX2_INLINE __m256i pack_order(int bf16) {
  return bf16 ? _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7)
              : _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
}

/* Four vectors of int8 values in 32-bit lanes, loaded by ld32(), to 32 bytes
 * in element order. */
AVX2_INLINE __m256i pack_i8x32(const __m256i r[4], int bf16) {
  const __m256i p0 = _mm256_packs_epi32(r[0], r[1]);
  const __m256i p1 = _mm256_packs_epi32(r[2], r[3]);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p0, p1), pack_order(bf16));
}

/* Eight byte values in 32-bit lanes (in order) to 8 bytes at d. */
AVX2_INLINE void st_bytes8(uint8_t *d, __m256i r, int sat_signed) {
  const __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  const __m128i b = sat_signed ? _mm_packs_epi16(p, p) : _mm_packus_epi16(p, p);
  _mm_storel_epi64((__m128i *)d, b);
}

/* kvt_f32_to_bf16 for non-NaN values: the same integer round to nearest even.
 * The 16-bit results sit in the low halves of the 32-bit lanes. */
AVX2_INLINE __m256i bf16_x8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
  return _mm256_srli_epi32(r, 16);
}

/* The same for any value: NaN keeps sign and payload and turns quiet. */
AVX2_INLINE __m256i bf16_nan_x8(__m256 v) {
  const __m256i q =
      _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(bf16_x8(v), q, nan);
}

AVX2_INLINE __m256i to_bf16(__m256 v, int nan_safe) {
  return nan_safe ? bf16_nan_x8(v) : bf16_x8(v);
}

/* Sixteen fp32 values, in order, to 16-bit elements. F16C's nearest-even
 * conversion matches kvt_f32_to_f16 for every input, NaN included. */
AVX2_INLINE void st16(uint16_t *d, __m256 a, __m256 b, int bf16, int nan_safe) {
  if (bf16) {
    const __m256i p = _mm256_packus_epi32(to_bf16(a, nan_safe), to_bf16(b, nan_safe));
    _mm256_storeu_si256((__m256i *)d, _mm256_permute4x64_epi64(p, 0xD8));
    return;
  }
  _mm_storeu_si128((__m128i *)d, _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  _mm_storeu_si128((__m128i *)(d + 8), _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT));
}

AVX2_INLINE void st8(uint16_t *d, __m256 a, int bf16, int nan_safe) {
  if (bf16) {
    const __m256i r = to_bf16(a, nan_safe);
    _mm_storeu_si128((__m128i *)d,
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
    return;
  }
  _mm_storeu_si128((__m128i *)d, _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
}

/* ---- e4m3 ----------------------------------------------------------------- */

/* kvt_f32_to_e4m3 without its sign or saturation: the code less 8 per 32-bit
 * lane (at most 0x42F, beyond 0x76 where it must saturate), and a NaN mask.
 * Below 2^-6 the e4m3 step is 2^-9, the ulp of 16384, so one nearest-even
 * addition rounds as the scalar path does. At and above 2^-6, an integer
 * round to nearest even at bit 20, re-biased. Where that integer formula is
 * meaningless (below about 2^-6) it is 0 or, shifted from a negative number,
 * above 0x800; at or above 2^-6 the subnormal formula is at least the normal
 * one. So a signed min picks the right one with no compare and no blend.
 * tests/test_fp8_exhaustive.c checks all 2^32 inputs. */
AVX2_INLINE __m256i e4m3_mag8(__m256 y, __m256i *nan) {
  const __m256i ay = _mm256_and_si256(_mm256_castps_si256(y), _mm256_set1_epi32(0x7FFFFFFF));
  const __m256 t = _mm256_add_ps(_mm256_castsi256_ps(ay), _mm256_set1_ps(16384.0f));
  const __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x46800008));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(ay, 20), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_set1_epi32(0x7FFFF - (120 << 23) - (8 << 20));
  const __m256i nrm = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(ay, bias), lsb), 20);
  *nan = _mm256_cmpgt_epi32(ay, _mm256_set1_epi32(0x7F800000));
  return _mm256_min_epi32(nrm, sub);
}

/* The bytes from (code - 8) clamped to 0x76 (448), sign source and NaN mask,
 * for any lane width: only each lane's low byte counts. */
AVX2_INLINE __m256i e4m3_finish(__m256i m8, __m256i sign, __m256i nan) {
  const __m256i code = _mm256_add_epi8(m8, _mm256_set1_epi8(8));
  const __m256i b = _mm256_or_si256(code, _mm256_and_si256(sign, _mm256_set1_epi8(-128)));
  return _mm256_blendv_epi8(b, _mm256_set1_epi8(0x7F), nan);
}

/* kvt_f32_to_e4m3 of eight values, the bytes in 32-bit lanes. */
AVX2_INLINE __m256i e4m3_x8(__m256 y) {
  __m256i nan;
  const __m256i m8 = _mm256_min_epi32(e4m3_mag8(y, &nan), _mm256_set1_epi32(0x76));
  const __m256i b = e4m3_finish(m8, _mm256_srli_epi32(_mm256_castps_si256(y), 24), nan);
  return _mm256_and_si256(b, _mm256_set1_epi32(0xFF));
}

/* Half of e4m3_x32(): 16 values to 16-bit lanes of code - 8, sign source and
 * NaN mask, packed as soon as made to keep few vectors live. */
AVX2_INLINE void e4m3_x16(__m256 y0, __m256 y1, __m256i *m, __m256i *sign, __m256i *nan) {
  __m256i n0, n1;
  const __m256i m0 = e4m3_mag8(y0, &n0), m1 = e4m3_mag8(y1, &n1);
  *m = _mm256_packs_epi32(m0, m1);
  *nan = _mm256_packs_epi32(n0, n1);
  *sign = _mm256_packs_epi32(_mm256_castps_si256(y0), _mm256_castps_si256(y1));
}

/* kvt_f32_to_e4m3 of 32 values in ld32() order. The signed saturating packs
 * carry each lane's sign and NaN mask to its byte and keep code - 8 (up to
 * 0x42F) above 0x76, so saturation, sign and NaN cost one op per 32 bytes. */
AVX2_INLINE __m256i e4m3_x32(const __m256 y[4], __m256i idx) {
  __m256i m0, s0, n0, m1, s1, n1;
  e4m3_x16(y[0], y[1], &m0, &s0, &n0);
  e4m3_x16(y[2], y[3], &m1, &s1, &n1);
  const __m256i m8 = _mm256_min_epi8(_mm256_packs_epi16(m0, m1), _mm256_set1_epi8(0x76));
  const __m256i b = e4m3_finish(m8, _mm256_packs_epi16(s0, s1), _mm256_packs_epi16(n0, n1));
  return _mm256_permutevar8x32_epi32(b, idx);
}

/* e4m3 value of eight bytes (not 0x7F or 0xFF) times s2 = scale * 2^120: the
 * byte's bits placed in fp32's fields are the value times 2^-120 (a
 * subnormal for e4m3 subnormals), so one multiply rounds the exact product
 * e4m3 * scale once, as the scalar path's exact re-bias and multiply do. */
AVX2_INLINE __m256 dq_e4m3_x8(const uint8_t *p, __m256 s2) {
  const __m256i b = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
  const __m256i bits =
      _mm256_and_si256(_mm256_slli_epi32(b, 20), _mm256_set1_epi32((int)0x87F00000u));
  return _mm256_mul_ps(_mm256_castsi256_ps(bits), s2);
}

/* ---- range kernels -------------------------------------------------------- */

static uint16_t hmax_u16(__m256i v) {
  __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi16(-1)));
  return (uint16_t)~_mm_extract_epi16(m, 0);
}

/* Largest magnitude bit pattern (sign cleared) of n elements. Within one
 * dtype, magnitude order is integer order, NaN and Inf above every finite. */
static uint16_t max_mag(const uint16_t *src, size_t n) {
  const __m256i mask = _mm256_set1_epi16(0x7FFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
    const __m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 16));
    m0 = _mm256_max_epu16(m0, _mm256_and_si256(a, mask));
    m1 = _mm256_max_epu16(m1, _mm256_and_si256(b, mask));
  }
  if (i + 16 <= n) {
    m0 = _mm256_max_epu16(m0,
                          _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(src + i)), mask));
    i += 16;
  }
  uint16_t r = hmax_u16(_mm256_max_epu16(m0, m1));
  for (; i < n; i++)
    r = (uint16_t)((src[i] & 0x7FFFu) > r ? (src[i] & 0x7FFFu) : r);
  return r;
}

static size_t first_nonfinite(const uint16_t *src, size_t n, uint16_t lim) {
  for (size_t i = 0; i < n; i++)
    if ((src[i] & 0x7FFFu) >= lim)
      return i;
  return n;
}

static size_t a_amax(const uint16_t *src, size_t n, int dtype, float *amax) {
  const uint16_t lim = nonfinite_mag(dtype);
  const uint16_t m = max_mag(src, n);
  if (m >= lim)
    return first_nonfinite(src, n, lim);
  *amax = h2f(m, dtype); /* fabsf of the largest element, bit for bit */
  return n;
}

/* Sign-magnitude to an int16 key whose signed order is the value order, with
 * -0 just below +0; the map is its own inverse. */
AVX2_INLINE __m256i key16(__m256i h) {
  return _mm256_xor_si256(h, _mm256_and_si256(_mm256_srai_epi16(h, 15), _mm256_set1_epi16(0x7FFF)));
}
static int16_t key1(uint16_t h) { return (int16_t)(h ^ ((h & 0x8000u) ? 0x7FFFu : 0u)); }

/* The element at the first zero of either sign: the scalar loops keep the
 * first of equal values, and a zero extreme takes that zero's sign. */
static uint16_t first_zero(const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(src + i));
    const __m256i z =
        _mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7FFF)), _mm256_setzero_si256());
    const unsigned m = (unsigned)_mm256_movemask_epi8(z);
    if (m)
      return src[i + (size_t)__builtin_ctz(m) / 2];
  }
  for (; i < n; i++)
    if (!(src[i] & 0x7FFFu))
      return src[i];
  return 0;
}

/* Signed min and max keys of n >= 16 elements. */
static void minmax_keys(const uint16_t *src, size_t n, int16_t *lo, int16_t *hi) {
  __m256i vlo = _mm256_set1_epi16(0x7FFF), vhi = _mm256_set1_epi16(-0x8000);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i k = key16(_mm256_loadu_si256((const __m256i *)(src + i)));
    vlo = _mm256_min_epi16(vlo, k);
    vhi = _mm256_max_epi16(vhi, k);
  }
  /* minpos is unsigned: flipping the sign bit keeps signed order, and
   * flipping the other bits too reverses it for the max. */
  __m128i l = _mm_min_epi16(_mm256_castsi256_si128(vlo), _mm256_extracti128_si256(vlo, 1));
  __m128i h = _mm_max_epi16(_mm256_castsi256_si128(vhi), _mm256_extracti128_si256(vhi, 1));
  l = _mm_minpos_epu16(_mm_xor_si128(l, _mm_set1_epi16(-0x8000)));
  h = _mm_minpos_epu16(_mm_xor_si128(h, _mm_set1_epi16(0x7FFF)));
  int16_t kl = (int16_t)(_mm_extract_epi16(l, 0) ^ 0x8000);
  int16_t kh = (int16_t)(_mm_extract_epi16(h, 0) ^ 0x7FFF);
  for (; i < n; i++) {
    const int16_t k = key1(src[i]);
    kl = k < kl ? k : kl;
    kh = k > kh ? k : kh;
  }
  *lo = kl;
  *hi = kh;
}

static size_t a_minmax(const uint16_t *src, size_t n, int dtype, float *mn, float *mx) {
  if (n < 16)
    return scalar()->minmax(src, n, dtype, mn, mx);
  const uint16_t lim = nonfinite_mag(dtype);
  int16_t lo, hi;
  minmax_keys(src, n, &lo, &hi);
  if (hi >= key1(lim) || lo <= key1((uint16_t)(0x8000u | lim)))
    return first_nonfinite(src, n, lim);
  uint16_t hlo = (uint16_t)key1((uint16_t)lo), hhi = (uint16_t)key1((uint16_t)hi);
  if (!(hlo & 0x7FFFu))
    hlo = first_zero(src, n);
  if (!(hhi & 0x7FFFu))
    hhi = first_zero(src, n);
  *mn = h2f(hlo, dtype);
  *mx = h2f(hhi, dtype);
  return n;
}

/* Lane j of the result: the min (max) over the eight lanes of vector j. */
AVX2_INLINE __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d, int max) {
#define RED_(x, y) (max ? _mm256_max_ps(x, y) : _mm256_min_ps(x, y))
  const __m256 ab = RED_(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
  const __m256 cd = RED_(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
  const __m256 r = RED_(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                        _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
#undef RED_
  const __m128 lo = _mm256_castps256_ps128(r), hi = _mm256_extractf128_ps(r, 1);
  return max ? _mm_max_ps(lo, hi) : _mm_min_ps(lo, hi);
}

/* Four groups of G (a multiple of 8) at p: their min and max into mn/mx.
 * Returns nonzero when a value is NaN or Inf. */
AVX2_INLINE int minmax4_body(const uint16_t *p, size_t G, int bf16, float *mn, float *mx) {
  __m256 lo[4], hi[4], bad = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int j = 0; j < 4; j++) {
    const uint16_t *g = p + (size_t)j * G;
    lo[j] = hi[j] = ld8(g, bf16);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(lo[j], absmask), inf, _CMP_NLT_UQ));
    for (size_t i = 8; i < G; i += 8) {
      const __m256 x = ld8(g + i, bf16);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(x, absmask), inf, _CMP_NLT_UQ));
      lo[j] = _mm256_min_ps(lo[j], x);
      hi[j] = _mm256_max_ps(hi[j], x);
    }
  }
  if (_mm256_movemask_ps(bad))
    return 1;
  _mm_storeu_ps(mn, reduce4(lo[0], lo[1], lo[2], lo[3], 0));
  _mm_storeu_ps(mx, reduce4(hi[0], hi[1], hi[2], hi[3], 1));
  return 0;
}

/* Four groups per step, reduced across groups with shuffles rather than one
 * horizontal reduction each: groups of 32 are a few vectors, and the
 * reduction is what costs. */
static size_t a_minmax_groups(const uint16_t *src, size_t n, size_t G, int dtype, float *mn,
                              float *mx) {
  const size_t ng = n / G;
  if (G % 8 || ng % 4)
    return scalar()->minmax_groups(src, n, G, dtype, mn, mx);
  const int bf16 = dtype == KVT_DTYPE_BF16;
  for (size_t g = 0; g < ng; g += 4) {
    int bad = bf16 ? minmax4_body(src + g * G, G, 1, mn + g, mx + g)
                   : minmax4_body(src + g * G, G, 0, mn + g, mx + g);
    if (bad) /* the scalar kernel finds the first non-finite element */
      return g * G + scalar()->minmax_groups(src + g * G, n - g * G, G, dtype, mn + g, mx + g);
  }
  return n;
}

AVX2_INLINE void minmax_acc_body(const uint16_t *src, size_t n, int bf16, float *mn, float *mx) {
  /* min_ps(x, m) is x < m ? x : m, the scalar expression, equal zeros and all. */
  for (size_t i = 0; i < n; i += 8) {
    const __m256 x = ld8(src + i, bf16);
    _mm256_storeu_ps(mn + i, _mm256_min_ps(x, _mm256_loadu_ps(mn + i)));
    _mm256_storeu_ps(mx + i, _mm256_max_ps(x, _mm256_loadu_ps(mx + i)));
  }
}

static size_t a_minmax_acc(const uint16_t *src, size_t n, int dtype, float *mn, float *mx) {
  /* A non-finite element is rare: the scalar kernel then does the partial
   * update and finds its index. */
  if (n < 8 || max_mag(src, n) >= nonfinite_mag(dtype))
    return scalar()->minmax_acc(src, n, dtype, mn, mx);
  const size_t nv = n & ~(size_t)7;
  if (dtype == KVT_DTYPE_BF16)
    minmax_acc_body(src, nv, 1, mn, mx);
  else
    minmax_acc_body(src, nv, 0, mn, mx);
  if (nv < n)
    scalar()->minmax_acc(src + nv, n - nv, dtype, mn + nv, mx + nv);
  return n;
}

/* ---- e4m3 and i8 quantisation --------------------------------------------- */

/* clamp(rintf(y), lo, hi) as int32 for non-NaN y. Clamping first and then
 * converting (nearest even, the MXCSR default that every path assumes, as
 * rintf does) is the same as rounding first, since the bounds are integers
 * and rounding is monotone, and it saves the separate round of
 * _mm256_round_ps. min_ps/max_ps are y < b ? y : b and y > b ? y : b; a -0
 * result becomes 0 either way. */
AVX2_INLINE __m256i clamp_rint(__m256 y, float lo, float hi) {
  const __m256 c = _mm256_max_ps(_mm256_min_ps(y, _mm256_set1_ps(hi)), _mm256_set1_ps(lo));
  return _mm256_cvtps_epi32(c);
}

enum { Q_E4M3, Q_I8 };

/* Bytes of eight elements: e4m3(x * inv), or clamp(rint(x * inv), +-127). */
AVX2_INLINE __m256i q_x8(__m256 x, __m256 inv, int kind) {
  const __m256 y = _mm256_mul_ps(x, inv);
  if (kind == Q_E4M3)
    return e4m3_x8(y);
  return clamp_rint(y, -127.0f, 127.0f);
}

/* The same for 32 elements loaded by ld32(), as 32 bytes in element order. */
AVX2_INLINE __m256i q_x32(const __m256 x[4], __m256 inv, int bf16, int kind) {
  __m256 y[4];
  __m256i r[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++)
    y[k] = _mm256_mul_ps(x[k], inv);
  if (kind == Q_E4M3)
    return e4m3_x32(y, pack_order(bf16));
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++)
    r[k] = clamp_rint(y[k], -127.0f, 127.0f);
  return pack_i8x32(r, bf16);
}

/* Returns how many leading elements were done (a multiple of 8). */
AVX2_INLINE size_t q_body(const uint16_t *src, size_t n, int bf16, float inv, uint8_t *dst,
                          int kind) {
  const __m256 vi = _mm256_set1_ps(inv);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 x[4];
    ld32(src + i, bf16, x);
    _mm256_storeu_si256((__m256i *)(dst + i), q_x32(x, vi, bf16, kind));
  }
  for (; i + 8 <= n; i += 8)
    st_bytes8(dst + i, q_x8(ld8(src + i, bf16), vi, kind), kind == Q_I8);
  return i;
}

static void a_q_e4m3(const uint16_t *src, size_t n, int dtype, float inv, uint8_t *dst) {
  const size_t i = dtype == KVT_DTYPE_BF16 ? q_body(src, n, 1, inv, dst, Q_E4M3)
                                           : q_body(src, n, 0, inv, dst, Q_E4M3);
  if (i < n)
    scalar()->q_e4m3(src + i, n - i, dtype, inv, dst + i);
}

static void a_q_i8(const uint16_t *src, size_t n, int dtype, float inv, int8_t *dst) {
  uint8_t *d = (uint8_t *)dst;
  const size_t i =
      dtype == KVT_DTYPE_BF16 ? q_body(src, n, 1, inv, d, Q_I8) : q_body(src, n, 0, inv, d, Q_I8);
  if (i < n)
    scalar()->q_i8(src + i, n - i, dtype, inv, dst + i);
}

/* ---- e4m3 and i8 dequantisation ------------------------------------------- */

/* Whether any byte is an e4m3 NaN (0x7F or 0xFF). */
static int any_e4m3_nan(const uint8_t *src, size_t n) {
  const __m256i m7f = _mm256_set1_epi8(0x7F);
  __m256i acc = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(src + i));
    acc = _mm256_or_si256(acc, _mm256_cmpeq_epi8(_mm256_and_si256(v, m7f), m7f));
  }
  if (!_mm256_testz_si256(acc, acc))
    return 1;
  for (; i < n; i++)
    if ((src[i] & 0x7Fu) == 0x7Fu)
      return 1;
  return 0;
}

enum { DQ_E4M3, DQ_I8 };

/* Eight dequantised fp32 values from src at element i (before rounding). */
AVX2_INLINE __m256 dq_x8(const uint8_t *src, size_t i, __m256 s, int kind) {
  if (kind == DQ_E4M3)
    return dq_e4m3_x8(src + i, s);
  const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(q), s);
}

/* Callers ensure no output is NaN, so bf16 needs no NaN case. */
AVX2_INLINE size_t dq_body(const uint8_t *src, size_t n, float s, int bf16, uint16_t *dst,
                           int kind) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    st16(dst + i, dq_x8(src, i, vs, kind), dq_x8(src, i + 8, vs, kind), bf16, 0);
  for (; i + 8 <= n; i += 8)
    st8(dst + i, dq_x8(src, i, vs, kind), bf16, 0);
  return i;
}

static void a_dq_e4m3(const uint8_t *src, size_t n, float scale, int dtype, uint16_t *dst) {
  /* scale * 2^120 must be exact (|scale| < 2^8: amax below 114688) and no
   * byte a NaN; otherwise, never for payloads this library writes from
   * realistic KV, the scalar kernel does it. */
  size_t i = 0;
  if (fabsf(scale) < 0x1p8f && !any_e4m3_nan(src, n)) {
    const float s2 = scale * 0x1p120f;
    i = dtype == KVT_DTYPE_BF16 ? dq_body(src, n, s2, 1, dst, DQ_E4M3)
                                : dq_body(src, n, s2, 0, dst, DQ_E4M3);
  }
  if (i < n)
    scalar()->dq_e4m3(src + i, n - i, scale, dtype, dst + i);
}

static void a_dq_i8(const int8_t *src, size_t n, float scale, int dtype, uint16_t *dst) {
  const uint8_t *s = (const uint8_t *)src;
  size_t i = 0;
  if (isfinite(scale)) /* then q * scale is never NaN */
    i = dtype == KVT_DTYPE_BF16 ? dq_body(s, n, scale, 1, dst, DQ_I8)
                                : dq_body(s, n, scale, 0, dst, DQ_I8);
  if (i < n)
    scalar()->dq_i8(src + i, n - i, scale, dtype, dst + i);
}

/* ---- i4 ------------------------------------------------------------------- */

/* clamp(rint((x - zero) * inv), 0, 15) as int32. */
AVX2_INLINE __m256i q4_x8(__m256 x, __m256 zero, __m256 inv) {
  return clamp_rint(_mm256_mul_ps(_mm256_sub_ps(x, zero), inv), 0.0f, 15.0f);
}

/* Sixteen elements split into the even ones and the odd ones, each in order:
 * the two nibbles of a byte then sit in the same lane of e and o. */
AVX2_INLINE void ld16_eo(const uint16_t *p, int bf16, __m256 *e, __m256 *o) {
  const __m256i v = _mm256_loadu_si256((const __m256i *)p);
  if (bf16) {
    *e = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *o = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
    return;
  }
  const __m256i sh = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4,
                                      5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  const __m256i d = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, sh), 0xD8);
  *e = _mm256_cvtph_ps(_mm256_castsi256_si128(d));
  *o = _mm256_cvtph_ps(_mm256_extracti128_si256(d, 1));
}

/* Eight code bytes (even nibble low) in 32-bit lanes from nibble values. */
AVX2_INLINE __m256i nib_join(__m256i qe, __m256i qo) {
  return _mm256_or_si256(qe, _mm256_slli_epi32(qo, 4));
}

/* Two nib_join() results (16 code bytes) stored in order. */
AVX2_INLINE void st_codes16(uint8_t *d, __m256i a, __m256i b) {
  const __m256i p = _mm256_packs_epi32(a, b);
  const __m256i q = _mm256_packus_epi16(p, p);
  _mm_storeu_si128((__m128i *)d,
                   _mm_unpacklo_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
}

AVX2_INLINE __m256i q_i4_x16(const uint16_t *p, int bf16, __m256 z, __m256 iv) {
  __m256 e, o;
  ld16_eo(p, bf16, &e, &o);
  return nib_join(q4_x8(e, z, iv), q4_x8(o, z, iv));
}

AVX2_INLINE size_t q_i4_body(const uint16_t *src, size_t n, int bf16, float zero, float inv,
                             uint8_t *dst) {
  const __m256 z = _mm256_set1_ps(zero), iv = _mm256_set1_ps(inv);
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    st_codes16(dst + i / 2, q_i4_x16(src + i, bf16, z, iv), q_i4_x16(src + i + 16, bf16, z, iv));
  if (i + 16 <= n) {
    st_bytes8(dst + i / 2, q_i4_x16(src + i, bf16, z, iv), 0);
    i += 16;
  }
  return i;
}

static void a_q_i4(const uint16_t *src, size_t n, int dtype, float zero, float inv, uint8_t *dst) {
  const size_t i = dtype == KVT_DTYPE_BF16 ? q_i4_body(src, n, 1, zero, inv, dst)
                                           : q_i4_body(src, n, 0, zero, inv, dst);
  if (i < n)
    scalar()->q_i4(src + i, n - i, dtype, zero, inv, dst + i / 2);
}

/* Channel parameters come in element order, so the elements stay in order:
 * nibbles of 16 elements (from in-order 8-lane vectors) pair up as adjacent
 * 16-bit lanes after one pack, and pmaddwd with (1, 16) joins each pair.
 * The bytes come out as 0,1,4,5 | 2,3,6,7 per 128-bit lane. */
AVX2_INLINE __m256i q_i4_chan_x16(const uint16_t *p, int bf16, const float *zero,
                                  const float *inv) {
  const __m256i a = q4_x8(ld8(p, bf16), _mm256_loadu_ps(zero), _mm256_loadu_ps(inv));
  const __m256i b = q4_x8(ld8(p + 8, bf16), _mm256_loadu_ps(zero + 8), _mm256_loadu_ps(inv + 8));
  return _mm256_madd_epi16(_mm256_packs_epi32(a, b), _mm256_set1_epi32(16 << 16 | 1));
}

/* Bytes of q_i4_chan_x16() results to memory in order: 16 from two, 8 from one. */
AVX2_INLINE void st_chan_codes16(uint8_t *d, __m256i m0, __m256i m1) {
  const __m256i w = _mm256_packus_epi16(_mm256_packs_epi32(m0, m1), _mm256_setzero_si256());
  _mm_storeu_si128((__m128i *)d,
                   _mm_unpacklo_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

AVX2_INLINE void st_chan_codes8(uint8_t *d, __m256i m0) {
  const __m256i w = _mm256_packus_epi16(_mm256_packs_epi32(m0, m0), _mm256_setzero_si256());
  _mm_storel_epi64((__m128i *)d,
                   _mm_unpacklo_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

AVX2_INLINE size_t q_i4_chan_body(const uint16_t *src, size_t n, int bf16, const float *zero,
                                  const float *inv, uint8_t *dst) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    st_chan_codes16(dst + i / 2, q_i4_chan_x16(src + i, bf16, zero + i, inv + i),
                    q_i4_chan_x16(src + i + 16, bf16, zero + i + 16, inv + i + 16));
  if (i + 16 <= n) {
    st_chan_codes8(dst + i / 2, q_i4_chan_x16(src + i, bf16, zero + i, inv + i));
    i += 16;
  }
  return i;
}

static void a_q_i4_chan(const uint16_t *src, size_t n, int dtype, const float *zero,
                        const float *inv, uint8_t *dst) {
  const size_t i = dtype == KVT_DTYPE_BF16 ? q_i4_chan_body(src, n, 1, zero, inv, dst)
                                           : q_i4_chan_body(src, n, 0, zero, inv, dst);
  if (i < n)
    scalar()->q_i4_chan(src + i, n - i, dtype, zero + i, inv + i, dst + i / 2);
}

/* 32 nibbles of 16 code bytes as bytes in element order (both lanes). */
AVX2_INLINE __m256i unpack_nibbles32(const uint8_t *p) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
  const __m256i lo = _mm256_and_si256(w, _mm256_set1_epi16(0x000F));
  return _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(w, 4), _mm256_set1_epi16(0x0F00)));
}

/* A group has one scale and zero, so only 16 outputs exist: compute them with
 * the scalar's multiply-then-add and look codes up with byte shuffles, one
 * table for the low bytes of the 16-bit results and one for the high. */
AVX2_INLINE void i4_lut(float scale, float zero, int bf16, __m256i *tlo, __m256i *thi) {
  const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zero);
  const __m256 a = _mm256_add_ps(_mm256_mul_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), s), z);
  const __m256 b = _mm256_add_ps(_mm256_mul_ps(_mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15), s), z);
  /* Finite scale and zero give no NaN (at worst an Inf), so bf16 needs no
   * NaN case; otherwise take the slower exact one. */
  const int nan_safe = !(isfinite(scale) && isfinite(zero));
  __m256i t; /* the 16 results in order */
  if (bf16)
    t = _mm256_permute4x64_epi64(_mm256_packus_epi32(to_bf16(a, nan_safe), to_bf16(b, nan_safe)),
                                 0xD8);
  else
    t = _mm256_set_m128i(_mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT),
                         _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2,
                                         4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  t = _mm256_shuffle_epi8(t, split); /* 64-bit parts: lo 0-7, hi 0-7, lo 8-15, hi 8-15 */
  *tlo = _mm256_permute4x64_epi64(t, 0x88);
  *thi = _mm256_permute4x64_epi64(t, 0xDD);
}

static void a_dq_i4(const uint8_t *src, size_t n, float scale, float zero, int dtype,
                    uint16_t *dst) {
  if (n < 16) { /* the table costs about as much as 16 scalar elements */
    scalar()->dq_i4(src, n, scale, zero, dtype, dst);
    return;
  }
  __m256i tlo, thi;
  if (dtype == KVT_DTYPE_BF16)
    i4_lut(scale, zero, 1, &tlo, &thi);
  else
    i4_lut(scale, zero, 0, &tlo, &thi);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i q = unpack_nibbles32(src + i / 2);
    const __m256i l = _mm256_shuffle_epi8(tlo, q), h = _mm256_shuffle_epi8(thi, q);
    const __m256i o0 = _mm256_unpacklo_epi8(l, h), o1 = _mm256_unpackhi_epi8(l, h);
    _mm256_storeu_si256((__m256i *)(dst + i), _mm256_permute2x128_si256(o0, o1, 0x20));
    _mm256_storeu_si256((__m256i *)(dst + i + 16), _mm256_permute2x128_si256(o0, o1, 0x31));
  }
  if (i + 16 <= n) {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(src + i / 2)));
    const __m128i q = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x000F)),
                                   _mm_and_si128(_mm_slli_epi16(w, 4), _mm_set1_epi16(0x0F00)));
    const __m128i l = _mm_shuffle_epi8(_mm256_castsi256_si128(tlo), q);
    const __m128i h = _mm_shuffle_epi8(_mm256_castsi256_si128(thi), q);
    _mm_storeu_si128((__m128i *)(dst + i), _mm_unpacklo_epi8(l, h));
    _mm_storeu_si128((__m128i *)(dst + i + 8), _mm_unpackhi_epi8(l, h));
    i += 16;
  }
  if (i < n)
    scalar()->dq_i4(src + i / 2, n - i, scale, zero, dtype, dst + i);
}

/* Eight nibble values, in order, from the 4 code bytes at p. */
AVX2_INLINE __m256 nibbles8(const uint8_t *p) {
  uint32_t w;
  memcpy(&w, p, 4);
  const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i q = _mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh);
  return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(15)));
}

/* q * scale + zero of eight elements from element j. */
AVX2_INLINE __m256 dq_chan_x8(const uint8_t *src, size_t j, const float *scale, const float *zero) {
  const __m256 p = _mm256_mul_ps(nibbles8(src + j / 2), _mm256_loadu_ps(scale + j));
  return _mm256_add_ps(p, _mm256_loadu_ps(zero + j));
}

/* Returns how many leading elements were done; *nan is set when some result
 * is NaN (only non-finite channel parameters, from a damaged payload, give
 * one), for then the bf16 values written are not the scalar path's. */
AVX2_INLINE size_t dq_i4_chan_body(const uint8_t *src, size_t n, const float *scale,
                                   const float *zero, int bf16, uint16_t *dst, int *nan) {
  __m256 bad = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = dq_chan_x8(src, i, scale, zero), b = dq_chan_x8(src, i + 8, scale, zero);
    if (bf16)
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
    st16(dst + i, a, b, bf16, 0);
  }
  if (i + 8 <= n) {
    const __m256 a = dq_chan_x8(src, i, scale, zero);
    if (bf16)
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    st8(dst + i, a, bf16, 0);
    i += 8;
  }
  *nan = !_mm256_testz_ps(bad, bad);
  return i;
}

static void a_dq_i4_chan(const uint8_t *src, size_t n, const float *scale, const float *zero,
                         int dtype, uint16_t *dst) {
  int nan;
  size_t i = dtype == KVT_DTYPE_BF16 ? dq_i4_chan_body(src, n, scale, zero, 1, dst, &nan)
                                     : dq_i4_chan_body(src, n, scale, zero, 0, dst, &nan);
  if (nan) /* redo it all the scalar way: src and dst never overlap */
    i = 0;
  if (i < n)
    scalar()->dq_i4_chan(src + i / 2, n - i, scale + i, zero + i, dtype, dst + i);
}

/* ---- i4 parameters -------------------------------------------------------- */

/* F16C's directed roundings are exactly kvt_f32_to_f16_rd/_ru (IEEE
 * roundTowardNegative/Positive, overflow included), so eight groups' zero and
 * scale come out as the scalar kvt_i4_params gives them. */
/* Eight groups from mn/mx at i; returns a mask of lanes that do not fit. */
AVX2_INLINE int i4_params8(const float *mn, const float *mx, uint8_t *params, float *zero,
                           float *inv, int store_lanes) {
  const __m256 inf = _mm256_set1_ps(INFINITY), fifteen = _mm256_set1_ps(15.0f);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 pz = _mm256_setzero_ps(); /* + 0: a zero extreme counts as +0 */
  __m128i zh = _mm256_cvtps_ph(_mm256_add_ps(_mm256_loadu_ps(mn), pz),
                               _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m256 z = _mm256_cvtph_ps(zh);
  __m256 q = _mm256_div_ps(_mm256_sub_ps(_mm256_add_ps(_mm256_loadu_ps(mx), pz), z), fifteen);
  __m128i sh = _mm256_cvtps_ph(q, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
  __m256 sc = _mm256_cvtph_ps(sh);
  __m256 bad = _mm256_or_ps(_mm256_cmp_ps(_mm256_and_ps(z, absmask), inf, _CMP_NLT_UQ),
                            _mm256_cmp_ps(_mm256_and_ps(sc, absmask), inf, _CMP_NLT_UQ));
  int badmask = _mm256_movemask_ps(bad) & ((1 << store_lanes) - 1);
  if (badmask)
    return badmask;
  __m256 iv = _mm256_and_ps(_mm256_div_ps(one, sc),
                            _mm256_cmp_ps(sc, _mm256_setzero_ps(), _CMP_GT_OQ));
  float zt[8], it[8];
  uint8_t pt[32];
  _mm256_storeu_ps(zt, z);
  _mm256_storeu_ps(it, iv);
  _mm_storeu_si128((__m128i *)pt, _mm_unpacklo_epi16(sh, zh));
  _mm_storeu_si128((__m128i *)(pt + 16), _mm_unpackhi_epi16(sh, zh));
  memcpy(zero, zt, sizeof(float) * store_lanes);
  memcpy(inv, it, sizeof(float) * store_lanes);
  memcpy(params, pt, 4 * (size_t)store_lanes);
  return 0;
}

/* F16C's directed roundings are exactly kvt_f32_to_f16_rd/_ru (IEEE
 * roundTowardNegative/Positive, overflow included), so eight groups' zero and
 * scale come out as the scalar kvt_i4_params gives them. A short tail is
 * padded with empty groups rather than handed to scalar code: rows of four
 * groups (head dim 128, groups of 32) are the common case. */
static size_t a_i4_params(const float *mn, const float *mx, size_t n, uint8_t *params,
                          float *zero, float *inv) {
  size_t i = 0;
  for (; i < n; i += 8) {
    int lanes = n - i < 8 ? (int)(n - i) : 8, bad;
    if (lanes == 8) {
      bad = i4_params8(mn + i, mx + i, params + 4 * i, zero + i, inv + i, 8);
    } else {
      float a[8] = {0}, b[8] = {0};
      memcpy(a, mn + i, sizeof(float) * lanes);
      memcpy(b, mx + i, sizeof(float) * lanes);
      bad = i4_params8(a, b, params + 4 * i, zero + i, inv + i, lanes);
    }
    if (bad) /* the scalar kernel stores the groups before the bad one, and finds it */
      return i + scalar()->i4_params(mn + i, mx + i, (size_t)lanes, params + 4 * i, zero + i,
                                     inv + i);
  }
  return n;
}

static void a_i4_unpack(const uint8_t *params, size_t n, float *scale, float *zero) {
  const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i pr = _mm256_loadu_si256((const __m256i *)(params + 4 * i));
    __m256i s = _mm256_and_si256(pr, lo16), z = _mm256_srli_epi32(pr, 16);
    /* Pack the eight 32-bit lanes' low halves in order into one __m128i. */
    __m256i sz = _mm256_permute4x64_epi64(_mm256_packus_epi32(s, z), 0xD8);
    _mm256_storeu_ps(scale + i, _mm256_cvtph_ps(_mm256_castsi256_si128(sz)));
    _mm256_storeu_ps(zero + i, _mm256_cvtph_ps(_mm256_extracti128_si256(sz, 1)));
  }
  if (i < n)
    scalar()->i4_unpack(params + 4 * i, n - i, scale + i, zero + i);
}

/* Eight scales per IEEE vector division, as the scalar divisions give them. */
static void a_scales(const float *amax, size_t n, float qmax, float *scale, float *inv) {
  const __m256 q = _mm256_set1_ps(qmax), one = _mm256_set1_ps(1.0f);
  const __m256 tiny = _mm256_set1_ps(KVT_TINY_AMAX);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_loadu_ps(amax + i);
    __m256 keep = _mm256_cmp_ps(a, tiny, _CMP_GE_OQ); /* false for NaN, as !(a >= tiny) */
    __m256 sc = _mm256_div_ps(a, q);
    _mm256_storeu_ps(scale + i, _mm256_and_ps(sc, keep));
    _mm256_storeu_ps(inv + i, _mm256_and_ps(_mm256_div_ps(one, sc), keep));
  }
  if (i < n)
    scalar()->scales(amax + i, n - i, qmax, scale + i, inv + i);
}

static const kvt_kernels avx2_kernels = {
    "avx2",      a_amax,       a_minmax,    a_minmax_groups, a_minmax_acc, a_q_e4m3,
    a_dq_e4m3,   a_q_i8,       a_dq_i8,     a_q_i4,       a_dq_i4,
    a_q_i4_chan, a_dq_i4_chan, a_i4_params, a_scales,     a_i4_unpack,
};

const kvt_kernels *kvt_kernels_avx2(void) { return &avx2_kernels; }

/* The vector conversions on their own, for tests/test_fp8_exhaustive.c. */

void kvt_avx2_f32_to_e4m3(const float *src, size_t n, uint8_t *dst) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 y[4] = {_mm256_loadu_ps(src + i), _mm256_loadu_ps(src + i + 8),
                         _mm256_loadu_ps(src + i + 16), _mm256_loadu_ps(src + i + 24)};
    _mm256_storeu_si256((__m256i *)(dst + i), e4m3_x32(y, pack_order(0)));
  }
  for (; i + 8 <= n; i += 8)
    st_bytes8(dst + i, e4m3_x8(_mm256_loadu_ps(src + i)), 0);
  for (; i < n; i++)
    dst[i] = kvt_f32_to_e4m3(src[i]);
}

void kvt_avx2_f32_to_16(const float *src, size_t n, int dtype, uint16_t *dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if (dtype == KVT_DTYPE_BF16)
      st8(dst + i, _mm256_loadu_ps(src + i), 1, 1);
    else
      st8(dst + i, _mm256_loadu_ps(src + i), 0, 1);
  }
  for (; i < n; i++)
    dst[i] = kvt_f2h(src[i], dtype);
}

#else

const kvt_kernels *kvt_kernels_avx2(void) { return NULL; }

#endif
