/* tests/test_cache_threads.c - many engine threads on one cache: puts, gets,
 * lookups and deletes of shared and private chains across a hierarchy small
 * enough that demotions, promotions and evictions run all the time. Every
 * byte a get returns is checked. Run under TSan in CI (bootstrap.sh tsan). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <time.h>

#include "cache_test_util.h"

enum { THREADS = 8, SEQS = 6, CHAIN = 12, ROUNDS = 400 };

typedef struct shared {
  kvt_cache *c;
  kvt_key keys[SEQS][CHAIN];
  uint8_t *payload[SEQS][CHAIN];
  uint64_t len;
  atomic_long bad, gets_ok, puts_ok;
} shared;

static cache_fx *fx;

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void *worker(void *arg) {
  shared *sh = ((void **)arg)[0];
  uint64_t seed = (uint64_t)(uintptr_t)((void **)arg)[1] * 7919 + 1;
  uint8_t *buf = malloc(sh->len);
  uint32_t *tok = seq_tokens(0, CHAIN);
  for (int r = 0; r < ROUNDS; r++) {
    int s = (int)(rnd(&seed) % SEQS), op = (int)(rnd(&seed) % 10);
    int i = (int)(rnd(&seed) % CHAIN);
    if (op < 4) { /* put a prefix, in order */
      for (int j = 0; j <= i; j++) {
        int rc = kvt_cache_put(sh->c, &sh->keys[s][j], j ? &sh->keys[s][j - 1] : NULL,
                               sh->payload[s][j], sh->len);
        if (rc && rc != -ENOSPC)
          atomic_fetch_add(&sh->bad, 1);
        else if (!rc)
          atomic_fetch_add(&sh->puts_ok, 1);
      }
    } else if (op < 8) { /* look up, then get what the lookup found */
      size_t hits = 0;
      kvt_cache_lookup_keys(sh->c, sh->keys[s], CHAIN, &hits);
      for (size_t j = 0; j < hits; j++) {
        uint64_t got = 0;
        int rc = kvt_cache_get(sh->c, &sh->keys[s][j], buf, sh->len, &got, NULL);
        if (rc == 0 && (got != sh->len || memcmp(buf, sh->payload[s][j], sh->len)))
          atomic_fetch_add(&sh->bad, 1);
        else if (rc && rc != KVT_ENOTFOUND) /* evicted since the lookup: a miss */
          atomic_fetch_add(&sh->bad, 1);
        else if (!rc)
          atomic_fetch_add(&sh->gets_ok, 1);
      }
    } else if (op < 8 + 1 && (rnd(&seed) & 1)) { /* the same through get_many */
      kvt_cache_get_req req[CHAIN];
      uint8_t *bufs = malloc((size_t)CHAIN * sh->len);
      memset(req, 0, sizeof(req));
      for (int j = 0; j < CHAIN; j++) {
        req[j].key = sh->keys[s][j];
        req[j].buf = bufs + (size_t)j * sh->len;
        req[j].cap = sh->len;
      }
      if (kvt_cache_get_many(sh->c, req, CHAIN, 4))
        atomic_fetch_add(&sh->bad, 1);
      for (int j = 0; j < CHAIN; j++) {
        if (req[j].result == 0 && memcmp(req[j].buf, sh->payload[s][j], sh->len))
          atomic_fetch_add(&sh->bad, 1);
        else if (req[j].result && req[j].result != KVT_ENOTFOUND)
          atomic_fetch_add(&sh->bad, 1);
        else if (!req[j].result)
          atomic_fetch_add(&sh->gets_ok, 1);
      }
      free(bufs);
    } else if (op < 9) {
      int rc = kvt_cache_del(sh->c, &sh->keys[s][i]);
      if (rc && rc != KVT_ENOTFOUND)
        atomic_fetch_add(&sh->bad, 1);
    } else {
      size_t cached;
      chunk_tokens(1500 + (uint32_t)s, 0, tok);
      if (kvt_cache_lookup(sh->c, tok, CT_TOKENS, &cached))
        atomic_fetch_add(&sh->bad, 1);
    }
  }
  free(tok);
  free(buf);
  return NULL;
}

