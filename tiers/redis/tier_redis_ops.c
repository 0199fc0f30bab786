/* tiers/redis/tier_redis_ops.c - the redis tier's workers. Each worker owns one
 * connection per node, takes up to `pipeline` queued operations, writes all
 * their commands to a node in one go and reads the replies in order
 * (phase 1), then runs the follow-up commands some need (phase 2: the
 * further parts of a large value, deleting the parts of a replaced, deleted
 * or failed value), and retries operations redirected by MOVED or ASK on
 * their new node.
 *
 * Layout of a value of L bytes under chunk key K (hex H), part size P, with
 * generation G (a random id per PUT, 16 hex digits):
 *   kvt:NS:{H}            header (64 bytes) + bytes [0, min(L, P))
 *   kvt:NS:{H}:G:p<i>     part header (32 bytes) + bytes [i*P, min(L, (i+1)*P)), i >= 1
 * (the headers, with the key and checksums: tier_redis_format.c).
 * The hash tag {H} puts a chunk's keys in one cluster slot. A PUT writes its
 * parts and its value key under its own generation's names (the value key as
 * kvt:NS:{H}:G:p0), then one script (PUT_LUA) checks they are all there,
 * reads the old header and renames p0 onto kvt:NS:{H}, all in one round
 * trip. A value in one part (most) is written with MULTI, GETRANGE of the
 * old header, SET, EXEC instead (no script, no extra key); DEL is MULTI,
 * GETRANGE, DEL, EXEC. Either way the switch is atomic, a failed PUT never
 * touches the old value, and each replaced value is seen by exactly one PUT
 * or DEL (exact items and used under concurrent replacement). The old
 * generation's parts are deleted after the switch.
 * Every part names its generation and index: a reader that finds a missing
 * part, another generation or a wrong length reports a miss, never mixed
 * bytes. A GET checks every header (its key, generation, index, length) and
 * the XXH3 of every part's data as it lands in the caller's buffer: a value
 * that fails is a miss (KVT_ENOTFOUND, what the cache takes for a lost copy),
 * logged as a warning naming the Redis key and the reason, and left in place
 * (a read never deletes: the next PUT replaces it). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>

#include "tier_redis.h"

/* KEYS[1] the value key; ARGV[1] the new generation's part names up to the
 * index (p0 is the new value key), ARGV[2] the part count. Returns nil
 * (nothing switched: a part is missing, its SET failed), or the old header
 * (its first 64 bytes, "" for none or another type). Only the value key is
 * declared, and a missing one is created before the RENAME: a slot being
 * imported (cluster, ASKING) refuses a command on several keys when one is
 * missing (TRYAGAIN). */
static const char PUT_LUA[] =
    "for i = 0, tonumber(ARGV[2]) - 1 do "
    "if redis.call('EXISTS', ARGV[1] .. i) == 0 then return false end end "
    "local h = '' "
    "local t = redis.call('TYPE', KEYS[1])['ok'] "
    "if t == 'string' then h = redis.call('GETRANGE', KEYS[1], 0, 63) "
    "elseif t == 'none' then redis.call('SET', KEYS[1], '') end "
    "redis.call('RENAME', ARGV[1] .. '0', KEYS[1]) "
    "return h";

enum { RD_NONE = 0, RD_MOVED = 1, RD_ASK = 2 };

typedef struct rd_job {
  kvt_tier_op *op;
  int node, ask, redirect, redirects, done;
  int result, conn_err;
  char key[200];
  size_t klen;
  unsigned slot;
  char rhost[256];
  int rport;
  /* the value written (PUT) or found (GET, QUERY, DEL) */
  uint64_t gen, total, psz;
  uint32_t nparts;
  uint64_t want_hash; /* GET: the XXH3-64 the data being read must have */
  /* the header that was there before (PUT, DEL), or QUERY's */
  uint8_t old[RD_HDR];
  int64_t old_len;
  int old_valid, reserved, phase2;
  int plain_del; /* DEL again without MULTI: the server refused it for memory */
  uint64_t cost;
} rd_job;

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static uint64_t cost_of(uint64_t total) { return total + RD_ITEM_OVERHEAD; }

/* What the header read before a PUT or DEL says: a value of ours for this
 * key (or format 1's, whose parts are removed as well). */
static int old_header(const rd_job *j, rd_hdr *v) {
  const int s = rd_hdr_check(j->old, (size_t)j->old_len, &j->op->key, v);
  return s == RD_HDR_OK || s == RD_HDR_FORMAT1;
}

/* Keeps the header a reply of type `type` and length blen brought. */
static void old_keep(rd_job *j, int rc, char type, int64_t blen) {
  rd_hdr v;
  j->old_len = !rc && type == '$' && blen > 0 && blen <= RD_HDR ? blen : 0;
  j->old_valid = j->old_len > 0 && old_header(j, &v);
}

/* The old value's generation and part count (1 when there was none). */
static uint32_t old_parts(const rd_job *j, uint64_t *gen, uint64_t *total) {
  rd_hdr v = {0};
  const int valid = j->old_valid && old_header(j, &v);
  if (gen)
    *gen = valid ? v.gen : 0;
  if (total)
    *total = valid ? v.total : 0;
  return valid ? v.nparts : 1;
}

