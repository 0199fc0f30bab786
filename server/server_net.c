/* server/server_net.c - kvtier-server's network side: one libfabric RDM
 * endpoint driven by one thread, sessions (tenant bindings), requests and a
 * pool of workers for the store's I/O (their side: server_work.c; what the
 * two share: server_net.h).
 *
 * A request lives in one of NREQ slots, each owning a receive buffer: the
 * number of requests being served at once is bounded by construction, and a
 * slot's buffer is posted again only when its request is finished. The
 * network thread does every libfabric call but some registrations (the
 * domain is thread-safe; workers register the buffers they fill or lend):
 *   PUT   check size -> a block reserved for the record in the DRAM tier
 *         (kvt_srv_store_put_reserve) and registered -> fi_read from the
 *         client's buffer straight into it -> commit -> reply. The commit
 *         runs here when it cannot block (one DRAM tier, the key not being
 *         read or written: a lock and an index update), else in a worker
 *         (with NVMe below: the write-through from the block first). Until
 *         the commit the old value is served; a failed transfer (RMA error,
 *         the client gone, a post refused for POST_STALL_S, shutdown) gives the
 *         block back and the old value stays.
 *         Without a DRAM tier, or no room for the reservation (reservations
 *         hold at most half of it), the bytes go through a staging buffer
 *         instead, which a worker then stores (kvt_srv_store_put: a copy).
 *   GET   worker lends the record from the DRAM tier (registered in place)
 *         or reads it into a staging buffer -> fi_write into the client's
 *         buffer -> reply (only after the write completed)
 *   other worker -> reply
 * Payload bytes in flight per session are bounded by --max-inflight: a
 * request that would pass it waits (deferred) until earlier ones finish. A
 * single request larger than the bound still runs alone, as it must.
 *
 * Peers. A HELLO carries the client's endpoint address, which goes into the
 * address vector; its reply names the session. A request whose session is
 * unknown cannot be answered (there is no address to answer to) and is
 * dropped: the client's timeout takes over, and its next HELLO starts a new
 * session. A failed send to a peer ends its session. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvt_internal.h"
#include "kvt_transport.h"
#include "server_net.h"

/* Fair shares (docs/SERVER.md). A session runs SESS_REQ_MAX requests at once
 * (the fabric tier's largest depth), stats-only sessions STATS_REQ_MAX all
 * together, one of several tenants TENANT_REQ_MAX: more are answered -EBUSY.
 * Stats-only sessions hold STATS_SESS_MAX table slots and replace each other;
 * one with a token is replaced only once idle SESS_IDLE_S; of several
 * tenants, one holds half the table: no HELLO flood ends a live session. */
#define SESS_REQ_MAX 64
#define STATS_REQ_MAX 8
#define TENANT_REQ_MAX (NREQ - NREQ / 4)
#define STATS_SESS_MAX 32
#define SESS_IDLE_S 30
/* A send or RMA the provider cannot take (its peer does not keep up) waits in
 * a queue, tried again each turn of the loop, never holding up the others;
 * after POST_STALL_S the peer's session ends. */
#define POST_STALL_S 5
/* HELLO replies waiting so, at most (no session's cap holds HELLOs): more
 * are dropped, the client's HELLO times out and it tries again. */
#define HELLO_PENDING_MAX 16
#define DRAIN_S 10
#define BUF_CACHE_MAX (512ull << 20)

int64_t kvt_srv_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec;
}

/* ---- staging buffers ---- */

static int buf_class(size_t n) {
  int c = BUF_MIN_SHIFT;
  while (c < 63 && ((size_t)1 << c) < n)
    c++;
  return c - BUF_MIN_SHIFT;
}

/* A registered buffer of at least n bytes: a cached one of n's power-of-two
 * class that is large enough, else a new one of n rounded up to 64 KiB (not
 * to the class's top: a 4 MiB payload would otherwise take 8 MiB). */
