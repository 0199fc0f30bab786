/* tests/test_codec_simd.c - the AVX2 codec kernels give the scalar kernels'
 * bytes: on random rows at many magnitudes, on every 16-bit input pattern and
 * every code byte with parameters that reach subnormals, saturation and
 * clamping, and on every short length (tails) from exactly sized, sometimes
 * misaligned buffers so that the sanitizer build catches a read or write past
 * the end. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec_internal.h"
#include "kvtier.h"
#include "synth.h"

static const kvt_kernels *S, *A; /* scalar reference, AVX2 under test */
static const int dtypes[2] = {KVT_DTYPE_BF16, KVT_DTYPE_F16};

static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static int finite16(uint16_t h, int dtype) {
  return (h & 0x7FFFu) < (dtype == KVT_DTYPE_BF16 ? 0x7F80u : 0x7C00u);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  assert_non_null(p);
  return p;
}

/* n finite elements: normal values times 2^e with e drawn from [lo, hi], plus
 * exact zeros of both signs and repeated values now and then. */
static void random_row(kvt_rng *r, uint16_t *x, size_t n, int dtype, int lo, int hi) {
  for (size_t i = 0; i < n; i++) {
    uint64_t pick = kvt_rng_next(r) % 16;
    if (pick == 0) {
      x[i] = (kvt_rng_next(r) & 1) ? 0x8000 : 0x0000;
      continue;
    }
    if (pick == 1 && i > 0) {
      x[i] = x[kvt_rng_next(r) % i];
      continue;
    }
    int e = lo + (int)(kvt_rng_next(r) % (uint64_t)(hi - lo + 1));
    uint16_t h = kvt_f2h(ldexpf((float)kvt_rng_normal(r), e), dtype);
    x[i] = finite16(h, dtype) ? h : (uint16_t)(h & 0x8000u);
  }
}

/* Magnitude ranges (powers of two) to draw from, per dtype. */
static void scale_range(int dtype, int k, int *lo, int *hi) {
  static const int bf[][2] = {{-130, -120}, {-20, -5}, {-3, 3}, {0, 0}, {10, 30}, {100, 126}};
  static const int hf[][2] = {{-26, -14}, {-14, -8}, {-3, 3}, {0, 0}, {5, 10}, {13, 15}};
  *lo = dtype == KVT_DTYPE_BF16 ? bf[k][0] : hf[k][0];
  *hi = dtype == KVT_DTYPE_BF16 ? bf[k][1] : hf[k][1];
}
#define N_RANGES 6

/* ---- comparison helpers --------------------------------------------------- */

static void check_amax(const uint16_t *x, size_t n, int dt) {
  float a = -1.0f, b = -1.0f;
  size_t ra = S->amax(x, n, dt, &a), rb = A->amax(x, n, dt, &b);
  if (ra != rb || (ra == n && memcmp(&a, &b, 4)))
    fail_msg("amax dtype %d n %zu: scalar %zu %a, avx2 %zu %a", dt, n, ra, a, rb, b);
}

static void check_minmax(const uint16_t *x, size_t n, int dt) {
  float a[2] = {-1, -1}, b[2] = {-1, -1};
  size_t ra = S->minmax(x, n, dt, &a[0], &a[1]), rb = A->minmax(x, n, dt, &b[0], &b[1]);
  if (ra != rb || (ra == n && memcmp(a, b, 8)))
    fail_msg("minmax dtype %d n %zu: scalar %zu [%a %a], avx2 %zu [%a %a]", dt, n, ra, a[0], a[1],
             rb, b[0], b[1]);
}

/* Accumulates x into copies of (mn, mx) with both kernels and compares the
 * return and every accumulator, including partial updates before a NaN. */
static void check_minmax_acc(const uint16_t *x, size_t n, int dt, const float *mn,
                             const float *mx) {
  float *m = xmalloc(4 * 4 * n);
  memcpy(m, mn, 4 * n);
  memcpy(m + n, mx, 4 * n);
  memcpy(m + 2 * n, mn, 4 * n);
  memcpy(m + 3 * n, mx, 4 * n);
  size_t ra = S->minmax_acc(x, n, dt, m, m + n);
  size_t rb = A->minmax_acc(x, n, dt, m + 2 * n, m + 3 * n);
  if (ra != rb || memcmp(m, m + 2 * n, 8 * n))
    fail_msg("minmax_acc dtype %d n %zu: scalar %zu, avx2 %zu", dt, n, ra, rb);
  free(m);
}

static void check_q_e4m3(const uint16_t *x, size_t n, int dt, float inv) {
  uint8_t *a = xmalloc(n), *b = xmalloc(n);
  S->q_e4m3(x, n, dt, inv, a);
  A->q_e4m3(x, n, dt, inv, b);
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i])
      fail_msg("q_e4m3 dtype %d inv %a x[%zu]=0x%04x: scalar 0x%02x avx2 0x%02x", dt, inv, i, x[i],
               a[i], b[i]);
  free(a);
  free(b);
}

