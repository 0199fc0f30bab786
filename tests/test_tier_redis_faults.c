/* tests/test_tier_redis_faults.c - the redis:// tier when the connection or
 * the server fails, against redis-server processes this program starts on
 * 127.0.0.1 (tests/fixtures/redis_fixture.h): a byte-counting TCP proxy
 * between the tier and the server holds replies, drips them, or cuts the
 * connection after an exact number of reply bytes; a server closes idle
 * connections, refuses writes in the middle of a multi-part PUT, or dies
 * under operations in flight. Exits 77 when redis-server is not on PATH. */
#include <errno.h>
#include <poll.h>
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
#include <unistd.h>

#include <cmocka.h>

#include "kvtier.h"
#include "redis_fixture.h"
#include "tier_test_util.h"

/* Static, never on the stack: the fixture keeps pointers to every server it
 * started (rfx_all) and reads them again at exit. */
static rfx_server srv; /* shared by the tests that need nothing special */
static rfx_server aux; /* one test's own server, stopped by that test */

static kvt_key key_of(uint32_t space, uint32_t id) {
  kvt_key k;
  memset(&k, 0x5D, sizeof(k));
  memcpy(k.bytes, &space, 4);
  memcpy(k.bytes + 8, &id, 4);
  return k;
}

static kvt_ctx *ctx_new(void) {
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
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
    fail_msg("open %s: %s: %s", spec, kvt_err_name(rc),
             kvt_ctx_last_error(ctx));
  return t;
}

static int count_cb(void *opaque, const kvt_key *key, uint64_t len) {
  (void)key, (void)len;
  (*(int *)opaque)++;
  return 0;
}

static kvt_tier_stats stats_of(kvt_tier *t) {
  kvt_tier_stats st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  assert_int_equal(kvt_tier_stats_get(t, &st), 0);
  return st;
}

static void start_server(rfx_server *s, const char *const *args, int nargs) {
  memset(s, 0, sizeof(*s));
  for (int i = 0; i < nargs; i++)
    s->args[s->nargs++] = args[i];
  assert_int_equal(rfx_start(s), 0);
}

/* ---- a proxy that can hold, drip or cut the server's replies ---- */

#define PX_CONNS 32

typedef struct proxy {
  int lfd, port, target;
  pthread_t acceptor;
  atomic_int stop;
  atomic_int hold; /* 1: replies are not forwarded */
  atomic_int
      drip_ms;     /* >0: replies forwarded a byte at a time, this far apart */
  atomic_long cut; /* >=0: forward this many more reply bytes, then drop the
                      connection */
  pthread_mutex_t mu;
  int nconns;
  struct px_conn {
    struct proxy *px;
    int cfd, sfd;
    pthread_t up, down;
  } conns[PX_CONNS];
} proxy;

static int send_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int readable(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, ms) > 0;
}

static void *px_up(void *arg) { /* client -> server, untouched */
  struct px_conn *c = arg;
  uint8_t buf[65536];
  while (!atomic_load(&c->px->stop)) {
    if (!readable(c->cfd, 50))
      continue;
    const ssize_t n = recv(c->cfd, buf, sizeof(buf), 0);
    if (n <= 0 || send_all(c->sfd, buf, (size_t)n)) {
      shutdown(c->sfd, SHUT_WR);
      break;
    }
  }
  return NULL;
}

static void *px_down(void *arg) { /* server -> client, held, dripped or cut */
  struct px_conn *c = arg;
  proxy *px = c->px;
  uint8_t buf[65536];
  while (!atomic_load(&px->stop)) {
    if (!readable(c->sfd, 20) || atomic_load(&px->hold)) {
      rfx_sleep_ms(1); /* hold is checked once the reply is there */
      continue;
    }
    size_t want = sizeof(buf);
    const int drip = atomic_load(&px->drip_ms);
    const long cut = atomic_load(&px->cut);
    if (drip > 0)
      want = 1;
    if (cut >= 0 && (size_t)cut < want)
      want = (size_t)cut;
    if (want == 0) {
      atomic_store(&px->cut, -1); /* later connections pass */
      shutdown(c->cfd, SHUT_RDWR);
      shutdown(c->sfd, SHUT_RDWR);
      break;
    }
    const ssize_t n = recv(c->sfd, buf, want, 0);
    if (n <= 0 || send_all(c->cfd, buf, (size_t)n)) {
      shutdown(c->cfd, SHUT_RDWR);
      break;
    }
    if (cut >= 0)
      atomic_fetch_sub(&px->cut, (long)n);
    if (drip > 0)
      rfx_sleep_ms(drip);
  }
  return NULL;
}

