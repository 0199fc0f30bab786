/* tests/test_cache_review.c - review of the cache manager (kvtier/cache.h):
 * interleavings forced with the fault decorator's delays (a put, get, delete,
 * promotion or demotion held open while another thread runs), accounting
 * against the tiers' own stats, parent links after a restart, and error
 * paths. Tests named *_bug_* show a defect found in review and fail until it
 * is fixed; the others cover behaviour that was not tested before. */
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

static kvt_tier_stats tier_stats(kvt_cache *c, int t) {
  kvt_tier_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  assert_int_equal(kvt_tier_stats_get(kvt_cache_tier(c, t), &s), 0);
  return s;
}

/* Nothing pinned, and every tier's items agree with the tier's own count. */
static void assert_settled(kvt_cache *c) {
  for (int i = 0; i < 500 && stats(c, -1).pinned; i++)
    sleep_ms(10); /* the background mover may still be moving */
  assert_int_equal(stats(c, -1).pinned, 0);
  for (int t = 0; t < kvt_cache_tier_count(c); t++) {
    kvt_cache_stats s = stats(c, t);
    assert_true(s.used <= s.capacity);
    assert_int_equal(s.items, tier_stats(c, t).items);
  }
}

/* One unrelated first chunk per i. */
static kvt_key single_key(uint32_t seq) {
  kvt_key k;
  chain_keys(&fx->fp, seq, 1, &k);
  return k;
}

static int put_one(kvt_cache *c, const kvt_key *key, const kvt_key *prev, uint32_t tokens) {
  uint64_t len;
  uint8_t *p = payload_of(fx->ctx, &fx->fp, key, tokens, &len);
  int r = kvt_cache_put(c, key, prev, p, len);
  free(p);
  return r;
}

/* Gets key into a fresh buffer; on success checks the bytes. */
static int get_one(kvt_cache *c, const kvt_key *key, int *tier) {
  uint64_t len, got = 0;
  uint8_t *want = payload_of(fx->ctx, &fx->fp, key, CT_TOKENS, &len);
  uint8_t *buf = malloc(len);
  int r = kvt_cache_get(c, key, buf, len, &got, tier);
  if (r == 0) {
    assert_int_equal(got, len);
    assert_memory_equal(buf, want, len);
  }
  free(buf);
  free(want);
  return r;
}

/* A call run in another thread, so the test can act while it is held up.
 * The payload is made beforehand: the context is not for two threads. */
typedef struct job {
  kvt_cache *c;
  kvt_key key;
  int op; /* 0 put, 1 get */
  uint8_t *payload, *buf;
  uint64_t len;
  int result, tier, bytes_ok;
  pthread_t th;
} job;

static void *job_main(void *arg) {
  job *j = arg;
  j->tier = -2;
  if (j->op == 0) {
    j->result = kvt_cache_put(j->c, &j->key, NULL, j->payload, j->len);
  } else {
    uint64_t got = 0;
    j->result = kvt_cache_get(j->c, &j->key, j->buf, j->len, &got, &j->tier);
    j->bytes_ok = got == j->len && !memcmp(j->buf, j->payload, j->len);
  }
  return NULL;
}

static void job_start(job *j, kvt_cache *c, int op, const kvt_key *key) {
  memset(j, 0, sizeof(*j));
  j->c = c;
  j->op = op;
  j->key = *key;
  j->payload = payload_of(fx->ctx, &fx->fp, key, CT_TOKENS, &j->len);
  j->buf = malloc(j->len);
  assert_int_equal(pthread_create(&j->th, NULL, job_main, j), 0);
}

/* Waits for the job; a get that succeeded must have read the right bytes. */
static void job_join(job *j) {
  assert_int_equal(pthread_join(j->th, NULL), 0);
  free(j->payload);
  free(j->buf);
  if (j->op == 1 && j->result == 0)
    assert_true(j->bytes_ok);
}

/* ---- interleavings that behave ------------------------------------------- */

/* A delete waits for a get that is reading the payload, which comes back
 * whole; then nothing is left anywhere. */
