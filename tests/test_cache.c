/* tests/test_cache.c - the cache manager's API (kvtier/cache.h) on one
 * thread: put/get/query round trips, integrity refusals (foreign, bad,
 * short-written payloads), lookup, batched gets, restore plans, loans,
 * reservations, fault paths and config checks. Placement across tiers is in
 * test_cache_placement.c, restarts in test_cache_restart.c, the background
 * mover in test_cache_mover.c, forced interleavings in test_cache_races.c and
 * many threads in test_cache_threads.c. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cache_fixture.h"

static void test_cache_put_get_round_trip(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:1MiB", 0, &fx->fp);
  kvt_key keys[3];
  chain_keys(&fx->fp, 1, 3, keys);
  put_chain(c, keys, 0, 3, 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal(get_check(c, &keys[i]), 0);
  uint64_t len = 0;
  int tier = -1;
  assert_int_equal(kvt_cache_query(c, &keys[1], &len, &tier), 0);
  assert_int_equal(len, plen);
  assert_int_equal(tier, 0);
  kvt_cache_stats s = stats(c, 0);
  assert_int_equal(s.hits, 3);
  assert_int_equal(s.items, 3);
  assert_int_equal(s.puts, 3);
  assert_int_equal(s.used, 3 * pcost);
  kvt_key absent = {{0xAB}};
  uint8_t b[8];
  assert_int_equal(kvt_cache_get(c, &absent, b, sizeof(b), NULL, NULL), KVT_ENOTFOUND);
  assert_int_equal(stats(c, -1).misses, 1);
  kvt_cache_close(c);
}

static void test_cache_put_of_a_held_key_writes_nothing(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:1MiB", 0, &fx->fp);
  kvt_key keys[1];
  chain_keys(&fx->fp, 2, 1, keys);
  put_chain(c, keys, 0, 1, 0);
  put_chain(c, keys, 0, 1, 0);
  assert_int_equal(stats(c, 0).puts, 1);
  assert_int_equal(stats(c, -1).duplicates, 1);
  kvt_cache_close(c);
}

static void test_cache_refuses_foreign_and_bad_payloads(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:1MiB", 0, &fx->fp);
  kvt_key keys[2];
  chain_keys(&fx->fp, 3, 2, keys);
  uint64_t len;
  /* Another model's payload. */
  uint8_t *p = payload_of(fx->ctx, &fx->fp_other, &keys[0], CT_TOKENS, &len);
  assert_int_equal(kvt_cache_put(c, &keys[0], NULL, p, len), KVT_EFOREIGN);
  free(p);
  /* A payload put under a key it does not name. */
  p = payload_of(fx->ctx, &fx->fp, &keys[0], CT_TOKENS, &len);
  assert_int_equal(kvt_cache_put(c, &keys[1], NULL, p, len), KVT_EFOREIGN);
  /* A damaged header; a truncated payload. */
  p[40] ^= 1;
  assert_int_equal(kvt_cache_put(c, &keys[0], NULL, p, len), KVT_ECHECKSUM);
  p[40] ^= 1;
  assert_int_equal(kvt_cache_put(c, &keys[0], NULL, p, 100), KVT_ETRUNC);
  free(p);
  assert_int_equal(stats(c, -1).refused, 4);
  assert_int_equal(stats(c, 0).items, 0);
  assert_int_equal(kvt_cache_where(c, &keys[0]), 0);
  kvt_cache_close(c);
}

static void test_cache_get_refuses_a_foreign_payload_found_in_a_tier(void **state) {
  (void)state;
  char spec[512];
  snprintf(spec, sizeof(spec), "nvme:%s/foreign:1MiB", fx->dir);
  kvt_key keys[1];
  chain_keys(&fx->fp, 4, 1, keys);
  uint64_t len;
  /* Planted behind the cache's back: the other model's bytes under our key. */
  uint8_t *p = payload_of(fx->ctx, &fx->fp_other, &keys[0], CT_TOKENS, &len);
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open(fx->ctx, spec, &t), 0);
  assert_int_equal(kvt_tier_put(t, &keys[0], p, len), 0);
  kvt_tier_close(t);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  assert_int_equal(kvt_cache_where(c, &keys[0]), 1u); /* found at open */
  uint64_t got;
  assert_int_equal(kvt_cache_get(c, &keys[0], p, len, &got, NULL), KVT_EFOREIGN);
  assert_int_equal(kvt_cache_get(c, &keys[0], p, len, &got, NULL), KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_where(c, &keys[0]), 0);
  assert_int_equal(kvt_tier_query(kvt_cache_tier(c, 0), &keys[0], NULL), KVT_ENOTFOUND);
  assert_int_equal(stats(c, -1).refused, 1);
  kvt_cache_close(c);
  free(p);
}

/* A put the tier acknowledged but stored short (torn) is refused by the get
 * that finds it, removed, and a miss from then on. */
