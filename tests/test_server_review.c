/* tests/test_server_review.c - regression guards from an adversarial review
 * of kvtier-server and the fabric tier: what a hostile peer on the fabric
 * must not be able to do. Guessing memory-registration keys must reach no
 * registered buffer, of a client or of the server (tcp;ofi_rxm checks no
 * access flags); forged replies sent to a client's endpoint must not
 * complete its GETs; a flood of HELLOs (without a token, or with another
 * tenant's) must not end a live session; one session whose RMA never
 * completes must not take every request slot of the server. Runs
 * kvtier-server on 127.0.0.1 (tests/server_fixture.h); skips (77) without it
 * or the provider. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <dirent.h>

#include "../transport/kvt_proto.h"
#include "../transport/kvt_transport.h"
#include "kvtier.h"
#include "server_fixture.h"
#include "tier_test_util.h"

static kvt_ctx *ctx;

static int64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static kvt_key key_of(uint32_t a) {
  kvt_key k;
  memset(&k, 0x5A, sizeof(k));
  memcpy(k.bytes, &a, 4);
  return k;
}

/* A raw endpoint with a registered message buffer, and the server in its AV. */
typedef struct raw {
  kvt_fab *f;
  uint64_t to;
  uint8_t *buf; /* 2 x KVT_PROTO_MSG_MAX: send half, receive half */
  kvt_fab_mr mr;
} raw;

static void raw_open(raw *r, const srv_fixture *srv, int no_post_wait) {
  char err[256], port[16];
  snprintf(port, sizeof(port), "%d", srv ? srv->port : 0);
  kvt_fab_config fc = {.provider = KVT_FAB_DEFAULT_PROVIDER, .peer_node = "127.0.0.1",
                       .peer_service = srv ? port : NULL, .no_post_wait = no_post_wait};
  if (!srv) {
    fc.node = "127.0.0.1";
    fc.service = "0";
    fc.peer_node = NULL;
  }
  assert_int_equal(kvt_fab_open(&fc, &r->f, err, sizeof(err)), 0);
  r->to = KVT_FAB_ADDR_NONE;
  if (srv)
    assert_int_equal(kvt_fab_av_insert_host(r->f, "127.0.0.1", port, &r->to), 0);
  r->buf = aligned_alloc(4096, 2 * KVT_PROTO_MSG_MAX);
  assert_non_null(r->buf);
  assert_int_equal(kvt_fab_mr_reg(r->f, r->buf, 2 * KVT_PROTO_MSG_MAX, KVT_FAB_LOCAL, &r->mr), 0);
}

static void raw_close(raw *r) {
  kvt_fab_mr_dereg(&r->mr);
  kvt_fab_close(r->f);
  free(r->buf);
}

/* Encodes m and sends it to r->to, driving r until the send completed.
 * Returns 0, the send's error, or -ETIMEDOUT. */
static int raw_try_send(raw *r, const kvt_proto_msg *m, int timeout_ms) {
  size_t len = 0;
  assert_int_equal(kvt_proto_encode(m, r->buf, KVT_PROTO_MSG_MAX, &len), 0);
  kvt_fab_ctx sent = {0};
  int rc = -EAGAIN;
  const int64_t end = ms_now() + timeout_ms;
  while (rc == -EAGAIN && ms_now() < end)
    rc = kvt_fab_send(r->f, r->to, r->buf, len, r->mr.desc, &sent);
  while (rc == 0 && ms_now() < end) {
    kvt_fab_comp c[16];
    const int n = kvt_fab_poll(r->f, c, 16);
    for (int j = 0; j < n; j++)
      if (c[j].ctx == &sent)
        return c[j].err;
    if (n <= 0)
      kvt_fab_wait(r->f, -1, 1);
  }
  return rc ? rc : -ETIMEDOUT;
}

static void raw_send(raw *r, const kvt_proto_msg *m) {
  assert_int_equal(raw_try_send(r, m, 5000), 0);
}

