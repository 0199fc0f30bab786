/* bench/cli_bench_redis.c - `kvtier bench redis`: the redis tier's PUT
 * and GET throughput against redis-benchmark's SET and GET on the same
 * server, with the same payload size, connections and pipelining, measured
 * in the same run (STYLE.md), interleaved repetition by repetition. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "cli_util.h"
#include "kvt_internal.h" /* kvt_url_unescape: the URL read as the tier reads it */

static const char redis_help[] =
    "Usage: kvtier bench redis [--url redis://HOST:PORT] [--size 1MiB] [--clients 4]\n"
    "                          [--pipeline 4] [--requests 1000] [--reps 5]\n"
    "\n"
    "Each repetition runs, against the same server:\n"
    "  redis-benchmark -h HOST -p PORT -t set,get -d SIZE -c CLIENTS -P PIPELINE -n REQUESTS -q --csv\n"
    "  then the tier (URL?ns=kvt-bench&conns=CLIENTS&pipeline=PIPELINE): REQUESTS PUTs of SIZE\n"
    "  random bytes with CLIENTS x PIPELINE operations in flight (kvt_tier_submit/poll)\n"
    "  over CLIENTS x PIPELINE keys (redis-benchmark rewrites one key), then REQUESTS GETs\n"
    "  of them the same way (verified once, untimed).\n"
    "Prints medians of --reps repetitions: ops/s, GB/s (1e9 bytes/s) and the tier's ratio\n"
    "to redis-benchmark for SET/PUT and GET. Without --url, starts redis-server on a free\n"
    "127.0.0.1 port (no persistence) and stops it afterwards.\n"
    "\n"
    "Options:\n"
    "  --url URL        a redis:// spec (kvtier/tier.h); AUTH and /DB go to redis-benchmark\n"
    "  --size SIZE      payload size (1MiB)\n"
    "  --clients N      connections of both (4)\n"
    "  --pipeline P     commands in flight per connection (4)\n"
    "  --requests N     operations per phase (1000)\n"
    "  --reps R         repetitions (5)\n";

typedef struct rb {
  const char *url, *size_s;
  uint32_t clients, pipeline, requests, reps;
  uint64_t size;
  char host[256], port[16], user[128], pass[256], db[16];
  pid_t server;
  char dir[256];
} rb;

/* ---- a local redis-server ---- */

static int free_port(void) {
  for (int i = 0; i < 50; i++) {
    const int port = 20000 + (int)((unsigned)rand() % 30000u);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    if (ok)
      return port;
  }
  return -1;
}

static int pinged(const char *host, int port) {
  const struct timeval tv = {1, 0};
  redisContext *c = redisConnectWithTimeout(host, port, tv);
  int ok = 0;
  if (c && !c->err) {
    redisReply *r = redisCommand(c, "PING");
    ok = r != NULL;
    if (r)
      freeReplyObject(r);
  }
  if (c)
    redisFree(c);
  return ok;
}

