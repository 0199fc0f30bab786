/* server/server_stats.c - a one-shot client for a running server's counters
 * (kvt_server_stats_fetch: what `kvtier-server --stats` prints): HELLO,
 * STATS, BYE over an endpoint of its own. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kvt_internal.h"
#include "kvt_proto.h"
#include "kvt_transport.h"
#include "kvtier/server.h"

const char *kvt_server_stat_name(size_t i) {
  return i < KVT_STAT_COUNT ? kvt_proto_stat_name((int)i) : NULL;
}

/* Sends m and waits for its reply into *r (raw bytes in rbuf). */
static int rpc(kvt_fab *f, uint64_t to, uint8_t *sbuf, uint8_t *rbuf, void *desc,
               const kvt_proto_msg *m, kvt_proto_msg *r) {
  kvt_fab_ctx rctx = {0}, sctx = {0};
  size_t len = 0;
  int rc = kvt_proto_encode(m, sbuf, KVT_PROTO_MSG_MAX, &len);
  if (rc == 0)
    rc = kvt_fab_recv(f, rbuf, KVT_PROTO_MSG_MAX, desc, &rctx);
  if (rc == 0)
    rc = kvt_fab_send(f, to, sbuf, len, desc, &sctx);
  if (rc)
    return rc;
  int got = 0, sent = 0;
  const time_t deadline = time(NULL) + 5;
  while ((!got || !sent) && time(NULL) <= deadline) {
    kvt_fab_comp c[4];
    const int n = kvt_fab_poll(f, c, 4);
    if (n < 0)
      return n;
    for (int i = 0; i < n; i++) {
      if (c[i].err)
        return c[i].err;
      if (c[i].ctx == &sctx)
        sent = 1;
      if (c[i].ctx == &rctx) {
        got = 1;
        if ((rc = kvt_proto_decode(rbuf, c[i].len, r)) != 0)
          return rc;
      }
    }
    if (n == 0)
      kvt_fab_wait(f, -1, 10);
  }
  return got && sent ? r->h.status : -ETIMEDOUT;
}

/* Says BYE and lets it leave before the endpoint closes. */
static void bye(kvt_fab *f, uint64_t to, uint8_t *buf, void *desc, uint64_t session) {
  kvt_proto_msg m;
  kvt_proto_init(&m, KVT_PROTO_BYE, 3, session);
  size_t len = 0;
  kvt_fab_ctx ctx = {0};
  if (kvt_proto_encode(&m, buf, KVT_PROTO_MSG_MAX, &len) == 0 &&
      kvt_fab_send(f, to, buf, len, desc, &ctx) == 0)
    for (int i = 0; i < 100; i++) {
      kvt_fab_comp c[2];
      if (kvt_fab_poll(f, c, 2) > 0)
        break;
      kvt_fab_wait(f, -1, 2);
    }
}

/* HELLO (as tenant, or stats-only) then STATS into v. */
static int hello_stats(kvt_fab *f, uint64_t to, uint8_t *buf, void *desc, const char *tenant,
                       const char *token, uint64_t v[KVT_STAT_COUNT]) {
  uint8_t addr[KVT_PROTO_ADDR_MAX];
  size_t alen = sizeof(addr);
  int rc = kvt_fab_getname(f, addr, &alen);
  kvt_proto_msg m, r;
  if (rc == 0) {
    kvt_proto_init(&m, KVT_PROTO_HELLO, 1, 0);
    m.u.hello.addr = addr;
    m.u.hello.addr_len = (uint16_t)alen;
    if (tenant && tenant[0]) { /* tenant counters too */
      snprintf(m.u.hello.tenant, sizeof(m.u.hello.tenant), "%s", tenant);
      snprintf(m.u.hello.token, sizeof(m.u.hello.token), "%s", token ? token : "");
    }
    rc = rpc(f, to, buf, buf + KVT_PROTO_MSG_MAX, desc, &m, &r);
    /* The HELLO's send found no room for a second: the provider could not
     * connect (tcp;ofi_rxm retries a refused connect meanwhile). */
    if (rc == -EAGAIN)
      rc = -ECONNREFUSED;
  }
  if (rc == 0) {
    kvt_proto_init(&m, KVT_PROTO_STATS, 2, r.h.session);
    rc = rpc(f, to, buf, buf + KVT_PROTO_MSG_MAX, desc, &m, &r);
  }
  if (rc == 0) {
    memcpy(v, r.u.stats.v, sizeof(r.u.stats.v));
    bye(f, to, buf, desc, r.h.session);
  }
  return rc;
}

int kvt_server_stats_fetch(kvt_ctx *ctx, const char *host, const char *port, const char *provider,
                           const char *tenant, const char *token, uint64_t *values, size_t cap,
                           size_t *count) {
  if (!ctx || !host || !port || (!values && cap))
    return -EINVAL;
  kvt_clear_error(ctx);
  if (tenant &&
      (strlen(tenant) > KVT_PROTO_TENANT_MAX || (token && strlen(token) > KVT_PROTO_TOKEN_MAX)))
    return kvt_fail(ctx, -EINVAL, "tenant or token too long");
  char err[512];
  kvt_fab *f = NULL;
  kvt_fab_config fc = {.provider = provider ? provider : KVT_FAB_DEFAULT_PROVIDER,
                       .peer_node = host,
                       .peer_service = port};
  int rc = kvt_fab_open(&fc, &f, err, sizeof(err));
  if (rc)
    return kvt_fail(ctx, rc, "%s", err);
  uint8_t *buf = kvt_alloc(ctx, 2 * KVT_PROTO_MSG_MAX, 4096);
  kvt_fab_mr mr = {0};
  uint64_t to = 0;
  uint64_t v[KVT_STAT_COUNT] = {0};
  rc = buf ? kvt_fab_mr_reg(f, buf, 2 * KVT_PROTO_MSG_MAX, KVT_FAB_LOCAL, &mr) : -ENOMEM;
  if (rc == 0)
    rc = kvt_fab_av_insert_host(f, host, port, &to);
  if (rc == 0)
    rc = hello_stats(f, to, buf, mr.desc, tenant, token, v);
  if (rc == -ECONNREFUSED)
    kvt_fail(ctx, rc, "%s:%s: nothing is listening (connection refused)", host, port);
  else if (rc)
    kvt_fail(ctx, rc, "%s:%s: %s", host, port, kvt_strerror(rc));
  kvt_fab_mr_dereg(&mr);
  kvt_fab_close(f);
  kvt_dealloc(ctx, buf);
  const size_t n = cap < KVT_STAT_COUNT ? cap : KVT_STAT_COUNT;
  if (rc == 0 && n)
    memcpy(values, v, n * sizeof(*v));
  if (count)
    *count = rc == 0 ? n : 0;
  return rc;
}
