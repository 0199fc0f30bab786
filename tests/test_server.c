/* tests/test_server.c - the server engine (kvtier/server.h) as its clients
 * see it, run in this process on 127.0.0.1 (tests/fixtures/server_fixture.c): the
 * API's refusals and life cycle, wrong tokens refused at open, tenants
 * isolated from each other, oversize requests refused, eight clients at
 * once, a stop drains and a restart finds the NVMe values, a server gone
 * and back, malformed messages and requests under sessions the server never
 * opened change nothing, the counters by request; and what a hostile peer
 * on the fabric must not be able to do: guessing memory-registration keys
 * reaches no registered buffer, of a client or of the server (tcp;ofi_rxm
 * checks no access flags); forged replies sent to a client's endpoint do
 * not complete its GETs; a flood of HELLOs (without a token, or with
 * another tenant's) does not end a live session; one session whose RMA
 * never completes does not take every request slot. The program itself:
 * test_server_program.c. Skips (77) without the provider. */
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

static int open_tier(const srv_fixture *f, const char *tenant, const char *token, int timeout_ms,
                     kvt_tier **t) {
  char spec[256];
  srv_spec(f, spec, sizeof(spec), tenant, token, timeout_ms, NULL);
  return kvt_tier_open(ctx, spec, t);
}

static kvt_key key_of(uint32_t a, uint32_t b) {
  kvt_key k;
  memset(&k, 0x3C, sizeof(k));
  memcpy(k.bytes, &a, 4);
  memcpy(k.bytes + 4, &b, 4);
  return k;
}

/* ---- listing ---- */

#define LIST_KEYS 3000

typedef struct walk {
  kvt_tier *t;
  int listed[LIST_KEYS + 200];
  int calls, added;
  int deleted[LIST_KEYS];
} walk;

/* Lists while the tier changes under the walk (the callback runs between
 * pages): deletes keys, replaces keys already listed and not yet listed
 * (a replaced value keeps its place), adds new ones. */
static int walk_cb(void *opaque, const kvt_key *key, uint64_t len) {
  walk *w = opaque;
  (void)len;
  uint32_t id;
  memcpy(&id, key->bytes, 4);
  if (id < LIST_KEYS + 200)
    w->listed[id]++;
  w->calls++;
  uint8_t v[16];
  fill(v, sizeof(v), w->calls);
  if (w->calls % 7 == 0) { /* delete a key from the far end */
    const uint32_t d = LIST_KEYS - 1 - (uint32_t)(w->calls / 7);
    const kvt_key k = key_of(d, 0);
    if (kvt_tier_del(w->t, &k) == 0)
      w->deleted[d] = 1;
  }
  if (w->calls % 11 == 0 && id < LIST_KEYS) { /* replace one listed and one ahead */
    const kvt_key k1 = key_of(id, 0), k2 = key_of((id + 500) % LIST_KEYS, 0);
    if (!w->deleted[id])
      assert_int_equal(kvt_tier_put(w->t, &k1, v, sizeof(v)), 0);
    if (!w->deleted[(id + 500) % LIST_KEYS])
      assert_int_equal(kvt_tier_put(w->t, &k2, v, sizeof(v)), 0);
  }
  if (id + 1 < LIST_KEYS && !w->deleted[id + 1]) {
    /* the next key: at a page's end, the one the next page starts at */
    const kvt_key k = key_of(id + 1, 0);
    assert_int_equal(kvt_tier_put(w->t, &k, v, sizeof(v)), 0);
  }
  if (w->calls % 13 == 0 && w->added < 200) {
    const kvt_key k = key_of(LIST_KEYS + (uint32_t)w->added++, 0);
    assert_int_equal(kvt_tier_put(w->t, &k, v, sizeof(v)), 0);
  }
  return 0;
}

static void test_list_pages_show_every_held_key_once_while_keys_change(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:64MiB", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, "default", "", 5000, &t), 0);
  uint8_t v[16];
  for (uint32_t i = 0; i < LIST_KEYS; i++) {
    const kvt_key k = key_of(i, 0);
    fill(v, sizeof(v), i);
    assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);
  }
  for (int round = 0; round < 2; round++) {
    walk *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    w->t = t;
    if (round == 1) /* keys already deleted stay deleted */
      for (uint32_t i = 0; i < LIST_KEYS; i++) {
        uint64_t len;
        const kvt_key k = key_of(i, 0);
        w->deleted[i] = kvt_tier_query(t, &k, &len) == KVT_ENOTFOUND;
      }
    assert_int_equal(kvt_tier_list(t, walk_cb, w), 0);
    for (uint32_t i = 0; i < LIST_KEYS + 200; i++) {
      if (w->listed[i] > 1)
        fail_msg("round %d: key %u listed %d times", round, i, w->listed[i]);
      if (i < LIST_KEYS && !w->deleted[i] && w->listed[i] != 1)
        fail_msg("round %d: key %u, held throughout, not listed", round, i);
    }
    assert_true(w->calls > 2000);
    free(w);
  }
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
}