/* ---- writing commands ---- */

static int put_num(rd_conn *c, char kind, uint64_t n) {
  char b[32];
  const int k = snprintf(b, sizeof(b), "%c%llu\r\n", kind, (unsigned long long)n);
  return rd_put_raw(c, b, (size_t)k);
}

static int put_arg(rd_conn *c, const void *p, size_t n) {
  int rc = put_num(c, '$', n);
  if (!rc)
    rc = rd_put_raw(c, p, n);
  return rc ? rc : rd_put_raw(c, "\r\n", 2);
}

static int put_main_key(rd_conn *c, const rd_job *j) { return put_arg(c, j->key, j->klen); }

/* kvt:NS:{H}:G:p (with_index 0) or kvt:NS:{H}:G:p<i>. */
static int part_name(char *k, size_t cap, const rd_job *j, uint64_t gen, uint32_t i,
                     int with_index) {
  const int n = snprintf(k, cap, "%.*s:%016llx:p", (int)j->klen, j->key, (unsigned long long)gen);
  return with_index ? n + snprintf(k + n, cap - (size_t)n, "%u", i) : n;
}

static int put_part_key(rd_conn *c, const rd_job *j, uint64_t gen, uint32_t part) {
  char k[256];
  const int n = part_name(k, sizeof(k), j, gen, part, 1);
  return put_arg(c, k, (size_t)n);
}

static int put_begin(rd_conn *c, const rd_job *j, int nargs) {
  int rc = 0;
  if (j->ask)
    rc = rd_put_raw(c, "*1\r\n$6\r\nASKING\r\n", 16);
  return rc ? rc : put_num(c, '*', (uint64_t)nargs);
}

/* GETRANGE key 0 63, with ASKING unless inside MULTI (whose ASKING holds). */
static int put_getrange_hdr(rd_conn *c, const rd_job *j, int in_tx) {
  int rc = in_tx ? put_num(c, '*', 4) : put_begin(c, j, 4);
  if (!rc)
    rc = put_arg(c, "GETRANGE", 8);
  if (!rc)
    rc = put_main_key(c, j);
  if (!rc)
    rc = put_arg(c, "0", 1);
  return rc ? rc : put_arg(c, "63", 2);
}

#define RD_MAIN UINT32_MAX /* put_set's part: the value key itself, inside MULTI */

/* SET <part i of the job's generation, or the value key> (head || data)
 * [PX ttl]: data is sent from the caller's buffer. */
static int put_set(rd_state *st, rd_conn *c, const rd_job *j, uint32_t part, const uint8_t *head,
                   size_t hn, const uint8_t *data, size_t dn) {
  const int nargs = st->ttl_ms ? 5 : 3;
  int rc = part == RD_MAIN ? put_num(c, '*', (uint64_t)nargs) : put_begin(c, j, nargs);
  if (!rc)
    rc = put_arg(c, "SET", 3);
  if (!rc)
    rc = part == RD_MAIN ? put_main_key(c, j) : put_part_key(c, j, j->gen, part);
  if (!rc)
    rc = put_num(c, '$', hn + dn);
  if (!rc)
    rc = rd_put_raw(c, head, hn);
  if (!rc)
    rc = rd_put_ref(c, data, dn);
  if (!rc)
    rc = rd_put_raw(c, "\r\n", 2);
  if (!rc && st->ttl_ms) {
    char t[32];
    const int n = snprintf(t, sizeof(t), "%llu", (unsigned long long)st->ttl_ms);
    rc = put_arg(c, "PX", 2);
    if (!rc)
      rc = put_arg(c, t, (size_t)n);
  }
  return rc;
}

/* MULTI, GETRANGE of the old header (the command follows), or EXEC. */
static int put_tx_begin(rd_conn *c, const rd_job *j) {
  int rc = put_begin(c, j, 1);
  if (!rc)
    rc = put_arg(c, "MULTI", 5);
  return rc ? rc : put_getrange_hdr(c, j, 1);
}

static int put_tx_end(rd_conn *c) { return rd_put_raw(c, "*1\r\n$4\r\nEXEC\r\n", 14); }

/* DEL of generation gen's parts [from, to). */
static int put_del(rd_conn *c, const rd_job *j, uint64_t gen, uint32_t from, uint32_t to) {
  int rc = put_begin(c, j, 1 + (int)(to - from));
  if (!rc)
    rc = put_arg(c, "DEL", 3);
  for (uint32_t i = from; i < to && !rc; i++)
    rc = put_part_key(c, j, gen, i);
  return rc;
}

/* EVAL PUT_LUA 1 <value key> <part names> <count>. */
static int put_switch(rd_conn *c, const rd_job *j) {
  int rc = put_begin(c, j, 6);
  if (!rc)
    rc = put_arg(c, "EVAL", 4);
  if (!rc)
    rc = put_arg(c, PUT_LUA, sizeof(PUT_LUA) - 1);
  if (!rc)
    rc = put_arg(c, "1", 1);
  if (!rc)
    rc = put_main_key(c, j);
  if (rc)
    return rc;
  char k[256], n[16];
  const int kn = part_name(k, sizeof(k), j, j->gen, 0, 0);
  const int nn = snprintf(n, sizeof(n), "%u", j->nparts);
  rc = put_arg(c, k, (size_t)kn);
  return rc ? rc : put_arg(c, n, (size_t)nn);
}

