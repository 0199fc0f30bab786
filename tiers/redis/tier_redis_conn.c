/* tiers/redis/tier_redis_conn.c - the redis tier's connections: connect with a
 * timeout (hiredis), AUTH and SELECT, backoff after failures, control
 * commands through hiredis' formatter and reader, the data path's own
 * buffered RESP reader and zero-copy writer (sendmsg with MSG_NOSIGNAL, so a
 * dead server is an error, never SIGPIPE), and the cluster slot map learned
 * from CLUSTER SLOTS. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tier_redis.h"

uint64_t rd_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* CRC16-CCITT (XMODEM), as the Redis Cluster spec names it. */
uint16_t rd_crc16(const char *buf, size_t len) {
  uint16_t crc = 0;
  for (size_t i = 0; i < len; i++) {
    crc ^= (uint16_t)((uint8_t)buf[i] << 8);
    for (int b = 0; b < 8; b++)
      crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc;
}

/* Maps an error reply to a code: the caller decides about MOVED and ASK. */
int rd_reply_error(const char *msg, size_t len) {
  static const struct {
    const char *prefix;
    int code;
  } map[] = {{"OOM", -ENOSPC},         {"NOAUTH", KVT_EAUTH},  {"WRONGPASS", KVT_EAUTH},
             {"NOPERM", KVT_EAUTH},    {"WRONGTYPE", KVT_ENOTFOUND}, {"LOADING", -EAGAIN},
             {"TRYAGAIN", -EAGAIN},    {"CLUSTERDOWN", -EAGAIN}, {"MASTERDOWN", -EAGAIN},
             {"READONLY", -EAGAIN},    {"ERR max number of clients", -EAGAIN}};
  for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
    const size_t n = strlen(map[i].prefix);
    if (len >= n && memcmp(msg, map[i].prefix, n) == 0)
      return map[i].code;
  }
  return KVT_EBACKEND;
}

/* ---- data path I/O ---- */

void rd_arm(const rd_state *st, rd_conn *c) {
  c->timeout_ms = st->timeout_ms;
  c->deadline_ms = rd_now_ms() + (uint64_t)st->timeout_ms;
}

/* Waits until the socket is ready for events, up to the connection's
 * deadline: the timeout bounds a whole reply, however slowly the server
 * trickles it (the socket's own timeouts bound each recv only), and a write
 * (of the caller's own bytes, any size) while it makes no progress. */
static int wait_io(rd_conn *c, short events) {
  if (!c->deadline_ms)
    return 0;
  for (;;) {
    const uint64_t now = rd_now_ms();
    if (now >= c->deadline_ms)
      return -ETIMEDOUT;
    struct pollfd p = {.fd = c->fd, .events = events};
    const int n = poll(&p, 1, (int)(c->deadline_ms - now));
    if (n > 0)
      return 0; /* ready, or an error/hangup the next call reports */
    if (n < 0 && errno != EINTR)
      return -errno;
  }
}

static int io_err(void) {
  return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
}

/* Whether a non-blocking call should wait for the socket and try again. */
static int would_block(const rd_conn *c) {
  return c->deadline_ms && (errno == EAGAIN || errno == EWOULDBLOCK);
}

int rd_conn_alive(rd_conn *c) {
  struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
  return poll(&p, 1, 0) <= 0; /* idle: nothing to read, no hangup */
}

int rd_flush(rd_conn *c) {
  struct iovec *iov = c->iov;
  int n = c->niov;
  while (n > 0) {
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)n;
    int rc = 0;
    const ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | (c->deadline_ms ? MSG_DONTWAIT : 0));
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      rc = would_block(c) ? wait_io(c, POLLOUT) : io_err();
    if (w < 0 && !rc)
      continue; /* writable now */
    if (rc) {
      c->niov = 0;
      c->arena_used = 0;
      return rc;
    }
    if (w > 0 && c->deadline_ms) /* a write of our own size: bounded by progress */
      c->deadline_ms = rd_now_ms() + (uint64_t)c->timeout_ms;
    size_t left = (size_t)w;
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (uint8_t *)iov->iov_base + left;
      iov->iov_len -= left;
    }
  }
  c->niov = 0;
  c->arena_used = 0;
  return 0;
}

/* One recv of at most n bytes into dst, within the deadline: > 0 bytes, or an
 * error (-ECONNRESET at EOF). */
