/* tests/test_tier_dram.c - what is particular to the dram tier: capacity and
 * ENOSPC, granule accounting, replace keeping the old value on failure,
 * coalescing of freed space, lazy slabs (no allocation per payload, nothing
 * left after close), allocation failure as a completion, and readers racing
 * deletes and replaces. Behaviour every tier shares is in
 * test_tier_conformance.c. Run under the ASan build too: the tier poisons
 * free slab bytes there, so a read of a freed block is reported. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvtier.h"
#include "kvtier/gpu.h"

#include "cache_fixture.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define MAX_LIVE 4096

/* An allocator that counts, checks frees and can refuse from a given call on. */
typedef struct counting {
  pthread_mutex_t mu;
  long calls, outstanding, bad_frees;
  long fail_from; /* refuse calls with this index and later; -1: never */
  long big;       /* allocations of at least 1 MiB: slabs */
  uint64_t big_bytes_live;
  size_t big_min_align;
  struct {
    void *p;
    size_t size;
  } live[MAX_LIVE];
} counting;

static void *c_alloc(void *opaque, size_t size, size_t align) {
  counting *c = opaque;
  pthread_mutex_lock(&c->mu);
  void *p = NULL;
  if (c->fail_from < 0 || c->calls < c->fail_from) {
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size ? size : 1))
      p = NULL;
  }
  c->calls++;
  for (int i = 0; p && i < MAX_LIVE; i++)
    if (!c->live[i].p) {
      c->live[i].p = p;
      c->live[i].size = size;
      c->outstanding++;
      if (size >= MiB) {
        c->big++;
        c->big_bytes_live += size;
        if (!c->big_min_align || align < c->big_min_align)
          c->big_min_align = align;
      }
      break;
    }
  pthread_mutex_unlock(&c->mu);
  return p;
}

static void c_free(void *opaque, void *ptr) {
  counting *c = opaque;
  if (!ptr)
    return;
  pthread_mutex_lock(&c->mu);
  int found = 0;
  for (int i = 0; i < MAX_LIVE && !found; i++)
    if (c->live[i].p == ptr) {
      if (c->live[i].size >= MiB)
        c->big_bytes_live -= c->live[i].size;
      c->live[i].p = NULL;
      c->outstanding--;
      found = 1;
      free(ptr);
    }
  c->bad_frees += !found;
  pthread_mutex_unlock(&c->mu);
}

static kvt_ctx *ctx_counting(counting *c) {
  memset(c, 0, sizeof(*c));
  pthread_mutex_init(&c->mu, NULL);
  c->fail_from = -1;
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.allocator.alloc = c_alloc;
  cfg.allocator.free = c_free;
  cfg.allocator.opaque = c;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), 0);
  return ctx;
}

static void ctx_counting_done(kvt_ctx *ctx, counting *c) {
  kvt_ctx_destroy(ctx);
  assert_int_equal(c->outstanding, 0);
  assert_int_equal(c->bad_frees, 0);
  pthread_mutex_destroy(&c->mu);
}

static kvt_key key_of(uint32_t i) {
  kvt_key k;
  memset(&k, 0xA5, sizeof(k));
  memcpy(k.bytes, &i, sizeof(i));
  return k;
}

static kvt_tier *open_tier(kvt_ctx *ctx, const char *spec) {
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open(ctx, spec, &t), 0);
  return t;
}

static kvt_tier_stats stats_of(kvt_tier *t) {
  kvt_tier_stats s;
  s.struct_size = sizeof(s);
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  return s;
}

static int put_fill(kvt_tier *t, uint32_t key, int byte, uint64_t len) {
  uint8_t *buf = malloc(len ? len : 1);
  assert_non_null(buf);
  memset(buf, byte, len);
  const kvt_key k = key_of(key);
  const int rc = kvt_tier_put(t, &k, buf, len);
  free(buf);
  return rc;
}

