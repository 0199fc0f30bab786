/* tests/test_tier_nvme_data.c - the nvme tier's data path: GET straight into
 * an aligned caller buffer and through the pool for any other buffer, PUT
 * from aligned and unaligned buffers writing the same file, payloads larger
 * than a pool buffer (the slow path), more operations than requests or pool
 * buffers (they queue, none is refused), many threads submitting and
 * polling at QD 64, GETs racing replacing PUTs (old or new value, never a
 * mix), nothing left allocated after close, a writer killed with many PUTs
 * in flight (every acknowledged value intact), operations of threads that
 * exited before they completed (io_uring cancels them), and the files of deleted
 * values reused by later PUTs of their size. Each test runs on both
 * engines. Restart and torn files are in test_tier_nvme.c. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvtier.h"
#include "tier_test_util.h"

#define KiB 1024u
#define MiB (1024u * 1024u)

typedef struct fx {
  const char *engine; /* "" or ",engine=pread" */
  char dir[256];
  atomic_long live; /* allocations outstanding through ctx */
  long base;
  kvt_ctx *ctx;
} fx;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static int setup(void **state, const char *engine) {
  fx *f = calloc(1, sizeof(*f));
  if (!f)
    return -1;
  f->engine = engine;
  const char *base = getenv("TMPDIR");
  snprintf(f->dir, sizeof(f->dir), "%s/kvt_nvd_XXXXXX", base ? base : "/tmp");
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.allocator = (kvt_allocator){counting_alloc, counting_free, &f->live, {0, 0}};
  if (!mkdtemp(f->dir) || kvt_ctx_create(&cfg, &f->ctx) != 0) {
    free(f);
    return -1;
  }
  f->base = atomic_load(&f->live);
  *state = f;
  return 0;
}
static int setup_uring(void **state) { return setup(state, ""); }
static int setup_pread(void **state) { return setup(state, ",engine=pread"); }

