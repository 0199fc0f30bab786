/* tests/test_server_reserve_review.c - a reviewer's checks of kvtier-server's
 * reserved PUT path (test_server_reserve.c has the author's): many keys put,
 * read and deleted at once on a small DRAM tier with --evict lru, so that
 * reservations, evictions (of values, or of copies in front of NVMe), DELs
 * and GETs served in place all overlap. What must hold: every GET returns
 * NOT_FOUND or exactly a value once put under that key; PUTs fail only with
 * -ENOSPC; once quiet, the DRAM tier holds exactly the values indexed
 * (nothing stays reserved); with NVMe below, a restart serves the same
 * values. Runs kvtier-server on 127.0.0.1 (tests/server_fixture.h); skips
 * (77) without it or the provider. */
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

#include <cmocka.h>

#include "../transport/kvt_transport.h"
#include "kvtier.h"
#include "server_fixture.h"
#include "tier_test_util.h"

#define REC_HDR 32u /* the server's record header (SRV_REC_HDR) */
#define NK 12       /* keys */
#define V_HEAD 16
#define V_MAX (700u << 10)
#define WRITERS 3
#define READERS 2

static kvt_ctx *ctx;

static int64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static uint64_t held(uint64_t len) { return (REC_HDR + len + 255) & ~(uint64_t)255; }

static kvt_key key_of(uint32_t k) {
  kvt_key key;
  memset(&key, 0x5A, sizeof(key));
  memcpy(key.bytes, &k, 4);
  return key;
}

static uint64_t v_len(uint32_t k, uint32_t ver) {
  return V_HEAD + ((uint64_t)k * 40009 + (uint64_t)ver * 977 * 1031) % (V_MAX - V_HEAD);
}

static void v_make(uint8_t *p, uint32_t k, uint32_t ver) {
  const uint64_t n = v_len(k, ver);
  memcpy(p, &k, 4);
  memcpy(p + 4, &ver, 4);
  memcpy(p + 8, &n, 8);
  fill(p + V_HEAD, n - V_HEAD, ((uint64_t)k << 32) | ver);
}

typedef struct shared {
  char spec[256];
  atomic_int stop;
  atomic_uint version[NK]; /* highest version of each key handed to a writer */
  atomic_ulong gets_ok, puts_ok, puts_full, dels;
  pthread_mutex_t mu;
  const char *wrong;
} shared;

static void set_wrong(shared *sh, const char *why) {
  pthread_mutex_lock(&sh->mu);
  if (!sh->wrong)
    sh->wrong = why;
  pthread_mutex_unlock(&sh->mu);
  atomic_store(&sh->stop, 1);
}

/* NULL when got is a whole value once put under key k. */
static const char *v_check(shared *sh, uint32_t k, const uint8_t *got, uint64_t len,
                           uint8_t *scratch) {
  uint32_t gk, ver;
  uint64_t n;
  if (len < V_HEAD)
    return "short value";
  memcpy(&gk, got, 4);
  memcpy(&ver, got + 4, 4);
  memcpy(&n, got + 8, 8);
  if (gk != k)
    return "another key's value";
  if (ver == 0 || ver > atomic_load(&sh->version[k]))
    return "a version never put";
  if (len != n || len != v_len(k, ver))
    return "wrong length for its version";
  v_make(scratch, k, ver);
  return memcmp(scratch, got, len) ? "bytes differ from what was put" : NULL;
}

typedef struct worker {
  shared *sh;
  uint32_t id;
} worker;

static uint32_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return (uint32_t)(*s >> 11);
}

