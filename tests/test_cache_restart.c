/* tests/test_cache_restart.c - a cache reopened over persistent (nvme)
 * tiers: the restart scan finds every payload and relinks chains, a
 * write-through copy survives, a put with prev after a restart links the
 * chain again, and a delete that failed in a tier is not reported done. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cache_fixture.h"

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

/* After a restart, a put with prev links the chain again.
 * The defect it guarded (found in review): cache.h: "Parents come from the prev
 * argument of kvt_cache_put()". After a restart a put of a held chunk with its
 * prev is a duplicate and links nothing, so the chain is ranked as unrelated
 * payloads and its head is evicted first, leaving a tail no lookup can reach.
 */
static void test_cache_put_with_prev_after_restart_relinks_the_chain(void **state) {
  (void)state;
  char spec[512];
  uint64_t item = 4096 + (plen + 4095) / 4096 * 4096; /* the nvme tier's cost: 5 fit */
  snprintf(spec, sizeof(spec), "nvme:%s/relink:%llu", fx->dir, (unsigned long long)(5 * item));
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key a[5];
  chain_keys(&fx->fp, 6400, 5, a);
  for (int i = 0; i < 5; i++)
    assert_int_equal(put_one(c, &a[i], i ? &a[i - 1] : NULL, CT_TOKENS), 0);
  kvt_cache_close(c);
  c = open_cache(spec, 0, &fx->fp);
  for (int i = 0; i < 5; i++) /* the engine puts the chain again, in order */
    assert_int_equal(put_one(c, &a[i], i ? &a[i - 1] : NULL, CT_TOKENS), 0);
  kvt_key b = single_key(6401);
  assert_int_equal(put_one(c, &b, NULL, CT_TOKENS), 0);
  uint32_t head = kvt_cache_where(c, &a[0]), tail = kvt_cache_where(c, &a[4]);
  kvt_cache_close(c);
  assert_int_equal(tail, 0);  /* the tail goes ... */
  assert_int_equal(head, 1u); /* ... not the head */
}

/* A delete that fails in a tier says so (or the payload is really gone).
 * The defect it guarded (found in review): kvt_cache_del returns 0 ("removed
 * from every tier") when the persistent tier failed to delete: the payload
 * comes back at the next open. */
static void test_cache_del_that_fails_in_a_tier_reports_the_failure(void **state) {
  (void)state;
  char spec[600], plain[512];
  snprintf(plain, sizeof(plain), "nvme:%s/delfail:1MiB", fx->dir);
  snprintf(spec, sizeof(spec), "fault:op=del,mode=fail@%s", plain);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key k = single_key(6600);
  assert_int_equal(put_one(c, &k, NULL, CT_TOKENS), 0);
  int r = kvt_cache_del(c, &k);
  kvt_cache_close(c);
  c = open_cache(plain, 0, &fx->fp);
  uint32_t where = kvt_cache_where(c, &k);
  kvt_cache_close(c);
  /* Either the delete says it failed, or it really removed the payload. */
  assert_true(r != 0 || where == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_cache_restart_finds_payloads_and_relinks_chains, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_write_through_keeps_a_persistent_copy, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(
          test_cache_put_with_prev_after_restart_relinks_the_chain, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(
          test_cache_del_that_fails_in_a_tier_reports_the_failure, ct_setup, ct_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