/* One part: MULTI, GETRANGE, SET, EXEC. Several: the parts, then the value
 * itself (as p0), then the switch. */
static int append_put(rd_state *st, rd_conn *c, rd_job *j) {
  const kvt_tier_op *op = j->op;
  const uint8_t *data = op->buf;
  const uint64_t n0 = op->len < j->psz ? op->len : j->psz;
  const rd_hdr v = {.gen = j->gen,
                    .total = op->len,
                    .psz = j->psz,
                    .nparts = j->nparts,
                    .hash = kvt_hash64(n0 ? data : (const uint8_t *)"", (size_t)n0)};
  uint8_t h[RD_HDR];
  rd_hdr_make(h, &op->key, &v);
  int rc = 0;
  if (j->nparts == 1) {
    rc = put_tx_begin(c, j);
    if (!rc)
      rc = put_set(st, c, j, RD_MAIN, h, RD_HDR, data, (size_t)op->len);
    return rc ? rc : put_tx_end(c);
  }
  for (uint32_t i = 1; i < j->nparts && !rc; i++) {
    uint8_t ph[RD_PHDR];
    const uint64_t off = (uint64_t)i * j->psz, n = op->len - off < j->psz ? op->len - off : j->psz;
    rd_part_make(ph, &op->key, op->len, j->gen, i, kvt_hash64(data + off, (size_t)n));
    rc = put_set(st, c, j, i, ph, RD_PHDR, data + off, (size_t)n);
  }
  if (!rc)
    rc = put_set(st, c, j, 0, h, RD_HDR, data, (size_t)n0);
  return rc ? rc : put_switch(c, j);
}

static int append_phase1(rd_state *st, rd_conn *c, rd_job *j) {
  switch (j->op->opcode) {
  case KVT_TIER_PUT:
    return append_put(st, c, j);
  case KVT_TIER_GET: {
    int rc = put_begin(c, j, 2);
    if (!rc)
      rc = put_arg(c, "GET", 3);
    return rc ? rc : put_main_key(c, j);
  }
  case KVT_TIER_QUERY:
    return put_getrange_hdr(c, j, 0);
  default: {
    if (j->plain_del) { /* GETRANGE of the header, then DEL, pipelined */
      int rc = put_getrange_hdr(c, j, 0);
      if (!rc)
        rc = put_begin(c, j, 2);
      if (!rc)
        rc = put_arg(c, "DEL", 3);
      return rc ? rc : put_main_key(c, j);
    }
    int rc = put_tx_begin(c, j);
    if (!rc)
      rc = put_num(c, '*', 2);
    if (!rc)
      rc = put_arg(c, "DEL", 3);
    if (!rc)
      rc = put_main_key(c, j);
    return rc ? rc : put_tx_end(c);
  }
  }
}

static int append_phase2(rd_conn *c, rd_job *j) {
  if (j->op->opcode == KVT_TIER_GET) {
    int rc = 0;
    for (uint32_t i = 1; i < j->nparts && !rc; i++) {
      rc = put_begin(c, j, 2);
      if (!rc)
        rc = put_arg(c, "GET", 3);
      if (!rc)
        rc = put_part_key(c, j, j->gen, i);
    }
    return rc;
  }
  /* A failed PUT removes what it wrote; a PUT or DEL that replaced or removed
   * a value in parts removes those parts. */
  if (j->op->opcode == KVT_TIER_PUT && j->result != 0)
    return put_del(c, j, j->gen, 0, j->nparts);
  uint64_t og;
  const uint32_t on = old_parts(j, &og, NULL);
  return put_del(c, j, og, 1, on);
}

/* ---- reading replies ---- */

/* An error reply for j: a redirect, or its first error. */
static void job_error(rd_state *st, rd_job *j, const char *text) {
  int kind = strncmp(text, "MOVED ", 6) == 0 ? RD_MOVED : strncmp(text, "ASK ", 4) == 0 ? RD_ASK : 0;
  if (kind) {
    unsigned slot;
    char addr[300];
    const char *colon;
    if (sscanf(text + (kind == RD_MOVED ? 6 : 4), "%u %299s", &slot, addr) == 2 &&
        (colon = strrchr(addr, ':')) != NULL && !j->redirect) {
      const int n = (int)(colon - addr);
      if (n == 0 || (n == 1 && addr[0] == '?')) { /* unknown endpoint: the node that replied */
        pthread_mutex_lock(&st->map_mu);
        snprintf(j->rhost, sizeof(j->rhost), "%s", st->nodes[j->node].host);
        pthread_mutex_unlock(&st->map_mu);
      } else {
        snprintf(j->rhost, sizeof(j->rhost), "%.*s", n, addr);
      }
      j->rport = atoi(colon + 1);
      j->redirect = kind;
      return;
    }
  }
  const int code = rd_reply_error(text, strlen(text));
  if (code == -EAGAIN && st->cluster) {
    pthread_mutex_lock(&st->map_mu);
    st->map_stale = 1; /* READONLY, CLUSTERDOWN: a failover may be under way */
    pthread_mutex_unlock(&st->map_mu);
  }
  if (!j->result)
    j->result = code; /* WRONGTYPE: not a value of ours, a miss */
}