static void test_cache_del_waits_for_a_get_in_progress(void **state) {
  (void)state;
  kvt_cache *c = open_cache("fault:op=get,mode=delay,ms=300@dram:1MiB", 0, &fx->fp);
  kvt_key k = single_key(5000);
  assert_int_equal(put_one(c, &k, NULL, CT_TOKENS), 0);
  job g;
  job_start(&g, c, 1, &k);
  sleep_ms(100);
  assert_int_equal(stats(c, -1).pinned, 1);
  assert_int_equal(kvt_cache_del(c, &k), 0);
  job_join(&g);
  assert_int_equal(g.result, 0);
  assert_int_equal(g.tier, 0);
  assert_int_equal(kvt_cache_where(c, &k), 0);
  assert_int_equal(stats(c, 0).used, 0);
  assert_int_equal(tier_stats(c, 0).used, 0);
  assert_settled(c);
  assert_int_equal(get_one(c, &k, NULL), KVT_ENOTFOUND);
  kvt_cache_close(c);
}

/* A get that pinned a payload whose eviction has begun reads it whole (or
 * misses); the eviction completes and the accounting agrees with the tier. */
static void test_cache_get_of_a_payload_being_evicted(void **state) {
  (void)state;
  char spec[128];
  snprintf(spec, sizeof(spec), "fault:op=del,mode=delay,ms=300@dram:%llu",
           (unsigned long long)(2 * pcost));
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key k0 = single_key(5100), k1 = single_key(5101), k2 = single_key(5102);
  assert_int_equal(put_one(c, &k0, NULL, CT_TOKENS), 0);
  assert_int_equal(put_one(c, &k1, NULL, CT_TOKENS), 0);
  job p;
  job_start(&p, c, 0, &k2); /* evicts k0; the tier's delete is held up */
  sleep_ms(100);
  int r = get_one(c, &k0, NULL);
  assert_true(r == 0 || r == KVT_ENOTFOUND);
  job_join(&p);
  assert_int_equal(p.result, 0);
  assert_int_equal(kvt_cache_where(c, &k2), 1u);
  assert_int_equal(stats(c, 0).evictions, 1);
  assert_settled(c);
  kvt_cache_close(c);
}

/* A delete during a promotion (the upper tier's put held up) waits for it
 * and then removes every copy; the victim the promotion demoted stays. */
static void test_cache_del_during_a_promotion_removes_every_copy(void **state) {
  (void)state;
  char spec[160];
  snprintf(spec, sizeof(spec), "fault:op=put,nth=3,mode=delay,ms=300@dram:%llu;dram:1MiB",
           (unsigned long long)pcost);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key k0 = single_key(5200), k1 = single_key(5201);
  assert_int_equal(put_one(c, &k0, NULL, CT_TOKENS), 0); /* top put 1 */
  assert_int_equal(put_one(c, &k1, NULL, CT_TOKENS), 0); /* top put 2; k0 goes down */
  assert_int_equal(kvt_cache_where(c, &k0), 2u);
  job g;
  job_start(&g, c, 1, &k0); /* promotes k0: top put 3 is held up */
  sleep_ms(100);
  assert_int_equal(kvt_cache_del(c, &k0), 0);
  job_join(&g);
  assert_int_equal(g.result, 0);
  assert_int_equal(g.tier, 1);
  assert_int_equal(kvt_cache_where(c, &k0), 0);
  assert_int_equal(kvt_tier_query(kvt_cache_tier(c, 0), &k0, NULL), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(kvt_cache_tier(c, 1), &k0, NULL), KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_where(c, &k1), 2u);
  int tier = -2;
  assert_int_equal(get_one(c, &k1, &tier), 0);
  assert_int_equal(tier, 1);
  assert_settled(c);
  kvt_cache_close(c);
}

/* A delete during a demotion (the lower tier's put held up) waits for the
 * move and removes the copy it made. */
static void test_cache_del_during_a_demotion_removes_the_moved_copy(void **state) {
  (void)state;
  char spec[160];
  snprintf(spec, sizeof(spec), "dram:%llu;fault:op=put,mode=delay,ms=300@dram:1MiB",
           (unsigned long long)pcost);
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key k0 = single_key(5300), k1 = single_key(5301);
  assert_int_equal(put_one(c, &k0, NULL, CT_TOKENS), 0);
  job p;
  job_start(&p, c, 0, &k1); /* demotes k0; its put below is held up */
  sleep_ms(100);
  assert_int_equal(stats(c, -1).pinned, 2);
  assert_int_equal(kvt_cache_del(c, &k0), 0);
  job_join(&p);
  assert_int_equal(p.result, 0);
  assert_int_equal(kvt_cache_where(c, &k0), 0);
  assert_int_equal(kvt_tier_query(kvt_cache_tier(c, 1), &k0, NULL), KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_where(c, &k1), 1u);
  assert_int_equal(stats(c, 1).used, 0);
  assert_settled(c);
  kvt_cache_close(c);
}