/* Asserts key holds len bytes, all equal to byte. */
static void expect_fill(kvt_tier *t, uint32_t key, int byte, uint64_t len) {
  uint8_t *buf = malloc(len + 1);
  assert_non_null(buf);
  const kvt_key k = key_of(key);
  uint64_t got = 0;
  assert_int_equal(kvt_tier_get(t, &k, buf, len + 1, &got), 0);
  assert_int_equal(got, len);
  for (uint64_t i = 0; i < len; i++)
    if (buf[i] != (uint8_t)byte)
      fail_msg("key %u byte %llu is %d, not %d", key, (unsigned long long)i, buf[i], byte);
  free(buf);
}

static void test_dram_open_rejects_zero_or_unparsable_capacity(void **state) {
  (void)state;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  const char *bad[] = {"dram:0", "dram:", "dram:lots", "dram:8XiB", "dram:-1", "dram:0GiB"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    kvt_tier *t = (kvt_tier *)&ctx; /* must stay untouched */
    assert_int_equal(kvt_tier_open(ctx, bad[i], &t), -EINVAL);
    assert_ptr_equal(t, (kvt_tier *)&ctx);
    assert_non_null(strstr(kvt_ctx_last_error(ctx), "dram"));
  }
  kvt_tier *t = open_tier(ctx, "dram:8GiB");
  kvt_tier_stats s = stats_of(t);
  assert_int_equal(s.capacity, 8ull << 30);
  assert_int_equal(s.used, 0);
  assert_string_equal(kvt_tier_spec(t), "dram:8GiB");
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

/* pin=off never pins; pin=on opens only where host memory can be pinned
 * (a CUDA build with a device; test_gpu_dram_pin.c checks that side); the
 * default (auto) opens everywhere and pins only with a device. */
static void test_dram_pin_option(void **state) {
  (void)state;
  kvt_ctx *c;
  assert_int_equal(kvt_ctx_create(NULL, &c), 0);
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open(c, "dram:1MiB,pin=off", &t), 0);
  uint8_t v[1000] = {1};
  kvt_key k = {{7}};
  assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);
  kvt_tier_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.pinned_bytes, 0);
  kvt_tier_close(t);
  assert_int_equal(kvt_tier_open(c, "dram:1MiB,pin=maybe", &t), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(c), "pin=maybe"));
  assert_int_equal(kvt_tier_open(c, "dram:1MiB,pin=auto", &t), 0);
  kvt_tier_close(t);
  /* Whether this machine can pin at all decides what pin=on does. */
  void *page = aligned_alloc(4096, 4096);
  const int can = kvt_gpu_host_register(NULL, page, 4096);
  if (can == 0)
    kvt_gpu_host_unregister(NULL, page);
  free(page);
  if (!kvt_has_feature("cuda"))
    assert_int_equal(can, KVT_ENOTSUP);
  const int r = kvt_tier_open(c, "dram:1MiB,pin=on", &t);
  if (can == 0) {
    assert_int_equal(r, 0);
    kvt_tier_close(t);
  } else {
    assert_int_equal(r, can);
    assert_non_null(strstr(kvt_ctx_last_error(c), "pin=on"));
  }
  kvt_ctx_destroy(c);
}

/* A loan is the stored bytes themselves, held in place: a delete or a
 * replace while lent frees the block only when it is returned (ASan builds
 * poison freed blocks, so reading a freed one would be reported). */