static void hello_of(kvt_proto_msg *m, const uint8_t *addr, size_t alen, const char *tenant,
                     const char *token) {
  kvt_proto_init(m, KVT_PROTO_HELLO, 77, 0);
  m->u.hello.addr = addr;
  m->u.hello.addr_len = (uint16_t)alen;
  snprintf(m->u.hello.tenant, sizeof(m->u.hello.tenant), "%s", tenant);
  snprintf(m->u.hello.token, sizeof(m->u.hello.token), "%s", token);
}

/* ---- registration keys ---- */

/* One RMA from a fresh endpoint (the provider drops a connection after a
 * refused access, so every guess gets its own) at a region of victim's:
 * a read of 64 bytes into loot, or a write of them. Returns the completion's
 * status (a write's success only says the bytes left: check the target). */
static int try_rma(kvt_fab *victim, const uint8_t *addr, int write, uint64_t raddr, uint64_t key,
                   uint8_t *loot) {
  raw thief;
  raw_open(&thief, NULL, 1);
  uint64_t peer;
  assert_int_equal(kvt_fab_av_insert(thief.f, addr, &peer), 0);
  kvt_fab_ctx cx = {0};
  int rc = -EAGAIN;
  for (const int64_t end = ms_now() + 3000; rc == -EAGAIN && ms_now() < end;) {
    kvt_fab_progress(victim); /* the connection needs both sides driven */
    kvt_fab_progress(thief.f);
    rc = write ? kvt_fab_write(thief.f, peer, thief.buf, 64, thief.mr.desc, raddr, key, &cx)
               : kvt_fab_read(thief.f, peer, thief.buf, 64, thief.mr.desc, raddr, key, &cx);
  }
  for (const int64_t end = ms_now() + 3000; rc == 0 && ms_now() < end;) {
    kvt_fab_progress(victim);
    kvt_fab_comp c[4];
    const int n = kvt_fab_poll(thief.f, c, 4);
    if (n > 0) {
      rc = c[0].err;
      if (rc == 0 && !write)
        memcpy(loot, thief.buf, 64);
      break;
    }
    kvt_fab_wait(thief.f, -1, 1);
  }
  for (int i = 0; i < 20; i++) /* a write that did go out lands now */
    kvt_fab_progress(victim);
  raw_close(&thief);
  return rc;
}

/* tcp;ofi_rxm takes the registrant's keys and offsets from 0 as RMA
 * addresses: with keys from a counter, any peer that can reach an endpoint
 * reads a PUT's payload or writes into a GET's buffer with key 1, 2, ... */
static void test_a_peer_cannot_guess_registration_keys(void **state) {
  (void)state;
  raw victim;
  raw_open(&victim, NULL, 0); /* registers its message buffer first, as the tier does */
  static uint8_t secret[4096], before[4096], loot[64];
  fill(secret, sizeof(secret), 99);
  memcpy(before, secret, sizeof(secret));
  kvt_fab_mr mr[2];
  assert_int_equal(kvt_fab_mr_reg(victim.f, secret, 2048, KVT_FAB_REMOTE_READ, &mr[0]), 0);
  assert_int_equal(kvt_fab_mr_reg(victim.f, secret + 2048, 2048, KVT_FAB_REMOTE_WRITE, &mr[1]), 0);
  uint8_t addr[KVT_PROTO_ADDR_MAX];
  size_t alen = sizeof(addr);
  assert_int_equal(kvt_fab_getname(victim.f, addr, &alen), 0);
  int reads_ok = 0;
  for (uint64_t key = 1; key <= 3; key++) { /* what a counter would have handed out */
    memset(loot, 0, sizeof(loot));
    reads_ok += try_rma(victim.f, addr, 0, mr[0].base, key, loot) == 0;
    assert_null(memmem(loot, sizeof(loot), secret, 16));
    (void)try_rma(victim.f, addr, 1, mr[1].base, key, loot);
  }
  assert_int_equal(reads_ok, 0);
  assert_memory_equal(secret, before, sizeof(secret));
  kvt_fab_mr_dereg(&mr[0]);
  kvt_fab_mr_dereg(&mr[1]);
  raw_close(&victim);
}

static const char *two_tenants[] = {"--tiers", "dram:16MiB", "--tenant", "alice:secret-a",
                                    "--tenant", "bob:secret-b", NULL};