static void *writer_main(void *arg) {
  worker *w = arg;
  shared *sh = w->sh;
  kvt_ctx *own = NULL;
  kvt_tier *t = NULL;
  uint8_t *buf = malloc(V_MAX);
  uint64_t s = 0x1234567ull + w->id * 7919;
  if (!buf || kvt_ctx_create(NULL, &own) || kvt_tier_open(own, sh->spec, &t)) {
    set_wrong(sh, "writer: open");
    goto out;
  }
  while (!atomic_load(&sh->stop)) {
    const uint32_t k = rnd(&s) % NK;
    const kvt_key key = key_of(k);
    if (w->id == 0 && rnd(&s) % 8 == 0) { /* DELs now and then */
      const int rc = kvt_tier_del(t, &key);
      if (rc != 0 && rc != KVT_ENOTFOUND) {
        set_wrong(sh, "a DEL failed");
        break;
      }
      atomic_fetch_add(&sh->dels, 1);
      continue;
    }
    const uint32_t ver = atomic_fetch_add(&sh->version[k], 1) + 1;
    v_make(buf, k, ver);
    const int rc = kvt_tier_put(t, &key, buf, v_len(k, ver));
    if (rc == -ENOSPC) {
      atomic_fetch_add(&sh->puts_full, 1);
    } else if (rc != 0) {
      set_wrong(sh, "a PUT failed other than -ENOSPC");
      break;
    } else {
      atomic_fetch_add(&sh->puts_ok, 1);
    }
  }
out:
  kvt_tier_close(t);
  kvt_ctx_destroy(own);
  free(buf);
  return NULL;
}

static void *reader_main(void *arg) {
  worker *w = arg;
  shared *sh = w->sh;
  kvt_ctx *own = NULL;
  kvt_tier *t = NULL;
  uint8_t *got = malloc(V_MAX), *scratch = malloc(V_MAX);
  uint64_t s = 0x7654321ull + w->id * 104729;
  if (!got || !scratch || kvt_ctx_create(NULL, &own) || kvt_tier_open(own, sh->spec, &t)) {
    set_wrong(sh, "reader: open");
  } else {
    while (!atomic_load(&sh->stop)) {
      const uint32_t k = rnd(&s) % NK;
      const kvt_key key = key_of(k);
      uint64_t len = 0;
      const int rc = kvt_tier_get(t, &key, got, V_MAX, &len);
      const char *why = rc == 0 ? v_check(sh, k, got, len, scratch)
                        : rc == KVT_ENOTFOUND ? NULL
                                              : "a GET failed";
      if (why) {
        set_wrong(sh, why);
        break;
      }
      atomic_fetch_add(&sh->gets_ok, rc == 0);
    }
  }
  kvt_tier_close(t);
  kvt_ctx_destroy(own);
  free(got);
  free(scratch);
  return NULL;
}

static void run_mix(shared *sh, const srv_fixture *f, int ms) {
  memset(sh, 0, sizeof(*sh));
  pthread_mutex_init(&sh->mu, NULL);
  srv_spec(f, sh->spec, sizeof(sh->spec), "default", "", 10000, NULL);
  worker w[WRITERS + READERS];
  pthread_t th[WRITERS + READERS];
  for (int i = 0; i < WRITERS + READERS; i++) {
    w[i] = (worker){.sh = sh, .id = (uint32_t)(i < WRITERS ? i : i - WRITERS)};
    assert_int_equal(
        pthread_create(&th[i], NULL, i < WRITERS ? writer_main : reader_main, &w[i]), 0);
  }
  const int64_t t0 = ms_now();
  while (!atomic_load(&sh->stop) && ms_now() - t0 < 60000 &&
         (ms_now() - t0 < ms || atomic_load(&sh->gets_ok) < 50 || atomic_load(&sh->puts_ok) < 50))
    sleep_ms(20);
  atomic_store(&sh->stop, 1);
  for (int i = 0; i < WRITERS + READERS; i++)
    pthread_join(th[i], NULL);
  pthread_mutex_destroy(&sh->mu);
  print_message("%lu PUTs (%lu refused: full), %lu DELs, %lu GETs checked\n",
                (unsigned long)atomic_load(&sh->puts_ok),
                (unsigned long)atomic_load(&sh->puts_full), (unsigned long)atomic_load(&sh->dels),
                (unsigned long)atomic_load(&sh->gets_ok));
  if (sh->wrong)
    fail_msg("%s", sh->wrong);
}

