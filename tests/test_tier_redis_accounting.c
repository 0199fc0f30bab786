/* tests/test_tier_redis_accounting.c - the redis:// tier's items, used and
 * capacity (tier.h: what the cache plans evictions with), against
 * redis-server processes this program starts on 127.0.0.1
 * (tests/fixtures/redis_fixture.h): the cost of a value split into parts,
 * values expired by ttl= under capacity=, a server full only when used says
 * so, and two PUTs replacing one key at once. Exits 77 when redis-server is
 * not on PATH. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvtier.h"
#include "redis_fixture.h"
#include "tier_test_util.h"

/* Static, never on the stack: the fixture keeps pointers to every server it
 * started (rfx_all) and reads them again at exit. */
static rfx_server srv; /* shared by the tests that need nothing special */
static rfx_server aux; /* one test's own server, stopped by that test */

static kvt_key key_of(uint32_t space, uint32_t id) {
  kvt_key k;
  memset(&k, 0x5D, sizeof(k));
  memcpy(k.bytes, &space, 4);
  memcpy(k.bytes + 8, &id, 4);
  return k;
}

static kvt_ctx *ctx_new(void) {
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), 0);
  return ctx;
}

static kvt_tier *tier_open(kvt_ctx *ctx, const char *fmt, ...) {
  char spec[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(spec, sizeof(spec), fmt, ap);
  va_end(ap);
  kvt_tier *t = NULL;
  const int rc = kvt_tier_open(ctx, spec, &t);
  if (rc)
    fail_msg("open %s: %s: %s", spec, kvt_err_name(rc),
             kvt_ctx_last_error(ctx));
  return t;
}

static kvt_tier_stats stats_of(kvt_tier *t) {
  kvt_tier_stats st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  assert_int_equal(kvt_tier_stats_get(t, &st), 0);
  return st;
}

static void start_server(rfx_server *s, const char *const *args, int nargs) {
  memset(s, 0, sizeof(*s));
  for (int i = 0; i < nargs; i++)
    s->args[s->nargs++] = args[i];
  assert_int_equal(rfx_start(s), 0);
}

/* tier.h: item_overhead + len rounded to granule is "what one value of len
 * bytes costs in `used`" (the cache plans evictions with it). */
static void test_used_matches_item_overhead_for_split_values(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t =
      tier_open(ctx, "redis://127.0.0.1:%d?ns=rv-cost&part=1KiB", srv.port);
  uint8_t val[3000];
  fill(val, sizeof(val), 15);
  const kvt_key k = key_of(6, 1);
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  const kvt_tier_stats st = stats_of(t);
  assert_int_equal(kvt_tier_del(t, &k), 0);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  const uint64_t g = st.granule ? st.granule : 1;
  assert_int_equal(st.used, st.item_overhead + (sizeof(val) + g - 1) / g * g);
}

/* ttl= and capacity= together: values that expired keep counting in `used`
 * forever, so the tier refuses every PUT once capacity was reached once,
 * with nothing stored. */
static void test_expired_ttl_values_do_not_hold_capacity_forever(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(
      ctx, "redis://127.0.0.1:%d?ns=rv-ttlcap&ttl=1&capacity=8KiB", srv.port);
  uint8_t val[6000], got[6000];
  fill(val, sizeof(val), 16);
  const kvt_key k1 = key_of(7, 1), k2 = key_of(7, 2);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(t, &k1, val, sizeof(val)), 0);
  rfx_sleep_ms(1300);
  assert_int_equal(kvt_tier_get(t, &k1, got, sizeof(got), &len),
                   KVT_ENOTFOUND); /* expired */
  const int rc = kvt_tier_put(t, &k2, val, sizeof(val));
  kvt_tier_del(t, &k2);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  if (rc != 0)
    fail_msg("PUT into an empty namespace (the only value expired): %s",
             kvt_err_name(rc));
}