static void check_q_i8(const uint16_t *x, size_t n, int dt, float inv) {
  int8_t *a = xmalloc(n), *b = xmalloc(n);
  S->q_i8(x, n, dt, inv, a);
  A->q_i8(x, n, dt, inv, b);
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i])
      fail_msg("q_i8 dtype %d inv %a x[%zu]=0x%04x: scalar %d avx2 %d", dt, inv, i, x[i], a[i],
               b[i]);
  free(a);
  free(b);
}

static void check_q_i4(const uint16_t *x, size_t n, int dt, float zero, float inv) {
  uint8_t *a = xmalloc(n / 2), *b = xmalloc(n / 2);
  S->q_i4(x, n, dt, zero, inv, a);
  A->q_i4(x, n, dt, zero, inv, b);
  for (size_t i = 0; i < n / 2; i++)
    if (a[i] != b[i])
      fail_msg("q_i4 dtype %d zero %a inv %a pair %zu (0x%04x 0x%04x): scalar 0x%02x avx2 "
               "0x%02x",
               dt, zero, inv, i, x[2 * i], x[2 * i + 1], a[i], b[i]);
  free(a);
  free(b);
}

static void check_q_i4_chan(const uint16_t *x, size_t n, int dt, const float *zero,
                            const float *inv) {
  uint8_t *a = xmalloc(n / 2), *b = xmalloc(n / 2);
  S->q_i4_chan(x, n, dt, zero, inv, a);
  A->q_i4_chan(x, n, dt, zero, inv, b);
  for (size_t i = 0; i < n / 2; i++)
    if (a[i] != b[i])
      fail_msg("q_i4_chan dtype %d n %zu byte %zu: scalar 0x%02x avx2 0x%02x", dt, n, i, a[i],
               b[i]);
  free(a);
  free(b);
}

static void check_out16(const char *what, int dt, size_t n, const uint16_t *a, const uint16_t *b,
                        float p0, float p1) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i])
      fail_msg("%s dtype %d n %zu params %a %a out[%zu]: scalar 0x%04x avx2 0x%04x", what, dt, n,
               p0, p1, i, a[i], b[i]);
}

static void check_dq_e4m3(const uint8_t *q, size_t n, float scale, int dt) {
  uint16_t *a = xmalloc(2 * n), *b = xmalloc(2 * n);
  S->dq_e4m3(q, n, scale, dt, a);
  A->dq_e4m3(q, n, scale, dt, b);
  check_out16("dq_e4m3", dt, n, a, b, scale, 0);
  free(a);
  free(b);
}

static void check_dq_i8(const int8_t *q, size_t n, float scale, int dt) {
  uint16_t *a = xmalloc(2 * n), *b = xmalloc(2 * n);
  S->dq_i8(q, n, scale, dt, a);
  A->dq_i8(q, n, scale, dt, b);
  check_out16("dq_i8", dt, n, a, b, scale, 0);
  free(a);
  free(b);
}

static void check_dq_i4(const uint8_t *q, size_t n, float scale, float zero, int dt) {
  uint16_t *a = xmalloc(2 * n), *b = xmalloc(2 * n);
  S->dq_i4(q, n, scale, zero, dt, a);
  A->dq_i4(q, n, scale, zero, dt, b);
  check_out16("dq_i4", dt, n, a, b, scale, zero);
  free(a);
  free(b);
}

static void check_dq_i4_chan(const uint8_t *q, size_t n, const float *scale, const float *zero,
                             int dt) {
  uint16_t *a = xmalloc(2 * n), *b = xmalloc(2 * n);
  S->dq_i4_chan(q, n, scale, zero, dt, a);
  A->dq_i4_chan(q, n, scale, zero, dt, b);
  check_out16("dq_i4_chan", dt, n, a, b, 0, 0);
  free(a);
  free(b);
}

/* ---- inputs ---------------------------------------------------------------- */

/* Every 16-bit pattern, or only the finite ones of dtype; returns the count. */
static size_t all_patterns(uint16_t *x, int dtype, int finite_only) {
  size_t n = 0;
  for (uint32_t h = 0; h < 65536; h++)
    if (!finite_only || finite16((uint16_t)h, dtype))
      x[n++] = (uint16_t)h;
  return n;
}

/* Multipliers for e4m3 and i8: plain, realistic (from amax), ones that push
 * most results into e4m3 subnormals or flush them, and ones that saturate. */
static const float invs[] = {1.0f,     448.0f / 3.0f, 448.0f / 65504.0f, 0x1p-8f,  0x1p-16f,
                             0x1p-20f, 0x1p-126f,     0x1p20f,           0x1p100f, 0.0f,
                             -2.0f,    0.999f};

