/* tests/test_tier_conformance.c - the one suite every tier must pass, run
 * against each spec in tier_rows[]: round trips, misses, overwrite, too-small
 * buffers, capacity, 256 operations in one submit, 8 threads on the blocking
 * helpers, close with operations in flight, stats, list, values tampered
 * with on the medium (planted under another key, bit flips: a miss, never
 * wrong bytes), malformed operations, traits; then the spec parser's
 * refusals, secrets in specs (shown as ***, in no detail or log), the
 * traits of NULL, of an application's backend table (of either size), of
 * decorators over nvme and of hbm.
 *
 * Adding a tier is adding a row (and, where its medium can be reached from
 * outside the process, a tamper hook in tests/fixtures/tier_tamper.c).
 * "{tmpdir}" in a row is replaced by a fresh temporary directory per test,
 * removed afterwards. A row whose scheme is not built in (kvt_tier_open
 * gives KVT_ENOTSUP) is skipped; if every row is, the program exits 77.
 * Each test opens its own tier on its own context, whose allocator counts,
 * so nothing may stay allocated after close.
 *
 * KVT_CONFORMANCE_SPECS="SPEC|SPEC..." replaces the rows: the remote tiers'
 * tests start their servers (redis-server, a Redis Cluster, kvtier-server)
 * and run this suite against them that way. */
#include <errno.h>
#include <ftw.h>
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

#include "kvtier.h"
#include "tier_internal.h"
#include "tier_tamper.h"
#include "tier_test_util.h"

typedef struct tier_row {
  const char *spec;
} tier_row;

static tier_row tier_rows[] = {
    {"dram:64MiB"},
    {"trace@dram:64MiB"},
    {"fault:op=any,every=1000000,mode=fail@dram:64MiB"}, /* a rule that never fires */
    {"nvme:{tmpdir}:256MiB"},
    {"nvme:{tmpdir}:256MiB,engine=pread"},
};

#define MiB (1024u * 1024u)

typedef struct fixture {
  kvt_ctx *ctx;
  kvt_tier *tier;
  char spec[512];
  char dir[256];    /* the row's {tmpdir}, or "" */
  atomic_long live; /* allocations outstanding through ctx */
  long live_base;   /* ... once ctx existed */
} fixture;

