/* tests/test_tier_redis_cluster.c - the redis+cluster:// tier against a
 * 3-master Redis Cluster this program starts on 127.0.0.1
 * (tests/fixtures/redis_fixture.h): the whole tier conformance suite, keys
 * spread over every master, a slot migrated under the tier (ASK while it
 * moves, MOVED after), a master killed under load from several threads (its
 * slots fail cleanly, the others keep working, and its restart recovers), a
 * master replaced by its replica (CLUSTER FAILOVER TAKEOVER), MOVED to an
 * endpoint a node does not know (":PORT"), and the slot hash (CRC16) against
 * the cluster spec. Exits 77 when redis-server is not on PATH. */
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
#include "tier_redis.h"
#include "tier_test_util.h"

static rfx_server nodes[RFX_CLUSTER_N];
static rfx_server cl[RFX_CLUSTER_N]; /* one test's own cluster, stopped by that test */

static kvt_key key_of(uint32_t space, uint32_t id) {
  kvt_key k;
  memset(&k, 0x3C, sizeof(k));
  memcpy(k.bytes, &space, 4);
  memcpy(k.bytes + 8, &id, 4);
  return k;
}

static void key_hex(const kvt_key *k, char *out) {
  for (int i = 0; i < 16; i++)
    snprintf(out + 2 * i, 3, "%02x", k->bytes[i]);
}

/* The cluster slot of the tier's keys for k: CRC16 (XMODEM) of the hash tag. */
static unsigned slot_of(const kvt_key *k) {
  char hex[33];
  key_hex(k, hex);
  uint16_t crc = 0;
  for (int i = 0; i < 32; i++) {
    crc ^= (uint16_t)((uint8_t)hex[i] << 8);
    for (int b = 0; b < 8; b++)
      crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc & 16383u;
}

static atomic_int seen_ask, seen_moved;

static void log_cb(void *opaque, int level, const char *msg) {
  (void)opaque, (void)level;
  if (strstr(msg, ": ASK at "))
    atomic_fetch_add(&seen_ask, 1);
  if (strstr(msg, ": MOVED to "))
    atomic_fetch_add(&seen_moved, 1);
}

static kvt_ctx *ctx_new(void) {
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.log = log_cb;
  cfg.log_level = KVT_LOG_DEBUG;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), 0);
  return ctx;
}