sbuf *kvt_srv_buf_get(kvt_server *sv, size_t n) {
  const int c = buf_class(n);
  if (c >= BUF_CLASSES)
    return NULL;
  pthread_mutex_lock(&sv->buf_mu);
  sbuf **pp = &sv->free_bufs[c];
  while (*pp && (*pp)->cap < n)
    pp = &(*pp)->next;
  sbuf *b = *pp;
  if (b) {
    *pp = b->next;
    sv->cached_bytes -= b->cap;
  }
  pthread_mutex_unlock(&sv->buf_mu);
  if (b)
    return b;
  b = kvt_alloc(sv->ctx, sizeof(*b), _Alignof(sbuf));
  if (!b)
    return NULL;
  memset(b, 0, sizeof(*b));
  b->cls = c;
  b->cap = (n + 65535) & ~(size_t)65535;
  if (!(b->p = kvt_alloc(sv->ctx, b->cap, 4096))) {
    kvt_dealloc(sv->ctx, b);
    return NULL;
  }
  if (kvt_fab_mr_reg(sv->fab, b->p, b->cap, KVT_FAB_LOCAL, &b->mr) != 0) {
    kvt_dealloc(sv->ctx, b->p);
    kvt_dealloc(sv->ctx, b);
    return NULL;
  }
  return b;
}

static void buf_free(kvt_server *sv, sbuf *b) {
  kvt_fab_mr_dereg(&b->mr);
  kvt_dealloc(sv->ctx, b->p);
  kvt_dealloc(sv->ctx, b);
}

static void buf_put(kvt_server *sv, sbuf *b) {
  if (!b)
    return;
  pthread_mutex_lock(&sv->buf_mu);
  if (sv->cached_bytes + b->cap <= BUF_CACHE_MAX) {
    b->next = sv->free_bufs[b->cls];
    sv->free_bufs[b->cls] = b;
    sv->cached_bytes += b->cap;
    b = NULL;
  }
  pthread_mutex_unlock(&sv->buf_mu);
  if (b)
    buf_free(sv, b);
}

/* ---- sessions ---- */

static sess *sess_find(kvt_server *sv, uint64_t id) {
  sess *s = &sv->sess[id & (MAX_SESS - 1)];
  return s->used && s->id == id && !s->dead ? s : NULL;
}

static void sess_free(kvt_server *sv, sess *s) {
  kvt_fab_av_remove(sv->fab, s->addr);
  sv->tenant_sess[s->tenant + 1]--;
  s->used = 0;
  s->id = 0;
  atomic_fetch_sub(&sv->n_sessions, 1);
}

/* Sessions a class (tenant + 1; 0: stats-only) may hold. */
static uint32_t sess_cap(const kvt_server *sv, int tenant) {
  if (tenant < 0)
    return STATS_SESS_MAX;
  return sv->cfg->n_tenants > 1 ? (MAX_SESS - STATS_SESS_MAX) / 2 : MAX_SESS - STATS_SESS_MAX;
}

/* The least recently active session with nothing in progress that may be
 * replaced: of class `tenant` only (own >= 0), or of any class; stats-only
 * ones at once, others once idle for SESS_IDLE_S. */
static sess *sess_victim(kvt_server *sv, int tenant, int own) {
  const int64_t idle_before = kvt_srv_now_s() - SESS_IDLE_S;
  sess *best = NULL;
  for (int i = 0; i < MAX_SESS; i++) {
    sess *s = &sv->sess[i];
    if (!s->used || s->outstanding || (own && s->tenant != tenant))
      continue;
    if (s->tenant >= 0 && s->last > idle_before)
      continue;
    if (!best || (s->tenant < 0) > (best->tenant < 0) ||
        ((s->tenant < 0) == (best->tenant < 0) && s->last < best->last))
      best = s; /* stats-only first, then the oldest */
  }
  return best;
}

/* A slot for a new session of tenant (-1: stats-only), or NULL (-EBUSY). */
static sess *sess_new(kvt_server *sv, int tenant) {
  sess *s = NULL;
  if (sv->tenant_sess[tenant + 1] >= sess_cap(sv, tenant)) {
    s = sess_victim(sv, tenant, 1);
  } else {
    for (int i = 0; i < MAX_SESS && !s; i++)
      if (!sv->sess[i].used)
        s = &sv->sess[i];
    if (!s)
      s = sess_victim(sv, tenant, 0);
  }
  if (s && s->used)
    sess_free(sv, s);
  return s;
}

/* Counts a request of s in progress; 0 when it is over its fair share. */
static int sess_hold(kvt_server *sv, sess *s) {
  uint32_t *t = &sv->tenant_reqs[s->tenant + 1];
  s->outstanding++;
  (*t)++;
  if (s->tenant < 0)
    return *t <= STATS_REQ_MAX;
  return s->outstanding <= SESS_REQ_MAX && (sv->cfg->n_tenants <= 1 || *t <= TENANT_REQ_MAX);
}