/* ---- authentication and tenants ---- */

static const char *two_tenants[] = {"--tiers",  "dram:32MiB",
                                    "--tenant", "alice:secret-a-0123456789",
                                    "--tenant", "bob:secret-b-0123456789",
                                    NULL};

static void test_wrong_token_or_unknown_tenant_is_refused_at_open(void **state) {
  (void)state;
  srv_fixture f = {0};
  memcpy(f.args, two_tenants, sizeof(two_tenants));
  srv_start_or_fail(&f);
  kvt_tier *t = NULL;
  assert_int_equal(open_tier(&f, "alice", "secret-b-0123456789", 3000, &t), KVT_EAUTH);
  assert_null(t);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "alice"));
  assert_int_equal(open_tier(&f, "mallory", "secret-a-0123456789", 3000, &t), KVT_EAUTH);
  assert_int_equal(open_tier(&f, "alice", "", 3000, &t), KVT_EAUTH);
  assert_int_equal(open_tier(&f, "alice", "secret-a-0123456789", 3000, &t), 0);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
}

typedef struct seen {
  int n;
  kvt_key keys[16];
} seen;

static int collect(void *opaque, const kvt_key *key, uint64_t len) {
  seen *s = opaque;
  (void)len;
  if (s->n < 16)
    s->keys[s->n] = *key;
  s->n++;
  return 0;
}

static void test_tenants_cannot_read_delete_or_list_each_others_keys(void **state) {
  (void)state;
  srv_fixture f = {0};
  memcpy(f.args, two_tenants, sizeof(two_tenants));
  srv_start_or_fail(&f);
  kvt_tier *a, *b;
  assert_int_equal(open_tier(&f, "alice", "secret-a-0123456789", 3000, &a), 0);
  assert_int_equal(open_tier(&f, "bob", "secret-b-0123456789", 3000, &b), 0);
  const kvt_key k = key_of(1, 1);
  uint8_t va[1000], vb[700], got[1000];
  fill(va, sizeof(va), 1);
  fill(vb, sizeof(vb), 2);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(a, &k, va, sizeof(va)), 0);
  assert_int_equal(kvt_tier_get(b, &k, got, sizeof(got), &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(b, &k, &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_del(b, &k), KVT_ENOTFOUND);
  seen sb = {0};
  assert_int_equal(kvt_tier_list(b, collect, &sb), 0);
  assert_int_equal(sb.n, 0);
  /* The same key in bob's namespace is bob's own value. */
  assert_int_equal(kvt_tier_put(b, &k, vb, sizeof(vb)), 0);
  assert_int_equal(kvt_tier_get(a, &k, got, sizeof(got), &len), 0);
  assert_int_equal(len, sizeof(va));
  assert_memory_equal(got, va, sizeof(va));
  assert_int_equal(kvt_tier_get(b, &k, got, sizeof(got), &len), 0);
  assert_int_equal(len, sizeof(vb));
  assert_memory_equal(got, vb, sizeof(vb));
  assert_int_equal(kvt_tier_del(b, &k), 0);
  assert_int_equal(kvt_tier_get(a, &k, got, sizeof(got), &len), 0); /* alice's untouched */
  seen sa = {0};
  assert_int_equal(kvt_tier_list(a, collect, &sa), 0);
  assert_int_equal(sa.n, 1);
  assert_memory_equal(sa.keys[0].bytes, k.bytes, 16);
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(b, &s), 0);
  assert_int_equal(s.items, 0); /* bob's count, not the server's */
  kvt_tier_close(a);
  kvt_tier_close(b);
  srv_stop_cleanly(&f, 20);
}

/* ---- limits ---- */