static void *px_accept(void *arg) {
  proxy *px = arg;
  while (!atomic_load(&px->stop)) {
    if (!readable(px->lfd, 20))
      continue;
    const int cfd = accept(px->lfd, NULL, NULL);
    if (cfd < 0)
      continue;
    const int sfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)px->target)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    pthread_mutex_lock(&px->mu);
    if (px->nconns == PX_CONNS ||
        connect(sfd, (struct sockaddr *)&a, sizeof(a)) != 0) {
      pthread_mutex_unlock(&px->mu);
      close(cfd);
      close(sfd);
      continue;
    }
    struct px_conn *c = &px->conns[px->nconns++];
    c->px = px, c->cfd = cfd, c->sfd = sfd;
    pthread_create(&c->up, NULL, px_up, c);
    pthread_create(&c->down, NULL, px_down, c);
    pthread_mutex_unlock(&px->mu);
  }
  return NULL;
}

static void proxy_start(proxy *px, int target) {
  memset(px, 0, sizeof(*px));
  pthread_mutex_init(&px->mu, NULL);
  atomic_store(&px->cut, -1);
  px->target = target;
  px->lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(px->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
  socklen_t len = sizeof(a);
  assert_int_equal(getsockname(px->lfd, (struct sockaddr *)&a, &len), 0);
  px->port = ntohs(a.sin_port);
  assert_int_equal(listen(px->lfd, 64), 0);
  assert_int_equal(pthread_create(&px->acceptor, NULL, px_accept, px), 0);
}

static void proxy_stop(proxy *px) {
  atomic_store(&px->stop, 1);
  pthread_join(px->acceptor, NULL);
  for (int i = 0; i < px->nconns; i++) {
    shutdown(px->conns[i].cfd, SHUT_RDWR);
    shutdown(px->conns[i].sfd, SHUT_RDWR);
    pthread_join(px->conns[i].up, NULL);
    pthread_join(px->conns[i].down, NULL);
    close(px->conns[i].cfd);
    close(px->conns[i].sfd);
  }
  close(px->lfd);
  pthread_mutex_destroy(&px->mu);
}

/* ---- wrong bytes: a multi-part GET whose parts were never read ---- */

/* GET A (two parts) and GET B go out in one batch; the connection drops
 * right after A's first reply (its header and first part). A's second part
 * was never read, so A must fail; exec_node() only fails the jobs from B on
 * and completes A with result 0 and a buffer whose tail was never written. */
static void
test_multipart_get_fails_when_connection_drops_before_its_parts(void **state) {
  (void)state;
  static proxy px; /* static: its threads outlive a failed assert */
  proxy_start(&px, srv.port);
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(
      ctx, "redis://127.0.0.1:%d?ns=rv-cut&part=1KiB&conns=1&timeout_ms=5000",
      px.port);
  enum { NA = 1500 };
  uint8_t a[NA], got_a[NA], got_s[8], got_b[8];
  fill(a, NA, 11);
  const kvt_key ka = key_of(1, 1), kb = key_of(1, 2), ks = key_of(1, 3);
  assert_int_equal(kvt_tier_put(t, &ka, a, NA), 0);
  assert_int_equal(kvt_tier_put(t, &kb, "b", 1), 0);
  assert_int_equal(kvt_tier_put(t, &ks, "s", 1), 0);
  /* Keep the only worker busy on GET S while GET A and GET B queue up. */
  atomic_store(&px.hold, 1);
  kvt_tier_op s, ga, gb;
  kvt_tier_op_init(&s, KVT_TIER_GET, &ks, got_s, sizeof(got_s), 0);
  kvt_tier_op *one[1] = {&s};
  assert_int_equal(kvt_tier_submit_owned(t, one, 1), 1);
  rfx_sleep_ms(200);
  memset(got_a, 0xEE, sizeof(got_a));
  kvt_tier_op_init(&ga, KVT_TIER_GET, &ka, got_a, sizeof(got_a), 0);
  kvt_tier_op_init(&gb, KVT_TIER_GET, &kb, got_b, sizeof(got_b), 0);
  kvt_tier_op *two[2] = {&ga, &gb};
  assert_int_equal(kvt_tier_submit_owned(t, two, 2), 2);
  rfx_sleep_ms(100);
  /* GET S: "$33\r\n" + 33 + "\r\n" = 40; GET A's value key: "$1056\r\n" + 1056
   * + "\r\n". */
  atomic_store(&px.cut, 40 + 7 + 1056 + 2);
  atomic_store(&px.hold, 0);
  const int rs = kvt_tier_wait(t, &s, 10000);
  const int rb = kvt_tier_wait(t, &gb, 10000);
  const int ra = kvt_tier_wait(t, &ga, 10000);
  const long left = atomic_load(&px.cut);
  kvt_tier_close(t); /* waits for anything still in flight */
  kvt_ctx_destroy(ctx);
  proxy_stop(&px);
  assert_int_equal(rs, 0);
  assert_int_not_equal(ra, -ETIMEDOUT);
  if (rb == 0)
    fail_msg(
        "the cut missed: GET A %s, GET B %s, %ld reply bytes left to forward",
        kvt_err_name(ra), kvt_err_name(rb), left);
  if (ra == 0 && memcmp(got_a, a, NA) != 0)
    fail_msg("GET A returned 0 but bytes %d.. were never read (GET B: %s)",
             1024, kvt_err_name(rb));
}

/* ---- timeouts ---- */

/* timeout_ms is "every call" (tier.h); a server that answers a byte at a
 * time, each byte inside the socket timeout, keeps one GET in flight for
 * minutes: the timeout is per recv(), not per operation. */
static void test_slow_drip_server_still_times_out_the_operation(void **state) {
  (void)state;
  static proxy px; /* static: its threads outlive a failed assert */
  proxy_start(&px, srv.port);
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(
      ctx, "redis://127.0.0.1:%d?ns=rv-drip&timeout_ms=300&conns=1", px.port);
  uint8_t val[2000], got[2000];
  fill(val, sizeof(val), 12);
  const kvt_key k = key_of(2, 1);
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  atomic_store(&px.drip_ms, 100);
  kvt_tier_op op;
  kvt_tier_op_init(&op, KVT_TIER_GET, &k, got, sizeof(got), 0);
  kvt_tier_op *one[1] = {&op};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(kvt_tier_submit_owned(t, one, 1), 1);
  const int rc = kvt_tier_wait(t, &op, 3000); /* 10 x timeout_ms */
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
  atomic_store(&px.drip_ms, 0);
  kvt_tier_close(t); /* waits for the GET, now that the rest comes at once */
  kvt_ctx_destroy(ctx);
  proxy_stop(&px);
  /* The GET itself fails with -ETIMEDOUT (tier.h), which kvt_tier_wait()
   * also returns when the wait runs out: the time tells them apart. */
  if (ms >= 2500)
    fail_msg("a GET with timeout_ms=300 was still in flight after %ld ms (%s)", ms,
             kvt_err_name(rc));
  assert_int_equal(rc, -ETIMEDOUT);
}

/* A healthy server that closes idle connections (its `timeout` setting):
 * the next operation writes into the closed connection and fails with
 * -ECONNRESET instead of reconnecting. */
static void
test_idle_connection_closed_by_server_does_not_fail_next_op(void **state) {
  (void)state;
  rfx_server *s = &aux;
  static const char *const args[] = {"--timeout", "1"};
  start_server(s, args, 2);
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t =
      tier_open(ctx, "redis://127.0.0.1:%d?ns=rv-idle&conns=1", s->port);
  const kvt_key k = key_of(3, 1);
  uint8_t got[8];
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(t, &k, "idle", 4), 0);
  rfx_sleep_ms(3000); /* the server drops the idle connection */
  const int rc = kvt_tier_get(t, &k, got, sizeof(got), &len);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  rfx_stop(s);
  if (rc != 0)
    fail_msg("GET after an idle period on a healthy server: %s",
             kvt_err_name(rc));
}

