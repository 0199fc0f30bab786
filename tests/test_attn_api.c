/* tests/test_attn_api.c - the host half of decode attention (kvtier/attn.h)
 * that runs without a GPU: row and scale sizes, the split choice, workspace
 * arithmetic, and the argument checks, which come before any launch (and,
 * built without CUDA, before KVT_ENOTSUP). Label unit: needs no device. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvtier.h"

static kvt_ctx *ctx;

/* A Llama-3.1-8B-shaped cache at fake (aligned, never dereferenced) addresses.
 */
static kvt_attn_cache cache_of(int format) {
  kvt_attn_cache c = KVT_ATTN_CACHE_INIT;
  c.format = format;
  c.dtype = KVT_DTYPE_BF16;
  c.num_blocks = 1024;
  c.block_size = 16;
  c.kv_heads = 8;
  c.head_dim = 128;
  c.k = (void *)(uintptr_t)0x10000;
  c.v = (void *)(uintptr_t)0x20000;
  if (format != KVT_ATTN_RAW) {
    c.k_scale = (void *)(uintptr_t)0x30000;
    c.v_scale = (void *)(uintptr_t)0x40000;
  }
  return c;
}

static kvt_attn_decode_params params_of(uint32_t batch) {
  kvt_attn_decode_params p = KVT_ATTN_DECODE_PARAMS_INIT;
  p.batch = batch;
  p.q_heads = 32;
  p.max_blocks = 512;
  p.softmax_scale = 0.08838834764831845f;
  p.sm_count = 132;
  return p;
}

static void test_attn_row_and_scale_bytes_follow_the_formats(void **state) {
  (void)state;
  assert_int_equal(kvt_attn_row_bytes(KVT_ATTN_RAW, 128, 0), 256);
  assert_int_equal(kvt_attn_row_bytes(KVT_ATTN_RAW, 128, 1), 256);
  assert_int_equal(kvt_attn_row_bytes(KVT_ATTN_K16V8, 128, 0), 256);
  assert_int_equal(kvt_attn_row_bytes(KVT_ATTN_K16V8, 128, 1), 128);
  assert_int_equal(kvt_attn_row_bytes(KVT_ATTN_FP8, 64, 0), 64);
  assert_int_equal(kvt_attn_row_bytes(KVT_ATTN_INT4, 256, 1), 128);
  assert_int_equal(kvt_attn_row_bytes(KVT_ATTN_INT4, 96, 1), 0);
  assert_int_equal(kvt_attn_row_bytes(7, 128, 0), 0);
  assert_int_equal(kvt_attn_scale_bytes(KVT_ATTN_RAW, 128, 0), 0);
  assert_int_equal(kvt_attn_scale_bytes(KVT_ATTN_K16V8, 128, 0), 0);
  assert_int_equal(kvt_attn_scale_bytes(KVT_ATTN_K16V8, 128, 1), 4);
  assert_int_equal(kvt_attn_scale_bytes(KVT_ATTN_FP8, 128, 0), 4);
  assert_int_equal(kvt_attn_scale_bytes(KVT_ATTN_INT4, 128, 0), 16);
  assert_int_equal(kvt_attn_scale_bytes(KVT_ATTN_INT4, 64, 1), 8);
}

static void test_attn_splits_fill_one_wave_and_respect_limits(void **state) {
  (void)state;
  /* 132 SMs x 4 resident CTAs = 528 */
  assert_int_equal(kvt_attn_num_splits(32 * 8, 8192, 132),
                   2); /* B=32: 512 CTAs */
  assert_int_equal(kvt_attn_num_splits(8 * 8, 32768, 132),
                   8); /* B=8: 512 CTAs */
  assert_int_equal(kvt_attn_num_splits(1 * 8, 32768, 132), 64); /* capped */
  assert_int_equal(kvt_attn_num_splits(1 * 8, 1000, 132),
                   4); /* >= 256 tokens each */
  assert_int_equal(kvt_attn_num_splits(1 * 8, 1, 132), 1);
  assert_int_equal(kvt_attn_num_splits(64 * 8, 8192, 132),
                   1); /* already a wave */
  assert_int_equal(kvt_attn_num_splits(0, 0, 0), 1);
  for (uint64_t ctas = 1; ctas < 5000; ctas += 37)
    for (uint32_t len = 1; len < 200000; len = len * 3 + 1) {
      const uint32_t s = kvt_attn_num_splits(ctas, len, 132);
      assert_true(s >= 1 && s <= KVT_ATTN_MAX_SPLITS);
      assert_true(s == 1 || ctas * s <= 528);
    }
}

