/* tests/test_cache_review2.c - second review of the cache and tier code:
 * kvt_cache_get_many against deletes and the background mover, the mover's
 * handling of a lower tier that fails, loans (kvt_tier_borrow) held across a
 * replace, caller-owned operations and poll(timeout 0) on the nvme tier, and
 * the config's struct_size.
 * Tests named *_bug_* show a defect found in review and fail until it is
 * fixed; the others cover behaviour that was not tested before. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "cache_fixture.h"

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0)
    ;
}

static const char *dram_for(char *buf, size_t cap, int n) {
  snprintf(buf, cap, "dram:%llu", (unsigned long long)(pcost * (uint64_t)n));
  return buf;
}

static kvt_cache *open_bg(const char *tiers, uint32_t headroom) {
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = tiers;
  cfg.fingerprint = &fx->fp;
  cfg.chunk_tokens = CT_TOKENS;
  cfg.flags = KVT_CACHE_BACKGROUND;
  cfg.headroom_pct = headroom;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), 0);
  return c;
}

static void put_one(kvt_cache *c, const kvt_key *key, const kvt_key *prev, int want) {
  uint64_t len;
  uint8_t *p = payload_of(fx->ctx, &fx->fp, key, CT_TOKENS, &len);
  assert_int_equal(kvt_cache_put(c, key, prev, p, len), want);
  free(p);
}

/* Gets key and checks the bytes. */
static void get_check(kvt_cache *c, const kvt_key *key) {
  uint64_t len, got = 0;
  uint8_t *want = payload_of(fx->ctx, &fx->fp, key, CT_TOKENS, &len);
  uint8_t *buf = malloc(len);
  assert_int_equal(kvt_cache_get(c, key, buf, len, &got, NULL), 0);
  assert_int_equal(got, len);
  assert_memory_equal(buf, want, len);
  free(buf);
  free(want);
}

static void wait_unpinned(kvt_cache *c) {
  for (int i = 0; i < 500 && stats(c, -1).pinned; i++)
    sleep_ms(10);
  assert_int_equal(stats(c, -1).pinned, 0);
}

/* ---- the background mover ------------------------------------------------ */

/* The top tier holds 9 of its 10 payloads, more than its 70% mark, and the
 * tier below fails every write. Without KVT_CACHE_BACKGROUND all 9 stay; the
 * mover, finding no lower tier to take its victims, drops them: payloads the
 * top tier had room for are lost. */
static void test_cache_bug_mover_drops_payloads_the_lower_tier_refuses(void **state) {
  (void)state;
  char d[64], spec[200];
  snprintf(spec, sizeof(spec), "%s;fault:op=put,mode=fail@dram:1MiB", dram_for(d, sizeof(d), 10));
  kvt_cache *c = open_bg(spec, 30);
  kvt_key k[9];
  for (uint32_t i = 0; i < 9; i++) {
    chain_keys(&fx->fp, 2100 + i, 1, &k[i]);
    put_one(c, &k[i], NULL, 0);
  }
  sleep_ms(300); /* the mover runs within microseconds of the last put */
  wait_unpinned(c);
  const kvt_cache_stats s0 = stats(c, 0), all = stats(c, -1);
  int held = 0;
  for (int i = 0; i < 9; i++)
    held += kvt_cache_query(c, &k[i], NULL, NULL) == 0;
  kvt_cache_close(c); /* before asserting: the fixture checks for leaks */
  assert_int_equal(s0.evictions, 0);
  assert_int_equal(all.items, 9);
  assert_int_equal(held, 9);
}

/* The top tier cannot delete (its DEL fails). The mover copies its coldest
 * payload down, the delete above fails and the bytes stay counted, so the
 * tier is still over its mark and the same payload is picked again: the
 * thread spins forever, a failed delete and a warning per turn. */