static int teardown(void **state) {
  fx *f = *state;
  kvt_ctx_destroy(f->ctx);
  nftw(f->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(f);
  return 0;
}

static kvt_tier *open_tier(fx *f, const char *opts) {
  char spec[512];
  snprintf(spec, sizeof(spec), "nvme:%s:1GiB%s%s", f->dir, opts, f->engine);
  kvt_tier *t = NULL;
  const int rc = kvt_tier_open(f->ctx, spec, &t);
  if (rc != 0)
    fail_msg("open %s: %s: %s", spec, kvt_err_name(rc), kvt_ctx_last_error(f->ctx));
  return t;
}

/* Closes t and checks that every allocation it made was given back. */
static void close_tier(fx *f, kvt_tier *t) {
  kvt_tier_close(t);
  assert_int_equal(atomic_load(&f->live), f->base);
}

static kvt_key key_of(uint32_t id) {
  kvt_key k;
  memset(&k, 0x5C, sizeof(k));
  memcpy(k.bytes, &id, sizeof(id));
  return k;
}

static uint8_t *aligned_buf(size_t n) {
  void *p = NULL;
  assert_int_equal(posix_memalign(&p, 4096, n ? n : 1), 0);
  return p;
}

/* Sizes around the block and pool-buffer edges. */
static const size_t sizes[] = {0, 1, 4095, 4096, 4097, 65536 + 7, MiB - 4096, MiB, MiB + 4096 + 3};

/* ---- tests ---- */

static void test_get_into_aligned_and_unaligned_buffers_round_trips(void **state) {
  fx *f = *state;
  kvt_tier *t = open_tier(f, "");
  const size_t n_sizes = sizeof(sizes) / sizeof(sizes[0]);
  const size_t room = MiB + 3 * 4096;
  uint8_t *want = malloc(room), *buf = aligned_buf(room + 4096);
  assert_non_null(want);
  for (uint32_t i = 0; i < n_sizes; i++) {
    fill(want, sizes[i], i);
    const kvt_key k = key_of(i);
    assert_int_equal(kvt_tier_put(t, &k, want, sizes[i]), 0);
  }
  for (uint32_t i = 0; i < n_sizes; i++) {
    const size_t n = sizes[i], padded = (n + 4095) & ~(size_t)4095;
    fill(want, n, i);
    const kvt_key k = key_of(i);
    /* aligned, padded room: in place; aligned, exact room: the pool; and
     * unaligned: the pool, or the slow path above a pool buffer. */
    const struct {
      size_t at, cap;
    } ways[] = {{0, padded}, {0, n}, {1, n}, {4096 - 8, n + 1}};
    for (size_t w = 0; w < sizeof(ways) / sizeof(ways[0]); w++) {
      memset(buf, 0xEE, room + 4096);
      uint64_t len = 0;
      assert_int_equal(kvt_tier_get(t, &k, buf + ways[w].at, ways[w].cap, &len), 0);
      assert_int_equal(len, n);
      assert_memory_equal(buf + ways[w].at, want, n);
      if (ways[w].at != 0 || ways[w].cap < padded) { /* not in place: only the value copied */
        if (buf[ways[w].at + n] != 0xEE)
          fail_msg("size %zu, way %zu: a byte past the value was written", n, w);
      }
    }
    if (n) { /* one byte short: the length comes back */
      uint64_t len = 0;
      assert_int_equal(kvt_tier_get(t, &k, buf, n - 1, &len), KVT_ENOBUFS);
      assert_int_equal(len, n);
    }
  }
  free(want);
  free(buf);
  close_tier(f, t);
}

/* The file a key's value lives in, whole. */
static uint8_t *read_file(const fx *f, uint32_t id, size_t *size) {
  const kvt_key k = key_of(id);
  char path[512], hex[33];
  for (int i = 0; i < 16; i++)
    snprintf(hex + 2 * i, 3, "%02x", k.bytes[i]);
  snprintf(path, sizeof(path), "%s/%.2s/%s", f->dir, hex, hex);
  const int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  uint8_t *p = malloc((size_t)st.st_size);
  assert_non_null(p);
  assert_int_equal(pread(fd, p, (size_t)st.st_size, 0), st.st_size);
  close(fd);
  *size = (size_t)st.st_size;
  return p;
}

static void test_put_from_aligned_and_unaligned_buffers_writes_the_same_payload(void **state) {
  fx *f = *state;
  kvt_tier *t = open_tier(f, "");
  const size_t n = 3 * 4096 + 100;
  uint8_t *a = aligned_buf(n + 4096);
  fill(a, n, 7);
  const kvt_key k1 = key_of(1), k2 = key_of(2);
  assert_int_equal(kvt_tier_put(t, &k1, a, n), 0);
  uint8_t *u = malloc(n + 1);
  memcpy(u + 1, a, n);
  assert_int_equal(kvt_tier_put(t, &k2, u + 1, n), 0);
  kvt_tier_close(t);
  size_t s1, s2;
  uint8_t *f1 = read_file(f, 1, &s1), *f2 = read_file(f, 2, &s2);
  assert_int_equal(s1, 4096 + 4 * 4096);
  assert_int_equal(s2, s1);
  assert_memory_equal(f1 + 4096, f2 + 4096, s1 - 4096); /* payload and zero padding */
  assert_memory_equal(f1 + 4096, a, n);
  for (size_t i = 4096 + n; i < s1; i++)
    assert_int_equal(f1[i], 0);
  free(f1), free(f2), free(u), free(a);
  assert_int_equal(atomic_load(&f->live), f->base);
}

static void test_payload_larger_than_a_pool_buffer_round_trips_unaligned(void **state) {
  fx *f = *state;
  kvt_tier *t = open_tier(f, "");
  const size_t n = 3 * MiB + 5;
  uint8_t *v = malloc(n + 1), *got = malloc(n + 1);
  assert_true(v && got);
  fill(v + 1, n, 99);
  const kvt_key k = key_of(9);
  assert_int_equal(kvt_tier_put(t, &k, v + 1, n), 0);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(t, &k, got + 1, n, &len), 0);
  assert_int_equal(len, n);
  assert_memory_equal(got + 1, v + 1, n);
  free(v), free(got);
  close_tier(f, t);
}

/* Submits all ops at once (the tier must take them all) and polls until
 * they completed; every result must be 0. */
