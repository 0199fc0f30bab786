/* tests/test_fp8_exhaustive.c - the AVX2 codec's fp32 conversions (to OCP
 * FP8 E4M3, to bf16, to fp16) against the scalar reference on all 2^32 fp32
 * bit patterns: the vector e4m3 rounding has no compare between its normal
 * and subnormal formulas, so only every input shows it right. Labelled
 * "long": about 30 s on one core, 80 s under ASan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "codec_internal.h"
#include "kvtier.h"

#ifdef KVT_HAVE_AVX2
/* Exported by codec/kernels_avx2.c for this test. */
void kvt_avx2_f32_to_e4m3(const float *src, size_t n, uint8_t *dst);
void kvt_avx2_f32_to_16(const float *src, size_t n, int dtype, uint16_t *dst);

#define BLOCK 65536u

static float blk[BLOCK];
static uint8_t out8[BLOCK], out8b[BLOCK];
static uint16_t out16[BLOCK];

/* Fills blk with the fp32 patterns hi << 16 .. hi << 16 | 0xFFFF. */
static void fill(uint32_t hi) {
  for (uint32_t lo = 0; lo < BLOCK; lo++) {
    const uint32_t u = hi << 16 | lo;
    memcpy(&blk[lo], &u, 4);
  }
}

static void test_avx2_e4m3_matches_scalar_on_all_fp32_inputs(void **state) {
  (void)state;
  for (uint32_t hi = 0; hi < 65536; hi++) {
    fill(hi);
    /* Whole: the 32-wide path. In pieces of 31: the 8-wide path and the tail. */
    kvt_avx2_f32_to_e4m3(blk, BLOCK, out8);
    for (uint32_t lo = 0; lo < BLOCK; lo += 31)
      kvt_avx2_f32_to_e4m3(blk + lo, BLOCK - lo < 31 ? BLOCK - lo : 31, out8b + lo);
    for (uint32_t lo = 0; lo < BLOCK; lo++) {
      const uint8_t want = kvt_f32_to_e4m3(blk[lo]);
      if (out8[lo] != want || out8b[lo] != want)
        fail_msg("e4m3 of 0x%08x: scalar 0x%02x avx2 0x%02x (0x%02x in pieces)", hi << 16 | lo,
                 want, out8[lo], out8b[lo]);
    }
  }
}

static void check_16(int dtype) {
  for (uint32_t hi = 0; hi < 65536; hi++) {
    fill(hi);
    kvt_avx2_f32_to_16(blk, BLOCK, dtype, out16);
    for (uint32_t lo = 0; lo < BLOCK; lo++) {
      const uint16_t want = kvt_f2h(blk[lo], dtype);
      if (out16[lo] != want)
        fail_msg("%s of 0x%08x: scalar 0x%04x avx2 0x%04x", kvt_dtype_name(dtype), hi << 16 | lo,
                 want, out16[lo]);
    }
  }
}

static void test_avx2_bf16_rounding_matches_scalar_on_all_fp32_inputs(void **state) {
  (void)state;
  check_16(KVT_DTYPE_BF16);
}

static void test_avx2_f16c_rounding_matches_scalar_on_all_fp32_inputs(void **state) {
  (void)state;
  check_16(KVT_DTYPE_F16);
}
#endif

int main(void) {
#ifdef KVT_HAVE_AVX2
  if (kvt_kernels_avx2() && kvt_has_feature("avx2")) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_avx2_e4m3_matches_scalar_on_all_fp32_inputs),
        cmocka_unit_test(test_avx2_bf16_rounding_matches_scalar_on_all_fp32_inputs),
        cmocka_unit_test(test_avx2_f16c_rounding_matches_scalar_on_all_fp32_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
  }
#endif
  printf("skipped: no AVX2+F16C kernels in this build or on this CPU\n");
  return 77;
}
