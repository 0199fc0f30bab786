/* tests/test_server_reserve.c - kvtier-server's reserved PUT path: the RMA
 * read of a PUT lands in a block reserved in the server's DRAM tier, which
 * is published only once the bytes are all there (written through to NVMe
 * first when there is a second tier). What must hold: round trips on a
 * dram server and on a dram+nvme server (across a restart); a GET of a key
 * whose replacement is in flight sees the old value, a DEL meanwhile wins
 * until the PUT completes; a client that dies mid-transfer leaves the old
 * value and no reserved memory behind; concurrent PUTs of one key leave one
 * whole value; a full DRAM tier refuses (--evict none) or drops (lru) as
 * before; a stop with a transfer in flight ends with 0; many keys put,
 * read and deleted at once under eviction (below). The server's DRAM
 * `used` counts reserved blocks, so the tests read it to see that a PUT
 * took this path and that nothing stays reserved.
 *
 * A "stalled" PUT is sent from a raw endpoint whose HELLO names a second
 * endpoint that then stops driving progress: the server's RMA read from it
 * waits until the test drives it again, or closes it (the read then fails).
 * Runs the server in this process on 127.0.0.1 (tests/fixtures/server_fixture.c);
 * skips (77) without the provider. */
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

#include "../transport/kvt_proto.h"
#include "../transport/kvt_transport.h"
#include "kvtier.h"
#include "server_fixture.h"
#include "tier_test_util.h"

static kvt_ctx *ctx;
static const char *self_path; /* argv[0]: the child that dies mid-PUT runs it */

#define REC_HDR 32u /* the server's record header (SRV_REC_HDR) */

static int64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static kvt_key key_of(uint32_t a, uint32_t b) {
  kvt_key k;
  memset(&k, 0x6D, sizeof(k));
  memcpy(k.bytes, &a, 4);
  memcpy(k.bytes + 4, &b, 4);
  return k;
}

/* What the DRAM tier holds for a value of len bytes (256-byte granules). */
static uint64_t held(uint64_t len) { return (REC_HDR + len + 255) & ~(uint64_t)255; }

static int open_tier(const srv_fixture *f, int timeout_ms, kvt_tier **t) {
  char spec[256];
  srv_spec(f, spec, sizeof(spec), "default", "", timeout_ms, NULL);
  return kvt_tier_open(ctx, spec, t);
}

/* Waits up to 5 s for the server's counter to read want; returns its value. */
static uint64_t wait_stat(const srv_fixture *f, const char *name, uint64_t want) {
  uint64_t v = srv_stat(f, name);
  for (const int64_t end = ms_now() + 5000; v != want && ms_now() < end; v = srv_stat(f, name))
    sleep_ms(50);
  return v;
}

static void put_checked(kvt_tier *t, const kvt_key *k, const uint8_t *v, uint64_t len) {
  assert_int_equal(kvt_tier_put(t, k, v, len), 0);
}

static void get_equals(kvt_tier *t, const kvt_key *k, const uint8_t *v, uint64_t len) {
  uint8_t *got = malloc(len + 1);
  assert_non_null(got);
  uint64_t n = UINT64_MAX;
  const int rc = kvt_tier_get(t, k, got, len + 1, &n);
  const int same = rc == 0 && n == len && memcmp(got, v, len) == 0;
  free(got);
  if (!same)
    fail_msg("GET: %s, %llu bytes, %s", kvt_err_name(rc), (unsigned long long)n,
             rc == 0 && n == len ? "other bytes" : "expected the value put");
}

/* ---- a PUT whose RMA read the test holds up ---- */

typedef struct raw {
  kvt_fab *f;
  uint64_t to;
  uint8_t *buf; /* 2 x KVT_PROTO_MSG_MAX: send half, receive half */
  kvt_fab_mr mr;
} raw;

static void raw_open(raw *r, const srv_fixture *srv) {
  char err[256], port[16];
  snprintf(port, sizeof(port), "%d", srv->port);
  kvt_fab_config fc = {
      .provider = KVT_FAB_DEFAULT_PROVIDER, .peer_node = "127.0.0.1", .peer_service = port};
  assert_int_equal(kvt_fab_open(&fc, &r->f, err, sizeof(err)), 0);
  assert_int_equal(kvt_fab_av_insert_host(r->f, "127.0.0.1", port, &r->to), 0);
  r->buf = aligned_alloc(4096, 2 * KVT_PROTO_MSG_MAX);
  assert_non_null(r->buf);
  assert_int_equal(kvt_fab_mr_reg(r->f, r->buf, 2 * KVT_PROTO_MSG_MAX, KVT_FAB_LOCAL, &r->mr), 0);
}

static void raw_close(raw *r) {
  if (!r->f)
    return;
  kvt_fab_mr_dereg(&r->mr);
  kvt_fab_close(r->f);
  free(r->buf);
  r->f = NULL;
}

static void raw_send(raw *r, const kvt_proto_msg *m) {
  size_t len = 0;
  assert_int_equal(kvt_proto_encode(m, r->buf, KVT_PROTO_MSG_MAX, &len), 0);
  kvt_fab_ctx sent = {0};
  int rc = -EAGAIN;
  const int64_t end = ms_now() + 5000;
  while (rc == -EAGAIN && ms_now() < end)
    rc = kvt_fab_send(r->f, r->to, r->buf, len, r->mr.desc, &sent);
  assert_int_equal(rc, 0);
  while (ms_now() < end) {
    kvt_fab_comp c[16];
    const int n = kvt_fab_poll(r->f, c, 16);
    for (int j = 0; j < n; j++)
      if (c[j].ctx == &sent) {
        assert_int_equal(c[j].err, 0);
        return;
      }
    if (n <= 0)
      kvt_fab_wait(r->f, -1, 1);
  }
  fail_msg("a raw send did not complete in 5 s");
}

