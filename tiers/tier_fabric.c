/* tiers/tier_fabric.c - the "fabric" tier: a client of kvtier-server over
 * libfabric (transport/), a tier like any other.
 *
 * Spec: fabric://HOST:PORT[?OPTION&OPTION...], options
 *   tenant=NAME       the tenant namespace (default "default")
 *   token=TOKEN       its shared secret (default: $KVTIER_FABRIC_TOKEN, else
 *                     empty); shown as token=*** by kvt_tier_spec() and in
 *                     messages, but kept in the caller's spec string and
 *                     in whatever else holds it, so prefer the environment
 *   timeout_ms=N      bound on every wait for the server (default 5000)
 *   provider=NAME     libfabric provider (default tcp;ofi_rxm; '+' may stand
 *                     for ';', e.g. verbs+ofi_rxm; auto: the first of efa,
 *                     verbs;ofi_rxm, tcp;ofi_rxm that opens, as the server's)
 *   depth=N           requests in flight at once (default and most 64: what
 *                     kvtier-server runs per session; it answers more -EBUSY)
 *   purge=1           delete every key of the tenant at open (tests)
 * HOST is a name, an IPv4 address or a bracketed IPv6 address.
 *
 * How it works. Submitters queue operations; one worker thread owns the
 * libfabric endpoint. It sends each operation as a control message naming
 * the op's own buffer, registered for the server's RMA (remote read for a
 * PUT, remote write for a GET), so payload bytes are never copied here; the
 * server replies once it has read or written them, and the worker then
 * deregisters the buffer and completes the op. Replies are matched by
 * request id; a stale reply (for an op already failed) is ignored.
 *
 * Failures. Every wait is bounded by timeout_ms (an op queued behind a
 * reconnect waits for its HELLO first, up to 2 x timeout_ms, so an op returns
 * within about 3 x timeout_ms while the server is away). An op that times out fails
 * with -ETIMEDOUT; the connection is then presumed dead: every other op in
 * flight fails with -ECONNRESET, the endpoint is closed (which revokes the
 * registrations, so a late write from the server cannot land in a buffer the
 * caller got back) and the next op opens a new one and says HELLO again.
 * While the server cannot be reached, queued ops fail with the connect
 * error (-ETIMEDOUT, -ECONNREFUSED) at most once per 250 ms retry window,
 * without waiting. A server that refuses the token gives KVT_EAUTH at open.
 * A message that names no request in flight (request ids are random: see
 * next_rand) is ignored, whoever sent it; a reply to one that contradicts
 * it (another opcode, a GET longer than its buffer) is KVT_EPROTO and drops
 * the connection.
 *
 * Stats and list are round trips to the server (STATS, paged LIST): items is
 * the tenant's own count; capacity and used are the server's, shared by its
 * tenants. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "kvt_proto.h"
#include "kvt_transport.h"
#include "tier_internal.h"

#define DEF_TIMEOUT_MS 5000
#define DEF_DEPTH 64
#define MAX_DEPTH 64 /* kvtier-server runs 64 requests of a session at once, refuses more */
#define RETRY_NS 250000000LL
#define EXTRA_RECVS 8

typedef struct ctl ctl;

/* A control request from an API thread (stats, list, purge's deletes),
 * answered through its own condition; never counted as a tier op. */
struct ctl {
  ctl *next;
  kvt_proto_msg req;
  kvt_proto_list_entry *entries; /* LIST: room for KVT_PROTO_LIST_MAX */
  kvt_proto_msg reply;           /* decoded reply (list entries copied out) */
  int done, rc;
};

typedef struct slot {
  kvt_fab_ctx sctx;  /* the request's send */
  uint8_t *msg;      /* its encoded request (in the conn's registered pool) */
  kvt_tier_op *op;   /* a tier op, or NULL */
  ctl *c;            /* or a control request */
  kvt_fab_mr mr;     /* op->buf, registered for the server's RMA */
  uint64_t req_id;
  int64_t deadline;
  int busy, sent, replied;
} slot;

/* One endpoint and its handshake; replaced as a whole after a failure. */
typedef struct conn {
  kvt_fab *fab;
  uint64_t server;   /* fi_addr */
  uint64_t session;
  uint64_t max_request, max_inflight;
  uint8_t *pool;     /* depth send buffers + recv buffers, KVT_PROTO_MSG_MAX each */
  kvt_fab_mr pool_mr;
  kvt_fab_ctx *rctx; /* one per recv buffer */
  uint32_t n_recv;
} conn;