static void test_dram_borrow_lends_in_place_until_returned(void **state) {
  (void)state;
  kvt_ctx *c;
  assert_int_equal(kvt_ctx_create(NULL, &c), 0);
  kvt_tier *t = open_tier(c, "dram:1MiB,pin=off");
  uint8_t v[3000], w[3000];
  memset(v, 0x5A, sizeof(v));
  memset(w, 0xA5, sizeof(w));
  kvt_key k = {{1, 2, 3}};
  assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);
  kvt_tier_loan a, b;
  assert_int_equal(kvt_tier_borrow(t, &k, &a), 0);
  assert_int_equal(a.len, sizeof(v));
  assert_memory_equal(a.data, v, sizeof(v));
  assert_int_equal(kvt_tier_put(t, &k, w, sizeof(w)), 0); /* replaced while lent */
  assert_memory_equal(a.data, v, sizeof(v));
  assert_int_equal(kvt_tier_borrow(t, &k, &b), 0);
  assert_memory_equal(b.data, w, sizeof(w));
  assert_int_equal(kvt_tier_del(t, &k), 0); /* deleted while lent */
  assert_memory_equal(b.data, w, sizeof(w));
  kvt_tier_return(t, &a);
  kvt_tier_return(t, &b);
  assert_int_equal(kvt_tier_borrow(t, &k, &a), KVT_ENOTFOUND);
  assert_int_equal(stats_of(t).used, 0); /* both blocks freed on return */
  /* Loans are bounded: past the pin records, -EAGAIN. */
  kvt_tier_loan many[80];
  int lent = 0, r = 0;
  for (int i = 0; i < 80; i++) {
    kvt_key ki = {{9, (uint8_t)i}};
    assert_int_equal(kvt_tier_put(t, &ki, v, 100), 0);
    r = kvt_tier_borrow(t, &ki, &many[lent]);
    if (r)
      break;
    lent++;
  }
  assert_int_equal(r, -EAGAIN);
  assert_true(lent >= 8);
  for (int i = 0; i < lent; i++)
    kvt_tier_return(t, &many[i]);
  kvt_tier_close(t);
  /* A tier that cannot lend says so. */
  char dir[] = "/tmp/kvt-borrow-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char spec[64];
  snprintf(spec, sizeof(spec), "nvme:%s:1MiB", dir);
  t = open_tier(c, spec);
  assert_int_equal(kvt_tier_borrow(t, &k, &a), KVT_ENOTSUP);
  kvt_tier_close(t);
  char cmd[96];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  kvt_ctx_destroy(c);
}

/* A loan keeps the bytes it lent while the key is replaced and then
 * deleted; the old block stays counted until the loan comes back, and the
 * tier closes with nothing leaked (the fixture's allocator check). */
static void test_tier_loan_survives_replace_and_delete_until_returned(void **state) {
  (void)state;
  kvt_tier *t;
  assert_int_equal(kvt_tier_open(fx->ctx, "dram:64KiB,pin=off", &t), 0);
  kvt_key k = {{9, 8, 7}};
  uint8_t v1[1000], v2[3000], back[3000];
  memset(v1, 0x11, sizeof(v1));
  memset(v2, 0x22, sizeof(v2));
  assert_int_equal(kvt_tier_put(t, &k, v1, sizeof(v1)), 0);
  kvt_tier_loan loan;
  assert_int_equal(kvt_tier_borrow(t, &k, &loan), 0);
  assert_int_equal(loan.len, sizeof(v1));
  assert_int_equal(kvt_tier_put(t, &k, v2, sizeof(v2)), 0); /* replace */
  uint64_t got = 0;
  assert_int_equal(kvt_tier_get(t, &k, back, sizeof(back), &got), 0);
  assert_int_equal(got, sizeof(v2));
  assert_memory_equal(back, v2, sizeof(v2));
  assert_memory_equal(loan.data, v1, sizeof(v1)); /* the loan still sees v1 */
  kvt_tier_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.items, 1);
  assert_int_equal(s.used, 1024 + 3072); /* the replaced block waits for the loan */
  assert_int_equal(kvt_tier_del(t, &k), 0);
  assert_memory_equal(loan.data, v1, sizeof(v1));
  kvt_tier_return(t, &loan);
  assert_null(loan.internal);
  kvt_tier_return(t, &loan); /* a second return is harmless */
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.items, 0);
  assert_int_equal(s.used, 0);
  /* Every pin record came back: 64 loans of distinct keys fit again. */
  kvt_tier_loan many[64];
  for (int i = 0; i < 64; i++) {
    kvt_key ki = {{(uint8_t)i, 1}};
    assert_int_equal(kvt_tier_put(t, &ki, v1, 100), 0);
    assert_int_equal(kvt_tier_borrow(t, &ki, &many[i]), 0);
  }
  kvt_key extra = {{200, 1}};
  assert_int_equal(kvt_tier_put(t, &extra, v1, 100), 0);
  assert_int_equal(kvt_tier_borrow(t, &extra, &loan), -EAGAIN);
  for (int i = 0; i < 64; i++)
    kvt_tier_return(t, &many[i]);
  assert_int_equal(kvt_tier_borrow(t, &extra, &loan), 0);
  kvt_tier_return(t, &loan);
  kvt_tier_close(t);
}