static ssize_t recv_some(rd_conn *c, void *dst, size_t n) {
  for (;;) {
    const ssize_t r = recv(c->fd, dst, n, c->deadline_ms ? MSG_DONTWAIT : 0);
    if (r > 0)
      return r;
    if (r == 0)
      return -ECONNRESET;
    if (errno == EINTR)
      continue;
    if (!would_block(c))
      return io_err();
    const int rc = wait_io(c, POLLIN); /* only once nothing is there */
    if (rc)
      return rc;
  }
}

int rd_put_ref(rd_conn *c, const void *p, size_t n) {
  if (n == 0)
    return 0;
  if (c->niov == RD_IOV) {
    const int rc = rd_flush(c);
    if (rc)
      return rc;
  }
  c->iov[c->niov].iov_base = (void *)p;
  c->iov[c->niov].iov_len = n;
  c->niov++;
  return 0;
}

int rd_put_raw(rd_conn *c, const void *p, size_t n) {
  if (n > RD_ARENA)
    return -EINVAL;
  if (c->arena_used + n > RD_ARENA || c->niov == RD_IOV) {
    const int rc = rd_flush(c);
    if (rc)
      return rc;
  }
  uint8_t *dst = c->arena + c->arena_used;
  memcpy(dst, p, n);
  /* Adjacent raw bytes extend the last iovec. */
  if (c->niov && (uint8_t *)c->iov[c->niov - 1].iov_base + c->iov[c->niov - 1].iov_len == dst)
    c->iov[c->niov - 1].iov_len += n;
  else {
    c->iov[c->niov].iov_base = dst;
    c->iov[c->niov].iov_len = n;
    c->niov++;
  }
  c->arena_used += n;
  return 0;
}

/* Reads what is there, at most max bytes: a reply line is read in small
 * steps so that a large bulk after it goes straight to its destination. */
static int fill(rd_conn *c, size_t max) {
  if (c->rpos == c->rlen)
    c->rpos = c->rlen = 0;
  else if (c->rpos > 0 && c->rlen == RD_RBUF) {
    memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
    c->rlen -= c->rpos;
    c->rpos = 0;
  }
  const size_t room = RD_RBUF - c->rlen;
  const ssize_t r = recv_some(c, c->rbuf + c->rlen, room < max ? room : max);
  if (r < 0)
    return (int)r;
  c->rlen += (size_t)r;
  return 0;
}

/* One reply line: its type byte and either its number (':', '$', '*') or
 * its text ('+', '-', truncated to cap). */
int rd_read_line(rd_conn *c, char *type, int64_t *num, char *text, size_t cap) {
  for (;;) {
    uint8_t *start = c->rbuf + c->rpos;
    uint8_t *nl = memchr(start, '\n', c->rlen - c->rpos);
    if (nl) {
      size_t n = (size_t)(nl - start);
      if (n < 2 || nl[-1] != '\r')
        return KVT_EPROTO;
      n -= 1; /* without \r */
      *type = (char)start[0];
      if (*type == '+' || *type == '-') {
        const size_t k = n - 1 < cap - 1 ? n - 1 : cap - 1;
        memcpy(text, start + 1, k);
        text[k] = '\0';
      } else if (*type == ':' || *type == '$' || *type == '*') {
        char tmp[32];
        if (n - 1 >= sizeof(tmp) || n < 2)
          return KVT_EPROTO;
        memcpy(tmp, start + 1, n - 1);
        tmp[n - 1] = '\0';
        char *end;
        *num = strtoll(tmp, &end, 10);
        if (*end)
          return KVT_EPROTO;
      } else {
        return KVT_EPROTO;
      }
      c->rpos += (size_t)(nl - start) + 1;
      return 0;
    }
    if (c->rlen - c->rpos == RD_RBUF)
      return KVT_EPROTO; /* a line longer than the buffer */
    const int rc = fill(c, 4096);
    if (rc)
      return rc;
  }
}

int rd_read_exact(rd_conn *c, void *dst, size_t n) {
  uint8_t *d = dst;
  const size_t have = c->rlen - c->rpos < n ? c->rlen - c->rpos : n;
  if (d)
    memcpy(d, c->rbuf + c->rpos, have);
  c->rpos += have;
  n -= have;
  if (d)
    d += have;
  while (n > 0) {
    if (!d || n < 4096) { /* small or discarded: through the buffer */
      const int rc = fill(c, d ? 4096 : RD_RBUF);
      if (rc)
        return rc;
      const size_t k = c->rlen - c->rpos < n ? c->rlen - c->rpos : n;
      if (d) {
        memcpy(d, c->rbuf + c->rpos, k);
        d += k;
      }
      c->rpos += k;
      n -= k;
      continue;
    }
    const ssize_t r = recv_some(c, d, n); /* large: straight into dst */
    if (r < 0)
      return (int)r;
    d += r;
    n -= (size_t)r;
  }
  return 0;
}