typedef struct stalled {
  raw a, b; /* a sends; b is the HELLO's address: replies and the server's RMA go to it */
  uint64_t session;
  kvt_fab_ctx rctx;
  uint8_t *payload;
  uint64_t len;
  kvt_fab_mr pmr;
} stalled;

static void stalled_post_recv(stalled *s) {
  assert_int_equal(
      kvt_fab_recv(s->b.f, s->b.buf + KVT_PROTO_MSG_MAX, KVT_PROTO_MSG_MAX, s->b.mr.desc, &s->rctx),
      0);
}

/* Drives b until the reply to request id arrives; returns its status, or
 * -ETIMEDOUT. */
static int stalled_wait(stalled *s, uint64_t id, kvt_proto_msg *rep, int timeout_ms) {
  for (const int64_t end = ms_now() + timeout_ms; ms_now() < end;) {
    kvt_fab_comp c[4];
    const int n = kvt_fab_poll(s->b.f, c, 4);
    for (int j = 0; j < n; j++) {
      if (c[j].ctx != &s->rctx)
        continue;
      const int ok =
          c[j].err == 0 && kvt_proto_decode(s->b.buf + KVT_PROTO_MSG_MAX, c[j].len, rep) == 0;
      stalled_post_recv(s);
      if (ok && rep->h.req_id == id)
        return rep->h.status;
    }
    if (n <= 0)
      kvt_fab_wait(s->b.f, -1, 1);
  }
  return -ETIMEDOUT;
}

static void stalled_open(stalled *s, const srv_fixture *f, uint64_t len, uint64_t seed) {
  memset(s, 0, sizeof(*s));
  raw_open(&s->a, f);
  raw_open(&s->b, f);
  uint8_t addr[KVT_PROTO_ADDR_MAX];
  size_t alen = sizeof(addr);
  assert_int_equal(kvt_fab_getname(s->b.f, addr, &alen), 0);
  stalled_post_recv(s);
  kvt_proto_msg m, rep;
  kvt_proto_init(&m, KVT_PROTO_HELLO, 77, 0);
  m.u.hello.addr = addr;
  m.u.hello.addr_len = (uint16_t)alen;
  snprintf(m.u.hello.tenant, sizeof(m.u.hello.tenant), "default");
  raw_send(&s->a, &m);
  assert_int_equal(stalled_wait(s, 77, &rep, 5000), 0);
  s->session = rep.h.session;
  s->len = len;
  s->payload = aligned_alloc(4096, len ? (len + 4095) & ~(uint64_t)4095 : 4096);
  assert_non_null(s->payload);
  fill(s->payload, len, seed);
  assert_int_equal(kvt_fab_mr_reg(s->b.f, s->payload, len, KVT_FAB_REMOTE_READ, &s->pmr), 0);
}

/* Sends the PUT; the server's read of b's payload then waits for b. */
static void stalled_put(stalled *s, const kvt_key *k, uint64_t id) {
  kvt_proto_msg m;
  kvt_proto_init(&m, KVT_PROTO_PUT, id, s->session);
  m.u.data.key = *k;
  m.u.data.len = s->len;
  m.u.data.rma_addr = kvt_fab_mr_addr(&s->pmr, s->payload, 0);
  m.u.data.rma_key = s->pmr.key;
  raw_send(&s->a, &m);
}

static void stalled_close(stalled *s) {
  kvt_fab_mr_dereg(&s->pmr);
  raw_close(&s->b); /* the server's read from it fails now */
  raw_close(&s->a);
  free(s->payload);
  s->payload = NULL;
}

/* ---- round trips ---- */

static const uint64_t sizes[] = {1, 31, 224, 225, 4096, 65537, (1u << 20) + 3, 4u << 20};
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

static void test_reserved_puts_round_trip_on_a_dram_server(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:64MiB", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, 5000, &t), 0);
  uint8_t *v = malloc(4u << 20);
  assert_non_null(v);
  uint64_t used = 0;
  for (uint32_t i = 0; i < N_SIZES; i++) {
    const kvt_key k = key_of(1, i);
    fill(v, sizes[i], i);
    put_checked(t, &k, v, sizes[i]);
    used += held(sizes[i]);
  }
  const kvt_key k0 = key_of(1, 100);
  put_checked(t, &k0, v, 0); /* an empty value: no transfer, the copying path */
  used += held(0);
  for (uint32_t i = 0; i < N_SIZES; i++) { /* replaced by values of other sizes */
    const kvt_key k = key_of(1, i);
    const uint64_t len = sizes[N_SIZES - 1 - i];
    fill(v, len, 1000 + i);
    put_checked(t, &k, v, len);
    used += held(len) - held(sizes[i]);
  }
  for (uint32_t i = 0; i < N_SIZES; i++) {
    const kvt_key k = key_of(1, i);
    const uint64_t len = sizes[N_SIZES - 1 - i];
    fill(v, len, 1000 + i);
    get_equals(t, &k, v, len);
    uint64_t q = 0;
    assert_int_equal(kvt_tier_query(t, &k, &q), 0);
    assert_int_equal(q, len);
  }
  get_equals(t, &k0, v, 0);
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.items, N_SIZES + 1);
  assert_int_equal(s.used, used); /* the values, and no block left reserved */
  assert_int_equal(srv_stat(&f, "puts_total"), 2 * N_SIZES + 1);
  assert_int_equal(srv_stat(&f, "errors_total"), 0);
  free(v);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 25);
}

