/* bench/cli_bench_fabric.c - `kvtier bench fabric`: PUT and GET throughput
 * of the fabric:// tier against a kvtier-server, next to fi_pingpong's
 * bandwidth with the same provider and message size measured in the same
 * run on the same machine (STYLE.md: a ratio against a baseline). */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_util.h"

static const char fabric_help[] =
    "Usage: kvtier bench fabric [--size 4MiB] [--iters N] [--reps R] [--qd 1,4]\n"
    "                           [--provider tcp;ofi_rxm] [--server HOST:PORT]\n"
    "                           [--tiers dram:1GiB] [--json]\n"
    "\n"
    "Starts a kvtier-server on 127.0.0.1 (the one next to this program, with\n"
    "--tiers; or uses --server), then per repetition:\n"
    "  baseline: fi_pingpong -p CORE -e rdm -S SIZE -I ITERS, server and client on\n"
    "            127.0.0.1 (CORE: the provider's core, e.g. tcp for tcp;ofi_rxm,\n"
    "            which fi_pingpong runs under ofi_rxm for rdm); its MB/sec, the bytes\n"
    "            of one transfer over the time of one transfer;\n"
    "  tier:     --iters PUTs of SIZE bytes over 16 keys, then --iters GETs, with\n"
    "            each --qd operations in flight (kvt_tier_submit/kvt_tier_poll).\n"
    "Prints medians of --reps repetitions in MB/s (1e6 bytes/s) and tier/pingpong.\n"
    "GETs are checked against what was put once, outside the timed region.\n"
    "\n"
    "Options:\n"
    "  --size SIZE       payload and message size (4MiB)\n"
    "  --iters N         transfers per phase and repetition (200)\n"
    "  --reps R          repetitions, at least 3 (5)\n"
    "  --qd LIST         tier operations in flight, comma-separated (1,4)\n"
    "  --provider NAME   libfabric provider (tcp;ofi_rxm)\n"
    "  --server H:P      an already running kvtier-server (tenant default)\n"
    "  --tiers SPEC      the local server's tiers (dram:1GiB)\n"
    "  --json            machine-readable output\n";

#define MAX_QD 8
#define KEYS 16

typedef struct fb {
  const char *size_s, *qd_s, *provider, *server, *tiers;
  uint32_t iters, reps;
  int json;
  uint64_t size;
  uint32_t qd[MAX_QD];
  int n_qd;
  pid_t srv_pid;
  char addr[128];
  char core[64]; /* fi_pingpong's -p */
  char pp_cmd[512];
} fb;

/* ---- subprocesses ---- */