static void test_oversize_put_is_refused_with_etoobig(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:16MiB", "--max-request", "1MiB", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, "default", "", 3000, &t), 0);
  const size_t big = (1u << 20) + 1;
  uint8_t *v = malloc(big), *got = malloc(big);
  assert_true(v && got);
  fill(v, big, 3);
  const kvt_key k = key_of(2, 1);
  assert_int_equal(kvt_tier_put(t, &k, v, big), KVT_ETOOBIG);
  uint64_t len = 0;
  assert_int_equal(kvt_tier_query(t, &k, &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_put(t, &k, v, big - 1), 0); /* the limit itself is fine */
  assert_int_equal(kvt_tier_get(t, &k, got, big, &len), 0);
  assert_int_equal(len, big - 1);
  assert_memory_equal(got, v, big - 1);
  free(v);
  free(got);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
}

/* ---- many clients ---- */

#define CLIENTS 8
#define ROUNDS 60
#define BATCH 16

typedef struct client {
  char spec[256]; /* built before the thread starts: the fixture is the main thread's */
  uint32_t id;
  const char *failed;
  int rc;
} client;

/* One round: a batch of async PUTs (more bytes than --max-inflight, so the
 * server defers some), then GETs of all of them, checked. */
static const char *client_round(kvt_tier *t, client *c, uint32_t round, uint8_t *bufs, size_t cap) {
  kvt_tier_op ops[BATCH], *ptrs[BATCH], *done[BATCH];
  for (int pass = 0; pass < 2; pass++) {
    for (uint32_t i = 0; i < BATCH; i++) {
      const uint64_t n = 1 + (round * 7919u + i * 104729u) % cap;
      uint8_t *b = bufs + i * cap;
      const kvt_key k = key_of(100 + c->id, round * BATCH + i);
      if (pass == 0)
        fill(b, n, ((uint64_t)c->id << 32) | (round * BATCH + i));
      kvt_tier_op_init(&ops[i], pass ? KVT_TIER_GET : KVT_TIER_PUT, &k, pass ? malloc(cap) : b,
                       pass ? cap : n, i);
      if (!ops[i].buf)
        return "out of memory";
      ptrs[i] = &ops[i];
    }
    int sub = 0, got = 0;
    while (sub < BATCH) {
      const int r = kvt_tier_submit(t, ptrs + sub, (size_t)(BATCH - sub));
      if (r < 0)
        return "submit";
      sub += r;
    }
    const time_t deadline = time(NULL) + 30;
    while (got < BATCH && time(NULL) < deadline) {
      const int r = kvt_tier_poll(t, done + got, (size_t)(BATCH - got), 200);
      if (r < 0)
        return "poll";
      got += r;
    }
    if (got < BATCH)
      return "completions missing after 30 s";
    for (uint32_t i = 0; i < BATCH; i++) {
      c->rc = ops[i].result;
      if (ops[i].result != 0) {
        if (pass)
          free(ops[i].buf);
        return pass ? "get" : "put";
      }
      if (pass) {
        const uint64_t n = 1 + (round * 7919u + i * 104729u) % cap;
        const int ok = ops[i].out_len == n && memcmp(ops[i].buf, bufs + i * cap, n) == 0;
        free(ops[i].buf);
        if (!ok)
          return "get returned other bytes";
      }
    }
  }
  return NULL;
}

static void *client_main(void *arg) {
  client *c = arg;
  kvt_tier *t = NULL;
  kvt_ctx *own = NULL; /* a context's error detail is for one thread */
  const size_t cap = 96 * 1024;
  uint8_t *bufs = malloc(BATCH * cap);
  if (!bufs || kvt_ctx_create(NULL, &own) != 0 || (c->rc = kvt_tier_open(own, c->spec, &t)) != 0) {
    c->failed = "open";
    free(bufs);
    kvt_ctx_destroy(own);
    return NULL;
  }
  for (uint32_t r = 0; r < ROUNDS && !c->failed; r++)
    c->failed = client_round(t, c, r, bufs, cap);
  kvt_tier_close(t);
  kvt_ctx_destroy(own);
  free(bufs);
  return NULL;
}

static void test_eight_clients_at_once_each_get_their_own_bytes(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:256MiB", "--max-inflight", "256KiB", NULL);
  srv_start_or_fail(&f);
  client c[CLIENTS];
  pthread_t th[CLIENTS];
  for (uint32_t i = 0; i < CLIENTS; i++) {
    c[i] = (client){.id = i};
    srv_spec(&f, c[i].spec, sizeof(c[i].spec), "default", "", 20000, NULL);
    assert_int_equal(pthread_create(&th[i], NULL, client_main, &c[i]), 0);
  }
  for (int i = 0; i < CLIENTS; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < CLIENTS; i++)
    if (c[i].failed)
      fail_msg("client %d: %s (%s)", i, c[i].failed, kvt_err_name(c[i].rc));
  /* Every value is held, or was dropped for room (the store is smaller
   * than what the clients put: --evict lru). */
  assert_int_equal(srv_stat(&f, "items") + srv_stat(&f, "evictions_total"),
                   (uint64_t)CLIENTS * ROUNDS * BATCH);
  assert_true(srv_stat(&f, "used_bytes") <= 256u << 20);
  assert_true(srv_stat(&f, "deferred_total") > 0); /* the bound held them */
  srv_stop_cleanly(&f, 20);
}

/* ---- stats ---- */

static void test_stats_fetch_gives_the_servers_counters(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:8MiB", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, "default", "", 3000, &t), 0);
  uint8_t v[5000];
  fill(v, sizeof(v), 9);
  for (uint32_t i = 0; i < 3; i++) {
    const kvt_key k = key_of(3, i);
    assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);
  }
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.capacity, 8u << 20);
  assert_int_equal(s.items, 3);
  assert_true(s.used >= 3 * sizeof(v));
  assert_string_equal(kvt_server_stat_name(0), "capacity_bytes");
  assert_null(kvt_server_stat_name(1000));
  assert_int_equal(srv_stat(&f, "puts_total"), 3);
  assert_int_equal(srv_stat(&f, "capacity_bytes"), 8u << 20);
  assert_int_equal(srv_stat(&f, "sessions"), 2); /* the tier's and the fetch's */
  /* With a tenant, its counters too; a wrong token is refused. */
  char port[16];
  snprintf(port, sizeof(port), "%d", f.port);
  uint64_t c[64];
  size_t n = 0;
  assert_int_equal(kvt_server_stats_fetch(ctx, "127.0.0.1", port, NULL, "default", "", c, 64, &n),
                   0);
  assert_true(n > 4 && n < 64);
  for (size_t i = 0; i < n; i++)
    if (!strcmp(kvt_server_stat_name(i), "tenant_items"))
      assert_int_equal(c[i], 3);
  assert_int_equal(kvt_server_stats_fetch(ctx, "127.0.0.1", port, NULL, "default", "x", c, 64, &n),
                   KVT_EAUTH);
  assert_int_equal(n, 0);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), port));
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
}