/* tcp;ofi_rxm does not check a region's access flags on a peer's RMA: the
 * server's own regions (registered for local use only) answered guessed
 * keys too. Key 1 was its message pool, where every client's HELLO, token
 * included, is received: any peer, without a session, read it. */
static void test_a_peer_cannot_read_the_servers_memory(void **state) {
  (void)state;
  srv_fixture f = {0};
  memcpy(f.args, two_tenants, sizeof(two_tenants));
  srv_start_or_fail(&f);
  char spec[256];
  srv_spec(&f, spec, sizeof(spec), "alice", "secret-a", 2000, NULL);
  kvt_tier *t;
  assert_int_equal(kvt_tier_open(ctx, spec, &t), 0); /* its HELLO lies in the pool now */
  const size_t len = 4u << 20;
  uint8_t *loot = aligned_alloc(4096, len);
  assert_non_null(loot);
  int ok = 0;
  for (uint64_t key = 1; key <= 3; key++) {
    raw thief;
    raw_open(&thief, &f, 0);
    kvt_fab_mr mr;
    assert_int_equal(kvt_fab_mr_reg(thief.f, loot, len, KVT_FAB_LOCAL, &mr), 0);
    memset(loot, 0, len);
    kvt_fab_ctx cx = {0};
    int rc = kvt_fab_read(thief.f, thief.to, loot, len, mr.desc, 0, key, &cx);
    for (const int64_t end = ms_now() + 3000; rc == 0 && ms_now() < end;) {
      kvt_fab_comp c[4];
      const int n = kvt_fab_poll(thief.f, c, 4);
      if (n > 0) {
        rc = c[0].err;
        ok += rc == 0;
        break;
      }
      kvt_fab_wait(thief.f, -1, 1);
    }
    assert_null(memmem(loot, len, "secret-a", 8));
    kvt_fab_mr_dereg(&mr);
    raw_close(&thief);
  }
  free(loot);
  assert_int_equal(ok, 0);
  /* Still serving. */
  const kvt_key k = key_of(3);
  uint8_t v[100], got[100];
  uint64_t n = 0;
  fill(v, sizeof(v), 3);
  assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &n), 0);
  assert_memory_equal(got, v, sizeof(v));
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
}

/* ---- sessions ---- */

/* The session table used to replace its least recently active idle session
 * when full, whoever asked: 1024 HELLOs without a token ended every other
 * client's session, whose next request was then dropped (a timeout). */
static void test_hello_floods_do_not_end_another_clients_session(void **state) {
  (void)state;
  srv_fixture f = {0};
  memcpy(f.args, two_tenants, sizeof(two_tenants));
  srv_start_or_fail(&f);
  char spec[256];
  srv_spec(&f, spec, sizeof(spec), "alice", "secret-a", 2000, NULL);
  kvt_tier *t;
  assert_int_equal(kvt_tier_open(ctx, spec, &t), 0);
  const kvt_key k = key_of(1);
  uint8_t v[1000], got[1000];
  fill(v, sizeof(v), 1);
  assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);

  raw r;
  raw_open(&r, &f, 0);
  uint8_t addr[KVT_PROTO_ADDR_MAX];
  size_t alen = sizeof(addr);
  assert_int_equal(kvt_fab_getname(r.f, addr, &alen), 0);
  kvt_proto_msg m;
  hello_of(&m, addr, alen, "", ""); /* stats-only: no token needed */
  for (int i = 0; i < 1100; i++)
    raw_send(&r, &m);
  hello_of(&m, addr, alen, "bob", "secret-b"); /* another tenant's, with its token */
  for (int i = 0; i < 1100; i++)
    raw_send(&r, &m);
  raw_close(&r);

  uint64_t n = 0;
  memset(got, 0, sizeof(got));
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &n), 0);
  assert_int_equal(n, sizeof(v));
  assert_memory_equal(got, v, sizeof(v));
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
}

/* ---- forged replies ---- */

/* Ports on 127.0.0.1 that this process listens on (its fabric endpoints):
 * /proc/net/tcp's listening sockets whose inode is one of our fds. */