static void test_reserved_puts_on_dram_nvme_are_durable_and_cached(void **state) {
  (void)state;
  char dir[256], tiers[400];
  assert_int_equal(srv_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(tiers, sizeof(tiers), "dram:16MiB;nvme:%s:128MiB", dir);
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", tiers, NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, 5000, &t), 0);
  enum { N = 24 };
  uint8_t *v = malloc(1u << 20);
  assert_non_null(v);
  for (uint32_t i = 0; i < N; i++) { /* more than DRAM holds: copies are dropped */
    const kvt_key k = key_of(2, i);
    fill(v, (1u << 20) - i * 1000, i);
    put_checked(t, &k, v, (1u << 20) - i * 1000);
  }
  for (uint32_t i = 0; i < N; i += 3) { /* replaced */
    const kvt_key k = key_of(2, i);
    fill(v, 5000 + i, 500 + i);
    put_checked(t, &k, v, 5000 + i);
  }
  const uint64_t dram = srv_stat(&f, "dram_used_bytes");
  assert_true(dram > 0 && dram <= 16u << 20); /* the cache tier holds copies */
  for (uint32_t i = 0; i < N; i++) {
    const kvt_key k = key_of(2, i);
    const uint64_t len = i % 3 ? (1u << 20) - i * 1000 : 5000 + i;
    fill(v, len, i % 3 ? i : 500 + i);
    get_equals(t, &k, v, len);
  }
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 25);
  srv_start_or_fail(&f); /* empty DRAM: everything comes from NVMe */
  assert_int_equal(open_tier(&f, 5000, &t), 0);
  for (uint32_t i = 0; i < N; i++) {
    const kvt_key k = key_of(2, i);
    const uint64_t len = i % 3 ? (1u << 20) - i * 1000 : 5000 + i;
    fill(v, len, i % 3 ? i : 500 + i);
    get_equals(t, &k, v, len);
  }
  assert_int_equal(srv_stat(&f, "items"), N);
  free(v);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 25);
  srv_rmdir(dir);
}

/* ---- a replacement in flight ---- */

static void test_get_and_del_while_a_replacement_is_in_flight(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:64MiB", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, 5000, &t), 0);
  const kvt_key k = key_of(3, 0);
  const uint64_t old_len = 300000, new_len = 2u << 20;
  uint8_t *old = malloc(old_len);
  assert_non_null(old);
  fill(old, old_len, 31);
  put_checked(t, &k, old, old_len);
  const uint64_t base = held(old_len);

  stalled s;
  stalled_open(&s, &f, new_len, 32);
  stalled_put(&s, &k, 1001);
  /* Its block is reserved (DRAM holds both), the old value is what is served. */
  assert_int_equal(wait_stat(&f, "used_bytes", base + held(new_len)), base + held(new_len));
  get_equals(t, &k, old, old_len);
  uint64_t q = 0;
  assert_int_equal(kvt_tier_query(t, &k, &q), 0);
  assert_int_equal(q, old_len);
  kvt_proto_msg rep;
  assert_int_equal(stalled_wait(&s, 1001, &rep, 5000), 0); /* b answers the read: done */
  get_equals(t, &k, s.payload, new_len);
  assert_int_equal(wait_stat(&f, "used_bytes", held(new_len)), held(new_len));

  /* A DEL while a replacement is in flight: gone until the PUT completes,
   * which then stores its value (as a PUT after the DEL would). */
  fill(s.payload, new_len, 33);
  stalled_put(&s, &k, 1002);
  assert_int_equal(wait_stat(&f, "used_bytes", 2 * held(new_len)), 2 * held(new_len));
  assert_int_equal(kvt_tier_del(t, &k), 0);
  uint64_t n = 0;
  assert_int_equal(kvt_tier_get(t, &k, old, old_len, &n), KVT_ENOTFOUND);
  assert_int_equal(stalled_wait(&s, 1002, &rep, 5000), 0);
  get_equals(t, &k, s.payload, new_len);
  kvt_tier_stats st = {.struct_size = sizeof(st)};
  assert_int_equal(kvt_tier_stats_get(t, &st), 0);
  assert_int_equal(st.items, 1);
  assert_int_equal(st.used, held(new_len));
  stalled_close(&s);
  free(old);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 25);
}

/* ---- clients that die ---- */

#define DIE_LEN (48u << 20)

/* The child of the test below: PUTs DIE_LEN bytes under key (5, 0) until
 * it is killed. */
static int child_put_forever(const char *spec) {
  kvt_ctx *own = NULL;
  kvt_tier *t = NULL;
  uint8_t *v = malloc(DIE_LEN);
  if (!v || kvt_ctx_create(NULL, &own) || kvt_tier_open(own, spec, &t))
    return 2;
  fill(v, DIE_LEN, 55);
  const kvt_key k = key_of(5, 0);
  printf("putting\n");
  fflush(stdout);
  for (;;)
    (void)kvt_tier_put(t, &k, v, DIE_LEN);
}