/* ---- the API ---- */

static void test_create_refuses_bad_configs_with_a_detail(void **state) {
  (void)state;
  static const struct {
    const char *tiers, *tenant, *tenant2, *detail;
    int workers;
  } bad[] = {
      {"dram:8MiB", "alice", NULL, "NAME:TOKEN", 0},
      {"dram:8MiB", "al ice:x", NULL, "1-64", 0},
      {"dram:8MiB", "alice:x-0123456789abcdef", "alice:y-0123456789abcdef", "twice", 0},
      /* what `--tenant prefill:$(cat FILE)` gives when FILE is missing */
      {"dram:8MiB", "prefill:", NULL, "tenant 'prefill': empty token", 0},
      {"dram:8MiB", "alice:0123456789abcde", NULL, "tenant 'alice': token of 15 bytes", 0},
      {"dram:8MiB", "ok:0123456789abcdef", "bob:", "tenant 'bob': empty token", 0},
      {"dram:1MiB;dram:1MiB;dram:1MiB", NULL, NULL, "two", 0},
      {"bogus:1", NULL, NULL, "bogus", 0},
      {"dram:8MiB", NULL, NULL, "workers", 300},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    const char *tenants[2] = {bad[i].tenant, bad[i].tenant2};
    kvt_server_config cfg = KVT_SERVER_CONFIG_INIT;
    cfg.listen_port = "0";
    cfg.tiers = bad[i].tiers;
    cfg.tenants = tenants;
    cfg.n_tenants = bad[i].tenant2 ? 2 : bad[i].tenant ? 1 : 0;
    cfg.workers = bad[i].workers;
    kvt_server *srv = (kvt_server *)&cfg; /* untouched on failure */
    assert_int_not_equal(kvt_server_create(ctx, &cfg, &srv), 0);
    assert_ptr_equal(srv, (kvt_server *)&cfg);
    if (!strstr(kvt_ctx_last_error(ctx), bad[i].detail))
      fail_msg("case %zu: '%s' does not name '%s'", i, kvt_ctx_last_error(ctx), bad[i].detail);
    assert_null(strstr(kvt_ctx_last_error(ctx), "0123456789abcde")); /* no token shown */
  }
  /* A token of KVT_SERVER_TOKEN_MAX + 1 bytes. */
  char long_spec[8 + KVT_SERVER_TOKEN_MAX + 2];
  snprintf(long_spec, sizeof(long_spec), "alice:%0*d", KVT_SERVER_TOKEN_MAX + 1, 7);
  const char *long_tenant[1] = {long_spec};
  kvt_server_config lc = KVT_SERVER_CONFIG_INIT;
  lc.listen_port = "0";
  lc.tenants = long_tenant;
  lc.n_tenants = 1;
  kvt_server *none = NULL;
  assert_int_equal(kvt_server_create(ctx, &lc, &none), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "tenant 'alice': token of 129 bytes"));
  assert_null(none);
  kvt_server_config old = KVT_SERVER_CONFIG_INIT;
  old.struct_size = sizeof(size_t);
  kvt_server *srv = NULL;
  assert_int_equal(kvt_server_create(ctx, &old, &srv), -EINVAL);
  assert_int_equal(kvt_server_create(NULL, &old, &srv), -EINVAL);
  assert_null(srv);
  assert_int_equal(kvt_server_run(NULL), -EINVAL);
  assert_int_equal(kvt_server_stop(NULL), -EINVAL);
  assert_string_equal(kvt_server_provider(NULL), "");
  kvt_server_destroy(NULL);
  assert_true(kvt_server_tenant_valid("alice-1.b_c"));
  assert_false(kvt_server_tenant_valid(""));
  assert_false(kvt_server_tenant_valid("a:b"));
}

