/* programs/kvtier_server.c - kvtier-server: serves payloads from its own DRAM
 * and NVMe tiers to fabric:// clients over libfabric (see docs/SERVER.md).
 * This file: options, tenants, signals, and `--stats ADDRESS`, a client that
 * prints a running server's counters in Prometheus text format. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "kvt_internal.h"
#include "kvt_transport.h"
#include "server_internal.h"

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
    "  --tenant NAME:TOKEN     a tenant namespace and its shared secret (repeat);\n"
    "                          without any, tenant \"default\" with an empty token\n"
    "  --tenants FILE          NAME:TOKEN lines ('#' comments)\n"
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
    "exit 0. Prints \"kvtier-server: ready on HOST:PORT ...\" once serving.\n";

static volatile sig_atomic_t stop_flag;
static int wake_fd = -1;

static void on_signal(int sig) {
  (void)sig;
  stop_flag = 1;
  const uint64_t one = 1;
  ssize_t w = write(wake_fd, &one, sizeof(one)); /* async-signal-safe */
  (void)w;
}

typedef struct opts {
  const char *listen, *tiers, *provider, *stats_addr;
  uint64_t max_request, max_inflight;
  int workers, evict, quiet;
  srv_tenant tenants[SRV_MAX_TENANTS];
  int n_tenants;
} opts;

static int add_tenant(opts *o, const char *spec, const char *where) {
  const char *colon = strchr(spec, ':');
  const size_t nl = colon ? (size_t)(colon - spec) : 0;
  if (!colon || nl == 0 || nl > KVT_PROTO_TENANT_MAX || strlen(colon + 1) > KVT_PROTO_TOKEN_MAX) {
    fprintf(stderr, "kvtier-server: %s: '%s': expected NAME:TOKEN\n", where, spec);
    return -1;
  }
  if (o->n_tenants == SRV_MAX_TENANTS) {
    fprintf(stderr, "kvtier-server: more than %d tenants\n", SRV_MAX_TENANTS);
    return -1;
  }
  srv_tenant *t = &o->tenants[o->n_tenants];
  memcpy(t->name, spec, nl);
  t->name[nl] = 0;
  snprintf(t->token, sizeof(t->token), "%s", colon + 1);
  if (!kvt_proto_tenant_valid(t->name)) {
    fprintf(stderr, "kvtier-server: %s: tenant '%s': 1-64 of [A-Za-z0-9._-]\n", where, t->name);
    return -1;
  }
  for (int i = 0; i < o->n_tenants; i++)
    if (strcmp(o->tenants[i].name, t->name) == 0) {
      fprintf(stderr, "kvtier-server: %s: tenant '%s' given twice\n", where, t->name);
      return -1;
    }
  t->tag = kvt_hash64(t->name, strlen(t->name));
  o->n_tenants++;
  return 0;
}

static int read_tenants(opts *o, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "kvtier-server: --tenants %s: %s\n", path, strerror(errno));
    return -1;
  }
  char line[512];
  int rc = 0, n = 0;
  while (rc == 0 && fgets(line, sizeof(line), f)) {
    n++;
    line[strcspn(line, "\r\n")] = 0;
    const char *p = line + strspn(line, " \t");
    if (*p == 0 || *p == '#')
      continue;
    char where[600];
    snprintf(where, sizeof(where), "%s:%d", path, n);
    rc = add_tenant(o, p, where);
  }
  fclose(f);
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
    fprintf(stderr, "kvtier-server: %s '%s': expected a size, e.g. 64MiB\n", name,
            v ? v : "");
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

/* ---- --stats: a one-shot client ---- */

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