static void run_all(kvt_tier *t, kvt_tier_op *ops, size_t n) {
  kvt_tier_op **ptr = calloc(n, sizeof(*ptr)), **done = calloc(n, sizeof(*done));
  assert_true(ptr && done);
  for (size_t i = 0; i < n; i++)
    ptr[i] = &ops[i];
  assert_int_equal(kvt_tier_submit(t, ptr, n), (int)n);
  size_t got = 0;
  while (got < n) {
    const int k = kvt_tier_poll(t, done, n, -1);
    assert_true(k > 0);
    for (int i = 0; i < k; i++)
      assert_int_equal(done[i]->result, 0);
    got += (size_t)k;
  }
  free(ptr);
  free(done);
}

static void test_more_ops_than_requests_and_pool_buffers_queue_and_complete(void **state) {
  fx *f = *state;
  kvt_tier *t = open_tier(f, ",qd=2"); /* 2 requests; 8 pool buffers */
  enum { N = 40 };
  const size_t n = 100 * KiB + 1; /* unaligned below: each PUT and GET wants a pool buffer */
  uint8_t *src = malloc(N * n + 1), *dst = malloc(N * n + 1);
  assert_true(src && dst);
  kvt_tier_op ops[N];
  for (uint32_t i = 0; i < N; i++) {
    fill(src + 1 + i * n, n, i);
    const kvt_key k = key_of(i);
    kvt_tier_op_init(&ops[i], KVT_TIER_PUT, &k, src + 1 + i * n, n, i);
  }
  run_all(t, ops, N);
  for (uint32_t i = 0; i < N; i++) {
    const kvt_key k = key_of(i);
    kvt_tier_op_init(&ops[i], KVT_TIER_GET, &k, dst + 1 + i * n, n, i);
  }
  run_all(t, ops, N);
  for (uint32_t i = 0; i < N; i++)
    assert_int_equal(ops[i].out_len, n);
  assert_memory_equal(dst + 1, src + 1, N * n);
  free(src), free(dst);
  close_tier(f, t);
}

typedef struct worker {
  kvt_tier *t;
  uint32_t id;
  atomic_long *done; /* completions seen by all workers */
  long total;
  int failures;
} worker;

/* Each worker submits 64 operations (aligned and unaligned buffers, several
 * sizes) and then polls - completions may be any worker's - until all
 * workers' operations are done; then checks its own. */
static void *worker_main(void *arg) {
  worker *w = arg;
  enum { N = 64 };
  const size_t n = 48 * KiB + 4096;
  const size_t stride = n + 4096; /* GET buffers: every other one unaligned */
  uint8_t *src = aligned_buf(N * n), *dst = aligned_buf(N * stride);
  kvt_tier_op ops[N], *ptr[N], *done[N];
  for (int phase = 0; phase < 2; phase++) {
    for (uint32_t i = 0; i < N; i++) {
      const size_t len = i % 3 == 0 ? n : i % 3 == 1 ? n - 4096 - 17 : 4096;
      uint8_t *b = phase ? dst + i * stride + (i % 2) : src + i * n;
      if (phase == 0)
        fill(b, len, w->id * 1000 + i);
      const kvt_key k = key_of(w->id * 1000 + i);
      kvt_tier_op_init(&ops[i], phase ? KVT_TIER_GET : KVT_TIER_PUT, &k, b, phase ? n : len, i);
      ptr[i] = &ops[i];
    }
    if (kvt_tier_submit(w->t, ptr, N) != N)
      w->failures++;
    const long goal = w->total * (phase + 1);
    while (atomic_load(w->done) < goal) {
      const int k = kvt_tier_poll(w->t, done, N, 5);
      if (k > 0)
        atomic_fetch_add(w->done, k);
    }
    for (uint32_t i = 0; i < N; i++) {
      const size_t len = i % 3 == 0 ? n : i % 3 == 1 ? n - 4096 - 17 : 4096;
      if (ops[i].result != 0 || (phase && (ops[i].out_len != len ||
                                           memcmp(ops[i].buf, src + i * n, len) != 0)))
        w->failures++;
    }
  }
  free(src);
  free(dst);
  return NULL;
}

static void test_many_threads_submit_and_poll_at_qd64(void **state) {
  fx *f = *state;
  kvt_tier *t = open_tier(f, ",qd=64");
  enum { T = 8 };
  pthread_t th[T];
  worker w[T];
  atomic_long done = 0;
  for (uint32_t i = 0; i < T; i++) {
    w[i] = (worker){t, i + 1, &done, (long)T * 64, 0};
    assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(w[i].failures, 0);
  }
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.items, T * 64);
  assert_int_equal(s.hits, T * 64);
  assert_int_equal(s.in_flight, 0);
  close_tier(f, t);
}