/* A tier that fails to open (or a --tiers that does not split) is named in
 * the detail with its secrets as ***: kvtier-server prints the detail. */
static void test_create_never_shows_a_tiers_password_or_token(void **state) {
  (void)state;
  static const char *const tiers[] = {
      "fabric://127.0.0.1:1?token=S3cret-fabric-tok&timeout_ms=100",
      "dram:1MiB;fabric://127.0.0.1:1?tenant=a&token=S3cret-fabric-tok&timeout_ms=100",
      "dram:1MiB;dram:1MiB;fabric://127.0.0.1:1?token=S3cret-fabric-tok",
#ifdef KVT_HAVE_HIREDIS
      "redis://:S3cret-redis-pw@127.0.0.1:1?timeout_ms=100",
      "dram:1MiB;redis://alice:S3cret-redis-pw@127.0.0.1:1?timeout_ms=100",
#endif
  };
  for (size_t i = 0; i < sizeof(tiers) / sizeof(tiers[0]); i++) {
    kvt_server_config cfg = KVT_SERVER_CONFIG_INIT;
    cfg.listen_port = "0";
    cfg.tiers = tiers[i];
    kvt_server *srv = NULL;
    assert_int_not_equal(kvt_server_create(ctx, &cfg, &srv), 0);
    assert_null(srv);
    const char *detail = kvt_ctx_last_error(ctx);
    if (strstr(detail, "S3cret") || !strstr(detail, "***"))
      fail_msg("tiers '%s': the detail '%s' shows the secret", tiers[i], detail);
  }
}

/* Creates a server with cfg and destroys it; returns what create did. */
static int create_destroy(const kvt_server_config *cfg) {
  kvt_server *srv = NULL;
  const int rc = kvt_server_create(ctx, cfg, &srv);
  kvt_server_destroy(srv);
  return rc;
}

static void test_the_tokenless_default_tenant_is_served_on_loopback_only_unless_insecure(
    void **state) {
  (void)state;
  kvt_server_config cfg = KVT_SERVER_CONFIG_INIT;
  cfg.listen_port = "0";
  cfg.tiers = "dram:1MiB";
  cfg.workers = 1;
  static const char *const loopback[] = {"127.0.0.1", "127.0.0.2"};
  for (size_t i = 0; i < sizeof(loopback) / sizeof(loopback[0]); i++) {
    cfg.listen_host = loopback[i];
    if (create_destroy(&cfg) != 0)
      fail_msg("%s: %s", loopback[i], kvt_ctx_last_error(ctx));
  }
  /* Any other address: refused before anything opens, naming the host. */
  cfg.listen_host = "0.0.0.0";
  assert_int_equal(create_destroy(&cfg), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "listen host '0.0.0.0' is not loopback"));
  cfg.listen_host = "localhost.example.com";
  assert_int_equal(create_destroy(&cfg), -EINVAL);
  /* A flag beyond a 0.3.0 caller's struct_size reads as 0. */
  cfg.listen_host = "0.0.0.0";
  cfg.flags = KVT_SERVER_INSECURE;
  cfg.struct_size = offsetof(kvt_server_config, flags);
  assert_int_equal(create_destroy(&cfg), -EINVAL);
  cfg.struct_size = sizeof(cfg);
  if (create_destroy(&cfg) != 0) /* told so explicitly */
    fail_msg("insecure: %s", kvt_ctx_last_error(ctx));
  cfg.flags = 2;
  assert_int_equal(create_destroy(&cfg), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "flags"));
  /* With tenants (and their tokens), any address. */
  const char *tenants[1] = {"alice:0123456789abcdef"};
  cfg.flags = 0;
  cfg.tenants = tenants;
  cfg.n_tenants = 1;
  if (create_destroy(&cfg) != 0)
    fail_msg("0.0.0.0 with a tenant: %s", kvt_ctx_last_error(ctx));
}