static int free_port(void) {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  int port = -1;
  if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(s, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (s >= 0)
    close(s);
  return port;
}

/* Runs argv with stdout into out (cap), waiting at most timeout_s. Returns
 * the exit status or -1. */
static int run_capture(char *const argv[], char *out, size_t cap, int timeout_s, pid_t *bg) {
  int fds[2];
  if (pipe(fds))
    return -1;
  const pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(fds[1]);
  if (bg) { /* a background server: leave it running */
    *bg = pid;
    close(fds[0]);
    return 0;
  }
  size_t got = 0;
  const double deadline = cli_now() + timeout_s;
  for (;;) {
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    if (cli_now() > deadline)
      break;
    if (poll(&p, 1, 100) <= 0)
      continue;
    const ssize_t r = read(fds[0], out + got, cap - 1 - got);
    if (r <= 0)
      break;
    got += (size_t)r;
    if (got == cap - 1)
      break;
  }
  out[got] = 0;
  close(fds[0]);
  int status = 0;
  if (cli_now() > deadline)
    kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* One fi_pingpong run: MB/s from the client's line, or 0. */
static double pingpong(fb *b) {
  const int port = free_port();
  char size[32], iters[32], ports[16];
  snprintf(size, sizeof(size), "%llu", (unsigned long long)b->size);
  snprintf(iters, sizeof(iters), "%u", b->iters);
  snprintf(ports, sizeof(ports), "%d", port);
  char *srv[] = {"fi_pingpong", "-p", b->core, "-e", "rdm", "-S", size, "-I", iters, "-B", ports,
                 NULL};
  char *cli[] = {"fi_pingpong", "-p", b->core, "-e", "rdm", "-S", size, "-I", iters, "-P", ports,
                 "127.0.0.1", NULL};
  snprintf(b->pp_cmd, sizeof(b->pp_cmd),
           "fi_pingpong -p %s -e rdm -S %s -I %s -B PORT & fi_pingpong -p %s -e rdm -S %s -I "
           "%s -P PORT 127.0.0.1",
           b->core, size, iters, b->core, size, iters);
  pid_t sp = 0;
  char out[4096];
  if (run_capture(srv, out, sizeof(out), 0, &sp) != 0)
    return 0;
  int rc = -1;
  for (int try = 0; try < 20 && rc != 0; try++) { /* until its control port listens */
    usleep(200000);
    rc = run_capture(cli, out, sizeof(out), 120, NULL);
    if (rc != 0 && !strstr(out, "failed to connect"))
      break;
  }
  int st;
  const double until = cli_now() + 10;
  while (waitpid(sp, &st, WNOHANG) == 0 && cli_now() < until)
    usleep(10000);
  kill(sp, SIGKILL);
  waitpid(sp, &st, 0);
  if (rc != 0)
    return 0;
  /* "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec", then the row. */
  const char *row = strstr(out, "Mxfers/sec");
  row = row ? strchr(row, '\n') : NULL;
  char c[6][32];
  double mbps = 0;
  if (row && sscanf(row, "%31s %31s %31s %31s %31s %lf", c[0], c[1], c[2], c[3], c[4], &mbps) == 6)
    return mbps;
  return 0;
}

static int start_server(fb *b, const char *self) {
  char bin[PATH_MAX];
  snprintf(bin, sizeof(bin), "%s", self);
  char *slash = strrchr(bin, '/');
  snprintf(slash ? slash + 1 : bin, sizeof(bin) - (size_t)(slash ? slash + 1 - bin : 0),
           "kvtier-server");
  char maxreq[32];
  snprintf(maxreq, sizeof(maxreq), "%llu", (unsigned long long)(b->size > (1u << 20) ? b->size : (1u << 20)));
  char *argv[] = {bin, "--listen", "127.0.0.1:0", "--quiet", "--tiers", (char *)b->tiers,
                  "--provider", (char *)b->provider, "--max-request", maxreq, NULL};
  int fds[2];
  if (access(bin, X_OK) != 0 || pipe(fds) != 0) {
    cli_error("bench fabric: %s not found (build it, or give --server)", bin);
    return CLI_EFAIL;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execv(bin, argv);
    _exit(127);
  }
  close(fds[1]);
  char line[512] = "";
  size_t got = 0;
  const double deadline = cli_now() + 15;
  while (cli_now() < deadline && !strchr(line, '\n') && got < sizeof(line) - 1) {
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    if (poll(&p, 1, 100) <= 0)
      continue;
    const ssize_t r = read(fds[0], line + got, sizeof(line) - 1 - got);
    if (r <= 0)
      break;
    got += (size_t)r;
    line[got] = 0;
  }
  close(fds[0]);
  const char *at = strstr(line, "ready on ");
  if (pid < 0 || !at) {
    cli_error("bench fabric: kvtier-server did not start");
    if (pid > 0)
      kill(pid, SIGKILL);
    return CLI_EFAIL;
  }
  b->srv_pid = pid;
  sscanf(at + 9, "%127s", b->addr);
  return 0;
}

static void stop_server(fb *b) {
  if (b->srv_pid > 0) {
    kill(b->srv_pid, SIGTERM);
    waitpid(b->srv_pid, NULL, 0);
  }
}

/* ---- the tier ---- */

static kvt_key bench_key(uint32_t i) {
  kvt_key k;
  memset(&k, 0xB7, sizeof(k));
  memcpy(k.bytes, &i, 4);
  return k;
}

/* iters ops of `opcode` with qd in flight; returns seconds, or < 0. */
static double tier_phase(kvt_tier *t, int opcode, uint8_t **bufs, uint64_t size, uint32_t iters,
                         uint32_t qd) {
  kvt_tier_op ops[MAX_QD], *done[MAX_QD];
  uint32_t issued = 0, completed = 0, free_n = qd;
  uint32_t free_ix[MAX_QD];
  for (uint32_t i = 0; i < qd; i++)
    free_ix[i] = i;
  const double t0 = cli_now();
  while (completed < iters) {
    while (free_n && issued < iters) {
      const uint32_t s = free_ix[--free_n];
      const kvt_key k = bench_key(issued % KEYS);
      kvt_tier_op_init(&ops[s], opcode, &k, bufs[s], size, s);
      kvt_tier_op *p = &ops[s];
      if (kvt_tier_submit(t, &p, 1) != 1)
        return -1;
      issued++;
    }
    const int n = kvt_tier_poll(t, done, qd, -1);
    for (int i = 0; i < n; i++) {
      if (done[i]->result != 0)
        return -1;
      free_ix[free_n++] = (uint32_t)done[i]->user_data;
      completed++;
    }
  }
  return cli_now() - t0;
}

static int parse_qd(fb *b) {
  char tmp[128];
  snprintf(tmp, sizeof(tmp), "%s", b->qd_s);
  char *save = NULL;
  for (char *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    const long v = strtol(t, NULL, 10);
    if (v < 1 || v > MAX_QD || b->n_qd == MAX_QD)
      return cli_usage_error("bench fabric", "--qd '%s': 1 to %d each", b->qd_s, MAX_QD);
    b->qd[b->n_qd++] = (uint32_t)v;
  }
  return b->n_qd ? 0 : cli_usage_error("bench fabric", "--qd: empty");
}

typedef struct result {
  double pp, put[MAX_QD], get[MAX_QD]; /* MB/s medians */
  double pp_lo, pp_hi, put_lo[MAX_QD], put_hi[MAX_QD], get_lo[MAX_QD], get_hi[MAX_QD];
} result;

static void span(const double *v, uint32_t n, double *lo, double *hi) {
  *lo = *hi = v[0];
  for (uint32_t i = 1; i < n; i++) {
    *lo = v[i] < *lo ? v[i] : *lo;
    *hi = v[i] > *hi ? v[i] : *hi;
  }
}

static int measure(fb *b, kvt_tier *t, uint8_t **bufs, result *res) {
  double *pp = calloc(b->reps, sizeof(double));
  double *put = calloc((size_t)b->reps * MAX_QD, sizeof(double));
  double *get = calloc((size_t)b->reps * MAX_QD, sizeof(double));
  if (!pp || !put || !get)
    return CLI_EFAIL;
  const double bytes = (double)b->size * b->iters;
  int rc = 0;
  for (uint32_t r = 0; r < b->reps && !rc; r++) {
    if ((pp[r] = pingpong(b)) <= 0) {
      cli_error("bench fabric: fi_pingpong failed or printed no bandwidth (%s)", b->pp_cmd);
      rc = CLI_EFAIL;
    }
    for (int q = 0; q < b->n_qd && !rc; q++) {
      const double ps = tier_phase(t, KVT_TIER_PUT, bufs, b->size, b->iters, b->qd[q]);
      const double gs = tier_phase(t, KVT_TIER_GET, bufs + MAX_QD, b->size, b->iters,
                                   b->qd[q]);
      if (ps <= 0 || gs <= 0) {
        cli_error("bench fabric: a tier operation failed");
        rc = CLI_EFAIL;
      }
      put[q * b->reps + r] = bytes / ps / 1e6;
      get[q * b->reps + r] = bytes / gs / 1e6;
    }
  }
  span(pp, b->reps, &res->pp_lo, &res->pp_hi);
  res->pp = cli_median(pp, b->reps);
  for (int q = 0; q < b->n_qd; q++) {
    span(put + q * b->reps, b->reps, &res->put_lo[q], &res->put_hi[q]);
    span(get + q * b->reps, b->reps, &res->get_lo[q], &res->get_hi[q]);
    res->put[q] = cli_median(put + q * b->reps, b->reps);
    res->get[q] = cli_median(get + q * b->reps, b->reps);
  }
  free(pp);
  free(put);
  free(get);
  return rc;
}

/* The GETs bring back what the PUTs stored (checked once, untimed). */
static int verify(fb *b, kvt_tier *t, uint8_t **bufs) {
  for (uint32_t k = 0; k < KEYS; k++) {
    const kvt_key key = bench_key(k);
    for (uint64_t i = 0; i < b->size; i += 4096)
      bufs[0][i] = (uint8_t)(k * 31 + i / 4096);
    if (kvt_tier_put(t, &key, bufs[0], b->size) != 0)
      return CLI_EFAIL;
    uint64_t len = 0;
    memset(bufs[1], 0, b->size);
    if (kvt_tier_get(t, &key, bufs[1], b->size, &len) != 0 || len != b->size ||
        memcmp(bufs[0], bufs[1], b->size) != 0) {
      cli_error("bench fabric: a GET did not return the bytes put");
      return CLI_EFAIL;
    }
  }
  return 0;
}

static void report(const fb *b, const result *r) {
  char cpu[128];
  cli_cpu_model(cpu, sizeof(cpu));
  if (b->json) {
    printf("{\"cpu\": ");
    cli_json_str(stdout, cpu);
    printf(", \"cpus\": %u, \"provider\": ", cli_cpu_count());
    cli_json_str(stdout, b->provider);
    printf(", \"size\": %llu, \"iters\": %u, \"reps\": %u, \"pingpong_MBps\": %.1f, \"tier\": [",
           (unsigned long long)b->size, b->iters, b->reps, r->pp);
    for (int q = 0; q < b->n_qd; q++)
      printf("%s{\"qd\": %u, \"put_MBps\": %.1f, \"get_MBps\": %.1f}", q ? ", " : "", b->qd[q],
             r->put[q], r->get[q]);
    printf("], \"pingpong_cmd\": ");
    cli_json_str(stdout, b->pp_cmd);
    printf("}\n");
    return;
  }
  printf("kvtier bench fabric: %s, %u CPUs, provider %s, server %s%s\n", cpu, cli_cpu_count(),
         b->provider, b->addr, b->server ? "" : " (started here)");
  printf("payload %s, %u transfers per phase, medians of %u repetitions\n", b->size_s, b->iters,
         b->reps);
  printf("baseline: %s\n", b->pp_cmd);
  printf("                          median MB/s   (min - max)          vs fi_pingpong\n");
  printf("  fi_pingpong            %9.1f       (%.0f - %.0f)\n", r->pp, r->pp_lo, r->pp_hi);
  for (int q = 0; q < b->n_qd; q++) {
    printf("  fabric tier PUT qd=%-2u  %9.1f       (%.0f - %.0f)   %.2fx\n", b->qd[q], r->put[q],
           r->put_lo[q], r->put_hi[q], r->pp > 0 ? r->put[q] / r->pp : 0.0);
    printf("  fabric tier GET qd=%-2u  %9.1f       (%.0f - %.0f)   %.2fx\n", b->qd[q], r->get[q],
           r->get_lo[q], r->get_hi[q], r->pp > 0 ? r->get[q] / r->pp : 0.0);
  }
}

static int bench(fb *b) {
  kvt_ctx *ctx = NULL;
  int rc = cli_ctx_create(0, &ctx);
  if (rc)
    return rc;
  char spec[512];
  snprintf(spec, sizeof(spec), "fabric://%s?provider=%s&depth=%d&timeout_ms=60000", b->addr,
           b->provider, MAX_QD);
  for (char *p = strchr(spec, '?'); p && *p; p++)
    if (*p == ';')
      *p = '+'; /* keep the provider's ';' away from tier-list splitting */
  kvt_tier *t = NULL;
  if ((rc = kvt_tier_open(ctx, spec, &t)) != 0) {
    cli_error("bench fabric: %s: %s", spec, kvt_ctx_last_error(ctx));
    kvt_ctx_destroy(ctx);
    return CLI_EFAIL;
  }
  uint8_t *bufs[2 * MAX_QD] = {0}; /* PUT sources, then GET destinations */
  for (int i = 0; i < 2 * MAX_QD && !rc; i++)
    if (!(bufs[i] = cli_alloc_faulted((size_t)b->size)))
      rc = CLI_EFAIL;
  if (!rc)
    rc = verify(b, t, bufs);
  result r;
  memset(&r, 0, sizeof(r));
  if (!rc)
    rc = measure(b, t, bufs, &r);
  if (!rc)
    report(b, &r);
  for (int i = 0; i < 2 * MAX_QD; i++)
    free(bufs[i]);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  return rc;
}

int cli_bench_fabric_main(int argc, char **argv) {
  fb b = {.size_s = "4MiB", .qd_s = "1,4", .provider = "tcp;ofi_rxm", .tiers = "dram:1GiB",
          .iters = 200, .reps = 5};
  const cli_opt opts[] = {
      {"--size", NULL, CLI_STR, &b.size_s, 0, 0},
      {"--iters", NULL, CLI_U32, &b.iters, 1, 1e7},
      {"--reps", NULL, CLI_U32, &b.reps, 3, 1000},
      {"--qd", NULL, CLI_STR, &b.qd_s, 0, 0},
      {"--provider", NULL, CLI_STR, &b.provider, 0, 0},
      {"--server", NULL, CLI_STR, &b.server, 0, 0},
      {"--tiers", NULL, CLI_STR, &b.tiers, 0, 0},
      {"--json", NULL, CLI_FLAG, &b.json, 0, 0},
  };
  size_t n_pos = 0;
  int rc = cli_parse("bench fabric", argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0,
                     &n_pos);
  if (rc == CLI_HELP) {
    fputs(fabric_help, stdout);
    return CLI_OK;
  }
  if (rc)
    return rc;
  if (kvt_parse_size(b.size_s, &b.size) != 0 || b.size == 0 || b.size > (1ull << 30))
    return cli_usage_error("bench fabric", "--size '%s': 1 byte to 1GiB", b.size_s);
  if ((rc = parse_qd(&b)) != 0)
    return rc;
  snprintf(b.core, sizeof(b.core), "%.*s", (int)strcspn(b.provider, ";"), b.provider);
  if (b.server) {
    snprintf(b.addr, sizeof(b.addr), "%s", b.server);
  } else {
    char self[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
      return CLI_EFAIL;
    self[n] = 0;
    if ((rc = start_server(&b, self)) != 0)
      return rc;
  }
  rc = bench(&b);
  stop_server(&b);
  return rc;
}