typedef struct fab_tier {
  kvt_ctx *ctx;
  kvt_tier *tier;
  char host[256], port[16], tenant[KVT_PROTO_TENANT_MAX + 1], token[KVT_PROTO_TOKEN_MAX + 1];
  char provider[64];
  int timeout_ms;
  uint32_t depth;
  pthread_t thread;
  int efd; /* wakes the worker */
  pthread_mutex_t mu;
  pthread_cond_t cv; /* ctl completions */
  /* Guarded by mu. */
  kvt_tier_op *q_head, *q_tail; /* queued ops, linked through internal[0] */
  ctl *c_head, *c_tail;
  int closing;
  /* The worker's own. */
  conn *cn;
  slot *slots;
  uint32_t n_busy;
  uint64_t rng; /* request ids: see next_rand */
  int last_err;
  int64_t retry_at;
  int started;  /* the first connect has been tried */
} fab_tier;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void wake(fab_tier *s) {
  const uint64_t one = 1;
  ssize_t w = write(s->efd, &one, sizeof(one));
  (void)w;
}

/* Request ids are nonces: 48 unpredictable bits above the slot index. Any
 * peer that can reach our endpoint can send it a message, so a reply is only
 * believed when it names a request id it could not have guessed (a forged
 * GET reply would otherwise hand the caller whatever its buffer held). */
static uint64_t next_rand(fab_tier *s) {
  uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull); /* splitmix64, seeded by getrandom */
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void seed_rng(fab_tier *s) {
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
    seed = (uint64_t)now_ns() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)s;
  s->rng ^= seed;
}

/* ---- connection ---- */

static void conn_free(fab_tier *s, conn *c) {
  if (!c)
    return;
  kvt_fab_mr_dereg(&c->pool_mr);
  kvt_fab_close(c->fab); /* cancels posted receives */
  kvt_dealloc(s->ctx, c->pool);
  kvt_dealloc(s->ctx, c->rctx);
  kvt_dealloc(s->ctx, c);
}

static uint8_t *recv_buf(fab_tier *s, conn *c, uint32_t i) {
  return c->pool + (size_t)(s->depth + i) * KVT_PROTO_MSG_MAX;
}

/* Sends HELLO and waits (bounded) for its reply on the fresh endpoint. */
static int conn_hello(fab_tier *s, conn *c) {
  uint8_t addr[KVT_PROTO_ADDR_MAX];
  size_t alen = sizeof(addr);
  int rc = kvt_fab_getname(c->fab, addr, &alen);
  if (rc)
    return rc;
  kvt_proto_msg m;
  seed_rng(s);
  const uint64_t hello_id = next_rand(s) | 1;
  kvt_proto_init(&m, KVT_PROTO_HELLO, hello_id, 0);
  m.u.hello.addr = addr;
  m.u.hello.addr_len = (uint16_t)alen;
  memcpy(m.u.hello.tenant, s->tenant, sizeof(s->tenant));
  memcpy(m.u.hello.token, s->token, sizeof(s->token));
  size_t len = 0;
  if ((rc = kvt_proto_encode(&m, c->pool, KVT_PROTO_MSG_MAX, &len)) != 0)
    return rc;
  kvt_fab_ctx sctx = {0};
  const int64_t deadline = now_ns() + (int64_t)s->timeout_ms * 1000000LL;
  /* The first send to a peer sets up the provider's connection (tcp;ofi_rxm
   * answers -EAGAIN meanwhile, each try driving progress for up to a second):
   * keep trying until timeout_ms. A peer that never accepts is refusing. */
  do
    rc = kvt_fab_send(c->fab, c->server, c->pool, len, c->pool_mr.desc, &sctx);
  while (rc == -EAGAIN && now_ns() < deadline);
  if (rc)
    return rc == -EAGAIN ? -ECONNREFUSED : rc;
  int sent = 0;
  while (now_ns() < deadline) {
    kvt_fab_comp cq[8];
    const int n = kvt_fab_poll(c->fab, cq, 8);
    if (n < 0)
      return n;
    for (int i = 0; i < n; i++) {
      if (cq[i].err)
        return cq[i].err;
      if (cq[i].ctx == &sctx) {
        sent = 1;
        continue;
      }
      const uint32_t ri = (uint32_t)(cq[i].ctx - c->rctx);
      kvt_proto_msg r;
      rc = kvt_proto_decode(recv_buf(s, c, ri), cq[i].len, &r);
      if (rc != 0 || r.h.req_id != hello_id) { /* not the answer to our HELLO: ignored */
        if ((rc = kvt_fab_recv(c->fab, recv_buf(s, c, ri), KVT_PROTO_MSG_MAX, c->pool_mr.desc,
                               &c->rctx[ri])) != 0)
          return rc;
        continue;
      }
      if (rc == 0 && r.h.opcode != (KVT_PROTO_HELLO | KVT_PROTO_REPLY))
        rc = KVT_EPROTO;
      if (rc == 0 && r.h.status == 0) {
        c->session = r.h.session;
        c->max_request = r.u.hello_reply.max_request;
        c->max_inflight = r.u.hello_reply.max_inflight;
      }
      rc = rc ? rc : r.h.status;
      if (rc == 0)
        rc = kvt_fab_recv(c->fab, recv_buf(s, c, ri), KVT_PROTO_MSG_MAX, c->pool_mr.desc,
                          &c->rctx[ri]);
      if (rc)
        return rc;
      /* The send's completion may still be owed: wait for it, so the
       * stack-held context is not referenced after return. */
      while (!sent && now_ns() < deadline) {
        const int k = kvt_fab_poll(c->fab, cq, 1);
        if (k < 0)
          return k;
        if (k == 1 && cq[0].ctx == &sctx)
          sent = 1;
        else if (k == 0)
          kvt_fab_wait(c->fab, -1, 1);
      }
      return sent ? 0 : -ETIMEDOUT;
    }
    if (n == 0)
      kvt_fab_wait(c->fab, -1, 10);
  }
  return -ETIMEDOUT;
}

