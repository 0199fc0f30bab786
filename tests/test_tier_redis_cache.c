/* tests/test_tier_redis_cache.c - the cache over a shared tier: one Redis
 * server, two caches as two engine hosts (or a prefill and a decode node).
 * What one puts, the other finds by lookup and reads back, though its index
 * was built before the put; what one deletes, the other misses; with a DRAM
 * tier above, a hit in Redis is promoted. Exits 77 without redis-server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cache_test_util.h"
#include "redis_fixture.h"

static rfx_server srv;
static cache_fx *fx;

static int group_setup(void **state) {
  (void)state;
  memset(&srv, 0, sizeof(srv));
  if (rfx_start(&srv))
    return -1;
  fx = cache_fx_new();
  return fx ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  cache_fx_free(fx);
  rfx_stop(&srv);
  return 0;
}

/* A cache on the group's server, namespace ns, under a dram tier if dram. */
static kvt_cache *open_on(int dram, const char *ns) {
  char tiers[256];
  snprintf(tiers, sizeof(tiers), "%sredis://127.0.0.1:%d?ns=%s", dram ? "dram:4MiB;" : "",
           srv.port, ns);
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = tiers;
  cfg.fingerprint = &fx->fp;
  cfg.chunk_tokens = CT_TOKENS;
  kvt_cache *c = NULL;
  int rc = kvt_cache_open(fx->ctx, &cfg, &c);
  if (rc)
    fail_msg("open %s: %s %s", tiers, kvt_err_name(rc), kvt_ctx_last_error(fx->ctx));
  return c;
}

enum { N = 12 };

static void put_chain(kvt_cache *c, const kvt_key *keys, uint32_t n, uint8_t **pay,
                      uint64_t *len) {
  for (uint32_t i = 0; i < n; i++) {
    pay[i] = payload_of(fx->ctx, &fx->fp, &keys[i], CT_TOKENS, &len[i]);
    assert_int_equal(kvt_cache_put(c, &keys[i], i ? &keys[i - 1] : NULL, pay[i], len[i]), 0);
  }
}