/* Reads one reply of a small kind; a bulk string lands in small (when it
 * fits: *blen says its length, -1 for nil). Returns an I/O error only. */
static int read_small(rd_state *st, rd_conn *c, rd_job *j, char *type, int64_t *num,
                      uint8_t *small, size_t cap, int64_t *blen) {
  char text[512];
  rd_arm(st, c); /* each reply within timeout_ms */
  int rc = rd_read_line(c, type, num, text, sizeof(text));
  if (rc)
    return rc;
  if (*type == '-') {
    job_error(st, j, text);
  } else if (*type == '$') {
    *blen = *num;
    if (*num >= 0) {
      const size_t n = (size_t)*num;
      rc = rd_read_exact(c, n <= cap ? small : NULL, n);
      if (!rc)
        rc = rd_read_exact(c, NULL, 2);
    }
  } else if (*type == '*') {
    return KVT_EPROTO; /* no command of the data path answers with an array */
  }
  return rc;
}

static int read_asking(rd_state *st, rd_conn *c, rd_job *j) {
  char type;
  int64_t num, blen;
  return j->ask ? read_small(st, c, j, &type, &num, NULL, 0, &blen) : 0;
}

/* A GET found a value that fails a check: a miss, with a warning. Part 0 is
 * the value key. */
static void corrupt(rd_state *st, rd_job *j, uint32_t part, const char *why) {
  j->result = KVT_ENOTFOUND;
  const unsigned long long n = __atomic_add_fetch(&st->corrupt, 1, __ATOMIC_RELAXED);
  char name[256];
  if (part)
    part_name(name, sizeof(name), j, j->gen, part, 1);
  else
    snprintf(name, sizeof(name), "%.*s", (int)j->klen, j->key);
  kvt_logf(st->ctx, KVT_LOG_WARN, "redis tier: %s: %s; a miss (values failing checks: %llu)", name,
           why, n);
}

/* A bulk reply (the value key, or part `part`) of up to hn header bytes +
 * data: the header lands in head,
 * and check() says whether the data goes to dst (else it is discarded) and
 * what XXH3-64 it must have (j->want_hash). */
typedef int (*head_check)(rd_state *st, rd_job *j, const uint8_t *head, size_t hn,
                          uint64_t data_len);

static int read_bulk(rd_state *st, rd_conn *c, rd_job *j, uint32_t part, size_t hn, uint8_t *head,
                     head_check check, uint8_t *dst, int64_t *blen) {
  char type, text[512];
  int64_t num = 0;
  *blen = -2;
  int rc = read_asking(st, c, j);
  rd_arm(st, c);
  if (!rc)
    rc = rd_read_line(c, &type, &num, text, sizeof(text));
  if (rc)
    return rc;
  if (type == '-') {
    job_error(st, j, text);
    return 0;
  }
  if (type != '$')
    return KVT_EPROTO;
  *blen = num;
  if (num < 0)
    return 0;
  size_t left = (size_t)num;
  int take = 0;
  if (!j->result && !j->redirect) {
    const size_t got = left < hn ? left : hn;
    rc = rd_read_exact(c, head, got);
    left -= got;
    take = !rc && check(st, j, head, got, left);
  }
  if (!rc)
    rc = rd_read_exact(c, take ? dst : NULL, left);
  if (!rc && take && kvt_hash64(left ? dst : (const uint8_t *)"", left) != j->want_hash)
    corrupt(st, j, part, "data checksum mismatch");
  return rc ? rc : rd_read_exact(c, NULL, 2);
}

static int check_main(rd_state *st, rd_job *j, const uint8_t *h, size_t hn, uint64_t data_len) {
  rd_hdr v;
  const int s = rd_hdr_check(h, hn, &j->op->key, &v);
  if (s != RD_HDR_OK) {
    corrupt(st, j, 0, rd_hdr_why(s));
    return 0;
  }
  if (data_len != (v.total < v.psz ? v.total : v.psz)) {
    corrupt(st, j, 0, "data length differs from its header's");
    return 0;
  }
  j->gen = v.gen, j->total = v.total, j->nparts = v.nparts, j->psz = v.psz;
  j->want_hash = v.hash;
  j->op->out_len = v.total;
  if (v.total > j->op->len) {
    j->result = KVT_ENOBUFS;
    return 0;
  }
  j->phase2 = v.nparts > 1;
  return 1;
}

static int check_part(rd_state *st, rd_job *j, const uint8_t *h, size_t hn, uint64_t data_len) {
  const uint32_t i = (uint32_t)j->phase2;
  const uint64_t off = (uint64_t)i * j->psz;
  const uint64_t want = j->total - off < j->psz ? j->total - off : j->psz;
  const int s = rd_part_check(h, hn, &j->op->key, j->total, j->gen, i, &j->want_hash);
  if (s == RD_HDR_OTHER_KEY) {
    j->result = KVT_ENOTFOUND; /* another generation's: a PUT replaced it since */
    return 0;
  }
  if (s != RD_HDR_OK || data_len != want) {
    corrupt(st, j, i,
            s != RD_HDR_OK ? "part header checksum mismatch (damaged, or another "
                             "key's or value's part)"
                           : "part length differs from the header's");
    return 0;
  }
  return 1;
}