static kvt_tier *cluster_open(kvt_ctx *ctx, const char *opts) {
  char spec[512];
  snprintf(spec, sizeof(spec), "redis+cluster://127.0.0.1:%d,127.0.0.1:%d?%s", nodes[0].port,
           nodes[1].port, opts);
  kvt_tier *t = NULL;
  const int rc = kvt_tier_open(ctx, spec, &t);
  if (rc)
    fail_msg("open %s: %s: %s", spec, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  return t;
}

static void test_conformance_suite_passes_against_a_3_node_cluster(void **state) {
  (void)state;
  char specs[1024];
  snprintf(specs, sizeof(specs),
           "redis+cluster://127.0.0.1:%d?ns={tmpdir}&capacity=32MiB|"
           "redis+cluster://127.0.0.1:%d,127.0.0.1:%d?ns={tmpdir}&capacity=32MiB&part=64KiB"
           "&conns=2&pipeline=8",
           nodes[0].port, nodes[1].port, nodes[2].port);
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

static long keys_on(int port, const char *pattern) {
  redisReply *r = rfx_cmd(port, "KEYS %s", pattern);
  assert_non_null(r);
  const long n = r->type == REDIS_REPLY_ARRAY ? (long)r->elements : -1;
  freeReplyObject(r);
  return n;
}

static int count_cb(void *opaque, const kvt_key *key, uint64_t len) {
  (void)key, (void)len;
  ++*(int *)opaque;
  return 0;
}

static void test_keys_spread_over_every_master_and_list_finds_them_all(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = cluster_open(ctx, "ns=spread&part=2KiB");
  uint8_t val[5000], got[5000];
  for (uint32_t i = 0; i < 300; i++) {
    const kvt_key k = key_of(1, i);
    fill(val, sizeof(val), i);
    assert_int_equal(kvt_tier_put(t, &k, val, 100 + i * 16), 0);
  }
  long total = 0;
  for (int i = 0; i < RFX_CLUSTER_N; i++) {
    const long n = keys_on(nodes[i].port, "kvt:spread:*");
    assert_true(n > 30); /* about a third each */
    total += n;
  }
  long want = 0; /* values above 2 KiB have 2 or 3 keys */
  for (uint32_t i = 0; i < 300; i++)
    want += (100 + i * 16 + 2047) / 2048;
  assert_int_equal(total, want);
  int listed = 0;
  assert_int_equal(kvt_tier_list(t, count_cb, &listed), 0);
  assert_int_equal(listed, 300);
  for (uint32_t i = 0; i < 300; i += 7) {
    const kvt_key k = key_of(1, i);
    uint64_t len = 0;
    fill(val, sizeof(val), i);
    assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
    assert_int_equal(len, 100 + i * 16);
    assert_memory_equal(got, val, len);
  }
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

static void node_id(int port, char *out, size_t cap) {
  redisReply *r = rfx_cmd(port, "CLUSTER MYID");
  assert_true(r && r->type == REDIS_REPLY_STRING);
  snprintf(out, cap, "%s", r->str);
  freeReplyObject(r);
}

/* Moves every key of slot from src to dst (MIGRATE). */
static void migrate_keys(int src, int dst, unsigned slot) {
  redisReply *r = rfx_cmd(nodes[src].port, "CLUSTER GETKEYSINSLOT %u 1000", slot);
  assert_true(r && r->type == REDIS_REPLY_ARRAY);
  for (size_t i = 0; i < r->elements; i++)
    assert_true(rfx_cmd_ok(nodes[src].port, "MIGRATE 127.0.0.1 %d %s 0 5000", nodes[dst].port,
                           r->element[i]->str));
  freeReplyObject(r);
}

static void get_expect(kvt_tier *t, uint32_t id, uint64_t n) {
  uint8_t want[4096], got[4096];
  uint64_t len = 0;
  const kvt_key k = key_of(2, id);
  fill(want, n, id);
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_int_equal(len, n);
  assert_memory_equal(got, want, n);
}

static void put_val(kvt_tier *t, uint32_t id, uint64_t n) {
  uint8_t val[4096];
  const kvt_key k = key_of(2, id);
  fill(val, n, id);
  assert_int_equal(kvt_tier_put(t, &k, val, n), 0);
}

static void test_migrating_slot_is_followed_through_ask_and_moved(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = cluster_open(ctx, "ns=mig&part=1KiB&conns=1");
  /* Three keys of one slot: a, b stored before the move, c put during it. */
  const kvt_key a = key_of(2, 0);
  const unsigned slot = slot_of(&a);
  uint32_t ids[3] = {0, 0, 0};
  for (uint32_t i = 1, n = 1; n < 3; i++) {
    const kvt_key k = key_of(2, i);
    if (slot_of(&k) == slot)
      ids[n++] = i;
  }
  put_val(t, ids[0], 3000); /* 3 parts */
  put_val(t, ids[1], 500);
  const int src = rfx_slot_owner(nodes, RFX_CLUSTER_N, slot), dst = (src + 1) % RFX_CLUSTER_N;
  assert_true(src >= 0);
  char src_id[64], dst_id[64];
  node_id(nodes[src].port, src_id, sizeof(src_id));
  node_id(nodes[dst].port, dst_id, sizeof(dst_id));
  assert_true(rfx_cmd_ok(nodes[dst].port, "CLUSTER SETSLOT %u IMPORTING %s", slot, src_id));
  assert_true(rfx_cmd_ok(nodes[src].port, "CLUSTER SETSLOT %u MIGRATING %s", slot, dst_id));
  atomic_store(&seen_ask, 0);
  atomic_store(&seen_moved, 0);
  put_val(t, ids[2], 2500); /* new key: the source answers ASK */
  assert_true(atomic_load(&seen_ask) > 0);
  assert_true(keys_on(nodes[dst].port, "kvt:mig:*") >= 3);
  get_expect(t, ids[0], 3000); /* still on the source */
  migrate_keys(src, dst, slot);
  get_expect(t, ids[0], 3000); /* moved: ASK again */
  get_expect(t, ids[1], 500);
  get_expect(t, ids[2], 2500);
  for (int i = 0; i < RFX_CLUSTER_N; i++) /* done: the destination owns the slot */
    assert_true(rfx_cmd_ok(nodes[(dst + i) % RFX_CLUSTER_N].port, "CLUSTER SETSLOT %u NODE %s",
                           slot, dst_id));
  assert_int_equal(atomic_load(&seen_moved), 0);
  get_expect(t, ids[0], 3000); /* MOVED, and the map is updated */
  assert_true(atomic_load(&seen_moved) > 0);
  get_expect(t, ids[2], 2500);
  put_val(t, ids[1], 1200);
  get_expect(t, ids[1], 1200);
  assert_int_equal(keys_on(nodes[src].port, "kvt:mig:*"), 0);
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.errors, 0);
  /* A fresh handle learns the new map from CLUSTER SLOTS. */
  kvt_tier *t2 = cluster_open(ctx, "ns=mig&part=1KiB");
  get_expect(t2, ids[2], 2500);
  kvt_tier_close(t2);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

/* ---- a master killed under load ---- */

typedef struct runner {
  kvt_tier *tier;
  uint32_t id;
  atomic_int *stop;
  long ok, errors, wrong;
} runner;

static void *runner_main(void *arg) {
  runner *r = arg;
  uint8_t val[6000], got[6000];
  for (uint32_t it = 0; !atomic_load(r->stop); it++) {
    const uint32_t id = r->id * 100 + it % 64;
    const kvt_key k = key_of(3, id);
    const uint64_t n = 8 + (it * 131u) % 5000;
    fill(val, n, ((uint64_t)id << 32) | it);
    memcpy(val, &it, 4);
    memcpy(val + 4, &id, 4);
    (kvt_tier_put(r->tier, &k, val, n) == 0) ? r->ok++ : r->errors++;
    uint64_t len = 0;
    if (kvt_tier_get(r->tier, &k, got, sizeof(got), &len) == 0) {
      uint32_t wit, wid;
      memcpy(&wit, got, 4);
      memcpy(&wid, got + 4, 4);
      fill(val, len, ((uint64_t)id << 32) | wit);
      memcpy(val, &wit, 4);
      memcpy(val + 4, &id, 4);
      r->wrong += wid != id || len != 8 + (wit * 131u) % 5000 || memcmp(val, got, len) != 0;
      r->ok++;
    } else {
      r->errors++;
    }
  }
  return NULL;
}

static void test_killed_master_fails_its_slots_cleanly_and_recovers(void **state) {
  (void)state;
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = cluster_open(ctx, "ns=kill&timeout_ms=500&conns=3&part=2KiB");
  runner r[4];
  pthread_t th[4];
  atomic_int stop = 0;
  for (int i = 0; i < 4; i++) {
    r[i] = (runner){.tier = t, .id = (uint32_t)i, .stop = &stop};
    assert_int_equal(pthread_create(&th[i], NULL, runner_main, &r[i]), 0);
  }
  rfx_sleep_ms(700);
  const int victim = 2;
  rfx_kill9(&nodes[victim]);
  rfx_sleep_ms(1000);
  atomic_store(&stop, 1);
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(r[i].wrong, 0);
  }
  /* Keys on the live masters work; keys on the dead one fail with an error. */
  int live_ok = 0, dead_err = 0;
  for (uint32_t i = 0; i < 60; i++) {
    const kvt_key k = key_of(4, i);
    const int owner = rfx_slot_owner(nodes, RFX_CLUSTER_N, slot_of(&k));
    const int rc = kvt_tier_put(t, &k, "x", 1);
    if (owner == victim) {
      assert_true(rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -ETIMEDOUT ||
                  rc == KVT_EBACKEND);
      dead_err++;
    } else {
      assert_int_equal(rc, 0);
      live_ok++;
    }
  }
  assert_true(live_ok > 0 && dead_err > 0);
  nodes[victim].pid = 0;
  assert_int_equal(rfx_start(&nodes[victim]), 0); /* same port, same nodes.conf */
  for (int i = 0; i < 2000 && !rfx_cluster_ok(nodes); i++)
    rfx_sleep_ms(10);
  int failures = 0;
  for (int round = 0; round < 60; round++) { /* the backoff is at most 1 s */
    failures = 0;
    for (uint32_t i = 0; i < 60; i++) {
      const kvt_key k = key_of(4, i);
      failures += kvt_tier_put(t, &k, "y", 1) != 0;
    }
    if (!failures)
      break;
    rfx_sleep_ms(100);
  }
  assert_int_equal(failures, 0);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

/* ---- failover to a replica ---- */

static long info_num(int port, const char *section, const char *field) {
  redisReply *r = rfx_cmd(port, "INFO %s", section);
  long v = -1;
  const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, field) : NULL;
  if (p)
    v = strtol(p + strlen(field), NULL, 10);
  if (r)
    freeReplyObject(r);
  return v;
}

static int wait_for(int (*cond)(const void *), const void *arg, int ms) {
  for (int i = 0; i < ms / 10; i++) {
    if (cond(arg))
      return 1;
    rfx_sleep_ms(10);
  }
  return cond(arg);
}

static int knows_4(const void *arg) {
  redisReply *r = rfx_cmd(((const rfx_server *)arg)->port, "CLUSTER INFO");
  const int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_known_nodes:4");
  if (r)
    freeReplyObject(r);
  return ok;
}

static int link_up(const void *arg) {
  redisReply *r = rfx_cmd(((const rfx_server *)arg)->port, "INFO replication");
  const int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "master_link_status:up");
  if (r)
    freeReplyObject(r);
  return ok;
}

static int in_sync(const void *arg) {
  const rfx_server *const *pair = arg; /* master, replica */
  const long m = info_num(pair[0]->port, "replication", "master_repl_offset:");
  const long s = info_num(pair[1]->port, "replication", "slave_repl_offset:");
  return m > 0 && m == s;
}

static int is_master(const void *arg) {
  redisReply *r = rfx_cmd(((const rfx_server *)arg)->port, "INFO replication");
  const int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "role:master");
  if (r)
    freeReplyObject(r);
  return ok;
}