static void test_cache_get_refuses_a_short_written_payload(void **state) {
  (void)state;
  kvt_cache *c = open_cache("fault:op=put,nth=1,mode=short@dram:1MiB", 0, &fx->fp);
  kvt_key k = single_key(5500);
  assert_int_equal(put_one(c, &k, NULL, CT_TOKENS), 0);
  assert_int_equal(get_one(c, &k, NULL), KVT_ETRUNC);
  assert_int_equal(get_one(c, &k, NULL), KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_where(c, &k), 0);
  assert_int_equal(stats(c, -1).refused, 1);
  assert_int_equal(stats(c, 0).used, 0);
  assert_settled(c);
  assert_int_equal(put_one(c, &k, NULL, CT_TOKENS), 0); /* stored whole this time */
  assert_int_equal(get_one(c, &k, NULL), 0);
  kvt_cache_close(c);
}

static void test_cache_lookup_counts_leading_chunks(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:1MiB", 0, &fx->fp);
  kvt_key a[8];
  chain_keys(&fx->fp, 600, 8, a);
  put_chain(c, a, 0, 8, 0);
  uint32_t *tok = seq_tokens(600, 9);
  size_t cached = 1;
  /* 8 full chunks and half of a ninth: the partial chunk has no key. */
  assert_int_equal(kvt_cache_lookup(c, tok, 8 * CT_TOKENS + CT_TOKENS / 2, &cached), 0);
  assert_int_equal(cached, 8 * CT_TOKENS);
  assert_int_equal(kvt_cache_lookup(c, tok, 9 * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, 8 * CT_TOKENS);
  assert_int_equal(kvt_cache_lookup(c, tok, CT_TOKENS - 1, &cached), 0);
  assert_int_equal(cached, 0);
  size_t hits = 0;
  assert_int_equal(kvt_cache_lookup_keys(c, a, 8, &hits), 0);
  assert_int_equal(hits, 8);
  assert_int_equal(kvt_cache_del(c, &a[3]), 0);
  assert_int_equal(kvt_cache_del(c, &a[3]), KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_lookup(c, tok, 8 * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, 3 * CT_TOKENS);
  /* A different model's tokens hit nothing: its keys differ. */
  tok[0] ^= 1;
  assert_int_equal(kvt_cache_lookup(c, tok, 8 * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, 0);
  assert_int_equal(stats(c, -1).pinned, 0);
  free(tok);
  kvt_cache_close(c);
  /* Without a fingerprint the cache cannot make keys from tokens. */
  c = open_cache("dram:1MiB", 0, NULL);
  assert_int_equal(kvt_cache_lookup(c, (const uint32_t *)"abcd", 1, &cached), -EINVAL);
  kvt_cache_close(c);
}

static void test_cache_lookup_of_a_long_context_walks_batches(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:8MiB", 0, &fx->fp);
  enum { N = 200 }; /* more than one batch of 64 keys */
  kvt_key *a = malloc(N * sizeof(*a));
  chain_keys(&fx->fp, 700, N, a);
  put_chain(c, a, 0, N, 0);
  uint32_t *tok = seq_tokens(700, N);
  size_t cached;
  assert_int_equal(kvt_cache_lookup(c, tok, (size_t)N * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, (size_t)N * CT_TOKENS);
  assert_int_equal(kvt_cache_del(c, &a[130]), 0);
  assert_int_equal(kvt_cache_lookup(c, tok, (size_t)N * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, 130 * CT_TOKENS);
  free(tok);
  free(a);
  kvt_cache_close(c);
}

static void test_cache_forgets_a_payload_its_tier_lost(void **state) {
  (void)state;
  char spec[512], dir[300];
  snprintf(dir, sizeof(dir), "%s/lost", fx->dir);
  snprintf(spec, sizeof(spec), "nvme:%s:4MiB", dir);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key keys[1];
  chain_keys(&fx->fp, 1000, 1, keys);
  put_chain(c, keys, 0, 1, 0);
  /* Corrupt every payload file on disk: the tier checks, deletes, misses. */
  char cmd[700];
  snprintf(cmd, sizeof(cmd),
           "for f in $(find '%s' -type f); do printf 'X' | dd of=$f bs=1 seek=5000 "
           "conv=notrunc status=none; done",
           dir);
  assert_int_equal(system(cmd), 0);
  uint8_t *buf = malloc(plen);
  assert_int_equal(kvt_cache_get(c, &keys[0], buf, plen, NULL, NULL), KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_where(c, &keys[0]), 0);
  assert_int_equal(stats(c, 0).used, 0);
  free(buf);
  kvt_cache_close(c);
}

static void test_cache_get_into_a_small_buffer_says_how_much(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:1MiB", 0, &fx->fp);
  kvt_key keys[1];
  chain_keys(&fx->fp, 1100, 1, keys);
  put_chain(c, keys, 0, 1, 0);
  uint8_t small[64];
  uint64_t len = 0;
  int tier = -2;
  assert_int_equal(kvt_cache_get(c, &keys[0], small, sizeof(small), &len, &tier), KVT_ENOBUFS);
  assert_int_equal(len, plen);
  assert_int_equal(tier, 0);
  assert_int_equal(stats(c, -1).pinned, 0);
  get_check(c, &keys[0]);
  kvt_cache_close(c);
}

static void test_cache_fault_paths(void **state) {
  (void)state;
  /* Every put to the top tier fails: payloads land in the next one. */
  kvt_cache *c = open_cache("fault:op=put,mode=fail@dram:1MiB;dram:1MiB", 0, &fx->fp);
  kvt_key keys[2];
  chain_keys(&fx->fp, 1200, 2, keys);
  put_chain(c, keys, 0, 2, 0);
  assert_int_equal(kvt_cache_where(c, &keys[0]), 2u);
  assert_true(stats(c, 0).errors >= 2);
  get_check(c, &keys[0]); /* the promotion fails too; the get does not */
  kvt_cache_close(c);
  /* A tier that answers -ENOSPC: the put goes below. */
  c = open_cache("fault:op=put,mode=nospace@dram:1MiB;dram:1MiB", 0, &fx->fp);
  put_chain(c, keys, 0, 1, 0);
  assert_int_equal(kvt_cache_where(c, &keys[0]), 2u);
  kvt_cache_close(c);
  /* Failing gets are errors, not hits and not crashes. */
  c = open_cache("fault:op=get,mode=fail@dram:1MiB", 0, &fx->fp);
  put_chain(c, keys, 0, 1, 0);
  uint8_t *buf = malloc(plen);
  assert_int_equal(kvt_cache_get(c, &keys[0], buf, plen, NULL, NULL), -EIO);
  assert_int_equal(stats(c, 0).errors, 1);
  /* A corrupted read is refused and the payload dropped. */
  kvt_cache_close(c);
  c = open_cache("fault:op=get,mode=corrupt@dram:1MiB", KVT_CACHE_VERIFY, &fx->fp);
  put_chain(c, keys, 0, 1, 0);
  int r = kvt_cache_get(c, &keys[0], buf, plen, NULL, NULL);
  assert_true(r == KVT_ECHECKSUM || r == KVT_ECORRUPT || r == KVT_EFOREIGN);
  assert_int_equal(kvt_cache_where(c, &keys[0]), 0);
  free(buf);
  kvt_cache_close(c);
}

static void test_cache_payload_larger_than_every_tier(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:1KiB;dram:2KiB", 0, &fx->fp);
  kvt_key keys[1];
  chain_keys(&fx->fp, 1300, 1, keys);
  put_chain(c, keys, 0, 1, -ENOSPC);
  assert_int_equal(stats(c, -1).items, 0);
  kvt_cache_close(c);
}

static void test_cache_get_many_reads_a_chain_from_both_tiers(void **state) {
  (void)state;
  char d[64], spec[512];
  snprintf(spec, sizeof(spec), "%s;nvme:%s/many:4MiB", dram_for(d, sizeof(d), 4), fx->dir);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  enum { N = 12 };
  kvt_key a[N];
  chain_keys(&fx->fp, 1400, N, a);
  put_chain(c, a, 0, N, 0);
  kvt_cache_get_req req[N + 2];
  memset(req, 0, sizeof(req));
  for (int i = 0; i < N + 2; i++) {
    req[i].key = i < N ? a[i] : (kvt_key){{(uint8_t)(0xE0 + i)}};
    req[i].cap = (plen + 4095) / 4096 * 4096;
    req[i].buf = aligned_alloc(4096, req[i].cap);
  }
  req[N + 1].key = a[0];
  req[N + 1].cap = 16; /* too small */
  assert_int_equal(kvt_cache_get_many(c, req, N + 2, 5), 0);
  for (int i = 0; i < N; i++) {
    assert_int_equal(req[i].result, 0);
    assert_int_equal(req[i].tier, i < 4 ? 0 : 1);
    assert_int_equal(req[i].len, plen);
    uint64_t len;
    uint8_t *want = payload_of(fx->ctx, &fx->fp, &a[i], CT_TOKENS, &len);
    assert_memory_equal(req[i].buf, want, len);
    free(want);
  }
  assert_int_equal(req[N].result, KVT_ENOTFOUND);
  assert_int_equal(req[N].tier, -1);
  assert_int_equal(req[N + 1].result, KVT_ENOBUFS);
  assert_int_equal(req[N + 1].len, plen);
  assert_int_equal(stats(c, 0).hits, 4);
  assert_int_equal(stats(c, 1).hits, N - 4);
  assert_int_equal(stats(c, -1).misses, 1);
  assert_int_equal(stats(c, -1).pinned, 0);
  /* The tail stays below: promoting it would evict the head. */
  for (int i = 0; i < N; i++)
    assert_int_equal(kvt_cache_where(c, &a[i]), i < 4 ? 1u : 2u);
  for (int i = 0; i < N + 2; i++)
    free(req[i].buf);
  req[0].buf = NULL;
  req[0].cap = 8;
  assert_int_equal(kvt_cache_get_many(c, req, 1, 0), -EINVAL);
  assert_int_equal(kvt_cache_get_many(c, NULL, 0, 0), 0);
  kvt_cache_close(c);
}

static void test_cache_get_many_promotes_after_reading(void **state) {
  (void)state;
  char d[64], spec[512];
  snprintf(spec, sizeof(spec), "%s;nvme:%s/manyp:4MiB", dram_for(d, sizeof(d), 3), fx->dir);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key k[6];
  for (uint32_t i = 0; i < 6; i++) {
    chain_keys(&fx->fp, 1450 + i, 1, &k[i]);
    put_chain(c, &k[i], 0, 1, 0);
  }
  /* k[0..2] went down; read them back together. */
  kvt_cache_get_req req[3];
  memset(req, 0, sizeof(req));
  for (int i = 0; i < 3; i++) {
    req[i].key = k[i];
    req[i].cap = plen;
    req[i].buf = malloc(plen);
  }
  assert_int_equal(kvt_cache_get_many(c, req, 3, 0), 0);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(req[i].result, 0);
    assert_int_equal(req[i].tier, 1);
    assert_int_equal(kvt_cache_where(c, &k[i]), 1u);
    free(req[i].buf);
  }
  assert_int_equal(stats(c, 0).promotions, 3);
  kvt_cache_close(c);
}

/* kvt_cache_get_many returns when a refused key is asked for twice in a
 * batch (two sequences sharing a prefix).
 * The defect it guarded (found in review): kvt_cache_get_many() pins every
 * request before it finishes any. A refused payload is removed by
 * cache_get_end -> remove_all, which waits for every other pin on it to go,
 * and a second request for the same key holds such a pin in the same thread:
 * the call never returned. (Two threads batching the same keys in different
 * orders deadlocked the same way.) */
typedef struct many_job {
  kvt_cache *c;
  kvt_cache_get_req req[2];
  atomic_int done;
  int rc;
} many_job;

static void *many_main(void *arg) {
  many_job *j = arg;
  j->rc = kvt_cache_get_many(j->c, j->req, 2, 0);
  atomic_store(&j->done, 1);
  return NULL;
}

static int hung; /* a thread of the test never returned */

static int teardown_after_hang(void **state) {
  if (!hung)
    return ct_teardown(state);
  /* The hung thread may still use the cache and the context: leak both. */
  cache_fx_rmtree(fx->dir);
  fx = NULL;
  return 0;
}

static void test_cache_get_many_returns_with_a_refused_key_asked_twice(void **state) {
  (void)state;
  char spec[512];
  snprintf(spec, sizeof(spec), "nvme:%s/many:1MiB", fx->dir);
  kvt_key k = single_key(6900);
  uint64_t len;
  uint8_t *p = payload_of(fx->ctx, &fx->fp_other, &k, CT_TOKENS, &len);
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open(fx->ctx, spec, &t), 0);
  assert_int_equal(kvt_tier_put(t, &k, p, len), 0); /* another model's bytes under our key */
  kvt_tier_close(t);
  many_job *j = calloc(1, sizeof(*j));
  j->c = open_cache(spec, 0, &fx->fp);
  for (int i = 0; i < 2; i++) {
    j->req[i].key = k;
    j->req[i].buf = malloc(len);
    j->req[i].cap = len;
  }
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, many_main, j), 0);
  for (int i = 0; i < 300 && !atomic_load(&j->done); i++)
    sleep_ms(10);
  if (!atomic_load(&j->done)) {
    hung = 1;
    pthread_detach(th);
    free(p);
    fail_msg("kvt_cache_get_many still waiting after 3 s: it waits for its own pin");
  }
  pthread_join(th, NULL);
  assert_int_equal(j->rc, 0);
  assert_int_equal(j->req[0].result, KVT_EFOREIGN);
  assert_int_equal(kvt_cache_where(j->c, &k), 0);
  kvt_cache_close(j->c);
  free(j->req[0].buf);
  free(j->req[1].buf);
  free(j);
  free(p);
}

static void test_cache_plan_restore_uses_the_bandwidth_model(void **state) {
  (void)state;
  char d[64], spec[512];
  snprintf(spec, sizeof(spec), "%s;nvme:%s/plan:4MiB", dram_for(d, sizeof(d), 3), fx->dir);
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = spec;
  cfg.fingerprint = &fx->fp;
  cfg.chunk_tokens = CT_TOKENS;
  cfg.links = "pcie5-x16;2.5"; /* a preset, then GB/s */
  kvt_cache *c;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), 0);
  kvt_key a[5];
  chain_keys(&fx->fp, 1700, 5, a);
  put_chain(c, a, 0, 5, 0); /* 3 in dram, 2 on nvme */
  uint32_t *tok = seq_tokens(1700, 6);
  kvt_model_arch m;
  assert_int_equal(kvt_model_preset("llama-3.1-8b", &m), 0);
  kvt_cache_plan p;
  memset(&p, 0, sizeof(p));
  p.struct_size = sizeof(p);
  assert_int_equal(kvt_cache_plan_restore(c, tok, 6 * CT_TOKENS, &m, 0, 0, &p), 0);
  assert_int_equal(p.cached_tokens, 5 * CT_TOKENS);
  assert_int_equal(p.tier_bytes[0], 3 * plen);
  assert_int_equal(p.tier_bytes[1], 2 * plen);
  assert_true(p.link_GBps[0] == 64.0 && p.link_GBps[1] == 2.5);
  const double want = kvt_model_restore_seconds(3.0 * (double)plen, 64e9, 1) +
                      kvt_model_restore_seconds(2.0 * (double)plen, 2.5e9, 1);
  assert_true(p.restore_s > want * 0.999999 && p.restore_s < want * 1.000001);
  const double rc = kvt_model_prefill_seconds(&m, 5.0 * CT_TOKENS, 0, 0);
  assert_true(p.recompute_s == rc);
  assert_int_equal(p.restore_pays, p.restore_s < rc);
  /* Nothing was touched: the plan is a query. */
  assert_int_equal(stats(c, -1).lookups, 0);
  assert_int_equal(kvt_cache_plan_restore(c, tok, 6 * CT_TOKENS, NULL, 0, 0, &p), 0);
  assert_true(p.recompute_s == 0 && !p.restore_pays);
  free(tok);
  kvt_cache_close(c);
  cfg.links = "pcie5-x16;warp-drive";
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(fx->ctx), "warp-drive"));
  cfg.links = "1;2;3";
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL);
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
  put_expect(c, &x, NULL, 0);
  put_expect(c, &y, NULL, 0);
  uint32_t *tok = seq_tokens(2800, 1);
  kvt_cache_plan plan;
  memset(&plan, 0, sizeof(plan));
  plan.struct_size = sizeof(plan);
  assert_int_equal(kvt_cache_plan_restore(c, tok, CT_TOKENS, NULL, 0, 0, &plan), 0);
  assert_int_equal(plan.cached_tokens, CT_TOKENS);
  assert_true(plan.tier_bytes[0] > 0);
  assert_int_equal(plan.recompute_s, 0.0);
  assert_int_equal(plan.restore_pays, 0);
  put_expect(c, &z, NULL, 0);
  assert_int_equal(kvt_cache_query(c, &x, NULL, NULL), KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_query(c, &y, NULL, NULL), 0);
  free(tok);
  kvt_cache_close(c);
}