/* Reads every key: each NOT_FOUND or valid; lens[k] its length (UINT64_MAX:
 * absent), data[k] its bytes. Returns the DRAM bytes those values hold. */
static uint64_t snapshot(shared *sh, const srv_fixture *f, uint64_t lens[NK], uint8_t *data) {
  kvt_tier *t;
  char spec[256];
  srv_spec(f, spec, sizeof(spec), "default", "", 10000, NULL);
  assert_int_equal(kvt_tier_open(ctx, spec, &t), 0);
  uint8_t *scratch = malloc(V_MAX);
  assert_non_null(scratch);
  uint64_t sum = 0;
  for (uint32_t k = 0; k < NK; k++) {
    const kvt_key key = key_of(k);
    uint64_t len = 0;
    const int rc = kvt_tier_get(t, &key, data + (size_t)k * V_MAX, V_MAX, &len);
    if (rc == KVT_ENOTFOUND) {
      lens[k] = UINT64_MAX;
      continue;
    }
    assert_int_equal(rc, 0);
    const char *why = v_check(sh, k, data + (size_t)k * V_MAX, len, scratch);
    if (why)
      fail_msg("key %u after the run: %s", k, why);
    lens[k] = len;
    sum += held(len);
  }
  free(scratch);
  kvt_tier_close(t);
  return sum;
}

static void test_many_keys_with_evict_lru_on_one_dram_tier(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:4MiB", "--evict", "lru", NULL);
  srv_start_or_fail(&f);
  static shared sh;
  run_mix(&sh, &f, 3000);
  uint64_t lens[NK];
  uint8_t *data = malloc((size_t)NK * V_MAX);
  assert_non_null(data);
  const uint64_t sum = snapshot(&sh, &f, lens, data);
  /* One tier: its `used` is the server's capacity use; nothing reserved is left. */
  assert_int_equal(srv_stat(&f, "used_bytes"), sum);
  assert_int_equal(srv_stat(&f, "errors_total"), 0);
  const uint64_t ev = srv_stat(&f, "evictions_total");
  print_message("%llu values dropped for room\n", (unsigned long long)ev);
  assert_true(ev > 0 && ev != UINT64_MAX); /* the mix did overlap evictions */
  free(data);
  srv_stop_cleanly(&f, 25);
}

static void test_many_keys_with_evict_lru_on_dram_and_nvme_survive_a_restart(void **state) {
  (void)state;
  char dir[256], tiers[400];
  assert_int_equal(srv_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(tiers, sizeof(tiers), "dram:3MiB;nvme:%s:4MiB", dir);
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", tiers, "--evict", "lru", NULL);
  srv_start_or_fail(&f);
  static shared sh;
  run_mix(&sh, &f, 3000);
  uint64_t lens[NK], lens2[NK];
  uint8_t *data = malloc((size_t)NK * V_MAX), *data2 = malloc((size_t)NK * V_MAX);
  assert_true(data && data2);
  (void)snapshot(&sh, &f, lens, data);
  assert_int_equal(srv_stat(&f, "errors_total"), 0);
  srv_stop_cleanly(&f, 25);
  srv_start_or_fail(&f);
  (void)snapshot(&sh, &f, lens2, data2);
  for (uint32_t k = 0; k < NK; k++) {
    assert_int_equal(lens2[k], lens[k]);
    if (lens[k] != UINT64_MAX)
      assert_memory_equal(data2 + (size_t)k * V_MAX, data + (size_t)k * V_MAX, lens[k]);
  }
  free(data);
  free(data2);
  srv_stop_cleanly(&f, 25);
  srv_rmdir(dir);
}

static int setup(void **state) {
  (void)state;
  return kvt_ctx_create(NULL, &ctx);
}

static int teardown(void **state) {
  (void)state;
  kvt_ctx_destroy(ctx);
  return 0;
}

int main(void) {
  if (!srv_can_run())
    return 77;
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_many_keys_with_evict_lru_on_one_dram_tier, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_many_keys_with_evict_lru_on_dram_and_nvme_survive_a_restart,
                                srv_kill_leftovers),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