/* (zero, inv) pairs for i4, from kvt_i4_params on some ranges plus extremes. */
static void i4_pairs(int dtype, float zero[8], float inv[8]) {
  static const float ranges[4][2] = {{-1, 1}, {0, 3}, {-65504, 65504}, {1e-6f, 2e-6f}};
  for (int k = 0; k < 4; k++) {
    uint16_t sh, zh;
    float s;
    assert_int_equal(kvt_i4_params(ranges[k][0], ranges[k][1], &sh, &zh, &s, &zero[k], &inv[k]), 0);
  }
  zero[4] = 0.0f, inv[4] = 1.0f;
  zero[5] = -0.5f, inv[5] = 0x1p20f; /* nearly everything clamps */
  zero[6] = 0.0f, inv[6] = 0.0f;
  zero[7] = dtype == KVT_DTYPE_BF16 ? -0x1p100f : -7.0f, inv[7] = 0x1p-100f;
}

/* ---- tests: range kernels ---------------------------------------------------- */

static void test_avx2_amax_and_minmax_match_scalar_on_random_rows(void **state) {
  (void)state;
  kvt_rng r = {1};
  uint16_t x[1024];
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < N_RANGES; k++)
      for (int it = 0; it < 40; it++) {
        int lo, hi;
        scale_range(dtypes[d], k, &lo, &hi);
        size_t n = it < 10 ? 128 : it < 20 ? 32 : 1 + kvt_rng_next(&r) % 1024;
        random_row(&r, x, n, dtypes[d], lo, hi);
        check_amax(x, n, dtypes[d]);
        check_minmax(x, n, dtypes[d]);
      }
}

/* All-zero, non-negative and non-positive rows, where the extreme is a zero
 * and the scalar loop keeps the sign of the first zero it meets. */
static void test_avx2_minmax_keeps_sign_of_first_zero_like_scalar(void **state) {
  (void)state;
  kvt_rng r = {2};
  uint16_t x[160];
  for (int d = 0; d < 2; d++)
    for (int it = 0; it < 400; it++) {
      size_t n = 16 + kvt_rng_next(&r) % 145;
      uint16_t neg = (it & 1) ? 0x8000 : 0;
      for (size_t i = 0; i < n; i++) {
        uint64_t p = kvt_rng_next(&r) % 4;
        x[i] = p == 0   ? 0x0000
               : p == 1 ? 0x8000
                        : (uint16_t)(neg | (1 + kvt_rng_next(&r) % 0x3000));
        if (it % 4 >= 2)
          x[i] &= 0x8000; /* zeros only */
      }
      check_minmax(x, n, dtypes[d]);
      check_amax(x, n, dtypes[d]);
    }
}

static void test_avx2_range_kernels_report_first_nonfinite_like_scalar(void **state) {
  (void)state;
  kvt_rng r = {3};
  uint16_t x[300];
  float mn[300], mx[300];
  for (int d = 0; d < 2; d++) {
    const uint16_t inf = dtypes[d] == KVT_DTYPE_BF16 ? 0x7F80 : 0x7C00;
    const uint16_t bad[] = {inf, (uint16_t)(inf | 0x8000), (uint16_t)(inf + 1), 0xFFFF, 0x7FFF};
    for (int it = 0; it < 500; it++) {
      size_t n = 1 + kvt_rng_next(&r) % 300;
      random_row(&r, x, n, dtypes[d], -3, 3);
      for (int j = 0; j < 1 + it % 3; j++)
        x[kvt_rng_next(&r) % n] = bad[kvt_rng_next(&r) % 5];
      for (size_t i = 0; i < n; i++) {
        mn[i] = (float)kvt_rng_normal(&r);
        mx[i] = mn[i] + 1.0f;
      }
      check_amax(x, n, dtypes[d]);
      check_minmax(x, n, dtypes[d]);
      check_minmax_acc(x, n, dtypes[d], mn, mx);
    }
  }
}

static void test_avx2_range_kernels_match_scalar_on_all_16bit_inputs(void **state) {
  (void)state;
  uint16_t *x = xmalloc(2 * 65536);
  float *mn = xmalloc(4 * 65536), *mx = xmalloc(4 * 65536);
  for (int d = 0; d < 2; d++) {
    /* In rows of 128 (head_dim), so every non-finite pattern is some row's
     * first and its index is checked; then the finite ones as one row. */
    size_t n = all_patterns(x, dtypes[d], 0);
    for (size_t i = 0; i < n; i += 128) {
      check_amax(x + i, 128, dtypes[d]);
      check_minmax(x + i, 128, dtypes[d]);
    }
    n = all_patterns(x, dtypes[d], 1);
    check_amax(x, n, dtypes[d]);
    check_minmax(x, n, dtypes[d]);
    for (size_t i = 0; i < n; i++) {
      mn[i] = i % 3 ? INFINITY : u2f(0x80000000u); /* -0 against +0 inputs */
      mx[i] = i % 3 ? -INFINITY : 0.0f;
    }
    check_minmax_acc(x, n, dtypes[d], mn, mx);
    for (size_t i = 0; i < n; i++) /* reversed: each element meets another */
      x[i] = x[n - 1 - i];
    check_minmax_acc(x, n, dtypes[d], mn, mx);
  }
  free(x);
  free(mn);
  free(mx);
}