static void test_cache_borrow_lends_from_memory_tiers_only(void **state) {
  (void)state;
  char d[64], spec[512];
  snprintf(spec, sizeof(spec), "%s;nvme:%s/loan:4MiB", dram_for(d, sizeof(d), 2), fx->dir);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key k[3];
  for (uint32_t i = 0; i < 3; i++) {
    chain_keys(&fx->fp, 1800 + i, 1, &k[i]);
    put_chain(c, &k[i], 0, 1, 0);
  }
  /* k[0] went down to nvme: that tier cannot lend. */
  kvt_cache_loan loan;
  assert_int_equal(kvt_cache_borrow(c, &k[0], &loan), KVT_ENOTSUP);
  assert_int_equal(loan.tier, -1);
  /* k[2] is in dram: lent in place, the same bytes a get returns. */
  assert_int_equal(kvt_cache_borrow(c, &k[2], &loan), 0);
  assert_int_equal(loan.tier, 0);
  assert_int_equal(loan.len, plen);
  uint64_t len;
  uint8_t *want = payload_of(fx->ctx, &fx->fp, &k[2], CT_TOKENS, &len);
  assert_memory_equal(loan.data, want, len);
  assert_int_equal(stats(c, -1).pinned, 1);
  /* While lent it is not evicted: puts that need room take others. */
  kvt_key more[3];
  for (uint32_t i = 0; i < 3; i++) {
    chain_keys(&fx->fp, 1810 + i, 1, &more[i]);
    put_chain(c, &more[i], 0, 1, 0);
  }
  assert_int_equal(kvt_cache_where(c, &k[2]) & 1u, 1u);
  assert_memory_equal(loan.data, want, len);
  kvt_cache_return(c, &loan);
  kvt_cache_return(c, &loan); /* a second return is harmless */
  assert_int_equal(stats(c, -1).pinned, 0);
  kvt_key absent = {{0xEE}};
  assert_int_equal(kvt_cache_borrow(c, &absent, &loan), KVT_ENOTFOUND);
  free(want);
  kvt_cache_close(c);
}

