/* server/server_stub.c - kvtier/server.h in a build without libfabric: the
 * same symbols, so every build exports one list; serving and connecting
 * return KVT_ENOTSUP. */
#include <errno.h>
#include <string.h>

#include "kvt_internal.h"
#include "kvtier/server.h"

int kvt_server_create(kvt_ctx *ctx, const kvt_server_config *cfg, kvt_server **out) {
  if (!ctx || !cfg || !out)
    return -EINVAL;
  return kvt_fail(ctx, KVT_ENOTSUP, "kvtier was built without libfabric: no server");
}

int kvt_server_run(kvt_server *srv) { return srv ? KVT_ENOTSUP : -EINVAL; }

int kvt_server_stop(kvt_server *srv) { return srv ? KVT_ENOTSUP : -EINVAL; }

int kvt_server_address(const kvt_server *srv, char *host, size_t host_cap, uint16_t *port) {
  (void)host_cap;
  return srv && host && port ? KVT_ENOTSUP : -EINVAL;
}

const char *kvt_server_provider(const kvt_server *srv) {
  (void)srv;
  return "";
}

void kvt_server_destroy(kvt_server *srv) { (void)srv; }

/* The rule of transport/proto.c's kvt_proto_tenant_valid, which this build
 * does not compile. */
int kvt_server_tenant_valid(const char *name) {
  const size_t n = name ? strlen(name) : 0;
  if (n == 0 || n > KVT_SERVER_TENANT_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return 0;
  }
  return 1;
}

int kvt_server_stats_fetch(kvt_ctx *ctx, const char *host, const char *port, const char *provider,
                           const char *tenant, const char *token, uint64_t *values, size_t cap,
                           size_t *count) {
  (void)provider, (void)tenant, (void)token;
  if (count)
    *count = 0;
  if (!ctx || !host || !port || (!values && cap))
    return -EINVAL;
  return kvt_fail(ctx, KVT_ENOTSUP, "kvtier was built without libfabric: no server client");
}

const char *kvt_server_stat_name(size_t i) {
  (void)i;
  return NULL;
}