/* Listening makes the trace row format its lines, from all threads. */
static void fx_log(void *opaque, int level, const char *msg) {
  (void)opaque, (void)level, (void)msg;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

/* f->spec from the row, with a fresh directory for "{tmpdir}". */
static int expand_spec(fixture *f, const char *tmpl) {
  const char *mark = strstr(tmpl, "{tmpdir}");
  f->dir[0] = '\0';
  if (!mark) {
    snprintf(f->spec, sizeof(f->spec), "%s", tmpl);
    return 0;
  }
  const char *base = getenv("TMPDIR");
  snprintf(f->dir, sizeof(f->dir), "%s/kvt_conformance_XXXXXX", base ? base : "/tmp");
  if (!mkdtemp(f->dir))
    return -errno;
  snprintf(f->spec, sizeof(f->spec), "%.*s%s%s", (int)(mark - tmpl), tmpl, f->dir,
           mark + strlen("{tmpdir}"));
  return 0;
}

static fixture *fixture_new(const char *tmpl) {
  fixture *f = calloc(1, sizeof(*f));
  if (!f || expand_spec(f, tmpl) != 0) {
    free(f);
    return NULL;
  }
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.allocator.alloc = counting_alloc;
  cfg.allocator.free = counting_free;
  cfg.allocator.opaque = &f->live;
  cfg.log = fx_log;
  cfg.log_opaque = f;
  cfg.log_level = KVT_LOG_DEBUG; /* the trace row's lines get formatted */
  if (kvt_ctx_create(&cfg, &f->ctx) != 0) {
    free(f);
    return NULL;
  }
  f->live_base = atomic_load(&f->live);
  return f;
}

static void fixture_free(fixture *f) {
  kvt_tier_close(f->tier);
  kvt_ctx_destroy(f->ctx);
  if (f->dir[0])
    nftw(f->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(f);
}

static int row_setup(void **state) {
  const tier_row *row = *state;
  fixture *f = fixture_new(row->spec);
  if (!f)
    return -1;
  int rc = kvt_tier_open(f->ctx, f->spec, &f->tier);
  if (rc != 0) {
    print_error("kvt_tier_open(%s): %s: %s\n", f->spec, kvt_err_name(rc),
                kvt_ctx_last_error(f->ctx));
    fixture_free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int row_teardown(void **state) {
  fixture *f = *state;
  kvt_tier_close(f->tier);
  f->tier = NULL;
  const long leaked = atomic_load(&f->live) - f->live_base;
  fixture_free(f);
  if (leaked != 0)
    print_error("%ld allocations outstanding after close\n", leaked);
  return leaked == 0 ? 0 : -1;
}

static void shown_spec(const char *spec, char *out, size_t cap);

/* ---- values ---- */

static kvt_key key_of(uint32_t space, uint32_t id) {
  kvt_key k;
  memset(&k, 0x5C, sizeof(k));
  memcpy(k.bytes, &space, sizeof(space));
  memcpy(k.bytes + 8, &id, sizeof(id));
  return k;
}

static uint8_t *filled(size_t n, uint64_t seed) {
  uint8_t *p = malloc(n ? n : 1);
  assert_non_null(p);
  fill(p, n, seed);
  return p;
}

/* ---- round trips and misses ---- */

static void test_put_get_round_trips_bytes_exactly(void **state) {
  fixture *f = *state;
  const size_t sizes[] = {0, 1, 4096 + 1, MiB, 4 * MiB};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    const size_t n = sizes[i], slack = 64;
    uint8_t *val = filled(n, i), *got = malloc(n + slack);
    assert_non_null(got);
    memset(got, 0xEE, n + slack);
    const kvt_key k = key_of(1, (uint32_t)i);
    assert_int_equal(kvt_tier_put(f->tier, &k, val, n), 0);
    uint64_t len = 0;
    assert_int_equal(kvt_tier_get(f->tier, &k, got, n + slack, &len), 0);
    assert_int_equal(len, n);
    assert_memory_equal(got, val, n);
    for (size_t j = n; j < n + slack; j++)
      assert_int_equal(got[j], 0xEE); /* nothing written past the value */
    assert_int_equal(kvt_tier_query(f->tier, &k, &len), 0);
    assert_int_equal(len, n);
    free(val);
    free(got);
  }
}

static void test_fresh_tier_reports_its_spec_and_misses_every_key(void **state) {
  fixture *f = *state;
  const kvt_key k = key_of(3, 0);
  uint8_t buf[16];
  uint64_t len = 0;
  char shown[512];
  shown_spec(f->spec, shown, sizeof(shown)); /* secrets as "***" */
  assert_string_equal(kvt_tier_spec(f->tier), shown);
  assert_int_equal(kvt_tier_get(f->tier, &k, buf, sizeof(buf), &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_del(f->tier, &k), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(f->tier, &k, &len), KVT_ENOTFOUND);
}

static void test_overwrite_returns_the_new_value_and_length(void **state) {
  fixture *f = *state;
  const kvt_key k = key_of(4, 0);
  const size_t sizes[] = {100, 5000, 7}; /* grow, then shrink */
  uint8_t got[5000];
  for (size_t i = 0; i < 3; i++) {
    uint8_t *val = filled(sizes[i], 40 + i);
    assert_int_equal(kvt_tier_put(f->tier, &k, val, sizes[i]), 0);
    uint64_t len = 0;
    assert_int_equal(kvt_tier_query(f->tier, &k, &len), 0);
    assert_int_equal(len, sizes[i]);
    assert_int_equal(kvt_tier_get(f->tier, &k, got, sizeof(got), &len), 0);
    assert_int_equal(len, sizes[i]);
    assert_memory_equal(got, val, sizes[i]);
    free(val);
  }
}

static void test_del_then_get_misses(void **state) {
  fixture *f = *state;
  const kvt_key k = key_of(5, 0), other = key_of(5, 1);
  uint8_t val[300], got[300];
  fill(val, sizeof(val), 5);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(f->tier, &k, val, sizeof(val)), 0);
  assert_int_equal(kvt_tier_put(f->tier, &other, val, sizeof(val)), 0);
  assert_int_equal(kvt_tier_del(f->tier, &k), 0);
  assert_int_equal(kvt_tier_get(f->tier, &k, got, sizeof(got), &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(f->tier, &k, &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_del(f->tier, &k), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_get(f->tier, &other, got, sizeof(got), &len), 0); /* untouched */
  assert_memory_equal(got, val, sizeof(val));
}

static void test_get_into_small_buffer_is_enobufs_with_length(void **state) {
  fixture *f = *state;
  const kvt_key k = key_of(6, 0);
  uint8_t val[1000], got[200];
  fill(val, sizeof(val), 6);
  memset(got, 0xEE, sizeof(got));
  assert_int_equal(kvt_tier_put(f->tier, &k, val, sizeof(val)), 0);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(f->tier, &k, got, 100, &len), KVT_ENOBUFS);
  assert_int_equal(len, sizeof(val));
  for (size_t j = 100; j < sizeof(got); j++)
    assert_int_equal(got[j], 0xEE);
  len = 0; /* a NULL buffer of capacity 0 asks for the length */
  assert_int_equal(kvt_tier_get(f->tier, &k, NULL, 0, &len), KVT_ENOBUFS);
  assert_int_equal(len, sizeof(val));
}

static void test_full_tier_refuses_put_with_enospc_and_recovers_after_del(void **state) {
  fixture *f = *state;
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(f->tier, &s), 0);
  assert_true(s.capacity > 0);
  const size_t vsize = MiB;
  uint8_t *val = filled(vsize, 7), *got = malloc(vsize);
  assert_non_null(got);
  const uint32_t max = (uint32_t)(s.capacity / vsize) + 16;
  uint32_t stored = 0;
  int rc = 0;
  for (; stored < max; stored++) {
    const kvt_key k = key_of(7, stored);
    rc = kvt_tier_put(f->tier, &k, val, vsize);
    if (rc != 0)
      break;
  }
  assert_int_equal(rc, -ENOSPC);
  assert_true((uint64_t)stored * vsize >= s.capacity / 2); /* not refused far too early */
  assert_int_equal(kvt_tier_stats_get(f->tier, &s), 0);
  assert_true(s.used <= s.capacity);
  assert_int_equal(s.items, stored);
  uint64_t len = 0;
  const kvt_key first = key_of(7, 0), second = key_of(7, 1), next = key_of(7, stored);
  assert_int_equal(kvt_tier_get(f->tier, &first, got, vsize, &len), 0);
  assert_memory_equal(got, val, vsize);
  assert_int_equal(kvt_tier_query(f->tier, &next, &len), KVT_ENOTFOUND); /* refused: absent */
  assert_int_equal(kvt_tier_del(f->tier, &first), 0);
  assert_int_equal(kvt_tier_del(f->tier, &second), 0);
  assert_int_equal(kvt_tier_put(f->tier, &next, val, vsize), 0);
  assert_int_equal(kvt_tier_get(f->tier, &next, got, vsize, &len), 0);
  assert_memory_equal(got, val, vsize);
  free(val);
  free(got);
}

/* ---- many operations in flight ---- */

#define BATCH 256
#define BATCH_CAP 5000

/* Op i of the batch, by i % 4: GET of a stored key, PUT of a new key, QUERY
 * of a stored key, GET of a missing key; the value's size varies with i. */
static const uint32_t batch_kind[4] = {KVT_TIER_GET, KVT_TIER_PUT, KVT_TIER_QUERY, KVT_TIER_GET};

static uint64_t batch_size(uint32_t i) { return (i * 37u) % 4999u + 1; }

static void batch_prepare(fixture *f, kvt_tier_op *ops, kvt_tier_op **ptrs, uint8_t *bufs) {
  for (uint32_t i = 0; i < BATCH; i++) {
    uint8_t *b = bufs + (size_t)i * BATCH_CAP;
    const kvt_key k = key_of(8 + i % 4, i);
    fill(b, batch_size(i), i);
    if (i % 4 == 0 || i % 4 == 2) {
      assert_int_equal(kvt_tier_put(f->tier, &k, b, batch_size(i)), 0);
      memset(b, 0, BATCH_CAP);
    }
    const uint64_t len = i % 4 == 1 ? batch_size(i) : i % 4 == 2 ? 0 : BATCH_CAP;
    kvt_tier_op_init(&ops[i], (int)batch_kind[i % 4], &k, i % 4 == 2 ? NULL : b, len, i);
    ptrs[i] = &ops[i];
  }
}

static void batch_check_one(const kvt_tier_op *op, uint32_t i) {
  uint8_t want[BATCH_CAP];
  assert_int_equal(op->result, i % 4 == 3 ? KVT_ENOTFOUND : 0);
  if (i % 4 == 0 || i % 4 == 2)
    assert_int_equal(op->out_len, batch_size(i));
  if (i % 4 == 0) {
    fill(want, batch_size(i), i);
    assert_memory_equal(op->buf, want, batch_size(i));
  }
}

static void test_256_ops_in_one_submit_complete_exactly_once(void **state) {
  fixture *f = *state;
  kvt_tier_op *ops = calloc(BATCH, sizeof(*ops));
  uint8_t *bufs = malloc((size_t)BATCH * BATCH_CAP), got[BATCH_CAP];
  kvt_tier_op *ptrs[BATCH], *done[64];
  int seen[BATCH] = {0}, completed = 0;
  assert_true(ops && bufs);
  batch_prepare(f, ops, ptrs, bufs);
  /* One call; a tier may accept fewer, and the rest then go in later. */
  int accepted = kvt_tier_submit(f->tier, ptrs, BATCH);
  assert_true(accepted > 0);
  const time_t deadline = time(NULL) + 10; /* a lost completion fails, not hangs */
  while (completed < BATCH && time(NULL) < deadline) {
    if (accepted < BATCH) {
      const int rc = kvt_tier_submit(f->tier, ptrs + accepted, (size_t)(BATCH - accepted));
      assert_true(rc >= 0);
      accepted += rc;
    }
    const int n = kvt_tier_poll(f->tier, done, 64, 100);
    assert_true(n >= 0);
    for (int j = 0; j < n; j++) {
      const uint64_t i = done[j]->user_data;
      assert_true(i < BATCH && done[j] == &ops[i]);
      assert_int_equal(seen[i]++, 0);
      batch_check_one(done[j], (uint32_t)i);
    }
    completed += n;
  }
  assert_int_equal(completed, BATCH);
  assert_int_equal(kvt_tier_poll(f->tier, done, 64, 0), 0); /* nothing twice */
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(f->tier, &s), 0);
  assert_int_equal(s.in_flight, 0);
  for (uint32_t i = 1; i < BATCH; i += 4) { /* the PUTs landed */
    uint64_t len = 0;
    assert_int_equal(kvt_tier_get(f->tier, &ops[i].key, got, sizeof(got), &len), 0);
    assert_int_equal(len, batch_size(i));
    assert_memory_equal(got, ops[i].buf, len);
  }
  free(ops);
  free(bufs);
}

static void test_close_with_ops_in_flight_neither_crashes_nor_leaks(void **state) {
  fixture *f = *state;
  enum { N = 512, SZ = 16384 };
  kvt_tier_op *ops = calloc(N, sizeof(*ops));
  uint8_t *bufs = malloc((size_t)N * SZ);
  kvt_tier_op *ptrs[N];
  assert_true(ops && bufs);
  for (uint32_t i = 0; i < N; i++) {
    const kvt_key k = key_of(11, i / 2);
    uint8_t *b = bufs + (size_t)i * SZ;
    fill(b, SZ, i);
    kvt_tier_op_init(&ops[i], i % 2 ? KVT_TIER_GET : KVT_TIER_PUT, &k, b, SZ, i);
    ptrs[i] = &ops[i];
  }
  int accepted = kvt_tier_submit(f->tier, ptrs, N);
  assert_true(accepted > 0);
  kvt_tier_close(f->tier); /* waits for them; their completions are dropped */
  f->tier = NULL;
  assert_int_equal(atomic_load(&f->live), f->live_base);
  free(ops); /* under ASan, a late completion would now be a use after free */
  free(bufs);
}

/* ---- threads ---- */

#define W_THREADS 8
#define W_ITERS 300
#define W_SHARED 8
#define W_MAX 8192
#define W_HEAD 16

typedef struct worker {
  kvt_tier *tier;
  uint32_t id;
  const char *failed; /* the first step that failed, or NULL */
  int rc;
} worker;

/* A value says who wrote it and how long it is, so a GET of a key several
 * threads write can check it got one whole value. */
static void make_value(uint8_t *p, uint64_t len, uint32_t writer, uint32_t seq) {
  memcpy(p, &writer, 4);
  memcpy(p + 4, &seq, 4);
  memcpy(p + 8, &len, 8);
  fill(p + W_HEAD, len - W_HEAD, ((uint64_t)writer << 32) | seq);
}

static int value_whole(const uint8_t *p, uint64_t len, uint8_t *scratch) {
  uint32_t writer, seq;
  uint64_t said;
  if (len < W_HEAD)
    return 0;
  memcpy(&writer, p, 4);
  memcpy(&seq, p + 4, 4);
  memcpy(&said, p + 8, 8);
  if (said != len || writer >= W_THREADS)
    return 0;
  make_value(scratch, len, writer, seq);
  return memcmp(scratch, p, len) == 0;
}

/* One round on a key of this thread's and on a key all threads write. */
static const char *worker_step(worker *w, uint32_t it, uint64_t len, uint8_t *val, uint8_t *got) {
  const kvt_key own = key_of(100 + w->id, it % 16), shared = key_of(99, it % W_SHARED);
  uint64_t n = 0;
  make_value(val, len, w->id, it);
  if ((w->rc = kvt_tier_put(w->tier, &own, val, len)) != 0)
    return "put own key";
  if ((w->rc = kvt_tier_get(w->tier, &own, got, W_MAX, &n)) != 0 || n != len ||
      memcmp(got, val, len) != 0)
    return "get own key: not the value put";
  if (it % 3 == 0 && ((w->rc = kvt_tier_del(w->tier, &own)) != 0 ||
                      kvt_tier_query(w->tier, &own, &n) != KVT_ENOTFOUND))
    return "del own key, then query: still there";
  if ((w->rc = kvt_tier_put(w->tier, &shared, val, len)) != 0)
    return "put shared key";
  if ((w->rc = kvt_tier_get(w->tier, &shared, got, W_MAX, &n)) != 0 || !value_whole(got, n, val))
    return "get shared key: not one whole value";
  return NULL;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  uint8_t *val = malloc(W_MAX), *got = malloc(W_MAX);
  uint64_t rng = 0x1234567u + w->id;
  w->failed = val && got ? NULL : "out of memory";
  for (uint32_t it = 0; it < W_ITERS && !w->failed; it++) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    w->failed = worker_step(w, it, W_HEAD + rng % (W_MAX - W_HEAD + 1), val, got);
  }
  free(val);
  free(got);
  return NULL;
}

static void test_blocking_helpers_from_8_threads_keep_values_whole(void **state) {
  fixture *f = *state;
  worker w[W_THREADS];
  pthread_t th[W_THREADS];
  for (uint32_t i = 0; i < W_THREADS; i++) {
    w[i].tier = f->tier;
    w[i].id = i;
    assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < W_THREADS; i++)
    assert_int_equal(pthread_join(th[i], NULL), 0);
  for (int i = 0; i < W_THREADS; i++)
    if (w[i].failed)
      fail_msg("thread %d: %s (%s)", i, w[i].failed, kvt_err_name(w[i].rc));
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(f->tier, &s), 0);
  assert_int_equal(s.puts, 2u * W_THREADS * W_ITERS);
  assert_int_equal(s.in_flight, 0);
}