static void test_a_put_whose_client_dies_mid_transfer_leaves_the_old_value(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:256MiB", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, 5000, &t), 0);
  const kvt_key k = key_of(5, 0);
  const uint64_t old_len = 100000;
  uint8_t *old = malloc(old_len), *big = malloc(DIE_LEN);
  assert_true(old && big);
  fill(old, old_len, 50);
  fill(big, DIE_LEN, 55);
  put_checked(t, &k, old, old_len);

  /* An endpoint that stops answering, then goes away: the read fails. */
  stalled s;
  stalled_open(&s, &f, 4u << 20, 51);
  stalled_put(&s, &k, 2001);
  assert_int_equal(wait_stat(&f, "used_bytes", held(old_len) + held(4u << 20)),
                   held(old_len) + held(4u << 20));
  stalled_close(&s);
  assert_int_equal(wait_stat(&f, "used_bytes", held(old_len)), held(old_len));
  get_equals(t, &k, old, old_len);

  /* A process killed at some point of its PUTs, five times. */
  char spec[256];
  srv_spec(&f, spec, sizeof(spec), "default", "", 5000, NULL);
  for (int round = 0; round < 5; round++) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      execl(self_path, self_path, "--child-put", spec, (char *)NULL);
      _exit(127);
    }
    close(fds[1]);
    char line[16] = {0};
    assert_true(read(fds[0], line, sizeof(line) - 1) > 0); /* it is connected */
    close(fds[0]);
    sleep_ms(5 + round * 7);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    /* Once the server saw the connection go, nothing stays reserved and the
     * key holds the old value or a whole new one. */
    uint64_t used = srv_stat(&f, "used_bytes");
    for (const int64_t end = ms_now() + 5000;
         used != held(old_len) && used != held(DIE_LEN) && ms_now() < end;)
      sleep_ms(50), used = srv_stat(&f, "used_bytes");
    uint64_t len = 0;
    uint8_t *got = malloc(DIE_LEN);
    assert_non_null(got);
    assert_int_equal(kvt_tier_get(t, &k, got, DIE_LEN, &len), 0);
    if (!(len == old_len && memcmp(got, old, old_len) == 0) &&
        !(len == DIE_LEN && memcmp(got, big, DIE_LEN) == 0))
      fail_msg("round %d: a value of %llu bytes that was never put", round,
               (unsigned long long)len);
    free(got);
    assert_int_equal(srv_stat(&f, "used_bytes"), held(len));
  }
  put_checked(t, &k, old, old_len); /* still serving */
  get_equals(t, &k, old, old_len);
  free(old);
  free(big);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 25);
}

static void test_a_stop_with_a_put_in_flight_ends_0_and_keeps_the_old_value(void **state) {
  (void)state;
  char dir[256], tiers[400];
  assert_int_equal(srv_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(tiers, sizeof(tiers), "dram:16MiB;nvme:%s:64MiB", dir);
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", tiers, NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, 5000, &t), 0);
  const kvt_key k = key_of(6, 0);
  uint8_t old[5000];
  fill(old, sizeof(old), 60);
  put_checked(t, &k, old, sizeof(old));
  kvt_tier_close(t);
  stalled s;
  stalled_open(&s, &f, 1u << 20, 61);
  stalled_put(&s, &k, 3001);
  assert_int_equal(wait_stat(&f, "dram_used_bytes", held(sizeof(old)) + held(1u << 20)),
                   held(sizeof(old)) + held(1u << 20));
  /* The drain gives up on the read after 10 s; the block goes back before
   * the tiers close. */
  srv_stop_cleanly(&f, 25);
  stalled_close(&s);
  srv_start_or_fail(&f);
  assert_int_equal(open_tier(&f, 5000, &t), 0);
  get_equals(t, &k, old, sizeof(old));
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 25);
  srv_rmdir(dir);
}

/* A GET served in place whose client stops reading keeps its value lent; a
 * PUT of that key then waits on a worker for the reader. A stop (SIGTERM in
 * the program) must still end: the drain gives up on the GET after 10 s, and the loan has to go
 * back before the workers are joined (it went back after, and the exit
 * hung). */
static void test_a_stop_with_a_stuck_get_and_a_waiting_put_ends_0(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:64MiB", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, 5000, &t), 0);
  const kvt_key k = key_of(7, 0);
  const uint64_t len = 8u << 20; /* more than the sockets buffer: the write stalls */
  uint8_t *v = malloc(len);
  assert_non_null(v);
  fill(v, len, 70);
  put_checked(t, &k, v, len);
  kvt_tier_close(t);

  stalled s;
  stalled_open(&s, &f, len, 71);
  kvt_fab_mr_dereg(&s.pmr);
  assert_int_equal(kvt_fab_mr_reg(s.b.f, s.payload, len, KVT_FAB_REMOTE_WRITE, &s.pmr), 0);
  kvt_proto_msg m;
  kvt_proto_init(&m, KVT_PROTO_GET, 4001, s.session);
  m.u.data.key = k;
  m.u.data.len = len;
  m.u.data.rma_addr = kvt_fab_mr_addr(&s.pmr, s.payload, 0);
  m.u.data.rma_key = s.pmr.key;
  raw_send(&s.a, &m);
  sleep_ms(300); /* the server has lent the value and started writing */

  /* A replacement from a client with a short timeout: its commit waits for
   * the stuck reader, on a worker; the client gives up. */
  assert_int_equal(open_tier(&f, 1500, &t), 0);
  fill(v, len, 72);
  const int rc = kvt_tier_put(t, &k, v, len);
  assert_true(rc == 0 || rc == -ETIMEDOUT || rc == -ECONNRESET);
  kvt_tier_close(t);

  const int64_t t0 = ms_now();
  srv_stop_cleanly(&f, 25); /* fails if the server does not end with 0 within 25 s */
  assert_true(ms_now() - t0 < 20000);
  stalled_close(&s);
  free(v);
}

/* ---- concurrency ---- */

#define V_HEAD 16
#define V_MAX (3u << 20)
#define WRITERS 4
#define READERS 3

typedef struct shared {
  char spec[256];
  atomic_int stop;
  atomic_uint max_version[WRITERS]; /* highest version each writer put (attempted) */
  const char *wrong;
  atomic_ulong gets_ok, puts_ok;
  pthread_mutex_t mu;
} shared;

static uint64_t v_len(uint32_t w, uint32_t ver) {
  return V_HEAD + ((uint64_t)w * 7717 + (uint64_t)ver * 977 * 1031) % (V_MAX - V_HEAD);
}

static void v_make(uint8_t *p, uint32_t w, uint32_t ver) {
  const uint64_t n = v_len(w, ver);
  memcpy(p, &w, 4);
  memcpy(p + 4, &ver, 4);
  memcpy(p + 8, &n, 8);
  fill(p + V_HEAD, n - V_HEAD, ((uint64_t)w << 32) | ver);
}