static void test_cache_borrow_refuses_a_foreign_payload(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:1MiB", 0, &fx->fp);
  kvt_key k[1];
  chain_keys(&fx->fp, 1820, 1, k);
  uint64_t len;
  uint8_t *p = payload_of(fx->ctx, &fx->fp_other, &k[0], CT_TOKENS, &len);
  /* Planted behind the cache's back, then indexed by a put of good bytes
   * under the same key being replaced in the tier. */
  put_chain(c, k, 0, 1, 0);
  assert_int_equal(kvt_tier_put(kvt_cache_tier(c, 0), &k[0], p, len), 0);
  kvt_cache_loan loan;
  assert_int_equal(kvt_cache_borrow(c, &k[0], &loan), KVT_EFOREIGN);
  assert_int_equal(kvt_cache_where(c, &k[0]), 0);
  assert_int_equal(stats(c, -1).pinned, 0);
  free(p);
  kvt_cache_close(c);
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
  put_expect(c, &k[0], NULL, 0);
  uint64_t len;
  uint8_t *want = payload_of(fx->ctx, &fx->fp, &k[0], CT_TOKENS, &len);
  kvt_tier_loan loan;
  assert_int_equal(kvt_tier_borrow(kvt_cache_tier(c, 0), &k[0], &loan), 0);
  assert_int_equal(loan.len, len);
  put_expect(c, &k[1], NULL, 0);
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

static void test_cache_open_rejects_bad_configs(void **state) {
  (void)state;
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  kvt_cache *c = (kvt_cache *)&cfg;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL); /* no tiers */
  assert_ptr_equal(c, (kvt_cache *)&cfg);
  cfg.tiers = "dram:1MiB;;dram:1MiB";
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(fx->ctx), "empty"));
  cfg.tiers = "dram:1MiB;dram:1MiB;dram:1MiB;dram:1MiB;dram:1MiB";
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(fx->ctx), "more than"));
  cfg.tiers = "dram:1MiB;bogus:1";
  assert_int_not_equal(kvt_cache_open(fx->ctx, &cfg, &c), 0);
  cfg.tiers = "dram:1MiB";
  cfg.flags = 1u << 20;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL);
  assert_ptr_equal(c, (kvt_cache *)&cfg);
  /* A fault decorator's ';'-separated rules stay one tier. */
  cfg.flags = 0;
  cfg.tiers = "fault:op=get,nth=2,mode=fail;op=put,nth=9,mode=fail@dram:1MiB;dram:1MiB";
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), 0);
  assert_int_equal(kvt_cache_tier_count(c), 2);
  kvt_cache_close(c);
  kvt_cache_close(NULL);
}