/* ---- stats and list ---- */

static void test_stats_count_the_operations_done(void **state) {
  fixture *f = *state;
  kvt_tier_stats s;
  memset(&s, 0xAB, sizeof(s));
  s.struct_size = 0; /* the full struct */
  assert_int_equal(kvt_tier_stats_get(f->tier, &s), 0);
  assert_int_equal(s.struct_size, sizeof(s));
  assert_int_equal(s.puts + s.gets + s.dels + s.queries + s.hits + s.misses, 0);
  assert_int_equal(s.items + s.bytes_in + s.bytes_out + s.errors + s.in_flight, 0);
  const kvt_key a = key_of(12, 0), b = key_of(12, 1), c = key_of(12, 2), none = key_of(12, 3);
  uint8_t val[3000], got[3000];
  uint64_t len;
  fill(val, sizeof(val), 12);
  assert_int_equal(kvt_tier_put(f->tier, &a, val, 100), 0);
  assert_int_equal(kvt_tier_put(f->tier, &b, val, 3000), 0);
  assert_int_equal(kvt_tier_put(f->tier, &c, val, 1), 0);
  assert_int_equal(kvt_tier_get(f->tier, &a, got, sizeof(got), &len), 0);
  assert_int_equal(kvt_tier_get(f->tier, &b, got, sizeof(got), &len), 0);
  assert_int_equal(kvt_tier_get(f->tier, &none, got, sizeof(got), &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(f->tier, &a, &len), 0);
  assert_int_equal(kvt_tier_del(f->tier, &c), 0);
  s.struct_size = sizeof(s);
  assert_int_equal(kvt_tier_stats_get(f->tier, &s), 0);
  const struct {
    const char *name;
    uint64_t got, want;
  } n[] = {{"puts", s.puts, 3},
           {"gets", s.gets, 3},
           {"hits", s.hits, 2},
           {"misses", s.misses, 1},
           {"queries", s.queries, 1},
           {"dels", s.dels, 1},
           {"errors", s.errors, 0},
           {"bytes_in", s.bytes_in, 3101},
           {"bytes_out", s.bytes_out, 3100},
           {"items", s.items, 2},
           {"in_flight", s.in_flight, 0}};
  for (size_t i = 0; i < sizeof(n) / sizeof(n[0]); i++)
    if (n[i].got != n[i].want)
      fail_msg("%s: %llu, want %llu", n[i].name, (unsigned long long)n[i].got,
               (unsigned long long)n[i].want);
  assert_true(s.used >= 3100 && s.used <= s.capacity);
  /* An older caller's shorter struct: nothing written past it. */
  memset(&s, 0xAB, sizeof(s));
  s.struct_size = offsetof(kvt_tier_stats, puts);
  assert_int_equal(kvt_tier_stats_get(f->tier, &s), 0);
  assert_int_equal(s.struct_size, offsetof(kvt_tier_stats, puts));
  assert_int_equal(s.items, 2);
  for (size_t i = offsetof(kvt_tier_stats, puts); i < sizeof(s); i++)
    assert_int_equal(((const uint8_t *)&s)[i], 0xAB);
}

typedef struct listing {
  int count[64]; /* times each id was listed */
  int calls, stop_at, bad;
} listing;

static int list_cb(void *opaque, const kvt_key *key, uint64_t len) {
  listing *l = opaque;
  uint32_t space, id;
  memcpy(&space, key->bytes, 4);
  memcpy(&id, key->bytes + 8, 4);
  if (space != 13 || id >= 64 || len != id + 1u)
    l->bad++;
  else
    l->count[id]++;
  return ++l->calls == l->stop_at ? 7 : 0;
}

static void test_list_returns_exactly_the_stored_keys(void **state) {
  fixture *f = *state;
  uint8_t val[64] = {0};
  for (uint32_t i = 0; i < 50; i++) {
    const kvt_key k = key_of(13, i);
    assert_int_equal(kvt_tier_put(f->tier, &k, val, i + 1), 0);
  }
  for (uint32_t i = 0; i < 50; i += 5) {
    const kvt_key k = key_of(13, i);
    assert_int_equal(kvt_tier_del(f->tier, &k), 0);
  }
  listing l = {.stop_at = -1};
  const int rc = kvt_tier_list(f->tier, list_cb, &l);
  if (rc == KVT_ENOTSUP)
    skip();
  assert_int_equal(rc, 0);
  assert_int_equal(l.bad, 0);
  assert_int_equal(l.calls, 40);
  for (uint32_t i = 0; i < 64; i++)
    assert_int_equal(l.count[i], i < 50 && i % 5 ? 1 : 0);
  listing stop = {.stop_at = 3};
  assert_int_equal(kvt_tier_list(f->tier, list_cb, &stop), 7);
  assert_int_equal(stop.calls, 3);
}

/* ---- tampering with the medium ---- */

/* A tier binds a value to its key and checks its bytes: what someone with
 * access to the medium changed or put there (tier_tamper.h) is a miss, never
 * a value with result 0. Rows whose medium this process cannot reach say why
 * and skip. Sizes: one part, and several where the row splits values. */
static const size_t tamper_sizes[] = {3000, 200 * 1024 + 5};

static void tamper_or_skip(const fixture *f) {
  const char *why = tamper_unsupported(f->spec);
  if (why) {
    printf("[  SKIP    ] %s: %s\n", f->spec, why);
    skip();
  }
}

static void test_a_value_planted_under_another_key_is_a_miss(void **state) {
  fixture *f = *state;
  tamper_or_skip(f);
  for (uint32_t i = 0; i < sizeof(tamper_sizes) / sizeof(tamper_sizes[0]); i++) {
    const size_t n = tamper_sizes[i];
    const kvt_key a = key_of(15, 3 * i), b = key_of(15, 3 * i + 1), never = key_of(15, 3 * i + 2);
    uint8_t *va = filled(n, 150 + i), *vb = filled(n, 160 + i), *got = malloc(n);
    assert_non_null(got);
    uint64_t len = 0;
    assert_int_equal(kvt_tier_put(f->tier, &a, va, n), 0);
    assert_int_equal(kvt_tier_put(f->tier, &b, vb, n), 0);
    assert_int_equal(tamper_plant(f->spec, &a, &b), 0);     /* over a value of the same length */
    assert_int_equal(tamper_plant(f->spec, &a, &never), 0); /* where there was none */
    const int rb = kvt_tier_get(f->tier, &b, got, n, &len);
    if (rb != KVT_ENOTFOUND)
      fail_msg("%zu bytes: get of b holding a's value: %s%s", n, kvt_err_name(rb),
               rb == 0 && memcmp(got, va, n) == 0 ? " with a's bytes" : "");
    const int rn = kvt_tier_get(f->tier, &never, got, n, &len);
    if (rn != KVT_ENOTFOUND)
      fail_msg("%zu bytes: get of a key never put: %s", n, kvt_err_name(rn));
    assert_int_equal(kvt_tier_query(f->tier, &never, &len), KVT_ENOTFOUND);
    assert_int_equal(kvt_tier_get(f->tier, &a, got, n, &len), 0); /* the original stays */
    assert_int_equal(len, n);
    assert_memory_equal(got, va, n);
    assert_int_equal(kvt_tier_put(f->tier, &b, vb, n), 0); /* and b can be put again */
    assert_int_equal(kvt_tier_get(f->tier, &b, got, n, &len), 0);
    assert_memory_equal(got, vb, n);
    free(va);
    free(vb);
    free(got);
  }
}

/* Offsets of the bit flips in each stored object: header bytes (those past
 * the object's header fields are dropped), then the first, a middle and the
 * last byte of the data. */
static const uint64_t flip_at[] = {0, 4, 5, 8, 11, 15, 16, 20, 24, 28, 31, 32, 40, 47, 48, 55, 63};

/* Puts val under k, flips one bit and gets it: whether that was a miss.
 * Anything else is noted in `bad` ("object:byte=result"). */
static int flip_one(fixture *f, const kvt_key *k, const uint8_t *val, size_t n, int seg,
                    uint64_t off, uint8_t *got, char *bad, size_t cap) {
  tamper_seg segs[64];
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(f->tier, k, val, n), 0);
  assert_true(tamper_segments(f->spec, k, segs, 64) > seg);
  assert_int_equal(tamper_flip(f->spec, k, seg, off, (int)(off % 8)), 0);
  const int rc = kvt_tier_get(f->tier, k, got, n, &len);
  if (rc == KVT_ENOTFOUND)
    return 1;
  const size_t used = strlen(bad);
  snprintf(bad + used, cap - used, " %d:%llu=%s", seg, (unsigned long long)off,
           rc != 0               ? kvt_err_name(rc)
           : memcmp(got, val, n) ? "wrong bytes"
                                 : "OK");
  return 0;
}