/* A GET must return exactly one value ever put under the key. */
static const char *v_check(shared *sh, const uint8_t *got, uint64_t len, uint8_t *scratch) {
  uint32_t w, ver;
  uint64_t n;
  if (len < V_HEAD)
    return "short value";
  memcpy(&w, got, 4);
  memcpy(&ver, got + 4, 4);
  memcpy(&n, got + 8, 8);
  if (w >= WRITERS || ver == 0 || ver > atomic_load(&sh->max_version[w]))
    return "a version never put";
  if (len != n || len != v_len(w, ver))
    return "wrong length for its version";
  v_make(scratch, w, ver);
  return memcmp(scratch, got, len) ? "bytes differ from what was put" : NULL;
}

static void set_wrong(shared *sh, const char *why) {
  pthread_mutex_lock(&sh->mu);
  if (!sh->wrong)
    sh->wrong = why;
  pthread_mutex_unlock(&sh->mu);
  atomic_store(&sh->stop, 1);
}

typedef struct worker {
  shared *sh;
  uint32_t id;
  int qd; /* PUTs in flight at once (writers) */
} worker;

static const kvt_key shared_key = {{0x11, 0x22, 0x33, 0x44}};

static void *reader_main(void *arg) {
  worker *w = arg;
  shared *sh = w->sh;
  kvt_ctx *own = NULL;
  kvt_tier *t = NULL;
  uint8_t *got = malloc(V_MAX), *scratch = malloc(V_MAX);
  if (!got || !scratch || kvt_ctx_create(NULL, &own) || kvt_tier_open(own, sh->spec, &t)) {
    set_wrong(sh, "reader: open");
  } else {
    while (!atomic_load(&sh->stop)) {
      uint64_t len = 0;
      const int rc = kvt_tier_get(t, &shared_key, got, V_MAX, &len);
      const char *why = rc == 0               ? v_check(sh, got, len, scratch)
                        : rc == KVT_ENOTFOUND ? NULL
                                              : "a GET failed";
      if (why) {
        set_wrong(sh, why);
        break;
      }
      if (rc == 0)
        atomic_fetch_add(&sh->gets_ok, 1);
    }
  }
  kvt_tier_close(t);
  kvt_ctx_destroy(own);
  free(got);
  free(scratch);
  return NULL;
}

/* Puts new versions of shared_key, qd at once, until told to stop. */
static void *writer_main(void *arg) {
  worker *w = arg;
  shared *sh = w->sh;
  kvt_ctx *own = NULL;
  kvt_tier *t = NULL;
  uint8_t *bufs = malloc((size_t)w->qd * V_MAX);
  if (!bufs || kvt_ctx_create(NULL, &own) || kvt_tier_open(own, sh->spec, &t)) {
    set_wrong(sh, "writer: open");
    goto out;
  }
  uint32_t ver = atomic_load(&sh->max_version[w->id]);
  while (!atomic_load(&sh->stop)) {
    kvt_tier_op ops[8], *ptrs[8], *done[8];
    for (int i = 0; i < w->qd; i++) {
      uint8_t *b = bufs + (size_t)i * V_MAX;
      v_make(b, w->id, ++ver);
      atomic_store(&sh->max_version[w->id], ver);
      kvt_tier_op_init(&ops[i], KVT_TIER_PUT, &shared_key, b, v_len(w->id, ver), 0);
      ptrs[i] = &ops[i];
    }
    int sub = 0, got = 0;
    while (sub < w->qd) {
      const int r = kvt_tier_submit(t, ptrs + sub, (size_t)(w->qd - sub));
      if (r < 0) {
        set_wrong(sh, "writer: submit");
        goto out;
      }
      sub += r;
    }
    while (got < w->qd) {
      const int r = kvt_tier_poll(t, done + got, (size_t)(w->qd - got), 10000);
      if (r <= 0) {
        set_wrong(sh, "writer: no completion in 10 s");
        goto out;
      }
      got += r;
    }
    for (int i = 0; i < w->qd; i++)
      if (ops[i].result != 0) {
        set_wrong(sh, "a PUT failed");
        goto out;
      }
    atomic_fetch_add(&sh->puts_ok, (unsigned long)w->qd);
  }
out:
  kvt_tier_close(t);
  kvt_ctx_destroy(own);
  free(bufs);
  return NULL;
}

/* writers PUT shared_key (qd each at once) while READERS GET it, for ms
 * (longer, up to 60 s, until both did some: sanitizer builds are slow). */
static void run_writers_and_readers(const srv_fixture *f, int writers, int qd, int ms) {
  static shared sh;
  memset(&sh, 0, sizeof(sh));
  pthread_mutex_init(&sh.mu, NULL);
  srv_spec(f, sh.spec, sizeof(sh.spec), "default", "", 10000, NULL);
  kvt_tier *t; /* a first value: readers check from the start */
  assert_int_equal(open_tier(f, 10000, &t), 0);
  uint8_t *v = malloc(V_MAX);
  assert_non_null(v);
  v_make(v, 0, 1);
  atomic_store(&sh.max_version[0], 1);
  put_checked(t, &shared_key, v, v_len(0, 1));
  free(v);
  kvt_tier_close(t);
  worker w[WRITERS + READERS];
  pthread_t th[WRITERS + READERS];
  const int n = writers + READERS;
  for (int i = 0; i < n; i++) {
    w[i] = (worker){.sh = &sh, .id = (uint32_t)(i < writers ? i : i - writers), .qd = qd};
    assert_int_equal(pthread_create(&th[i], NULL, i < writers ? writer_main : reader_main, &w[i]),
                     0);
  }
  const int64_t t0 = ms_now();
  while (!atomic_load(&sh.stop) && ms_now() - t0 < 60000 &&
         (ms_now() - t0 < ms || atomic_load(&sh.gets_ok) < 20 || atomic_load(&sh.puts_ok) < 20))
    sleep_ms(20);
  atomic_store(&sh.stop, 1);
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
  pthread_mutex_destroy(&sh.mu);
  print_message("%lu PUTs, %lu GETs checked\n", (unsigned long)atomic_load(&sh.puts_ok),
                (unsigned long)atomic_load(&sh.gets_ok));
  if (sh.wrong)
    fail_msg("%s", sh.wrong);
  assert_true(atomic_load(&sh.gets_ok) > 0 && atomic_load(&sh.puts_ok) > 0);
}