static void
test_attn_workspace_counts_fp32_partials_of_every_split(void **state) {
  (void)state;
  kvt_attn_cache c = cache_of(KVT_ATTN_K16V8);
  kvt_attn_decode_params p = params_of(8);
  p.max_seq_len = 8192;
  size_t n = 1;
  assert_int_equal(kvt_attn_workspace_size(ctx, &c, &p, &n), 0);
  /* 8 splits: 8 x 32 rows x 8 splits x (128 + 2) floats */
  assert_int_equal(n,
                   (size_t)8 * 32 * 8 * 128 * 4 + (size_t)8 * 32 * 8 * 2 * 4);
  p.num_splits = 1;
  assert_int_equal(kvt_attn_workspace_size(ctx, &c, &p, &n), 0);
  assert_int_equal(n, 0);
  p.num_splits = 3;
  assert_int_equal(kvt_attn_workspace_size(ctx, &c, &p, &n), 0);
  assert_int_equal(n, (size_t)8 * 32 * 3 * 130 * 4);
  p.num_splits = KVT_ATTN_MAX_SPLITS + 1;
  assert_int_equal(kvt_attn_workspace_size(ctx, &c, &p, &n), KVT_ESHAPE);
  p.num_splits = 0;
  p.sm_count = 0;
#ifndef KVT_HAVE_CUDA
  assert_int_equal(kvt_attn_workspace_size(ctx, &c, &p, &n), KVT_ENOTSUP);
#endif
  assert_int_equal(kvt_attn_workspace_size(ctx, NULL, &p, &n), -EINVAL);
  assert_int_equal(kvt_attn_workspace_size(ctx, &c, &p, NULL), -EINVAL);
}

/* INT4 CTAs serve pairs of kv heads where kv_heads is even, so their split
 * count is that of half the CTAs; the workspace follows the splits. */
static void test_attn_decode_splits_count_int4_head_pairs(void **state) {
  (void)state;
  kvt_attn_decode_params p = params_of(8);
  p.max_blocks = 2048;
  p.max_seq_len = 32768;
  uint32_t s = 0;
  size_t n = 0;
  kvt_attn_cache c = cache_of(KVT_ATTN_K16V8);
  assert_int_equal(kvt_attn_decode_splits(ctx, &c, &p, &s), 0);
  assert_int_equal(s, kvt_attn_num_splits(8 * 8, 32768, 132)); /* 8 */
  c = cache_of(KVT_ATTN_INT4);
  assert_int_equal(kvt_attn_decode_splits(ctx, &c, &p, &s), 0);
  assert_int_equal(s, kvt_attn_num_splits(8 * 4, 32768, 132)); /* 16 */
  assert_int_equal(s, 16);
  assert_int_equal(kvt_attn_workspace_size(ctx, &c, &p, &n), 0);
  assert_int_equal(n, (size_t)8 * 32 * 16 * 130 * 4);
  c.kv_heads = 1; /* odd: one head per CTA */
  p.q_heads = 4;
  assert_int_equal(kvt_attn_decode_splits(ctx, &c, &p, &s), 0);
  assert_int_equal(s, kvt_attn_num_splits(8 * 1, 32768, 132));
  p.num_splits = 5; /* the caller's choice wins */
  assert_int_equal(kvt_attn_decode_splits(ctx, &c, &p, &s), 0);
  assert_int_equal(s, 5);
  p.num_splits = KVT_ATTN_MAX_SPLITS + 1;
  assert_int_equal(kvt_attn_decode_splits(ctx, &c, &p, &s), KVT_ESHAPE);
  assert_int_equal(kvt_attn_decode_splits(ctx, NULL, &p, &s), -EINVAL);
  assert_int_equal(kvt_attn_decode_splits(ctx, &c, NULL, &s), -EINVAL);
  assert_int_equal(kvt_attn_decode_splits(ctx, &c, &p, NULL), -EINVAL);
}

/* Each bad field alone gives its error, for workspace and decode alike. */
static void expect_decode(const kvt_attn_cache *c,
                          const kvt_attn_decode_params *p, int want) {
  size_t n;
  assert_int_equal(kvt_attn_workspace_size(ctx, c, p, &n), want);
  /* decode checks pointers too: give it fake ones that are never reached */
  kvt_attn_decode_params d = *p;
  d.q = (void *)(uintptr_t)0x50000;
  d.block_table = (int32_t *)(uintptr_t)0x60000;
  d.seq_lens = (int32_t *)(uintptr_t)0x70000;
  d.out = (void *)(uintptr_t)0x80000;
  d.num_splits = 1;
  if (want)
    assert_int_equal(kvt_attn_decode(ctx, c, &d, NULL), want);
}