typedef struct racer {
  kvt_tier *t;
  atomic_int *stop;
  int bad, hits;
} racer;

#define RACE_A 10000u
#define RACE_B (50000u + 4096u)

/* Replaces one key with value A or B (different sizes), over and over. */
static void *race_writer(void *arg) {
  racer *r = arg;
  uint8_t *a = malloc(RACE_A), *b = aligned_buf(RACE_B);
  fill(a, RACE_A, 1);
  fill(b, RACE_B, 2);
  const kvt_key k = key_of(77);
  for (int i = 0; i < 150; i++)
    if (kvt_tier_put(r->t, &k, i % 2 ? b : a, i % 2 ? RACE_B : RACE_A) != 0)
      r->bad++;
  atomic_store(r->stop, 1);
  free(a);
  free(b);
  return NULL;
}

/* Every GET returns all of A or all of B. */
static void *race_reader(void *arg) {
  racer *r = arg;
  uint8_t *a = malloc(RACE_A), *b = malloc(RACE_B), *got = aligned_buf(64 * KiB);
  fill(a, RACE_A, 1);
  fill(b, RACE_B, 2);
  const kvt_key k = key_of(77);
  while (!atomic_load(r->stop)) {
    uint64_t len = 0;
    const int rc = kvt_tier_get(r->t, &k, got, 64 * KiB, &len);
    if (rc == 0) {
      r->hits++;
      if (!(len == RACE_A && memcmp(got, a, RACE_A) == 0) &&
          !(len == RACE_B && memcmp(got, b, RACE_B) == 0))
        r->bad++;
    } else if (rc != KVT_ENOTFOUND) {
      r->bad++;
    }
  }
  free(a), free(b), free(got);
  return NULL;
}

static void test_gets_racing_replacing_puts_see_old_or_new_value_whole(void **state) {
  fx *f = *state;
  kvt_tier *t = open_tier(f, "");
  atomic_int stop = 0;
  racer rs[3];
  pthread_t th[3];
  for (int i = 0; i < 3; i++) {
    rs[i] = (racer){t, &stop, 0, 0};
    assert_int_equal(pthread_create(&th[i], NULL, i ? race_reader : race_writer, &rs[i]), 0);
  }
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(rs[i].bad, 0);
  }
  uint64_t len = 0;
  const kvt_key k = key_of(77);
  assert_int_equal(kvt_tier_query(t, &k, &len), 0);
  assert_int_equal(len, RACE_B); /* the last PUT won */
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.items, 1);
  assert_int_equal(s.used, 4096 + ((RACE_B + 4095) & ~4095u)); /* replaced files counted once */
  close_tier(f, t);
}

/* The child keeps 16 PUTs in flight and reports each acknowledged one. */
static void qd_writer_child(const fx *f, int wfd) {
  kvt_ctx *ctx = NULL;
  kvt_tier *t = NULL;
  char spec[512];
  snprintf(spec, sizeof(spec), "nvme:%s:1GiB,qd=16%s", f->dir, f->engine);
  if (kvt_ctx_create(NULL, &ctx) != 0 || kvt_tier_open(ctx, spec, &t) != 0)
    _exit(2);
  enum { QD = 16 };
  const size_t n = 64 * KiB + 3;
  uint8_t *v = malloc(QD * n);
  kvt_tier_op ops[QD], *one[1], *done[QD];
  uint32_t next = 0;
  for (uint32_t s = 0; s < QD; s++, next++) {
    fill(v + s * n, n, next);
    const kvt_key k = key_of(next);
    kvt_tier_op_init(&ops[s], KVT_TIER_PUT, &k, v + s * n, n, s);
    one[0] = &ops[s];
    if (kvt_tier_submit(t, one, 1) != 1)
      _exit(3);
  }
  for (;;) {
    const int got = kvt_tier_poll(t, done, QD, -1);
    for (int i = 0; i < got; i++) {
      uint32_t id;
      memcpy(&id, done[i]->key.bytes, sizeof(id));
      if (done[i]->result != 0 || write(wfd, &id, sizeof(id)) != sizeof(id))
        _exit(4);
      const uint32_t s = (uint32_t)done[i]->user_data;
      fill(v + s * n, n, next);
      const kvt_key k = key_of(next++);
      kvt_tier_op_init(&ops[s], KVT_TIER_PUT, &k, v + s * n, n, s);
      one[0] = &ops[s];
      if (kvt_tier_submit(t, one, 1) != 1)
        _exit(5);
    }
  }
}

