/* server/server.c - the server's public face (kvtier/server.h): a config
 * checked and copied, the store opened, the network side started, run,
 * stopped (from a signal handler too) and closed, the bound address. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
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

_Static_assert(KVT_SERVER_TOKEN_MAX == KVT_PROTO_TOKEN_MAX, "a token fits a HELLO");

/* "NAME:TOKEN" into t (the first ':' ends the name). The token is checked
 * unless tokenless (the default tenant). The detail names the tenant, never
 * the token. */
static int parse_tenant(kvt_ctx *ctx, const char *spec, int tokenless, kvt_srv_tenant *t) {
  const char *colon = spec ? strchr(spec, ':') : NULL;
  const size_t nl = colon ? (size_t)(colon - spec) : 0;
  if (!colon || nl == 0 || nl > KVT_PROTO_TENANT_MAX)
    return kvt_fail(ctx, -EINVAL, "tenant '%.*s': expected NAME:TOKEN",
                    colon ? (int)nl : (int)KVT_PROTO_TENANT_MAX, spec ? spec : "(null)");
  memcpy(t->name, spec, nl);
  t->name[nl] = 0;
  if (!kvt_proto_tenant_valid(t->name))
    return kvt_fail(ctx, -EINVAL, "tenant '%s': 1-64 of [A-Za-z0-9._-]", t->name);
  const size_t tl = strlen(colon + 1);
  if (!tokenless && tl == 0)
    return kvt_fail(ctx, -EINVAL, "tenant '%s': empty token (a token is %d to %d bytes)", t->name,
                    KVT_SERVER_TOKEN_MIN, KVT_SERVER_TOKEN_MAX);
  if (!tokenless && (tl < KVT_SERVER_TOKEN_MIN || tl > KVT_SERVER_TOKEN_MAX))
    return kvt_fail(ctx, -EINVAL, "tenant '%s': token of %zu bytes (a token is %d to %d bytes)",
                    t->name, tl, KVT_SERVER_TOKEN_MIN, KVT_SERVER_TOKEN_MAX);
  snprintf(t->token, sizeof(t->token), "%s", colon + 1);
  t->tag = kvt_hash64(t->name, strlen(t->name));
  return 0;
}

/* Whether host names a loopback address: 127.0.0.0/8 (also IPv4-mapped),
 * ::1, or "localhost". Anything else, a name that may resolve to loopback
 * included, is taken as reachable from elsewhere. */
static int host_is_loopback(const char *host) {
  struct in_addr a4;
  struct in6_addr a6;
  if (strcasecmp(host, "localhost") == 0)
    return 1;
  if (inet_pton(AF_INET, host, &a4) == 1)
    return (ntohl(a4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, host, &a6) != 1)
    return 0;
  return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
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
  if (cfg->flags & ~KVT_SERVER_INSECURE)
    return kvt_fail(ctx, -EINVAL, "unknown flags %#llx", (unsigned long long)cfg->flags);
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
  if (cfg->n_tenants == 0 && !(cfg->flags & KVT_SERVER_INSECURE) && !host_is_loopback(sv->host))
    return kvt_fail(ctx, -EINVAL,
                    "listen host '%s' is not loopback and no tenant is given: the default tenant "
                    "has no token, so anyone reaching it could read and write every value (give "
                    "tenants, or KVT_SERVER_INSECURE)",
                    sv->host);
  if (!(sv->tenants = kvt_alloc(ctx, nt * sizeof(kvt_srv_tenant), _Alignof(kvt_srv_tenant))))
    return kvt_fail(ctx, -ENOMEM, "out of memory");
  memset(sv->tenants, 0, nt * sizeof(kvt_srv_tenant));
  for (size_t i = 0; i < nt && rc == 0; i++) {
    rc = parse_tenant(ctx, cfg->n_tenants ? cfg->tenants[i] : "default:", cfg->n_tenants == 0,
                      &sv->tenants[i]);
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
  /* Fields are only appended: a config of the 0.3.0 size (up to log_level
   * and its padding) reads the later ones as 0. */
  if (cfg->struct_size < offsetof(kvt_server_config, flags))
    return kvt_fail(ctx, -EINVAL, "kvt_server_config: struct_size %zu, at least %zu",
                    cfg->struct_size, offsetof(kvt_server_config, flags));
  kvt_server_config full = KVT_SERVER_CONFIG_INIT;
  memcpy(&full, cfg, cfg->struct_size < sizeof(full) ? cfg->struct_size : sizeof(full));
  cfg = &full;
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