static void test_failover_to_a_replica_is_followed_after_a_map_refresh(void **state) {
  (void)state;
  static rfx_server replica;
  memset(&replica, 0, sizeof(replica));
  replica.nargs = (int)(sizeof(rfx_cluster_args) / sizeof(rfx_cluster_args[0]));
  memcpy(replica.args, rfx_cluster_args, sizeof(rfx_cluster_args));
  assert_int_equal(rfx_start(&replica), 0);
  assert_true(rfx_cmd_ok(nodes[0].port, "CLUSTER MEET 127.0.0.1 %d", replica.port));
  assert_true(wait_for(knows_4, &replica, 10000));
  const int victim = 1;
  char master_id[64];
  node_id(nodes[victim].port, master_id, sizeof(master_id));
  assert_true(rfx_cmd_ok(replica.port, "CLUSTER REPLICATE %s", master_id));
  assert_true(wait_for(link_up, &replica, 15000));
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = cluster_open(ctx, "ns=fo&timeout_ms=500");
  uint8_t val[3000], got[3000];
  for (uint32_t i = 0; i < 40; i++) {
    const kvt_key k = key_of(5, i);
    fill(val, sizeof(val), i);
    assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  }
  const rfx_server *pair[2] = {&nodes[victim], &replica};
  assert_true(wait_for(in_sync, pair, 10000));
  rfx_kill9(&nodes[victim]);
  assert_true(rfx_cmd_ok(replica.port, "CLUSTER FAILOVER TAKEOVER"));
  assert_true(wait_for(is_master, &replica, 10000));
  /* Every value comes back (from the promoted replica for the victim's
   * slots) once the tier has refreshed its map; until then, errors only. */
  for (uint32_t i = 0; i < 40; i++) {
    const kvt_key k = key_of(5, i);
    int rc = -1;
    uint64_t len = 0;
    for (int tries = 0; tries < 100 && rc != 0; tries++) {
      rc = kvt_tier_get(t, &k, got, sizeof(got), &len);
      assert_true(rc != KVT_ENOTFOUND);
      if (rc)
        rfx_sleep_ms(50);
    }
    assert_int_equal(rc, 0);
    fill(val, sizeof(val), i);
    assert_int_equal(len, sizeof(val));
    assert_memory_equal(got, val, sizeof(val));
  }
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  rfx_stop(&replica);
}