static void test_a_server_stopped_before_it_runs_returns_at_once(void **state) {
  (void)state;
  kvt_server_config cfg = KVT_SERVER_CONFIG_INIT;
  cfg.listen_port = "0";
  cfg.tiers = "dram:8MiB";
  cfg.workers = 2;
  kvt_server *srv = NULL;
  assert_int_equal(kvt_server_create(ctx, &cfg, &srv), 0);
  char host[64];
  uint16_t port = 0;
  assert_int_equal(kvt_server_address(srv, host, sizeof(host), &port), 0);
  assert_string_equal(host, "127.0.0.1"); /* loopback unless told otherwise */
  assert_true(port > 0);
  assert_int_equal(kvt_server_address(srv, host, 3, &port), KVT_ENOBUFS);
  assert_non_null(strstr(kvt_server_provider(srv), "tcp"));
  assert_int_equal(kvt_server_stop(srv), 0);
  assert_int_equal(kvt_server_stop(srv), 0); /* any number of times */
  assert_int_equal(kvt_server_run(srv), 0);
  assert_int_equal(kvt_server_run(srv), -EINVAL); /* a server runs once */
  kvt_server_destroy(srv);
  /* Created and destroyed without running. */
  assert_int_equal(kvt_server_create(ctx, &cfg, &srv), 0);
  kvt_server_destroy(srv);
}

/* ---- hostile peers ---- */

/* Sends len bytes of buf to the server from a raw endpoint and drives it a
 * little; nothing is expected back. */
static void send_raw(kvt_fab *f, uint64_t to, uint8_t *buf, size_t len, void *desc) {
  kvt_fab_ctx sent = {0};
  int rc = -EAGAIN;
  for (int i = 0; i < 20 && rc == -EAGAIN; i++)
    rc = kvt_fab_send(f, to, buf, len, desc, &sent);
  assert_int_equal(rc, 0);
  for (int i = 0; i < 500; i++) {
    kvt_fab_comp c[4];
    const int n = kvt_fab_poll(f, c, 4);
    for (int j = 0; j < n; j++)
      if (c[j].ctx == &sent)
        return;
    kvt_fab_wait(f, -1, 2);
  }
}

static void test_malformed_and_unauthenticated_requests_leave_the_server_serving(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:8MiB", "--tenant", "alice:alice-token-0123456", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, "alice", "alice-token-0123456", 3000, &t), 0);
  const kvt_key k = key_of(6, 0);
  uint8_t v[300], got[300];
  fill(v, sizeof(v), 6);
  assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);

  char err[256], port[16];
  snprintf(port, sizeof(port), "%d", f.port);
  kvt_fab *raw = NULL;
  kvt_fab_config fc = {
      .provider = KVT_FAB_DEFAULT_PROVIDER, .peer_node = "127.0.0.1", .peer_service = port};
  assert_int_equal(kvt_fab_open(&fc, &raw, err, sizeof(err)), 0);
  uint64_t to;
  assert_int_equal(kvt_fab_av_insert_host(raw, "127.0.0.1", port, &to), 0);
  static uint8_t buf[KVT_PROTO_MSG_MAX];
  kvt_fab_mr mr;
  assert_int_equal(kvt_fab_mr_reg(raw, buf, sizeof(buf), KVT_FAB_LOCAL, &mr), 0);
  /* Garbage, a wrong version, a truncated header. */
  fill(buf, 200, 1);
  send_raw(raw, to, buf, 200, mr.desc);
  kvt_proto_msg m;
  size_t len = 0;
  kvt_proto_init(&m, KVT_PROTO_STATS, 1, 0);
  assert_int_equal(kvt_proto_encode(&m, buf, sizeof(buf), &len), 0);
  buf[4] = 9;
  send_raw(raw, to, buf, len, mr.desc);
  send_raw(raw, to, buf, 10, mr.desc);
  /* Requests under sessions it never opened: ids with only slot bits (the
   * tier's session among them, by slot; its other 54 bits are random). */
  for (uint64_t sess = 0; sess < 1024; sess += 97) {
    kvt_proto_init(&m, KVT_PROTO_DEL, 2, sess);
    m.u.key.key = k;
    assert_int_equal(kvt_proto_encode(&m, buf, sizeof(buf), &len), 0);
    send_raw(raw, to, buf, len, mr.desc);
    kvt_proto_init(&m, KVT_PROTO_GET, 3, sess);
    m.u.data.key = k;
    m.u.data.len = 4096;
    m.u.data.rma_addr = 0x1000;
    m.u.data.rma_key = 1;
    assert_int_equal(kvt_proto_encode(&m, buf, sizeof(buf), &len), 0);
    send_raw(raw, to, buf, len, mr.desc);
  }
  kvt_fab_mr_dereg(&mr);
  kvt_fab_close(raw);
  /* Still serving, alice's value untouched. */
  uint64_t n = 0;
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &n), 0);
  assert_int_equal(n, sizeof(v));
  assert_memory_equal(got, v, sizeof(v));
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
}