/* ---- control commands (hiredis formatter and reader) ---- */

int rd_ctl_send(rd_conn *c, int argc, const char **argv, const size_t *argvlen) {
  char *cmd = NULL;
  const int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
  if (len < 0)
    return -ENOMEM;
  int rc = 0;
  for (size_t off = 0; off < (size_t)len && !rc;) {
    const int flags = MSG_NOSIGNAL | (c->deadline_ms ? MSG_DONTWAIT : 0);
    const ssize_t w = send(c->fd, cmd + off, (size_t)len - off, flags);
    if (w > 0)
      off += (size_t)w;
    else if (w < 0 && errno != EINTR)
      rc = would_block(c) ? wait_io(c, POLLOUT) : io_err();
  }
  redisFreeCommand(cmd);
  return rc;
}

int rd_ctl_read(rd_conn *c, redisReply **out) {
  redisReader *r = c->rc->reader;
  if (c->rlen > c->rpos) { /* bytes the data path's reader holds (none, normally) */
    redisReaderFeed(r, (const char *)c->rbuf + c->rpos, c->rlen - c->rpos);
    c->rpos = c->rlen = 0;
  }
  for (;;) {
    void *reply = NULL;
    if (redisReaderGetReply(r, &reply) != REDIS_OK)
      return KVT_EPROTO;
    if (reply) {
      *out = reply;
      return 0;
    }
    const ssize_t n = recv_some(c, c->rbuf, RD_RBUF);
    if (n < 0)
      return (int)n;
    redisReaderFeed(r, (const char *)c->rbuf, (size_t)n);
  }
}

int rd_ctl(rd_state *st, rd_conn *c, int argc, const char **argv, const size_t *argvlen,
           redisReply **out) {
  rd_arm(st, c);
  int rc = rd_ctl_send(c, argc, argv, argvlen);
  return rc ? rc : rd_ctl_read(c, out);
}

/* ---- connections ---- */

void rd_conn_close(rd_state *st, rd_conn *c) {
  if (c->rc)
    redisFree(c->rc);
  c->rc = NULL;
  c->fd = -1;
  c->rpos = c->rlen = 0;
  c->niov = 0;
  c->arena_used = 0;
  c->deadline_ms = 0;
  (void)st;
}

void rd_conn_free(rd_state *st, rd_conn *c) {
  rd_conn_close(st, c);
  kvt_dealloc(st->ctx, c->rbuf);
  kvt_dealloc(st->ctx, c->arena);
  kvt_dealloc(st->ctx, c->iov);
  c->rbuf = c->arena = NULL;
  c->iov = NULL;
}

/* AUTH and SELECT on a fresh connection. */
static int conn_setup(rd_state *st, rd_conn *c, const char *where, int for_open) {
  redisReply *r = NULL;
  int rc = 0;
  if (st->pass[0]) {
    const char *argv[3] = {"AUTH", st->user, st->pass};
    size_t lens[3] = {4, strlen(st->user), strlen(st->pass)};
    const int user = st->user[0] != '\0';
    const char *a2[2] = {"AUTH", st->pass};
    size_t l2[2] = {4, strlen(st->pass)};
    rc = user ? rd_ctl(st, c, 3, argv, lens, &r) : rd_ctl(st, c, 2, a2, l2, &r);
    if (!rc && r->type == REDIS_REPLY_ERROR) {
      rc = rd_reply_error(r->str, r->len);
      if (rc == KVT_EBACKEND)
        rc = KVT_EAUTH;
      if (for_open)
        kvt_fail(st->ctx, rc, "redis tier: %s: AUTH refused: %s", where, r->str);
    }
    freeReplyObject(r);
    r = NULL;
  }
  if (!rc && st->db) {
    char db[16];
    snprintf(db, sizeof(db), "%d", st->db);
    const char *argv[2] = {"SELECT", db};
    size_t lens[2] = {6, strlen(db)};
    rc = rd_ctl(st, c, 2, argv, lens, &r);
    if (!rc && r->type == REDIS_REPLY_ERROR) {
      rc = rd_reply_error(r->str, r->len);
      if (for_open)
        kvt_fail(st->ctx, rc, "redis tier: %s: SELECT %d refused: %s", where, st->db, r->str);
    }
    freeReplyObject(r);
  } else if (!rc && !st->pass[0]) {
    const char *argv[1] = {"PING"}; /* says NOAUTH now rather than on the first op */
    size_t lens[1] = {4};
    rc = rd_ctl(st, c, 1, argv, lens, &r);
    if (!rc && r->type == REDIS_REPLY_ERROR) {
      rc = rd_reply_error(r->str, r->len);
      if (for_open)
        kvt_fail(st->ctx, rc, "redis tier: %s: PING refused: %s", where, r->str);
    }
    freeReplyObject(r);
  }
  if (rc && for_open && !kvt_ctx_last_error(st->ctx)[0])
    kvt_fail(st->ctx, rc, "redis tier: %s: %s", where, kvt_strerror(rc));
  return rc;
}

