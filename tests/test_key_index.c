/* tests/test_key_index.c - the library's one key index (core/key_index.h),
 * used by the dram and nvme tiers, the cache and the server: operations
 * against a reference, probe lengths for structured keys, field widths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "key_index.h"
#include "kvtier.h"

static kvt_ctx *ctx;

static int setup(void **state) {
  (void)state;
  return kvt_ctx_create(NULL, &ctx);
}

static int teardown(void **state) {
  (void)state;
  kvt_ctx_destroy(ctx);
  return 0;
}

static kvt_key key2(uint64_t lo, uint64_t hi) {
  kvt_key k;
  kvt_st64(k.bytes, lo);
  kvt_st64(k.bytes + 8, hi);
  return k;
}

static void put(kvt_index *ix, const kvt_key *k, uint64_t len) {
  assert_int_equal(kvt_index_reserve(ix, ix->items + 1), 0);
  int fresh;
  kvt_index_entry *e = kvt_index_upsert(ix, k, &fresh);
  assert_non_null(e);
  e->len = len;
}

/* The longest distance, in slots, of a live entry from where its search starts. */
static uint64_t max_probe(const kvt_index *ix) {
  uint64_t worst = 0;
  const uint64_t mask = ix->cap - 1;
  for (uint64_t i = 0; i < ix->cap; i++)
    if (ix->slots[i].live) {
      const uint64_t d = (i - (kvt_index_hash(&ix->slots[i].key) & mask)) & mask;
      worst = d > worst ? d : worst;
    }
  return worst;
}

/* Random upserts and removals over a small key space, checked after every
 * step against a plain array: finds, the item count and the snapshot. */
static void test_key_index_agrees_with_a_reference_under_churn(void **state) {
  (void)state;
  enum { KEYS = 512, STEPS = 20000 };
  static uint64_t ref[KEYS]; /* len + 1; 0: absent */
  memset(ref, 0, sizeof(ref));
  kvt_index ix;
  kvt_index_init(&ix, ctx);
  uint64_t x = 0x9E3779B97F4A7C15ull, items = 0;
  for (int s = 0; s < STEPS; s++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const unsigned i = (unsigned)(x % KEYS);
    const kvt_key k = key2(i, i % 7); /* structured on purpose */
    if ((x >> 32) % 3) {
      put(&ix, &k, x >> 40);
      items += ref[i] == 0;
      ref[i] = (x >> 40) + 1;
    } else if (ref[i]) {
      kvt_index_remove(&ix, kvt_index_find(&ix, &k));
      ref[i] = 0;
      items--;
    }
    const kvt_index_entry *e = kvt_index_find(&ix, &k);
    assert_int_equal(e != NULL, ref[i] != 0);
    if (e)
      assert_int_equal(e->len, ref[i] - 1);
    assert_int_equal(ix.items, items);
  }
  for (unsigned i = 0; i < KEYS; i++) {
    const kvt_key k = key2(i, i % 7);
    const kvt_index_entry *e = kvt_index_find(&ix, &k);
    assert_int_equal(e != NULL, ref[i] != 0);
  }
  kvt_index_item all[KEYS];
  assert_int_equal(kvt_index_snapshot(&ix, all, KEYS), items);
  kvt_index_free(&ix);
}

/* Callers of the tier and cache APIs choose their keys: a grid of two
 * counters, equal halves, one counter shifted. Each set must spread: a
 * search never walks far from where it starts. (A hash that folds the
 * halves linearly puts each of these sets into a handful of slots.) */
static void test_key_index_spreads_structured_keys(void **state) {
  (void)state;
  enum { N = 4096 };
  for (int set = 0; set < 4; set++) {
    kvt_index ix;
    kvt_index_init(&ix, ctx);
    for (uint64_t i = 0; i < N; i++) {
      kvt_key k;
      switch (set) {
      case 0:
        k = key2(i % 64, i / 64); /* grid */
        break;
      case 1:
        k = key2(i, i); /* equal halves */
        break;
      case 2:
        k = key2(i, i << 16);
        break;
      default:
        k = key2(i << 40, 0); /* high bytes only */
        break;
      }
      put(&ix, &k, i);
    }
    const uint64_t worst = max_probe(&ix);
    print_message("set %d: %d keys in %llu slots, longest probe %llu\n", set, N,
                  (unsigned long long)ix.cap, (unsigned long long)worst);
    assert_true(worst < 64);
    kvt_index_free(&ix);
  }
}

/* Entries hold any length and offset a tier can produce (a value longer
 * than 4 GiB, an offset past 2^34 in a slab sized to a large value). */
static void test_key_index_entries_keep_64_bit_lengths_and_offsets(void **state) {
  (void)state;
  kvt_index ix;
  kvt_index_init(&ix, ctx);
  const kvt_key k = key2(1, 2);
  put(&ix, &k, (1ull << 41) + 3);
  kvt_index_entry *e = kvt_index_find(&ix, &k);
  e->off = (1ull << 40) + 5;
  e->slab = UINT32_MAX - 1;
  e = kvt_index_find(&ix, &k);
  assert_int_equal(e->len, (1ull << 41) + 3);
  assert_int_equal(e->off, (1ull << 40) + 5);
  assert_int_equal(e->slab, UINT32_MAX - 1);
  kvt_index_free(&ix);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_key_index_agrees_with_a_reference_under_churn),
      cmocka_unit_test(test_key_index_spreads_structured_keys),
      cmocka_unit_test(test_key_index_entries_keep_64_bit_lengths_and_offsets),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
