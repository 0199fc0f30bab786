/* kvtier/server.h - the cache server's engine as a library: the server that
 * kvtier-server runs (docs/SERVER.md), and a client for its counters.
 *
 * EXPERIMENTAL: these declarations may change in a minor release
 * (docs/API.md says what that means).
 *
 * A server keeps opaque values of its tenants in its own tiers (one tier, or
 * a DRAM cache tier in front of one that holds everything) and serves
 * fabric:// tiers (kvtier/tier.h) over libfabric: control messages, payload
 * bytes by RMA. Life cycle: kvt_server_create() opens the tiers, indexes
 * what the last one holds, binds the endpoint and starts the workers (it
 * accepts requests from then on); kvt_server_run() serves them until
 * kvt_server_stop(), then drains (requests in progress finish, up to 10 s;
 * new ones are answered -ESHUTDOWN); kvt_server_destroy() closes it all.
 *
 * Every function exists in every build: without libfabric, those that
 * serve or connect return KVT_ENOTSUP. */
#ifndef KVTIER_SERVER_H
#define KVTIER_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_server kvt_server;

#define KVT_SERVER_MAX_TENANTS 256
#define KVT_SERVER_TENANT_MAX 64 /* bytes of a tenant name */
#define KVT_SERVER_TOKEN_MAX 128 /* bytes of a tenant's token */
#define KVT_SERVER_TOKEN_MIN 16  /* bytes of a tenant's token, at least */

enum kvt_server_evict {
  KVT_SERVER_EVICT_LRU = 0, /* when full, drop the least recently used values */
  KVT_SERVER_EVICT_NONE = 1 /* when full, refuse PUTs with -ENOSPC */
};

typedef struct kvt_server_config {
  size_t struct_size;      /* sizeof(kvt_server_config): fields are only appended */
  const char *listen_host; /* address to bind; NULL: "127.0.0.1" (loopback) */
  const char *listen_port; /* NULL: "7474"; "0": any free port (kvt_server_address) */
  /* One tier spec, or a cache tier then the tier holding everything,
   * separated by ';' (e.g. "dram:4GiB;nvme:/var/lib/kvtier:100GiB"). NULL:
   * "dram:4GiB". */
  const char *tiers;
  /* n_tenants strings "NAME:TOKEN" (the first ':' ends the name; names of
   * 1..KVT_SERVER_TENANT_MAX bytes of [A-Za-z0-9._-], distinct; tokens of
   * KVT_SERVER_TOKEN_MIN..KVT_SERVER_TOKEN_MAX bytes: an empty or short one
   * is refused, never served). None: one tenant, "default", with an empty
   * token, which anyone who reaches the endpoint can use: only on a
   * loopback listen_host (127.0.0.0/8, ::1, "localhost") unless flags has
   * KVT_SERVER_INSECURE. Copied by kvt_server_create. */
  const char *const *tenants;
  size_t n_tenants;
  uint64_t max_request;  /* largest value, bytes; 0: 256 MiB */
  uint64_t max_inflight; /* payload bytes in flight per session; 0: 1 GiB */
  int evict;             /* enum kvt_server_evict */
  /* libfabric provider, e.g. "tcp;ofi_rxm" (NULL: that), "verbs;ofi_rxm",
   * "efa", or "auto" (the first of efa, verbs;ofi_rxm, tcp;ofi_rxm that opens). */
  const char *provider;
  int workers; /* threads doing storage I/O, 1..256; 0: 4 */
  /* The server's own messages (a refused tenant at KVT_LOG_WARN, a failed
   * post or a drain that timed out at KVT_LOG_ERROR), one line each, from
   * the thread calling kvt_server_run(); levels above log_level are
   * dropped. NULL: none. The tiers log through the context instead. */
  kvt_log_fn log;
  void *log_opaque;
  int log_level;
  /* Appended after 0.3.0 (a config whose struct_size ends before it reads
   * as 0; 64 bits wide so that it lies past the 0.3.0 struct's tail
   * padding). KVT_SERVER_* flags; others are refused (-EINVAL). */
  uint64_t flags;
} kvt_server_config;

/* kvt_server_config.flags: without tenants, serve the tokenless "default"
 * tenant on any listen_host, not only a loopback one (kvtier-server
 * --insecure). */
#define KVT_SERVER_INSECURE 1ull

/* clang-format off */
#define KVT_SERVER_CONFIG_INIT                                                                     \
  { sizeof(kvt_server_config), NULL, NULL, NULL, NULL, 0, 0, 0, KVT_SERVER_EVICT_LRU, NULL, 0,     \
    NULL, NULL, KVT_LOG_WARN, 0 }
/* clang-format on */