/* Two gets of a foreign payload at once: both refuse it, it is deleted once,
 * and nothing stays pinned. */
static void test_cache_two_gets_refusing_the_same_payload(void **state) {
  (void)state;
  char spec[512];
  snprintf(spec, sizeof(spec), "fault:op=get,mode=delay,ms=400@nvme:%s/refuse2:1MiB", fx->dir);
  kvt_key k = single_key(5400);
  uint64_t len;
  uint8_t *p = payload_of(fx->ctx, &fx->fp_other, &k, CT_TOKENS, &len);
  kvt_cache *c = open_cache(spec, 0, NULL);
  assert_int_equal(kvt_cache_put(c, &k, NULL, p, len), 0); /* no fingerprint: accepted */
  kvt_cache_close(c);
  c = open_cache(spec, 0, &fx->fp);
  job g1, g2;
  job_start(&g1, c, 1, &k);
  job_start(&g2, c, 1, &k);
  job_join(&g1);
  job_join(&g2);
  assert_int_equal(g1.result, KVT_EFOREIGN);
  assert_int_equal(g2.result, KVT_EFOREIGN);
  assert_int_equal(kvt_cache_where(c, &k), 0);
  assert_int_equal(stats(c, -1).refused, 2);
  assert_int_equal(stats(c, 0).used, 0);
  assert_settled(c);
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

/* Many threads on three tiers with write-through, full verification and a
 * middle tier that corrupts every 13th read: refused gets remove payloads
 * while other threads put, get, look up and delete them. A get that
 * succeeds returns the right bytes; nothing stays pinned; the counts agree
 * with the tiers'. */
enum { ST_THREADS = 6, ST_SEQS = 4, ST_CHAIN = 8, ST_ROUNDS = 250 };

typedef struct stress {
  kvt_cache *c;
  kvt_key keys[ST_SEQS][ST_CHAIN];
  uint8_t *payload[ST_SEQS][ST_CHAIN];
  uint64_t len;
  atomic_long bad, ok;
  int id;
} stress;

static void *stress_main(void *arg) {
  stress *st = ((void **)arg)[0];
  uint64_t x = (uint64_t)(uintptr_t)((void **)arg)[1] * 0x9E3779B97F4A7C15ull + 1;
  uint8_t *buf = malloc(st->len);
  for (int r = 0; r < ST_ROUNDS; r++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int s = (int)(x % ST_SEQS), op = (int)((x >> 8) % 10), i = (int)((x >> 16) % ST_CHAIN);
    if (op < 4) {
      for (int j = 0; j <= i; j++) {
        int rc = kvt_cache_put(st->c, &st->keys[s][j], j ? &st->keys[s][j - 1] : NULL,
                               st->payload[s][j], st->len);
        if (rc && rc != -ENOSPC)
          atomic_fetch_add(&st->bad, 1);
      }
    } else if (op < 8) {
      size_t hits = 0;
      kvt_cache_lookup_keys(st->c, st->keys[s], ST_CHAIN, &hits);
      for (size_t j = 0; j < hits; j++) {
        uint64_t got = 0;
        int rc = kvt_cache_get(st->c, &st->keys[s][j], buf, st->len, &got, NULL);
        if (rc == 0 && (got != st->len || memcmp(buf, st->payload[s][j], st->len)))
          atomic_fetch_add(&st->bad, 1);
        else if (rc == 0)
          atomic_fetch_add(&st->ok, 1);
        else if (rc != KVT_ENOTFOUND && rc != KVT_ECHECKSUM && rc != KVT_ECORRUPT &&
                 rc != KVT_EFOREIGN && rc != KVT_EFORMAT && rc != KVT_ETRUNC &&
                 rc != KVT_EVERSION && rc != KVT_ETOOBIG)
          atomic_fetch_add(&st->bad, 1);
      }
    } else if (op < 9) {
      int rc = kvt_cache_del(st->c, &st->keys[s][i]);
      if (rc && rc != KVT_ENOTFOUND)
        atomic_fetch_add(&st->bad, 1);
    } else {
      uint64_t len = 0;
      int t = -1;
      int rc = kvt_cache_query(st->c, &st->keys[s][i], &len, &t);
      if (rc == 0 && (len != st->len || t < 0 || t > 2))
        atomic_fetch_add(&st->bad, 1);
      kvt_cache_stats all;
      memset(&all, 0, sizeof(all));
      kvt_cache_stats_get(st->c, -1, &all);
    }
  }
  free(buf);
  return NULL;
}

static void run_stress(uint32_t flags, uint32_t headroom_pct) {
  stress *st = calloc(1, sizeof(*st));
  for (uint32_t s = 0; s < ST_SEQS; s++) {
    chain_keys(&fx->fp, 7000 + s, ST_CHAIN, st->keys[s]);
    for (int j = 0; j < ST_CHAIN; j++)
      st->payload[s][j] = payload_of(fx->ctx, &fx->fp, &st->keys[s][j], CT_TOKENS, &st->len);
  }
  char spec[600];
  snprintf(spec, sizeof(spec),
           "dram:%llu;fault:op=get,every=13,mode=corrupt@dram:%llu;nvme:%s/stress:256KiB",
           (unsigned long long)(4 * pcost), (unsigned long long)(8 * pcost), fx->dir);
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = spec;
  cfg.fingerprint = &fx->fp;
  cfg.chunk_tokens = CT_TOKENS;
  cfg.flags = flags;
  cfg.headroom_pct = headroom_pct;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &st->c), 0);
  pthread_t th[ST_THREADS];
  void *args[ST_THREADS][2];
  for (int t = 0; t < ST_THREADS; t++) {
    args[t][0] = st;
    args[t][1] = (void *)(uintptr_t)(t + 1);
    assert_int_equal(pthread_create(&th[t], NULL, stress_main, args[t]), 0);
  }
  for (int t = 0; t < ST_THREADS; t++)
    pthread_join(th[t], NULL);
  assert_int_equal(atomic_load(&st->bad), 0);
  assert_true(atomic_load(&st->ok) > 0);
  assert_settled(st->c);
  kvt_cache_close(st->c);
  for (int s = 0; s < ST_SEQS; s++)
    for (int j = 0; j < ST_CHAIN; j++)
      free(st->payload[s][j]);
  free(st);
}