/* The key holds one whole value of some writer, and the server nothing else. */
static void check_final(const srv_fixture *f, int dram_only) {
  kvt_tier *t;
  assert_int_equal(open_tier(f, 5000, &t), 0);
  uint8_t *got = malloc(V_MAX), *scratch = malloc(V_MAX);
  assert_true(got && scratch);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(t, &shared_key, got, V_MAX, &len), 0);
  uint32_t wid, ver;
  memcpy(&wid, got, 4);
  memcpy(&ver, got + 4, 4);
  assert_true(wid < WRITERS && len == v_len(wid, ver));
  v_make(scratch, wid, ver);
  assert_memory_equal(scratch, got, len);
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.items, 1);
  if (dram_only)
    assert_int_equal(s.used, held(len));
  else
    assert_int_equal(wait_stat(f, "dram_used_bytes", held(len)), held(len));
  free(got);
  free(scratch);
  kvt_tier_close(t);
}

static void test_replacing_a_value_while_gets_run_never_returns_wrong_bytes(void **state) {
  (void)state;
  char dir[256], tiers[400];
  assert_int_equal(srv_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(tiers, sizeof(tiers), "dram:64MiB;nvme:%s:256MiB", dir);
  const char *specs[2] = {"dram:64MiB", tiers};
  for (int i = 0; i < 2; i++) {
    srv_fixture f = {0};
    srv_set_args(&f, "--tiers", specs[i], NULL);
    srv_start_or_fail(&f);
    run_writers_and_readers(&f, 1, 1, 2500);
    check_final(&f, i == 0);
    assert_int_equal(srv_stat(&f, "errors_total"), 0);
    srv_stop_cleanly(&f, 25);
  }
  srv_rmdir(dir);
}

static void test_concurrent_puts_of_one_key_leave_one_whole_value(void **state) {
  (void)state;
  srv_fixture f = {0};
  /* 4 writers x 4 x up to 3 MiB in flight: more than half the DRAM tier,
   * so some PUTs take the copying path meanwhile. */
  srv_set_args(&f, "--tiers", "dram:64MiB", NULL);
  srv_start_or_fail(&f);
  run_writers_and_readers(&f, WRITERS, 4, 3000);
  check_final(&f, 1);
  assert_int_equal(srv_stat(&f, "errors_total"), 0);
  srv_stop_cleanly(&f, 25);
}

/* ---- a full DRAM tier ---- */

static void test_a_full_dram_tier_with_evict_none_refuses_and_keeps_its_values(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:8MiB", "--evict", "none", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, 5000, &t), 0);
  const uint64_t len = 1u << 20;
  uint8_t *v = malloc(len);
  assert_non_null(v);
  uint32_t n = 0;
  int rc = 0;
  for (; n < 16; n++) {
    const kvt_key k = key_of(7, n);
    fill(v, len, n);
    if ((rc = kvt_tier_put(t, &k, v, len)) != 0)
      break;
  }
  assert_int_equal(rc, -ENOSPC);
  assert_true(n >= 6 && n < 8);
  const kvt_key k0 = key_of(7, 0); /* a replacement needs room for both values */
  fill(v, len, 999);
  assert_int_equal(kvt_tier_put(t, &k0, v, len), -ENOSPC);
  for (uint32_t i = 0; i < n; i++) {
    const kvt_key k = key_of(7, i);
    fill(v, len, i);
    get_equals(t, &k, v, len);
  }
  assert_int_equal(kvt_tier_del(t, &k0), 0); /* room again */
  const kvt_key kn = key_of(7, n);
  fill(v, len, n);
  put_checked(t, &kn, v, len);
  get_equals(t, &kn, v, len);
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.items, n);
  assert_int_equal(s.used, n * held(len));
  assert_int_equal(srv_stat(&f, "evictions_total"), 0);
  free(v);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 25);
}

typedef struct seen {
  int n;
  kvt_key keys[16];
} seen;

static int collect(void *opaque, const kvt_key *key, uint64_t len) {
  seen *s = opaque;
  (void)len;
  if (s->n < 16)
    s->keys[s->n++] = *key;
  return 0;
}