/* Reserves key's payload (chained to prev), writes it in place, publishes. */
static int reserve_put(kvt_cache *c, const kvt_key *key, const kvt_key *prev,
                       const kvt_key *fp) {
  uint64_t len;
  uint8_t *p = payload_of(fx->ctx, fp, key, CT_TOKENS, &len);
  kvt_cache_reservation res;
  int r = kvt_cache_reserve(c, key, prev, len, &res);
  if (r == 0) {
    assert_int_equal(res.len, len);
    assert_int_equal(res.tier, 0);
    memcpy(res.data, p, len);
    r = kvt_cache_publish(c, &res);
    assert_null(res.data); /* cleared either way */
  }
  free(p);
  return r;
}

static void test_cache_reserve_then_publish_is_a_put_without_the_copy(void **state) {
  (void)state;
  char spec[512];
  snprintf(spec, sizeof(spec), "dram:1MiB;nvme:%s/res:4MiB", fx->dir);
  kvt_cache *c = open_cache(spec, KVT_CACHE_WRITE_THROUGH, &fx->fp);
  kvt_key k[3];
  chain_keys(&fx->fp, 2600, 3, k);
  /* Unpublished: gets miss and nothing is held. */
  uint64_t len;
  uint8_t *p = payload_of(fx->ctx, &fx->fp, &k[0], CT_TOKENS, &len);
  kvt_cache_reservation res;
  assert_int_equal(kvt_cache_reserve(c, &k[0], NULL, len, &res), 0);
  assert_int_equal(kvt_cache_query(c, &k[0], NULL, NULL), KVT_ENOTFOUND);
  assert_int_equal(get_one(c, &k[0], NULL), KVT_ENOTFOUND);
  memcpy(res.data, p, len);
  assert_int_equal(kvt_cache_publish(c, &res), 0);
  free(p);
  /* Published: in dram, written through to nvme, counted as a put. */
  assert_int_equal(get_check(c, &k[0]), 0);
  assert_int_equal(kvt_cache_where(c, &k[0]), 3u);
  assert_int_equal(stats(c, 0).puts, 1);
  assert_int_equal(stats(c, 0).used, pcost);
  /* Chained: the chain is a prefix for lookups. */
  assert_int_equal(reserve_put(c, &k[1], &k[0], &fx->fp), 0);
  assert_int_equal(reserve_put(c, &k[2], &k[1], &fx->fp), 0);
  size_t hits = 0;
  assert_int_equal(kvt_cache_lookup_keys(c, k, 3, &hits), 0);
  assert_int_equal(hits, 3);
  /* A held key: nothing reserved. */
  assert_int_equal(reserve_put(c, &k[1], &k[0], &fx->fp), -EEXIST);
  assert_int_equal(stats(c, -1).duplicates, 1);
  assert_settled(c);
  kvt_cache_close(c);
}