static int read_get(rd_state *st, rd_conn *c, rd_job *j) {
  uint8_t h[RD_HDR];
  int64_t blen;
  const int rc = read_bulk(st, c, j, 0, RD_HDR, h, check_main, j->op->buf, &blen);
  if (!rc && blen < 0 && !j->result && !j->redirect)
    j->result = KVT_ENOTFOUND;
  return rc;
}

/* GETRANGE of the header, or a script's reply: the header (old_valid), and
 * whether there was a reply at all (*nil: a nil bulk). */
static int read_hdr(rd_state *st, rd_conn *c, rd_job *j, int *nil) {
  char type = 0;
  int64_t num, blen = -1;
  int rc = read_asking(st, c, j);
  if (!rc)
    rc = read_small(st, c, j, &type, &num, j->old, sizeof(j->old), &blen);
  old_keep(j, rc, type, blen);
  *nil = !rc && type == '$' && blen < 0;
  return rc;
}

static int read_status(rd_state *st, rd_conn *c, rd_job *j, int64_t *num) {
  char type;
  int64_t blen;
  int rc = read_asking(st, c, j);
  return rc ? rc : read_small(st, c, j, &type, num, NULL, 0, &blen);
}

/* MULTI's +OK, two +QUEUED (or errors: MOVED, OOM), then EXEC's reply:
 * [the old header (or WRONGTYPE: another type, which the command replaces),
 * the command's reply (*num)], or an error (EXECABORT). */
static int read_tx(rd_state *st, rd_conn *c, rd_job *j, int64_t *num) {
  char type, text[512];
  int64_t n = 0, blen;
  int rc = read_asking(st, c, j);
  for (int i = 0; i < 3 && !rc; i++)
    rc = read_small(st, c, j, &type, &n, NULL, 0, &blen);
  rd_arm(st, c);
  if (!rc)
    rc = rd_read_line(c, &type, &n, text, sizeof(text));
  if (rc || type == '-') {
    if (!rc)
      job_error(st, j, text);
    return rc;
  }
  if (type != '*' || n != 2)
    return KVT_EPROTO;
  const int saved = j->result;
  rc = read_small(st, c, j, &type, &n, j->old, sizeof(j->old), &blen);
  j->result = saved;
  old_keep(j, rc, type, blen);
  return rc ? rc : read_small(st, c, j, &type, num, NULL, 0, &blen);
}

/* One part: the transaction. Several: the parts' and p0's SETs, then the
 * switch. */
static int read_put(rd_state *st, rd_conn *c, rd_job *j) {
  int64_t num = 0;
  int rc = 0, nil = 0;
  if (j->nparts == 1) {
    rc = read_tx(st, c, j, &num);
  } else {
    for (uint32_t i = 0; i < j->nparts && !rc; i++)
      rc = read_status(st, c, j, &num);
    if (!rc)
      rc = read_hdr(st, c, j, &nil);
  }
  if (rc || j->redirect)
    return rc;
  if (nil && !j->result)
    j->result = -ENOSPC; /* a part was gone at the switch: evicted, the server is full */
  if (j->result) {
    j->old_valid = 0;
    j->phase2 = j->nparts > 1; /* remove what did get written */
  } else {
    uint64_t og;
    j->phase2 = old_parts(j, &og, NULL) > 1 && og != j->gen;
  }
  return 0;
}

static int read_phase1(rd_state *st, rd_conn *c, rd_job *j) {
  int rc, nil = 0;
  switch (j->op->opcode) {
  case KVT_TIER_PUT:
    return read_put(st, c, j);
  case KVT_TIER_GET:
    return read_get(st, c, j);
  case KVT_TIER_QUERY:
    rc = read_hdr(st, c, j, &nil);
    if (!rc && !j->result && !j->redirect) {
      rd_hdr v; /* only a header of ours for this key, checksum and all */
      const int ok = rd_hdr_check(j->old, (size_t)j->old_len, &j->op->key, &v) == RD_HDR_OK;
      j->op->out_len = ok ? v.total : 0;
      j->result = ok ? 0 : KVT_ENOTFOUND;
    }
    j->old_valid = 0;
    return rc;
  default: {
    int64_t num = 0;
    if (j->plain_del) {
      const int saved = j->result;
      rc = read_hdr(st, c, j, &nil);
      if (!j->redirect)
        j->result = saved; /* WRONGTYPE: another type, which DEL removes too */
      if (!rc)
        rc = read_status(st, c, j, &num);
    } else {
      rc = read_tx(st, c, j, &num);
    }
    if (!rc && !j->result && !j->redirect) {
      j->result = num > 0 ? 0 : KVT_ENOTFOUND; /* another type under the name: deleted too */
      j->nparts = 1;
      j->phase2 = j->result == 0 && old_parts(j, NULL, NULL) > 1;
    }
    if (j->result)
      j->old_valid = 0;
    return rc;
  }
  }
}

