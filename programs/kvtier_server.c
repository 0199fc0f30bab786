/* programs/kvtier_server.c - kvtier-server: serves payloads from its own DRAM
 * and NVMe tiers to fabric:// clients over libfabric (see docs/SERVER.md).
 * Only the main: options, tenants, signals, the ready line, and `--stats
 * ADDRESS` printing a running server's counters in Prometheus text format.
 * The engine is libkvtier's (kvtier/server.h). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "kvtier.h"

static const char usage[] =
    "usage: kvtier-server [options]\n"
    "       kvtier-server --stats HOST:PORT [--tenant NAME:TOKEN] [--provider P]\n"
    "\n"
    "Serves put/get/exists/delete/list/stats to fabric:// tiers over libfabric:\n"
    "control messages, payload bytes by RMA. Values live in --tiers: one tier,\n"
    "or a DRAM cache tier in front of an NVMe tier that holds everything\n"
    "(written through, so a restart finds every acknowledged value).\n"
    "\n"
    "options:\n"
    "  --listen HOST:PORT      address to bind (default 127.0.0.1:7474; port 0: any,\n"
    "                          printed in the ready line)\n"
    "  --tiers SPEC            default \"dram:4GiB\"; e.g.\n"
    "                          \"dram:4GiB;nvme:/var/lib/kvtier:100GiB\"\n"
    "  --tenant NAME:TOKEN     a tenant namespace and its shared secret, 16 to 128\n"
    "                          bytes (repeat); an empty or shorter token is refused.\n"
    "                          Without any: tenant \"default\" with an empty token,\n"
    "                          on a loopback --listen only (127.0.0.0/8, ::1,\n"
    "                          localhost) unless --insecure\n"
    "  --tenants FILE          NAME:TOKEN lines ('#' comments), at least one\n"
    "  --insecure              serve the tokenless \"default\" tenant on any address\n"
    "  --max-request SIZE      largest value accepted (default 256MiB): larger PUTs\n"
    "                          are refused with KVT_ETOOBIG\n"
    "  --max-inflight SIZE     payload bytes in flight per client (default 1GiB);\n"
    "                          requests beyond wait for earlier ones\n"
    "  --evict lru|none        when full: drop least recently used values (default),\n"
    "                          or refuse PUTs with -ENOSPC\n"
    "  --provider NAME         libfabric provider (default tcp;ofi_rxm; auto: the first\n"
    "                          of efa, verbs;ofi_rxm, tcp;ofi_rxm that opens)\n"
    "  --workers N             threads for storage I/O (default 4)\n"
    "  --quiet                 no log lines but the ready line\n"
    "  --stats HOST:PORT       print a running server's counters (Prometheus text)\n"
    "  --help\n"
    "\n"
    "SIGTERM or SIGINT: finish requests in progress (up to 10 s), close the tiers,\n"
    "exit 0. Prints \"kvtier-server: ready on HOST:PORT ...\" once serving.\n"
    "\n"
    "Exit status: 0 stopped by a signal after serving, or --stats printed; 1 the\n"
    "server could not start (a tier, the endpoint, libfabric) or failed, or --stats\n"
    "got no counters (nothing listening, tenant refused, no reply); 2 bad usage (an\n"
    "option, a tenant or token, no --tenant on a non-loopback --listen).\n";

/* A signal before the server exists is remembered and passed on once it does. */
static volatile sig_atomic_t stop_flag;
static kvt_server *volatile the_server;

static void on_signal(int sig) {
  (void)sig;
  stop_flag = 1;
  kvt_server *srv = the_server;
  if (srv)
    kvt_server_stop(srv); /* async-signal-safe */
}

typedef struct tenant_opt {
  char name[KVT_SERVER_TENANT_MAX + 1];
  char token[KVT_SERVER_TOKEN_MAX + 1];
  char spec[KVT_SERVER_TENANT_MAX + KVT_SERVER_TOKEN_MAX + 2]; /* NAME:TOKEN */
} tenant_opt;

typedef struct opts {
  const char *listen, *tiers, *provider, *stats_addr;
  uint64_t max_request, max_inflight;
  int workers, evict, quiet, insecure;
  tenant_opt tenants[KVT_SERVER_MAX_TENANTS];
  int n_tenants;
} opts;