static void test_cache_reserve_refusals_give_the_room_back(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:1MiB", 0, &fx->fp);
  kvt_key k[2];
  chain_keys(&fx->fp, 2610, 2, k);
  /* Another model's payload written into the block: refused at publish. */
  assert_int_equal(reserve_put(c, &k[0], NULL, &fx->fp_other), KVT_EFOREIGN);
  assert_int_equal(stats(c, -1).refused, 1);
  /* Aborted: nothing stored. */
  kvt_cache_reservation res;
  assert_int_equal(kvt_cache_reserve(c, &k[1], NULL, plen, &res), 0);
  kvt_cache_abort(c, &res);
  kvt_cache_abort(c, &res); /* cleared: a second abort does nothing */
  assert_int_equal(kvt_cache_publish(c, &res), -EINVAL);
  assert_int_equal(stats(c, 0).used, 0);
  assert_int_equal(stats(c, 0).items, 0);
  assert_int_equal(stats(c, 0).puts, 0);
  /* The keys can be put afterwards. */
  put_chain(c, k, 0, 2, 0);
  assert_int_equal(kvt_cache_reserve(c, &k[0], NULL, 0, &res), -EINVAL);
  assert_settled(c);
  kvt_cache_close(c);
  /* A hottest tier that cannot reserve (nvme): KVT_ENOTSUP, use a put. */
  char spec[512];
  snprintf(spec, sizeof(spec), "nvme:%s/nores:4MiB", fx->dir);
  c = open_cache(spec, 0, &fx->fp);
  assert_int_equal(kvt_cache_reserve(c, &k[0], NULL, plen, &res), KVT_ENOTSUP);
  assert_int_equal(res.tier, -1);
  put_chain(c, k, 0, 1, 0);
  kvt_cache_close(c);
}

/* A reservation makes room as a put does: never at the cost of its own
 * prefix, so a chain longer than the tier keeps its head. */