static void test_cache_bug_mover_spins_when_the_upper_tier_cannot_delete(void **state) {
  (void)state;
  char d[64], spec[200];
  snprintf(spec, sizeof(spec), "fault:op=del,mode=fail@%s;dram:1MiB", dram_for(d, sizeof(d), 10));
  kvt_cache *c = open_bg(spec, 30);
  kvt_key k[9];
  for (uint32_t i = 0; i < 9; i++) {
    chain_keys(&fx->fp, 2200 + i, 1, &k[i]);
    put_one(c, &k[i], NULL, 0);
  }
  sleep_ms(300);
  const kvt_cache_stats s0 = stats(c, 0);
  /* A handful of failed deletes at most: one per payload over the mark. */
  kvt_cache_close(c); /* stops the mover; before asserting (leak check) */
  if (s0.errors > 16)
    print_error("the mover failed %llu deletes in 300 ms\n", (unsigned long long)s0.errors);
  assert_true(s0.errors <= 16);
}

/* ---- get_many against deletes and the mover -------------------------------- */

typedef struct race {
  kvt_cache *c;
  kvt_key *keys;
  uint8_t **payloads; /* made on the main thread: the context is not thread-safe */
  uint64_t len;
  int n;
  atomic_int stop;
  atomic_long gets_ok, gets_missing;
  atomic_long bad; /* unexpected results in the other thread (asserts belong to main) */
} race;

static void *deleter(void *arg) {
  race *r = arg;
  for (int round = 0; !atomic_load(&r->stop); round++) {
    const int i = round % r->n;
    const int d = kvt_cache_del(r->c, &r->keys[i]);
    if (d != 0 && d != KVT_ENOTFOUND)
      atomic_fetch_add(&r->bad, 1);
    const int pr =
        kvt_cache_put(r->c, &r->keys[i], i ? &r->keys[i - 1] : NULL, r->payloads[i], r->len);
    if (pr != 0 && pr != -ENOSPC)
      atomic_fetch_add(&r->bad, 1);
  }
  return NULL;
}

/* Batches read a chain (every key twice) while another thread deletes and
 * puts its chunks back and the mover keeps 40% of the top tier free: every
 * request is a correct hit or a miss, nothing stays pinned, and the
 * accounting matches the tiers'. */
static void test_cache_get_many_races_deletes_and_the_mover(void **state) {
  (void)state;
  enum { N = 12 };
  char d0[64], d1[64], spec[200];
  snprintf(spec, sizeof(spec), "%s;%s", dram_for(d0, sizeof(d0), 6), dram_for(d1, sizeof(d1), 20));
  kvt_cache *c = open_bg(spec, 40);
  kvt_key keys[N];
  chain_keys(&fx->fp, 2300, N, keys);
  for (int i = 0; i < N; i++)
    put_one(c, &keys[i], i ? &keys[i - 1] : NULL, 0);
  uint8_t *want[N];
  uint64_t len = 0;
  for (int i = 0; i < N; i++)
    want[i] = payload_of(fx->ctx, &fx->fp, &keys[i], CT_TOKENS, &len);
  race r = {.c = c, .keys = keys, .payloads = want, .len = len, .n = N};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, deleter, &r), 0);
  kvt_cache_get_req req[2 * N];
  uint8_t *bufs = malloc((size_t)2 * N * len);
  for (int round = 0; round < 300; round++) {
    for (int i = 0; i < 2 * N; i++) {
      memset(&req[i], 0, sizeof(req[i]));
      req[i].key = keys[i % N];
      req[i].buf = bufs + (size_t)i * len;
      req[i].cap = len;
    }
    assert_int_equal(kvt_cache_get_many(c, req, 2 * N, (uint32_t)(round % 5)), 0);
    for (int i = 0; i < 2 * N; i++) {
      if (req[i].result == 0) {
        assert_int_equal(req[i].len, len);
        assert_true(req[i].tier >= 0 && req[i].tier < 2);
        assert_memory_equal(req[i].buf, want[i % N], len);
        atomic_fetch_add(&r.gets_ok, 1);
      } else {
        assert_int_equal(req[i].result, KVT_ENOTFOUND);
        assert_int_equal(req[i].tier, -1);
        atomic_fetch_add(&r.gets_missing, 1);
      }
    }
  }
  atomic_store(&r.stop, 1);
  pthread_join(th, NULL);
  assert_int_equal(atomic_load(&r.bad), 0);
  assert_true(atomic_load(&r.gets_ok) > 0);
  /* The mover may still be finishing a round: wait for a quiet moment. */
  int agree = 0;
  kvt_cache_stats cs[2];
  kvt_tier_stats ts[2];
  for (int tries = 0; tries < 300 && !agree; tries++) {
    sleep_ms(10);
    agree = stats(c, -1).pinned == 0;
    for (int t = 0; t < 2; t++) {
      memset(&ts[t], 0, sizeof(ts[t]));
      ts[t].struct_size = sizeof(ts[t]);
      assert_int_equal(kvt_tier_stats_get(kvt_cache_tier(c, t), &ts[t]), 0);
      cs[t] = stats(c, t);
      agree = agree && cs[t].items == ts[t].items && cs[t].used == ts[t].used;
    }
  }
  for (int t = 0; t < 2 && !agree; t++)
    print_error("tier %d: cache says %llu items, %llu bytes; the tier %llu, %llu\n", t,
                (unsigned long long)cs[t].items, (unsigned long long)cs[t].used,
                (unsigned long long)ts[t].items, (unsigned long long)ts[t].used);
  assert_true(agree);
  free(bufs);
  for (int i = 0; i < N; i++)
    free(want[i]);
  kvt_cache_close(c);
}