static void test_avx2_minmax_acc_matches_scalar_over_token_groups(void **state) {
  (void)state;
  kvt_rng r = {4};
  uint16_t x[128];
  float mn[2][128], mx[2][128];
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < N_RANGES; k++) {
      int lo, hi;
      scale_range(dtypes[d], k, &lo, &hi);
      for (int i = 0; i < 128; i++)
        mn[0][i] = mn[1][i] = INFINITY, mx[0][i] = mx[1][i] = -INFINITY;
      for (int t = 0; t < 64; t++) { /* a KIVI group of 64 tokens, head_dim 128 */
        random_row(&r, x, 128, dtypes[d], lo, hi);
        assert_int_equal(S->minmax_acc(x, 128, dtypes[d], mn[0], mx[0]), 128);
        assert_int_equal(A->minmax_acc(x, 128, dtypes[d], mn[1], mx[1]), 128);
      }
      assert_memory_equal(mn[0], mn[1], sizeof(mn[0]));
      assert_memory_equal(mx[0], mx[1], sizeof(mx[0]));
    }
}

/* ---- tests: e4m3 and i8 ---------------------------------------------------- */

static void test_avx2_e4m3_matches_scalar_on_all_16bit_inputs(void **state) {
  (void)state;
  uint16_t *x = xmalloc(2 * 65536);
  for (int d = 0; d < 2; d++) {
    size_t n = all_patterns(x, dtypes[d], 0); /* q_e4m3 defines NaN and Inf too */
    for (size_t k = 0; k < sizeof(invs) / sizeof(invs[0]); k++)
      check_q_e4m3(x, n, dtypes[d], invs[k]);
  }
  free(x);
}

static void test_avx2_i8_matches_scalar_on_all_finite_16bit_inputs(void **state) {
  (void)state;
  uint16_t *x = xmalloc(2 * 65536);
  for (int d = 0; d < 2; d++) {
    size_t n = all_patterns(x, dtypes[d], 1);
    for (size_t k = 0; k < sizeof(invs) / sizeof(invs[0]); k++)
      check_q_i8(x, n, dtypes[d], invs[k]);
    check_q_i8(x, n, dtypes[d], 127.0f / 65504.0f);
  }
  free(x);
}

/* Scales for the dequantisers: realistic, ones with subnormal and overflowing
 * products, ones past the vector path's exact range, and non-finite. */
static const float scales[] = {
    1.0f,    3.0f / 448.0f, 65504.0f / 448.0f, 0x1p-140f, 0x1p-130f, 0x1p-149f,
    255.99f, 256.0f,        0x1p120f,          0.0f,      -1.5f,     INFINITY,
    NAN,     1e-3f};

static void test_avx2_dequant_e4m3_and_i8_match_scalar_on_all_codes(void **state) {
  (void)state;
  uint8_t q[512];
  for (int i = 0; i < 512; i++)
    q[i] = (uint8_t)(i < 256 ? i : 511 - i);
  kvt_rng r = {5};
  for (int d = 0; d < 2; d++) {
    for (size_t k = 0; k < sizeof(scales) / sizeof(scales[0]); k++) {
      check_dq_e4m3(q, 512, scales[k], dtypes[d]);
      check_dq_i8((const int8_t *)q, 512, scales[k], dtypes[d]);
    }
    /* NaN scales whose payload a careless bf16 rounding would carry into. */
    const uint32_t nans[] = {0x7FA0FFFFu, 0xFFC0C001u, 0x7F808000u, 0xFFFFFFFFu};
    for (int k = 0; k < 4; k++) {
      check_dq_e4m3(q, 512, u2f(nans[k]), dtypes[d]);
      check_dq_i8((const int8_t *)q, 512, u2f(nans[k]), dtypes[d]);
      check_dq_i4(q, 512, u2f(nans[k]), 1.0f, dtypes[d]);
      check_dq_i4(q, 512, 1.0f, u2f(nans[k]), dtypes[d]);
    }
    for (int it = 0; it < 200; it++) {
      float s = ldexpf((float)kvt_rng_uniform(&r) + 0.5f, (int)(kvt_rng_next(&r) % 60) - 40);
      check_dq_e4m3(q, 512, s, dtypes[d]);
      check_dq_i8((const int8_t *)q, 512, s, dtypes[d]);
    }
    /* Without NaN bytes the whole row takes the vector path. */
    for (int i = 0; i < 512; i++)
      if ((q[i] & 0x7F) == 0x7F)
        q[i] ^= 1;
    for (size_t k = 0; k < sizeof(scales) / sizeof(scales[0]); k++)
      check_dq_e4m3(q, 512, scales[k], dtypes[d]);
  }
}