/* NAME:TOKEN from where (an option or FILE:LINE). Messages name the
 * tenant, never the token. */
static int add_tenant(opts *o, const char *spec, const char *where) {
  const char *colon = strchr(spec, ':');
  const size_t nl = colon ? (size_t)(colon - spec) : 0;
  if (!colon || nl == 0 || nl > KVT_SERVER_TENANT_MAX) {
    fprintf(stderr, "kvtier-server: %s: '%.*s': expected NAME:TOKEN\n", where,
            colon ? (int)nl : KVT_SERVER_TENANT_MAX, spec);
    return -1;
  }
  if (o->n_tenants == KVT_SERVER_MAX_TENANTS) {
    fprintf(stderr, "kvtier-server: more than %d tenants\n", KVT_SERVER_MAX_TENANTS);
    return -1;
  }
  tenant_opt *t = &o->tenants[o->n_tenants];
  memcpy(t->name, spec, nl);
  t->name[nl] = 0;
  snprintf(t->token, sizeof(t->token), "%s", colon + 1);
  if (!kvt_server_tenant_valid(t->name)) {
    fprintf(stderr, "kvtier-server: %s: tenant '%s': 1-64 of [A-Za-z0-9._-]\n", where, t->name);
    return -1;
  }
  /* An empty token is what `--tenant NAME:$(cat FILE)` gives when FILE is
   * missing: refused, like a short one, rather than served to anyone. */
  const size_t tl = strlen(colon + 1);
  if (tl < KVT_SERVER_TOKEN_MIN || tl > KVT_SERVER_TOKEN_MAX) {
    char what[64] = "empty token";
    if (tl)
      snprintf(what, sizeof(what), "token of %zu bytes", tl);
    fprintf(stderr, "kvtier-server: %s: tenant '%s': %s (a token is %d to %d bytes)\n", where,
            t->name, what, KVT_SERVER_TOKEN_MIN, KVT_SERVER_TOKEN_MAX);
    return -1;
  }
  for (int i = 0; i < o->n_tenants; i++)
    if (strcmp(o->tenants[i].name, t->name) == 0) {
      fprintf(stderr, "kvtier-server: %s: tenant '%s' given twice\n", where, t->name);
      return -1;
    }
  snprintf(t->spec, sizeof(t->spec), "%s", spec);
  o->n_tenants++;
  return 0;
}

static int read_tenants(opts *o, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "kvtier-server: --tenants %s: %s\n", path, strerror(errno));
    return -1;
  }
  char *line = NULL; /* whole lines: a long comment's tail is no tenant line */
  size_t cap = 0;
  int rc = 0, n = 0;
  const int before = o->n_tenants;
  while (rc == 0 && getline(&line, &cap, f) >= 0) {
    n++;
    line[strcspn(line, "\r\n")] = 0;
    const char *p = line + strspn(line, " \t");
    if (*p == 0 || *p == '#')
      continue;
    char where[600];
    snprintf(where, sizeof(where), "%s:%d", path, n);
    rc = add_tenant(o, p, where);
  }
  free(line);
  fclose(f);
  /* A file with no tenant (tokens not written yet) is not "no --tenant":
   * that would serve the tokenless default tenant. */
  if (rc == 0 && o->n_tenants == before) {
    fprintf(stderr, "kvtier-server: --tenants %s: no NAME:TOKEN line\n", path);
    rc = -1;
  }
  return rc;
}

/* HOST:PORT or [HOST6]:PORT into host and port buffers. */
static int split_addr(const char *a, char *host, size_t hcap, char *port, size_t pcap) {
  const char *colon = strrchr(a, ':');
  if (!colon || colon == a || !colon[1])
    return -1;
  const char *h = a;
  size_t hl = (size_t)(colon - a);
  if (a[0] == '[' && colon[-1] == ']') {
    h = a + 1;
    hl -= 2;
  }
  if (hl == 0 || hl >= hcap || strlen(colon + 1) >= pcap)
    return -1;
  memcpy(host, h, hl);
  host[hl] = 0;
  strcpy(port, colon + 1);
  char *end;
  const long p = strtol(port, &end, 10);
  return *end || p < 0 || p > 65535 ? -1 : 0;
}

