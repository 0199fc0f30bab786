/* tests/test_cache_placement.c - where the cache (kvtier/cache.h) puts
 * payloads: demotion of the coldest, promotion, eviction at the bottom,
 * prefix-aware ranking (a chain's head over its tail, never a payload at the
 * cost of its own prefix), and the accounting of each tier against the
 * tier's own stats. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cache_fixture.h"

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

/* A demotion that reads a short copy does not carry it down: the payload is
 * dropped (an error), never moved as if whole. */
static void test_cache_demotion_drops_a_short_copy(void **state) {
  (void)state;
  char spec[160];
  snprintf(spec, sizeof(spec), "fault:op=put,nth=1,mode=short@dram:%llu;dram:1MiB",
           (unsigned long long)pcost);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key k0 = single_key(5600), k1 = single_key(5601);
  assert_int_equal(put_one(c, &k0, NULL, CT_TOKENS), 0); /* stored short */
  assert_int_equal(put_one(c, &k1, NULL, CT_TOKENS), 0); /* pushes k0 out */
  assert_int_equal(kvt_cache_where(c, &k0), 0);
  assert_int_equal(kvt_tier_query(kvt_cache_tier(c, 1), &k0, NULL), KVT_ENOTFOUND);
  assert_true(stats(c, 0).errors >= 1);
  assert_int_equal(get_one(c, &k1, NULL), 0);
  assert_settled(c);
  kvt_cache_close(c);
}

/* The cache counts a tier's used bytes as the tier does.
 * The defect it guarded (found in review): cache_internal.h: used is "as the
 * tier counts them (cache_cost)", from the item_overhead and granule the tier
 * reports. Neither the dram nor the nvme tier reports them, so the cache counts
 * len alone. */
static void test_cache_used_matches_the_tiers_own_used(void **state) {
  (void)state;
  char spec[512];
  snprintf(spec, sizeof(spec), "dram:1MiB;nvme:%s/used:4MiB", fx->dir);
  kvt_cache *c = open_cache(spec, KVT_CACHE_WRITE_THROUGH, &fx->fp);
  kvt_key k = single_key(6000);
  assert_int_equal(put_one(c, &k, NULL, CT_TOKENS - 1), 0); /* a length off the granules */
  assert_int_equal(kvt_cache_where(c, &k), 3u);
  uint64_t used[2], tier_used[2];
  for (int t = 0; t < 2; t++) {
    assert_int_equal(stats(c, t).items, tier_stats(c, t).items);
    used[t] = stats(c, t).used;
    tier_used[t] = tier_stats(c, t).used;
    if (used[t] != tier_used[t])
      print_error("tier %d: the cache counts %llu bytes used, the tier %llu\n", t,
                  (unsigned long long)used[t], (unsigned long long)tier_used[t]);
  }
  kvt_cache_close(c);
  assert_int_equal(used[0], tier_used[0]);
  assert_int_equal(used[1], tier_used[1]);
}

/* A demotion cascade never evicts the prefix of the payload being put.
 * The defect it guarded (found in review): cache.h: "a payload is never placed
 * at the cost of evicting its own prefix". The victim a put pushes out of the
 * top tier is demoted, and that demotion evicts from the tier below without the
 * put's ancestors marked (mark_ancestors starts a new generation for the
 * victim): the put's own parent is dropped, and the chunk just stored cannot be
 * reached. */
static void test_cache_demotion_cascade_keeps_the_prefix_of_the_payload_put(void **state) {
  (void)state;
  char spec[128];
  snprintf(spec, sizeof(spec), "dram:%llu;dram:%llu", (unsigned long long)pcost,
           (unsigned long long)pcost);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key a[2], x = single_key(6801);
  chain_keys(&fx->fp, 6800, 2, a);
  assert_int_equal(put_one(c, &a[0], NULL, CT_TOKENS), 0);
  assert_int_equal(put_one(c, &x, NULL, CT_TOKENS), 0);
  assert_int_equal(kvt_cache_where(c, &a[0]), 2u); /* the head went down */
  assert_int_equal(put_one(c, &a[1], &a[0], CT_TOKENS), 0);
  uint32_t head = kvt_cache_where(c, &a[0]), tail = kvt_cache_where(c, &a[1]);
  size_t hits = 9;
  assert_int_equal(kvt_cache_lookup_keys(c, a, 2, &hits), 0);
  kvt_cache_close(c);
  if (tail)
    assert_int_not_equal(head, 0); /* stored at the cost of its own prefix */
  assert_true(hits == 2 || tail == 0);
}

/* A put refused to spare its own prefix evicts nothing.
 * The defect it guarded (found in review): A put refused at the cost of its own
 * prefix (-ENOSPC) has already taken and dropped the victims it chose before it
 * reached the prefix: a payload is lost for a put that stores nothing. */
static void test_cache_put_refused_for_its_prefix_evicts_nothing(void **state) {
  (void)state;
  char spec[128];
  snprintf(spec, sizeof(spec), "dram:%llu", (unsigned long long)(4 * pcost));
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key z = single_key(6500), w = single_key(6501), v = single_key(6502), a[2];
  chain_keys(&fx->fp, 6503, 2, a);
  /* Coldest first: z, a[0], w, v; the tier is full. */
  assert_int_equal(put_one(c, &z, NULL, CT_TOKENS), 0);
  assert_int_equal(put_one(c, &a[0], NULL, CT_TOKENS), 0);
  assert_int_equal(put_one(c, &w, NULL, CT_TOKENS), 0);
  assert_int_equal(put_one(c, &v, NULL, CT_TOKENS), 0);
  /* A chunk twice as long after a[0]: after z the next victim is its prefix. */
  assert_int_equal(put_one(c, &a[1], &a[0], 2 * CT_TOKENS), -ENOSPC);
  assert_int_equal(kvt_cache_where(c, &a[1]), 0);
  uint64_t evictions = stats(c, 0).evictions;
  uint32_t where_z = kvt_cache_where(c, &z);
  kvt_cache_close(c);
  assert_int_equal(evictions, 0);
  assert_int_equal(where_z, 1u);
}

/* An eviction whose delete fails keeps the cache's items equal to the tier's.
 * The defect it guarded (found in review): An eviction whose delete fails in
 * the tier: the cache forgets the payload but the tier keeps it, so the tier's
 * capacity is taken by a payload the cache can never evict again, and items
 * drift apart. */
static void test_cache_failed_eviction_leaves_no_ghost_in_the_tier(void **state) {
  (void)state;
  char spec[128];
  snprintf(spec, sizeof(spec), "fault:op=del,nth=1,mode=fail@dram:%llu",
           (unsigned long long)(2 * pcost));
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key k[4];
  for (int i = 0; i < 4; i++) {
    k[i] = single_key(6700 + (uint32_t)i);
    assert_int_equal(put_one(c, &k[i], NULL, CT_TOKENS), 0);
  }
  uint64_t items = stats(c, 0).items, tier_items = tier_stats(c, 0).items;
  kvt_cache_close(c);
  assert_int_equal(items, tier_items);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cache_demotes_coldest_to_the_lower_tier, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_no_promote_leaves_hits_below, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_evicts_at_the_bottom_within_capacity, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_keeps_the_head_of_a_chain_over_its_tail, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_puts_the_tail_of_a_chain_below_its_head, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_demotion_drops_a_short_copy, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_used_matches_the_tiers_own_used, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(
          test_cache_demotion_cascade_keeps_the_prefix_of_the_payload_put, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(
          test_cache_put_refused_for_its_prefix_evicts_nothing, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(
          test_cache_failed_eviction_leaves_no_ghost_in_the_tier, ct_setup, ct_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