/* ---- redirections to an endpoint the node does not know ---- */

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

/* With cluster-preferred-endpoint-type unknown-endpoint (nodes behind
 * addresses they do not know), MOVED says ":PORT": the host is the one that
 * replied. apply_slots() takes the seed's host for CLUSTER SLOTS' NULL host,
 * but job_error() makes a node named "" of it, and the redirected operation
 * fails. */
static void
test_moved_to_an_unknown_endpoint_goes_to_the_replying_host(void **state) {
  (void)state;
  assert_int_equal(rfx_cluster_start(cl), 0);
  for (int i = 0; i < RFX_CLUSTER_N; i++)
    assert_true(rfx_cmd_ok(
        cl[i].port,
        "CONFIG SET cluster-preferred-endpoint-type unknown-endpoint"));
  kvt_ctx *ctx = ctx_new();
  kvt_tier *t = tier_open(
      ctx, "redis+cluster://127.0.0.1:%d?ns=rv-moved&conns=1", cl[0].port);
  const kvt_key k = key_of(10, 1);
  char hex[33];
  for (int i = 0; i < 16; i++)
    snprintf(hex + 2 * i, 3, "%02x", k.bytes[i]);
  const unsigned slot = rd_crc16(hex, 32) & 16383u;
  const int src = rfx_slot_owner(cl, RFX_CLUSTER_N, slot),
            dst = (src + 1) % RFX_CLUSTER_N;
  assert_true(src >= 0);
  redisReply *r = rfx_cmd(cl[dst].port, "CLUSTER MYID");
  assert_true(r && r->type == REDIS_REPLY_STRING);
  char dst_id[64];
  snprintf(dst_id, sizeof(dst_id), "%s", r->str);
  freeReplyObject(r);
  for (int i = 0; i < RFX_CLUSTER_N;
       i++) /* the (empty) slot moves; the tier's map is stale */
    assert_true(rfx_cmd_ok(cl[(dst + i) % RFX_CLUSTER_N].port,
                           "CLUSTER SETSLOT %u NODE %s", slot, dst_id));
  r = rfx_cmd(cl[src].port, "SET kvt:rv-moved:{%s} x", hex);
  const int moved =
      r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "MOVED ", 6) == 0;
  char reply[128] = "";
  if (r)
    snprintf(reply, sizeof(reply), "%s", r->str ? r->str : "");
  if (r)
    freeReplyObject(r);
  const int rc = kvt_tier_put(t, &k, "moved", 5);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  for (int i = 0; i < RFX_CLUSTER_N; i++)
    rfx_stop(&cl[i]);
  assert_true(moved); /* the source redirects: reply */
  if (rc != 0)
    fail_msg("PUT redirected by '%s': %s", reply, kvt_err_name(rc));
}