static void test_a_full_dram_tier_with_evict_lru_keeps_taking_puts(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:8MiB", "--evict", "lru", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, 10000, &t), 0);
  enum { QD = 8, ROUNDS = 6 };
  const uint64_t len = 1u << 20;
  uint8_t *bufs = malloc(QD * len);
  assert_non_null(bufs);
  /* QD at once: 8 MiB in flight, more than reservations may hold (half the
   * tier), so some take the copying path and drop values for room. */
  for (uint32_t r = 0; r < ROUNDS; r++) {
    kvt_tier_op ops[QD], *ptrs[QD], *done[QD];
    for (uint32_t i = 0; i < QD; i++) {
      const kvt_key k = key_of(8, r * QD + i);
      fill(bufs + i * len, len, r * QD + i);
      kvt_tier_op_init(&ops[i], KVT_TIER_PUT, &k, bufs + i * len, len, i);
      ptrs[i] = &ops[i];
    }
    int sub = 0, got = 0;
    while (sub < QD) {
      const int n = kvt_tier_submit(t, ptrs + sub, QD - sub);
      assert_true(n > 0);
      sub += n;
    }
    while (got < QD) {
      const int n = kvt_tier_poll(t, done + got, QD - got, 10000);
      assert_true(n > 0);
      got += n;
    }
    for (uint32_t i = 0; i < QD; i++)
      assert_int_equal(ops[i].result, 0);
  }
  /* What is still held is what was put (of the last rounds: older values
   * were dropped first), and fits the tier. */
  seen sn = {0};
  assert_int_equal(kvt_tier_list(t, collect, &sn), 0);
  assert_true(sn.n >= 1 && sn.n <= 7);
  for (int i = 0; i < sn.n; i++) {
    uint32_t a, b;
    memcpy(&a, sn.keys[i].bytes, 4);
    memcpy(&b, sn.keys[i].bytes + 4, 4);
    assert_int_equal(a, 8);
    assert_true(b >= (ROUNDS - 2) * QD);
    fill(bufs, len, b);
    get_equals(t, &sn.keys[i], bufs, len);
  }
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.items, (uint64_t)sn.n);
  assert_int_equal(s.used, s.items * held(len)); /* nothing reserved is left */
  assert_int_equal(srv_stat(&f, "evictions_total") + s.items, (uint64_t)ROUNDS * QD);
  assert_int_equal(srv_stat(&f, "errors_total"), 0);
  free(bufs);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 25);
}

/* ---- many keys under eviction ----
 *
 * Many keys put, read and deleted at once on a small DRAM tier with
 * --evict lru, so that reservations, evictions (of values, or of copies in
 * front of NVMe), DELs and GETs served in place all overlap. What must
 * hold: every GET returns NOT_FOUND or exactly a value once put under that
 * key; PUTs fail only with -ENOSPC; once quiet, the DRAM tier holds exactly
 * the values indexed (nothing stays reserved); with NVMe below, a restart
 * serves the same values. */

#define MIX_NK 12 /* keys */
#define MIX_V_HEAD 16
#define MIX_V_MAX (700u << 10)
#define MIX_WRITERS 3
#define MIX_READERS 2

static kvt_key mix_key(uint32_t k) {
  kvt_key key;
  memset(&key, 0x5A, sizeof(key));
  memcpy(key.bytes, &k, 4);
  return key;
}

static uint64_t mix_len(uint32_t k, uint32_t ver) {
  return MIX_V_HEAD + ((uint64_t)k * 40009 + (uint64_t)ver * 977 * 1031) % (MIX_V_MAX - MIX_V_HEAD);
}

static void mix_make(uint8_t *p, uint32_t k, uint32_t ver) {
  const uint64_t n = mix_len(k, ver);
  memcpy(p, &k, 4);
  memcpy(p + 4, &ver, 4);
  memcpy(p + 8, &n, 8);
  fill(p + MIX_V_HEAD, n - MIX_V_HEAD, ((uint64_t)k << 32) | ver);
}

typedef struct mix_shared {
  char spec[256];
  atomic_int stop;
  atomic_uint version[MIX_NK]; /* highest version of each key handed to a writer */
  atomic_ulong gets_ok, puts_ok, puts_full, dels;
  pthread_mutex_t mu;
  const char *wrong;
} mix_shared;

static void mix_set_wrong(mix_shared *sh, const char *why) {
  pthread_mutex_lock(&sh->mu);
  if (!sh->wrong)
    sh->wrong = why;
  pthread_mutex_unlock(&sh->mu);
  atomic_store(&sh->stop, 1);
}

/* NULL when got is a whole value once put under key k. */
static const char *mix_check(mix_shared *sh, uint32_t k, const uint8_t *got, uint64_t len,
                             uint8_t *scratch) {
  uint32_t gk, ver;
  uint64_t n;
  if (len < MIX_V_HEAD)
    return "short value";
  memcpy(&gk, got, 4);
  memcpy(&ver, got + 4, 4);
  memcpy(&n, got + 8, 8);
  if (gk != k)
    return "another key's value";
  if (ver == 0 || ver > atomic_load(&sh->version[k]))
    return "a version never put";
  if (len != n || len != mix_len(k, ver))
    return "wrong length for its version";
  mix_make(scratch, k, ver);
  return memcmp(scratch, got, len) ? "bytes differ from what was put" : NULL;
}

typedef struct mix_worker {
  mix_shared *sh;
  uint32_t id;
} mix_worker;

static uint32_t mix_rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return (uint32_t)(*s >> 11);
}