static void test_a_bit_flipped_anywhere_in_a_stored_value_is_a_miss(void **state) {
  fixture *f = *state;
  tamper_or_skip(f);
  int failed = 0;
  for (uint32_t i = 0; i < sizeof(tamper_sizes) / sizeof(tamper_sizes[0]); i++) {
    const size_t n = tamper_sizes[i];
    const kvt_key k = key_of(16, i);
    uint8_t *val = filled(n, 170 + i), *got = malloc(n);
    tamper_seg segs[64];
    char bad[2048] = "";
    int flips = 0, missed = 0;
    assert_non_null(got);
    assert_int_equal(kvt_tier_put(f->tier, &k, val, n), 0);
    const int nsegs = tamper_segments(f->spec, &k, segs, 64);
    assert_true(nsegs >= 1);
    for (int s = 0; s < nsegs; s++) {
      for (size_t j = 0; j < sizeof(flip_at) / sizeof(flip_at[0]); j++)
        if (flip_at[j] < segs[s].fields)
          flips++, missed += flip_one(f, &k, val, n, s, flip_at[j], got, bad, sizeof(bad));
      const uint64_t d = segs[s].data, dn = segs[s].data_len;
      const uint64_t data_at[3] = {d, d + dn / 2, d + dn - 1};
      for (int j = 0; j < 3 && dn; j++)
        flips++, missed += flip_one(f, &k, val, n, s, data_at[j], got, bad, sizeof(bad));
    }
    if (missed != flips) {
      print_error("%zu bytes in %d object(s): %d of %d flips not a miss (object:byte=result):%s\n",
                  n, nsegs, flips - missed, flips, bad);
      failed = 1;
    }
    uint64_t len = 0; /* put again, it is whole */
    assert_int_equal(kvt_tier_put(f->tier, &k, val, n), 0);
    assert_int_equal(kvt_tier_get(f->tier, &k, got, n, &len), 0);
    assert_memory_equal(got, val, n);
    free(val);
    free(got);
  }
  assert_false(failed);
}

