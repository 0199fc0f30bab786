/* tiers/redis/tier_redis.c - the redis tiers: payloads in a Redis server
 * (redis://) or a Redis Cluster (redis+cluster://) through hiredis.
 *
 *   redis://[USER:PASSWORD@]HOST:PORT[/DB][?OPTIONS]
 *   redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...][?OPTIONS]
 * USER may be empty (":PASSWORD@": AUTH PASSWORD; otherwise AUTH USER
 * PASSWORD for an ACL user); %XX escapes (two hex digits, not %00) are
 * decoded in both. The userinfo ends at the last '@' before the '?', so a
 * password may hold '@' and '/', and a '?' in it is written %3F. Messages,
 * logs and kvt_tier_spec() show the password as ***. HOST may be a name,
 * an IPv4 address or [IPv6]. The cluster form takes any number of seed
 * nodes and learns the rest with CLUSTER SLOTS. OPTIONS, joined with '&':
 *   ns=NAME          key namespace, one per deployment (default "default");
 *                    letters, digits and _ - . / only
 *   ttl=SECONDS      every key expires after this (default 0: never)
 *   timeout_ms=N     connect timeout, the limit for each reply (however
 *                    slowly the server sends it), and for a write that
 *                    makes no progress (default 2000)
 *   capacity=SIZE    what the tier may hold, enforced by this handle on what
 *                    it wrote (default: no limit of its own; capacity is then
 *                    reported as what this handle holds plus what the masters
 *                    have free, maxmemory (or RAM) less their used_memory,
 *                    learned at open, every 10 s and when a server refuses a
 *                    PUT for memory that the stats said would fit)
 *   part=SIZE        values above this are split into parts (default 64MiB,
 *                    at most 511MiB, Redis' bulk limit is 512MB)
 *   conns=N          worker threads, each with one connection per node (4)
 *   pipeline=N       operations one worker sends before reading replies (32)
 *
 * Keys: kvt:NS:{HEX} holds a 64-byte header (magic, format, generation,
 * length, part count and size, the key, the XXH3 of the first part and of
 * the header) and the first part; kvt:NS:{HEX}:GEN:p<i> the others, each
 * with a 32-byte header (index, generation, the XXH3 of its data and of its
 * header with the key and length), GEN naming the PUT that wrote them (see
 * tier_redis_format.c, tier_redis_ops.c). A PUT of one part
 * is one transaction (MULTI, GETRANGE of the old header, SET, EXEC); a PUT
 * of several writes them all, then switches the value key in one script
 * (EVAL: checks the parts, RENAME). So a failed PUT leaves any old value in
 * place, and concurrent PUTs and DELs of one key keep items and used exact.
 * Values are split into at most 1024 parts (larger than part= where
 * needed). A missing, expired, torn or foreign value is a miss, and so is a
 * value that fails a check (another key's, a part of another value, a bit
 * flipped in a header or the data, format 1 of kvtier 0.3.0), logged as a
 * warning naming the Redis key; a GET never deletes it (the next PUT
 * replaces it). A GET that misses or fails may have written into its
 * buffer, never past the value's length or the buffer's capacity.
 * Errors: a full server (OOM, maxmemory with noeviction) is -ENOSPC; a dead
 * or unreachable server fails the operations on it with -ECONNREFUSED,
 * -ECONNRESET, -ETIMEDOUT (or KVT_EBACKEND), logged, and the next operation
 * reconnects (backing off up to 1 s while it cannot); a connection the
 * server closed while idle (its `timeout`) is replaced before use; a server
 * that is loading, or a cluster that is failing over (LOADING, TRYAGAIN,
 * CLUSTERDOWN, READONLY), is -EAGAIN; refused AUTH is KVT_EAUTH.
 * Stats: items and used count the values this handle wrote and deleted, each
 * value item_overhead (its header and an estimate of Redis' memory per key,
 * RD_ITEM_OVERHEAD) + its length (other clients' values and TTL expiry are
 * not seen; list() walks the servers for the truth). With ttl= and
 * capacity=, a PUT that would not fit first counts the namespace again from
 * the servers (at most once a second), so expired values stop holding
 * capacity; items and used are then the namespace's. capacity is 0 when
 * neither capacity= nor the servers (INFO memory) say. QUERY reads the
 * header only: a value whose parts are gone reports its length and then
 * misses on GET.
 * Open connects to a seed (to the server) and fails when it cannot, with
 * the reason (refused connection, AUTH reply) in kvt_ctx_last_error. An ACL
 * user needs GET, SET, GETRANGE, DEL, MULTI, EXEC, EVAL (EXISTS, TYPE,
 * RENAME inside), SCAN, INFO, PING (and CLUSTER SLOTS, ASKING).
 * Cluster: the slot of a key is CRC16 of its hash tag; slot owners come from
 * CLUSTER SLOTS; MOVED updates the map (and schedules a refresh; a MOVED
 * without a host, cluster-preferred-endpoint-type unknown-endpoint, names
 * the node that replied), ASK is followed with ASKING, at most 5 redirects
 * per operation; a connection error, READONLY or CLUSTERDOWN refreshes the
 * map (at most every 100 ms), which follows a failover. At most 64 nodes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "tier_redis.h"

/* ---- spec ---- */