/* ---- stop, restart ---- */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void test_stop_drains_and_a_restart_has_the_nvme_values(void **state) {
  (void)state;
  char dir[256], tiers[400];
  assert_int_equal(srv_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(tiers, sizeof(tiers), "dram:1MiB;nvme:%s:64MiB", dir);
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", tiers, "--tenant", "alice:alice-token-0123456", "--tenant",
               "bob:bob-token-0123456789", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t, *u;
  assert_int_equal(open_tier(&f, "alice", "alice-token-0123456", 3000, &t), 0);
  assert_int_equal(open_tier(&f, "bob", "bob-token-0123456789", 3000, &u), 0);
  enum { N = 20, SZ = 300 * 1024 }; /* more than the DRAM tier holds */
  uint8_t *v = malloc(SZ), *got = malloc(SZ);
  assert_true(v && got);
  for (uint32_t i = 0; i < N; i++) {
    const kvt_key k = key_of(4, i);
    fill(v, SZ - i, i);
    assert_int_equal(kvt_tier_put(t, &k, v, SZ - i), 0);
  }
  const kvt_key kb = key_of(4, 0);
  assert_int_equal(kvt_tier_put(u, &kb, v, 10), 0);
  kvt_tier_close(t);
  kvt_tier_close(u);
  srv_stop_cleanly(&f, 20);
  srv_start_or_fail(&f); /* same port, same directory */
  assert_int_equal(open_tier(&f, "alice", "alice-token-0123456", 3000, &t), 0);
  for (uint32_t i = 0; i < N; i++) {
    const kvt_key k = key_of(4, i);
    uint64_t len = 0;
    fill(v, SZ - i, i);
    assert_int_equal(kvt_tier_get(t, &k, got, SZ, &len), 0);
    assert_int_equal(len, SZ - i);
    assert_memory_equal(got, v, len);
  }
  seen s = {0};
  assert_int_equal(kvt_tier_list(t, collect, &s), 0); /* owners come back from the records */
  assert_int_equal(s.n, N);
  kvt_tier_stats st = {.struct_size = sizeof(st)};
  assert_int_equal(kvt_tier_stats_get(t, &st), 0);
  assert_int_equal(st.items, N);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
  srv_rmdir(dir);
  free(v);
  free(got);
}

static void test_dead_server_fails_ops_and_the_same_tier_reconnects(void **state) {
  (void)state;
  srv_fixture f = {0};
  srv_set_args(&f, "--tiers", "dram:8MiB", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, "default", "", 1000, &t), 0);
  uint8_t v[100] = {1};
  const kvt_key k = key_of(5, 0);
  assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);
  srv_stop_cleanly(&f, 20);
  const int64_t t0 = ms_now();
  const int rc = kvt_tier_put(t, &k, v, sizeof(v));
  assert_true(rc == -ECONNREFUSED || rc == -ETIMEDOUT || rc == -ECONNRESET || rc == -EIO);
  assert_true(ms_now() - t0 < 5000);
  srv_start_or_fail(&f); /* empty DRAM: the old value is gone, the tier works again */
  int ok = -1;
  for (int i = 0; i < 50 && ok != 0; i++) { /* retries while the client notices */
    ok = kvt_tier_put(t, &k, v, sizeof(v));
    if (ok)
      sleep_ms(100);
  }
  assert_int_equal(ok, 0);
  uint8_t got[100];
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_memory_equal(got, v, sizeof(v));
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
}

static kvt_key peer_key(uint32_t a) {
  kvt_key k;
  memset(&k, 0x5A, sizeof(k));
  memcpy(k.bytes, &a, 4);
  return k;
}

/* ---- hostile peers on the fabric ---- */

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
  kvt_fab_config fc = {.provider = KVT_FAB_DEFAULT_PROVIDER,
                       .peer_node = "127.0.0.1",
                       .peer_service = srv ? port : NULL,
                       .no_post_wait = no_post_wait};
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

static const char *two_tenants_16m[] = {"--tiers",  "dram:16MiB",
                                        "--tenant", "alice:secret-a-0123456789",
                                        "--tenant", "bob:secret-b-0123456789",
                                        NULL};