int rd_conn_connect(rd_state *st, const char *host, int port, rd_conn *c, int for_open) {
  char where[300];
  snprintf(where, sizeof(where), "%s:%d", host, port);
  if (!c->rbuf)
    c->rbuf = kvt_alloc(st->ctx, RD_RBUF, 64);
  if (!c->arena)
    c->arena = kvt_alloc(st->ctx, RD_ARENA, 64);
  if (!c->iov)
    c->iov = kvt_alloc(st->ctx, RD_IOV * sizeof(struct iovec), 64);
  if (!c->rbuf || !c->arena || !c->iov)
    return for_open ? kvt_fail(st->ctx, -ENOMEM, "redis tier: connection buffers") : -ENOMEM;
  const struct timeval tv = {st->timeout_ms / 1000, (st->timeout_ms % 1000) * 1000};
  errno = 0;
  redisContext *rc = redisConnectWithTimeout(host, port, tv);
  if (!rc)
    return for_open ? kvt_fail(st->ctx, -ENOMEM, "redis tier: connecting to %s", where) : -ENOMEM;
  if (rc->err) {
    const int e = rc->err == REDIS_ERR_IO && errno ? -errno : KVT_EBACKEND;
    if (for_open)
      kvt_fail(st->ctx, e, "redis tier: cannot connect to %s: %s", where, rc->errstr);
    redisFree(rc);
    return e;
  }
  if (redisSetTimeout(rc, tv) != REDIS_OK) {
    redisFree(rc);
    return for_open ? kvt_fail(st->ctx, KVT_EBACKEND, "redis tier: %s: setting timeouts", where)
                    : KVT_EBACKEND;
  }
  c->rc = rc;
  c->fd = rc->fd;
  c->rpos = c->rlen = 0;
  c->niov = 0;
  c->arena_used = 0;
  const int err = conn_setup(st, c, where, for_open);
  if (err)
    rd_conn_close(st, c);
  return err;
}

/* Connects c to node unless the node is backing off; logs the first failure
 * and the recovery. */
int rd_conn_open(rd_state *st, int node, rd_conn *c, int for_open) {
  char host[256];
  int port;
  pthread_mutex_lock(&st->map_mu);
  rd_node *n = &st->nodes[node];
  const uint64_t now = rd_now_ms();
  if (n->backoff_ms && now < n->next_try_ms && !for_open) {
    const int e = n->last_err;
    pthread_mutex_unlock(&st->map_mu);
    return e;
  }
  snprintf(host, sizeof(host), "%s", n->host);
  port = n->port;
  pthread_mutex_unlock(&st->map_mu);
  const int rc = rd_conn_connect(st, host, port, c, for_open);
  pthread_mutex_lock(&st->map_mu);
  if (rc) {
    if (!n->backoff_ms)
      kvt_logf(st->ctx, KVT_LOG_WARN, "redis tier: %s:%d: connect failed: %s; retrying with backoff",
               host, port, kvt_strerror(rc));
    n->backoff_ms = n->backoff_ms ? (n->backoff_ms * 2 > 1000 ? 1000 : n->backoff_ms * 2) : 50;
    n->next_try_ms = rd_now_ms() + n->backoff_ms;
    n->last_err = rc;
    st->map_stale = st->cluster;
  } else if (n->backoff_ms) {
    kvt_logf(st->ctx, KVT_LOG_INFO, "redis tier: %s:%d: reconnected", host, port);
    n->backoff_ms = 0;
  }
  pthread_mutex_unlock(&st->map_mu);
  return rc;
}