typedef struct many_arg {
  kvt_cache *c;
  kvt_cache_get_req *req;
  size_t n;
  int rc;
} many_arg;

static void *many_main(void *arg) {
  many_arg *a = arg;
  a->rc = kvt_cache_get_many(a->c, a->req, a->n, 1);
  return NULL;
}

/* A delete of a key that a batch has pinned (its reads held open by 300 ms
 * delays) waits for the batch: the batch gets the bytes, the delete then
 * succeeds and the key is gone. */
static void test_cache_del_waits_for_get_many_reading_its_key(void **state) {
  (void)state;
  kvt_cache *c = open_cache("fault:op=get,mode=delay,ms=300@dram:1MiB", 0, &fx->fp);
  kvt_key keys[3];
  chain_keys(&fx->fp, 2400, 3, keys);
  for (int i = 0; i < 3; i++)
    put_one(c, &keys[i], i ? &keys[i - 1] : NULL, 0);
  uint64_t len;
  uint8_t *want = payload_of(fx->ctx, &fx->fp, &keys[1], CT_TOKENS, &len);
  uint8_t *buf = malloc(3 * len);
  kvt_cache_get_req req[3];
  memset(req, 0, sizeof(req));
  for (int i = 0; i < 3; i++) {
    req[i].key = keys[i];
    req[i].buf = buf + (size_t)i * len;
    req[i].cap = len;
  }
  many_arg a = {c, req, 3, -1};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, many_main, &a), 0);
  sleep_ms(100); /* the batch has pinned all three; its first read sleeps */
  assert_int_equal(kvt_cache_del(c, &keys[1]), 0);
  pthread_join(th, NULL);
  assert_int_equal(a.rc, 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal(req[i].result, 0);
  assert_memory_equal(req[1].buf, want, len);
  assert_int_equal(kvt_cache_query(c, &keys[1], NULL, NULL), KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_where(c, &keys[1]), 0);
  assert_int_equal(stats(c, -1).pinned, 0);
  assert_int_equal(stats(c, 0).items, 2);
  free(buf);
  free(want);
  kvt_cache_close(c);
}

/* Close while the mover is in the middle of a slow demotion (the lower
 * tier's PUT sleeps 300 ms): close waits for it and leaks nothing. */