static void sess_unhold(kvt_server *sv, sess *s) {
  s->outstanding--;
  sv->tenant_reqs[s->tenant + 1]--;
}

/* ---- replies and finishing ---- */

/* Queues r's post (kind P_*) to be tried again by retry_posts(). */
static void defer_post(kvt_server *sv, sreq *r, int kind) {
  if (r->pending == P_NONE)
    r->pending_since = kvt_srv_now_s();
  r->pending = kind;
  r->pnext = NULL;
  if (sv->retry_tail)
    sv->retry_tail->pnext = r;
  else
    sv->retry_head = r;
  sv->retry_tail = r;
}

static void post_recv(kvt_server *sv, sreq *r) {
  r->pending = P_NONE;
  if (sv->draining) {
    r->state = RS_IDLE;
    return;
  }
  r->state = RS_POSTED;
  const int rc = kvt_fab_recv(sv->fab, r->rbuf, KVT_PROTO_MSG_MAX, sv->pool_mr.desc, &r->rctx);
  if (rc == -EAGAIN) {
    defer_post(sv, r, P_RECV);
  } else if (rc != 0) {
    r->state = RS_IDLE; /* this slot is lost; the others keep serving */
    kvt_srv_log(sv, KVT_LOG_ERROR, "posting a receive: %s", kvt_fab_error(sv->fab));
  }
}

static void start(kvt_server *sv, sreq *r);
static void reply(kvt_server *sv, sreq *r, int32_t status);

/* Gives back a reserved PUT's block that was not committed (the PUT failed:
 * the old value stays). Only called with no RMA into it in flight. */
static void put_drop(kvt_server *sv, sreq *r) {
  kvt_fab_mr_dereg(&r->put_mr);
  kvt_srv_store_put_abort(sv->st, &r->put);
}

static void finish(kvt_server *sv, sreq *r) {
  if (r->hello_q) {
    r->hello_q = 0;
    sv->hello_pending--;
  }
  put_drop(sv, r);
  buf_put(sv, r->stage);
  r->stage = NULL;
  if (r->lent) {
    kvt_fab_mr_dereg(&r->lend_mr);
    kvt_srv_store_get_unlend(sv->st, &r->g);
    kvt_srv_store_get_end(sv->st, &r->g, r->status == 0);
    r->lent = 0;
  }
  if (r->temp_addr != KVT_FAB_ADDR_NONE) {
    kvt_fab_av_remove(sv->fab, r->temp_addr);
    r->temp_addr = KVT_FAB_ADDR_NONE;
  }
  sess *s = r->s;
  r->s = NULL;
  if (s) {
    s->inflight -= r->charge;
    sess_unhold(sv, s);
    r->charge = 0;
    /* Requests that waited for room start while it lasts (or end with
     * their session). Both may finish requests of s in turn. */
    while (s->used && s->def_head &&
           (s->dead || s->inflight == 0 ||
            s->inflight + s->def_head->charge <= sv->cfg->max_inflight)) {
      sreq *d = s->def_head;
      s->def_head = d->next;
      if (!s->def_head)
        s->def_tail = NULL;
      if (s->dead)
        reply(sv, d, -ECONNRESET);
      else
        start(sv, d);
    }
    if (s->used && s->dead && s->outstanding == 0)
      sess_free(sv, s);
  }
  post_recv(sv, r);
}

static int encode_reply(kvt_server *sv, sreq *r, size_t *len) {
  kvt_proto_msg m;
  kvt_proto_init_reply(&m, &r->req, r->status);
  switch (r->req.h.opcode) {
  case KVT_PROTO_HELLO:
    if (r->status == 0) {
      m.h.session = r->new_session;
      m.u.hello_reply.max_request = sv->cfg->max_request;
      m.u.hello_reply.max_inflight = sv->cfg->max_inflight;
      m.u.hello_reply.msg_max = KVT_PROTO_MSG_MAX;
      m.u.hello_reply.list_max = KVT_PROTO_LIST_MAX;
    }
    break;
  case KVT_PROTO_GET:
  case KVT_PROTO_EXISTS:
    m.u.len.len = r->out_len;
    break;
  case KVT_PROTO_STATS:
    if (r->status == 0) {
      m.u.stats.n = KVT_STAT_COUNT;
      memcpy(m.u.stats.v, r->stats, sizeof(r->stats));
    }
    break;
  case KVT_PROTO_LIST:
    if (r->status == 0) {
      m.u.list_reply.n = r->list_n;
      m.u.list_reply.next = r->list_next;
      m.u.list_reply.entries = r->list;
    }
    break;
  default:
    break;
  }
  return kvt_proto_encode(&m, r->msg, KVT_PROTO_MSG_MAX, len);
}