static int read_phase2(rd_state *st, rd_conn *c, rd_job *j) {
  if (j->op->opcode != KVT_TIER_GET) {
    int64_t num; /* cleanup: its own errors do not change the result */
    const int saved = j->result, redirect = j->redirect;
    const int rc = read_status(st, c, j, &num);
    j->result = saved, j->redirect = redirect;
    return rc;
  }
  int rc = 0;
  for (uint32_t i = 1; i < j->nparts && !rc; i++) {
    uint8_t h[RD_PHDR];
    int64_t blen;
    j->phase2 = (int)i;
    rc = read_bulk(st, c, j, i, RD_PHDR, h, check_part,
                   (uint8_t *)j->op->buf + (uint64_t)i * j->psz, &blen);
    if (!rc && blen < (int64_t)RD_PHDR && !j->result && !j->redirect)
      j->result = KVT_ENOTFOUND; /* a part is gone (evicted, expired, deleted) */
  }
  return rc;
}

/* ---- running a batch ---- */

static void conn_lost(rd_worker *w, int node, int err, int failed) {
  rd_state *st = w->st;
  pthread_mutex_lock(&st->map_mu);
  char where[300];
  snprintf(where, sizeof(where), "%s:%d", st->nodes[node].host, st->nodes[node].port);
  st->map_stale = st->cluster;
  pthread_mutex_unlock(&st->map_mu);
  kvt_logf(st->ctx, KVT_LOG_WARN, "redis tier: %s: %s; %d operation(s) failed, reconnecting",
           where, kvt_strerror(err), failed);
  rd_conn_close(st, &w->conn[node]);
}

static int in_phase(const rd_job *j, int phase) {
  if (j->conn_err)
    return 0;
  if (phase == 1)
    return 1;
  return j->phase2 && !j->redirect && (j->op->opcode != KVT_TIER_GET || !j->result);
}

/* Which jobs a connection error at (phase, next) fails: those whose phase-1
 * replies were not all read, and every GET whose further parts were not
 * read (wherever it stands in the list). A PUT or DEL whose phase 2 only
 * cleans up keeps its result: it did happen (the parts it meant to delete
 * stay, and expire with ttl=). */
static int fail_on_conn_error(rd_job **list, int n, int phase, int next, int rc) {
  int failed = 0;
  for (int k = 0; k < n; k++) {
    rd_job *j = list[k];
    const int get_parts = j->op->opcode == KVT_TIER_GET && in_phase(j, 2);
    const int fail = phase == 1 ? k >= next || get_parts : k >= next && get_parts;
    if (fail && !j->conn_err) {
      j->conn_err = rc;
      failed++;
    }
  }
  return failed;
}

/* Phase 1 and 2 of the jobs in list (all on node) over one connection, each
 * write and each reply within timeout_ms. A connection the server closed
 * while it was idle (its `timeout`, a restart) is replaced before use. */
static void exec_node(rd_worker *w, int node, rd_job **list, int n) {
  rd_state *st = w->st;
  rd_conn *c = &w->conn[node];
  if (c->rc && !rd_conn_alive(c))
    rd_conn_close(st, c);
  int rc = c->rc ? 0 : rd_conn_open(st, node, c, 0);
  int phase = 1, next = 0;
  while (!rc && phase <= 2) {
    int any = 0;
    rd_arm(st, c);
    for (int i = 0; i < n && !rc; i++)
      if (in_phase(list[i], phase)) {
        rc = phase == 1 ? append_phase1(st, c, list[i]) : append_phase2(c, list[i]);
        any = 1;
      }
    if (!rc && any)
      rc = rd_flush(c);
    for (next = 0; next < n && !rc;) {
      if (in_phase(list[next], phase))
        rc = phase == 1 ? read_phase1(st, c, list[next]) : read_phase2(st, c, list[next]);
      if (!rc)
        next++;
    }
    if (!rc)
      phase++;
  }
  if (!rc)
    return;
  const int failed = fail_on_conn_error(list, n, phase, next, rc);
  if (c->rc)
    conn_lost(w, node, rc, failed);
}

/* With ttl= and capacity=, values expire behind the handle's back: before
 * refusing a PUT for capacity, count the namespace again (at most once a
 * second). Called without acct_mu; the values in flight stay reserved. */
static void recount(rd_state *st) {
  if (pthread_mutex_trylock(&st->learn_mu) != 0)
    return;
  const uint64_t now = rd_now_ms();
  uint64_t used = 0, items = 0;
  if (now >= __atomic_load_n(&st->next_recount_ms, __ATOMIC_RELAXED) &&
      rd_recount(st, &used, &items) == 0) {
    pthread_mutex_lock(&st->acct_mu);
    st->used = (int64_t)used + st->pending;
    st->items = (int64_t)items;
    pthread_mutex_unlock(&st->acct_mu);
  }
  __atomic_store_n(&st->next_recount_ms, rd_now_ms() + 1000, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&st->learn_mu);
}

static int reserve(rd_state *st, rd_job *j) {
  pthread_mutex_lock(&st->acct_mu); /* concurrent PUTs see each other */
  const uint64_t used = (uint64_t)(st->used < 0 ? 0 : st->used);
  const int fits = !st->capacity || used + j->cost <= st->capacity;
  if (fits) {
    st->used += (int64_t)j->cost;
    st->pending += (int64_t)j->cost;
    st->items++;
    j->reserved = 1;
  }
  pthread_mutex_unlock(&st->acct_mu);
  return fits;
}