static int parse_size_opt(const char *name, const char *v, uint64_t *out) {
  if (!v || kvt_parse_size(v, out) != 0 || *out == 0) {
    fprintf(stderr, "kvtier-server: %s '%s': expected a size, e.g. 64MiB\n", name, v ? v : "");
    return -1;
  }
  return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int used = 1, rc = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      exit(0);
    } else if (!strcmp(a, "--quiet")) {
      o->quiet = 1;
      used = 0;
    } else if (!strcmp(a, "--insecure")) {
      o->insecure = 1;
      used = 0;
    } else if (!v) {
      fprintf(stderr, "kvtier-server: %s: missing value (or unknown option; see --help)\n", a);
      return -1;
    } else if (!strcmp(a, "--listen")) {
      o->listen = v;
    } else if (!strcmp(a, "--tiers")) {
      o->tiers = v;
    } else if (!strcmp(a, "--provider")) {
      o->provider = v;
    } else if (!strcmp(a, "--stats")) {
      o->stats_addr = v;
    } else if (!strcmp(a, "--tenant")) {
      rc = add_tenant(o, v, "--tenant");
    } else if (!strcmp(a, "--tenants")) {
      rc = read_tenants(o, v);
    } else if (!strcmp(a, "--max-request")) {
      rc = parse_size_opt(a, v, &o->max_request);
    } else if (!strcmp(a, "--max-inflight")) {
      rc = parse_size_opt(a, v, &o->max_inflight);
    } else if (!strcmp(a, "--workers")) {
      o->workers = atoi(v);
      if (o->workers < 1 || o->workers > 256) {
        fprintf(stderr, "kvtier-server: --workers '%s': 1 to 256\n", v);
        rc = -1;
      }
    } else if (!strcmp(a, "--evict")) {
      o->evict = !strcmp(v, "lru") ? 1 : !strcmp(v, "none") ? 0 : -1;
      if (o->evict < 0) {
        fprintf(stderr, "kvtier-server: --evict '%s': lru or none\n", v);
        rc = -1;
      }
    } else {
      fprintf(stderr, "kvtier-server: unknown option '%s' (see --help)\n", a);
      return -1;
    }
    if (rc)
      return -1;
    i += used;
  }
  return 0;
}

/* ---- --stats ---- */

static int print_stats(const opts *o) {
  char host[256], port[16];
  if (split_addr(o->stats_addr, host, sizeof(host), port, sizeof(port))) {
    fprintf(stderr, "kvtier-server: --stats '%s': expected HOST:PORT\n", o->stats_addr);
    return 2;
  }
  kvt_ctx_config cc = KVT_CTX_CONFIG_INIT;
  kvt_ctx *ctx = NULL;
  if (kvt_ctx_create(&cc, &ctx) != 0)
    return 1;
  uint64_t v[64] = {0};
  size_t n = 0;
  const tenant_opt *t = o->n_tenants ? &o->tenants[0] : NULL; /* tenant counters too */
  const int rc = kvt_server_stats_fetch(ctx, host, port, o->provider, t ? t->name : NULL,
                                        t ? t->token : NULL, v, 64, &n);
  if (rc) {
    /* The detail names the server when a request failed, not when no
     * endpoint opened. */
    char where[300];
    snprintf(where, sizeof(where), "%s:%s: ", host, port);
    const char *err = kvt_ctx_last_error(ctx);
    if (strncmp(err, where, strlen(where)) == 0)
      fprintf(stderr, "kvtier-server --stats %s\n", err);
    else
      fprintf(stderr, "kvtier-server --stats: %s\n", err);
    kvt_ctx_destroy(ctx);
    return 1;
  }
  kvt_ctx_destroy(ctx);
  for (size_t i = 0; i < n; i++) {
    const char *name = kvt_server_stat_name(i);
    const size_t len = strlen(name);
    const int counter = len > 6 && strcmp(name + len - 6, "_total") == 0;
    printf("# TYPE kvtier_server_%s %s\nkvtier_server_%s %llu\n", name,
           counter ? "counter" : "gauge", name, (unsigned long long)v[i]);
  }
  return 0;
}

/* ---- serving ---- */

static void log_to_stderr(void *opaque, int level, const char *msg) {
  (void)opaque;
  fprintf(stderr, "kvtier-server: %s%s\n", level == KVT_LOG_ERROR ? "error: " : "", msg);
}