static void test_avx2_e4m3_and_i8_match_scalar_on_random_rows(void **state) {
  (void)state;
  kvt_rng r = {6};
  uint16_t x[1024];
  uint8_t q[1024];
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < N_RANGES; k++)
      for (int it = 0; it < 30; it++) {
        int lo, hi;
        scale_range(dtypes[d], k, &lo, &hi);
        size_t n = it < 10 ? 128 : 1 + kvt_rng_next(&r) % 1024;
        random_row(&r, x, n, dtypes[d], lo, hi);
        float amax, s8, i8, se, ie;
        assert_int_equal(S->amax(x, n, dtypes[d], &amax), n);
        kvt_e4m3_scale(amax, &se, &ie);
        kvt_i8_scale(amax, &s8, &i8);
        check_q_e4m3(x, n, dtypes[d], ie);
        check_q_i8(x, n, dtypes[d], i8);
        S->q_e4m3(x, n, dtypes[d], ie, q);
        check_dq_e4m3(q, n, se, dtypes[d]);
        S->q_i8(x, n, dtypes[d], i8, (int8_t *)q);
        check_dq_i8((const int8_t *)q, n, s8, dtypes[d]);
      }
}

/* ---- tests: i4 --------------------------------------------------------------- */

static void test_avx2_i4_matches_scalar_on_all_finite_16bit_inputs(void **state) {
  (void)state;
  uint16_t *x = xmalloc(2 * 65536);
  float *z = xmalloc(4 * 65536), *iv = xmalloc(4 * 65536);
  kvt_rng r = {7};
  for (int d = 0; d < 2; d++) {
    size_t n = all_patterns(x, dtypes[d], 1) & ~(size_t)1;
    float zero[8], inv[8];
    i4_pairs(dtypes[d], zero, inv);
    for (int k = 0; k < 8; k++)
      check_q_i4(x, n, dtypes[d], zero[k], inv[k]);
    for (size_t i = 0; i < n; i++) {
      int k = (int)(kvt_rng_next(&r) % 8);
      z[i] = zero[k], iv[i] = inv[k];
    }
    check_q_i4_chan(x, n, dtypes[d], z, iv);
  }
  free(x);
  free(z);
  free(iv);
}

static void test_avx2_dequant_i4_matches_scalar_on_all_codes(void **state) {
  (void)state;
  uint8_t q[256];
  float s[512], z[512];
  for (int i = 0; i < 256; i++)
    q[i] = (uint8_t)i;
  kvt_rng r = {8};
  const float sp[] = {1.0f, 0x1p-24f, 65504.0f, 0.0f, 2.0f / 15.0f, INFINITY, NAN, 1.0f};
  const float zp[] = {0.0f, -1.0f, -65504.0f, 3.5f, -0.0f, 1.0f, 1.0f, -INFINITY};
  for (int d = 0; d < 2; d++) {
    for (size_t k = 0; k < sizeof(sp) / sizeof(sp[0]); k++)
      for (size_t n = 16; n <= 512; n *= 2)
        check_dq_i4(q + 256 - n / 2, n, sp[k], zp[k], dtypes[d]);
    for (int it = 0; it < 200; it++) {
      float sc = kvt_f16_to_f32((uint16_t)(kvt_rng_next(&r) & 0x7BFF));
      float ze = kvt_f16_to_f32((uint16_t)(kvt_rng_next(&r) & 0xFBFF));
      check_dq_i4(q, 512, sc, ze, dtypes[d]);
      check_dq_i4(q, 32, sc, ze, dtypes[d]);
    }
    /* Channel parameters: every fp16 scale and zero pattern, NaN included. */
    for (int it = 0; it < 256; it++) {
      for (int i = 0; i < 512; i++) {
        s[i] = kvt_f16_to_f32((uint16_t)(it * 256 + i / 2));
        z[i] = kvt_f16_to_f32((uint16_t)kvt_rng_next(&r));
      }
      check_dq_i4_chan(q, 512, s, z, dtypes[d]);
    }
  }
}