static void test_killed_writer_at_qd16_leaves_acknowledged_values_intact(void **state) {
  fx *f = *state;
  int p[2];
  assert_int_equal(pipe(p), 0);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    qd_writer_child(f, p[1]);
  }
  close(p[1]);
  uint32_t id, n_acked = 0;
  static uint32_t acked[1 << 16];
  while (n_acked < 200 && read(p[0], &id, sizeof(id)) == sizeof(id))
    acked[n_acked++] = id;
  assert_int_equal(kill(pid, SIGKILL), 0);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
  while (n_acked < (1 << 16) && read(p[0], &id, sizeof(id)) == sizeof(id))
    acked[n_acked++] = id;
  close(p[0]);
  kvt_tier *t = open_tier(f, "");
  const size_t n = 64 * KiB + 3;
  uint8_t *want = malloc(n), *got = malloc(n);
  for (uint32_t i = 0; i < n_acked; i++) {
    const kvt_key k = key_of(acked[i]);
    uint64_t len = 0;
    fill(want, n, acked[i]);
    assert_int_equal(kvt_tier_get(t, &k, got, n, &len), 0);
    assert_int_equal(len, n);
    assert_memory_equal(got, want, n);
  }
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_true(s.items >= n_acked && s.items <= n_acked + 16); /* in flight: whole or absent */
  free(want), free(got);
  close_tier(f, t);
}

typedef struct leaver {
  kvt_tier *t;
  kvt_tier_op *ops;
  uint8_t *buf;
  size_t n;
  uint32_t first;
} leaver;

/* Submits 16 PUTs and exits at once: the kernel cancels what the thread
 * submitted when it exits (io_uring requests belong to their submitter). */
static void *leaver_main(void *arg) {
  leaver *l = arg;
  kvt_tier_op *ptr[16];
  for (uint32_t i = 0; i < 16; i++) {
    fill(l->buf + i * l->n, l->n, l->first + i);
    const kvt_key k = key_of(l->first + i);
    kvt_tier_op_init(&l->ops[i], KVT_TIER_PUT, &k, l->buf + i * l->n, l->n, i);
    ptr[i] = &l->ops[i];
  }
  if (kvt_tier_submit(l->t, ptr, 16) != 16)
    abort();
  return NULL;
}

static void test_ops_of_threads_that_exited_still_complete(void **state) {
  fx *f = *state;
  kvt_tier *t = open_tier(f, "");
  enum { T = 6 };
  const size_t n = 64 * KiB;
  uint8_t *buf = aligned_buf(T * 16 * n), *got = aligned_buf(n), *want = malloc(n);
  kvt_tier_op ops[T * 16], *done[T * 16];
  leaver l[T];
  for (uint32_t round = 0; round < 3; round++) {
    for (uint32_t i = 0; i < T; i++) {
      l[i] = (leaver){t, ops + i * 16, buf + i * 16 * n, n, round * 1000 + i * 16};
      pthread_t th;
      assert_int_equal(pthread_create(&th, NULL, leaver_main, &l[i]), 0);
      assert_int_equal(pthread_join(th, NULL), 0); /* gone before its PUTs completed */
    }
    int got_n = 0;
    while (got_n < T * 16) {
      const int k = kvt_tier_poll(t, done, T * 16, -1);
      assert_true(k > 0);
      for (int i = 0; i < k; i++)
        if (done[i]->result != 0)
          fail_msg("a PUT of an exited thread: %s", kvt_err_name(done[i]->result));
      got_n += k;
    }
    for (uint32_t i = 0; i < T * 16; i++) {
      const kvt_key k = key_of(round * 1000 + i);
      uint64_t len = 0;
      fill(want, n, round * 1000 + i);
      assert_int_equal(kvt_tier_get(t, &k, got, n, &len), 0);
      assert_memory_equal(got, want, n);
    }
  }
  free(buf), free(got), free(want);
  close_tier(f, t);
}