static void run_threads(const char *tiers, uint32_t flags) {
  shared *sh = calloc(1, sizeof(*sh));
  for (uint32_t s = 0; s < SEQS; s++) {
    chain_keys(&fx->fp, 1500 + s, CHAIN, sh->keys[s]);
    for (int j = 0; j < CHAIN; j++)
      sh->payload[s][j] = payload_of(fx->ctx, &fx->fp, &sh->keys[s][j], CT_TOKENS, &sh->len);
  }
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = tiers;
  cfg.fingerprint = &fx->fp;
  cfg.chunk_tokens = CT_TOKENS;
  cfg.flags = flags;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &sh->c), 0);
  pthread_t th[THREADS];
  void *args[THREADS][2];
  for (int t = 0; t < THREADS; t++) {
    args[t][0] = sh;
    args[t][1] = (void *)(uintptr_t)(t + 1);
    assert_int_equal(pthread_create(&th[t], NULL, worker, args[t]), 0);
  }
  for (int t = 0; t < THREADS; t++)
    pthread_join(th[t], NULL);
  assert_int_equal(atomic_load(&sh->bad), 0);
  assert_true(atomic_load(&sh->gets_ok) > 0);
  assert_true(atomic_load(&sh->puts_ok) > 0);
  kvt_cache_stats all;
  memset(&all, 0, sizeof(all));
  /* The background mover may still be at work: wait until nothing moves. */
  for (int tries = 0; tries < 500; tries++) {
    assert_int_equal(kvt_cache_stats_get(sh->c, -1, &all), 0);
    kvt_cache_stats s0;
    memset(&s0, 0, sizeof(s0));
    assert_int_equal(kvt_cache_stats_get(sh->c, 0, &s0), 0);
    if (all.pinned == 0 && (!(flags & KVT_CACHE_BACKGROUND) ||
                            s0.used <= s0.capacity - s0.capacity / 100 * 10))
      break;
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(all.pinned, 0);
  uint64_t items = 0;
  for (int t = 0; t < kvt_cache_tier_count(sh->c); t++) {
    kvt_cache_stats s;
    memset(&s, 0, sizeof(s));
    assert_int_equal(kvt_cache_stats_get(sh->c, t, &s), 0);
    assert_true(s.used <= s.capacity);
    items += s.items;
    /* The cache's view agrees with the tier's own. */
    kvt_tier_stats ts;
    memset(&ts, 0, sizeof(ts));
    assert_int_equal(kvt_tier_stats_get(kvt_cache_tier(sh->c, t), &ts), 0);
    assert_int_equal(ts.items, s.items);
  }
  assert_true(items >= all.items);
  /* Everything the index holds comes back intact. */
  uint8_t *buf = malloc(sh->len);
  for (int s = 0; s < SEQS; s++)
    for (int j = 0; j < CHAIN; j++) {
      if (!kvt_cache_where(sh->c, &sh->keys[s][j]))
        continue;
      assert_int_equal(kvt_cache_get(sh->c, &sh->keys[s][j], buf, sh->len, NULL, NULL), 0);
      assert_memory_equal(buf, sh->payload[s][j], sh->len);
    }
  free(buf);
  kvt_cache_close(sh->c);
  for (int s = 0; s < SEQS; s++)
    for (int j = 0; j < CHAIN; j++)
      free(sh->payload[s][j]);
  free(sh);
}

static void test_cache_threads_on_two_dram_tiers(void **state) {
  (void)state;
  /* About 10 and 20 of the 72 payloads. */
  run_threads("dram:48KiB;dram:96KiB", 0);
}

static void test_cache_threads_with_the_background_mover(void **state) {
  (void)state;
  run_threads("dram:48KiB;dram:96KiB", KVT_CACHE_BACKGROUND);
}

static void test_cache_threads_on_dram_and_nvme(void **state) {
  (void)state;
  char spec[512];
  snprintf(spec, sizeof(spec), "dram:48KiB;nvme:%s/threads:512KiB", fx->dir);
  run_threads(spec, 0);
}

static int setup(void **state) {
  (void)state;
  fx = cache_fx_new();
  return fx ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  cache_fx_free(fx);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cache_threads_on_two_dram_tiers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_threads_on_dram_and_nvme, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_threads_with_the_background_mover, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