/* CRC16/XMODEM check value, and the cluster spec's hash-tag example slot. */
static void test_crc16_matches_the_cluster_spec(void **state) {
  (void)state;
  assert_int_equal(rd_crc16("123456789", 9), 0x31C3);
  assert_int_equal(rd_crc16("user1000", 8) & 16383, 3443);
}

static int group_setup(void **state) {
  (void)state;
  const int rc = rfx_cluster_start(nodes);
  if (rc)
    fprintf(stderr, "starting the cluster: %s\n", strerror(-rc));
  return rc ? -1 : 0;
}

static int group_teardown(void **state) {
  (void)state;
  for (int i = 0; i < RFX_CLUSTER_N; i++)
    rfx_stop(&nodes[i]);
  return 0;
}

int main(void) {
  if (!rfx_have_redis()) {
    printf("[  SKIP    ] redis-server is not on PATH\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conformance_suite_passes_against_a_3_node_cluster),
      cmocka_unit_test(test_keys_spread_over_every_master_and_list_finds_them_all),
      cmocka_unit_test(test_migrating_slot_is_followed_through_ask_and_moved),
      cmocka_unit_test(test_killed_master_fails_its_slots_cleanly_and_recovers),
      cmocka_unit_test(test_failover_to_a_replica_is_followed_after_a_map_refresh),
      cmocka_unit_test(test_moved_to_an_unknown_endpoint_goes_to_the_replying_host),
      cmocka_unit_test(test_crc16_matches_the_cluster_spec),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