/* ---- malformed operations, spec ---- */

static void test_malformed_ops_are_rejected_with_einval(void **state) {
  fixture *f = *state;
  const kvt_key k = key_of(14, 0);
  uint8_t b[8];
  kvt_tier_op op, *one[1] = {&op};
  kvt_tier_op_init(&op, 0, &k, b, sizeof(b), 1);
  assert_int_equal(kvt_tier_submit(f->tier, one, 1), -EINVAL);
  kvt_tier_op_init(&op, KVT_TIER_QUERY + 1, &k, b, sizeof(b), 1);
  assert_int_equal(kvt_tier_submit(f->tier, one, 1), -EINVAL);
  kvt_tier_op_init(&op, KVT_TIER_PUT, &k, NULL, 5, 1);
  assert_int_equal(kvt_tier_submit(f->tier, one, 1), -EINVAL);
  kvt_tier_op_init(&op, KVT_TIER_GET, &k, NULL, 5, 1);
  assert_int_equal(kvt_tier_submit(f->tier, one, 1), -EINVAL);
  kvt_tier_op_init(&op, KVT_TIER_PUT, &k, b, sizeof(b), 1);
  op.flags = 1;
  assert_int_equal(kvt_tier_submit(f->tier, one, 1), -EINVAL);
  kvt_tier_op *none[1] = {NULL};
  assert_int_equal(kvt_tier_submit(f->tier, none, 1), -EINVAL);
  kvt_tier_op *done[4];
  assert_int_equal(kvt_tier_poll(f->tier, done, 4, 0), 0); /* none was accepted */
  uint64_t len = 0;
  assert_int_equal(kvt_tier_query(f->tier, &k, &len), KVT_ENOTFOUND);
}

