/* tests/test_tier_redis.c - the redis:// tier against redis-server processes
 * this program starts on 127.0.0.1 (tests/fixtures/redis_fixture.h): the
 * whole tier conformance suite (test_tier_conformance run with
 * KVT_CONFORMANCE_SPECS), then what is particular to Redis: binary-safe
 * values, values split into parts, values failing a check (logged, left in
 * place), kvtier 0.3.0's values, namespaces, TTL, AUTH (password and ACL
 * user; the password shown as *** by the tier and `kvtier store`), a full
 * server, torn parts, a server killed and restarted under load
 * from several threads, and many clients at once; bad escapes in the
 * credentials of a spec; that `kvtier bench redis` runs, and that the
 * fixture forgets the servers it stopped. Failures of the connection and the
 * server are in test_tier_redis_faults.c, items and used in
 * test_tier_redis_accounting.c. Exits 77 when redis-server is not on PATH. */
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvtier.h"
#include "redis_fixture.h"
#include "tier_test_util.h"

/* Static, never on the stack: the fixture keeps pointers to every server it
 * started (rfx_all) and reads them again at exit. */
static rfx_server srv; /* shared by the tests that need nothing special */
static rfx_server aux; /* one test's own server, stopped by that test */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static kvt_key key_of(uint32_t space, uint32_t id) {
  kvt_key k;
  memset(&k, 0xA7, sizeof(k));
  memcpy(k.bytes, &space, 4);
  memcpy(k.bytes + 8, &id, 4);
  return k;
}

/* The Redis key the tier uses for k in namespace ns (tier_redis_ops.c), or
 * with part > 0 the pattern of that part's key (kvt:NS:{H}:GEN:pN, GEN the
 * generation of the PUT that wrote it). */
static void redis_key(char *out, size_t cap, const char *ns, const kvt_key *k, int part) {
  int n = snprintf(out, cap, "kvt:%s:{", ns);
  for (int i = 0; i < 16; i++)
    n += snprintf(out + n, cap - (size_t)n, "%02x", k->bytes[i]);
  n += snprintf(out + n, cap - (size_t)n, "}");
  if (part)
    snprintf(out + n, cap - (size_t)n, ":*:p%d", part);
}

/* The name of part `part` of k's value as stored now (exactly one). */
static void part_key(char *out, size_t cap, const char *ns, const kvt_key *k, int part) {
  char pattern[160];
  redis_key(pattern, sizeof(pattern), ns, k, part);
  redisReply *r = rfx_cmd(srv.port, "KEYS %s", pattern);
  assert_true(r && r->type == REDIS_REPLY_ARRAY && r->elements == 1);
  snprintf(out, cap, "%s", r->element[0]->str);
  freeReplyObject(r);
}

typedef struct logbuf {
  pthread_mutex_t mu;
  char last[512];
  int lines;
} logbuf;

static void log_cb(void *opaque, int level, const char *msg) {
  logbuf *l = opaque;
  (void)level;
  pthread_mutex_lock(&l->mu);
  snprintf(l->last, sizeof(l->last), "%s", msg);
  l->lines++;
  pthread_mutex_unlock(&l->mu);
}

static logbuf logs = {PTHREAD_MUTEX_INITIALIZER, "", 0};

static kvt_ctx *ctx_new(void) {
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.log = log_cb;
  cfg.log_opaque = &logs;
  cfg.log_level = KVT_LOG_INFO;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), 0);
  return ctx;
}