static void test_avx2_i4_matches_scalar_on_random_groups(void **state) {
  (void)state;
  kvt_rng r = {9};
  uint16_t x[128];
  uint8_t q[64];
  float mn[128], mx[128], sc[128], ze[128], iv[128];
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < N_RANGES; k++)
      for (int it = 0; it < 50; it++) {
        int lo, hi;
        scale_range(dtypes[d], k, &lo, &hi);
        hi = hi > 10 ? 10 : hi; /* fp16 scale and zero: |x| < 65504 */
        lo = lo > hi ? hi : lo;
        random_row(&r, x, 128, dtypes[d], lo, hi);
        for (size_t g = 0; g < 128; g += 32) { /* value groups of 32 along dim */
          uint16_t sh, zh;
          float a, b, s, z, inv;
          assert_int_equal(S->minmax(x + g, 32, dtypes[d], &a, &b), 32);
          assert_int_equal(kvt_i4_params(a, b, &sh, &zh, &s, &z, &inv), 0);
          check_q_i4(x + g, 32, dtypes[d], z, inv);
          S->q_i4(x + g, 32, dtypes[d], z, inv, q);
          check_dq_i4(q, 32, s, z, dtypes[d]);
        }
        for (int i = 0; i < 128; i++) { /* one channel group, as KIVI keys */
          uint16_t sh, zh;
          mn[i] = kvt_h2f(x[i], dtypes[d]) - (float)kvt_rng_uniform(&r);
          mx[i] = mn[i] + (float)kvt_rng_uniform(&r) * 4.0f;
          assert_int_equal(kvt_i4_params(mn[i], mx[i], &sh, &zh, &sc[i], &ze[i], &iv[i]), 0);
        }
        check_q_i4_chan(x, 128, dtypes[d], ze, iv);
        S->q_i4_chan(x, 128, dtypes[d], ze, iv, q);
        check_dq_i4_chan(q, 128, sc, ze, dtypes[d]);
      }
}

/* ---- tests: tails ------------------------------------------------------------ */

/* Every kernel on lengths 1..67. Each input sits at the very end of its own
 * heap block (so ASan sees a read past the last element) and, when shift is
 * set, one element off the block's alignment (so no load may assume it). */
static void tails_for_length(kvt_rng *r, int dt, size_t n, int shift) {
  uint16_t row[80];
  uint8_t codes[80];
  float p[4][80];
  random_row(r, row, n, dt, -4, 4);
  for (size_t i = 0; i < n; i++) {
    codes[i] = (uint8_t)kvt_rng_next(r);
    p[0][i] = (float)kvt_rng_normal(r) - 2.0f;
    p[1][i] = p[0][i] + 4.0f;
    p[2][i] = 15.0f / 4.0f;
    p[3][i] = 4.0f / 15.0f;
  }
  const size_t s = shift ? 1 : 0;
  uint16_t *xb = xmalloc(2 * (n + s)), *x = xb + s;
  uint8_t *qb = xmalloc(n + s), *q = qb + s;
  float *fb[4], *f[4];
  memcpy(x, row, 2 * n);
  memcpy(q, codes, n);
  for (int k = 0; k < 4; k++) {
    fb[k] = xmalloc(4 * (n + s));
    f[k] = fb[k] + s;
    memcpy(f[k], p[k], 4 * n);
  }
  check_amax(x, n, dt);
  check_minmax(x, n, dt);
  check_minmax_acc(x, n, dt, f[0], f[1]);
  check_q_e4m3(x, n, dt, 448.0f / 5.0f);
  check_q_i8(x, n, dt, 127.0f / 5.0f);
  check_dq_e4m3(q, n, 0.01f, dt);
  check_dq_i8((const int8_t *)q, n, 0.01f, dt);
  if (n % 2 == 0) {
    check_q_i4(x, n, dt, -2.0f, 15.0f / 4.0f);
    check_q_i4_chan(x, n, dt, f[0], f[2]);
    check_dq_i4(q, n, 4.0f / 15.0f, -2.0f, dt);
    check_dq_i4_chan(q, n, f[3], f[0], dt);
  }
  free(xb);
  free(qb);
  for (int k = 0; k < 4; k++)
    free(fb[k]);
}

static void test_avx2_kernels_match_scalar_on_every_short_length(void **state) {
  (void)state;
  kvt_rng r = {10};
  for (int d = 0; d < 2; d++)
    for (size_t n = 1; n <= 67; n++)
      for (int rep = 0; rep < 4; rep++)
        tails_for_length(&r, dtypes[d], n, rep & 1);
}

static void test_avx2_kernels_accept_empty_rows_like_scalar(void **state) {
  (void)state;
  const uint16_t x[1] = {0};
  for (int d = 0; d < 2; d++) {
    check_amax(x, 0, dtypes[d]);
    check_minmax(x, 0, dtypes[d]);
  }
}

/* i4 parameters: every fp32 min/max pair the codec can meet (bf16 and fp16
 * values, ranges from zero to beyond fp16), and groups that do not fit. */