static void test_bad_specs_fail_with_a_detail_naming_the_problem(void **state) {
  (void)state;
  static const struct {
    const char *spec, *names; /* the detail must contain names */
  } bad[] = {
      {"", ""},          {"nosuch:1GiB", "nosuch"}, {"dram", "dram"},         {"dram:", "dram"},
      {"dram:-5", "-5"}, {"dram:12XB", "12XB"},     {"dram:1GiB,x", "option 'x'"}};
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    kvt_tier *t = (kvt_tier *)&ctx; /* must stay untouched */
    const int rc = kvt_tier_open(ctx, bad[i].spec, &t);
    const char *detail = kvt_ctx_last_error(ctx);
    /* An unknown scheme must be KVT_ENOTSUP: the rows above skip on it. */
    const int unknown = strncmp(bad[i].spec, "nosuch", 6) == 0;
    if (unknown ? rc != KVT_ENOTSUP : rc != KVT_ESPEC && rc != -EINVAL)
      fail_msg("'%s': %s", bad[i].spec, kvt_err_name(rc));
    assert_ptr_equal(t, (kvt_tier *)&ctx);
    if (!detail[0] || !strstr(detail, bad[i].names))
      fail_msg("'%s': detail '%s' does not name '%s'", bad[i].spec, detail, bad[i].names);
  }
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open(ctx, NULL, &t), -EINVAL);
  assert_int_equal(kvt_tier_open(NULL, "dram:1MiB", &t), -EINVAL);
  assert_null(t);
  kvt_tier_close(NULL);
  kvt_ctx_destroy(ctx);
}

static void test_sizes_parse_with_binary_and_decimal_units(void **state) {
  (void)state;
  static const struct {
    const char *text;
    uint64_t want;
  } good[] = {{"4096", 4096},        {"7B", 7},          {"1K", 1024},
              {"2KiB", 2048},        {"3KB", 3000},      {"8GiB", 8ull << 30},
              {"512MB", 512000000},  {"1T", 1ull << 40}, {"2tb", 2000000000000ull},
              {"64mib", 64ull << 20}};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    uint64_t v = 0;
    assert_int_equal(kvt_parse_size(good[i].text, &v), 0);
    assert_int_equal(v, good[i].want);
  }
  static const char *const bad[] = {
      "",      "-5", "12XB", "GiB", " 5", "5 GiB", "0x10", "18446744073709551616", "17179869184GiB",
      "1.5GiB"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    uint64_t v = 42;
    if (kvt_parse_size(bad[i], &v) != -EINVAL)
      fail_msg("'%s' parsed as %llu", bad[i], (unsigned long long)v);
    assert_int_equal(v, 42);
  }
  assert_int_equal(kvt_parse_size(NULL, NULL), -EINVAL);
}

/* ---- secrets ---- */

/* The spec as kvt_tier_spec and messages show it (docs/TIERS.md), for the
 * rows' syntaxes: token= and password= values and the password of a URL's
 * userinfo as "***". */
static void shown_spec(const char *spec, char *out, size_t cap) {
  char tmp[512];
  snprintf(tmp, sizeof(tmp), "%s", spec);
  const char *slashes = strstr(tmp, "://"), *q = strchr(tmp, '?');
  const char *at =
      slashes ? memchr(slashes, '@', (size_t)((q ? q : tmp + strlen(tmp)) - slashes)) : NULL;
  size_t n = 0;
  if (at) { /* USER:PASSWORD@ -> USER:***@ */
    const char *user = slashes + 3, *colon = memchr(user, ':', (size_t)(at - user));
    n = (size_t)snprintf(out, cap, "%.*s***", (int)((colon ? colon + 1 : user) - tmp), tmp);
  }
  for (const char *p = at ? at : tmp; *p && n + 1 < cap;) {
    const int secret = (p[0] == '?' || p[0] == '&') &&
                       (strncmp(p + 1, "token=", 6) == 0 || strncmp(p + 1, "password=", 9) == 0);
    if (!secret) {
      out[n++] = *p++;
      continue;
    }
    const size_t name = (size_t)(strchr(p, '=') + 1 - p);
    n += (size_t)snprintf(out + n, cap - n, "%.*s***", (int)name, p);
    p += name + strcspn(p + name, "&");
  }
  out[n < cap ? n : cap - 1] = '\0';
}