static void test_cache_threads_with_refusals_on_three_tiers(void **state) {
  (void)state;
  run_stress(KVT_CACHE_WRITE_THROUGH | KVT_CACHE_VERIFY, 0);
}

/* The same with the background mover keeping 30% of the upper tiers free. */
static void test_cache_threads_with_the_background_mover(void **state) {
  (void)state;
  run_stress(KVT_CACHE_VERIFY | KVT_CACHE_BACKGROUND, 30);
}

/* ---- defects -------------------------------------------------------------- */

/* cache_internal.h: used is "as the tier counts them (cache_cost)", from the
 * item_overhead and granule the tier reports. Neither the dram nor the nvme
 * tier reports them, so the cache counts len alone. */
static void test_cache_bug_used_differs_from_the_tiers_own_used(void **state) {
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

/* kvt_cache_put returns 0 for a key "already held" while another thread's
 * put of it is still writing: the caller's get right after its own
 * successful put misses. */
static void test_cache_bug_put_of_a_key_being_put_returns_before_it_is_held(void **state) {
  (void)state;
  kvt_cache *c = open_cache("fault:op=put,mode=delay,ms=400@dram:1MiB", 0, &fx->fp);
  kvt_key k = single_key(6100);
  job p;
  job_start(&p, c, 0, &k);
  sleep_ms(100);
  assert_int_equal(put_one(c, &k, NULL, CT_TOKENS), 0);
  int r = get_one(c, &k, NULL); /* our put said the key is held */
  job_join(&p);
  kvt_cache_close(c);
  assert_int_equal(p.result, 0);
  assert_int_equal(r, 0);
}

/* The same, when the first put then fails: the second one returned 0 and
 * nothing was ever stored. */
static void test_cache_bug_put_of_a_key_whose_put_fails_returns_0(void **state) {
  (void)state;
  kvt_cache *c =
      open_cache("fault:op=put,mode=delay,ms=300;op=put,mode=nospace@dram:1MiB", 0, &fx->fp);
  kvt_key k = single_key(6200);
  job p;
  job_start(&p, c, 0, &k);
  sleep_ms(100);
  int r = put_one(c, &k, NULL, CT_TOKENS);
  job_join(&p);
  uint32_t where = kvt_cache_where(c, &k);
  kvt_cache_close(c);
  assert_int_equal(p.result, -ENOSPC);
  assert_int_equal(where, 0);
  assert_int_not_equal(r, 0); /* 0 means "stored, or already held" */
}

/* A put of a key whose eviction has begun must not return 0 ("held") while
 * the eviction goes on and drops it: it waits for the eviction, then stores
 * the payload again, which makes it the hottest; with room for two, the
 * coldest (k1) goes. */
static void test_cache_bug_put_racing_the_eviction_of_its_key_loses_it(void **state) {
  (void)state;
  char spec[128];
  snprintf(spec, sizeof(spec), "fault:op=del,mode=delay,ms=400@dram:%llu",
           (unsigned long long)(2 * pcost));
  kvt_cache *c = open_cache(spec, 0, &fx->fp);
  kvt_key k0 = single_key(6300), k1 = single_key(6301), k2 = single_key(6302);
  assert_int_equal(put_one(c, &k0, NULL, CT_TOKENS), 0);
  assert_int_equal(put_one(c, &k1, NULL, CT_TOKENS), 0);
  job p;
  job_start(&p, c, 0, &k2); /* evicts k0; the tier's delete is held up */
  sleep_ms(100);
  assert_int_equal(put_one(c, &k0, NULL, CT_TOKENS), 0);
  job_join(&p);
  uint32_t where1 = kvt_cache_where(c, &k1), where2 = kvt_cache_where(c, &k2);
  int r = get_one(c, &k0, NULL);
  kvt_cache_close(c);
  assert_int_equal(p.result, 0);
  assert_int_equal(r, 0);          /* the one just put is held ... */
  assert_int_not_equal(where2, 0); /* ... with the other new one ... */
  assert_int_equal(where1, 0);     /* ... and the coldest went */
}

/* cache.h: "Parents come from the prev argument of kvt_cache_put()". After
 * a restart a put of a held chunk with its prev is a duplicate and links
 * nothing, so the chain is ranked as unrelated payloads and its head is
 * evicted first, leaving a tail no lookup can reach. */
static void test_cache_bug_put_with_prev_after_restart_does_not_relink(void **state) {
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

/* cache.h: "a payload is never placed at the cost of evicting its own
 * prefix". The victim a put pushes out of the top tier is demoted, and that
 * demotion evicts from the tier below without the put's ancestors marked
 * (mark_ancestors starts a new generation for the victim): the put's own
 * parent is dropped, and the chunk just stored cannot be reached. */
static void test_cache_bug_cascade_evicts_the_prefix_of_the_payload_put(void **state) {
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

/* kvt_cache_get_many() pins every request before it finishes any. A
 * refused payload is removed by cache_get_end -> remove_all, which waits for
 * every other pin on it to go, and a second request for the same key (two
 * sequences sharing a prefix in one batch) holds such a pin in the same
 * thread: the call never returns. (Two threads batching the same keys in
 * different orders deadlock the same way.) */
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

static void test_cache_bug_get_many_hangs_on_a_refused_key_asked_twice(void **state) {
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

/* A put refused at the cost of its own prefix (-ENOSPC) has already taken
 * and dropped the victims it chose before it reached the prefix: a payload
 * is lost for a put that stores nothing. */
static void test_cache_bug_refused_put_still_evicts(void **state) {
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

/* kvt_cache_del returns 0 ("removed from every tier") when the persistent
 * tier failed to delete: the payload comes back at the next open. */
static void test_cache_bug_del_that_failed_in_a_tier_reports_success(void **state) {
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

/* An eviction whose delete fails in the tier: the cache forgets the payload
 * but the tier keeps it, so the tier's capacity is taken by a payload the
 * cache can never evict again, and items drift apart. */
static void test_cache_bug_failed_eviction_leaves_a_ghost_in_the_tier(void **state) {
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
      cmocka_unit_test_setup_teardown(test_cache_del_waits_for_a_get_in_progress, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_of_a_payload_being_evicted, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_del_during_a_promotion_removes_every_copy, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_del_during_a_demotion_removes_the_moved_copy,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_two_gets_refusing_the_same_payload, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_get_refuses_a_short_written_payload, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_demotion_drops_a_short_copy, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_threads_with_refusals_on_three_tiers, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_threads_with_the_background_mover, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_bug_used_differs_from_the_tiers_own_used, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(
          test_cache_bug_put_of_a_key_being_put_returns_before_it_is_held, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_bug_put_of_a_key_whose_put_fails_returns_0, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_bug_put_racing_the_eviction_of_its_key_loses_it,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_bug_put_with_prev_after_restart_does_not_relink,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_bug_cascade_evicts_the_prefix_of_the_payload_put,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_bug_get_many_hangs_on_a_refused_key_asked_twice,
                                      ct_setup, teardown_after_hang),
      cmocka_unit_test_setup_teardown(test_cache_bug_refused_put_still_evicts, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_bug_del_that_failed_in_a_tier_reports_success,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cache_bug_failed_eviction_leaves_a_ghost_in_the_tier,
                                      ct_setup, ct_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
