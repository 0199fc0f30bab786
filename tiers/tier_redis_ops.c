/* tiers/tier_redis_ops.c - the redis tier's workers. Each worker owns one
 * connection per node, takes up to `pipeline` queued operations, writes all
 * their commands to a node in one go and reads the replies in order
 * (phase 1), then runs the follow-up commands some need (phase 2: the
 * further parts of a large value, deleting parts a shorter value left), and
 * retries operations redirected by MOVED or ASK on their new node.
 *
 * Layout of a value of L bytes under chunk key K (hex H), part size P:
 *   kvt:NS:{H}        header (32 bytes) + bytes [0, min(L, P))
 *   kvt:NS:{H}:p<i>   part header (16 bytes) + bytes [i*P, min(L, (i+1)*P)), i >= 1
 * The hash tag {H} puts a chunk's keys in one cluster slot. Parts are written
 * before the value key, and every part names the generation (a random id) of
 * the header that owns it: a reader that finds a missing part, another
 * generation or a wrong length reports a miss, never mixed bytes. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "tier_redis.h"

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
  /* the header that was there before (PUT, DEL) */
  uint8_t old[RD_HDR];
  int old_valid, reserved, phase2;
  uint64_t cost;
} rd_job;

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static uint32_t parts_of(uint64_t total, uint64_t psz) {
  return total == 0 ? 1u : (uint32_t)((total + psz - 1) / psz);
}

static uint64_t cost_of(uint64_t total, uint32_t nparts) {
  return total + RD_HDR + (uint64_t)RD_PHDR * (nparts - 1);
}

static void hdr_make(uint8_t *h, uint64_t gen, uint64_t total, uint32_t nparts, uint64_t psz) {
  memcpy(h, "KVTR", 4);
  h[4] = 1;
  h[5] = h[6] = h[7] = 0;
  kvt_st64(h + 8, gen);
  kvt_st64(h + 16, total);
  kvt_st32(h + 24, nparts);
  kvt_st32(h + 28, (uint32_t)psz);
}