static int ns_ok(const char *ns) {
  if (!*ns)
    return 0;
  for (const char *p = ns; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          *p == '_' || *p == '-' || *p == '.' || *p == '/'))
      return 0;
  return 1;
}

static int parse_u64(const char *v, uint64_t lo, uint64_t hi, uint64_t *out) {
  char *end;
  errno = 0;
  if (*v < '0' || *v > '9')
    return -1;
  const unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end || x < lo || x > hi)
    return -1;
  *out = x;
  return 0;
}

static int parse_option(rd_state *st, const char *shown, char *kv) {
  char *v = strchr(kv, '=');
  if (!v)
    return kvt_fail(st->ctx, KVT_ESPEC, "redis tier: '%s': option '%s' needs =VALUE", shown, kv);
  *v++ = '\0';
  uint64_t x = 0;
  int bad = 0;
  if (strcmp(kv, "ns") == 0) {
    bad = strlen(v) >= sizeof(st->ns) || !ns_ok(v);
    if (!bad)
      snprintf(st->ns, sizeof(st->ns), "%s", v);
  } else if (strcmp(kv, "ttl") == 0) {
    bad = parse_u64(v, 0, 100ull * 365 * 86400, &x);
    st->ttl_ms = x * 1000;
  } else if (strcmp(kv, "timeout_ms") == 0) {
    bad = parse_u64(v, 1, 3600000, &x);
    st->timeout_ms = (int)x;
  } else if (strcmp(kv, "capacity") == 0) {
    bad = kvt_parse_size(v, &st->capacity) != 0 || st->capacity == 0;
  } else if (strcmp(kv, "part") == 0) {
    bad = kvt_parse_size(v, &st->part) != 0 || st->part < 1024 || st->part > (511ull << 20);
  } else if (strcmp(kv, "conns") == 0) {
    bad = parse_u64(v, 1, RD_MAX_WORKERS, &x);
    st->conns = (uint32_t)x;
  } else if (strcmp(kv, "pipeline") == 0) {
    bad = parse_u64(v, 1, 1024, &x);
    st->pipeline = (uint32_t)x;
  } else {
    return kvt_fail(st->ctx, KVT_ESPEC, "redis tier: '%s': unknown option '%s'", shown, kv);
  }
  if (bad)
    return kvt_fail(st->ctx, KVT_ESPEC, "redis tier: '%s': bad value '%s' for option '%s'", shown,
                    v, kv);
  return 0;
}

static int parse_host(rd_state *st, const char *shown, const char *h, size_t n) {
  char tmp[256];
  if (n == 0 || n >= sizeof(tmp))
    return kvt_fail(st->ctx, KVT_ESPEC, "redis tier: '%s': expected HOST:PORT", shown);
  memcpy(tmp, h, n);
  tmp[n] = '\0';
  char *colon = strrchr(tmp, ':');
  uint64_t port = 0;
  if (!colon || parse_u64(colon + 1, 1, 65535, &port))
    return kvt_fail(st->ctx, KVT_ESPEC, "redis tier: '%s': '%s' is not HOST:PORT", shown, tmp);
  *colon = '\0';
  const char *name = tmp;
  if (tmp[0] == '[' && colon > tmp + 1 && colon[-1] == ']') {
    colon[-1] = '\0';
    name = tmp + 1;
  }
  if (!*name)
    return kvt_fail(st->ctx, KVT_ESPEC, "redis tier: '%s': empty host", shown);
  if (rd_node_add(st, name, (int)port) < 0)
    return kvt_fail(st->ctx, KVT_ESPEC, "redis tier: '%s': more than %d nodes", shown,
                    RD_MAX_NODES);
  return 0;
}