static void check_i4_params(const float *mn, const float *mx, size_t n) {
  uint8_t pa[4 * 64], pb[4 * 64];
  float za[64], zb[64], ia[64], ib[64];
  memset(pa, 0xAA, sizeof(pa));
  memset(pb, 0xAA, sizeof(pb));
  size_t ra = S->i4_params(mn, mx, n, pa, za, ia), rb = A->i4_params(mn, mx, n, pb, zb, ib);
  assert_int_equal(ra, rb);
  assert_memory_equal(pa, pb, 4 * ra);
  assert_memory_equal(za, zb, sizeof(float) * ra);
  assert_memory_equal(ia, ib, sizeof(float) * ra);
}

static void test_avx2_i4_params_match_scalar_including_out_of_range(void **state) {
  (void)state;
  kvt_rng r = {77};
  float mn[64], mx[64];
  for (int iter = 0; iter < 20000; iter++) {
    size_t n = 1 + kvt_rng_next(&r) % 64;
    int e = (int)(kvt_rng_next(&r) % 60) - 40; /* magnitudes 2^-40 .. 2^20 */
    for (size_t i = 0; i < n; i++) {
      float a = (float)(kvt_rng_normal(&r) * ldexp(1.0, e));
      float b = (float)(kvt_rng_normal(&r) * ldexp(1.0, e));
      if (kvt_rng_next(&r) % 16 == 0)
        b = a; /* zero range */
      mn[i] = a < b ? a : b;
      mx[i] = a < b ? b : a;
    }
    check_i4_params(mn, mx, n);
  }
  /* Edges: fp16's limits for zero and for scale. */
  const float edge[] = {65504.0f, 65519.0f, 65520.0f, -65504.0f, -65520.0f, -65536.0f,
                        1e6f,     -1e6f,    0x1p-25f, -0x1p-25f, 0.0f,      -0.0f};
  for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); i++)
    for (size_t j = 0; j < sizeof(edge) / sizeof(edge[0]); j++) {
      float a[9], b[9];
      for (int k = 0; k < 9; k++) {
        a[k] = edge[i] < edge[j] ? edge[i] : edge[j];
        b[k] = edge[i] < edge[j] ? edge[j] : edge[i];
      }
      check_i4_params(a, b, 9);
    }
}

/* Per-group min/max of a row: equal to scalar's up to the sign of a zero
 * (which kvt_i4_params ignores), and the same first non-finite index. */
static void test_avx2_minmax_groups_match_scalar_up_to_zero_sign(void **state) {
  (void)state;
  kvt_rng r = {123};
  uint16_t x[256];
  float ma[64], mb[64], xa[64], xb[64];
  const size_t groups[] = {8, 16, 32, 64, 6};
  for (int iter = 0; iter < 4000; iter++)
    for (int d = 0; d < 2; d++) {
      size_t G = groups[kvt_rng_next(&r) % 5], n = G * (1 + kvt_rng_next(&r) % 8);
      if (n > 256)
        n = G * (256 / G);
      random_row(&r, x, n, dtypes[d], -20, 10);
      for (size_t i = 0; i < n; i++) {
        uint64_t u = kvt_rng_next(&r) % 64;
        if (u == 0)
          x[i] = 0x8000; /* -0 */
        else if (u == 1)
          x[i] = 0;
      }
      if (kvt_rng_next(&r) % 8 == 0) /* a NaN or Inf somewhere */
        x[kvt_rng_next(&r) % n] = kvt_rng_next(&r) % 2 ? 0x7FC1 : (dtypes[d] == KVT_DTYPE_BF16 ? 0xFF80 : 0xFC00);
      size_t ra = S->minmax_groups(x, n, G, dtypes[d], ma, xa);
      size_t rb = A->minmax_groups(x, n, G, dtypes[d], mb, xb);
      assert_int_equal(ra, rb);
      for (size_t g = 0; g < ra / G; g++) {
        assert_true(ma[g] + 0.0f == mb[g] + 0.0f && !signbit(ma[g] + 0.0f) == !signbit(mb[g] + 0.0f));
        assert_true(xa[g] + 0.0f == xb[g] + 0.0f && !signbit(xa[g] + 0.0f) == !signbit(xb[g] + 0.0f));
      }
    }
  /* A zero extreme gives the same parameters whichever its sign. */
  uint16_t s1, z1, s2, z2;
  float sc, zf, iv;
  assert_int_equal(kvt_i4_params(-0.0f, 3.0f, &s1, &z1, &sc, &zf, &iv), 0);
  assert_int_equal(kvt_i4_params(0.0f, 3.0f, &s2, &z2, &sc, &zf, &iv), 0);
  assert_int_equal(s1, s2);
  assert_int_equal(z1, z2);
  assert_int_equal(kvt_i4_params(-2.0f, -0.0f, &s1, &z1, &sc, &zf, &iv), 0);
  assert_int_equal(kvt_i4_params(-2.0f, 0.0f, &s2, &z2, &sc, &zf, &iv), 0);
  assert_int_equal(s1, s2);
  assert_int_equal(z1, z2);
}