static int start_server(rb *b) {
  srand((unsigned)getpid());
  const int port = free_port();
  snprintf(b->dir, sizeof(b->dir), "/tmp/kvt-bench-redis-XXXXXX");
  if (port < 0 || !mkdtemp(b->dir)) {
    cli_error("bench redis: no free port or temporary directory");
    return -1;
  }
  snprintf(b->host, sizeof(b->host), "127.0.0.1");
  snprintf(b->port, sizeof(b->port), "%d", port);
  const pid_t parent = getpid();
  b->server = fork();
  if (b->server == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the benchmark */
    if (getppid() != parent)
      _exit(1);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execlp("redis-server", "redis-server", "--port", b->port, "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--dir", b->dir, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 500; i++) {
    if (pinged(b->host, port))
      return 0;
    usleep(10000);
  }
  cli_error("bench redis: redis-server did not start (is it on PATH?)");
  return -1;
}

static void stop_server(rb *b) {
  if (b->server > 0) {
    kill(b->server, SIGTERM);
    waitpid(b->server, NULL, 0);
  }
  if (b->dir[0])
    rmdir(b->dir);
}


/* HOST ([IPv6] too), PORT, USER, PASSWORD (%XX decoded) and DB of --url, as
 * the tier reads them (for redis-benchmark). */
static int parse_url(rb *b) {
  const char *p = strncmp(b->url, "redis://", 8) == 0 ? b->url + 8 : NULL;
  if (!p)
    return cli_usage_error("bench redis", "--url must be redis://[USER:PASSWORD@]HOST:PORT[/DB]");
  const char *end = p + strcspn(p, "/?"), *at = NULL;
  for (const char *q = p; q < end; q++)
    at = *q == '@' ? q : at;
  if (at) {
    const char *colon = memchr(p, ':', (size_t)(at - p));
    const char *pw = colon ? colon + 1 : p;
    if (kvt_url_unescape(b->user, sizeof(b->user), p, colon ? (size_t)(colon - p) : 0) ||
        kvt_url_unescape(b->pass, sizeof(b->pass), pw, (size_t)(at - pw)))
      return cli_usage_error("bench redis", "--url has a bad USER:PASSWORD@");
    p = at + 1;
  }
  const char *colon = NULL, *host = p, *host_end;
  for (const char *q = p; q < end; q++)
    colon = *q == ':' ? q : colon;
  host_end = colon;
  if (*p == '[') { /* [IPv6]:PORT */
    const char *close = memchr(p, ']', (size_t)(end - p));
    colon = close && close + 1 < end && close[1] == ':' ? close + 1 : NULL;
    host = p + 1;
    host_end = close;
  }
  if (!colon || host_end <= host || colon + 1 >= end)
    return cli_usage_error("bench redis", "--url needs HOST:PORT");
  snprintf(b->host, sizeof(b->host), "%.*s", (int)(host_end - host), host);
  snprintf(b->port, sizeof(b->port), "%.*s", (int)(end - colon - 1), colon + 1);
  if (*end == '/' && end[1] && end[1] != '?')
    snprintf(b->db, sizeof(b->db), "%.*s", (int)strcspn(end + 1, "?"), end + 1);
  return 0;
}

/* ---- redis-benchmark ---- */

static int run_capture(char *const *argv, char *out, size_t cap) {
  int fd[2];
  if (pipe(fd) != 0)
    return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    close(fd[0]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(fd[1]);
  size_t len = 0;
  for (ssize_t r; (r = read(fd[0], out + len, cap - 1 - len)) != 0;) {
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      break;
    len += (size_t)r;
    if (len + 1 >= cap)
      break;
  }
  out[len] = '\0';
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static double csv_rps(const char *out, const char *test) {
  char pat[32];
  snprintf(pat, sizeof(pat), "\"%s\",\"", test);
  const char *p = strstr(out, pat);
  return p ? strtod(p + strlen(pat), NULL) : 0;
}

static void benchmark_argv(const rb *b, char args[][32], char **argv) {
  int n = 0;
  snprintf(args[0], 32, "%llu", (unsigned long long)b->size);
  snprintf(args[1], 32, "%u", b->clients);
  snprintf(args[2], 32, "%u", b->pipeline);
  snprintf(args[3], 32, "%u", b->requests);
  const char *fixed[] = {"redis-benchmark", "-h", b->host, "-p", b->port, "-t", "set,get"};
  for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
    argv[n++] = (char *)fixed[i];
  argv[n++] = "-d", argv[n++] = args[0], argv[n++] = "-c", argv[n++] = args[1];
  argv[n++] = "-P", argv[n++] = args[2], argv[n++] = "-n", argv[n++] = args[3];
  argv[n++] = "-q", argv[n++] = "--csv";
  if (b->user[0])
    argv[n++] = "--user", argv[n++] = (char *)b->user;
  if (b->pass[0])
    argv[n++] = "-a", argv[n++] = (char *)b->pass;
  if (b->db[0])
    argv[n++] = "--dbnum", argv[n++] = (char *)b->db;
  argv[n] = NULL;
}

/* ---- the tier ---- */

/* Runs `requests` operations of opcode with depth in flight; seconds. */
static double tier_phase(kvt_tier *t, int opcode, const rb *b, uint8_t *bufs, kvt_tier_op *ops,
                         uint32_t depth, int *failed) {
  kvt_tier_op *done[256];
  uint32_t issued = 0, completed = 0;
  const double t0 = cli_now();
  for (uint32_t i = 0; i < depth && issued < b->requests; i++, issued++) {
    kvt_key k = {{0}};
    memcpy(k.bytes, &i, 4);
    kvt_tier_op_init(&ops[i], opcode, &k, bufs + (size_t)i * b->size, b->size, i);
    kvt_tier_op *one = &ops[i];
    if (kvt_tier_submit(t, &one, 1) != 1)
      return -1;
  }
  while (completed < b->requests) {
    const int n = kvt_tier_poll(t, done, 256, -1);
    for (int j = 0; j < n; j++) {
      completed++;
      *failed += done[j]->result != 0;
      if (issued < b->requests) {
        const uint32_t slot = (uint32_t)done[j]->user_data;
        const kvt_key k = done[j]->key; /* op_init clears the op first */
        kvt_tier_op_init(done[j], opcode, &k, bufs + (size_t)slot * b->size, b->size,
                         slot);
        if (kvt_tier_submit(t, &done[j], 1) != 1)
          return -1;
        issued++;
      }
    }
  }
  return cli_now() - t0;
}

typedef struct rep {
  double set_rps, get_rps, put_rps, tget_rps;
} rep;

static int one_rep(const rb *b, kvt_tier *t, uint8_t *bufs, kvt_tier_op *ops, rep *r) {
  char args[4][32], out[8192];
  char *argv[32];
  benchmark_argv(b, args, argv);
  if (run_capture(argv, out, sizeof(out)) != 0 || !(r->set_rps = csv_rps(out, "SET")) ||
      !(r->get_rps = csv_rps(out, "GET"))) {
    cli_error("bench redis: redis-benchmark failed: %s", out);
    return CLI_EFAIL;
  }
  const uint32_t depth = b->clients * b->pipeline;
  int failed = 0;
  const double put_s = tier_phase(t, KVT_TIER_PUT, b, bufs, ops, depth, &failed);
  const double get_s = tier_phase(t, KVT_TIER_GET, b, bufs, ops, depth, &failed);
  if (put_s <= 0 || get_s <= 0 || failed) {
    cli_error("bench redis: %d tier operations failed", failed);
    return CLI_EFAIL;
  }
  r->put_rps = b->requests / put_s;
  r->tget_rps = b->requests / get_s;
  return 0;
}

static int verify(const rb *b, kvt_tier *t, uint8_t *bufs, uint32_t depth) {
  uint8_t *got = malloc(b->size);
  int bad = !got;
  for (uint32_t i = 0; i < depth && !bad; i++) {
    kvt_key k = {{0}};
    memcpy(k.bytes, &i, 4);
    uint64_t len = 0;
    bad = kvt_tier_get(t, &k, got, b->size, &len) != 0 || len != b->size ||
          memcmp(got, bufs + (size_t)i * b->size, b->size) != 0;
  }
  free(got);
  if (bad)
    cli_error("bench redis: a GET did not return the bytes PUT");
  return bad ? CLI_EFAIL : 0;
}

static void report(const rb *b, rep *reps) {
  double v[4][64];
  for (uint32_t i = 0; i < b->reps; i++) {
    v[0][i] = reps[i].set_rps, v[1][i] = reps[i].put_rps;
    v[2][i] = reps[i].get_rps, v[3][i] = reps[i].tget_rps;
  }
  double ratio_put[64], ratio_get[64];
  for (uint32_t i = 0; i < b->reps; i++) {
    ratio_put[i] = reps[i].put_rps / reps[i].set_rps;
    ratio_get[i] = reps[i].tget_rps / reps[i].get_rps;
  }
  const double m[4] = {cli_median(v[0], b->reps), cli_median(v[1], b->reps),
                       cli_median(v[2], b->reps), cli_median(v[3], b->reps)};
  const double gb = (double)b->size / 1e9;
  printf("redis %s:%s, size %llu B, clients %u, pipeline %u, requests %u, medians of %u reps\n",
         b->host, b->port, (unsigned long long)b->size, b->clients, b->pipeline, b->requests,
         b->reps);
  printf("  redis-benchmark SET  %10.1f ops/s  %6.3f GB/s\n", m[0], m[0] * gb);
  printf("  tier PUT             %10.1f ops/s  %6.3f GB/s   ratio %.2f (median of per-rep ratios)\n",
         m[1], m[1] * gb, cli_median(ratio_put, b->reps));
  printf("  redis-benchmark GET  %10.1f ops/s  %6.3f GB/s\n", m[2], m[2] * gb);
  printf("  tier GET             %10.1f ops/s  %6.3f GB/s   ratio %.2f (median of per-rep ratios)\n",
         m[3], m[3] * gb, cli_median(ratio_get, b->reps));
  printf("  per rep (SET, PUT, GET, tier GET ops/s):\n");
  for (uint32_t i = 0; i < b->reps; i++)
    printf("    %u: %.1f %.1f %.1f %.1f\n", i + 1, reps[i].set_rps, reps[i].put_rps, reps[i].get_rps,
           reps[i].tget_rps);
}

static int bench(rb *b) {
  char spec[1024];
  snprintf(spec, sizeof(spec), "%s%sns=kvt-bench&conns=%u&pipeline=%u", b->url,
           strchr(b->url, '?') ? "&" : "?", b->clients, b->pipeline);
  kvt_ctx *ctx = NULL;
  kvt_tier *t = NULL;
  int rc = cli_ctx_create(KVT_SIMD_AUTO, &ctx);
  if (rc)
    return rc;
  if ((rc = kvt_tier_open(ctx, spec, &t)) != 0) {
    cli_error("bench redis: %s", kvt_ctx_last_error(ctx)); /* names the tier, secrets as *** */
    kvt_ctx_destroy(ctx);
    return CLI_EFAIL;
  }
  const uint32_t depth = b->clients * b->pipeline;
  uint8_t *bufs = cli_alloc_faulted((size_t)depth * b->size);
  kvt_tier_op *ops = calloc(depth, sizeof(*ops));
  rep *reps = calloc(b->reps, sizeof(*reps));
  rc = bufs && ops && reps ? 0 : CLI_EFAIL;
  for (size_t i = 0; !rc && i < (size_t)depth * b->size; i++)
    bufs[i] = (uint8_t)(i * 2654435761u >> 13);
  for (uint32_t i = 0; i < b->reps && !rc; i++) {
    rc = one_rep(b, t, bufs, ops, &reps[i]);
    if (!rc && i == 0)
      rc = verify(b, t, bufs, depth);
  }
  if (!rc)
    report(b, reps);
  for (uint32_t i = 0; i < depth; i++) { /* leave the server as we found it */
    kvt_key k = {{0}};
    memcpy(k.bytes, &i, 4);
    kvt_tier_del(t, &k);
  }
  printf("  commands: redis-benchmark -h %s -p %s -t set,get -d %llu -c %u -P %u -n %u -q --csv\n"
         "            tier %s\n",
         b->host, b->port, (unsigned long long)b->size, b->clients, b->pipeline, b->requests,
         kvt_tier_spec(t)); /* its password as *** */
  free(bufs);
  free(ops);
  free(reps);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  return rc;
}

int cli_bench_redis_main(int argc, char **argv) {
  rb b = {.size_s = "1MiB", .clients = 4, .pipeline = 4, .requests = 1000, .reps = 5};
  const cli_opt opts[] = {{"--url", NULL, CLI_STR, &b.url, 0, 0},
                          {"--size", NULL, CLI_STR, &b.size_s, 0, 0},
                          {"--clients", NULL, CLI_U32, &b.clients, 1, 64},
                          {"--pipeline", NULL, CLI_U32, &b.pipeline, 1, 256},
                          {"--requests", NULL, CLI_U32, &b.requests, 1, 100000000},
                          {"--reps", NULL, CLI_U32, &b.reps, 1, 64}};
  size_t npos = 0;
  int rc = cli_parse("bench redis", argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0,
                     &npos);
  if (rc == CLI_HELP) {
    fputs(redis_help, stdout);
    return CLI_OK;
  }
  if (rc)
    return rc;
  if (kvt_parse_size(b.size_s, &b.size) != 0 || b.size == 0 || b.size > (256ull << 20))
    return cli_usage_error("bench redis", "--size '%s' is not a size in 1B..256MiB", b.size_s);
  if ((uint64_t)b.clients * b.pipeline > 1024)
    return cli_usage_error("bench redis", "--clients x --pipeline must be at most 1024");
  char url[300];
  if (b.url) {
    if ((rc = parse_url(&b)) != 0)
      return rc;
  } else {
    if (start_server(&b) != 0) {
      stop_server(&b);
      return CLI_EFAIL;
    }
    snprintf(url, sizeof(url), "redis://%s:%s", b.host, b.port);
    b.url = url;
  }
  char model[128];
  cli_cpu_model(model, sizeof(model));
  printf("machine: %s, %u CPUs\n", model, cli_cpu_count());
  rc = bench(&b);
  stop_server(&b);
  return rc;
}