static int conn_open(fab_tier *s, conn **out) {
  conn *c = kvt_alloc(s->ctx, sizeof(*c), 64);
  if (!c)
    return -ENOMEM;
  memset(c, 0, sizeof(*c));
  c->n_recv = s->depth + EXTRA_RECVS;
  const size_t pool = (size_t)(s->depth + c->n_recv) * KVT_PROTO_MSG_MAX;
  c->pool = kvt_alloc(s->ctx, pool, 4096);
  c->rctx = kvt_alloc(s->ctx, c->n_recv * sizeof(*c->rctx), 64);
  char err[600] = ""; /* kvt_fab_open's detail, when no endpoint opened */
  kvt_fab_config fc = {.provider = s->provider, .peer_node = s->host, .peer_service = s->port};
  int rc = !c->pool || !c->rctx ? -ENOMEM : kvt_fab_open(&fc, &c->fab, err, sizeof(err));
  if (rc == 0)
    rc = kvt_fab_mr_reg(c->fab, c->pool, pool, KVT_FAB_LOCAL, &c->pool_mr);
  if (rc == 0)
    rc = kvt_fab_av_insert_host(c->fab, s->host, s->port, &c->server);
  for (uint32_t i = 0; rc == 0 && i < c->n_recv; i++) {
    memset(&c->rctx[i], 0, sizeof(c->rctx[i]));
    rc = kvt_fab_recv(c->fab, recv_buf(s, c, i), KVT_PROTO_MSG_MAX, c->pool_mr.desc, &c->rctx[i]);
  }
  if (rc == 0)
    rc = conn_hello(s, c);
  if (rc) {
    if (!s->started)
      kvt_fail(s->ctx, rc, "fabric tier: %s:%s (tenant '%s', provider %s): %s%s%s", s->host,
               s->port, s->tenant, s->provider, kvt_strerror(rc),
               (c->fab ? kvt_fab_error(c->fab) : err)[0] ? ": " : "",
               c->fab ? kvt_fab_error(c->fab) : err);
    conn_free(s, c);
    return rc;
  }
  *out = c;
  return 0;
}

/* ---- completing ---- */

static void slot_finish(fab_tier *s, slot *sl, int rc, uint64_t out_len) {
  kvt_fab_mr_dereg(&sl->mr); /* before the caller gets its buffer back */
  if (sl->op) {
    kvt_tier_op *op = sl->op;
    sl->op = NULL;
    op->result = rc;
    op->out_len = out_len;
    kvt_tier_complete(s->tier, op);
  } else if (sl->c) {
    pthread_mutex_lock(&s->mu);
    sl->c->rc = rc;
    sl->c->done = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    sl->c = NULL;
  }
  sl->replied = 1;
}

static void slot_release_if_done(fab_tier *s, slot *sl) {
  if (sl->busy && sl->replied && sl->sent) {
    sl->busy = 0;
    s->n_busy--;
  }
}

/* The connection is gone: every op in flight fails (the one that found out
 * with rc, the others with -ECONNRESET), the endpoint closes. */
static void conn_fail(fab_tier *s, slot *first, int rc) {
  for (uint32_t i = 0; i < s->depth; i++) {
    slot *sl = &s->slots[i];
    if (!sl->busy)
      continue;
    if (!sl->replied)
      slot_finish(s, sl, sl == first ? rc : -ECONNRESET, 0);
    sl->busy = 0;
  }
  s->n_busy = 0;
  conn_free(s, s->cn);
  s->cn = NULL;
  s->last_err = rc;
  s->retry_at = 0; /* the next op tries again at once */
}