static void test_avx2_scales_match_scalar_divisions(void **state) {
  (void)state;
  kvt_rng r = {91};
  float amax[67], sa[67], sb[67], ia[67], ib[67];
  const float qmax[2] = {448.0f, 127.0f};
  for (int iter = 0; iter < 3000; iter++) {
    size_t n = 1 + kvt_rng_next(&r) % 67;
    for (size_t i = 0; i < n; i++) {
      int e = (int)(kvt_rng_next(&r) % 260) - 140; /* 2^-140 .. 2^120: both sides of tiny */
      amax[i] = (float)(kvt_rng_uniform(&r) * ldexp(1.0, e));
      if (kvt_rng_next(&r) % 11 == 0)
        amax[i] = kvt_rng_next(&r) % 2 ? 0.0f : KVT_TINY_AMAX;
    }
    for (int q = 0; q < 2; q++) {
      S->scales(amax, n, qmax[q], sa, ia);
      A->scales(amax, n, qmax[q], sb, ib);
      assert_memory_equal(sa, sb, n * sizeof(float));
      assert_memory_equal(ia, ib, n * sizeof(float));
    }
  }
}

static void test_avx2_i4_unpack_matches_scalar_on_all_non_nan_fp16_pairs(void **state) {
  (void)state;
  uint8_t params[4 * 257];
  float sa[257], za[257], sb[257], zb[257];
  for (uint32_t base = 0; base < 65536; base += 256) {
    for (uint32_t i = 0; i < 257; i++) {
      uint16_t sc = (uint16_t)(base + i), z = (uint16_t)(65535 - base - i);
      /* NaN payloads are not part of the contract (an encoder never writes
       * NaN parameters; F16C quiets signalling NaNs, the scalar path keeps
       * them): test NaN as the canonical quiet NaN only. */
      if ((sc & 0x7FFF) > 0x7C00)
        sc = 0x7E00;
      if ((z & 0x7FFF) > 0x7C00)
        z = 0x7E00;
      params[4 * i] = (uint8_t)sc, params[4 * i + 1] = (uint8_t)(sc >> 8);
      params[4 * i + 2] = (uint8_t)z, params[4 * i + 3] = (uint8_t)(z >> 8);
    }
    S->i4_unpack(params, 257, sa, za);
    A->i4_unpack(params, 257, sb, zb);
    assert_memory_equal(sa, sb, sizeof(sa));
    assert_memory_equal(za, zb, sizeof(za));
  }
}

int main(void) {
  S = kvt_kernels_scalar();
  A = kvt_kernels_avx2();
  if (!A || !kvt_has_feature("avx2")) {
    printf("skipped: no AVX2+F16C kernels in this build or on this CPU\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_avx2_amax_and_minmax_match_scalar_on_random_rows),
      cmocka_unit_test(test_avx2_i4_params_match_scalar_including_out_of_range),
      cmocka_unit_test(test_avx2_scales_match_scalar_divisions),
      cmocka_unit_test(test_avx2_minmax_groups_match_scalar_up_to_zero_sign),
      cmocka_unit_test(test_avx2_i4_unpack_matches_scalar_on_all_non_nan_fp16_pairs),
      cmocka_unit_test(test_avx2_minmax_keeps_sign_of_first_zero_like_scalar),
      cmocka_unit_test(test_avx2_range_kernels_report_first_nonfinite_like_scalar),
      cmocka_unit_test(test_avx2_range_kernels_match_scalar_on_all_16bit_inputs),
      cmocka_unit_test(test_avx2_minmax_acc_matches_scalar_over_token_groups),
      cmocka_unit_test(test_avx2_e4m3_matches_scalar_on_all_16bit_inputs),
      cmocka_unit_test(test_avx2_i8_matches_scalar_on_all_finite_16bit_inputs),
      cmocka_unit_test(test_avx2_dequant_e4m3_and_i8_match_scalar_on_all_codes),
      cmocka_unit_test(test_avx2_e4m3_and_i8_match_scalar_on_random_rows),
      cmocka_unit_test(test_avx2_i4_matches_scalar_on_all_finite_16bit_inputs),
      cmocka_unit_test(test_avx2_dequant_i4_matches_scalar_on_all_codes),
      cmocka_unit_test(test_avx2_i4_matches_scalar_on_random_groups),
      cmocka_unit_test(test_avx2_kernels_match_scalar_on_every_short_length),
      cmocka_unit_test(test_avx2_kernels_accept_empty_rows_like_scalar),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