static void test_dram_put_beyond_free_space_is_enospc_and_used_stays_within_capacity(void **state) {
  (void)state;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  kvt_tier *t = open_tier(ctx, "dram:64KiB");
  uint32_t stored = 0;
  int rc;
  while ((rc = put_fill(t, stored, (int)stored + 1, 3000)) == 0) { /* 3000 -> 3072 with rounding */
    stored++;
    assert_true(stats_of(t).used <= 64 * KiB);
  }
  assert_int_equal(rc, -ENOSPC);
  assert_int_equal(stored, 64 * KiB / 3072);
  kvt_tier_stats s = stats_of(t);
  assert_int_equal(s.items, stored);
  assert_int_equal(s.used, stored * 3072ull);
  assert_int_equal(s.errors, 1); /* -ENOSPC is an error, unlike a miss */
  assert_int_equal(put_fill(t, 999, 1, 64 * KiB + 1), -ENOSPC); /* larger than the tier */
  for (uint32_t i = 0; i < stored; i++)
    expect_fill(t, i, (int)i + 1, 3000); /* a refused PUT disturbs nothing */
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static void test_dram_used_counts_granule_rounding_and_empty_values(void **state) {
  (void)state;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  kvt_tier *t = open_tier(ctx, "dram:1MiB");
  assert_int_equal(put_fill(t, 1, 7, 1), 0);
  assert_int_equal(stats_of(t).used, 256);
  assert_int_equal(put_fill(t, 2, 8, 257), 0);
  assert_int_equal(stats_of(t).used, 256 + 512);
  assert_int_equal(put_fill(t, 3, 0, 0), 0); /* an empty value takes no space */
  kvt_tier_stats s = stats_of(t);
  assert_int_equal(s.used, 768);
  assert_int_equal(s.items, 3);
  uint64_t len = 99;
  const kvt_key k3 = key_of(3), k1 = key_of(1);
  assert_int_equal(kvt_tier_query(t, &k3, &len), 0);
  assert_int_equal(len, 0);
  assert_int_equal(kvt_tier_get(t, &k3, NULL, 0, &len), 0);
  assert_int_equal(kvt_tier_del(t, &k3), 0);
  assert_int_equal(kvt_tier_del(t, &k1), 0);
  s = stats_of(t);
  assert_int_equal(s.used, 512);
  assert_int_equal(s.items, 1);
  expect_fill(t, 2, 8, 257);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static void test_dram_failed_replace_keeps_the_old_value(void **state) {
  (void)state;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  kvt_tier *t = open_tier(ctx, "dram:64KiB");
  assert_int_equal(put_fill(t, 1, 0xAA, 40 * KiB), 0);
  /* The new value is stored before the old is freed: both do not fit. */
  assert_int_equal(put_fill(t, 1, 0xBB, 40 * KiB), -ENOSPC);
  expect_fill(t, 1, 0xAA, 40 * KiB);
  assert_int_equal(stats_of(t).used, 40 * KiB);
  assert_int_equal(put_fill(t, 1, 0xCC, 16 * KiB), 0);
  expect_fill(t, 1, 0xCC, 16 * KiB);
  kvt_tier_stats s = stats_of(t);
  assert_int_equal(s.used, 16 * KiB);
  assert_int_equal(s.items, 1);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static void test_dram_freed_neighbours_coalesce_into_one_large_block(void **state) {
  (void)state;
  counting c;
  kvt_ctx *ctx = ctx_counting(&c);
  kvt_tier *t = open_tier(ctx, "dram:64KiB");
  for (uint32_t i = 0; i < 64; i++)
    assert_int_equal(put_fill(t, i, (int)i, KiB), 0);
  assert_int_equal(put_fill(t, 100, 1, KiB), -ENOSPC);
  for (uint32_t i = 0; i < 62; i += 2) {
    const kvt_key k = key_of(i);
    assert_int_equal(kvt_tier_del(t, &k), 0);
  }
  assert_int_equal(stats_of(t).used, 33 * KiB);
  /* 31 KiB are free, but only in 1 KiB holes: fragmentation. */
  assert_int_equal(put_fill(t, 100, 1, 2 * KiB), -ENOSPC);
  /* Odd ones downwards, so holes merge both with the extent below and above.
   * Keys 62 and 63 stay: the slab is never empty, so only coalescing can
   * make room (an empty slab could be released and made afresh). */
  for (uint32_t i = 61; i < 62; i -= 2) {
    expect_fill(t, i, (int)i, KiB);
    const kvt_key k = key_of(i);
    assert_int_equal(kvt_tier_del(t, &k), 0);
  }
  assert_int_equal(stats_of(t).used, 2 * KiB);
  const long calls = c.calls;
  assert_int_equal(put_fill(t, 100, 0x5A, 62 * KiB), 0);
  assert_int_equal(c.calls, calls); /* the same slab, no new one */
  expect_fill(t, 100, 0x5A, 62 * KiB);
  expect_fill(t, 62, 62, KiB);
  expect_fill(t, 63, 63, KiB);
  assert_int_equal(stats_of(t).used, 64 * KiB);
  kvt_tier_close(t);
  ctx_counting_done(ctx, &c);
}

static void test_dram_slabs_are_lazy_shared_by_payloads_and_freed_on_close(void **state) {
  (void)state;
  counting c;
  kvt_ctx *ctx = ctx_counting(&c);
  kvt_tier *t = open_tier(ctx, "dram:1GiB");
  assert_int_equal(c.big, 0); /* nothing reserved up front */
  const long before = c.calls;
  for (uint32_t i = 0; i < 1000; i++)
    assert_int_equal(put_fill(t, i, (int)(i & 0xFF), 1000), 0);
  assert_int_equal(c.big, 1); /* one 64 MiB slab holds all of them */
  assert_int_equal(c.big_bytes_live, 64 * MiB);
  assert_int_equal(c.big_min_align, 4096);
  /* Besides the slab only metadata that grows geometrically: the index and
   * the slab's free-extent array. */
  assert_true(c.calls - before <= 12);
  const long steady = c.calls;
  for (uint32_t i = 0; i < 1000; i++) /* replace, delete and re-put: no allocation at all */
    assert_int_equal(put_fill(t, i, (int)((i + 1) & 0xFF), 1000), 0);
  for (uint32_t i = 0; i < 1000; i += 3) {
    const kvt_key k = key_of(i);
    assert_int_equal(kvt_tier_del(t, &k), 0);
    assert_int_equal(put_fill(t, i, 3, 700), 0);
  }
  assert_int_equal(c.calls, steady);
  expect_fill(t, 999, 3, 700);
  expect_fill(t, 998, (999 & 0xFF), 1000);
  /* Past one slab's worth, a second slab. */
  assert_int_equal(put_fill(t, 5000, 1, 40 * MiB), 0);
  assert_int_equal(put_fill(t, 5001, 2, 40 * MiB), 0);
  assert_int_equal(c.big, 2);
  assert_int_equal(c.big_bytes_live, 128 * MiB);
  kvt_tier_close(t);
  assert_int_equal(c.big_bytes_live, 0);
  ctx_counting_done(ctx, &c);
}

static void test_dram_capacity_remainder_and_oversized_payloads_get_own_slabs(void **state) {
  (void)state;
  counting c;
  kvt_ctx *ctx = ctx_counting(&c);
  kvt_tier *t = open_tier(ctx, "dram:100MiB");
  for (uint32_t i = 0; i < 3; i++) /* 64 MiB slab holds two, a 36 MiB remainder the third */
    assert_int_equal(put_fill(t, i, (int)i + 1, 30 * MiB), 0);
  assert_int_equal(c.big_bytes_live, 100 * MiB);
  /* 10 MiB are free but split 4 + 6 across slabs: fragmentation, no fit. */
  assert_int_equal(put_fill(t, 3, 9, 8 * MiB), -ENOSPC);
  for (uint32_t i = 0; i < 3; i++) {
    expect_fill(t, i, (int)i + 1, 30 * MiB);
    const kvt_key k = key_of(i);
    assert_int_equal(kvt_tier_del(t, &k), 0);
  }
  /* Larger than a standard slab: the empty slabs make room for one of its size. */
  assert_int_equal(put_fill(t, 10, 0x11, 90 * MiB), 0);
  assert_int_equal(c.big_bytes_live, 90 * MiB);
  expect_fill(t, 10, 0x11, 90 * MiB);
  const kvt_key k10 = key_of(10);
  assert_int_equal(kvt_tier_del(t, &k10), 0);
  const long slabs = c.big;
  assert_int_equal(put_fill(t, 11, 0x22, 5 * MiB), 0); /* reuses the empty large slab */
  assert_int_equal(c.big, slabs);
  kvt_tier_stats s = stats_of(t);
  assert_int_equal(s.used, 5 * MiB);
  assert_int_equal(s.capacity, 100 * MiB);
  kvt_tier_close(t);
  ctx_counting_done(ctx, &c);
}

/* A scenario in which every allocation may fail: each step either works or
 * gives -ENOMEM, what worked stays readable, and nothing leaks. */
static void test_dram_allocation_failure_is_an_enomem_completion(void **state) {
  (void)state;
  uint8_t *big = malloc(64 * MiB);
  assert_non_null(big);
  memset(big, 0x3C, 64 * MiB);
  const kvt_key ka = key_of(1), kb = key_of(2);
  for (long fail_at = 0;; fail_at++) {
    counting c;
    kvt_ctx *ctx = ctx_counting(&c);
    c.fail_from = c.calls + fail_at;
    kvt_tier *t = NULL;
    int rc = kvt_tier_open(ctx, "dram:128MiB", &t);
    if (rc) {
      assert_int_equal(rc, -ENOMEM);
      ctx_counting_done(ctx, &c);
      continue;
    }
    const int ra = kvt_tier_put(t, &ka, big, KiB);
    const int rb = kvt_tier_put(t, &kb, big, 64 * MiB); /* needs a second slab */
    assert_true(ra == 0 || ra == -ENOMEM);
    assert_true(rb == 0 || rb == -ENOMEM);
    uint64_t len = 0;
    if (ra == 0)
      assert_int_equal(kvt_tier_query(t, &ka, &len), 0);
    if (rb == 0)
      assert_int_equal(kvt_tier_query(t, &kb, &len), 0);
    const kvt_tier_stats s = stats_of(t);
    assert_int_equal(s.errors, (ra != 0) + (rb != 0));
    assert_int_equal(s.items, (ra == 0) + (rb == 0));
    kvt_tier_close(t);
    ctx_counting_done(ctx, &c);
    if (ra == 0 && rb == 0)
      break;
  }
  /* Through submit and poll: accepted, then completed with -ENOMEM. */
  counting c;
  kvt_ctx *ctx = ctx_counting(&c);
  kvt_tier *t = open_tier(ctx, "dram:1MiB");
  c.fail_from = c.calls;
  kvt_tier_op op, *ops[1] = {&op}, *done[2];
  kvt_tier_op_init(&op, KVT_TIER_PUT, &ka, big, KiB, 42);
  assert_int_equal(kvt_tier_submit(t, ops, 1), 1);
  assert_int_equal(kvt_tier_poll(t, done, 2, 1000), 1);
  assert_ptr_equal(done[0], &op);
  assert_int_equal(op.result, -ENOMEM);
  assert_int_equal(op.user_data, 42);
  c.fail_from = -1;
  assert_int_equal(kvt_tier_put(t, &ka, big, KiB), 0);
  kvt_tier_close(t);
  ctx_counting_done(ctx, &c);
  free(big);
}

typedef struct race {
  kvt_tier *t;
  volatile int stop;
  long hits[2];
  long errors, torn; /* cmocka's asserts belong to the main thread: count here */
} race;

#define RACE_LEN (64 * KiB)

static void *race_reader(void *arg) {
  race *r = ((race **)arg)[0];
  const long me = (long)(intptr_t)((void **)arg)[1];
  uint8_t *buf = malloc(RACE_LEN);
  const kvt_key k = key_of(7);
  while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
    uint64_t len = 0;
    const int rc = kvt_tier_get(r->t, &k, buf, RACE_LEN, &len);
    if (rc == KVT_ENOTFOUND)
      continue;
    if (rc != 0 || len != RACE_LEN) {
      __atomic_add_fetch(&r->errors, 1, __ATOMIC_RELAXED);
      break;
    }
    /* Every value is one repeated byte: a mixture means the block was reused mid-copy. */
    if (buf[0] == 0 || memcmp(buf, buf + 1, RACE_LEN - 1) != 0) {
      __atomic_add_fetch(&r->torn, 1, __ATOMIC_RELAXED);
      break;
    }
    __atomic_add_fetch(&r->hits[me], 1, __ATOMIC_RELAXED);
  }
  free(buf);
  return NULL;
}

/* Four values' worth of capacity, so a freed block is reused at once by the
 * next PUT: reading a block after its free would see other bytes (and, under
 * ASan, poisoned memory). */
static void test_dram_concurrent_get_never_reads_freed_or_reused_blocks(void **state) {
  (void)state;
  counting c;
  kvt_ctx *ctx = ctx_counting(&c);
  race r = {open_tier(ctx, "dram:256KiB"), 0, {0, 0}, 0, 0};
  pthread_t th[2];
  void *args[2][2] = {{&r, (void *)(intptr_t)0}, {&r, (void *)(intptr_t)1}};
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, race_reader, args[i]), 0);
  const kvt_key k = key_of(7), other = key_of(8);
  uint8_t *val = malloc(RACE_LEN);
  long iter = 0;
  for (; iter < 200000; iter++) {
    if (iter >= 2000 && __atomic_load_n(&r.hits[0], __ATOMIC_RELAXED) > 100 &&
        __atomic_load_n(&r.hits[1], __ATOMIC_RELAXED) > 100)
      break;
    if (__atomic_load_n(&r.errors, __ATOMIC_RELAXED) || __atomic_load_n(&r.torn, __ATOMIC_RELAXED))
      break;
    memset(val, (int)(iter % 250) + 1, RACE_LEN);
    assert_int_equal(kvt_tier_put(r.t, &k, val, RACE_LEN), 0);
    memset(val, (int)((iter + 1) % 250) + 1, RACE_LEN);
    assert_int_equal(kvt_tier_put(r.t, &k, val, RACE_LEN), 0); /* replace */
    assert_int_equal(kvt_tier_put(r.t, &other, val, RACE_LEN), 0);
    assert_int_equal(kvt_tier_del(r.t, &k), 0);
    assert_int_equal(kvt_tier_del(r.t, &other), 0);
  }
  __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  free(val);
  assert_int_equal(r.errors, 0);
  assert_int_equal(r.torn, 0);
  assert_true(r.hits[0] > 0 && r.hits[1] > 0);
  const kvt_tier_stats s = stats_of(r.t);
  assert_int_equal(s.items, 0);
  assert_int_equal(s.used, 0); /* blocks freed by their last reader too */
  assert_int_equal(s.errors, 0);
  kvt_tier_close(r.t);
  ctx_counting_done(ctx, &c);
}