static ino_t inode_of(const fx *f, uint32_t id) {
  const kvt_key k = key_of(id);
  char path[512], hex[33];
  for (int i = 0; i < 16; i++)
    snprintf(hex + 2 * i, 3, "%02x", k.bytes[i]);
  snprintf(path, sizeof(path), "%s/%.2s/%s", f->dir, hex, hex);
  struct stat st;
  return stat(path, &st) == 0 ? st.st_ino : 0;
}

static int count_spares(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag;
  return strncmp(path + ftw->base, ".free-", 6) == 0; /* stops the walk at the first */
}

static void test_deleted_files_are_reused_by_puts_of_the_same_size(void **state) {
  fx *f = *state;
  kvt_tier *t = open_tier(f, "");
  const size_t n = 200 * KiB;
  uint8_t *v = aligned_buf(n), *got = aligned_buf(n);
  fill(v, n, 1);
  const kvt_key a = key_of(1), b = key_of(2), c = key_of(3);
  assert_int_equal(kvt_tier_put(t, &a, v, n), 0);
  const ino_t ino = inode_of(f, 1);
  assert_int_equal(kvt_tier_del(t, &a), 0);
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.used, 0); /* a spare is not a value */
  assert_int_equal(nftw(f->dir, count_spares, 16, FTW_PHYS), 1);
  fill(v, n, 2);
  assert_int_equal(kvt_tier_put(t, &b, v, n), 0); /* same size: the same file, rewritten */
  assert_int_equal(inode_of(f, 2), ino);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(t, &b, got, n, &len), 0);
  assert_memory_equal(got, v, n);
  assert_int_equal(kvt_tier_get(t, &a, got, n, &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_del(t, &b), 0);
  assert_int_equal(kvt_tier_put(t, &c, v, n / 2), 0); /* another size: a new file */
  assert_true(inode_of(f, 3) != ino);
  kvt_tier_close(t);
  assert_int_equal(nftw(f->dir, count_spares, 16, FTW_PHYS), 0); /* close removes spares */
  t = open_tier(f, "");
  assert_int_equal(kvt_tier_get(t, &c, got, n, &len), 0);
  assert_int_equal(len, n / 2);
  assert_memory_equal(got, v, n / 2);
  free(v), free(got);
  close_tier(f, t);
}

static void test_spares_give_way_when_the_capacity_is_needed(void **state) {
  fx *f = *state;
  char spec[512];
  snprintf(spec, sizeof(spec), "nvme:%s:1MiB%s", f->dir, f->engine);
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open(f->ctx, spec, &t), 0);
  static uint8_t v[700 * KiB];
  kvt_key k[3] = {key_of(1), key_of(2), key_of(3)};
  for (int i = 0; i < 3; i++)
    assert_int_equal(kvt_tier_put(t, &k[i], v, 300 * KiB), 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal(kvt_tier_del(t, &k[i]), 0); /* three spares of 300 KiB + 4 KiB */
  const kvt_key big = key_of(9);
  assert_int_equal(kvt_tier_put(t, &big, v, 700 * KiB), 0); /* fits once two are dropped */
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.used, 4096 + 700 * KiB);
  assert_int_equal(s.items, 1);
  close_tier(f, t);
}

#define BOTH(fn)                                                                                   \
  cmocka_unit_test_setup_teardown(fn, setup_uring, teardown),                                      \
      cmocka_unit_test_setup_teardown(fn, setup_pread, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      BOTH(test_get_into_aligned_and_unaligned_buffers_round_trips),
      BOTH(test_put_from_aligned_and_unaligned_buffers_writes_the_same_payload),
      BOTH(test_payload_larger_than_a_pool_buffer_round_trips_unaligned),
      BOTH(test_more_ops_than_requests_and_pool_buffers_queue_and_complete),
      BOTH(test_many_threads_submit_and_poll_at_qd64),
      BOTH(test_gets_racing_replacing_puts_see_old_or_new_value_whole),
      BOTH(test_killed_writer_at_qd16_leaves_acknowledged_values_intact),
      BOTH(test_ops_of_threads_that_exited_still_complete),
      BOTH(test_deleted_files_are_reused_by_puts_of_the_same_size),
      BOTH(test_spares_give_way_when_the_capacity_is_needed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