/* Parses a value header; 0 when it is not one of ours. */
static int hdr_parse(const uint8_t *h, uint64_t *gen, uint64_t *total, uint32_t *nparts,
                     uint64_t *psz) {
  if (memcmp(h, "KVTR", 4) != 0 || h[4] != 1)
    return 0;
  *gen = kvt_ld64(h + 8);
  *total = kvt_ld64(h + 16);
  *nparts = kvt_ld32(h + 24);
  *psz = kvt_ld32(h + 28);
  return *psz > 0 && *nparts == parts_of(*total, *psz);
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

static int put_key(rd_conn *c, const rd_job *j, uint32_t part) {
  if (part == 0)
    return put_arg(c, j->key, j->klen);
  char k[224];
  const int n = snprintf(k, sizeof(k), "%.*s:p%u", (int)j->klen, j->key, part);
  return put_arg(c, k, (size_t)n);
}

static int put_begin(rd_conn *c, const rd_job *j, int nargs) {
  int rc = 0;
  if (j->ask)
    rc = rd_put_raw(c, "*1\r\n$6\r\nASKING\r\n", 16);
  return rc ? rc : put_num(c, '*', (uint64_t)nargs);
}

static int put_getrange_hdr(rd_conn *c, const rd_job *j) {
  int rc = put_begin(c, j, 4);
  if (!rc)
    rc = put_arg(c, "GETRANGE", 8);
  if (!rc)
    rc = put_key(c, j, 0);
  if (!rc)
    rc = put_arg(c, "0", 1);
  return rc ? rc : put_arg(c, "31", 2);
}

/* SET key (head || data) [PX ttl]: data is sent from the caller's buffer. */
static int put_set(rd_state *st, rd_conn *c, const rd_job *j, uint32_t part, const uint8_t *head,
                   size_t hn, const uint8_t *data, size_t dn) {
  int rc = put_begin(c, j, st->ttl_ms ? 5 : 3);
  if (!rc)
    rc = put_arg(c, "SET", 3);
  if (!rc)
    rc = put_key(c, j, part);
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

/* DEL of parts [from, to) (and the value key itself when with_main). */
static int put_del(rd_conn *c, const rd_job *j, int with_main, uint32_t from, uint32_t to) {
  const int nargs = 1 + (with_main ? 1 : 0) + (int)(to - from);
  int rc = put_begin(c, j, nargs);
  if (!rc)
    rc = put_arg(c, "DEL", 3);
  if (!rc && with_main)
    rc = put_key(c, j, 0);
  for (uint32_t i = from; i < to && !rc; i++)
    rc = put_key(c, j, i);
  return rc;
}

static int append_put(rd_state *st, rd_conn *c, rd_job *j) {
  const kvt_tier_op *op = j->op;
  const uint8_t *data = op->buf;
  int rc = put_getrange_hdr(c, j);
  for (uint32_t i = 1; i < j->nparts && !rc; i++) {
    uint8_t ph[RD_PHDR];
    memcpy(ph, "KVTP", 4);
    kvt_st32(ph + 4, i);
    kvt_st64(ph + 8, j->gen);
    const uint64_t off = (uint64_t)i * j->psz, n = op->len - off < j->psz ? op->len - off : j->psz;
    rc = put_set(st, c, j, i, ph, RD_PHDR, data + off, (size_t)n);
  }
  uint8_t h[RD_HDR];
  hdr_make(h, j->gen, op->len, j->nparts, j->psz);
  return rc ? rc
            : put_set(st, c, j, 0, h, RD_HDR, data, (size_t)(op->len < j->psz ? op->len : j->psz));
}

static int append_phase1(rd_state *st, rd_conn *c, rd_job *j) {
  switch (j->op->opcode) {
  case KVT_TIER_PUT:
    return append_put(st, c, j);
  case KVT_TIER_GET: {
    int rc = put_begin(c, j, 2);
    if (!rc)
      rc = put_arg(c, "GET", 3);
    return rc ? rc : put_key(c, j, 0);
  }
  case KVT_TIER_QUERY:
    return put_getrange_hdr(c, j);
  default: {
    int rc = put_getrange_hdr(c, j);
    return rc ? rc : put_del(c, j, 1, 0, 0);
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
        rc = put_key(c, j, i);
    }
    return rc;
  }
  /* PUT or DEL: remove parts nobody owns any more (phase2 = first stale part,
   * or the whole value after a failed multi-part PUT). */
  uint64_t og = 0, ot = 0, op = 0;
  uint32_t on = 1;
  if (j->old_valid)
    hdr_parse(j->old, &og, &ot, &on, &op);
  const uint32_t to = on > j->nparts ? on : j->nparts;
  if (j->op->opcode == KVT_TIER_PUT && j->result != 0)
    return put_del(c, j, 1, 1, to);
  return put_del(c, j, 0, (uint32_t)j->phase2, to);
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
      snprintf(j->rhost, sizeof(j->rhost), "%.*s", (int)(colon - addr), addr);
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

/* A bulk reply of hn header bytes + data: the header lands in head, the
 * data in dst when accept() says so (else it is discarded). */
typedef int (*head_check)(rd_job *j, const uint8_t *head, uint64_t data_len);

static int read_bulk(rd_state *st, rd_conn *c, rd_job *j, size_t hn, uint8_t *head,
                     head_check check, uint8_t *dst, int64_t *blen) {
  char type, text[512];
  int64_t num = 0;
  *blen = -2;
  int rc = read_asking(st, c, j);
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
  if (left >= hn && !j->result && !j->redirect) {
    rc = rd_read_exact(c, head, hn);
    left -= hn;
    take = !rc && check(j, head, left);
  }
  if (!rc)
    rc = rd_read_exact(c, take ? dst : NULL, left);
  return rc ? rc : rd_read_exact(c, NULL, 2);
}

static int check_main(rd_job *j, const uint8_t *h, uint64_t data_len) {
  uint64_t gen, total, psz;
  uint32_t n;
  if (!hdr_parse(h, &gen, &total, &n, &psz) || data_len != (total < psz ? total : psz)) {
    j->result = KVT_ENOTFOUND; /* not ours, or torn */
    return 0;
  }
  j->gen = gen, j->total = total, j->nparts = n, j->psz = psz;
  j->op->out_len = total;
  if (total > j->op->len) {
    j->result = KVT_ENOBUFS;
    return 0;
  }
  j->phase2 = n > 1;
  return 1;
}

static int check_part(rd_job *j, const uint8_t *h, uint64_t data_len) {
  const uint32_t i = (uint32_t)j->phase2;
  const uint64_t off = (uint64_t)i * j->psz;
  const uint64_t want = j->total - off < j->psz ? j->total - off : j->psz;
  if (memcmp(h, "KVTP", 4) != 0 || kvt_ld32(h + 4) != i || kvt_ld64(h + 8) != j->gen ||
      data_len != want) {
    j->result = KVT_ENOTFOUND; /* another generation, or torn */
    return 0;
  }
  return 1;
}

static int read_get(rd_state *st, rd_conn *c, rd_job *j) {
  uint8_t h[RD_HDR];
  int64_t blen;
  const int rc = read_bulk(st, c, j, RD_HDR, h, check_main, j->op->buf, &blen);
  if (!rc && blen < 0 && !j->result && !j->redirect)
    j->result = KVT_ENOTFOUND;
  if (!rc && blen >= 0 && blen < (int64_t)RD_HDR && !j->result)
    j->result = KVT_ENOTFOUND;
  return rc;
}

/* GETRANGE of the header: the header, or old_valid = 0. */
static int read_hdr(rd_state *st, rd_conn *c, rd_job *j) {
  char type;
  int64_t num, blen = -1;
  int rc = read_asking(st, c, j);
  if (!rc)
    rc = read_small(st, c, j, &type, &num, j->old, sizeof(j->old), &blen);
  uint64_t g, t, p;
  uint32_t n;
  j->old_valid = !rc && type == '$' && blen == RD_HDR && hdr_parse(j->old, &g, &t, &n, &p);
  return rc;
}

static int read_status(rd_state *st, rd_conn *c, rd_job *j, int64_t *num) {
  char type;
  int64_t blen;
  int rc = read_asking(st, c, j);
  return rc ? rc : read_small(st, c, j, &type, num, NULL, 0, &blen);
}

static int read_phase1(rd_state *st, rd_conn *c, rd_job *j) {
  int64_t num = 0;
  int rc;
  switch (j->op->opcode) {
  case KVT_TIER_PUT:
    rc = read_hdr(st, c, j);
    if (j->result == KVT_ENOTFOUND)
      j->result = 0; /* another type under the name: SET replaces it */
    for (uint32_t i = 0; i < j->nparts && !rc; i++)
      rc = read_status(st, c, j, &num);
    if (!rc && j->result == 0 && j->old_valid) {
      uint64_t g, t, p;
      uint32_t n;
      hdr_parse(j->old, &g, &t, &n, &p);
      j->phase2 = n > j->nparts ? (int)j->nparts : 0;
    } else if (!rc && j->result != 0 && j->nparts > 1) {
      j->phase2 = 1; /* a failed multi-part PUT removes the value */
    }
    return rc;
  case KVT_TIER_GET:
    return read_get(st, c, j);
  case KVT_TIER_QUERY:
    rc = read_hdr(st, c, j);
    if (!rc && !j->result && !j->redirect) {
      uint64_t g, p;
      uint32_t n;
      if (j->old_valid && hdr_parse(j->old, &g, &j->op->out_len, &n, &p))
        j->result = 0;
      else
        j->result = KVT_ENOTFOUND;
    }
    return rc;
  default:
    rc = read_hdr(st, c, j);
    if (j->result == KVT_ENOTFOUND)
      j->result = 0; /* another type under the name: DEL removes it */
    if (!rc)
      rc = read_status(st, c, j, &num);
    if (!rc && !j->result && !j->redirect) {
      j->result = num > 0 ? 0 : KVT_ENOTFOUND;
      uint64_t g, t, p;
      uint32_t n = 1;
      if (j->old_valid)
        hdr_parse(j->old, &g, &t, &n, &p);
      j->nparts = 1;
      j->phase2 = j->result == 0 && n > 1 ? 1 : 0;
    }
    return rc;
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
    rc = read_bulk(st, c, j, RD_PHDR, h, check_part, (uint8_t *)j->op->buf + (uint64_t)i * j->psz,
                   &blen);
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

/* Phase 1 and 2 of the jobs in list (all on node) over one connection. On a
 * connection error, the jobs whose replies were not all read fail with it
 * (a PUT or DEL whose phase 2 only cleans up keeps its result). */
static void exec_node(rd_worker *w, int node, rd_job **list, int n) {
  rd_state *st = w->st;
  rd_conn *c = &w->conn[node];
  int rc = c->rc ? 0 : rd_conn_open(st, node, c, 0);
  int phase = 1, next = 0;
  while (!rc && phase <= 2) {
    int any = 0;
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
  int failed = 0;
  for (int k = next; k < n; k++)
    if (in_phase(list[k], phase) && (phase == 1 || list[k]->op->opcode == KVT_TIER_GET)) {
      list[k]->conn_err = rc;
      failed++;
    }
  if (c->rc)
    conn_lost(w, node, rc, failed);
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
  j->psz = st->part;
  j->nparts = parts_of(op->len, st->part);
  j->cost = cost_of(op->len, j->nparts);
  pthread_mutex_lock(&st->acct_mu); /* reserve: concurrent PUTs see each other */
  if (st->capacity && (uint64_t)(st->used < 0 ? 0 : st->used) + j->cost > st->capacity) {
    j->result = -ENOSPC;
    j->done = 1;
  } else {
    st->used += (int64_t)j->cost;
    st->items++;
    j->reserved = 1;
  }
  pthread_mutex_unlock(&st->acct_mu);
}

static void job_account(rd_state *st, rd_job *j) {
  uint64_t g, t, p;
  uint32_t n;
  const int old = j->old_valid && hdr_parse(j->old, &g, &t, &n, &p);
  pthread_mutex_lock(&st->acct_mu);
  if (j->op->opcode == KVT_TIER_PUT && j->reserved && j->op->result != 0) {
    st->used -= (int64_t)j->cost;
    st->items--;
  }
  if (old && j->op->result == 0 &&
      (j->op->opcode == KVT_TIER_PUT || j->op->opcode == KVT_TIER_DEL)) {
    st->used -= (int64_t)cost_of(t, n);
    st->items--;
  }
  pthread_mutex_unlock(&st->acct_mu);
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
    job_account(st, j);
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
  uint64_t rng = (uint64_t)(uintptr_t)w ^ rd_now_ms() * 0x2545F4914F6CDD1Dull;
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