static void *mix_writer_main(void *arg) {
  mix_worker *w = arg;
  mix_shared *sh = w->sh;
  kvt_ctx *own = NULL;
  kvt_tier *t = NULL;
  uint8_t *buf = malloc(MIX_V_MAX);
  uint64_t s = 0x1234567ull + w->id * 7919;
  if (!buf || kvt_ctx_create(NULL, &own) || kvt_tier_open(own, sh->spec, &t)) {
    mix_set_wrong(sh, "writer: open");
    goto out;
  }
  while (!atomic_load(&sh->stop)) {
    const uint32_t k = mix_rnd(&s) % MIX_NK;
    const kvt_key key = mix_key(k);
    if (w->id == 0 && mix_rnd(&s) % 8 == 0) { /* DELs now and then */
      const int rc = kvt_tier_del(t, &key);
      if (rc != 0 && rc != KVT_ENOTFOUND) {
        mix_set_wrong(sh, "a DEL failed");
        break;
      }
      atomic_fetch_add(&sh->dels, 1);
      continue;
    }
    const uint32_t ver = atomic_fetch_add(&sh->version[k], 1) + 1;
    mix_make(buf, k, ver);
    const int rc = kvt_tier_put(t, &key, buf, mix_len(k, ver));
    if (rc == -ENOSPC) {
      atomic_fetch_add(&sh->puts_full, 1);
    } else if (rc != 0) {
      mix_set_wrong(sh, "a PUT failed other than -ENOSPC");
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

static void *mix_reader_main(void *arg) {
  mix_worker *w = arg;
  mix_shared *sh = w->sh;
  kvt_ctx *own = NULL;
  kvt_tier *t = NULL;
  uint8_t *got = malloc(MIX_V_MAX), *scratch = malloc(MIX_V_MAX);
  uint64_t s = 0x7654321ull + w->id * 104729;
  if (!got || !scratch || kvt_ctx_create(NULL, &own) || kvt_tier_open(own, sh->spec, &t)) {
    mix_set_wrong(sh, "reader: open");
  } else {
    while (!atomic_load(&sh->stop)) {
      const uint32_t k = mix_rnd(&s) % MIX_NK;
      const kvt_key key = mix_key(k);
      uint64_t len = 0;
      const int rc = kvt_tier_get(t, &key, got, MIX_V_MAX, &len);
      const char *why = rc == 0               ? mix_check(sh, k, got, len, scratch)
                        : rc == KVT_ENOTFOUND ? NULL
                                              : "a GET failed";
      if (why) {
        mix_set_wrong(sh, why);
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

static void run_mix(mix_shared *sh, const srv_fixture *f, int ms) {
  memset(sh, 0, sizeof(*sh));
  pthread_mutex_init(&sh->mu, NULL);
  srv_spec(f, sh->spec, sizeof(sh->spec), "default", "", 10000, NULL);
  mix_worker w[MIX_WRITERS + MIX_READERS];
  pthread_t th[MIX_WRITERS + MIX_READERS];
  for (int i = 0; i < MIX_WRITERS + MIX_READERS; i++) {
    w[i] = (mix_worker){.sh = sh, .id = (uint32_t)(i < MIX_WRITERS ? i : i - MIX_WRITERS)};
    assert_int_equal(
        pthread_create(&th[i], NULL, i < MIX_WRITERS ? mix_writer_main : mix_reader_main, &w[i]),
        0);
  }
  const int64_t t0 = ms_now();
  while (!atomic_load(&sh->stop) && ms_now() - t0 < 60000 &&
         (ms_now() - t0 < ms || atomic_load(&sh->gets_ok) < 50 || atomic_load(&sh->puts_ok) < 50))
    sleep_ms(20);
  atomic_store(&sh->stop, 1);
  for (int i = 0; i < MIX_WRITERS + MIX_READERS; i++)
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
static uint64_t snapshot(mix_shared *sh, const srv_fixture *f, uint64_t lens[MIX_NK],
                         uint8_t *data) {
  kvt_tier *t;
  char spec[256];
  srv_spec(f, spec, sizeof(spec), "default", "", 10000, NULL);
  assert_int_equal(kvt_tier_open(ctx, spec, &t), 0);
  uint8_t *scratch = malloc(MIX_V_MAX);
  assert_non_null(scratch);
  uint64_t sum = 0;
  for (uint32_t k = 0; k < MIX_NK; k++) {
    const kvt_key key = mix_key(k);
    uint64_t len = 0;
    const int rc = kvt_tier_get(t, &key, data + (size_t)k * MIX_V_MAX, MIX_V_MAX, &len);
    if (rc == KVT_ENOTFOUND) {
      lens[k] = UINT64_MAX;
      continue;
    }
    assert_int_equal(rc, 0);
    const char *why = mix_check(sh, k, data + (size_t)k * MIX_V_MAX, len, scratch);
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
  static mix_shared sh;
  run_mix(&sh, &f, 3000);
  uint64_t lens[MIX_NK];
  uint8_t *data = malloc((size_t)MIX_NK * MIX_V_MAX);
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
  static mix_shared sh;
  run_mix(&sh, &f, 3000);
  uint64_t lens[MIX_NK], lens2[MIX_NK];
  uint8_t *data = malloc((size_t)MIX_NK * MIX_V_MAX), *data2 = malloc((size_t)MIX_NK * MIX_V_MAX);
  assert_true(data && data2);
  (void)snapshot(&sh, &f, lens, data);
  assert_int_equal(srv_stat(&f, "errors_total"), 0);
  srv_stop_cleanly(&f, 25);
  srv_start_or_fail(&f);
  (void)snapshot(&sh, &f, lens2, data2);
  for (uint32_t k = 0; k < MIX_NK; k++) {
    assert_int_equal(lens2[k], lens[k]);
    if (lens[k] != UINT64_MAX)
      assert_memory_equal(data2 + (size_t)k * MIX_V_MAX, data + (size_t)k * MIX_V_MAX, lens[k]);
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

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child-put") == 0)
    return child_put_forever(argv[2]);
  self_path = argv[0];
  if (!srv_can_run())
    return 77;
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_reserved_puts_round_trip_on_a_dram_server, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_reserved_puts_on_dram_nvme_are_durable_and_cached,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_get_and_del_while_a_replacement_is_in_flight,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_a_put_whose_client_dies_mid_transfer_leaves_the_old_value,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_a_stop_with_a_stuck_get_and_a_waiting_put_ends_0,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_a_stop_with_a_put_in_flight_ends_0_and_keeps_the_old_value,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_many_keys_with_evict_lru_on_one_dram_tier, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_many_keys_with_evict_lru_on_dram_and_nvme_survive_a_restart,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_replacing_a_value_while_gets_run_never_returns_wrong_bytes,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_concurrent_puts_of_one_key_leave_one_whole_value,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_a_full_dram_tier_with_evict_none_refuses_and_keeps_its_values,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_a_full_dram_tier_with_evict_lru_keeps_taking_puts,
                                srv_kill_leftovers),
  };
  return cmocka_run_group_tests_name("kvtier-server reserved PUTs", tests, setup, teardown);
}