static int stats_fetch(const opts *o, const char *host, const char *port, uint64_t *v) {
  char err[512];
  kvt_fab *f = NULL;
  kvt_fab_config fc = {.provider = o->provider, .peer_node = host, .peer_service = port};
  int rc = kvt_fab_open(&fc, &f, err, sizeof(err));
  if (rc) {
    fprintf(stderr, "kvtier-server --stats: %s\n", err);
    return rc;
  }
  static uint8_t buf[2 * KVT_PROTO_MSG_MAX];
  kvt_fab_mr mr;
  uint64_t to = 0;
  uint8_t addr[KVT_PROTO_ADDR_MAX];
  size_t alen = sizeof(addr);
  rc = kvt_fab_mr_reg(f, buf, sizeof(buf), KVT_FAB_LOCAL, &mr);
  if (rc == 0)
    rc = kvt_fab_av_insert_host(f, host, port, &to);
  if (rc == 0)
    rc = kvt_fab_getname(f, addr, &alen);
  kvt_proto_msg m, r;
  if (rc == 0) {
    kvt_proto_init(&m, KVT_PROTO_HELLO, 1, 0);
    m.u.hello.addr = addr;
    m.u.hello.addr_len = (uint16_t)alen;
    if (o->n_tenants) { /* tenant counters too */
      strcpy(m.u.hello.tenant, o->tenants[0].name);
      strcpy(m.u.hello.token, o->tenants[0].token);
    }
    rc = rpc(f, to, buf, buf + KVT_PROTO_MSG_MAX, mr.desc, &m, &r);
  }
  if (rc == 0) {
    kvt_proto_init(&m, KVT_PROTO_STATS, 2, r.h.session);
    rc = rpc(f, to, buf, buf + KVT_PROTO_MSG_MAX, mr.desc, &m, &r);
  }
  if (rc == 0)
    memcpy(v, r.u.stats.v, sizeof(r.u.stats.v));
  else
    fprintf(stderr, "kvtier-server --stats %s:%s: %s\n", host, port, kvt_strerror(rc));
  if (rc == 0) {
    kvt_proto_init(&m, KVT_PROTO_BYE, 3, r.h.session);
    size_t len = 0;
    kvt_fab_ctx ctx = {0};
    if (kvt_proto_encode(&m, buf, KVT_PROTO_MSG_MAX, &len) == 0 &&
        kvt_fab_send(f, to, buf, len, mr.desc, &ctx) == 0)
      for (int i = 0; i < 100; i++) { /* let it leave before the endpoint closes */
        kvt_fab_comp c[2];
        if (kvt_fab_poll(f, c, 2) > 0)
          break;
        kvt_fab_wait(f, -1, 2);
      }
  }
  kvt_fab_mr_dereg(&mr);
  kvt_fab_close(f);
  return rc;
}

static int print_stats(const opts *o) {
  char host[256], port[16];
  if (split_addr(o->stats_addr, host, sizeof(host), port, sizeof(port))) {
    fprintf(stderr, "kvtier-server: --stats '%s': expected HOST:PORT\n", o->stats_addr);
    return 2;
  }
  uint64_t v[KVT_STAT_COUNT] = {0};
  if (stats_fetch(o, host, port, v))
    return 1;
  for (int i = 0; i < KVT_STAT_COUNT; i++) {
    const char *name = kvt_proto_stat_name(i);
    const size_t n = strlen(name);
    const int counter = n > 6 && strcmp(name + n - 6, "_total") == 0;
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

static int serve(opts *o) {
  char host[256], port[16];
  if (split_addr(o->listen, host, sizeof(host), port, sizeof(port))) {
    fprintf(stderr, "kvtier-server: --listen '%s': expected HOST:PORT\n", o->listen);
    return 2;
  }
  if (o->n_tenants == 0) {
    add_tenant(o, "default:", "default");
    if (!o->quiet)
      fprintf(stderr, "kvtier-server: no --tenant given: one tenant, \"default\", empty token\n");
  }
  kvt_ctx_config cc = KVT_CTX_CONFIG_INIT;
  cc.log = log_to_stderr;
  cc.log_level = o->quiet ? KVT_LOG_ERROR : KVT_LOG_WARN;
  kvt_ctx *ctx = NULL;
  if (kvt_ctx_create(&cc, &ctx) != 0)
    return 1;
  srv_store *st = NULL;
  char err[1024] = "";
  int rc = srv_store_open(ctx, o->tiers, o->evict, o->tenants, o->n_tenants, &st, err,
                          sizeof(err));
  if (rc) {
    fprintf(stderr, "kvtier-server: %s\n", err);
    kvt_ctx_destroy(ctx);
    return 1;
  }
  srv_config sc = {host, port, o->provider, o->max_request, o->max_inflight, o->workers,
                   o->tenants, o->n_tenants, o->quiet};
  rc = srv_net_run(&sc, st, &stop_flag, wake_fd);
  srv_store_close(st); /* every acknowledged PUT is already durable in an nvme tier */
  kvt_ctx_destroy(ctx);
  if (rc == 0 && !o->quiet)
    fprintf(stderr, "kvtier-server: stopped\n");
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  static opts o;
  o.listen = "127.0.0.1:7474";
  o.tiers = "dram:4GiB";
  o.provider = KVT_FAB_DEFAULT_PROVIDER;
  o.max_request = 256ull << 20;
  o.max_inflight = 1ull << 30;
  o.workers = 4;
  o.evict = 1;
  if (parse_args(argc, argv, &o))
    return 2;
  if (o.stats_addr)
    return print_stats(&o);
  wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    perror("kvtier-server: eventfd");
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  const int rc = serve(&o);
  close(wake_fd);
  return rc;
}