static void test_attn_decode_rejects_bad_shapes_before_launch(void **state) {
  (void)state;
  const kvt_attn_cache good = cache_of(KVT_ATTN_INT4);
  const kvt_attn_decode_params gp = params_of(4);
  expect_decode(&good, &gp, 0);
  kvt_attn_cache c = good;
  c.head_dim = 96;
  expect_decode(&c, &gp, KVT_ESHAPE);
  c = good;
  c.block_size = 8;
  expect_decode(&c, &gp, KVT_ESHAPE);
  c.block_size = 24;
  expect_decode(&c, &gp, KVT_ESHAPE);
  c.block_size = 512;
  expect_decode(&c, &gp, KVT_ESHAPE);
  c = good;
  c.dtype = 7;
  expect_decode(&c, &gp, KVT_ESHAPE);
  c = good;
  c.format = 9;
  expect_decode(&c, &gp, KVT_ESHAPE);
  c = good;
  c.struct_size = 8;
  expect_decode(&c, &gp, -EINVAL);
  c = good;
  c.kv_heads = 0;
  expect_decode(&c, &gp, KVT_ESHAPE);
  kvt_attn_decode_params p = gp;
  p.q_heads = 36; /* not a multiple of 8 */
  expect_decode(&good, &p, KVT_ESHAPE);
  p.q_heads = 8 * 65; /* gqa 65 */
  expect_decode(&good, &p, KVT_ESHAPE);
  p = gp;
  p.batch = 0;
  expect_decode(&good, &p, KVT_ESHAPE);
  p = gp;
  p.max_blocks = 0;
  expect_decode(&good, &p, KVT_ESHAPE);
  p = gp;
  p.max_seq_len = 512 * 16 + 1;
  expect_decode(&good, &p, KVT_ESHAPE);
  p = gp;
  p.softmax_scale = INFINITY;
  expect_decode(&good, &p, KVT_ESHAPE);
  p = gp;
  p.struct_size = 4;
  expect_decode(&good, &p, -EINVAL);
  /* decode-only: pointers and alignment */
  kvt_attn_decode_params d = gp;
  d.num_splits = 1;
  assert_int_equal(kvt_attn_decode(ctx, &good, &d, NULL),
                   -EINVAL); /* NULL q, ... */
  c = good;
  c.k_scale = NULL;
  d.q = (void *)(uintptr_t)0x50000;
  d.block_table = (int32_t *)(uintptr_t)0x60000;
  d.seq_lens = (int32_t *)(uintptr_t)0x70000;
  d.out = (void *)(uintptr_t)0x80000;
  assert_int_equal(kvt_attn_decode(ctx, &c, &d, NULL), -EINVAL);
  c = good;
  c.v = (void *)(uintptr_t)0x20004;
  assert_int_equal(kvt_attn_decode(ctx, &c, &d, NULL), KVT_ESHAPE);
  d.q = (void *)(uintptr_t)0x50002;
  assert_int_equal(kvt_attn_decode(ctx, &good, &d, NULL), KVT_ESHAPE);
  d.q = (void *)(uintptr_t)0x50000;
  d.num_splits = 4; /* needs a workspace */
#ifdef KVT_HAVE_CUDA
  assert_int_equal(kvt_attn_decode(ctx, &good, &d, NULL), KVT_ENOBUFS);
#else
  assert_int_equal(kvt_attn_decode(ctx, &good, &d, NULL), KVT_ENOTSUP);
  d.num_splits = 1;
  assert_int_equal(kvt_attn_decode(ctx, &good, &d, NULL), KVT_ENOTSUP);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "without CUDA"));
#endif
  assert_int_equal(kvt_attn_decode(ctx, NULL, &d, NULL), -EINVAL);
}

static void test_attn_append_checks_arguments_first(void **state) {
  (void)state;
  kvt_attn_cache c = cache_of(KVT_ATTN_FP8);
  kvt_attn_append_params a = KVT_ATTN_APPEND_PARAMS_INIT;
  a.batch = 0; /* nothing to do */
  assert_int_equal(kvt_attn_append(ctx, &c, &a, NULL), 0);
  a.batch = 4;
  assert_int_equal(kvt_attn_append(ctx, &c, &a, NULL),
                   -EINVAL); /* NULL k, v, slots */
  a.k = (void *)(uintptr_t)0x50000;
  a.v = (void *)(uintptr_t)0x58000;
  a.slots = (int64_t *)(uintptr_t)0x60004; /* misaligned */
  assert_int_equal(kvt_attn_append(ctx, &c, &a, NULL), KVT_ESHAPE);
  c.head_dim = 48;
  a.slots = (int64_t *)(uintptr_t)0x60000;
  assert_int_equal(kvt_attn_append(ctx, &c, &a, NULL), KVT_ESHAPE);
  c = cache_of(KVT_ATTN_FP8);
  c.v_scale = NULL;
  assert_int_equal(kvt_attn_append(ctx, &c, &a, NULL), -EINVAL);
  a.struct_size = 3;
  c = cache_of(KVT_ATTN_FP8);
  assert_int_equal(kvt_attn_append(ctx, &c, &a, NULL), -EINVAL);
#ifndef KVT_HAVE_CUDA
  a.struct_size = sizeof(a);
  assert_int_equal(kvt_attn_append(ctx, &c, &a, NULL), KVT_ENOTSUP);
#endif
}

int main(void) {
  if (kvt_ctx_create(NULL, &ctx) != 0)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attn_row_and_scale_bytes_follow_the_formats),
      cmocka_unit_test(test_attn_splits_fill_one_wave_and_respect_limits),
      cmocka_unit_test(test_attn_workspace_counts_fp32_partials_of_every_split),
      cmocka_unit_test(test_attn_decode_splits_count_int4_head_pairs),
      cmocka_unit_test(test_attn_decode_rejects_bad_shapes_before_launch),
      cmocka_unit_test(test_attn_append_checks_arguments_first),
  };
  const int rc = cmocka_run_group_tests(tests, NULL, NULL);
  kvt_ctx_destroy(ctx);
  return rc;
}