static void test_secrets_in_specs_are_shown_as_stars(void **state) {
  (void)state;
  static const struct {
    const char *spec, *shown;
  } cases[] = {
      {"redis://:s3cret@127.0.0.1:6379?ns=a", "redis://:***@127.0.0.1:6379?ns=a"},
      {"redis://alice:w0nder%25land@h:1/2?ns=x", "redis://alice:***@h:1/2?ns=x"},
      {"redis://s3cret@h:1", "redis://***@h:1"},
      {"redis+cluster://u:p@a:1,b:2?ttl=5", "redis+cluster://u:***@a:1,b:2?ttl=5"},
      {"redis://:a@b/c@h:1/3", "redis://:***@h:1/3"},     /* '@' and '/' in the password */
      {"redis://:a?b@h:1?ns=n", "redis://:***@h:1?ns=n"}, /* an unescaped '?' */
      {"redis://h:1?password=pw&ns=n", "redis://h:1?password=***&ns=n"},
      {"fabric://h:1?tenant=t&token=tok&depth=4", "fabric://h:1?tenant=t&token=***&depth=4"},
      {"fabric://h:1?token=a@b", "fabric://h:1?token=***"},
      {"trace@fault:op=get,nth=1,mode=fail@redis://:pw@h:1",
       "trace@fault:op=get,nth=1,mode=fail@redis://:***@h:1"},
      {"dram:1GiB;redis://:pw@h:1;fabric://h:2?token=t",
       "dram:1GiB;redis://:***@h:1;fabric://h:2?token=***"},
      {"//u:pw@h:1?ns=a", "//u:***@h:1?ns=a"}, /* a backend's ARGS */
      {"nvme:/srv/a@b:1GiB", "nvme:/srv/a@b:1GiB"},
      {"dram:64MiB", "dram:64MiB"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char got[256];
    const size_t n = kvt_spec_redact(got, sizeof(got), cases[i].spec);
    if (strcmp(got, cases[i].shown) != 0 || n != strlen(cases[i].shown))
      fail_msg("'%s' shown as '%s' (%zu), want '%s'", cases[i].spec, got, n, cases[i].shown);
  }
  char small[8];
  assert_int_equal(kvt_spec_redact(small, sizeof(small), "redis://:pw@h:1"), 16);
  assert_string_equal(small, "redis:/"); /* cut, terminated */
  assert_int_equal(kvt_spec_redact(NULL, 0, "fabric://h:1?token=t"), 22);
}

typedef struct loglines {
  char all[8192];
} loglines;

static void collect_log(void *opaque, int level, const char *msg) {
  loglines *l = opaque;
  (void)level;
  const size_t n = strlen(l->all);
  snprintf(l->all + n, sizeof(l->all) - n, "%s\n", msg);
}

/* A spec's password or token is in no error detail and no log line, and
 * kvt_tier_spec of a tier that opened shows "***" (the rows: fabric's
 * token=). No server is needed: these opens fail. */
static void test_a_failed_open_shows_no_secret_in_its_detail_or_logs(void **state) {
  (void)state;
  static const char *const specs[] = {
      "redis://:S3CRET-1@127.0.0.1:1",
      "redis://u:S3CRET-1@127.0.0.1:1?bogus=1",
      "redis://:S3CRET-1@127.0.0.1:1/x",
      "redis://:S3CRET-1@127.0.0.1:99999",
      "redis://:S3CRET-1@127.0.0.1:1,h:2",
      "redis://:S3CRET-1@@",
      "redis::S3CRET-1@127.0.0.1:1",
      "redis+cluster://:S3CRET-1@127.0.0.1:1/3",
      "fabric://127.0.0.1:1?token=S3CRET-1&timeout_ms=200",
      "fabric:127.0.0.1:1?token=S3CRET-1",
      "fabric://127.0.0.1:1?token=S3CRET-1&depth=0",
      "fault:@redis://:S3CRET-1@127.0.0.1:1",
      "trace@redis://:S3CRET-1@127.0.0.1:1?ttl=x",
      "nosuch://:S3CRET-1@h:1",
      "dram:1MiB;;redis://:S3CRET-1@127.0.0.1:1",
  };
  for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
    static loglines logs;
    logs.all[0] = '\0';
    kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
    cfg.log = collect_log;
    cfg.log_opaque = &logs;
    cfg.log_level = KVT_LOG_DEBUG;
    kvt_ctx *ctx = NULL;
    assert_int_equal(kvt_ctx_create(&cfg, &ctx), 0);
    int rc;
    if (strchr(specs[i], ';')) { /* a list: the cache's messages */
      kvt_cache_config cc = KVT_CACHE_CONFIG_INIT;
      kvt_cache *c = NULL;
      cc.tiers = specs[i];
      rc = kvt_cache_open(ctx, &cc, &c);
      kvt_cache_close(c);
    } else {
      kvt_tier *t = NULL;
      rc = kvt_tier_open(ctx, specs[i], &t);
      kvt_tier_close(t);
    }
    const char *detail = kvt_ctx_last_error(ctx);
    if (rc == 0 || !detail[0] || strstr(detail, "S3CRET") || strstr(logs.all, "S3CRET"))
      fail_msg("'%s': %s, detail '%s', log '%s'", specs[i], kvt_err_name(rc), detail, logs.all);
    kvt_ctx_destroy(ctx);
  }
}

/* ---- traits ---- */

/* What a spec's backend must declare: decorators (trace@, fault:RULES@)
 * answer for the tier they wrap. */
static uint32_t traits_expected(const char *spec) {
  for (;;) {
    if (strncmp(spec, "trace@", 6) == 0)
      spec += 6;
    else if (strncmp(spec, "fault:", 6) == 0 && strchr(spec, '@'))
      spec = strchr(spec, '@') + 1;
    else
      break;
  }
  const uint32_t remote = KVT_TIER_PERSISTENT | KVT_TIER_SHARED | KVT_TIER_REMOTE;
  static const struct {
    const char *prefix;
    uint32_t traits;
  } want[] = {{"dram:", KVT_TIER_HOST_MEMORY}, {"nvme:", KVT_TIER_PERSISTENT},
              {"hbm:", KVT_TIER_DEVICE},       {"redis://", 0},
              {"redis+cluster://", 0},         {"fabric://", 0}};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
    if (strncmp(spec, want[i].prefix, strlen(want[i].prefix)) == 0)
      return want[i].traits ? want[i].traits : remote;
  fail_msg("no traits known for the row '%s'", spec);
  return 0;
}

static void test_traits_are_those_its_backend_declares(void **state) {
  fixture *f = *state;
  assert_int_equal(kvt_tier_traits(f->tier), traits_expected(f->spec));
}

static void test_traits_of_null_are_none(void **state) {
  (void)state;
  assert_int_equal(kvt_tier_traits(NULL), 0);
}

static int nop_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **st) {
  (void)ctx, (void)args, (void)tier;
  *st = NULL;
  return 0;
}
static void nop_close(void *st) {
  (void)st;
}
static int nop_submit(void *st, kvt_tier_op *op) {
  (void)st, (void)op;
  return -ENOTSUP; /* nothing is ever submitted here */
}
static uint32_t nop_traits_of(void *st) {
  (void)st;
  return KVT_TIER_SHARED;
}

/* An application's backend: traits from its table, from traits_of when set,
 * and none from a table of an older size that ends before them. */
