/* tests/test_gpu_dram_pin.c - the dram tier pins its slabs for the GPU
 * (cudaHostRegister) when a device is present: whole slabs, not payloads;
 * every registration undone on close (re-opening on the same addresses would
 * fail otherwise); pin=off pins nothing. Skips (77) without a CUDA device. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvtier.h"
#include "tier_test_util.h"

static kvt_ctx *ctx;

static uint64_t pinned_of(kvt_tier *t) {
  kvt_tier_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  return s.pinned_bytes;
}

static void test_gpu_dram_slabs_are_pinned_whole_and_released(void **state) {
  (void)state;
  const size_t n = 1u << 20;
  uint8_t *v = malloc(n), *back = malloc(n);
  fill(v, n, 42);
  for (int round = 0; round < 20; round++) {
    kvt_tier *t = NULL;
    assert_int_equal(kvt_tier_open(ctx, "dram:256MiB,pin=on", &t), 0);
    assert_int_equal(pinned_of(t), 0); /* lazily: nothing before the first put */
    kvt_key k = {{(uint8_t)round, 1}};
    assert_int_equal(kvt_tier_put(t, &k, v, n), 0);
    assert_int_equal(pinned_of(t), 64u << 20); /* one whole 64 MiB slab */
    k.bytes[2] = 1;
    assert_int_equal(kvt_tier_put(t, &k, v, n), 0);
    assert_int_equal(pinned_of(t), 64u << 20); /* the same slab */
    uint64_t len = 0;
    assert_int_equal(kvt_tier_get(t, &k, back, n, &len), 0);
    assert_memory_equal(back, v, n);
    kvt_tier_close(t); /* unregisters: the next round reuses the addresses */
  }
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open(ctx, "dram:256MiB,pin=off", &t), 0);
  kvt_key k = {{9}};
  assert_int_equal(kvt_tier_put(t, &k, v, n), 0);
  assert_int_equal(pinned_of(t), 0);
  kvt_tier_close(t);
  free(v);
  free(back);
}

static void test_gpu_dram_pinned_cache_round_trip(void **state) {
  (void)state;
  /* The default (pin=auto) pins on a GPU machine: a cache over it works as
   * anywhere else. */
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open(ctx, "dram:128MiB", &t), 0);
  const size_t n = 3u << 20;
  uint8_t *v = malloc(n), *back = malloc(n);
  for (int i = 0; i < 30; i++) {
    kvt_key k = {{(uint8_t)i, 2}};
    fill(v, n, (uint64_t)i);
    int r = kvt_tier_put(t, &k, v, n);
    assert_true(r == 0 || r == -ENOSPC);
    if (r == 0) {
      assert_int_equal(kvt_tier_get(t, &k, back, n, NULL), 0);
      assert_memory_equal(back, v, n);
    }
  }
  assert_true(pinned_of(t) >= (64u << 20));
  kvt_tier_close(t);
  free(v);
  free(back);
}

int main(void) {
  if (kvt_ctx_create(NULL, &ctx))
    return 1;
  void *page = aligned_alloc(4096, 4096);
  const int can = kvt_gpu_host_register(NULL, page, 4096);
  if (can == 0)
    kvt_gpu_host_unregister(NULL, page);
  free(page);
  if (can) {
    fprintf(stderr, "test_gpu_dram_pin: cannot pin host memory here (%s); skipped\n",
            kvt_strerror(can));
    kvt_ctx_destroy(ctx);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu_dram_slabs_are_pinned_whole_and_released),
      cmocka_unit_test(test_gpu_dram_pinned_cache_round_trip),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  kvt_ctx_destroy(ctx);
  return r;
}