/* ---- a failed PUT of a value in parts ---- */

/* Stores A in three parts, then makes the server refuse writes (maxmemory
 * below what it holds) and PUTs B under the same key. */
static kvt_tier *failed_put_setup(rfx_server *s, kvt_ctx *ctx, const kvt_key *k,
                                  uint8_t *a, size_t n) {
  start_server(s, NULL, 0);
  kvt_tier *t = tier_open(
      ctx, "redis://127.0.0.1:%d?ns=rv-oom&part=1KiB&conns=1", s->port);
  uint8_t *b = malloc(n);
  fill(a, n, 13);
  fill(b, n, 14);
  assert_int_equal(kvt_tier_put(t, k, a, n), 0);
  assert_true(rfx_cmd_ok(s->port, "CONFIG SET maxmemory 1"));
  assert_int_equal(kvt_tier_put(t, k, b, n), -ENOSPC);
  assert_true(rfx_cmd_ok(s->port, "CONFIG SET maxmemory 0"));
  free(b);
  return t;
}

/* tier.h: "a failed PUT leaves any old value in place". */
static void test_failed_multipart_put_leaves_old_value_in_place(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  enum { N = 3000 };
  uint8_t a[N], got[N];
  const kvt_key k = key_of(4, 1);
  kvt_tier *t = failed_put_setup(&aux, ctx, &k, a, N);
  uint64_t len = 0;
  const int rc = kvt_tier_get(t, &k, got, N, &len);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  rfx_stop(&aux);
  if (rc != 0)
    fail_msg("GET of the old value after a refused PUT: %s", kvt_err_name(rc));
  assert_memory_equal(got, a, N);
}