static void test_what_one_host_puts_the_other_looks_up_and_reads(void **state) {
  (void)state;
  /* Both open before anything is put: the reader's index starts empty. */
  kvt_cache *writer = open_on(0, "share1");
  kvt_cache *reader = open_on(0, "share1");
  kvt_key keys[N];
  chain_keys(&fx->fp, 7, N, keys);
  uint8_t *pay[N];
  uint64_t len[N];
  put_chain(writer, keys, N, pay, len);

  uint32_t *tok = seq_tokens(7, N);
  size_t cached = 0;
  assert_int_equal(kvt_cache_lookup(reader, tok, (size_t)N * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, (size_t)N * CT_TOKENS);
  size_t hits = 0;
  assert_int_equal(kvt_cache_lookup_keys(reader, keys, N, &hits), 0);
  assert_int_equal(hits, N);

  /* Every byte back, one get and a batch. */
  uint8_t *buf = malloc(len[0] + 64);
  uint64_t got = 0;
  int tier = -1;
  assert_int_equal(kvt_cache_get(reader, &keys[3], buf, len[0] + 64, &got, &tier), 0);
  assert_int_equal(got, len[3]);
  assert_memory_equal(buf, pay[3], len[3]);
  kvt_cache_get_req reqs[N];
  uint8_t *bufs[N];
  for (int i = 0; i < N; i++) {
    bufs[i] = malloc(len[i]);
    memset(&reqs[i], 0, sizeof(reqs[i]));
    reqs[i].key = keys[i];
    reqs[i].buf = bufs[i];
    reqs[i].cap = len[i];
  }
  assert_int_equal(kvt_cache_get_many(reader, reqs, N, 4), 0);
  for (int i = 0; i < N; i++) {
    assert_int_equal(reqs[i].result, 0);
    assert_int_equal(reqs[i].len, len[i]);
    assert_memory_equal(bufs[i], pay[i], len[i]);
    free(bufs[i]);
  }

  /* Deleted by the writer: the reader misses it (and forgets its copy). */
  assert_int_equal(kvt_cache_del(writer, &keys[5]), 0);
  assert_int_equal(kvt_cache_get(reader, &keys[5], buf, len[0] + 64, &got, NULL),
                   KVT_ENOTFOUND);
  assert_int_equal(kvt_cache_lookup(reader, tok, (size_t)N * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, (size_t)5 * CT_TOKENS);

  /* Another namespace sees none of it. */
  kvt_cache *other = open_on(0, "share1-other");
  assert_int_equal(kvt_cache_lookup(other, tok, (size_t)N * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, 0);
  for (int i = 0; i < N; i++)
    if (i != 5)
      kvt_cache_del(writer, &keys[i]);
  kvt_cache_close(other);
  kvt_cache_close(reader);
  kvt_cache_close(writer);
  for (int i = 0; i < N; i++)
    free(pay[i]);
  free(buf);
  free(tok);
}

static void test_a_hit_in_redis_under_dram_is_promoted(void **state) {
  (void)state;
  kvt_cache *writer = open_on(0, "share2");
  kvt_cache *reader = open_on(1, "share2");
  kvt_key keys[4];
  chain_keys(&fx->fp, 9, 4, keys);
  uint8_t *pay[4];
  uint64_t len[4];
  put_chain(writer, keys, 4, pay, len);
  uint8_t *buf = malloc(len[0]);
  uint64_t got = 0;
  int tier = -1;
  assert_int_equal(kvt_cache_get(reader, &keys[2], buf, len[0], &got, &tier), 0);
  assert_int_equal(tier, 1); /* served by redis */
  assert_memory_equal(buf, pay[2], len[2]);
  assert_int_equal(kvt_cache_get(reader, &keys[2], buf, len[0], &got, &tier), 0);
  assert_int_equal(tier, 0); /* then from dram */
  assert_memory_equal(buf, pay[2], len[2]);
  for (int i = 0; i < 4; i++) {
    kvt_cache_del(writer, &keys[i]);
    free(pay[i]);
  }
  kvt_cache_close(reader);
  kvt_cache_close(writer);
  free(buf);
}

static void test_a_dead_shared_tier_is_a_miss_not_an_error_or_hang(void **state) {
  (void)state;
  rfx_server s;
  memset(&s, 0, sizeof(s));
  assert_int_equal(rfx_start(&s), 0);
  char tiers[160];
  snprintf(tiers, sizeof(tiers), "dram:1MiB;redis://127.0.0.1:%d?ns=dead&timeout_ms=300",
           s.port);
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = tiers;
  cfg.fingerprint = &fx->fp;
  cfg.chunk_tokens = CT_TOKENS;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), 0);
  rfx_kill9(&s);
  kvt_key keys[3];
  chain_keys(&fx->fp, 11, 3, keys);
  uint32_t *tok = seq_tokens(11, 3);
  size_t cached = 1;
  assert_int_equal(kvt_cache_lookup(c, tok, 3 * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, 0);
  uint8_t b[16];
  assert_int_equal(kvt_cache_get(c, &keys[0], b, sizeof(b), NULL, NULL), KVT_ENOTFOUND);
  kvt_cache_close(c);
  free(tok);
  rfx_stop(&s);
}

/* A cache never evicts from a shared tier: other hosts' chunks live there
 * and the server decides what goes. B's index holds A's chunks (listed at
 * open) and would have evicted them to fit its own under capacity=. */
static void test_a_cache_never_evicts_other_hosts_chunks_from_a_shared_tier(void **state) {
  (void)state;
  uint64_t plen = 0;
  kvt_key probe;
  chain_keys(&fx->fp, 13, 1, &probe);
  free(payload_of(fx->ctx, &fx->fp, &probe, CT_TOKENS, &plen));
  const uint64_t cap = 10 * (plen + 64); /* about ten payloads */
  char tiers[256];
  snprintf(tiers, sizeof(tiers), "redis://127.0.0.1:%d?ns=noevict&capacity=%llu", srv.port,
           (unsigned long long)cap);
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = tiers;
  cfg.fingerprint = &fx->fp;
  cfg.chunk_tokens = CT_TOKENS;
  kvt_cache *a = NULL, *b = NULL;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &a), 0);
  kvt_key ka[7], kb[7];
  chain_keys(&fx->fp, 21, 7, ka);
  chain_keys(&fx->fp, 22, 7, kb);
  uint8_t *pa[7], *pb[7];
  uint64_t la[7], lb[7];
  put_chain(a, ka, 7, pa, la);
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &b), 0); /* indexes A's 7 */
  for (int i = 0; i < 7; i++) {
    pb[i] = payload_of(fx->ctx, &fx->fp, &kb[i], CT_TOKENS, &lb[i]);
    (void)kvt_cache_put(b, &kb[i], i ? &kb[i - 1] : NULL, pb[i], lb[i]);
  }
  uint8_t *buf = malloc(la[0]);
  for (int i = 0; i < 7; i++) {
    uint64_t got = 0;
    assert_int_equal(kvt_cache_get(a, &ka[i], buf, la[0], &got, NULL), 0);
    assert_memory_equal(buf, pa[i], la[i]);
  }
  kvt_cache_stats st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  assert_int_equal(kvt_cache_stats_get(b, 0, &st), 0);
  assert_int_equal(st.evictions, 0);
  for (int i = 0; i < 7; i++) {
    kvt_cache_del(a, &ka[i]);
    kvt_cache_del(a, &kb[i]);
    free(pa[i]);
    free(pb[i]);
  }
  free(buf);
  kvt_cache_close(b);
  kvt_cache_close(a);
}

/* kvtier demo --pd through the group's server: prefill and decode processes
 * that share only the redis tier; every payload byte checked by the CLI. */
static void test_demo_pd_through_redis_is_byte_identical(void **state) {
  (void)state;
  const char *cli = KVT_BINARY_DIR "/programs/kvtier";
  if (access(cli, X_OK) != 0) {
    printf("(no %s: skipped)\n", cli);
    return;
  }
  char cmd[1024];
  snprintf(cmd, sizeof(cmd),
           "%s demo --pd --remote 'redis://127.0.0.1:%d?ns=pd-test' --layers 2 --tokens 512 "
           "--heads 2 --head-dim 64 --chunk-tokens 128 2>&1",
           cli, srv.port);
  char out[8192];
  const int st = rfx_shell(cmd, out, sizeof(out));
  if (st != 0 || !strstr(out, "4 of 4 payloads byte-identical"))
    fail_msg("demo --pd exited %d:\n%s", st, out);
  /* It deletes what it put in a --remote tier. */
  redisReply *r = rfx_cmd(srv.port, "KEYS kvt:pd-test:*");
  assert_non_null(r);
  assert_int_equal(r->elements, 0);
  freeReplyObject(r);
}

int main(void) {
  if (!rfx_have_redis()) {
    printf("[  SKIP    ] redis-server is not on PATH\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_what_one_host_puts_the_other_looks_up_and_reads),
      cmocka_unit_test(test_a_hit_in_redis_under_dram_is_promoted),
      cmocka_unit_test(test_a_dead_shared_tier_is_a_miss_not_an_error_or_hang),
      cmocka_unit_test(test_a_cache_never_evicts_other_hosts_chunks_from_a_shared_tier),
      cmocka_unit_test(test_demo_pd_through_redis_is_byte_identical),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