static kvt_tier *tier_open(kvt_ctx *ctx, const char *fmt, ...) {
  char spec[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(spec, sizeof(spec), fmt, ap);
  va_end(ap);
  kvt_tier *t = NULL;
  const int rc = kvt_tier_open(ctx, spec, &t);
  if (rc)
    fail_msg("open %s: %s: %s", spec, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  return t;
}

/* ---- conformance ---- */

static void test_conformance_suite_passes_against_redis_server(void **state) {
  (void)state;
  char specs[1024];
  /* {tmpdir} makes every test of the suite use a namespace of its own. */
  snprintf(specs, sizeof(specs),
           "redis://127.0.0.1:%d?ns={tmpdir}&capacity=32MiB|"
           "redis://127.0.0.1:%d/2?ns={tmpdir}&capacity=32MiB&part=64KiB&conns=2&pipeline=4",
           srv.port, srv.port);
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("KVT_CONFORMANCE_SPECS", specs, 1);
    execl(KVT_BINARY_DIR "/tests/test_tier_conformance", "test_tier_conformance", (char *)NULL);
    _exit(127);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- values ---- */

static void test_binary_values_with_nul_and_crlf_round_trip(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=bin", srv.port);
  static const char *const vals[] = {"\0\0\0", "\r\n", "$-1\r\n", "*3\r\n$3\r\nSET\r\n", "-ERR x\r\n",
                                     "+OK\r\n\0"};
  static const size_t lens[] = {3, 2, 5, 14, 8, 6};
  for (uint32_t i = 0; i < 6; i++) {
    const kvt_key k = key_of(1, i);
    char got[64];
    uint64_t len = 0;
    assert_int_equal(kvt_tier_put(t, &k, vals[i], lens[i]), 0);
    assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
    assert_int_equal(len, lens[i]);
    assert_memory_equal(got, vals[i], lens[i]);
  }
  uint8_t all[256];
  for (int i = 0; i < 256; i++)
    all[i] = (uint8_t)i;
  const kvt_key k = key_of(1, 99);
  uint8_t got[256];
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(t, &k, all, sizeof(all)), 0);
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_memory_equal(got, all, sizeof(all));
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static long count_keys(int port, const char *pattern) {
  redisReply *r = rfx_cmd(port, "KEYS %s", pattern);
  assert_non_null(r);
  const long n = r->type == REDIS_REPLY_ARRAY ? (long)r->elements : -1;
  freeReplyObject(r);
  return n;
}

static void test_value_above_part_size_splits_and_round_trips(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=split&part=4KiB", srv.port);
  const size_t n = 100 * 1024 + 3;
  uint8_t *val = malloc(n), *got = malloc(n);
  assert_true(val && got);
  fill(val, n, 7);
  const kvt_key k = key_of(2, 1);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(t, &k, val, n), 0);
  assert_int_equal(count_keys(srv.port, "kvt:split:*"), 26); /* 25 full parts + 3 bytes */
  assert_int_equal(kvt_tier_get(t, &k, got, n, &len), 0);
  assert_int_equal(len, n);
  assert_memory_equal(got, val, n);
  assert_int_equal(kvt_tier_get(t, &k, got, n - 1, &len), KVT_ENOBUFS);
  assert_int_equal(len, n);
  assert_int_equal(kvt_tier_put(t, &k, val, 5000), 0); /* shorter: the stale parts go */
  assert_int_equal(count_keys(srv.port, "kvt:split:*"), 2);
  assert_int_equal(kvt_tier_get(t, &k, got, n, &len), 0);
  assert_int_equal(len, 5000);
  assert_memory_equal(got, val, 5000);
  assert_int_equal(kvt_tier_del(t, &k), 0);
  assert_int_equal(count_keys(srv.port, "kvt:split:*"), 0);
  free(val);
  free(got);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

/* part= is a floor: a value that would need more than 1024 parts gets larger
 * ones, so one PUT never pipelines millions of commands. */
static void test_tiny_part_size_still_caps_the_part_count(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=cap&part=1KiB", srv.port);
  const size_t n = 3u << 20;
  uint8_t *val = malloc(n), *got = malloc(n);
  assert_true(val && got);
  fill(val, n, 8);
  const kvt_key k = key_of(2, 2);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(t, &k, val, n), 0);
  assert_int_equal(count_keys(srv.port, "kvt:cap:*"), 1024);
  assert_int_equal(kvt_tier_get(t, &k, got, n, &len), 0);
  assert_int_equal(len, n);
  assert_memory_equal(got, val, n);
  assert_int_equal(kvt_tier_del(t, &k), 0);
  assert_int_equal(count_keys(srv.port, "kvt:cap:*"), 0);
  free(val);
  free(got);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static void test_torn_or_mixed_parts_are_a_miss_never_wrong_bytes(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=torn&part=4KiB", srv.port);
  enum { N = 20 * 1024 };
  static uint8_t a[N], b[N], got[N];
  fill(a, N, 1);
  fill(b, N, 2);
  const kvt_key k = key_of(3, 1);
  char part2[128], part1[128];
  uint64_t len = 0;
  /* A part deleted behind the tier's back. */
  assert_int_equal(kvt_tier_put(t, &k, a, N), 0);
  part_key(part2, sizeof(part2), "torn", &k, 2);
  assert_true(rfx_cmd_ok(srv.port, "DEL %s", part2));
  assert_int_equal(kvt_tier_get(t, &k, got, N, &len), KVT_ENOTFOUND);
  /* A part of an older generation put back under a newer header. */
  assert_int_equal(kvt_tier_put(t, &k, a, N), 0);
  part_key(part1, sizeof(part1), "torn", &k, 1);
  redisReply *old = rfx_cmd(srv.port, "GET %s", part1);
  assert_true(old && old->type == REDIS_REPLY_STRING);
  assert_int_equal(kvt_tier_put(t, &k, b, N), 0);
  part_key(part1, sizeof(part1), "torn", &k, 1);
  assert_true(rfx_cmd_ok(srv.port, "SET %s %b", part1, old->str, (size_t)old->len));
  freeReplyObject(old);
  assert_int_equal(kvt_tier_get(t, &k, got, N, &len), KVT_ENOTFOUND);
  /* A foreign value under the tier's key name, and a truncated header. */
  char main_key[128];
  redis_key(main_key, sizeof(main_key), "torn", &k, 0);
  assert_true(rfx_cmd_ok(srv.port, "SET %s hello", main_key));
  assert_int_equal(kvt_tier_get(t, &k, got, N, &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(t, &k, &len), KVT_ENOTFOUND);
  assert_true(rfx_cmd_ok(srv.port, "DEL %s", main_key));
  assert_true(rfx_cmd_ok(srv.port, "LPUSH %s x", main_key)); /* another type: a miss */
  assert_int_equal(kvt_tier_get(t, &k, got, N, &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(t, &k, &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_put(t, &k, a, 100), 0); /* which a PUT replaces */
  assert_int_equal(kvt_tier_get(t, &k, got, N, &len), 0);
  assert_int_equal(len, 100);
  assert_memory_equal(got, a, 100);
  assert_true(rfx_cmd_ok(srv.port, "DEL %s", main_key));
  assert_true(rfx_cmd_ok(srv.port, "LPUSH %s x", main_key));
  assert_int_equal(kvt_tier_del(t, &k), 0);
  assert_int_equal(count_keys(srv.port, main_key), 0);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

typedef struct lister {
  int n;
  uint64_t lens;
} lister;

static int count_cb(void *opaque, const kvt_key *key, uint64_t len) {
  lister *l = opaque;
  (void)key;
  l->n++;
  l->lens += len;
  return 0;
}

/* The last line logged, copied out. */
static void last_log(char *out, size_t cap) {
  pthread_mutex_lock(&logs.mu);
  snprintf(out, cap, "%s", logs.last);
  pthread_mutex_unlock(&logs.mu);
}

/* The conformance suite has the tampering cases every tier must pass; here,
 * what the redis tier says about them: a warning naming the Redis key and
 * the reason, and the value left where it is (a read never deletes). */
static void test_a_value_failing_a_check_is_logged_with_its_key_and_left_in_place(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=check&part=4KiB", srv.port);
  enum { N = 10000 };
  static uint8_t val[N], got[N];
  fill(val, N, 11);
  const kvt_key k = key_of(7, 1), other = key_of(7, 2);
  char main_key[128], part[128], other_key[128], line[512];
  uint64_t len = 0;
  redis_key(main_key, sizeof(main_key), "check", &k, 0);
  assert_int_equal(kvt_tier_put(t, &k, val, N), 0);
  part_key(part, sizeof(part), "check", &k, 2);
  redisReply *r = rfx_cmd(srv.port, "GETRANGE %s 100 100", part);
  assert_true(r && r->type == REDIS_REPLY_STRING && r->len == 1);
  const char flipped = (char)(r->str[0] ^ 0x10);
  freeReplyObject(r);
  assert_true(rfx_cmd_ok(srv.port, "SETRANGE %s 100 %b", part, &flipped, (size_t)1));
  assert_int_equal(kvt_tier_get(t, &k, got, N, &len), KVT_ENOTFOUND);
  last_log(line, sizeof(line));
  if (!strstr(line, part) || !strstr(line, "data checksum mismatch"))
    fail_msg("the warning does not name %s and the reason: '%s'", part, line);
  assert_int_equal(count_keys(srv.port, main_key), 1); /* still there */
  assert_int_equal(count_keys(srv.port, part), 1);
  /* Another key's value under this one's name: its header says so. */
  assert_int_equal(kvt_tier_put(t, &other, val, 100), 0);
  redis_key(other_key, sizeof(other_key), "check", &other, 0);
  assert_true(rfx_cmd_ok(srv.port, "COPY %s %s REPLACE", other_key, main_key));
  assert_int_equal(kvt_tier_get(t, &k, got, N, &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(t, &k, &len), KVT_ENOTFOUND);
  last_log(line, sizeof(line));
  if (!strstr(line, main_key) || !strstr(line, "another key's value"))
    fail_msg("the warning does not name %s and the reason: '%s'", main_key, line);
  assert_int_equal(kvt_tier_put(t, &k, val, N), 0); /* a PUT replaces it */
  assert_int_equal(kvt_tier_get(t, &k, got, N, &len), 0);
  assert_memory_equal(got, val, N);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

/* kvtier 0.3.0's values (format 1: a 32-byte header without the key or
 * checksums, 16-byte part headers) are misses, not listed, and replaced
 * with their parts by a PUT. */
static void test_format_1_values_are_misses_and_a_put_removes_their_parts(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=fmt1", srv.port);
  const kvt_key k = key_of(8, 1);
  enum { P = 4096, N = 2 * P + 100 };
  static uint8_t val[N], got[N], v1[32 + P], ph[16 + P];
  fill(val, N, 12);
  const uint64_t gen = 0x0123456789abcdefull;
  char main_key[128], part[160], line[512];
  redis_key(main_key, sizeof(main_key), "fmt1", &k, 0);
  memset(v1, 0, 32);
  memcpy(v1, "KVTR\1", 5);
  for (int i = 0; i < 8; i++) { /* little-endian: generation, length */
    v1[8 + i] = (uint8_t)(gen >> (8 * i));
    v1[16 + i] = (uint8_t)((uint64_t)N >> (8 * i));
  }
  v1[24] = 3;        /* parts */
  v1[29] = P >> 8;   /* part size */
  memcpy(v1 + 32, val, P);
  assert_true(rfx_cmd_ok(srv.port, "SET %s %b", main_key, v1, sizeof(v1)));
  for (uint32_t i = 1; i < 3; i++) {
    const size_t n = i == 1 ? P : N - 2 * P;
    memcpy(ph, "KVTP", 4);
    for (int b = 0; b < 4; b++)
      ph[4 + b] = (uint8_t)(i >> (8 * b));
    for (int b = 0; b < 8; b++)
      ph[8 + b] = (uint8_t)(gen >> (8 * b));
    memcpy(ph + 16, val + i * P, n);
    snprintf(part, sizeof(part), "%s:%016llx:p%u", main_key, (unsigned long long)gen, i);
    assert_true(rfx_cmd_ok(srv.port, "SET %s %b", part, ph, 16 + n));
  }
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(t, &k, got, N, &len), KVT_ENOTFOUND);
  last_log(line, sizeof(line));
  if (!strstr(line, main_key) || !strstr(line, "format 1"))
    fail_msg("the warning does not name %s and format 1: '%s'", main_key, line);
  assert_int_equal(kvt_tier_query(t, &k, &len), KVT_ENOTFOUND);
  lister l = {0};
  assert_int_equal(kvt_tier_list(t, count_cb, &l), 0);
  assert_int_equal(l.n, 0);
  assert_int_equal(count_keys(srv.port, "kvt:fmt1:*"), 3);
  assert_int_equal(kvt_tier_put(t, &k, val, 100), 0);
  assert_int_equal(count_keys(srv.port, "kvt:fmt1:*"), 1); /* its parts went with it */
  assert_int_equal(kvt_tier_get(t, &k, got, N, &len), 0);
  assert_int_equal(len, 100);
  assert_int_equal(kvt_tier_del(t, &k), 0);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static void test_namespaces_never_see_each_others_keys(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *a = tier_open(ctx, "redis://127.0.0.1:%d?ns=tenant-a", srv.port);
  kvt_tier *b = tier_open(ctx, "redis://127.0.0.1:%d?ns=tenant-b", srv.port);
  kvt_tier *aa = tier_open(ctx, "redis://127.0.0.1:%d?ns=tenant-aa", srv.port);
  const kvt_key k = key_of(4, 1);
  uint8_t got[16];
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(a, &k, "from a", 6), 0);
  assert_int_equal(kvt_tier_get(b, &k, got, sizeof(got), &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_get(aa, &k, got, sizeof(got), &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_put(b, &k, "from bb", 7), 0);
  assert_int_equal(kvt_tier_get(a, &k, got, sizeof(got), &len), 0);
  assert_int_equal(len, 6);
  assert_memory_equal(got, "from a", 6);
  lister la = {0}, lb = {0}, laa = {0};
  assert_int_equal(kvt_tier_list(a, count_cb, &la), 0);
  assert_int_equal(kvt_tier_list(b, count_cb, &lb), 0);
  assert_int_equal(kvt_tier_list(aa, count_cb, &laa), 0);
  assert_int_equal(la.n, 1);
  assert_int_equal(la.lens, 6);
  assert_int_equal(lb.n, 1);
  assert_int_equal(lb.lens, 7);
  assert_int_equal(laa.n, 0);
  assert_int_equal(kvt_tier_del(b, &k), 0);
  assert_int_equal(kvt_tier_get(a, &k, got, sizeof(got), &len), 0);
  kvt_tier_close(a);
  kvt_tier_close(b);
  kvt_tier_close(aa);
  kvt_ctx_destroy(ctx);
}

static void test_ttl_expires_values_into_misses(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=ttl&ttl=1&part=1KiB", srv.port);
  uint8_t val[3000], got[3000];
  fill(val, sizeof(val), 3);
  const kvt_key k = key_of(5, 1);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  char name[128];
  redis_key(name, sizeof(name), "ttl", &k, 0);
  redisReply *r = rfx_cmd(srv.port, "PTTL %s", name);
  assert_true(r && r->type == REDIS_REPLY_INTEGER && r->integer > 0 && r->integer <= 1000);
  freeReplyObject(r);
  part_key(name, sizeof(name), "ttl", &k, 2);
  r = rfx_cmd(srv.port, "PTTL %s", name); /* the parts expire too */
  assert_true(r && r->type == REDIS_REPLY_INTEGER && r->integer > 0 && r->integer <= 1000);
  freeReplyObject(r);
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  rfx_sleep_ms(1300);
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(t, &k, &len), KVT_ENOTFOUND);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

/* ---- AUTH ---- */

static void test_auth_with_password_and_acl_user_and_wrong_password_is_eauth(void **state) {
  (void)state;
  rfx_server s;
  memset(&s, 0, sizeof(s));
  s.args[s.nargs++] = "--requirepass";
  s.args[s.nargs++] = "s3cret";
  s.pass = "s3cret";
  assert_int_equal(rfx_start(&s), 0);
  redisContext *c = rfx_connect(s.port, NULL, "s3cret");
  assert_non_null(c);
  redisReply *r = redisCommand(c, "ACL SETUSER alice on >w0nder%%land ~kvt:* +@all");
  assert_true(r && r->type != REDIS_REPLY_ERROR);
  freeReplyObject(r);
  redisFree(c);
  kvt_ctx *ctx = ctx_new();
  const kvt_key k = key_of(6, 1);
  uint8_t got[8];
  uint64_t len;
  kvt_tier *t = tier_open(ctx, "redis://:s3cret@127.0.0.1:%d?ns=auth", s.port);
  assert_int_equal(kvt_tier_put(t, &k, "pw", 2), 0);
  kvt_tier_close(t);
  t = tier_open(ctx, "redis://alice:w0nder%%25land@127.0.0.1:%d?ns=auth", s.port); /* %25: '%' */
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_memory_equal(got, "pw", 2);
  kvt_tier_close(t);
  char spec[256];
  snprintf(spec, sizeof(spec), "redis://:wrong@127.0.0.1:%d", s.port);
  t = NULL;
  assert_int_equal(kvt_tier_open(ctx, spec, &t), KVT_EAUTH);
  assert_null(t);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "WRONGPASS"));
  snprintf(spec, sizeof(spec), "redis://alice:nope@127.0.0.1:%d", s.port);
  assert_int_equal(kvt_tier_open(ctx, spec, &t), KVT_EAUTH);
  snprintf(spec, sizeof(spec), "redis://127.0.0.1:%d", s.port); /* no password at all */
  assert_int_equal(kvt_tier_open(ctx, spec, &t), KVT_EAUTH);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "NOAUTH"));
  kvt_ctx_destroy(ctx);
  rfx_stop(&s);
}

/* A password is shown as *** by kvt_tier_spec, and neither a refused AUTH
 * nor `kvtier store` (output, errors) shows it. */
static void test_the_password_is_shown_as_stars_and_never_in_details_or_cli_output(void **state) {
  (void)state;
  rfx_server *s = &aux;
  memset(s, 0, sizeof(*s));
  s->args[s->nargs++] = "--requirepass";
  s->args[s->nargs++] = "Pw-s3cret";
  s->pass = "Pw-s3cret";
  assert_int_equal(rfx_start(s), 0);
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://:Pw-s3cret@127.0.0.1:%d?ns=sec", s->port);
  char want[128], spec[256], cmd[1024];
  snprintf(want, sizeof(want), "redis://:***@127.0.0.1:%d?ns=sec", s->port);
  assert_string_equal(kvt_tier_spec(t), want);
  kvt_tier_close(t);
  snprintf(spec, sizeof(spec), "redis://default:Pw-wr0ng@127.0.0.1:%d?ns=sec", s->port);
  t = NULL;
  assert_int_equal(kvt_tier_open(ctx, spec, &t), KVT_EAUTH);
  if (strstr(kvt_ctx_last_error(ctx), "Pw-wr0ng"))
    fail_msg("the detail shows the password: %s", kvt_ctx_last_error(ctx));
  kvt_ctx_destroy(ctx);
  const char *cli = KVT_BINARY_DIR "/programs/kvtier";
  if (access(cli, X_OK) != 0) {
    rfx_stop(s);
    skip(); /* programs not built (the TSan build) */
  }
  static const struct {
    const char *pw, *opt, *sub;
  } runs[] = {{"Pw-s3cret", "", "stats"},
              {"Pw-s3cret", "", "ls --json"},
              {"Pw-s3cret", "", "rm --key 00112233445566778899aabbccddeeff"},
              {"Pw-wr0ng", "", "ls"},
              {"Pw-s3cret", "&bogus=1", "ls"}};
  for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
    snprintf(cmd, sizeof(cmd), "%s store --tiers 'redis://:%s@127.0.0.1:%d?ns=sec%s' %s 2>&1", cli,
             runs[i].pw, s->port, runs[i].opt, runs[i].sub);
    char out[8192];
    const int status = rfx_shell(cmd, out, sizeof(out));
    if (strstr(out, "Pw-") || (i < 3 && !strstr(out, want)) || (i == 4 && !strstr(out, "***")))
      fail_msg("%s: status %d:\n%s", cmd, status, out);
  }
  rfx_stop(s);
}

/* ---- a full server ---- */

/* A server over its maxmemory (noeviction) refuses every command queued in
 * MULTI, so a DEL sent as a transaction would fail too; DEL is how room is
 * made on a full server, so it must still work there. */
static void test_del_frees_room_on_a_server_over_maxmemory(void **state) {
  (void)state;
  rfx_server s;
  memset(&s, 0, sizeof(s));
  const char *args[] = {"--maxmemory-policy", "noeviction"};
  memcpy(s.args, args, sizeof(args));
  s.nargs = 2;
  assert_int_equal(rfx_start(&s), 0);
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=over", s.port);
  enum { V = 256 * 1024, N = 8 };
  uint8_t *val = malloc(V);
  fill(val, V, 11);
  for (uint32_t i = 0; i < N; i++) {
    const kvt_key k = key_of(8, i);
    assert_int_equal(kvt_tier_put(t, &k, val, V), 0);
  }
  /* now over the limit for certain: about 2 MiB used, 1 MiB allowed */
  assert_true(rfx_cmd_ok(s.port, "CONFIG SET maxmemory 1mb"));
  const kvt_key more = key_of(8, 100);
  assert_int_equal(kvt_tier_put(t, &more, val, V), -ENOSPC);
  uint64_t len = 0;
  for (uint32_t i = 0; i < N; i++) {
    const kvt_key k = key_of(8, i);
    assert_int_equal(kvt_tier_del(t, &k), 0);
    assert_int_equal(kvt_tier_query(t, &k, &len), KVT_ENOTFOUND);
  }
  assert_int_equal(kvt_tier_del(t, &more), KVT_ENOTFOUND);
  assert_true(rfx_cmd_ok(s.port, "CONFIG SET maxmemory 0"));
  assert_int_equal(kvt_tier_put(t, &more, val, V), 0);
  free(val);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  rfx_stop(&s);
}

static void test_full_server_gives_enospc_and_recovers_after_deletes(void **state) {
  (void)state;
  rfx_server s;
  memset(&s, 0, sizeof(s));
  const char *args[] = {"--maxmemory", "8mb", "--maxmemory-policy", "noeviction"};
  memcpy(s.args, args, sizeof(args));
  s.nargs = 4;
  assert_int_equal(rfx_start(&s), 0);
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=full", s.port);
  kvt_tier_stats st = {.struct_size = sizeof(st)};
  assert_int_equal(kvt_tier_stats_get(t, &st), 0);
  /* What the server has free: its maxmemory less what it uses itself. */
  assert_true(st.capacity > (4u << 20) && st.capacity < (8u << 20));
  enum { V = 256 * 1024 };
  uint8_t *val = malloc(V), *got = malloc(V);
  fill(val, V, 9);
  int rc = 0;
  uint32_t n = 0;
  for (; n < 200; n++) {
    const kvt_key k = key_of(7, n);
    if ((rc = kvt_tier_put(t, &k, val, V)) != 0)
      break;
  }
  assert_int_equal(rc, -ENOSPC);
  assert_true(n > 4);
  uint64_t len = 0;
  const kvt_key first = key_of(7, 0), refused = key_of(7, n);
  assert_int_equal(kvt_tier_get(t, &first, got, V, &len), 0); /* reads still work */
  assert_memory_equal(got, val, V);
  assert_int_equal(kvt_tier_query(t, &refused, &len), KVT_ENOTFOUND);
  for (uint32_t i = 0; i < 4; i++) {
    const kvt_key k = key_of(7, i);
    assert_int_equal(kvt_tier_del(t, &k), 0);
  }
  assert_int_equal(kvt_tier_put(t, &refused, val, V), 0);
  assert_int_equal(kvt_tier_get(t, &refused, got, V, &len), 0);
  assert_memory_equal(got, val, V);
  free(val);
  free(got);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  rfx_stop(&s);
}

/* ---- threads, a killed server ---- */

#define T_VMAX 20000

typedef struct runner {
  kvt_tier *tier;
  uint32_t id;
  atomic_int *stop;
  long ok, errors, wrong;
  double worst_s; /* the slowest single operation */
} runner;

/* A value names its key and version and is otherwise determined by them. */
static uint64_t value_make(uint8_t *p, uint32_t key, uint32_t ver) {
  const uint64_t len = 16 + (key * 7919u + ver * 104729u) % (T_VMAX - 16);
  memcpy(p, &key, 4);
  memcpy(p + 4, &ver, 4);
  memcpy(p + 8, &len, 8);
  fill(p + 16, len - 16, ((uint64_t)key << 32) | ver);
  return len;
}

static int value_right(const uint8_t *p, uint64_t len, uint32_t key, uint8_t *scratch) {
  uint32_t k, ver;
  if (len < 16)
    return 0;
  memcpy(&k, p, 4);
  memcpy(&ver, p + 4, 4);
  return k == key && value_make(scratch, k, ver) == len && memcmp(scratch, p, len) == 0;
}

static void *runner_main(void *arg) {
  runner *r = arg;
  uint8_t *val = malloc(T_VMAX), *got = malloc(T_VMAX), *scratch = malloc(T_VMAX);
  for (uint32_t it = 0; !atomic_load(r->stop); it++) {
    const uint32_t key = r->id * 1000 + it % 32; /* 32 keys per thread, rewritten */
    const kvt_key k = key_of(8, key);
    const uint64_t len = value_make(val, key, it);
    double t0 = now_s();
    int rc = kvt_tier_put(r->tier, &k, val, len);
    double dt = now_s() - t0;
    r->worst_s = dt > r->worst_s ? dt : r->worst_s;
    rc ? r->errors++ : r->ok++;
    uint64_t n = 0;
    t0 = now_s();
    rc = kvt_tier_get(r->tier, &k, got, T_VMAX, &n);
    dt = now_s() - t0;
    r->worst_s = dt > r->worst_s ? dt : r->worst_s;
    if (rc == 0 && !value_right(got, n, key, scratch))
      r->wrong++;
    rc == 0 ? r->ok++ : r->errors++;
  }
  free(val);
  free(got);
  free(scratch);
  return NULL;
}

static void run_threads(kvt_tier **tiers, int ntiers, int per_tier, double seconds,
                        void (*midway)(void *), void *arg, runner *out) {
  pthread_t th[32];
  atomic_int stop = 0;
  const int n = ntiers * per_tier;
  for (int i = 0; i < n; i++) {
    out[i] = (runner){.tier = tiers[i % ntiers], .id = (uint32_t)i, .stop = &stop};
    assert_int_equal(pthread_create(&th[i], NULL, runner_main, &out[i]), 0);
  }
  rfx_sleep_ms((long)(seconds * 500));
  if (midway)
    midway(arg);
  rfx_sleep_ms((long)(seconds * 500));
  atomic_store(&stop, 1);
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
}

static void kill9(void *arg) { rfx_kill9(arg); }

static void test_server_killed_mid_run_never_returns_wrong_bytes_and_recovers(void **state) {
  (void)state;
  rfx_server s;
  memset(&s, 0, sizeof(s));
  assert_int_equal(rfx_start(&s), 0);
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=kill&timeout_ms=500&conns=3", s.port);
  runner r[4];
  logs.lines = 0;
  run_threads(&t, 1, 4, 2.0, kill9, &s, r);
  long ok = 0, errors = 0;
  for (int i = 0; i < 4; i++) {
    assert_int_equal(r[i].wrong, 0);
    assert_true(r[i].worst_s < 3.0); /* no hang: bounded by the 500 ms timeouts */
    ok += r[i].ok, errors += r[i].errors;
  }
  assert_true(ok > 0 && errors > 0);
  assert_true(logs.lines > 0); /* the failures were logged */
  /* While it is down: fast failures with a clear code. */
  const kvt_key k = key_of(9, 1);
  uint8_t got[8];
  uint64_t len;
  const double t0 = now_s();
  for (int i = 0; i < 50; i++) {
    const int rc = kvt_tier_get(t, &k, got, sizeof(got), &len);
    assert_true(rc == -ECONNREFUSED || rc == -ECONNRESET);
  }
  assert_true(now_s() - t0 < 3.0); /* each fails fast */
  assert_int_equal(rfx_start(&s), 0); /* same port */
  int rc = -1;
  for (int i = 0; i < 100 && rc != 0; i++) { /* the backoff is at most 1 s */
    rc = kvt_tier_put(t, &k, "back", 4);
    if (rc)
      rfx_sleep_ms(50);
  }
  assert_int_equal(rc, 0);
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_memory_equal(got, "back", 4);
  kvt_tier_stats st = {.struct_size = sizeof(st)};
  assert_int_equal(kvt_tier_stats_get(t, &st), 0);
  assert_true(st.errors > 0);
  assert_int_equal(st.in_flight, 0);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  rfx_stop(&s);
}

/* A server that accepts connections and never answers (hung, or a black
 * hole): each connect costs a timeout, so the tier must back off instead of
 * paying one per operation. */
static void test_unresponsive_server_costs_timeouts_per_backoff_not_per_operation(void **state) {
  (void)state;
  rfx_server s;
  memset(&s, 0, sizeof(s));
  assert_int_equal(rfx_start(&s), 0);
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(ctx, "redis://127.0.0.1:%d?ns=hung&timeout_ms=300&conns=1", s.port);
  const kvt_key k = key_of(10, 1);
  assert_int_equal(kvt_tier_put(t, &k, "v", 1), 0);
  rfx_kill9(&s);
  const int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(fd, 128), 0); /* never accepted: no reply ever comes */
  uint8_t got[8];
  uint64_t len;
  int timeouts = 0;
  const double t0 = now_s();
  for (int i = 0; i < 40; i++) {
    const int rc = kvt_tier_get(t, &k, got, sizeof(got), &len);
    assert_true(rc == -ETIMEDOUT || rc == -ECONNRESET || rc == -ECONNREFUSED);
    timeouts += rc == -ETIMEDOUT;
  }
  const double took = now_s() - t0;
  assert_true(timeouts > 0);
  assert_true(took < 6.0); /* 40 x 300 ms = 12 s without the backoff */
  close(fd);
  assert_int_equal(rfx_start(&s), 0);
  int rc = -1;
  for (int i = 0; i < 100 && rc != 0; i++) {
    rc = kvt_tier_put(t, &k, "w", 1);
    if (rc)
      rfx_sleep_ms(50);
  }
  assert_int_equal(rc, 0);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  rfx_stop(&s);
}

static void test_many_clients_at_once_keep_values_whole(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t[2] = {tier_open(ctx, "redis://127.0.0.1:%d?ns=many&conns=4&part=8KiB", srv.port),
                    tier_open(ctx, "redis://127.0.0.1:%d?ns=many&conns=2", srv.port)};
  runner r[16];
  run_threads(t, 2, 8, 2.0, NULL, NULL, r);
  for (int i = 0; i < 16; i++) {
    assert_int_equal(r[i].wrong, 0);
    assert_int_equal(r[i].errors, 0);
    assert_true(r[i].ok > 0);
  }
  kvt_tier_close(t[0]);
  kvt_tier_close(t[1]);
  kvt_ctx_destroy(ctx);
}

/* ---- the benchmark keeps working ---- */

static void test_bench_redis_cli_runs_against_the_fixture_server(void **state) {
  (void)state;
  const char *cli = KVT_BINARY_DIR "/programs/kvtier";
  if (access(cli, X_OK) != 0 || system("command -v redis-benchmark >/dev/null 2>&1") != 0)
    skip(); /* programs not built (the TSan build), or no redis-benchmark */
  char cmd[1024];
  snprintf(cmd, sizeof(cmd),
           "%s bench redis --url redis://127.0.0.1:%d --size 64KiB --clients 2 --pipeline 2 "
           "--requests 50 --reps 1 2>&1",
           cli, srv.port);
  char out[8192];
  const int status = rfx_shell(cmd, out, sizeof(out));
  if (status != 0 || !strstr(out, "tier PUT") || !strstr(out, "tier GET"))
    fail_msg("kvtier bench redis: status %d:\n%s", status, out);
}

/* With a password in --url, its report shows the tier as *** too. */
static void test_bench_redis_cli_never_prints_the_password(void **state) {
  (void)state;
  const char *cli = KVT_BINARY_DIR "/programs/kvtier";
  if (access(cli, X_OK) != 0 || system("command -v redis-benchmark >/dev/null 2>&1") != 0)
    skip(); /* programs not built (the TSan build), or no redis-benchmark */
  rfx_server *s = &aux;
  static const char *const args[] = {"--requirepass", "Pw-S3cret"};
  memset(s, 0, sizeof(*s));
  s->pass = args[1];
  s->args[s->nargs++] = args[0];
  s->args[s->nargs++] = args[1];
  assert_int_equal(rfx_start(s), 0);
  char cmd[1024];
  snprintf(cmd, sizeof(cmd),
           "%s bench redis --url redis://:Pw-S3cret@127.0.0.1:%d --size 4KiB --clients 1 "
           "--pipeline 1 --requests 20 --reps 1 2>&1",
           cli, s->port);
  char out[8192];
  const int status = rfx_shell(cmd, out, sizeof(out));
  rfx_stop(s);
  if (status != 0 || !strstr(out, "tier PUT") || strstr(out, "S3cret") || !strstr(out, "***"))
    fail_msg("kvtier bench redis: status %d:\n%s", status, out);
}

/* ---- specs ---- */

static void test_bad_specs_and_dead_servers_fail_open_with_detail(void **state) {
  (void)state;
  static const struct {
    const char *spec, *names;
    int rc;
  } bad[] = {{"redis:127.0.0.1:6379", "//", KVT_ESPEC},
             {"redis://127.0.0.1", "HOST:PORT", KVT_ESPEC},
             {"redis://127.0.0.1:99999", "HOST:PORT", KVT_ESPEC},
             {"redis://a:1,b:2", "redis+cluster", KVT_ESPEC},
             {"redis://127.0.0.1:1/x", "/x", KVT_ESPEC},
             {"redis://127.0.0.1:1?ns=a{b}", "ns", KVT_ESPEC},
             {"redis://127.0.0.1:1?ttl=-1", "ttl", KVT_ESPEC},
             {"redis://127.0.0.1:1?part=100", "part", KVT_ESPEC},
             {"redis://127.0.0.1:1?bogus=1", "bogus", KVT_ESPEC},
             {"redis+cluster://127.0.0.1:1/3", "database", KVT_ESPEC},
             {"redis://127.0.0.1:1", "127.0.0.1:1", -ECONNREFUSED}};
  kvt_ctx *ctx = ctx_new();
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    kvt_tier *t = NULL;
    const int rc = kvt_tier_open(ctx, bad[i].spec, &t);
    if (rc != bad[i].rc || !strstr(kvt_ctx_last_error(ctx), bad[i].names))
      fail_msg("'%s': %s, '%s'", bad[i].spec, kvt_err_name(rc), kvt_ctx_last_error(ctx));
    assert_null(t);
  }
  kvt_ctx_destroy(ctx);
}

static int open_rc(kvt_ctx *ctx, const char *fmt, ...) {
  char spec[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(spec, sizeof(spec), fmt, ap);
  va_end(ap);
  kvt_tier *t = NULL;
  const int rc = kvt_tier_open(ctx, spec, &t);
  kvt_tier_close(t);
  return rc;
}

/* %XX must be two hex digits: strtol() also takes a sign or a space
 * ("%-1" is 0xFF, "% 1" is 0x01), which should be a bad spec. */
static void test_bad_percent_escapes_in_credentials_are_espec(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  static const char *const bad[] = {":%-1", ":% 1", ":%+1", ":a%-F", "%-1:pw"};
  char why[1024] = "";
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    const int rc =
        open_rc(ctx, "redis://%s@127.0.0.1:%d?ns=rv-esc", bad[i], srv.port);
    if (rc != KVT_ESPEC)
      snprintf(why + strlen(why), sizeof(why) - strlen(why), " '%s@': %s;",
               bad[i], kvt_err_name(rc));
  }
  kvt_ctx_destroy(ctx);
  if (why[0])
    fail_msg("accepted as escapes:%s", why);
}

/* "%00" decodes into a NUL that ends the C string: ":ab%00zz@" sends
 * AUTH ab and opens with a password other than the one given. */
static void test_nul_escape_in_password_is_refused(void **state) {
  (void)state;
  rfx_server *s = &aux;
  static const char *const args[] = {"--requirepass", "ab"};
  memset(s, 0, sizeof(*s));
  s->pass = "ab"; /* rfx_start PINGs with it */
  s->args[s->nargs++] = args[0];
  s->args[s->nargs++] = args[1];
  assert_int_equal(rfx_start(s), 0);
  kvt_ctx *ctx = ctx_new();
  const int rc =
      open_rc(ctx, "redis://:ab%%00zz@127.0.0.1:%d?ns=rv-nul", s->port);
  const int rc_user =
      open_rc(ctx, "redis://default:ab%%00zz@127.0.0.1:%d?ns=rv-nul", s->port);
  kvt_ctx_destroy(ctx);
  rfx_stop(s);
  if (rc == 0 || rc_user == 0)
    fail_msg("password \"ab\\0zz\" opened a server whose password is \"ab\" "
             "(%s, %s)",
             kvt_err_name(rc), kvt_err_name(rc_user));
}

/* ---- the fixture ---- */

static void start_server(rfx_server *s, const char *const *args, int nargs) {
  memset(s, 0, sizeof(*s));
  for (int i = 0; i < nargs; i++)
    s->args[s->nargs++] = args[i];
  assert_int_equal(rfx_start(s), 0);
}

/* rfx_stop() leaves the server in rfx_all, and rfx_kill_all() reads every
 * entry at exit: test_tier_redis.c's servers live on the stack, so at exit
 * it reads dead frames and kill()s whatever positive pid they hold. */
static void test_fixture_forgets_servers_it_stopped(void **state) {
  (void)state;
  start_server(&aux, NULL, 0);
  rfx_stop(&aux);
  for (int i = 0; i < RFX_MAX_SERVERS; i++)
    if (rfx_all[i] == &aux)
      fail_msg("a stopped server stays registered (rfx_all[%d])", i);
}

static int group_setup(void **state) {
  (void)state;
  memset(&srv, 0, sizeof(srv));
  return rfx_start(&srv) == 0 ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  rfx_stop(&srv);
  return 0;
}

int main(void) {
  if (!rfx_have_redis()) {
    printf("[  SKIP    ] redis-server is not on PATH\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conformance_suite_passes_against_redis_server),
      cmocka_unit_test(test_binary_values_with_nul_and_crlf_round_trip),
      cmocka_unit_test(test_value_above_part_size_splits_and_round_trips),
      cmocka_unit_test(test_tiny_part_size_still_caps_the_part_count),
      cmocka_unit_test(test_torn_or_mixed_parts_are_a_miss_never_wrong_bytes),
      cmocka_unit_test(test_a_value_failing_a_check_is_logged_with_its_key_and_left_in_place),
      cmocka_unit_test(test_format_1_values_are_misses_and_a_put_removes_their_parts),
      cmocka_unit_test(test_namespaces_never_see_each_others_keys),
      cmocka_unit_test(test_ttl_expires_values_into_misses),
      cmocka_unit_test(test_auth_with_password_and_acl_user_and_wrong_password_is_eauth),
      cmocka_unit_test(test_the_password_is_shown_as_stars_and_never_in_details_or_cli_output),
      cmocka_unit_test(test_full_server_gives_enospc_and_recovers_after_deletes),
      cmocka_unit_test(test_del_frees_room_on_a_server_over_maxmemory),
      cmocka_unit_test(test_server_killed_mid_run_never_returns_wrong_bytes_and_recovers),
      cmocka_unit_test(test_unresponsive_server_costs_timeouts_per_backoff_not_per_operation),
      cmocka_unit_test(test_many_clients_at_once_keep_values_whole),
      cmocka_unit_test(test_bad_specs_and_dead_servers_fail_open_with_detail),
      cmocka_unit_test(test_bench_redis_cli_runs_against_the_fixture_server),
      cmocka_unit_test(test_bench_redis_cli_never_prints_the_password),
      cmocka_unit_test(test_bad_percent_escapes_in_credentials_are_espec),
      cmocka_unit_test(test_nul_escape_in_password_is_refused),
      cmocka_unit_test(test_fixture_forgets_servers_it_stopped),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