static void job_prepare(rd_state *st, rd_job *j, kvt_tier_op *op, uint64_t *rng) {
  static const char hex[] = "0123456789abcdef";
  memset(j, 0, sizeof(*j));
  j->op = op;
  memcpy(j->key, st->prefix, st->prefix_len);
  char *p = j->key + st->prefix_len;
  *p++ = '{';
  for (int i = 0; i < 16; i++) {
    *p++ = hex[op->key.bytes[i] >> 4];
    *p++ = hex[op->key.bytes[i] & 15];
  }
  *p++ = '}';
  j->klen = (size_t)(p - j->key);
  j->slot = rd_crc16(j->key + st->prefix_len + 1, 32) & (RD_SLOTS - 1);
  j->node = rd_node_of_slot(st, j->slot);
  if (j->node < 0) {
    pthread_mutex_lock(&st->map_mu);
    st->map_stale = 1;
    pthread_mutex_unlock(&st->map_mu);
  }
  if (op->opcode != KVT_TIER_PUT)
    return;
  j->gen = rng_next(rng);
  uint64_t fit = (op->len + RD_MAX_PARTS - 1) / RD_MAX_PARTS; /* the header says psz */
  fit = fit < (511ull << 20) ? fit : 511ull << 20;              /* Redis' bulk limit */
  j->psz = fit > st->part ? fit : st->part;
  j->nparts = rd_parts_of(op->len, j->psz);
  j->cost = cost_of(op->len);
  if (j->nparts > RD_MAX_PARTS) { /* above 511 GiB */
    j->result = -ENOSPC;
    j->done = 1;
    return;
  }
  if (reserve(st, j))
    return;
  if (st->ttl_ms && rd_now_ms() >= __atomic_load_n(&st->next_recount_ms, __ATOMIC_RELAXED)) {
    recount(st);
    if (reserve(st, j))
      return;
  }
  j->result = -ENOSPC;
  j->done = 1;
}

/* Whether the stats already said that a value of this cost does not fit
 * (else capacity is learned again: the server knows better). */
static int refusal_expected(rd_state *st, uint64_t cost) {
  pthread_mutex_lock(&st->acct_mu);
  const int expected = (uint64_t)(st->used > 0 ? st->used : 0) + cost > st->server_capacity;
  pthread_mutex_unlock(&st->acct_mu);
  return expected;
}

/* Returns the cost of a PUT the server refused for lack of memory, else 0. */
static uint64_t job_account(rd_state *st, rd_job *j) {
  uint64_t total = 0;
  const int old = j->op->result == 0 && j->old_valid &&
                  (j->op->opcode == KVT_TIER_PUT || j->op->opcode == KVT_TIER_DEL);
  if (old)
    old_parts(j, NULL, &total);
  pthread_mutex_lock(&st->acct_mu);
  if (j->reserved) {
    st->pending -= (int64_t)j->cost;
    if (j->op->result != 0) {
      st->used -= (int64_t)j->cost;
      st->items--;
    }
  }
  if (old) {
    st->used -= (int64_t)cost_of(total);
    st->items--;
  }
  pthread_mutex_unlock(&st->acct_mu);
  return j->reserved && j->op->result == -ENOSPC ? j->cost : 0;
}

/* A redirected job goes again to its new node; MOVED also updates the map. */
static void job_redirect(rd_state *st, rd_job *j) {
  const int node = rd_node_add(st, j->rhost, j->rport);
  kvt_logf(st->ctx, KVT_LOG_DEBUG, "redis tier: slot %u: %s %s:%d", j->slot,
           j->redirect == RD_MOVED ? "MOVED to" : "ASK at", j->rhost, j->rport);
  if (node < 0 || ++j->redirects > RD_MAX_REDIRECTS) {
    j->result = KVT_EBACKEND;
    j->done = 1;
    return;
  }
  if (j->redirect == RD_MOVED) {
    pthread_mutex_lock(&st->map_mu);
    st->slot_node[j->slot] = (uint8_t)node;
    st->map_stale = 1; /* others moved too, most likely */
    pthread_mutex_unlock(&st->map_mu);
  }
  j->ask = j->redirect == RD_ASK;
  j->node = node;
  j->redirect = 0;
  j->result = 0;
  j->phase2 = 0;
  j->old_valid = 0;
  j->op->out_len = 0;
  if (j->op->opcode == KVT_TIER_DEL)
    j->nparts = 0;
}