static void test_cache_close_waits_for_the_mover_mid_demotion(void **state) {
  (void)state;
  char d[64], spec[200];
  snprintf(spec, sizeof(spec), "%s;fault:op=put,mode=delay,ms=300@dram:1MiB",
           dram_for(d, sizeof(d), 10));
  kvt_cache *c = open_bg(spec, 30);
  kvt_key k[9];
  for (uint32_t i = 0; i < 9; i++) {
    chain_keys(&fx->fp, 2600 + i, 1, &k[i]);
    put_one(c, &k[i], NULL, 0);
  }
  for (int i = 0; i < 100 && stats(c, -1).pinned == 0; i++)
    sleep_ms(5); /* until the mover has taken its victims */
  assert_true(stats(c, -1).pinned > 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  kvt_cache_close(c);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const long ms = (t1.tv_sec - t0.tv_sec) * 1000L + (t1.tv_nsec - t0.tv_nsec) / 1000000L;
  assert_true(ms < 2000); /* one round at most, not every victim of the tier */
}

/* A delete of a payload the mover is demoting (the lower PUT held open)
 * waits for the move and then removes both copies. */
static void test_cache_del_during_a_background_demotion(void **state) {
  (void)state;
  char d[64], spec[200];
  snprintf(spec, sizeof(spec), "%s;fault:op=put,mode=delay,ms=300@dram:1MiB",
           dram_for(d, sizeof(d), 10));
  kvt_cache *c = open_bg(spec, 30);
  kvt_key k[9];
  for (uint32_t i = 0; i < 9; i++) {
    chain_keys(&fx->fp, 2700 + i, 1, &k[i]);
    put_one(c, &k[i], NULL, 0);
  }
  for (int i = 0; i < 100 && stats(c, -1).pinned == 0; i++)
    sleep_ms(5);
  assert_true(stats(c, -1).pinned > 0);
  /* k[0] is the coldest: the mover's first victim. */
  assert_int_equal(kvt_cache_del(c, &k[0]), 0);
  assert_int_equal(kvt_cache_where(c, &k[0]), 0);
  uint64_t len;
  for (int t = 0; t < 2; t++)
    assert_int_equal(kvt_tier_query(kvt_cache_tier(c, t), &k[0], &len), KVT_ENOTFOUND);
  wait_unpinned(c);
  for (int i = 1; i < 9; i++)
    get_check(c, &k[i]);
  kvt_cache_close(c);
}

/* kvt_cache_plan_restore touches nothing: the payload it counted stays the
 * coldest and is the one evicted next. */
static void test_cache_plan_restore_does_not_touch(void **state) {
  (void)state;
  char d[64];
  kvt_cache *c = open_cache(dram_for(d, sizeof(d), 2), 0, &fx->fp);
  kvt_key x, y, z;
  chain_keys(&fx->fp, 2800, 1, &x);
  chain_keys(&fx->fp, 2801, 1, &y);
  chain_keys(&fx->fp, 2802, 1, &z);
  put_one(c, &x, NULL, 0);
  put_one(c, &y, NULL, 0);
  uint32_t *tok = seq_tokens(2800, 1);
  kvt_cache_plan plan;
  memset(&plan, 0, sizeof(plan));
  plan.struct_size = sizeof(plan);
  assert_int_equal(kvt_cache_plan_restore(c, tok, CT_TOKENS, NULL, 0, 0, &plan), 0);
  assert_int_equal(plan.cached_tokens, CT_TOKENS);
  assert_true(plan.tier_bytes[0] > 0);
  assert_int_equal(plan.recompute_s, 0.0);
  assert_int_equal(plan.restore_pays, 0);
  put_one(c, &z, NULL, 0);
  assert_int_equal(kvt_cache_query(c, &x, NULL, NULL), KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_query(c, &y, NULL, NULL), 0);
  free(tok);
  kvt_cache_close(c);
}

/* A persistent top tier found over its mark at open: the mover starts
 * demoting at once (before kvt_cache_open returns), every payload stays
 * readable and the top tier ends under its mark. */
static void test_cache_mover_works_on_a_tier_found_full_at_open(void **state) {
  (void)state;
  char spec[400];
  snprintf(spec, sizeof(spec), "nvme:%s:%llu;dram:1MiB", fx->dir,
           (unsigned long long)(10 * (4096 + (plen + 4095) / 4096 * 4096)));
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key k[9];
  for (uint32_t i = 0; i < 9; i++) {
    chain_keys(&fx->fp, 2900 + i, 1, &k[i]);
    put_one(c, &k[i], NULL, 0);
  }
  assert_int_equal(stats(c, 0).items, 9);
  kvt_cache_close(c);
  c = open_bg(spec, 30);
  kvt_cache_stats s0 = stats(c, 0);
  for (int i = 0; i < 300 && (s0.items > 7 || stats(c, -1).pinned); i++) {
    sleep_ms(10);
    s0 = stats(c, 0);
  }
  assert_true(s0.items <= 7);
  for (int i = 0; i < 9; i++)
    get_check(c, &k[i]);
  kvt_cache_close(c);
}

/* ---- loans ------------------------------------------------------------------ */

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

/* The cache's own dram tier lends a payload; the cache evicting it (a put
 * that needs the room) does not pull the bytes from under the loan. */
static void test_cache_tier_loan_outlives_an_eviction(void **state) {
  (void)state;
  char d[64];
  kvt_cache *c = open_cache(dram_for(d, sizeof(d), 2), 0, &fx->fp);
  kvt_key k[3];
  for (uint32_t i = 0; i < 3; i++)
    chain_keys(&fx->fp, 2500 + i, 1, &k[i]);
  put_one(c, &k[0], NULL, 0);
  uint64_t len;
  uint8_t *want = payload_of(fx->ctx, &fx->fp, &k[0], CT_TOKENS, &len);
  kvt_tier_loan loan;
  assert_int_equal(kvt_tier_borrow(kvt_cache_tier(c, 0), &k[0], &loan), 0);
  assert_int_equal(loan.len, len);
  put_one(c, &k[1], NULL, 0);
  /* k[0] is the coldest: evicted for k[2] (the tier's DEL only marks the
   * lent block dead; whether the PUT then finds room is the tier's say). */
  uint64_t l2;
  uint8_t *p2 = payload_of(fx->ctx, &fx->fp, &k[2], CT_TOKENS, &l2);
  const int pr = kvt_cache_put(c, &k[2], NULL, p2, l2);
  assert_true(pr == 0 || pr == -ENOSPC);
  free(p2);
  assert_int_equal(kvt_cache_query(c, &k[0], NULL, NULL), KVT_ENOTFOUND);
  assert_memory_equal(loan.data, want, len);
  kvt_tier_return(kvt_cache_tier(c, 0), &loan);
  free(want);
  if (pr == 0)
    get_check(c, &k[2]);
  wait_unpinned(c);
  kvt_cache_close(c);
}

/* ---- owned operations and poll on nvme ---------------------------------------- */

static kvt_tier *open_nvme(void) {
  char spec[400];
  snprintf(spec, sizeof(spec), "nvme:%s:64MiB", fx->dir);
  kvt_tier *t = NULL;
  const int r = kvt_tier_open(fx->ctx, spec, &t);
  if (r)
    print_error("open %s: %s (%s)\n", spec, kvt_strerror(r), kvt_ctx_last_error(fx->ctx));
  assert_int_equal(r, 0);
  return t;
}

/* kvt_tier_wait with timeouts 0 and 1 on nvme operations: -ETIMEDOUT until
 * done (each call drives the ring), the result once done and on every later
 * wait, and the bytes are right. */
static void test_tier_wait_timeouts_on_nvme(void **state) {
  (void)state;
  kvt_tier *t = open_nvme();
  enum { LEN = 1 << 20 };
  uint8_t *val = aligned_alloc(4096, LEN), *back = aligned_alloc(4096, LEN);
  for (size_t i = 0; i < LEN; i++)
    val[i] = (uint8_t)(i * 31u + 7u);
  kvt_key k = {{4, 4, 4}};
  kvt_tier_op put, get;
  kvt_tier_op_init(&put, KVT_TIER_PUT, &k, val, LEN, 1);
  kvt_tier_op *p = &put;
  assert_int_equal(kvt_tier_submit_owned(t, &p, 1), 1);
  int rc, spins = 0;
  while ((rc = kvt_tier_wait(t, &put, spins & 1)) == -ETIMEDOUT)
    assert_true(++spins < 1000000);
  assert_int_equal(rc, 0);
  assert_int_equal(kvt_tier_wait(t, &put, 0), 0); /* done stays done */
  kvt_tier_op_init(&get, KVT_TIER_GET, &k, back, LEN, 2);
  p = &get;
  assert_int_equal(kvt_tier_submit_owned(t, &p, 1), 1);
  kvt_tier_op *done[2];
  assert_int_equal(kvt_tier_poll(t, done, 2, 0), 0); /* never reaches poll */
  spins = 0;
  while ((rc = kvt_tier_wait(t, &get, 0)) == -ETIMEDOUT)
    assert_true(++spins < 10000000);
  assert_int_equal(rc, 0);
  assert_int_equal(get.out_len, LEN);
  assert_memory_equal(back, val, LEN);
  free(val);
  free(back);
  kvt_tier_close(t);
}

/* kvt_tier_poll with timeout 0 alone drives the nvme tier: a loop of
 * non-blocking polls collects a PUT and a GET without any blocking call. */
static void test_tier_poll_timeout_0_makes_progress_on_nvme(void **state) {
  (void)state;
  kvt_tier *t = open_nvme();
  uint8_t val[5000], back[5000];
  for (size_t i = 0; i < sizeof(val); i++)
    val[i] = (uint8_t)(i ^ 0x5a);
  kvt_key k = {{5, 5, 5}};
  kvt_tier_op put, get;
  kvt_tier_op_init(&put, KVT_TIER_PUT, &k, val, sizeof(val), 11);
  kvt_tier_op *p = &put, *done[2];
  assert_int_equal(kvt_tier_submit(t, &p, 1), 1);
  int got = 0;
  for (long spins = 0; got == 0; spins++) {
    assert_true(spins < 10000000);
    got = kvt_tier_poll(t, done, 2, 0);
  }
  assert_int_equal(got, 1);
  assert_ptr_equal(done[0], &put);
  assert_int_equal(put.result, 0);
  kvt_tier_op_init(&get, KVT_TIER_GET, &k, back, sizeof(back), 12);
  p = &get;
  assert_int_equal(kvt_tier_submit(t, &p, 1), 1);
  got = 0;
  for (long spins = 0; got == 0; spins++) {
    assert_true(spins < 10000000);
    got = kvt_tier_poll(t, done, 2, 0);
  }
  assert_int_equal(got, 1);
  assert_ptr_equal(done[0], &get);
  assert_int_equal(get.result, 0);
  assert_int_equal(get.out_len, sizeof(val));
  assert_memory_equal(back, val, sizeof(val));
  assert_int_equal(kvt_tier_poll(t, done, 2, 0), 0); /* nothing in flight */
  kvt_tier_close(t);
}

/* ---- ABI ---------------------------------------------------------------------- */

/* kvt_cache_config gained headroom_pct and links after its first version;
 * config structs are only appended to (STYLE.md), so a caller built against
 * the shorter struct (struct_size ending before headroom_pct) must still
 * open, with the defaults for the fields it does not have. */
static void test_cache_bug_open_refuses_a_config_of_the_older_size(void **state) {
  (void)state;
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.struct_size = offsetof(kvt_cache_config, headroom_pct);
  cfg.tiers = "dram:1MiB";
  cfg.fingerprint = &fx->fp;
  cfg.chunk_tokens = CT_TOKENS;
  kvt_cache *c = NULL;
  const int r = kvt_cache_open(fx->ctx, &cfg, &c);
  kvt_cache_close(c);
  assert_int_equal(r, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cache_bug_mover_drops_payloads_the_lower_tier_refuses,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_bug_mover_spins_when_the_upper_tier_cannot_delete,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_many_races_deletes_and_the_mover, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_del_waits_for_get_many_reading_its_key, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_close_waits_for_the_mover_mid_demotion, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_del_during_a_background_demotion, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_plan_restore_does_not_touch, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_mover_works_on_a_tier_found_full_at_open, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_tier_loan_survives_replace_and_delete_until_returned,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_tier_loan_outlives_an_eviction, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_tier_wait_timeouts_on_nvme, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_tier_poll_timeout_0_makes_progress_on_nvme, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_bug_open_refuses_a_config_of_the_older_size,
                                      ct_setup, ct_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