static int our_listen_ports(int *ports, int max) {
  unsigned long inodes[256];
  int ni = 0, n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return 0;
  for (struct dirent *e; (e = readdir(d)) != NULL && ni < 256;) {
    char path[300], link[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    const ssize_t l = readlink(path, link, sizeof(link) - 1);
    if (l > 0) {
      link[l] = 0;
      if (sscanf(link, "socket:[%lu]", &inodes[ni]) == 1)
        ni++;
    }
  }
  closedir(d);
  FILE *f = fopen("/proc/net/tcp", "r");
  char line[512];
  while (f && fgets(line, sizeof(line), f) && n < max) {
    unsigned addr, port, st;
    unsigned long ino;
    if (sscanf(line, " %*d: %x:%x %*x:%*x %x %*s %*s %*s %*s %*s %lu", &addr, &port, &st,
               &ino) != 4 || st != 0x0A || addr != 0x0100007Fu)
      continue;
    for (int i = 0; i < ni; i++)
      if (inodes[i] == ino)
        ports[n++] = (int)port;
  }
  if (f)
    fclose(f);
  return n;
}

/* The fabric tier's request ids used to count (op n had id n << 16 | slot)
 * and any message naming one was believed: a peer that reached the tier's
 * endpoint completed an in-flight GET with success and whatever its buffer
 * held; and a message that did not decode dropped the connection. */
static void test_forged_replies_are_not_believed(void **state) {
  (void)state;
  if (!srv_binary_present())
    skip(); /* the server is frozen with SIGSTOP: it must be a process of its own */
  srv_fixture f = {.binary = 1};
  memcpy(f.args, two_tenants, sizeof(two_tenants));
  srv_start_or_fail(&f);
  char spec[256];
  srv_spec(&f, spec, sizeof(spec), "alice", "secret-a", 1500, NULL);
  kvt_tier *t;
  assert_int_equal(kvt_tier_open(ctx, spec, &t), 0);
  const kvt_key k = key_of(9);
  uint8_t v[100], got[100];
  fill(v, sizeof(v), 9);
  assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);
  int ports[16];
  const int np = our_listen_ports(ports, 16); /* the tier's endpoint among them */
  assert_true(np > 0);
  raw atk;
  raw_open(&atk, NULL, 1);
  assert_true(f.pid > 0);
  kill(f.pid, SIGSTOP); /* the GET stays in flight */
  memset(got, 0xEE, sizeof(got));
  kvt_tier_op op = {.opcode = KVT_TIER_GET, .key = k, .buf = got, .len = sizeof(got)};
  kvt_tier_op *ops[1] = {&op};
  assert_int_equal(kvt_tier_submit(t, ops, 1), 1);
  for (int p = 0; p < np; p++) {
    char port[16];
    snprintf(port, sizeof(port), "%d", ports[p]);
    assert_int_equal(kvt_fab_av_insert_host(atk.f, "127.0.0.1", port, &atk.to), 0);
    kvt_proto_msg m;
    for (uint64_t id = 1; id <= 4; id++)
      for (uint64_t sl = 0; sl < 2; sl++) {
        kvt_proto_init(&m, KVT_PROTO_GET | KVT_PROTO_REPLY, id << 16 | sl, 0);
        m.u.len.len = sizeof(v);
        (void)raw_try_send(&atk, &m, 300); /* to every port: some are not the tier's */
      }
    kvt_proto_init(&m, KVT_PROTO_STATS, 1, 0); /* not a reply at all */
    (void)raw_try_send(&atk, &m, 300);
  }
  kvt_tier_op *done[1];
  const int n = kvt_tier_poll(t, done, 1, 10000);
  kill(f.pid, SIGCONT);
  raw_close(&atk);
  assert_int_equal(n, 1);
  assert_int_equal(op.result, -ETIMEDOUT); /* the server never answered */
  uint64_t len = 0;
  int rc = -1;
  for (int i = 0; i < 20 && rc != 0; i++) /* reconnects */
    rc = kvt_tier_get(t, &k, got, sizeof(got), &len);
  assert_int_equal(rc, 0);
  assert_memory_equal(got, v, sizeof(v));
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
}