static void run_batch(rd_worker *w, rd_job *jobs, int n) {
  rd_state *st = w->st;
  rd_job *list[1024];
  uint64_t full = 0;
  for (int round = 0; round <= RD_MAX_REDIRECTS; round++) {
    int more = 0;
    for (int node = 0; node < RD_MAX_NODES; node++) {
      int k = 0;
      for (int i = 0; i < n; i++)
        if (!jobs[i].done && jobs[i].node == node)
          list[k++] = &jobs[i];
      if (k)
        exec_node(w, node, list, k);
    }
    for (int i = 0; i < n; i++) {
      rd_job *j = &jobs[i];
      if (j->done)
        continue;
      if (j->node < 0) {
        j->result = KVT_EBACKEND; /* no node serves the slot */
        j->done = 1;
      } else if (j->conn_err) {
        j->result = j->conn_err;
        j->done = 1;
      } else if (j->redirect) {
        job_redirect(st, j);
        more += !j->done;
      } else if (j->op->opcode == KVT_TIER_DEL && j->result == -ENOSPC && !j->plain_del) {
        /* A server over maxmemory refuses every command queued in MULTI,
         * DEL included, and DEL is how room is made on it: so again, as
         * GETRANGE and DEL pipelined. Not atomic, but while the server
         * refuses writes no PUT of the key can come in between. */
        j->plain_del = 1;
        j->result = 0;
        j->phase2 = 0;
        j->old_valid = 0;
        j->nparts = 0;
        more++;
      } else {
        j->done = 1;
      }
    }
    if (!more)
      break;
  }
  for (int i = 0; i < n; i++) {
    rd_job *j = &jobs[i];
    if (!j->done || j->redirect)
      j->result = KVT_EBACKEND; /* too many redirects */
    j->op->result = j->result;
    if (j->result != 0 && j->result != KVT_ENOBUFS)
      j->op->out_len = 0;
    const uint64_t refused = job_account(st, j);
    full = refused > full ? refused : full;
  }
  if (full && !st->capacity && !refusal_expected(st, full)) {
    rd_learn_capacity(st, 0); /* before the caller sees -ENOSPC: capacity follows */
    /* The server's own buffers (a client's query buffer holds a whole
     * value) move its used_memory by tens of KiB between the refusal and
     * the INFO above: what it just refused is the better evidence, until
     * the next periodic count. */
    pthread_mutex_lock(&st->acct_mu);
    const uint64_t u = st->used > 0 ? (uint64_t)st->used : 0;
    if (u + full <= st->server_capacity)
      st->server_capacity = u + full - 1;
    pthread_mutex_unlock(&st->acct_mu);
  }
  for (int i = 0; i < n; i++)
    kvt_tier_complete(st->tier, jobs[i].op);
}

/* Takes up to `pipeline` operations (and about 64 MiB of payload). */
static int take_batch(rd_state *st, kvt_tier_op **ops) {
  /* A caller that waits for each completion submits its next operation
   * within microseconds: yield a few times before sleeping, which saves the
   * futex wake-up round trip. */
  for (int i = 0; i < 16 && !__atomic_load_n(&st->q_head, __ATOMIC_RELAXED); i++)
    sched_yield();
  pthread_mutex_lock(&st->q_mu);
  while (!st->q_head && !st->stop)
    pthread_cond_wait(&st->q_cv, &st->q_mu);
  int n = 0;
  uint64_t bytes = 0;
  while (st->q_head && n < (int)st->pipeline && (n == 0 || bytes < (64ull << 20))) {
    kvt_tier_op *op = st->q_head;
    __atomic_store_n(&st->q_head, (kvt_tier_op *)op->internal[1], __ATOMIC_RELAXED);
    if (!st->q_head)
      st->q_tail = NULL;
    bytes += op->len;
    ops[n++] = op;
  }
  if (st->q_head)
    pthread_cond_signal(&st->q_cv); /* more for another worker */
  pthread_mutex_unlock(&st->q_mu);
  return n;
}

void *rd_worker_main(void *arg) {
  rd_worker *w = arg;
  rd_state *st = w->st;
  kvt_tier_op *ops[1024];
  uint64_t rng;
  if (getrandom(&rng, sizeof(rng), 0) != (ssize_t)sizeof(rng)) /* generations must not repeat */
    rng = (uint64_t)(uintptr_t)w ^ rd_now_ms() * 0x2545F4914F6CDD1Dull;
  for (;;) {
    const int n = take_batch(st, ops);
    if (n == 0)
      break; /* stopping, queue empty */
    pthread_mutex_lock(&st->map_mu);
    const int stale = st->map_stale;
    pthread_mutex_unlock(&st->map_mu);
    if (stale)
      rd_refresh_map(st, 0);
    for (int i = 0; i < n; i++)
      job_prepare(st, &w->jobs[i], ops[i], &rng);
    run_batch(w, w->jobs, n);
    if (!st->capacity)
      rd_learn_capacity(st, 10000); /* other clients' values come and go */
  }
  return NULL;
}

int rd_worker_init(rd_state *st, rd_worker *w) {
  memset(w, 0, sizeof(*w));
  w->st = st;
  w->jobs = kvt_alloc(st->ctx, sizeof(rd_job) * st->pipeline, 64);
  if (!w->jobs)
    return -ENOMEM;
  for (int i = 0; i < RD_MAX_NODES; i++)
    w->conn[i].fd = -1;
  return 0;
}

void rd_worker_fini(rd_worker *w) {
  if (!w->st)
    return;
  for (int i = 0; i < RD_MAX_NODES; i++)
    rd_conn_free(w->st, &w->conn[i]);
  kvt_dealloc(w->st->ctx, w->jobs);
  w->jobs = NULL;
}