/* Whatever the failed PUT does to the old value, items and used must follow:
 * here the cleanup deleted A, but the handle still counts it. */
static void test_failed_multipart_put_keeps_items_and_used_true(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  enum { N = 3000 };
  uint8_t a[N];
  const kvt_key k = key_of(5, 1);
  kvt_tier *t = failed_put_setup(&aux, ctx, &k, a, N);
  int listed = 0;
  assert_int_equal(kvt_tier_list(t, count_cb, &listed), 0);
  const kvt_tier_stats st = stats_of(t);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  rfx_stop(&aux);
  if ((int)st.items != listed || (listed == 0 && st.used != 0))
    fail_msg("items %llu, used %llu, but list() finds %d value(s)",
             (unsigned long long)st.items, (unsigned long long)st.used, listed);
}

/* ---- a server that dies ---- */

/* Every accepted operation completes exactly once, also when the server dies
 * under them. */
static void
test_ops_in_flight_when_server_dies_complete_exactly_once(void **state) {
  (void)state;
  rfx_server *s = &aux;
  start_server(s, NULL, 0);
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(
      ctx, "redis://127.0.0.1:%d?ns=rv-die&timeout_ms=500&conns=2", s->port);
  enum { N = 64, V = 32 * 1024 };
  static kvt_tier_op ops[N];
  static uint8_t bufs[N][V];
  for (int i = 0; i < N; i++) {
    const kvt_key k = key_of(9, (uint32_t)i);
    fill(bufs[i], V, (uint64_t)i);
    kvt_tier_op_init(&ops[i], i % 2 ? KVT_TIER_GET : KVT_TIER_PUT, &k, bufs[i],
                     V, (uint64_t)i);
  }
  int seen[N] = {0}, got = 0;
  for (int i = 0; i < N; i++) {
    kvt_tier_op *one = &ops[i];
    assert_int_equal(kvt_tier_submit(t, &one, 1), 1);
    if (i == N / 2)
      rfx_kill9(s);
  }
  kvt_tier_op *done[N];
  for (int tries = 0; got < N && tries < 100; tries++) {
    const int n = kvt_tier_poll(t, done, N, 100);
    for (int i = 0; i < n; i++)
      seen[done[i]->user_data]++;
    got += n;
  }
  assert_int_equal(got, N);
  for (int i = 0; i < N; i++)
    assert_int_equal(seen[i], 1);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  rfx_stop(s);
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
      cmocka_unit_test(test_multipart_get_fails_when_connection_drops_before_its_parts),
      cmocka_unit_test(test_slow_drip_server_still_times_out_the_operation),
      cmocka_unit_test(test_idle_connection_closed_by_server_does_not_fail_next_op),
      cmocka_unit_test(test_failed_multipart_put_leaves_old_value_in_place),
      cmocka_unit_test(test_failed_multipart_put_keeps_items_and_used_true),
      cmocka_unit_test(test_ops_in_flight_when_server_dies_complete_exactly_once),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