/* Sends r's encoded reply, or queues it when the provider has no room. */
static void send_reply(kvt_server *sv, sreq *r) {
  const uint64_t dest = r->temp_addr != KVT_FAB_ADDR_NONE ? r->temp_addr : r->s ? r->s->addr : 0;
  int rc = (r->s && r->s->dead)
               ? -ECONNRESET
               : kvt_fab_send(sv->fab, dest, r->msg, r->send_len, sv->pool_mr.desc, &r->sctx);
  if (rc == -EAGAIN && r->req.h.opcode == KVT_PROTO_HELLO && !r->hello_q) {
    if (sv->hello_pending < HELLO_PENDING_MAX) {
      r->hello_q = 1;
      sv->hello_pending++;
    } else {
      rc = -EBUSY; /* dropped */
    }
  }
  if (rc == -EAGAIN) {
    defer_post(sv, r, P_SEND);
    return;
  }
  r->pending = P_NONE;
  if (rc) {
    if (r->s)
      r->s->dead = 1; /* cannot answer this peer: its session ends */
    finish(sv, r);
  }
}

static void reply(kvt_server *sv, sreq *r, int32_t status) {
  put_drop(sv, r); /* at once: a reply waiting for room holds no DRAM */
  r->status = status;
  r->state = RS_REPLY;
  const int rc = (r->s && r->s->dead) ? -ECONNRESET : encode_reply(sv, r, &r->send_len);
  if (rc) {
    if (r->s)
      r->s->dead = 1;
    r->pending = P_NONE;
    finish(sv, r);
    return;
  }
  send_reply(sv, r);
}

/* ---- data movement ---- */

static void post_rma(kvt_server *sv, sreq *r) {
  const uint64_t chunk = r->rma_len - r->rma_off < kvt_fab_max_rma(sv->fab)
                             ? r->rma_len - r->rma_off
                             : kvt_fab_max_rma(sv->fab);
  const uint64_t raddr = r->req.u.data.rma_addr + r->rma_off;
  r->state = RS_RMA;
  if (r->s->dead) {
    r->pending = P_NONE;
    reply(sv, r, -ECONNRESET);
    return;
  }
  int rc;
  if (r->req.h.opcode == KVT_PROTO_PUT && r->put.tier)
    rc = kvt_fab_read(sv->fab, r->s->addr, r->put_rec + SRV_REC_HDR + r->rma_off, (size_t)chunk,
                      r->put_mr.desc, raddr, r->req.u.data.rma_key, &r->actx);
  else if (r->req.h.opcode == KVT_PROTO_PUT)
    rc = kvt_fab_read(sv->fab, r->s->addr, r->stage->p + SRV_REC_HDR + r->rma_off, (size_t)chunk,
                      r->stage->mr.desc, raddr, r->req.u.data.rma_key, &r->actx);
  else if (r->lent)
    rc = kvt_fab_write(sv->fab, r->s->addr, r->src + r->rma_off, (size_t)chunk, r->lend_mr.desc,
                       raddr, r->req.u.data.rma_key, &r->actx);
  else
    rc = kvt_fab_write(sv->fab, r->s->addr, r->stage->p + SRV_REC_HDR + r->rma_off, (size_t)chunk,
                       r->stage->mr.desc, raddr, r->req.u.data.rma_key, &r->actx);
  if (rc == -EAGAIN) {
    defer_post(sv, r, P_RMA);
    return;
  }
  r->pending = P_NONE;
  if (rc)
    reply(sv, r, rc);
  else
    r->rma_off += chunk;
}

/* Tries the queued posts again; one that waited POST_STALL_S ends its
 * peer's session (a receive of ours waits as long as it takes). */
