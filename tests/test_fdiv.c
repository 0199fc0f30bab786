/* tests/test_fdiv.c - the GPU kernels' division by invariant divisors
 * (kvt_gpu_fdiv in gpu/kvt_gpu_layout.h), checked on the CPU against plain
 * division: every divisor the layouts use, powers of two and their
 * neighbours up to 2^31, and numerators at the edges of the 32-bit range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvt_gpu_layout.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t next32(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}

static void check_divisor(uint32_t d) {
  const kvt_gpu_fdiv f = kvt_gpu_fdiv_make(d);
  assert_int_equal(f.div, d);
  const uint32_t edges[] = {0,          1,          2,          d - 1,      d,
                            d + 1,      2 * d - 1,  2 * d,      0x7fffffffu, 0x80000000u,
                            0xfffffffeu, 0xffffffffu, UINT32_MAX - d, UINT32_MAX / d * d,
                            UINT32_MAX / d * d - 1};
  for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
    const uint32_t n = edges[i];
    if (kvt_gpu_fdiv_q(f, n) != n / d)
      fail_msg("%u / %u: got %u, want %u", n, d, kvt_gpu_fdiv_q(f, n), n / d);
  }
  for (int i = 0; i < 2000; i++) {
    const uint32_t n = next32() >> (next32() % 32);
    if (kvt_gpu_fdiv_q(f, n) != n / d)
      fail_msg("%u / %u: got %u, want %u", n, d, kvt_gpu_fdiv_q(f, n), n / d);
  }
}

static void test_fdiv_equals_division_for_small_divisors(void **state) {
  (void)state;
  for (uint32_t d = 1; d <= 4096; d++)
    check_divisor(d);
}

static void test_fdiv_equals_division_near_powers_of_two(void **state) {
  (void)state;
  for (uint32_t l = 1; l <= 31; l++) {
    const uint32_t p = 1u << l;
    check_divisor(p);
    check_divisor(p - 1);
    if (l < 31)
      check_divisor(p + 1);
  }
  for (int i = 0; i < 2000; i++)
    check_divisor(1 + (next32() & 0x7fffffffu));
}

static void test_fdiv_exhaustive_over_16_bit_numerators(void **state) {
  (void)state;
  const uint32_t ds[] = {3, 5, 6, 7, 12, 24, 40, 48, 96, 100, 384, 1000, 65535, 65537};
  for (size_t k = 0; k < sizeof(ds) / sizeof(ds[0]); k++) {
    const kvt_gpu_fdiv f = kvt_gpu_fdiv_make(ds[k]);
    for (uint32_t n = 0; n < (1u << 20); n++)
      if (kvt_gpu_fdiv_q(f, n) != n / ds[k])
        fail_msg("%u / %u", n, ds[k]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fdiv_equals_division_for_small_divisors),
      cmocka_unit_test(test_fdiv_equals_division_near_powers_of_two),
      cmocka_unit_test(test_fdiv_exhaustive_over_16_bit_numerators),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