static void test_backend_traits_come_from_its_table_and_its_size(void **state) {
  (void)state;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  kvt_tier_backend be = {.abi_version = KVT_TIER_ABI_VERSION,
                         .struct_size = sizeof(kvt_tier_backend),
                         .scheme = "nop",
                         .open = nop_open,
                         .close = nop_close,
                         .submit = nop_submit,
                         .traits = KVT_TIER_PERSISTENT | KVT_TIER_REMOTE};
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open_backend(ctx, &be, "", &t), 0);
  assert_int_equal(kvt_tier_traits(t), KVT_TIER_PERSISTENT | KVT_TIER_REMOTE);
  kvt_tier_close(t);
  be.traits_of = nop_traits_of;
  assert_int_equal(kvt_tier_open_backend(ctx, &be, "", &t), 0);
  assert_int_equal(kvt_tier_traits(t), KVT_TIER_SHARED);
  kvt_tier_close(t);
  /* 0.2's table: traits and traits_of lie past its struct_size. */
  be.struct_size = (uint32_t)offsetof(kvt_tier_backend, traits);
  assert_int_equal(kvt_tier_open_backend(ctx, &be, "", &t), 0);
  assert_int_equal(kvt_tier_traits(t), 0);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

/* trace@ and fault:@ over nvme: the rows wrap dram only. */
static void test_decorators_answer_for_the_tier_they_wrap(void **state) {
  (void)state;
  fixture *f = fixture_new("trace@fault:op=any,every=1000000,mode=fail@nvme:{tmpdir}:1MiB");
  assert_non_null(f);
  assert_int_equal(kvt_tier_open(f->ctx, f->spec, &f->tier), 0);
  assert_int_equal(kvt_tier_traits(f->tier), KVT_TIER_PERSISTENT);
  fixture_free(f);
}

/* The hbm tier is not a conformance row (its values live in device memory):
 * its traits are checked where CUDA and a device are there. */
static void test_hbm_tier_is_device_memory(void **state) {
  (void)state;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  kvt_tier *t = NULL;
  const int rc = kvt_tier_open(ctx, "hbm:0:1MiB", &t);
  if (rc) {
    printf("[  SKIP    ] hbm:0:1MiB: %s: %s\n", kvt_err_name(rc), kvt_ctx_last_error(ctx));
    kvt_ctx_destroy(ctx);
    skip();
  }
  assert_int_equal(kvt_tier_traits(t), traits_expected("hbm:0:1MiB"));
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

/* Whether the row's scheme is built in: KVT_ENOTSUP means skip the row. */
static int row_built(const tier_row *row) {
  fixture *f = fixture_new(row->spec);
  if (!f)
    return 1; /* let the tests report it */
  const int rc = kvt_tier_open(f->ctx, f->spec, &f->tier);
  if (rc == KVT_ENOTSUP)
    printf("[  SKIP    ] %s: %s\n", row->spec, kvt_ctx_last_error(f->ctx));
  fflush(stdout);
  fixture_free(f);
  return rc != KVT_ENOTSUP;
}

#define ROW_TEST(fn) cmocka_unit_test_prestate_setup_teardown(fn, row_setup, row_teardown, row)

enum { MAX_ENV_ROWS = 16 };

int main(void) {
  int failed = 0, rows_run = 0;
  tier_row *rows = tier_rows;
  size_t n_rows = sizeof(tier_rows) / sizeof(tier_rows[0]);
  static tier_row env_rows[MAX_ENV_ROWS];
  static char env_copy[4096];
  const char *env = getenv("KVT_CONFORMANCE_SPECS");
  if (env && *env) {
    if (strlen(env) >= sizeof(env_copy)) {
      fprintf(stderr, "KVT_CONFORMANCE_SPECS is longer than %zu bytes\n", sizeof(env_copy) - 1);
      return 1;
    }
    strcpy(env_copy, env);
    n_rows = 0;
    char *save = NULL;
    for (char *tok = strtok_r(env_copy, "|", &save); tok && n_rows < MAX_ENV_ROWS;
         tok = strtok_r(NULL, "|", &save))
      env_rows[n_rows++].spec = tok;
    rows = env_rows;
  }
  for (size_t i = 0; i < n_rows; i++) {
    tier_row *row = &rows[i];
    if (!row_built(row))
      continue;
    rows_run++;
    printf("[ TIER     ] %s\n", row->spec);
    fflush(stdout);
    const struct CMUnitTest tests[] = {
        ROW_TEST(test_put_get_round_trips_bytes_exactly),
        ROW_TEST(test_fresh_tier_reports_its_spec_and_misses_every_key),
        ROW_TEST(test_overwrite_returns_the_new_value_and_length),
        ROW_TEST(test_del_then_get_misses),
        ROW_TEST(test_get_into_small_buffer_is_enobufs_with_length),
        ROW_TEST(test_full_tier_refuses_put_with_enospc_and_recovers_after_del),
        ROW_TEST(test_256_ops_in_one_submit_complete_exactly_once),
        ROW_TEST(test_close_with_ops_in_flight_neither_crashes_nor_leaks),
        ROW_TEST(test_blocking_helpers_from_8_threads_keep_values_whole),
        ROW_TEST(test_stats_count_the_operations_done),
        ROW_TEST(test_list_returns_exactly_the_stored_keys),
        ROW_TEST(test_a_value_planted_under_another_key_is_a_miss),
        ROW_TEST(test_a_bit_flipped_anywhere_in_a_stored_value_is_a_miss),
        ROW_TEST(test_malformed_ops_are_rejected_with_einval),
        ROW_TEST(test_traits_are_those_its_backend_declares),
    };
    failed += cmocka_run_group_tests_name(row->spec, tests, NULL, NULL);
  }
  const struct CMUnitTest spec_tests[] = {
      cmocka_unit_test(test_bad_specs_fail_with_a_detail_naming_the_problem),
      cmocka_unit_test(test_sizes_parse_with_binary_and_decimal_units),
      cmocka_unit_test(test_secrets_in_specs_are_shown_as_stars),
      cmocka_unit_test(test_a_failed_open_shows_no_secret_in_its_detail_or_logs),
      cmocka_unit_test(test_traits_of_null_are_none),
      cmocka_unit_test(test_backend_traits_come_from_its_table_and_its_size),
      cmocka_unit_test(test_decorators_answer_for_the_tier_they_wrap),
      cmocka_unit_test(test_hbm_tier_is_device_memory),
  };
  failed += cmocka_run_group_tests_name("tier specs", spec_tests, NULL, NULL);
  if (rows_run == 0 && failed == 0)
    return 77;
  return failed ? 1 : 0;
}