/* ---- cluster slot map ---- */

static int node_find_locked(rd_state *st, const char *host, int port) {
  for (int i = 0; i < st->nnodes; i++)
    if (st->nodes[i].port == port && strcmp(st->nodes[i].host, host) == 0)
      return i;
  if (st->nnodes == RD_MAX_NODES)
    return -1;
  rd_node *n = &st->nodes[st->nnodes];
  memset(n, 0, sizeof(*n));
  snprintf(n->host, sizeof(n->host), "%s", host);
  n->port = port;
  return st->nnodes++;
}

int rd_node_add(rd_state *st, const char *host, int port) {
  pthread_mutex_lock(&st->map_mu);
  const int i = node_find_locked(st, host, port);
  pthread_mutex_unlock(&st->map_mu);
  return i;
}

int rd_node_of_slot(rd_state *st, unsigned slot) {
  if (!st->cluster)
    return 0;
  pthread_mutex_lock(&st->map_mu);
  const int n = st->slot_node[slot & (RD_SLOTS - 1)];
  pthread_mutex_unlock(&st->map_mu);
  return n == RD_NO_NODE ? -1 : n;
}

/* Applies a CLUSTER SLOTS reply: [[start, end, [host, port, ...], ...], ...]. */
static int apply_slots(rd_state *st, const redisReply *r, const char *seed_host) {
  if (r->type != REDIS_REPLY_ARRAY)
    return KVT_EPROTO;
  uint8_t map[RD_SLOTS];
  memset(map, RD_NO_NODE, sizeof(map));
  pthread_mutex_lock(&st->map_mu);
  for (size_t i = 0; i < r->elements; i++) {
    const redisReply *e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[2]->type != REDIS_REPLY_ARRAY ||
        e->element[2]->elements < 2)
      continue;
    const long long lo = e->element[0]->integer, hi = e->element[1]->integer;
    const redisReply *m = e->element[2];
    const char *host = m->element[0]->type == REDIS_REPLY_STRING && m->element[0]->len &&
                               strcmp(m->element[0]->str, "?") != 0
                           ? m->element[0]->str
                           : seed_host;
    const int node = node_find_locked(st, host, (int)m->element[1]->integer);
    if (node < 0 || lo < 0 || hi >= RD_SLOTS || lo > hi)
      continue;
    memset(map + lo, node, (size_t)(hi - lo + 1));
  }
  memcpy(st->slot_node, map, sizeof(map));
  st->map_stale = 0;
  pthread_mutex_unlock(&st->map_mu);
  return 0;
}

/* Learns the slot map from the first node that answers CLUSTER SLOTS; at
 * most every 100 ms unless for_open. */
int rd_refresh_map(rd_state *st, int for_open) {
  pthread_mutex_lock(&st->refresh_mu);
  const uint64_t now = rd_now_ms();
  if (!for_open && now < st->next_refresh_ms) {
    pthread_mutex_unlock(&st->refresh_mu);
    return 0;
  }
  st->next_refresh_ms = now + 100;
  pthread_mutex_lock(&st->map_mu);
  const int nnodes = st->nnodes;
  pthread_mutex_unlock(&st->map_mu);
  int rc = KVT_EBACKEND;
  for (int i = 0; i < nnodes; i++) {
    rd_conn c;
    memset(&c, 0, sizeof(c));
    c.fd = -1;
    rc = rd_conn_open(st, i, &c, 0);
    if (rc == 0) {
      const char *argv[2] = {"CLUSTER", "SLOTS"};
      const size_t lens[2] = {7, 5};
      redisReply *r = NULL;
      rc = rd_ctl(st, &c, 2, argv, lens, &r);
      if (!rc) {
        if (r->type == REDIS_REPLY_ERROR) {
          if (for_open)
            kvt_fail(st->ctx, KVT_EBACKEND, "redis tier: CLUSTER SLOTS: %s", r->str);
          rc = KVT_EBACKEND;
        } else {
          rc = apply_slots(st, r, st->nodes[i].host);
        }
        freeReplyObject(r);
      }
    }
    rd_conn_free(st, &c);
    if (rc == 0)
      break;
  }
  pthread_mutex_unlock(&st->refresh_mu);
  return rc;
}
