/* server/server.c - the server's public face (kvtier/server.h): a config
 * checked and copied, the store opened, the network side started, run,
 * stopped (from a signal handler too) and closed, the bound address. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server_net.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2,
               "kvt_server_stop stores an atomic_int in a signal handler");

void kvt_srv_log(kvt_server *sv, int level, const char *fmt, ...) {
  if (!sv->log || level > sv->log_level)
    return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  sv->log(sv->log_opaque, level, line);
}

int kvt_server_tenant_valid(const char *name) { return name && kvt_proto_tenant_valid(name); }

/* "NAME:TOKEN" into t (the first ':' ends the name). */
static int parse_tenant(kvt_ctx *ctx, const char *spec, kvt_srv_tenant *t) {
  const char *colon = spec ? strchr(spec, ':') : NULL;
  const size_t nl = colon ? (size_t)(colon - spec) : 0;
  if (!colon || nl == 0 || nl > KVT_PROTO_TENANT_MAX || strlen(colon + 1) > KVT_PROTO_TOKEN_MAX)
    return kvt_fail(ctx, -EINVAL, "tenant '%s': expected NAME:TOKEN", spec ? spec : "(null)");
  memcpy(t->name, spec, nl);
  t->name[nl] = 0;
  snprintf(t->token, sizeof(t->token), "%s", colon + 1);
  if (!kvt_proto_tenant_valid(t->name))
    return kvt_fail(ctx, -EINVAL, "tenant '%s': 1-64 of [A-Za-z0-9._-]", t->name);
  t->tag = kvt_hash64(t->name, strlen(t->name));
  return 0;
}

static int copy_str(kvt_ctx *ctx, char *dst, size_t cap, const char *src, const char *what) {
  if (strlen(src) >= cap)
    return kvt_fail(ctx, -EINVAL, "%s '%s': too long", what, src);
  memcpy(dst, src, strlen(src) + 1);
  return 0;
}

/* Copies cfg into sv->config and its buffers, defaults filled in. */
static int take_config(kvt_server *sv, const kvt_server_config *cfg) {
  kvt_ctx *ctx = sv->ctx;
  const size_t nt = cfg->n_tenants ? cfg->n_tenants : 1;
  if (cfg->n_tenants && !cfg->tenants)
    return kvt_fail(ctx, -EINVAL, "n_tenants %zu without tenants", cfg->n_tenants);
  if (nt > SRV_MAX_TENANTS)
    return kvt_fail(ctx, -EINVAL, "more than %d tenants", SRV_MAX_TENANTS);
  if (cfg->workers < 0 || cfg->workers > 256)
    return kvt_fail(ctx, -EINVAL, "workers %d: 1 to 256", cfg->workers);
  if (cfg->evict != KVT_SERVER_EVICT_LRU && cfg->evict != KVT_SERVER_EVICT_NONE)
    return kvt_fail(ctx, -EINVAL, "evict %d: KVT_SERVER_EVICT_LRU or _NONE", cfg->evict);
  int rc = copy_str(ctx, sv->host, sizeof(sv->host),
                    cfg->listen_host ? cfg->listen_host : "127.0.0.1", "listen host");
  if (rc == 0)
    rc = copy_str(ctx, sv->port, sizeof(sv->port), cfg->listen_port ? cfg->listen_port : "7474",
                  "listen port");
  if (rc == 0)
    rc = copy_str(ctx, sv->provider, sizeof(sv->provider),
                  cfg->provider ? cfg->provider : KVT_FAB_DEFAULT_PROVIDER, "provider");
  if (rc)
    return rc;
  if (!(sv->tenants = kvt_alloc(ctx, nt * sizeof(kvt_srv_tenant), _Alignof(kvt_srv_tenant))))
    return kvt_fail(ctx, -ENOMEM, "out of memory");
  memset(sv->tenants, 0, nt * sizeof(kvt_srv_tenant));
  for (size_t i = 0; i < nt && rc == 0; i++) {
    rc = parse_tenant(ctx, cfg->n_tenants ? cfg->tenants[i] : "default:", &sv->tenants[i]);
    for (size_t j = 0; j < i && rc == 0; j++)
      if (strcmp(sv->tenants[j].name, sv->tenants[i].name) == 0)
        rc = kvt_fail(ctx, -EINVAL, "tenant '%s' given twice", sv->tenants[i].name);
  }
  if (rc)
    return rc;
  sv->config = (kvt_srv_config){
      .host = sv->host,
      .port = sv->port,
      .provider = sv->provider,
      .max_request = cfg->max_request ? cfg->max_request : 256ull << 20,
      .max_inflight = cfg->max_inflight ? cfg->max_inflight : 1ull << 30,
      .workers = cfg->workers ? cfg->workers : 4,
      .tenants = sv->tenants,
      .n_tenants = (int)nt,
  };
  sv->cfg = &sv->config;
  sv->log = cfg->log;
  sv->log_opaque = cfg->log_opaque;
  sv->log_level = cfg->log_level;
  return 0;
}