static void fail_queued(fab_tier *s, int rc) {
  pthread_mutex_lock(&s->mu);
  kvt_tier_op *op = s->q_head;
  ctl *c = s->c_head;
  s->q_head = s->q_tail = NULL;
  s->c_head = s->c_tail = NULL;
  for (ctl *x = c; x; x = x->next) {
    x->rc = rc;
    x->done = 1;
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  while (op) {
    kvt_tier_op *next = op->internal[0];
    op->internal[0] = NULL;
    op->result = rc;
    op->out_len = 0;
    kvt_tier_complete(s->tier, op);
    op = next;
  }
}

/* ---- sending ---- */

static void build_op(const fab_tier *s, slot *sl, kvt_proto_msg *m) {
  kvt_tier_op *op = sl->op;
  static const uint16_t code[] = {0, KVT_PROTO_PUT, KVT_PROTO_GET, KVT_PROTO_DEL,
                                  KVT_PROTO_EXISTS};
  kvt_proto_init(m, code[op->opcode], sl->req_id, s->cn->session);
  if (op->opcode == KVT_TIER_PUT || op->opcode == KVT_TIER_GET) {
    m->u.data.key = op->key;
    m->u.data.len = op->len;
    m->u.data.rma_addr = sl->mr.fid ? kvt_fab_mr_addr(&sl->mr, op->buf, 0) : 0;
    m->u.data.rma_key = sl->mr.key;
  } else {
    m->u.key.key = op->key;
  }
}

/* Sends what sl holds; on failure finishes it with the error. */
static void slot_send(fab_tier *s, slot *sl) {
  conn *c = s->cn;
  kvt_tier_op *op = sl->op;
  int rc = 0;
  if (op && op->len && (op->opcode == KVT_TIER_PUT || op->opcode == KVT_TIER_GET))
    rc = kvt_fab_mr_reg(c->fab, op->buf, (size_t)op->len,
                        op->opcode == KVT_TIER_PUT ? KVT_FAB_REMOTE_READ : KVT_FAB_REMOTE_WRITE,
                        &sl->mr);
  kvt_proto_msg m;
  if (op)
    build_op(s, sl, &m);
  else {
    m = sl->c->req;
    m.h.req_id = sl->req_id;
    m.h.session = c->session;
  }
  size_t len = 0;
  if (rc == 0)
    rc = kvt_proto_encode(&m, sl->msg, KVT_PROTO_MSG_MAX, &len);
  sl->deadline = now_ns() + (int64_t)s->timeout_ms * 1000000LL;
  sl->sctx.owner = sl;
  if (rc == 0)
    rc = kvt_fab_send(c->fab, c->server, sl->msg, len, c->pool_mr.desc, &sl->sctx);
  if (rc == -EAGAIN) {
    /* The provider could not take the message for a second: with tcp;ofi_rxm
     * that is a peer that refuses connections (the server is down). */
    conn_fail(s, sl, -ECONNREFUSED);
  } else if (rc) {
    sl->sent = 1;
    slot_finish(s, sl, rc, 0);
    slot_release_if_done(s, sl);
  }
}

/* Moves queued work into free slots while there are both. */
static void dispatch(fab_tier *s) {
  for (uint32_t i = 0; i < s->depth && s->cn; i++) {
    slot *sl = &s->slots[i];
    if (sl->busy)
      continue;
    pthread_mutex_lock(&s->mu);
    ctl *c = s->c_head;
    kvt_tier_op *op = NULL;
    if (c) {
      s->c_head = c->next;
      if (!s->c_head)
        s->c_tail = NULL;
    } else if ((op = s->q_head) != NULL) {
      s->q_head = op->internal[0];
      if (!s->q_head)
        s->q_tail = NULL;
      op->internal[0] = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (!c && !op)
      return;
    memset(&sl->mr, 0, sizeof(sl->mr));
    sl->op = op;
    sl->c = c;
    sl->busy = 1;
    sl->sent = sl->replied = 0;
    sl->req_id = (next_rand(s) << 16) | i;
    sl->msg = s->cn->pool + (size_t)i * KVT_PROTO_MSG_MAX;
    s->n_busy++;
    slot_send(s, sl);
  }
}

/* ---- receiving ---- */

/* Applies a decoded reply to its slot. Returns 0, or an error that drops the
 * connection. */
static int on_reply(fab_tier *s, const kvt_proto_msg *r) {
  const uint32_t idx = (uint32_t)(r->h.req_id & 0xffff);
  if (idx >= s->depth)
    return 0;
  slot *sl = &s->slots[idx];
  if (!sl->busy || sl->replied || sl->req_id != r->h.req_id)
    return 0; /* stale: its op already failed */
  if (r->h.status == -ENOTCONN) { /* the server forgot our session (restarted) */
    slot_finish(s, sl, -ECONNRESET, 0);
    return -ECONNRESET;
  }
  if (sl->c) {
    ctl *c = sl->c;
    c->reply = *r;
    if (r->h.opcode == (KVT_PROTO_LIST | KVT_PROTO_REPLY) && r->h.status == 0) {
      for (uint32_t i = 0; i < r->u.list_reply.n; i++)
        kvt_proto_list_entry_at(r, i, &c->entries[i]);
      c->reply.u.list_reply.raw = NULL; /* the receive buffer is reposted */
    }
    slot_finish(s, sl, r->h.status, 0);
    return 0;
  }
  const kvt_tier_op *op = sl->op;
  uint64_t out_len = 0;
  if (op->opcode == KVT_TIER_GET || op->opcode == KVT_TIER_QUERY)
    out_len = r->u.len.len;
  if (op->opcode == KVT_TIER_GET && r->h.status == 0 && out_len > op->len) {
    slot_finish(s, sl, KVT_EPROTO, 0);
    return KVT_EPROTO;
  }
  slot_finish(s, sl, r->h.status, out_len);
  return 0;
}

static int opcode_matches(uint16_t reply_op, const slot *sl) {
  return sl->busy && sl->msg && kvt_ld16(sl->msg + 6) == (reply_op & ~KVT_PROTO_REPLY);
}

static void on_completion(fab_tier *s, const kvt_fab_comp *cp) {
  conn *c = s->cn;
  if (cp->ctx >= c->rctx && cp->ctx < c->rctx + c->n_recv) {
    const uint32_t ri = (uint32_t)(cp->ctx - c->rctx);
    if (cp->err) {
      conn_fail(s, NULL, cp->err);
      return;
    }
    const uint8_t *raw = recv_buf(s, c, ri);
    kvt_proto_msg r;
    const int ok = kvt_proto_decode(raw, cp->len, &r) == 0 && (r.h.opcode & KVT_PROTO_REPLY);
    const uint32_t idx = (uint32_t)(r.h.req_id & 0xffff);
    /* Anyone can send to this endpoint: a message that names no request of
     * ours in flight (the id is a nonce) is ignored. One that does is the
     * server's, and must make sense. */
    slot *sl = ok && idx < s->depth && s->slots[idx].busy && s->slots[idx].req_id == r.h.req_id
                   ? &s->slots[idx]
                   : NULL;
    int rc = sl && !opcode_matches(r.h.opcode, sl) ? KVT_EPROTO : 0;
    if (rc == 0 && sl)
      rc = on_reply(s, &r);
    if (rc == 0 && s->cn)
      rc = kvt_fab_recv(c->fab, recv_buf(s, c, ri), KVT_PROTO_MSG_MAX, c->pool_mr.desc,
                        &c->rctx[ri]);
    if (rc) {
      conn_fail(s, sl, rc);
      return;
    }
    if (sl)
      slot_release_if_done(s, sl);
    return;
  }
  slot *sl = cp->ctx->owner;
  if (cp->err) {
    conn_fail(s, sl, cp->err);
    return;
  }
  sl->sent = 1;
  slot_release_if_done(s, sl);
}

/* ---- the worker ---- */

static void check_deadlines(fab_tier *s) {
  const int64_t now = now_ns();
  for (uint32_t i = 0; i < s->depth && s->cn; i++) {
    slot *sl = &s->slots[i];
    if (sl->busy && now > sl->deadline) {
      conn_fail(s, sl, -ETIMEDOUT);
      return;
    }
  }
}

static int has_work(fab_tier *s) {
  pthread_mutex_lock(&s->mu);
  const int w = s->q_head || s->c_head;
  pthread_mutex_unlock(&s->mu);
  return w;
}

/* Opens a connection when work waits and none is up; while the server
 * cannot be reached, queued work fails with the reason at once. */
static void ensure_conn(fab_tier *s) {
  if (s->cn || !has_work(s))
    return;
  if (now_ns() < s->retry_at) {
    fail_queued(s, s->last_err);
    return;
  }
  const int rc = conn_open(s, &s->cn);
  if (rc) {
    s->last_err = rc;
    s->retry_at = now_ns() + RETRY_NS;
    fail_queued(s, rc);
  }
}

static int closing(fab_tier *s) {
  pthread_mutex_lock(&s->mu);
  const int c = s->closing;
  pthread_mutex_unlock(&s->mu);
  return c;
}

static void say_bye(fab_tier *s) {
  if (!s->cn || s->n_busy)
    return;
  kvt_proto_msg m;
  kvt_proto_init(&m, KVT_PROTO_BYE, 0, s->cn->session);
  size_t len = 0;
  kvt_fab_ctx ctx = {0};
  if (kvt_proto_encode(&m, s->cn->pool, KVT_PROTO_MSG_MAX, &len) != 0 ||
      kvt_fab_send(s->cn->fab, s->cn->server, s->cn->pool, len, s->cn->pool_mr.desc, &ctx) != 0)
    return;
  const int64_t deadline = now_ns() + 200000000LL; /* best effort */
  while (now_ns() < deadline) {
    kvt_fab_comp c[4];
    const int n = kvt_fab_poll(s->cn->fab, c, 4);
    for (int i = 0; i < n; i++)
      if (c[i].ctx == &ctx)
        return;
    if (n < 0)
      return;
    kvt_fab_wait(s->cn->fab, -1, 5);
  }
}

static void *worker_main(void *arg) {
  fab_tier *s = arg;
  for (;;) {
    ensure_conn(s);
    if (s->cn)
      dispatch(s);
    int n = 0;
    if (s->cn) {
      kvt_fab_comp cq[32];
      n = kvt_fab_poll(s->cn->fab, cq, 32);
      if (n < 0)
        conn_fail(s, NULL, n);
      for (int i = 0; i < n && s->cn; i++)
        on_completion(s, &cq[i]);
      if (s->cn)
        check_deadlines(s);
    }
    if (closing(s) && s->n_busy == 0 && !has_work(s))
      break;
    if (n > 0)
      continue;
    if (s->cn && s->n_busy)
      kvt_fab_wait(s->cn->fab, s->efd, 50);
    else if (!has_work(s)) {
      struct pollfd p = {.fd = s->efd, .events = POLLIN};
      poll(&p, 1, 100);
    }
    uint64_t v;
    ssize_t r = read(s->efd, &v, sizeof(v)); /* non-blocking: drains the wakeups */
    (void)r;
  }
  say_bye(s);
  conn_free(s, s->cn);
  s->cn = NULL;
  return NULL;
}

/* ---- backend table ---- */

static int fab_submit(void *state, kvt_tier_op *op) {
  fab_tier *s = state;
  pthread_mutex_lock(&s->mu);
  op->internal[0] = NULL;
  if (s->q_tail)
    s->q_tail->internal[0] = op;
  else
    s->q_head = op;
  s->q_tail = op;
  pthread_mutex_unlock(&s->mu);
  wake(s);
  return 0;
}

/* Runs one control request through the worker and waits for its reply (the
 * worker bounds the wait by timeout_ms). */
static int ctl_run(fab_tier *s, ctl *c) {
  c->next = NULL;
  c->done = 0;
  pthread_mutex_lock(&s->mu);
  if (s->c_tail)
    s->c_tail->next = c;
  else
    s->c_head = c;
  s->c_tail = c;
  pthread_mutex_unlock(&s->mu);
  wake(s);
  pthread_mutex_lock(&s->mu);
  while (!c->done)
    pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return c->rc;
}

static int fab_stats(void *state, kvt_tier_stats *out) {
  fab_tier *s = state;
  ctl c;
  memset(&c, 0, sizeof(c));
  kvt_proto_init(&c.req, KVT_PROTO_STATS, 0, 0);
  const int rc = ctl_run(s, &c);
  if (rc)
    return rc;
  const uint64_t *v = c.reply.u.stats.v;
  out->capacity = v[KVT_STAT_CAPACITY];
  out->used = v[KVT_STAT_USED];
  out->items = v[KVT_STAT_TENANT_ITEMS];
  return 0;
}

/* Pages through the tenant's keys; fn runs with no lock held, so it may call
 * back into the tier. A key stored or deleted during the walk may or may not
 * be shown; every key held throughout is shown exactly once. */
static int fab_list(void *state, kvt_tier_list_fn fn, void *opaque) {
  fab_tier *s = state;
  kvt_proto_list_entry *e = kvt_alloc(s->ctx, KVT_PROTO_LIST_MAX * sizeof(*e), 64);
  if (!e)
    return -ENOMEM;
  uint64_t cursor = 0;
  int rc = 0;
  do {
    ctl c;
    memset(&c, 0, sizeof(c));
    kvt_proto_init(&c.req, KVT_PROTO_LIST, 0, 0);
    c.req.u.list.cursor = cursor;
    c.req.u.list.max = KVT_PROTO_LIST_MAX;
    c.entries = e;
    if ((rc = ctl_run(s, &c)) != 0)
      break;
    for (uint32_t i = 0; i < c.reply.u.list_reply.n && rc == 0; i++)
      rc = fn(opaque, &e[i].key, e[i].len);
    cursor = c.reply.u.list_reply.next;
  } while (rc == 0 && cursor != 0);
  kvt_dealloc(s->ctx, e);
  return rc;
}

typedef struct purge_list {
  kvt_key *keys;
  size_t n, cap;
  kvt_ctx *ctx;
} purge_list;

static int purge_collect(void *opaque, const kvt_key *key, uint64_t len) {
  purge_list *p = opaque;
  (void)len;
  if (p->n == p->cap) {
    const size_t cap = p->cap ? p->cap * 2 : 256;
    kvt_key *k = kvt_alloc(p->ctx, cap * sizeof(*k), 64);
    if (!k)
      return -ENOMEM;
    if (p->n)
      memcpy(k, p->keys, p->n * sizeof(*k));
    kvt_dealloc(p->ctx, p->keys);
    p->keys = k;
    p->cap = cap;
  }
  p->keys[p->n++] = *key;
  return 0;
}

/* purge=1: deletes every key of the tenant (through control requests, so a
 * fresh tier's counters stay at zero). */
static int purge_tenant(fab_tier *s) {
  purge_list p = {NULL, 0, 0, s->ctx};
  int rc = fab_list(s, purge_collect, &p);
  for (size_t i = 0; rc == 0 && i < p.n; i++) {
    ctl c;
    memset(&c, 0, sizeof(c));
    kvt_proto_init(&c.req, KVT_PROTO_DEL, 0, 0);
    c.req.u.key.key = p.keys[i];
    rc = ctl_run(s, &c);
    if (rc == KVT_ENOTFOUND)
      rc = 0;
  }
  kvt_dealloc(s->ctx, p.keys);
  return rc;
}

/* ---- spec ---- */

static int parse_host_port(fab_tier *s, const char *a, size_t n) {
  const char *colon;
  const char *host = a;
  size_t hl;
  if (n && a[0] == '[') {
    const char *rb = memchr(a, ']', n);
    if (!rb || rb + 1 >= a + n || rb[1] != ':')
      return -EINVAL;
    host = a + 1;
    hl = (size_t)(rb - host);
    colon = rb + 1;
  } else {
    colon = NULL;
    for (size_t i = 0; i < n; i++)
      if (a[i] == ':')
        colon = a + i;
    if (!colon)
      return -EINVAL;
    hl = (size_t)(colon - a);
  }
  const size_t pl = (size_t)(a + n - colon - 1);
  if (hl == 0 || hl >= sizeof(s->host) || pl == 0 || pl >= sizeof(s->port))
    return -EINVAL;
  memcpy(s->host, host, hl);
  s->host[hl] = 0;
  memcpy(s->port, colon + 1, pl);
  s->port[pl] = 0;
  char *end;
  const long port = strtol(s->port, &end, 10);
  return *end || port <= 0 || port > 65535 ? -EINVAL : 0;
}

static int parse_int_opt(const char *v, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  const long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return -EINVAL;
  *out = x;
  return 0;
}

/* One NAME=VALUE option into s (purge into *purge). */
static int parse_opt(kvt_ctx *ctx, fab_tier *s, char *opt, int *purge) {
  char *eq = strchr(opt, '=');
  if (!eq)
    return kvt_fail(ctx, KVT_ESPEC, "fabric tier: option '%s': expected NAME=VALUE", opt);
  *eq = 0;
  const char *v = eq + 1;
  long x = 0;
  if (!strcmp(opt, "tenant")) {
    if (!kvt_proto_tenant_valid(v))
      return kvt_fail(ctx, KVT_ESPEC, "fabric tier: tenant '%s': 1-64 of [A-Za-z0-9._-]", v);
    snprintf(s->tenant, sizeof(s->tenant), "%s", v);
  } else if (!strcmp(opt, "token")) {
    if (strlen(v) > KVT_PROTO_TOKEN_MAX)
      return kvt_fail(ctx, KVT_ESPEC, "fabric tier: token longer than %u bytes",
                      KVT_PROTO_TOKEN_MAX);
    snprintf(s->token, sizeof(s->token), "%s", v);
  } else if (!strcmp(opt, "timeout_ms")) {
    if (parse_int_opt(v, 10, 3600000, &x))
      return kvt_fail(ctx, KVT_ESPEC, "fabric tier: timeout_ms '%s': 10 to 3600000", v);
    s->timeout_ms = (int)x;
  } else if (!strcmp(opt, "depth")) {
    if (parse_int_opt(v, 1, MAX_DEPTH, &x))
      return kvt_fail(ctx, KVT_ESPEC, "fabric tier: depth '%s': 1 to %d", v, MAX_DEPTH);
    s->depth = (uint32_t)x;
  } else if (!strcmp(opt, "provider")) {
    if (!*v || strlen(v) >= sizeof(s->provider))
      return kvt_fail(ctx, KVT_ESPEC, "fabric tier: provider '%s'", v);
    snprintf(s->provider, sizeof(s->provider), "%s", v);
    for (char *p = s->provider; *p; p++)
      if (*p == '+')
        *p = ';';
  } else if (!strcmp(opt, "purge")) {
    if (parse_int_opt(v, 0, 1, &x))
      return kvt_fail(ctx, KVT_ESPEC, "fabric tier: purge '%s': 0 or 1", v);
    *purge = (int)x;
  } else {
    return kvt_fail(ctx, KVT_ESPEC,
                    "fabric tier: unknown option '%s' (tenant, token, timeout_ms, provider, "
                    "depth, purge)",
                    opt);
  }
  return 0;
}

static int parse_spec(kvt_ctx *ctx, const char *args, fab_tier *s, int *purge) {
  if (!args || strncmp(args, "//", 2) != 0) {
    char shown[256];
    kvt_spec_redact(shown, sizeof(shown), args ? args : "");
    return kvt_fail(ctx, KVT_ESPEC, "fabric tier: '%s': expected fabric://HOST:PORT[?options]",
                    shown);
  }
  const char *a = args + 2, *q = strchr(a, '?');
  const size_t hn = q ? (size_t)(q - a) : strlen(a);
  if (parse_host_port(s, a, hn))
    return kvt_fail(ctx, KVT_ESPEC, "fabric tier: '%.*s': expected HOST:PORT (port 1-65535)",
                    (int)hn, a);
  if (!q)
    return 0;
  char opts[1024];
  if (strlen(q + 1) >= sizeof(opts))
    return kvt_fail(ctx, KVT_ESPEC, "fabric tier: options too long");
  strcpy(opts, q + 1);
  char *save = NULL;
  for (char *o = strtok_r(opts, "&", &save); o; o = strtok_r(NULL, "&", &save)) {
    const int rc = parse_opt(ctx, s, o, purge);
    if (rc)
      return rc;
  }
  return 0;
}

static void fab_free(fab_tier *s) {
  if (s->efd >= 0)
    close(s->efd);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  kvt_dealloc(s->ctx, s->slots);
  kvt_dealloc(s->ctx, s);
}

static void fab_close(void *state) {
  fab_tier *s = state;
  pthread_mutex_lock(&s->mu);
  s->closing = 1;
  pthread_mutex_unlock(&s->mu);
  wake(s);
  pthread_join(s->thread, NULL);
  fab_free(s);
}

static int fab_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state) {
  fab_tier *s = kvt_alloc(ctx, sizeof(*s), 64);
  if (!s)
    return kvt_fail(ctx, -ENOMEM, "fabric tier: allocating its state");
  memset(s, 0, sizeof(*s));
  s->ctx = ctx;
  s->tier = tier;
  s->efd = -1;
  s->timeout_ms = DEF_TIMEOUT_MS;
  s->depth = DEF_DEPTH;
  strcpy(s->tenant, "default");
  strcpy(s->provider, KVT_FAB_DEFAULT_PROVIDER);
  const char *env = getenv("KVTIER_FABRIC_TOKEN");
  if (env && strlen(env) <= KVT_PROTO_TOKEN_MAX)
    strcpy(s->token, env);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  int purge = 0;
  int rc = parse_spec(ctx, args, s, &purge);
  if (rc) {
    fab_free(s);
    return rc;
  }
  s->slots = kvt_alloc(ctx, s->depth * sizeof(*s->slots), 64);
  s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (!s->slots || s->efd < 0) {
    fab_free(s);
    return kvt_fail(ctx, -ENOMEM, "fabric tier: allocating its slots or eventfd");
  }
  memset(s->slots, 0, s->depth * sizeof(*s->slots));
  /* Connect now, on this thread, so a wrong token or an unreachable server
   * fails the open with the reason in the context. */
  rc = conn_open(s, &s->cn);
  s->started = 1;
  if (rc == 0)
    kvt_logf(ctx, KVT_LOG_INFO, "fabric tier: %s:%s tenant '%s' over %s (session %016llx)",
             s->host, s->port, s->tenant, kvt_fab_provider(s->cn->fab),
             (unsigned long long)s->cn->session);
  if (rc == 0 && pthread_create(&s->thread, NULL, worker_main, s) != 0) {
    conn_free(s, s->cn);
    rc = kvt_fail(ctx, -EAGAIN, "fabric tier: starting its worker thread");
  }
  if (rc) {
    fab_free(s);
    return rc;
  }
  if (purge && (rc = purge_tenant(s)) != 0) {
    fab_close(s);
    return kvt_fail(ctx, rc, "fabric tier: purging tenant '%s': %s", s->tenant,
                    kvt_strerror(rc));
  }
  *state = s;
  return 0;
}

const kvt_tier_backend kvt_tier_backend_fabric = {
    .abi_version = KVT_TIER_ABI_VERSION,
    .struct_size = sizeof(kvt_tier_backend),
    .scheme = "fabric",
    .open = fab_open,
    .close = fab_close,
    .submit = fab_submit,
    .stats = fab_stats,
    .list = fab_list,
    .traits = KVT_TIER_PERSISTENT | KVT_TIER_SHARED | KVT_TIER_REMOTE,
};