/* Creates a server: opens cfg's tiers with ctx, indexes what the last tier
 * holds (a restart finds every value acknowledged before), binds the
 * endpoint and starts the workers. Receives are posted on return: a client
 * may connect before kvt_server_run() is called.
 *
 * ctx: must outlive the server; the server's tiers use it from its threads
 * (so its hooks must be thread-safe; the defaults are), and so the context
 * must not be used by another thread while the server runs. cfg is read
 * during the call only (strings copied). *out is written only on success.
 *
 * Returns 0; -EINVAL (NULL argument, a struct_size too small, a bad
 * tenant: its name, or a token empty, shorter than KVT_SERVER_TOKEN_MIN or
 * longer than KVT_SERVER_TOKEN_MAX; no tenants on a listen_host that is not
 * loopback without KVT_SERVER_INSECURE; unknown flags; a tier list of more
 * than two, workers out of range), KVT_EBACKEND (libfabric.so.1 could not
 * be loaded: it is loaded on first use, before any tier opens), KVT_ESPEC
 * or KVT_ENOTSUP (a tier spec), a tier's error, -ENOMEM, the provider's
 * error opening the endpoint (e.g. -EADDRINUSE), or KVT_ENOTSUP (built
 * without libfabric). Detail in kvt_ctx_last_error(ctx), naming the tenant
 * (never its token) or the host.
 * Thread-safety: like any call on ctx (one thread at a time). */
KVT_API int kvt_server_create(kvt_ctx *ctx, const kvt_server_config *cfg, kvt_server **out);

/* Serves until kvt_server_stop() (possibly called before), then drains:
 * requests in progress finish (up to 10 s), new ones are answered
 * -ESHUTDOWN. Runs in the calling thread (the network thread); the workers
 * are the server's own. Returns 0 once drained; -EINVAL (NULL, or a server
 * already run: a server runs once), KVT_ENOTSUP (no libfabric).
 * Thread-safety: one call per server; any thread. */
KVT_API int kvt_server_run(kvt_server *srv);

/* Asks kvt_server_run() to drain and return (or, before it runs, to return
 * at once). Async-signal-safe and thread-safe: may be called from a signal
 * handler or any thread, any number of times, until kvt_server_destroy().
 * Returns 0, -EINVAL (NULL) or KVT_ENOTSUP (no libfabric). */
KVT_API int kvt_server_stop(kvt_server *srv);

/* The address the endpoint is bound to (the port chosen for port "0"):
 * host as text (IPv4 or IPv6, NUL-terminated, in host[0..host_cap)) and
 * port. Returns 0; -EINVAL (NULL argument), KVT_ENOBUFS (host_cap too
 * small), KVT_ENOTSUP (not an IP endpoint, or no libfabric).
 * Thread-safety: any thread, while the server exists. */
KVT_API int kvt_server_address(const kvt_server *srv, char *host, size_t host_cap, uint16_t *port);

/* The libfabric provider the endpoint uses (as "auto" resolved), owned by
 * the server; "" for NULL or without libfabric. Thread-safety: any thread. */
KVT_API const char *kvt_server_provider(const kvt_server *srv);

/* Closes the server: stops and joins the workers, closes the endpoint and
 * the tiers (every acknowledged PUT is already durable in an nvme tier).
 * Not while kvt_server_run() is running: stop it and let it return first.
 * Accepts NULL. Thread-safety: one call, after run returned (or never ran). */
KVT_API void kvt_server_destroy(kvt_server *srv);

/* Whether name is a valid tenant name: 1..KVT_SERVER_TENANT_MAX bytes of
 * [A-Za-z0-9._-]. Returns 1 or 0. Thread-safe; in every build. */
KVT_API int kvt_server_tenant_valid(const char *name);

/* ---- the counters of a running server (what `kvtier-server --stats` prints) ---- */

/* Fetches the counters of the server at host:port: one HELLO, one STATS,
 * one BYE, each waited for at most 5 s. tenant NULL or "": a stats-only
 * session (the tenant counters are 0); else tenant and token authenticate
 * and the tenant counters are filled. provider as in kvt_server_config.
 * values[0..cap) receive the counters in the order of kvt_server_stat_name
 * (those the server did not send are 0); *count (may be NULL) gets how many
 * were written: min(cap, the number of names).
 * Returns 0; -EINVAL (NULL argument); KVT_EBACKEND (libfabric.so.1 could
 * not be loaded); the provider's error opening an endpoint; -ECONNREFUSED
 * (nobody listens at host:port: the connection was refused, after about
 * 1.5 s); -ETIMEDOUT (no reply in time); KVT_EAUTH (tenant refused);
 * another status the server replied; KVT_ENOTSUP (built without
 * libfabric). Detail in kvt_ctx_last_error(ctx), naming host:port once an
 * endpoint opened. Thread-safety: like any call on ctx. */
KVT_API int kvt_server_stats_fetch(kvt_ctx *ctx, const char *host, const char *port,
                                   const char *provider, const char *tenant, const char *token,
                                   uint64_t *values, size_t cap, size_t *count);

/* The name of counter i ("capacity_bytes", "puts_total", ...: a name
 * ending in "_total" counts up, the others are gauges), or NULL past the
 * last (and always NULL without libfabric). Counters are only appended.
 * Thread-safe. */
KVT_API const char *kvt_server_stat_name(size_t i);

#ifdef __cplusplus
}
#endif

#endif
