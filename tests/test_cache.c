/* tests/test_cache.c - the cache manager (kvtier/cache.h): placement across
 * tiers, demotion, promotion, prefix-aware eviction, lookup, integrity
 * refusals, write-through and restart, fault paths. Concurrency is in
 * test_cache_threads.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <time.h>

#define CACHE_TEST_FIXTURE
#include "cache_test_util.h"

/* "dram:N" holding n test payloads. */
static const char *dram_for(char *buf, size_t cap, int n) {
  snprintf(buf, cap, "dram:%llu", (unsigned long long)(pcost * (uint64_t)n));
  return buf;
}

/* Puts chunks [from, to) of a chain, chained to their parents. */
static void put_chain(kvt_cache *c, const kvt_key *keys, int from, int to, int want) {
  for (int i = from; i < to; i++) {
    uint64_t len;
    uint8_t *p = payload_of(fx->ctx, &fx->fp, &keys[i], CT_TOKENS, &len);
    assert_int_equal(kvt_cache_put(c, &keys[i], i ? &keys[i - 1] : NULL, p, len), want);
    free(p);
  }
}

/* Gets key and checks the bytes; returns the tier that served it. */
static int get_check(kvt_cache *c, const kvt_key *key) {
  uint64_t len, got = 0;
  uint8_t *want = payload_of(fx->ctx, &fx->fp, key, CT_TOKENS, &len);
  uint8_t *buf = malloc(len);
  int tier = -2;
  assert_int_equal(kvt_cache_get(c, key, buf, len, &got, &tier), 0);
  assert_int_equal(got, len);
  assert_memory_equal(buf, want, len);
  free(buf);
  free(want);
  return tier;
}

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

static void test_cache_demotes_coldest_to_the_lower_tier(void **state) {
  (void)state;
  char d[64], spec[512];
  snprintf(spec, sizeof(spec), "%s;nvme:%s/demote:4MiB", dram_for(d, sizeof(d), 4), fx->dir);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key keys[10];
  for (uint32_t i = 0; i < 10; i++)
    chain_keys(&fx->fp, 100 + i, 1, &keys[i]); /* ten unrelated first chunks */
  for (int i = 0; i < 10; i++)
    put_chain(c, &keys[i], 0, 1, 0);
  for (int i = 0; i < 10; i++)
    assert_int_equal(kvt_cache_where(c, &keys[i]), i < 6 ? 2u : 1u);
  kvt_cache_stats s0 = stats(c, 0), s1 = stats(c, 1);
  assert_int_equal(s0.demotions, 6);
  assert_int_equal(s0.items, 4);
  assert_true(s0.used <= s0.capacity);
  assert_int_equal(s1.puts, 6);
  assert_int_equal(s1.items, 6);
  assert_int_equal(s1.evictions + s0.evictions, 0);
  /* A hit below is promoted; the coldest in DRAM (keys[6]) goes down. */
  assert_int_equal(get_check(c, &keys[2]), 1);
  assert_int_equal(kvt_cache_where(c, &keys[2]), 1u);
  assert_int_equal(kvt_cache_where(c, &keys[6]), 2u);
  assert_int_equal(stats(c, 0).promotions, 1);
  assert_int_equal(stats(c, 1).hits, 1);
  assert_int_equal(stats(c, 0).misses, 1);
  assert_int_equal(get_check(c, &keys[2]), 0);
  for (int i = 0; i < 10; i++)
    get_check(c, &keys[i]);
  kvt_cache_close(c);
}

static void test_cache_no_promote_leaves_hits_below(void **state) {
  (void)state;
  char d[64], spec[128];
  snprintf(spec, sizeof(spec), "%s;dram:1MiB", dram_for(d, sizeof(d), 2));
  kvt_cache *c = open_cache(spec, KVT_CACHE_NO_PROMOTE, &fx->fp);
  kvt_key keys[3];
  for (uint32_t i = 0; i < 3; i++)
    chain_keys(&fx->fp, 200 + i, 1, &keys[i]);
  for (int i = 0; i < 3; i++)
    put_chain(c, &keys[i], 0, 1, 0);
  assert_int_equal(get_check(c, &keys[0]), 1);
  assert_int_equal(kvt_cache_where(c, &keys[0]), 2u);
  assert_int_equal(stats(c, 0).promotions, 0);
  kvt_cache_close(c);
}