/* ---- request slots ---- */

/* One session used to be able to hold every request slot of the server: its
 * first PUT's RMA read stalls (its endpoint never answers), the rest wait
 * for --max-inflight, each in a slot, and no other client is heard again. */
static void test_a_stalled_session_does_not_take_every_request_slot(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:16MiB", "--tenant", "alice:secret-a", "--tenant", "bob:secret-b", "--max-inflight", "64KiB", NULL);
  srv_start_or_fail(&f);
  /* alice's requests go out from a, naming b, which then stops driving its
   * endpoint: the server's RMA reads from b never complete. */
  raw a, b;
  raw_open(&a, &f, 0);
  raw_open(&b, &f, 0);
  uint8_t addr[KVT_PROTO_ADDR_MAX];
  size_t alen = sizeof(addr);
  assert_int_equal(kvt_fab_getname(b.f, addr, &alen), 0);
  kvt_fab_ctx rctx = {0};
  assert_int_equal(
      kvt_fab_recv(b.f, b.buf + KVT_PROTO_MSG_MAX, KVT_PROTO_MSG_MAX, b.mr.desc, &rctx), 0);
  kvt_proto_msg m, rep;
  hello_of(&m, addr, alen, "alice", "secret-a");
  raw_send(&a, &m);
  uint64_t session = 0;
  for (const int64_t end = ms_now() + 5000; !session && ms_now() < end;) {
    kvt_fab_comp c[4];
    const int n = kvt_fab_poll(b.f, c, 4);
    for (int j = 0; j < n; j++)
      if (c[j].ctx == &rctx && c[j].err == 0 &&
          kvt_proto_decode(b.buf + KVT_PROTO_MSG_MAX, c[j].len, &rep) == 0)
        session = rep.h.status == 0 ? rep.h.session : 0;
    if (n <= 0)
      kvt_fab_wait(b.f, -1, 1);
  }
  assert_true(session != 0);
  static uint8_t payload[64 << 10];
  kvt_fab_mr pmr;
  assert_int_equal(kvt_fab_mr_reg(b.f, payload, sizeof(payload), KVT_FAB_REMOTE_READ, &pmr), 0);
  for (int i = 0; i < 300; i++) {
    kvt_proto_init(&m, KVT_PROTO_PUT, 1000 + (uint64_t)i, session);
    m.u.data.key = key_of(100 + (uint32_t)i);
    m.u.data.len = sizeof(payload);
    m.u.data.rma_addr = kvt_fab_mr_addr(&pmr, payload, 0);
    m.u.data.rma_key = pmr.key;
    raw_send(&a, &m);
  }
  /* bob is still served. */
  char spec[256];
  srv_spec(&f, spec, sizeof(spec), "bob", "secret-b", 3000, NULL);
  kvt_tier *t = NULL;
  const int64_t t0 = ms_now();
  int rc = kvt_tier_open(ctx, spec, &t);
  const kvt_key k = key_of(7);
  uint8_t v[500], got[500];
  fill(v, sizeof(v), 7);
  if (rc == 0)
    rc = kvt_tier_put(t, &k, v, sizeof(v));
  uint64_t n = 0;
  if (rc == 0)
    rc = kvt_tier_get(t, &k, got, sizeof(got), &n);
  const int64_t took = ms_now() - t0;
  /* Let the stalled reads go: b's endpoint closes, they fail. */
  kvt_fab_mr_dereg(&pmr);
  raw_close(&b);
  raw_close(&a);
  assert_int_equal(rc, 0);
  assert_memory_equal(got, v, sizeof(v));
  assert_true(took < 3000);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
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
      cmocka_unit_test(test_a_peer_cannot_guess_registration_keys),
      cmocka_unit_test_teardown(test_a_peer_cannot_read_the_servers_memory, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_forged_replies_are_not_believed, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_hello_floods_do_not_end_another_clients_session,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_a_stalled_session_does_not_take_every_request_slot,
                                srv_kill_leftovers),
  };
  return cmocka_run_group_tests_name("kvtier-server review", tests, setup, teardown);
}