static int parse_userinfo(rd_state *st, const char *shown, const char *u, size_t n) {
  const char *colon = memchr(u, ':', n);
  const size_t un = colon ? (size_t)(colon - u) : 0;
  const char *p = colon ? colon + 1 : u;
  const size_t pn = n - (size_t)(p - u);
  if (kvt_url_unescape(st->user, sizeof(st->user), u, un) ||
      kvt_url_unescape(st->pass, sizeof(st->pass), p, pn) ||
      !st->pass[0])
    return kvt_fail(st->ctx, KVT_ESPEC, "redis tier: '%s': bad USER:PASSWORD@", shown);
  return 0;
}

/* Messages show args as `shown`, its password replaced by "***". */
static int parse_spec(rd_state *st, const char *args) {
  char buf[1024], shown[1100];
  kvt_spec_redact(shown, sizeof(shown), args);
  if (strncmp(args, "//", 2) != 0 || strlen(args) >= sizeof(buf))
    return kvt_fail(st->ctx, KVT_ESPEC,
                    "redis tier: '%s': expected //HOST:PORT (see kvtier/tier.h)",
                    strncmp(args, "//", 2) == 0 || !strchr(args, '@') ? shown : "(not shown)");
  snprintf(buf, sizeof(buf), "%s", args + 2);
  char *opts = strchr(buf, '?');
  if (opts)
    *opts++ = '\0';
  if (opts && strchr(opts, '@') && !strchr(buf, '@'))
    return kvt_fail(st->ctx, KVT_ESPEC,
                    "redis tier: '%s': '@' after '?': a '?' in USER:PASSWORD is written %%3F",
                    shown);
  char *hosts = buf, *at = strrchr(buf, '@'); /* the password may hold '@' and '/' */
  if (at) {
    int rc = parse_userinfo(st, shown, buf, (size_t)(at - buf));
    if (rc)
      return rc;
    hosts = at + 1;
  }
  char *path = strchr(hosts, '/');
  if (path)
    *path++ = '\0';
  for (char *h = hosts;;) {
    char *comma = strchr(h, ',');
    if (comma && !st->cluster)
      return kvt_fail(st->ctx, KVT_ESPEC,
                      "redis tier: '%s': one HOST:PORT (redis+cluster:// takes several)", shown);
    int rc = parse_host(st, shown, h, comma ? (size_t)(comma - h) : strlen(h));
    if (rc)
      return rc;
    if (!comma)
      break;
    h = comma + 1;
  }
  uint64_t db = 0;
  if (path && *path && (parse_u64(path, 0, 1000000, &db) || (st->cluster && db != 0)))
    return kvt_fail(st->ctx, KVT_ESPEC, "redis tier: '%s': bad database '/%s'%s", shown, path,
                    st->cluster ? " (a cluster has only database 0)" : "");
  st->db = (int)db;
  char *save = NULL;
  for (char *kv = opts ? strtok_r(opts, "&", &save) : NULL; kv; kv = strtok_r(NULL, "&", &save)) {
    int rc = parse_option(st, shown, kv);
    if (rc)
      return rc;
  }
  return 0;
}

/* ---- open: reach the servers, learn the map and the capacity ---- */

static uint64_t info_field(const char *info, const char *name) {
  const char *p = strstr(info, name);
  return p ? strtoull(p + strlen(name), NULL, 10) : 0;
}

/* What one server has free: maxmemory (or its RAM where that is 0) less
 * what it uses now, its own memory and other clients' keys included; 0 when
 * it does not answer. */
static uint64_t node_free(rd_state *st, int node, int *answered) {
  rd_conn c;
  memset(&c, 0, sizeof(c));
  c.fd = -1;
  redisReply *r = NULL;
  const char *argv[2] = {"INFO", "memory"};
  const size_t lens[2] = {4, 6};
  uint64_t free_b = 0;
  if (rd_conn_open(st, node, &c, 0) == 0 && rd_ctl(st, &c, 2, argv, lens, &r) == 0) {
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
      const uint64_t mm = info_field(r->str, "\nmaxmemory:");
      const uint64_t limit = mm ? mm : info_field(r->str, "total_system_memory:");
      const uint64_t used = info_field(r->str, "\nused_memory:");
      free_b = limit > used ? limit - used : 0;
      *answered += limit > 0;
    }
    freeReplyObject(r);
  }
  rd_conn_free(st, &c);
  return free_b;
}