typedef struct seen {
  kvt_tier *t;
  int count[100];
  int bad_len, del_failed;
} seen;

static int list_and_delete(void *opaque, const kvt_key *key, uint64_t len) {
  seen *s = opaque;
  uint32_t i;
  memcpy(&i, key->bytes, sizeof(i));
  if (i >= 100)
    return -1;
  s->count[i]++;
  s->bad_len += len != i;
  s->del_failed += kvt_tier_del(s->t, key) != 0; /* calling back into the tier is allowed */
  return 0;
}

static int stop_at_first(void *opaque, const kvt_key *key, uint64_t len) {
  (void)opaque, (void)key, (void)len;
  return 17;
}

static void test_dram_list_gives_every_key_once_and_allows_calls_back(void **state) {
  (void)state;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  kvt_tier *t = open_tier(ctx, "dram:1MiB");
  assert_int_equal(kvt_tier_list(t, stop_at_first, NULL), 0); /* empty */
  for (uint32_t i = 0; i < 100; i++)
    assert_int_equal(put_fill(t, i, 1, i), 0);
  assert_int_equal(kvt_tier_list(t, stop_at_first, NULL), 17);
  seen s;
  memset(&s, 0, sizeof(s));
  s.t = t;
  assert_int_equal(kvt_tier_list(t, list_and_delete, &s), 0);
  for (int i = 0; i < 100; i++)
    assert_int_equal(s.count[i], 1);
  assert_int_equal(s.bad_len, 0);
  assert_int_equal(s.del_failed, 0);
  const kvt_tier_stats st = stats_of(t);
  assert_int_equal(st.items, 0);
  assert_int_equal(st.used, 0);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static void test_dram_stats_follow_operations(void **state) {
  (void)state;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  kvt_tier *t = open_tier(ctx, "dram:1MiB");
  const kvt_key k = key_of(1), absent = key_of(2);
  uint8_t buf[1000];
  memset(buf, 9, sizeof(buf));
  assert_int_equal(kvt_tier_put(t, &k, buf, 1000), 0);
  assert_int_equal(kvt_tier_put(t, &k, buf, 600), 0); /* replace: one item, new size */
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(t, &k, buf, 100, &len), KVT_ENOBUFS);
  assert_int_equal(len, 600);
  assert_int_equal(kvt_tier_get(t, &k, buf, sizeof(buf), &len), 0);
  assert_int_equal(kvt_tier_get(t, &absent, buf, sizeof(buf), &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(t, &absent, &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_del(t, &absent), KVT_ENOTFOUND);
  kvt_tier_stats s = stats_of(t);
  assert_int_equal(s.capacity, MiB);
  assert_int_equal(s.used, 768);
  assert_int_equal(s.items, 1);
  assert_int_equal(s.puts, 2);
  assert_int_equal(s.gets, 3);
  assert_int_equal(s.hits, 1);
  assert_int_equal(s.misses, 1);
  assert_int_equal(s.queries, 1);
  assert_int_equal(s.dels, 1);
  assert_int_equal(s.errors, 0);
  assert_int_equal(s.bytes_in, 1600);
  assert_int_equal(s.bytes_out, 600);
  assert_int_equal(s.in_flight, 0);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dram_open_rejects_zero_or_unparsable_capacity),
      cmocka_unit_test(test_dram_pin_option),
      cmocka_unit_test(test_dram_borrow_lends_in_place_until_returned),
      cmocka_unit_test_setup_teardown(test_tier_loan_survives_replace_and_delete_until_returned,
                                      ct_setup, ct_teardown),
      cmocka_unit_test(test_dram_put_beyond_free_space_is_enospc_and_used_stays_within_capacity),
      cmocka_unit_test(test_dram_used_counts_granule_rounding_and_empty_values),
      cmocka_unit_test(test_dram_failed_replace_keeps_the_old_value),
      cmocka_unit_test(test_dram_freed_neighbours_coalesce_into_one_large_block),
      cmocka_unit_test(test_dram_slabs_are_lazy_shared_by_payloads_and_freed_on_close),
      cmocka_unit_test(test_dram_capacity_remainder_and_oversized_payloads_get_own_slabs),
      cmocka_unit_test(test_dram_allocation_failure_is_an_enomem_completion),
      cmocka_unit_test(test_dram_concurrent_get_never_reads_freed_or_reused_blocks),
      cmocka_unit_test(test_dram_list_gives_every_key_once_and_allows_calls_back),
      cmocka_unit_test(test_dram_stats_follow_operations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