/* tcp;ofi_rxm does not check a region's access flags on a peer's RMA: the
 * server's own regions (registered for local use only) answered guessed
 * keys too. Key 1 was its message pool, where every client's HELLO, token
 * included, is received: any peer, without a session, read it. */
static void test_a_peer_cannot_read_the_servers_memory(void **state) {
  (void)state;
  srv_fixture f = {0};
  memcpy(f.args, two_tenants_16m, sizeof(two_tenants_16m));
  srv_start_or_fail(&f);
  char spec[256];
  srv_spec(&f, spec, sizeof(spec), "alice", "secret-a-0123456789", 2000, NULL);
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
    assert_null(memmem(loot, len, "secret-a-0123456789", 19));
    kvt_fab_mr_dereg(&mr);
    raw_close(&thief);
  }
  free(loot);
  assert_int_equal(ok, 0);
  /* Still serving. */
  const kvt_key k = peer_key(3);
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
  memcpy(f.args, two_tenants_16m, sizeof(two_tenants_16m));
  srv_start_or_fail(&f);
  char spec[256];
  srv_spec(&f, spec, sizeof(spec), "alice", "secret-a-0123456789", 2000, NULL);
  kvt_tier *t;
  assert_int_equal(kvt_tier_open(ctx, spec, &t), 0);
  const kvt_key k = peer_key(1);
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
  hello_of(&m, addr, alen, "bob", "secret-b-0123456789"); /* another tenant's, with its token */
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
    if (sscanf(line, " %*d: %x:%x %*x:%*x %x %*s %*s %*s %*s %*s %lu", &addr, &port, &st, &ino) !=
            4 ||
        st != 0x0A || addr != 0x0100007Fu)
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
  memcpy(f.args, two_tenants_16m, sizeof(two_tenants_16m));
  srv_start_or_fail(&f);
  char spec[256];
  srv_spec(&f, spec, sizeof(spec), "alice", "secret-a-0123456789", 1500, NULL);
  kvt_tier *t;
  assert_int_equal(kvt_tier_open(ctx, spec, &t), 0);
  const kvt_key k = peer_key(9);
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
  srv_set_args(&f, "--tiers", "dram:16MiB", "--tenant", "alice:secret-a-0123456789", "--tenant",
               "bob:secret-b-0123456789", "--max-inflight", "64KiB", NULL);
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
  hello_of(&m, addr, alen, "alice", "secret-a-0123456789");
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
    m.u.data.key = peer_key(100 + (uint32_t)i);
    m.u.data.len = sizeof(payload);
    m.u.data.rma_addr = kvt_fab_mr_addr(&pmr, payload, 0);
    m.u.data.rma_key = pmr.key;
    raw_send(&a, &m);
  }
  /* bob is still served. */
  char spec[256];
  srv_spec(&f, spec, sizeof(spec), "bob", "secret-b-0123456789", 3000, NULL);
  kvt_tier *t = NULL;
  const int64_t t0 = ms_now();
  int rc = kvt_tier_open(ctx, spec, &t);
  const kvt_key k = peer_key(7);
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
      cmocka_unit_test_teardown(test_wrong_token_or_unknown_tenant_is_refused_at_open,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_tenants_cannot_read_delete_or_list_each_others_keys,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_oversize_put_is_refused_with_etoobig, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_stats_fetch_gives_the_servers_counters, srv_kill_leftovers),
      cmocka_unit_test(
          test_the_tokenless_default_tenant_is_served_on_loopback_only_unless_insecure),
      cmocka_unit_test(test_create_refuses_bad_configs_with_a_detail),
      cmocka_unit_test(test_create_never_shows_a_tiers_password_or_token),
      cmocka_unit_test(test_a_server_stopped_before_it_runs_returns_at_once),
      cmocka_unit_test_teardown(test_eight_clients_at_once_each_get_their_own_bytes,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_list_pages_show_every_held_key_once_while_keys_change,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(
          test_malformed_and_unauthenticated_requests_leave_the_server_serving, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_stop_drains_and_a_restart_has_the_nvme_values,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_dead_server_fails_ops_and_the_same_tier_reconnects,
                                srv_kill_leftovers),
      cmocka_unit_test(test_a_peer_cannot_guess_registration_keys),
      cmocka_unit_test_teardown(test_a_peer_cannot_read_the_servers_memory, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_forged_replies_are_not_believed, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_hello_floods_do_not_end_another_clients_session,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_a_stalled_session_does_not_take_every_request_slot,
                                srv_kill_leftovers),
  };
  return cmocka_run_group_tests_name("kvtier-server", tests, setup, teardown);
}