/* Without capacity=, the tier may hold what it holds plus what the masters
 * have free: so a server that refuses a PUT for memory (-ENOSPC) has the
 * tier report used close to capacity, and the cache evicts in time. Learned
 * at open, after such a refusal and every 10 s while operations run. */
void rd_learn_capacity(rd_state *st, uint64_t min_age_ms) {
  const uint64_t now = rd_now_ms();
  if (now < __atomic_load_n(&st->learned_ms, __ATOMIC_RELAXED) + min_age_ms ||
      pthread_mutex_trylock(&st->learn_mu) != 0)
    return;
  int masters[RD_MAX_NODES], n = 0, seen[RD_MAX_NODES] = {0}, answered = 0;
  pthread_mutex_lock(&st->map_mu);
  for (int s = 0; s < RD_SLOTS && (st->cluster || n == 0); s++) {
    const int node = st->cluster ? st->slot_node[s] : 0;
    if (node != RD_NO_NODE && !seen[node]) {
      seen[node] = 1;
      masters[n++] = node;
    }
  }
  pthread_mutex_unlock(&st->map_mu);
  uint64_t free_sum = 0;
  for (int i = 0; i < n; i++)
    free_sum += node_free(st, masters[i], &answered);
  pthread_mutex_lock(&st->acct_mu);
  if (answered)
    st->server_capacity = (uint64_t)(st->used > 0 ? st->used : 0) + free_sum;
  pthread_mutex_unlock(&st->acct_mu);
  __atomic_store_n(&st->learned_ms, rd_now_ms(), __ATOMIC_RELAXED);
  pthread_mutex_unlock(&st->learn_mu);
}

static int reach(rd_state *st) {
  int rc = KVT_EBACKEND;
  for (int i = 0; i < st->nseeds; i++) { /* the first seed that answers, for errors with detail */
    rd_conn c;
    memset(&c, 0, sizeof(c));
    c.fd = -1;
    kvt_clear_error(st->ctx);
    rc = rd_conn_connect(st, st->nodes[i].host, st->nodes[i].port, &c, 1);
    rd_conn_free(st, &c);
    if (rc == 0 || rc == KVT_EAUTH)
      break;
  }
  if (rc || !st->cluster)
    return rc;
  rc = rd_refresh_map(st, 1);
  if (rc && !kvt_ctx_last_error(st->ctx)[0])
    kvt_fail(st->ctx, rc, "redis tier: no seed node answered CLUSTER SLOTS: %s", kvt_strerror(rc));
  return rc;
}

static void state_free(rd_state *st) {
  if (st->workers) {
    for (uint32_t i = 0; i < st->conns; i++)
      rd_worker_fini(&st->workers[i]);
    kvt_dealloc(st->ctx, st->workers);
  }
  pthread_mutex_destroy(&st->map_mu);
  pthread_mutex_destroy(&st->refresh_mu);
  pthread_mutex_destroy(&st->q_mu);
  pthread_cond_destroy(&st->q_cv);
  pthread_mutex_destroy(&st->acct_mu);
  pthread_mutex_destroy(&st->learn_mu);
  kvt_dealloc(st->ctx, st);
}

static void stop_workers(rd_state *st) {
  pthread_mutex_lock(&st->q_mu);
  st->stop = 1;
  pthread_cond_broadcast(&st->q_cv);
  pthread_mutex_unlock(&st->q_mu);
  for (uint32_t i = 0; i < st->nworkers; i++)
    pthread_join(st->workers[i].thread, NULL);
  st->nworkers = 0;
}

