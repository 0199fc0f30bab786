/* tests/test_tier_reserve.c - zero-copy writes into memory tiers
 * (kvt_tier_reserve / kvt_tier_publish / kvt_tier_abort): a reserved block is
 * invisible until published, then reads back as a PUT of its bytes would;
 * an abort leaves the old value; room is accounted; tiers that cannot say
 * KVT_ENOTSUP; many threads at once. */
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
#include "tier_test_util.h"

static kvt_key key_of(uint64_t i) {
  kvt_key k;
  memset(&k, 0, sizeof(k));
  memcpy(k.bytes, &i, sizeof(i));
  k.bytes[15] = 0x5A;
  return k;
}

static kvt_tier *open_tier(kvt_ctx **ctx, const char *spec) {
  assert_int_equal(kvt_ctx_create(NULL, ctx), 0);
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open(*ctx, spec, &t), 0);
  return t;
}

static void test_reserved_block_is_invisible_until_published(void **state) {
  (void)state;
  kvt_ctx *ctx;
  kvt_tier *t = open_tier(&ctx, "dram:8MiB,pin=off");
  const kvt_key k = key_of(1);
  uint8_t old[1000], neu[3000], got[4096];
  fill(old, sizeof(old), 1);
  fill(neu, sizeof(neu), 2);
  assert_int_equal(kvt_tier_put(t, &k, old, sizeof(old)), 0);
  kvt_tier_reservation r;
  assert_int_equal(kvt_tier_reserve(t, &k, sizeof(neu), &r), 0);
  assert_non_null(r.data);
  assert_int_equal(r.len, sizeof(neu));
  memcpy(r.data, neu, sizeof(neu));
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0); /* still the old one */
  assert_int_equal(len, sizeof(old));
  assert_memory_equal(got, old, sizeof(old));
  assert_int_equal(kvt_tier_publish(t, &r), 0);
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_int_equal(len, sizeof(neu));
  assert_memory_equal(got, neu, sizeof(neu));
  assert_int_equal(kvt_tier_publish(t, &r), -EINVAL); /* once only */
  kvt_tier_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.items, 1);
  assert_int_equal(s.puts, 2);
  assert_int_equal(s.bytes_in, sizeof(old) + sizeof(neu));
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static void test_abort_leaves_the_old_value_and_gives_the_room_back(void **state) {
  (void)state;
  kvt_ctx *ctx;
  kvt_tier *t = open_tier(&ctx, "dram:1MiB,pin=off");
  const kvt_key k = key_of(2);
  uint8_t v[512], got[512];
  fill(v, sizeof(v), 3);
  assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);
  kvt_tier_stats before, after;
  memset(&before, 0, sizeof(before));
  before.struct_size = after.struct_size = sizeof(before);
  assert_int_equal(kvt_tier_stats_get(t, &before), 0);
  kvt_tier_reservation r;
  assert_int_equal(kvt_tier_reserve(t, &k, 600 * 1024, &r), 0);
  kvt_tier_reservation r2; /* no room for a second such block */
  const kvt_key k3 = key_of(3);
  assert_int_equal(kvt_tier_reserve(t, &k3, 600 * 1024, &r2), -ENOSPC);
  memset(r.data, 0xEE, r.len);
  kvt_tier_abort(t, &r);
  assert_int_equal(kvt_tier_stats_get(t, &after), 0);
  assert_int_equal(after.used, before.used);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_memory_equal(got, v, sizeof(v));
  assert_int_equal(kvt_tier_reserve(t, &k3, 600 * 1024, &r2), 0); /* room is back */
  kvt_tier_abort(t, &r2);
  kvt_tier_abort(t, &r2); /* a second abort does nothing */
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static void test_tiers_that_cannot_reserve_say_enotsup(void **state) {
  (void)state;
  kvt_ctx *ctx;
  kvt_tier *t = open_tier(&ctx, "trace@dram:1MiB,pin=off");
  kvt_tier_reservation r;
  const kvt_key k4 = key_of(4);
  assert_int_equal(kvt_tier_reserve(t, &k4, 10, &r), KVT_ENOTSUP);
  assert_int_equal(kvt_tier_reserve(NULL, &k4, 10, &r), -EINVAL);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static void test_zero_length_reservation_publishes_an_empty_value(void **state) {
  (void)state;
  kvt_ctx *ctx;
  kvt_tier *t = open_tier(&ctx, "dram:1MiB,pin=off");
  kvt_tier_reservation r;
  const kvt_key k5 = key_of(5);
  assert_int_equal(kvt_tier_reserve(t, &k5, 0, &r), 0);
  assert_null(r.data);
  assert_int_equal(kvt_tier_publish(t, &r), 0);
  uint64_t len = 7;
  assert_int_equal(kvt_tier_query(t, &k5, &len), 0);
  assert_int_equal(len, 0);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

typedef struct worker {
  kvt_tier *t;
  int id, bad;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  uint8_t buf[4096], got[4096];
  for (int i = 0; i < 300; i++) {
    const kvt_key k = key_of((uint64_t)w->id * 1000 + (uint64_t)(i % 17));
    const uint64_t len = 100 + (uint64_t)((i * 37) % 3900);
    fill(buf, len, (uint64_t)w->id * 100000 + (uint64_t)i);
    kvt_tier_reservation r;
    if (kvt_tier_reserve(w->t, &k, len, &r))
      continue;
    memcpy(r.data, buf, len);
    if (i % 5 == 4) {
      kvt_tier_abort(w->t, &r);
      continue;
    }
    if (kvt_tier_publish(w->t, &r)) {
      w->bad++;
      continue;
    }
    uint64_t n = 0;
    if (kvt_tier_get(w->t, &k, got, sizeof(got), &n) || n != len || memcmp(got, buf, len))
      w->bad++; /* keys are per worker: nobody else replaces it */
  }
  return NULL;
}

static void test_many_threads_reserve_publish_and_abort_at_once(void **state) {
  (void)state;
  kvt_ctx *ctx;
  kvt_tier *t = open_tier(&ctx, "dram:64MiB,pin=off");
  pthread_t th[8];
  worker w[8];
  for (int i = 0; i < 8; i++) {
    w[i] = (worker){t, i, 0};
    pthread_create(&th[i], NULL, work, &w[i]);
  }
  for (int i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(w[i].bad, 0);
  }
  kvt_tier_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.items, 8 * 17);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reserved_block_is_invisible_until_published),
      cmocka_unit_test(test_abort_leaves_the_old_value_and_gives_the_room_back),
      cmocka_unit_test(test_tiers_that_cannot_reserve_say_enotsup),
      cmocka_unit_test(test_zero_length_reservation_publishes_an_empty_value),
      cmocka_unit_test(test_many_threads_reserve_publish_and_abort_at_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