static void test_cache_reserve_keeps_the_prefix_of_its_chain(void **state) {
  (void)state;
  char d[64];
  kvt_cache *c = open_cache(dram_for(d, sizeof(d), 2), 0, &fx->fp);
  kvt_key k[3];
  chain_keys(&fx->fp, 2620, 3, k);
  assert_int_equal(reserve_put(c, &k[0], NULL, &fx->fp), 0);
  assert_int_equal(reserve_put(c, &k[1], &k[0], &fx->fp), 0);
  assert_int_equal(reserve_put(c, &k[2], &k[1], &fx->fp), -ENOSPC);
  size_t hits = 0;
  assert_int_equal(kvt_cache_lookup_keys(c, k, 3, &hits), 0);
  assert_int_equal(hits, 2);
  assert_settled(c);
  kvt_cache_close(c);
}

/* A hottest tier that cannot reserve (a decorator over dram says
 * KVT_ENOTSUP only when asked) is found out before any room is made: a
 * reservation that does not happen costs nobody their place. */
static void test_cache_reserve_refused_by_a_decorator_evicts_nothing(void **state) {
  (void)state;
  char d[64], spec[128];
  snprintf(spec, sizeof(spec), "trace@%s", dram_for(d, sizeof(d), 2));
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key a = single_key(2700), b = single_key(2701), x = single_key(2702);
  put_expect(c, &a, NULL, 0);
  put_expect(c, &b, NULL, 0);
  kvt_cache_reservation res;
  assert_int_equal(kvt_cache_reserve(c, &x, NULL, plen, &res), KVT_ENOTSUP);
  assert_int_equal(stats(c, 0).evictions, 0);
  assert_int_equal(stats(c, 0).errors, 0);
  assert_int_equal(kvt_cache_query(c, &a, NULL, NULL), 0);
  assert_int_equal(kvt_cache_query(c, &b, NULL, NULL), 0);
  assert_int_equal(stats(c, 0).used, 2 * pcost);
  assert_settled(c);
  kvt_cache_close(c);
}

/* While a chunk's reservation is out, its parent is the head of a chain
 * that lives on in this tier: another put evicts something else, so the
 * chunk, once published, is reachable by lookups. */
static void test_cache_eviction_keeps_the_parent_of_a_reservation(void **state) {
  (void)state;
  char d[64];
  kvt_cache *c = open_cache(dram_for(d, sizeof(d), 3), 0, &fx->fp);
  kvt_key k[2];
  chain_keys(&fx->fp, 2710, 2, k);
  kvt_key x = single_key(2711), y = single_key(2712);
  put_expect(c, &k[0], NULL, 0);
  uint64_t len;
  uint8_t *p = payload_of(fx->ctx, &fx->fp, &k[1], CT_TOKENS, &len);
  kvt_cache_reservation res;
  assert_int_equal(kvt_cache_reserve(c, &k[1], &k[0], len, &res), 0);
  put_expect(c, &x, NULL, 0);
  put_expect(c, &y, NULL, 0); /* the tier is full: one of k[0], x goes */
  memcpy(res.data, p, len);
  assert_int_equal(kvt_cache_publish(c, &res), 0);
  free(p);
  assert_int_equal(kvt_cache_query(c, &k[0], NULL, NULL), 0);
  size_t hits = 0;
  assert_int_equal(kvt_cache_lookup_keys(c, k, 2, &hits), 0);
  assert_int_equal(hits, 2);
  assert_settled(c);
  kvt_cache_close(c);
}

/* A reservation chained to another unpublished one that is aborted: the
 * child publishes on its own, the parent can be put again and the chain
 * is whole for lookups. */
static void test_cache_reserve_behind_an_aborted_reservation(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:1MiB", 0, &fx->fp);
  kvt_key k[2];
  chain_keys(&fx->fp, 2720, 2, k);
  kvt_cache_reservation ra, rb;
  assert_int_equal(kvt_cache_reserve(c, &k[0], NULL, plen, &ra), 0);
  uint64_t len;
  uint8_t *p = payload_of(fx->ctx, &fx->fp, &k[1], CT_TOKENS, &len);
  assert_int_equal(kvt_cache_reserve(c, &k[1], &k[0], len, &rb), 0);
  kvt_cache_abort(c, &ra);
  assert_int_equal(stats(c, 0).used, pcost);
  memcpy(rb.data, p, len);
  assert_int_equal(kvt_cache_publish(c, &rb), 0);
  free(p);
  put_chain(c, k, 0, 1, 0);
  size_t hits = 0;
  assert_int_equal(kvt_cache_lookup_keys(c, k, 2, &hits), 0);
  assert_int_equal(hits, 2);
  assert_int_equal(stats(c, 0).items, 2);
  assert_int_equal(stats(c, 0).used, 2 * pcost);
  assert_settled(c);
  kvt_cache_close(c);
}

/* While reserved the key is invisible: delete, get, query and lookups miss;
 * larger than the tier: -ENOSPC with nothing left behind; a refused
 * publish under write-through leaves every tier's accounting as it was. */