static int start_workers(rd_state *st) {
  st->workers = kvt_alloc(st->ctx, sizeof(rd_worker) * st->conns, 64);
  if (!st->workers)
    return kvt_fail(st->ctx, -ENOMEM, "redis tier: allocating workers");
  memset(st->workers, 0, sizeof(rd_worker) * st->conns);
  for (uint32_t i = 0; i < st->conns; i++) {
    int rc = rd_worker_init(st, &st->workers[i]);
    if (!rc)
      rc = -pthread_create(&st->workers[i].thread, NULL, rd_worker_main, &st->workers[i]);
    if (rc) {
      stop_workers(st);
      return kvt_fail(st->ctx, rc, "redis tier: starting worker threads");
    }
    st->nworkers++;
  }
  return 0;
}

static int open_common(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state, int cluster) {
  rd_state *st = kvt_alloc(ctx, sizeof(*st), 64);
  if (!st)
    return kvt_fail(ctx, -ENOMEM, "redis tier: allocating its state");
  memset(st, 0, sizeof(*st));
  st->ctx = ctx;
  st->tier = tier;
  st->cluster = cluster;
  snprintf(st->ns, sizeof(st->ns), "default");
  st->timeout_ms = 2000;
  st->part = 64ull << 20;
  st->conns = 4;
  st->pipeline = 32;
  memset(st->slot_node, cluster ? RD_NO_NODE : 0, sizeof(st->slot_node));
  pthread_mutex_init(&st->map_mu, NULL);
  pthread_mutex_init(&st->refresh_mu, NULL);
  pthread_mutex_init(&st->q_mu, NULL);
  pthread_cond_init(&st->q_cv, NULL);
  pthread_mutex_init(&st->acct_mu, NULL);
  pthread_mutex_init(&st->learn_mu, NULL);
  int rc = parse_spec(st, args);
  if (!rc) {
    st->nseeds = st->nnodes;
    st->prefix_len = (size_t)snprintf(st->prefix, sizeof(st->prefix), "kvt:%s:", st->ns);
    rc = reach(st);
  }
  if (!rc) {
    if (!st->capacity)
      rd_learn_capacity(st, 0);
    rc = start_workers(st);
  }
  if (rc) {
    state_free(st);
    return rc;
  }
  *state = st;
  return 0;
}

static int redis_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state) {
  return open_common(ctx, args, tier, state, 0);
}

static int cluster_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state) {
  return open_common(ctx, args, tier, state, 1);
}

static void redis_close(void *state) {
  rd_state *st = state;
  stop_workers(st);
  state_free(st);
}

static int redis_submit(void *state, kvt_tier_op *op) {
  rd_state *st = state;
  op->internal[1] = NULL;
  pthread_mutex_lock(&st->q_mu);
  if (st->q_tail)
    st->q_tail->internal[1] = op;
  else
    __atomic_store_n(&st->q_head, op, __ATOMIC_RELAXED); /* take_batch peeks unlocked */
  st->q_tail = op;
  pthread_cond_signal(&st->q_cv);
  pthread_mutex_unlock(&st->q_mu);
  return 0;
}

static int redis_stats(void *state, kvt_tier_stats *out) {
  rd_state *st = state;
  pthread_mutex_lock(&st->acct_mu);
  out->used = st->used > 0 ? (uint64_t)st->used : 0;
  out->items = st->items > 0 ? (uint64_t)st->items : 0;
  out->capacity = st->capacity ? st->capacity : st->server_capacity;
  pthread_mutex_unlock(&st->acct_mu);
  out->item_overhead = RD_ITEM_OVERHEAD;
  out->granule = 0;
  return 0;
}

/* Designated: members appended to the table later stay NULL (optional). */
const kvt_tier_backend kvt_tier_backend_redis = {
    .abi_version = KVT_TIER_ABI_VERSION,
    .struct_size = sizeof(kvt_tier_backend),
    .scheme = "redis",
    .open = redis_open,
    .close = redis_close,
    .submit = redis_submit,
    .stats = redis_stats,
    .list = rd_list,
    .traits = KVT_TIER_PERSISTENT | KVT_TIER_SHARED | KVT_TIER_REMOTE,
};

const kvt_tier_backend kvt_tier_backend_redis_cluster = {
    .abi_version = KVT_TIER_ABI_VERSION,
    .struct_size = sizeof(kvt_tier_backend),
    .scheme = "redis+cluster",
    .open = cluster_open,
    .close = redis_close,
    .submit = redis_submit,
    .stats = redis_stats,
    .list = rd_list,
    .traits = KVT_TIER_PERSISTENT | KVT_TIER_SHARED | KVT_TIER_REMOTE,
};