static void retry_posts(kvt_server *sv) {
  sreq *r = sv->retry_head;
  sv->retry_head = sv->retry_tail = NULL;
  const int64_t now = kvt_srv_now_s();
  while (r) {
    sreq *next = r->pnext;
    const int kind = r->pending;
    if (kind != P_RECV && now - r->pending_since > POST_STALL_S) {
      r->pending = P_NONE;
      if (r->s)
        r->s->dead = 1;
      if (kind == P_SEND)
        finish(sv, r);
      else
        reply(sv, r, -ETIMEDOUT); /* the session is dead: this finishes r */
    } else if (kind == P_RECV) {
      post_recv(sv, r);
    } else if (kind == P_SEND) {
      send_reply(sv, r);
    } else {
      post_rma(sv, r);
    }
    r = next;
  }
}

static void to_workers(kvt_server *sv, sreq *r) {
  r->state = RS_WORK;
  r->next = NULL;
  pthread_mutex_lock(&sv->mu);
  if (sv->job_tail)
    sv->job_tail->next = r;
  else
    sv->job_head = r;
  sv->job_tail = r;
  pthread_cond_signal(&sv->cv);
  pthread_mutex_unlock(&sv->mu);
}

/* A PUT's block reserved in the DRAM tier and registered for the RMA read
 * into it. Cheap enough for this thread: the store's reserve never waits
 * for other requests (making room drops DRAM values or copies, no I/O), and
 * registering is a map insert for tcp;ofi_rxm (about 2 us for 4 MiB; a
 * provider that pins pages, verbs, pays more, as the GET path does). Its
 * key is random, as every registration's (kvt_fab_mr_reg). */
static int put_reserve(kvt_server *sv, sreq *r) {
  uint8_t *rec = NULL;
  const uint64_t len = r->req.u.data.len;
  int rc = kvt_srv_store_put_reserve(sv->st, r->s->tenant, &r->req.u.data.key, len, &r->put, &rec);
  if (rc)
    return rc;
  rc = kvt_fab_mr_reg(sv->fab, rec, (size_t)(SRV_REC_HDR + len), KVT_FAB_LOCAL, &r->put_mr);
  if (rc) {
    kvt_srv_store_put_abort(sv->st, &r->put);
    return rc;
  }
  r->put_rec = rec;
  return 0;
}

/* The RMA read has filled the reserved block: committed here when that does
 * not block (one DRAM tier, the key not in use: a lock and an index update),
 * else by a worker (a write-through to NVMe, or waiting for the key's
 * readers and writers). */
static void put_commit(kvt_server *sv, sreq *r) {
  kvt_fab_mr_dereg(&r->put_mr); /* nothing more lands in it */
  const int rc = kvt_srv_store_put_commit(sv->st, &r->put, 0);
  if (rc == -EWOULDBLOCK)
    to_workers(sv, r);
  else
    reply(sv, r, rc);
}

/* Starts a request whose in-flight bytes are within the session's bound. */
static void start(kvt_server *sv, sreq *r) {
  r->s->inflight += r->charge;
  if (r->req.h.opcode != KVT_PROTO_PUT) {
    to_workers(sv, r);
    return;
  }
  r->rma_off = 0;
  r->rma_len = r->req.u.data.len;
  /* The bytes land where they will be kept when the store has a DRAM tier
   * with room; else (NVMe only, no room, an empty value) in a staging buffer
   * that a worker then stores, with kvt_srv_store_put's errors. */
  if (r->rma_len && put_reserve(sv, r) == 0) {
    post_rma(sv, r);
    return;
  }
  r->stage = kvt_srv_buf_get(sv, SRV_REC_HDR + r->req.u.data.len);
  if (!r->stage) {
    reply(sv, r, -ENOMEM);
    return;
  }
  if (r->rma_len)
    post_rma(sv, r);
  else
    to_workers(sv, r);
}

/* ---- requests ---- */

/* Token comparison that takes the same time wherever the first difference is. */
static int token_equal(const char *a, const char *b) {
  unsigned char d = 0;
  const size_t la = strlen(a), lb = strlen(b);
  for (size_t i = 0; i < KVT_PROTO_TOKEN_MAX; i++)
    d |= (unsigned char)((i < la ? a[i] : 0) ^ (i < lb ? b[i] : 0));
  return d == 0 && la == lb;
}