/* The server's own lines (kvt_server_config.log). */
static void server_log(void *opaque, int level, const char *msg) {
  (void)opaque, (void)level;
  fprintf(stderr, "kvtier-server: %s\n", msg);
}

/* As the library decides (server.c): 127.0.0.0/8, ::1 (also IPv4-mapped),
 * localhost. Checked here too so that the refusal is a usage error. */
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

static int serve(opts *o) {
  char host[256], port[16];
  if (split_addr(o->listen, host, sizeof(host), port, sizeof(port))) {
    fprintf(stderr, "kvtier-server: --listen '%s': expected HOST:PORT\n", o->listen);
    return 2;
  }
  const int loopback = host_is_loopback(host);
  if (o->n_tenants == 0 && !loopback && !o->insecure) {
    fprintf(stderr,
            "kvtier-server: --listen %s is not loopback and no --tenant is given: the tenant "
            "\"default\" has no token, so anyone who reaches it could read and write every "
            "value; give --tenant NAME:TOKEN (or --insecure)\n",
            o->listen);
    return 2;
  }
  if (o->n_tenants == 0 && !o->quiet)
    fprintf(stderr, "kvtier-server: no --tenant given: one tenant, \"default\", empty token%s\n",
            loopback ? "" : " (--insecure: anyone who reaches the server may use it)");
  kvt_ctx_config cc = KVT_CTX_CONFIG_INIT;
  cc.log = log_to_stderr;
  cc.log_level = o->quiet ? KVT_LOG_ERROR : KVT_LOG_WARN;
  kvt_ctx *ctx = NULL;
  if (kvt_ctx_create(&cc, &ctx) != 0)
    return 1;
  const char *specs[KVT_SERVER_MAX_TENANTS];
  for (int i = 0; i < o->n_tenants; i++)
    specs[i] = o->tenants[i].spec;
  kvt_server_config sc = KVT_SERVER_CONFIG_INIT;
  sc.listen_host = host;
  sc.listen_port = port;
  sc.tiers = o->tiers;
  sc.tenants = specs;
  sc.n_tenants = (size_t)o->n_tenants;
  sc.max_request = o->max_request;
  sc.max_inflight = o->max_inflight;
  sc.evict = o->evict ? KVT_SERVER_EVICT_LRU : KVT_SERVER_EVICT_NONE;
  sc.provider = o->provider;
  sc.workers = o->workers;
  sc.log = server_log;
  sc.log_level = o->quiet ? KVT_LOG_ERROR : KVT_LOG_WARN;
  sc.flags = o->insecure ? KVT_SERVER_INSECURE : 0;
  kvt_server *srv = NULL;
  int rc = kvt_server_create(ctx, &sc, &srv);
  if (rc) {
    fprintf(stderr, "kvtier-server: %s\n", kvt_ctx_last_error(ctx));
    kvt_ctx_destroy(ctx);
    return 1;
  }
  the_server = srv;
  if (stop_flag) /* a signal came while it was being created */
    kvt_server_stop(srv);
  char bound[64] = "?";
  uint16_t bound_port = 0;
  if (kvt_server_address(srv, bound, sizeof(bound), &bound_port) != 0)
    snprintf(bound, sizeof(bound), "?");
  printf("kvtier-server: ready on %s:%u (provider %s, %d tenants)\n", bound, (unsigned)bound_port,
         kvt_server_provider(srv), o->n_tenants ? o->n_tenants : 1);
  fflush(stdout);
  rc = kvt_server_run(srv);
  the_server = NULL;
  kvt_server_destroy(srv);
  kvt_ctx_destroy(ctx);
  if (rc == 0 && !o->quiet)
    fprintf(stderr, "kvtier-server: stopped\n");
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  static opts o;
  o.listen = "127.0.0.1:7474";
  o.tiers = "dram:4GiB";
  o.provider = NULL; /* the library's default, tcp;ofi_rxm */
  o.max_request = 256ull << 20;
  o.max_inflight = 1ull << 30;
  o.workers = 4;
  o.evict = 1;
  if (parse_args(argc, argv, &o))
    return 2;
  if (o.stats_addr)
    return print_stats(&o);
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  return serve(&o);
}