/* Without capacity= the tier reports the server's maxmemory as capacity,
 * but `used` leaves out what Redis spends per key and on itself ("used:
 * bytes held now, the backend's allocation overhead included"), so the
 * server refuses PUTs while used + the next value's cost is far below
 * capacity: the cache, planning evictions on used and capacity, never
 * evicts in time. */
static void test_server_full_only_when_used_says_so(void **state) {
  (void)state;
  static const char *const args[] = {"--maxmemory", "3mb", "--maxmemory-policy",
                                     "noeviction"};
  start_server(&aux, args, 4);
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=rv-full", aux.port);
  uint8_t val[1024];
  fill(val, sizeof(val), 17);
  int rc = 0;
  uint32_t n = 0;
  for (; n < 20000 && rc == 0; n++) {
    const kvt_key k = key_of(11, n);
    rc = kvt_tier_put(t, &k, val, sizeof(val));
  }
  const kvt_tier_stats st = stats_of(t);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  rfx_stop(&aux);
  assert_int_equal(rc, -ENOSPC);
  const uint64_t next = st.item_overhead + sizeof(val);
  if (st.used + next <= st.capacity)
    fail_msg("-ENOSPC after %u values with used %llu + %llu <= capacity %llu",
             n - 1, (unsigned long long)st.used, (unsigned long long)next,
             (unsigned long long)st.capacity);
}

/* Two workers replacing one key at once: each PUT reads the old header
 * (GETRANGE), then writes; Redis reads 16 KiB of a client's commands per
 * turn, so both GETRANGEs run before either SET, both PUTs see the same old
 * value (or none) and both subtract it (or neither does). */
static void test_concurrent_replace_of_one_key_keeps_items_exact(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(
      ctx, "redis://127.0.0.1:%d?ns=rv-race&part=64KiB&conns=2&pipeline=1",
      srv.port);
  enum { N = 300000 };
  uint8_t *v = malloc(2 * N);
  fill(v, 2 * N, 18);
  const kvt_key k = key_of(8, 1);
  kvt_tier_stats st = {0};
  uint64_t len = 0, cost = 0;
  int round = 0;
  for (; round < 100; round++) {
    kvt_tier_op ops[2];
    kvt_tier_op_init(&ops[0], KVT_TIER_PUT, &k, v, N, 0);
    kvt_tier_op_init(&ops[1], KVT_TIER_PUT, &k, v + N, N - 1000, 1);
    kvt_tier_op *both[2] = {&ops[0], &ops[1]}, *done[2];
    assert_int_equal(kvt_tier_submit(t, both, 2), 2); /* one to each worker */
    for (int got = 0; got < 2;)
      got += kvt_tier_poll(t, done + got, (size_t)(2 - got), -1);
    assert_int_equal(ops[0].result, 0);
    assert_int_equal(ops[1].result, 0);
    st = stats_of(t);
    assert_int_equal(kvt_tier_query(t, &k, &len), 0);
    cost = st.item_overhead + len; /* tier.h: what one value costs in used */
    if (st.items != 1 || st.used != cost)
      break;
  }
  kvt_tier_del(t, &k);
  free(v);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  if (st.items != 1 || st.used != cost)
    fail_msg("round %d of two concurrent PUTs: one value of %llu bytes (cost "
             "%llu) held, but "
             "items %llu, used %llu",
             round, (unsigned long long)len, (unsigned long long)cost,
             (unsigned long long)st.items, (unsigned long long)st.used);
}

static int group_setup(void **state) {
  (void)state;
  memset(&srv, 0, sizeof(srv));
  return rfx_start(&srv) == 0 ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  rfx_stop(&srv);
  return 0;
}

int main(void) {
  if (!rfx_have_redis()) {
    printf("[  SKIP    ] redis-server is not on PATH\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_used_matches_item_overhead_for_split_values),
      cmocka_unit_test(test_expired_ttl_values_do_not_hold_capacity_forever),
      cmocka_unit_test(test_server_full_only_when_used_says_so),
      cmocka_unit_test(test_concurrent_replace_of_one_key_keeps_items_exact),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