int kvt_server_create(kvt_ctx *ctx, const kvt_server_config *cfg, kvt_server **out) {
  if (!ctx || !cfg || !out)
    return -EINVAL;
  kvt_clear_error(ctx);
  if (cfg->struct_size < sizeof(kvt_server_config))
    return kvt_fail(ctx, -EINVAL, "kvt_server_config: struct_size %zu, expected %zu",
                    cfg->struct_size, sizeof(kvt_server_config));
  kvt_server *sv = kvt_alloc(ctx, sizeof(*sv), 64);
  if (!sv)
    return kvt_fail(ctx, -ENOMEM, "out of memory");
  memset(sv, 0, sizeof(*sv));
  sv->ctx = ctx;
  sv->wake_fd = -1;
  int rc = take_config(sv, cfg);
  if (rc == 0) { /* libfabric loads (or is found missing) before a tier opens */
    char err[600];
    if ((rc = kvt_fab_load(err, sizeof(err))) != 0)
      kvt_fail(ctx, rc, "%s", err);
  }
  if (rc == 0 && (sv->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
    rc = kvt_fail(ctx, -errno, "eventfd: %s", strerror(errno));
  if (rc == 0) {
    char err[1024] = "";
    rc = kvt_srv_store_open(ctx, cfg->tiers ? cfg->tiers : "dram:4GiB",
                            cfg->evict == KVT_SERVER_EVICT_LRU, sv->tenants, sv->cfg->n_tenants,
                            &sv->st, err, sizeof(err));
    if (rc)
      kvt_fail(ctx, rc, "%s", err);
  }
  if (rc == 0)
    rc = kvt_srv_net_open(sv);
  if (rc) {
    kvt_server_destroy(sv);
    return rc;
  }
  *out = sv;
  return 0;
}

int kvt_server_run(kvt_server *srv) {
  if (!srv || atomic_exchange(&srv->ran, 1))
    return -EINVAL;
  kvt_srv_net_serve(srv);
  return 0;
}

int kvt_server_stop(kvt_server *srv) {
  if (!srv)
    return -EINVAL;
  atomic_store(&srv->stop, 1);
  const uint64_t one = 1;
  ssize_t w = write(srv->wake_fd, &one, sizeof(one)); /* async-signal-safe */
  (void)w;
  return 0;
}

int kvt_server_address(const kvt_server *srv, char *host, size_t host_cap, uint16_t *port) {
  if (!srv || !host || !port || !srv->fab)
    return -EINVAL;
  uint8_t addr[KVT_PROTO_ADDR_MAX];
  size_t len = sizeof(addr);
  int rc = kvt_fab_getname(srv->fab, addr, &len);
  if (rc)
    return rc;
  const struct sockaddr *sa = (const struct sockaddr *)addr;
  const void *ip = NULL;
  if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
    ip = &in->sin_addr;
    *port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    const struct sockaddr_in6 *in = (const struct sockaddr_in6 *)addr;
    ip = &in->sin6_addr;
    *port = ntohs(in->sin6_port);
  } else {
    return KVT_ENOTSUP;
  }
  if (host_cap > (size_t)INT32_MAX)
    host_cap = INT32_MAX;
  if (!inet_ntop(sa->sa_family, ip, host, (socklen_t)host_cap))
    return KVT_ENOBUFS;
  return 0;
}

const char *kvt_server_provider(const kvt_server *srv) {
  return srv && srv->fab ? kvt_fab_provider(srv->fab) : "";
}

void kvt_server_destroy(kvt_server *srv) {
  if (!srv)
    return;
  kvt_ctx *ctx = srv->ctx;
  kvt_srv_net_close(srv);
  kvt_srv_store_close(srv->st); /* every acknowledged PUT is already durable in an nvme tier */
  if (srv->wake_fd >= 0)
    close(srv->wake_fd);
  kvt_dealloc(ctx, srv->tenants);
  kvt_dealloc(ctx, srv);
}