static void on_hello(kvt_server *sv, sreq *r) {
  const kvt_proto_msg *m = &r->req;
  uint64_t addr;
  /* The provider reads an address of its own size: a shorter one would be
   * completed from the tenant and token bytes that follow it. */
  if (m->u.hello.addr_len == 0 || m->u.hello.addr_len < kvt_fab_addr_len(sv->fab) ||
      kvt_fab_av_insert(sv->fab, m->u.hello.addr, &addr) != 0) {
    post_recv(sv, r); /* nowhere to answer */
    return;
  }
  int tenant = -1;
  if (m->u.hello.tenant[0]) {
    tenant = -2;
    for (int i = 0; i < sv->cfg->n_tenants; i++)
      if (strcmp(sv->cfg->tenants[i].name, m->u.hello.tenant) == 0 &&
          token_equal(sv->cfg->tenants[i].token, m->u.hello.token))
        tenant = i;
  }
  sess *s = tenant >= -1 && !sv->draining ? sess_new(sv, tenant) : NULL;
  if (!s) {
    r->temp_addr = addr;
    if (tenant == -2) {
      atomic_fetch_add(&sv->auth_refused, 1);
      kvt_srv_log(sv, KVT_LOG_WARN, "refused tenant '%s': unknown tenant or wrong token",
                  m->u.hello.tenant);
    }
    reply(sv, r, tenant == -2 ? KVT_EAUTH : sv->draining ? -ESHUTDOWN : -EBUSY);
    return;
  }
  const size_t slot = (size_t)(s - sv->sess);
  /* The session id is what authorizes every later request of the peer, so
   * it must not be guessable: 54 random bits above the slot's. */
  uint64_t rnd = 0;
  if (getrandom(&rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
    sv->salt = sv->salt * 6364136223846793005ull + 1442695040888963407ull;
    rnd = sv->salt;
  }
  memset(s, 0, sizeof(*s));
  s->id = (rnd & ~(uint64_t)(MAX_SESS - 1)) | slot;
  if (s->id == 0)
    s->id = MAX_SESS | slot;
  s->addr = addr;
  s->tenant = tenant;
  s->used = 1;
  s->last = kvt_srv_now_s();
  sv->tenant_sess[tenant + 1]++;
  atomic_fetch_add(&sv->n_sessions, 1);
  r->new_session = s->id;
  r->temp_addr = KVT_FAB_ADDR_NONE;
  r->s = s;
  (void)sess_hold(sv, s); /* its reply */
  reply(sv, r, 0);
}

/* Admission of a data or query request on a known session. */
static void admit(kvt_server *sv, sreq *r) {
  sess *s = r->s;
  const uint16_t op = r->req.h.opcode;
  if (sv->draining) {
    reply(sv, r, -ESHUTDOWN);
    return;
  }
  if (s->tenant < 0 && op != KVT_PROTO_STATS) {
    reply(sv, r, KVT_EAUTH); /* a stats-only session */
    return;
  }
  if (op == KVT_PROTO_PUT && r->req.u.data.len > sv->cfg->max_request) {
    atomic_fetch_add(&sv->too_big, 1);
    reply(sv, r, KVT_ETOOBIG);
    return;
  }
  r->charge = 0;
  if (op == KVT_PROTO_PUT)
    r->charge = r->req.u.data.len;
  else if (op == KVT_PROTO_GET)
    r->charge = r->req.u.data.len < sv->cfg->max_request ? r->req.u.data.len : sv->cfg->max_request;
  if (r->charge && s->inflight && s->inflight + r->charge > sv->cfg->max_inflight) {
    atomic_fetch_add(&sv->deferred, 1);
    r->state = RS_DEFERRED;
    r->next = NULL;
    if (s->def_tail)
      s->def_tail->next = r;
    else
      s->def_head = r;
    s->def_tail = r;
    return;
  }
  start(sv, r);
}

static void on_recv(kvt_server *sv, sreq *r, const kvt_fab_comp *c) {
  r->state = RS_IDLE;
  r->s = NULL;
  r->temp_addr = KVT_FAB_ADDR_NONE;
  r->charge = 0;
  if (c->err) {
    if (c->err != -ECANCELED)
      kvt_srv_log(sv, KVT_LOG_ERROR, "receive failed: %s", kvt_fab_error(sv->fab));
    post_recv(sv, r);
    return;
  }
  if (kvt_proto_decode(r->rbuf, c->len, &r->req) != 0 || (r->req.h.opcode & KVT_PROTO_REPLY)) {
    post_recv(sv, r); /* malformed: dropped (there may be no one to tell) */
    return;
  }
  if (r->req.h.opcode == KVT_PROTO_HELLO) {
    on_hello(sv, r);
    return;
  }
  sess *s = sess_find(sv, r->req.h.session);
  if (!s) {
    post_recv(sv, r);
    return;
  }
  if (r->req.h.opcode == KVT_PROTO_BYE) {
    s->dead = 1;
    if (s->outstanding == 0)
      sess_free(sv, s);
    post_recv(sv, r);
    return;
  }
  s->last = kvt_srv_now_s();
  r->s = s;
  if (!sess_hold(sv, s)) {
    reply(sv, r, -EBUSY); /* over its fair share of request slots */
    return;
  }
  admit(sv, r);
}

static void on_rma_done(kvt_server *sv, sreq *r, const kvt_fab_comp *c) {
  if (c->err) {
    reply(sv, r, c->err); /* the client's buffer went away: it gets an error, if it listens */
    return;
  }
  if (r->rma_off < r->rma_len) {
    post_rma(sv, r);
    return;
  }
  if (r->req.h.opcode == KVT_PROTO_PUT && r->put.tier)
    put_commit(sv, r);
  else if (r->req.h.opcode == KVT_PROTO_PUT)
    to_workers(sv, r);
  else
    reply(sv, r, 0);
}

static void on_work_done(kvt_server *sv, sreq *r) {
  if (r->req.h.opcode == KVT_PROTO_GET && r->status == 0 && r->out_len) {
    r->rma_off = 0;
    r->rma_len = r->out_len;
    post_rma(sv, r);
    return;
  }
  reply(sv, r, r->status);
}

static void on_completion(kvt_server *sv, const kvt_fab_comp *c) {
  sreq *r = c->ctx->owner;
  switch (c->ctx->kind) {
  case K_RECV:
    on_recv(sv, r, c);
    break;
  case K_RMA:
    on_rma_done(sv, r, c);
    break;
  default: /* K_SEND: the reply went out (or the peer is gone) */
    if (c->err && r->s)
      r->s->dead = 1;
    finish(sv, r);
  }
}

/* ---- setup and the loop ---- */

static int setup(kvt_server *sv) {
  char err[512];
  kvt_fab_config fc = {.provider = sv->cfg->provider,
                       .node = sv->cfg->host,
                       .service = sv->cfg->port,
                       .cq_depth = 4 * NREQ,
                       .no_post_wait = 1};
  int rc = kvt_fab_open(&fc, &sv->fab, err, sizeof(err));
  if (rc)
    return kvt_fail(sv->ctx, rc, "opening the endpoint: %s", err);
  const size_t pool = (size_t)NREQ * 2 * KVT_PROTO_MSG_MAX;
  if (!(sv->pool = kvt_alloc(sv->ctx, pool, 4096)))
    return kvt_fail(sv->ctx, -ENOMEM, "out of memory");
  if ((rc = kvt_fab_mr_reg(sv->fab, sv->pool, pool, KVT_FAB_LOCAL, &sv->pool_mr)) != 0)
    return kvt_fail(sv->ctx, rc, "registering buffers: %s", kvt_fab_error(sv->fab));
  for (int i = 0; i < NREQ; i++) {
    sreq *r = &sv->req[i];
    r->rbuf = sv->pool + (size_t)i * 2 * KVT_PROTO_MSG_MAX;
    r->msg = r->rbuf + KVT_PROTO_MSG_MAX;
    r->rctx = (kvt_fab_ctx){.owner = r, .kind = K_RECV};
    r->sctx = (kvt_fab_ctx){.owner = r, .kind = K_SEND};
    r->actx = (kvt_fab_ctx){.owner = r, .kind = K_RMA};
    r->temp_addr = KVT_FAB_ADDR_NONE;
    post_recv(sv, r);
  }
  return 0;
}

static void take_done(kvt_server *sv) {
  pthread_mutex_lock(&sv->mu);
  sreq *r = sv->done_head;
  sv->done_head = sv->done_tail = NULL;
  pthread_mutex_unlock(&sv->mu);
  while (r) {
    sreq *next = r->next;
    on_work_done(sv, r);
    r = next;
  }
}

void kvt_srv_net_serve(kvt_server *sv) {
  int64_t drain_deadline = 0;
  for (;;) {
    kvt_fab_comp c[64];
    const int n = kvt_fab_poll(sv->fab, c, 64);
    for (int i = 0; i < n; i++)
      on_completion(sv, &c[i]);
    take_done(sv);
    retry_posts(sv);
    if (atomic_load(&sv->stop) && !sv->draining) {
      sv->draining = 1;
      drain_deadline = kvt_srv_now_s() + DRAIN_S;
      for (int i = 0; i < NREQ; i++) /* posted receives stay posted; no new work starts */
        if (sv->req[i].state == RS_POSTED)
          sv->req[i].state = RS_IDLE;
    }
    if (sv->draining) {
      int busy = 0;
      for (int i = 0; i < NREQ; i++)
        busy += sv->req[i].state != RS_IDLE;
      if (!busy)
        break;
      if (kvt_srv_now_s() > drain_deadline) {
        kvt_srv_log(sv, KVT_LOG_ERROR, "%d requests still in progress after %d s; closing", busy,
                    DRAIN_S);
        break;
      }
    }
    if (n <= 0)
      kvt_fab_wait(sv->fab, sv->wake_fd, sv->retry_head ? 1 : 100);
    uint64_t v;
    ssize_t rr = read(sv->wake_fd, &v, sizeof(v));
    (void)rr;
  }
}

void kvt_srv_net_close(kvt_server *sv) {
  if (!sv->net_open)
    return;
  sv->net_open = 0;
  /* GETs the drain gave up on (their clients stopped reading) go back first:
   * a worker may be waiting for them (a commit of the same key), and the
   * workers are joined next. Nothing moves their bytes any more: the network
   * thread, which drives the provider, has stopped. */
  for (int i = 0; i < NREQ; i++) {
    sreq *r = &sv->req[i];
    if (r->lent) {
      kvt_fab_mr_dereg(&r->lend_mr);
      kvt_srv_store_get_unlend(sv->st, &r->g);
      kvt_srv_store_get_end(sv->st, &r->g, 0);
      r->lent = 0;
    }
  }
  pthread_mutex_lock(&sv->mu);
  sv->stop_workers = 1;
  pthread_cond_broadcast(&sv->cv);
  pthread_mutex_unlock(&sv->mu);
  for (int i = 0; i < sv->n_threads; i++)
    pthread_join(sv->threads[i], NULL);
  kvt_dealloc(sv->ctx, sv->threads);
  for (int i = 0; i < NREQ; i++) {
    sreq *r = &sv->req[i];
    if (r->stage && r->state == RS_RMA && r->pending == P_NONE)
      r->stage = NULL; /* an RMA may still land in it as the endpoint closes: left */
    if (r->stage)
      buf_put(sv, r->stage);
    kvt_fab_mr_dereg(&r->put_mr); /* its reservation is given back below */
    kvt_dealloc(sv->ctx, r->list);
  }
  for (int c = 0; c < BUF_CLASSES; c++)
    for (sbuf *b = sv->free_bufs[c], *next; b; b = next) {
      next = b->next;
      buf_free(sv, b);
    }
  kvt_fab_mr_dereg(&sv->pool_mr);
  kvt_fab_close(sv->fab);
  /* A PUT whose RMA read was in flight when the drain timed out: its block
   * goes back only now that the endpoint is closed and nothing can land in
   * it, and before the store closes its tiers (every reservation must be
   * published or aborted by then). */
  for (int i = 0; i < NREQ; i++)
    kvt_srv_store_put_abort(sv->st, &sv->req[i].put);
  kvt_dealloc(sv->ctx, sv->pool);
  pthread_mutex_destroy(&sv->buf_mu);
  pthread_mutex_destroy(&sv->mu);
  pthread_cond_destroy(&sv->cv);
}

int kvt_srv_net_open(kvt_server *sv) {
  sv->net_open = 1;
  sv->started = kvt_srv_now_s();
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  sv->salt =
      (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)ts.tv_sec;
  pthread_mutex_init(&sv->mu, NULL);
  pthread_mutex_init(&sv->buf_mu, NULL);
  pthread_cond_init(&sv->cv, NULL);
  int rc = setup(sv);
  if (rc == 0 && !(sv->threads = kvt_alloc(sv->ctx, (size_t)sv->cfg->workers * sizeof(pthread_t),
                                           sizeof(void *))))
    rc = kvt_fail(sv->ctx, -ENOMEM, "out of memory");
  for (int i = 0; rc == 0 && i < sv->cfg->workers; i++) {
    if (pthread_create(&sv->threads[i], NULL, kvt_srv_worker_main, sv) != 0) {
      rc = kvt_fail(sv->ctx, -EAGAIN, "starting a worker thread");
      break;
    }
    sv->n_threads++;
  }
  return rc;
}