static void test_cache_reserved_key_is_invisible_and_refusals_leave_nothing(void **state) {
  (void)state;
  char spec[512];
  snprintf(spec, sizeof(spec), "dram:1MiB;nvme:%s/resinv:4MiB", fx->dir);
  kvt_cache *c = open_cache(spec, KVT_CACHE_WRITE_THROUGH, &fx->fp);
  kvt_key k[1];
  chain_keys(&fx->fp, 2730, 1, k);
  kvt_cache_reservation res;
  assert_int_equal(kvt_cache_reserve(c, &k[0], NULL, (uint64_t)2 << 20, &res), -ENOSPC);
  assert_int_equal(res.tier, -1);
  assert_int_equal(stats(c, -1).pinned, 0);
  assert_int_equal(kvt_cache_reserve(c, &k[0], NULL, plen, &res), 0);
  assert_int_equal(kvt_cache_del(c, &k[0]), KVT_ENOTFOUND);
  assert_int_equal(get_one(c, &k[0], NULL), KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_where(c, &k[0]), 0);
  size_t hits = 1;
  assert_int_equal(kvt_cache_lookup_keys(c, k, 1, &hits), 0);
  assert_int_equal(hits, 0);
  memset(res.data, 0, plen); /* not a payload */
  assert_true(kvt_cache_publish(c, &res) != 0);
  for (int t = 0; t < 2; t++) {
    assert_int_equal(stats(c, t).used, 0);
    assert_int_equal(stats(c, t).items, 0);
    assert_int_equal(stats(c, t).puts, 0);
  }
  assert_int_equal(reserve_put(c, &k[0], NULL, &fx->fp), 0);
  assert_int_equal(kvt_cache_where(c, &k[0]), 3u);
  assert_settled(c);
  kvt_cache_close(c);
}

/* A write-through that fails leaves the published payload in dram. */
static void test_cache_publish_with_a_failing_write_through(void **state) {
  (void)state;
  char spec[512];
  snprintf(spec, sizeof(spec), "dram:1MiB;fault:op=put,mode=fail@nvme:%s/wtf:4MiB", fx->dir);
  kvt_cache *c = open_cache(spec, KVT_CACHE_WRITE_THROUGH, &fx->fp);
  kvt_key k[1];
  chain_keys(&fx->fp, 2740, 1, k);
  assert_int_equal(reserve_put(c, &k[0], NULL, &fx->fp), 0);
  assert_int_equal(kvt_cache_where(c, &k[0]), 1u);
  assert_int_equal(stats(c, 1).used, 0);
  assert_true(stats(c, 1).errors >= 1);
  assert_int_equal(get_check(c, &k[0]), 0);
  assert_settled(c);
  kvt_cache_close(c);
}

/* A cache closed with a reservation out frees everything (the header asks
 * callers not to; a binding's finalizer may still). */
static void test_cache_close_with_a_reservation_out_leaks_nothing(void **state) {
  (void)state;
  kvt_cache *c = open_cache("dram:1MiB", 0, &fx->fp);
  kvt_key k[2];
  chain_keys(&fx->fp, 2750, 2, k);
  put_chain(c, k, 0, 1, 0);
  kvt_cache_reservation res;
  assert_int_equal(kvt_cache_reserve(c, &k[1], &k[0], plen, &res), 0);
  kvt_cache_close(c); /* the fixture's teardown checks for leaks */
}

/* kvt_cache_open accepts a config of an older (shorter) struct_size.
 * The defect it guarded (found in review): kvt_cache_config gained headroom_pct
 * and links after its first version; config structs are only appended to
 * (STYLE.md), so a caller built against the shorter struct (struct_size ending
 * before headroom_pct) must still open, with the defaults for the fields it
 * does not have. */
static void test_cache_open_accepts_a_config_of_an_older_size(void **state) {
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
      cmocka_unit_test_setup_teardown(test_cache_put_get_round_trip, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_put_of_a_held_key_writes_nothing, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_refuses_foreign_and_bad_payloads, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(
          test_cache_get_refuses_a_foreign_payload_found_in_a_tier, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_refuses_a_short_written_payload, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_lookup_counts_leading_chunks, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_lookup_of_a_long_context_walks_batches, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_forgets_a_payload_its_tier_lost, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_into_a_small_buffer_says_how_much, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_fault_paths, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_payload_larger_than_every_tier, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_many_reads_a_chain_from_both_tiers, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_many_promotes_after_reading, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(
          test_cache_get_many_returns_with_a_refused_key_asked_twice, ct_setup, teardown_after_hang),
      cmocka_unit_test_setup_teardown(test_cache_plan_restore_uses_the_bandwidth_model, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_plan_restore_does_not_touch, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_borrow_lends_from_memory_tiers_only, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_borrow_refuses_a_foreign_payload, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_tier_loan_outlives_an_eviction, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(
          test_cache_reserve_then_publish_is_a_put_without_the_copy, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_reserve_refusals_give_the_room_back, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_reserve_keeps_the_prefix_of_its_chain, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_reserve_refused_by_a_decorator_evicts_nothing, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_eviction_keeps_the_parent_of_a_reservation, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_reserve_behind_an_aborted_reservation, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_reserved_key_is_invisible_and_refusals_leave_nothing, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_publish_with_a_failing_write_through, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_close_with_a_reservation_out_leaks_nothing, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_open_rejects_bad_configs, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_open_accepts_a_config_of_an_older_size, ct_setup,
                                      ct_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