static void test_cache_evicts_at_the_bottom_within_capacity(void **state) {
  (void)state;
  char d0[64], d1[64], spec[160];
  snprintf(spec, sizeof(spec), "%s;%s", dram_for(d0, sizeof(d0), 3), dram_for(d1, sizeof(d1), 5));
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key keys[20];
  for (uint32_t i = 0; i < 20; i++) {
    chain_keys(&fx->fp, 300 + i, 1, &keys[i]);
    put_chain(c, &keys[i], 0, 1, 0);
    for (int t = 0; t < 2; t++) {
      kvt_cache_stats s = stats(c, t);
      assert_true(s.used <= s.capacity);
    }
  }
  assert_int_equal(stats(c, 0).items, 3);
  assert_int_equal(stats(c, 1).items, 5);
  assert_int_equal(stats(c, 1).evictions, 12);
  for (int i = 0; i < 20; i++) /* the newest 8 are held: LRU */
    assert_int_equal(kvt_cache_where(c, &keys[i]) != 0, i >= 12);
  kvt_cache_close(c);
}

static void test_cache_keeps_the_head_of_a_chain_over_its_tail(void **state) {
  (void)state;
  char d[64];
  kvt_cache *c = open_cache(dram_for(d, sizeof(d), 5), 0, &fx->fp);
  kvt_key a[10], b[3];
  chain_keys(&fx->fp, 400, 10, a);
  chain_keys(&fx->fp, 401, 3, b);
  /* Room for 5: the rest of the chain would have to evict its own prefix. */
  put_chain(c, a, 0, 5, 0);
  put_chain(c, a, 5, 10, -ENOSPC);
  for (int i = 0; i < 10; i++)
    assert_int_equal(kvt_cache_where(c, &a[i]), i < 5 ? 1u : 0u);
  /* Another sequence evicts the first one's tail, not its head. */
  put_chain(c, b, 0, 3, 0);
  for (int i = 0; i < 5; i++)
    assert_int_equal(kvt_cache_where(c, &a[i]), i < 2 ? 1u : 0u);
  uint32_t *tok = seq_tokens(400, 10);
  size_t cached = 0;
  assert_int_equal(kvt_cache_lookup(c, tok, 10 * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, 2 * CT_TOKENS);
  free(tok);
  kvt_cache_close(c);
}

static void test_cache_puts_the_tail_of_a_chain_below_its_head(void **state) {
  (void)state;
  char d[64], spec[512];
  snprintf(spec, sizeof(spec), "%s;nvme:%s/tail:4MiB", dram_for(d, sizeof(d), 4), fx->dir);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key a[10];
  chain_keys(&fx->fp, 500, 10, a);
  put_chain(c, a, 0, 10, 0);
  for (int i = 0; i < 10; i++)
    assert_int_equal(kvt_cache_where(c, &a[i]), i < 4 ? 1u : 2u);
  /* Reading the chain in order leaves it where it is: promoting the tail
   * would evict the head. */
  for (int i = 0; i < 10; i++)
    assert_int_equal(get_check(c, &a[i]), i < 4 ? 0 : 1);
  for (int i = 0; i < 10; i++)
    assert_int_equal(kvt_cache_where(c, &a[i]), i < 4 ? 1u : 2u);
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

static void test_cache_restart_finds_payloads_and_relinks_chains(void **state) {
  (void)state;
  char spec[512];
  /* The nvme tier costs a 4 KiB header + 4 KiB-rounded payload per item:
   * room for exactly 5 of ours. */
  uint64_t item = 4096 + (plen + 4095) / 4096 * 4096;
  snprintf(spec, sizeof(spec), "nvme:%s/restart:%llu", fx->dir, (unsigned long long)(5 * item));
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key a[5], b[1];
  chain_keys(&fx->fp, 800, 5, a);
  chain_keys(&fx->fp, 801, 1, b);
  put_chain(c, a, 0, 5, 0);
  kvt_cache_close(c);

  c = open_cache(spec, 0, &fx->fp);
  assert_int_equal(stats(c, 0).items, 5);
  uint32_t *tok = seq_tokens(800, 5);
  size_t cached;
  assert_int_equal(kvt_cache_lookup(c, tok, 5 * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, 5 * CT_TOKENS);
  /* The lookup relinked the chain: a new payload evicts its tail. */
  put_chain(c, b, 0, 1, 0);
  for (int i = 0; i < 5; i++)
    assert_int_equal(kvt_cache_where(c, &a[i]), i < 4 ? 1u : 0u);
  for (int i = 0; i < 4; i++)
    get_check(c, &a[i]);
  free(tok);
  kvt_cache_close(c);
}

static void test_cache_write_through_keeps_a_persistent_copy(void **state) {
  (void)state;
  char d[64], spec[512];
  snprintf(spec, sizeof(spec), "%s;nvme:%s/wt:4MiB", dram_for(d, sizeof(d), 2), fx->dir);
  kvt_cache *c = open_cache(spec, KVT_CACHE_WRITE_THROUGH, &fx->fp);
  kvt_key keys[4];
  for (uint32_t i = 0; i < 4; i++) {
    chain_keys(&fx->fp, 900 + i, 1, &keys[i]);
    put_chain(c, &keys[i], 0, 1, 0);
  }
  assert_int_equal(kvt_cache_where(c, &keys[0]), 2u);
  assert_int_equal(kvt_cache_where(c, &keys[3]), 3u);
  kvt_cache_stats s1 = stats(c, 1);
  assert_int_equal(s1.puts, 4);            /* demotions wrote nothing more */
  assert_int_equal(stats(c, 0).demotions, 2);
  /* A promoted copy leaves the persistent one in place. */
  assert_int_equal(get_check(c, &keys[0]), 1);
  assert_int_equal(kvt_cache_where(c, &keys[0]), 3u);
  kvt_cache_close(c);
  c = open_cache(spec, KVT_CACHE_WRITE_THROUGH, &fx->fp);
  for (int i = 0; i < 4; i++)
    assert_int_equal(get_check(c, &keys[i]), 1);
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

static void test_cache_background_mover_keeps_headroom(void **state) {
  (void)state;
  char d[64], spec[160];
  snprintf(spec, sizeof(spec), "%s;dram:1MiB", dram_for(d, sizeof(d), 10));
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = spec;
  cfg.fingerprint = &fx->fp;
  cfg.chunk_tokens = CT_TOKENS;
  cfg.flags = KVT_CACHE_BACKGROUND;
  cfg.headroom_pct = 30;
  kvt_cache *c;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), 0);
  kvt_key k[12];
  for (uint32_t i = 0; i < 12; i++) {
    chain_keys(&fx->fp, 1600 + i, 1, &k[i]);
    put_chain(c, &k[i], 0, 1, 0);
  }
  /* The mover brings the top tier under 70% of 10 payloads: 7 or fewer. */
  kvt_cache_stats s0;
  for (int tries = 0; tries < 200; tries++) {
    s0 = stats(c, 0);
    /* Settled: under the mark, and no victim still on its way down (its
     * bytes leave `used` when taken, its item when moved). */
    if (s0.used <= s0.capacity - s0.capacity / 100 * 30 && stats(c, -1).pinned == 0) {
      s0 = stats(c, 0);
      break;
    }
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  assert_true(s0.used <= s0.capacity - s0.capacity / 100 * 30);
  assert_true(s0.items <= 7);
  assert_true(s0.demotions >= 5);
  for (int i = 0; i < 12; i++)
    get_check(c, &k[i]);
  kvt_cache_close(c);
  cfg.headroom_pct = 95;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cache_put_get_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_put_of_a_held_key_writes_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_refuses_foreign_and_bad_payloads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_refuses_a_foreign_payload_found_in_a_tier,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_demotes_coldest_to_the_lower_tier, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_no_promote_leaves_hits_below, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_evicts_at_the_bottom_within_capacity, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_keeps_the_head_of_a_chain_over_its_tail, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_puts_the_tail_of_a_chain_below_its_head, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_lookup_counts_leading_chunks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_lookup_of_a_long_context_walks_batches, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_restart_finds_payloads_and_relinks_chains, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_write_through_keeps_a_persistent_copy, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_forgets_a_payload_its_tier_lost, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_into_a_small_buffer_says_how_much, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_fault_paths, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_payload_larger_than_every_tier, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_many_reads_a_chain_from_both_tiers, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_many_promotes_after_reading, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_background_mover_keeps_headroom, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_plan_restore_uses_the_bandwidth_model, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_borrow_lends_from_memory_tiers_only, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_borrow_refuses_a_foreign_payload, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cache_open_rejects_bad_configs, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
