/* programs/cli_demo_pd.c - `kvtier demo --pd`: disaggregated prefill and
 * decode as two processes that share nothing but a remote tier.
 *
 * The prefill process makes a long context's KV (synthetic, chunk by chunk),
 * encodes each chunk, and puts it through a cache whose only tier is the
 * remote one: a kvtier-server this command starts on loopback (fabric://),
 * or the tier given with --remote (a running kvtier-server, Redis, a Redis
 * Cluster). The decode process, started after the prefill process exits,
 * knows only the prompt's tokens: it looks the prefix up, gets every chunk,
 * decodes it, and checks every byte of every payload against its own
 * encoding of the same KV. The processes are forked, so the second finds the
 * chunks through the remote tier alone. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"
#include "kvtier.h"
#include "synth.h"

int cli_demo_pd_main(int argc, char **argv);

static const char pd_help[] =
    "Usage: kvtier demo --pd [--remote SPEC] [--server PATH] [--layers L] [--tokens T]\n"
    "                        [--heads H] [--head-dim D] [--chunk-tokens N] [--codec C]\n"
    "                        [--seed S] [--keep]\n"
    "\n"
    "Prefill -> decode through a remote tier, as two processes. Without --remote it\n"
    "starts kvtier-server (the one next to this kvtier, or --server PATH) on\n"
    "127.0.0.1 with a random port, a DRAM tier and a random tenant token, and stops\n"
    "it at the end. The prefill process encodes the context chunk by chunk (chained\n"
    "keys) and puts every chunk; the decode process looks the prompt up, gets every\n"
    "chunk, decodes it, and checks each payload byte for byte against its own\n"
    "encoding of the same KV. Exit 0 only if every byte matched.\n"
    "\n"
    "Options:\n"
    "  --remote SPEC     a running shared tier, e.g. fabric://HOST:PORT?tenant=T&token=X\n"
    "                    or redis://127.0.0.1:6379?ns=pd-demo\n"
    "  --server PATH     the kvtier-server to start (default: next to this program)\n"
    "  --layers L        layers (32)         --tokens T      context tokens (4096)\n"
    "  --heads H         KV heads (8)        --head-dim D    head dimension (128)\n"
    "  --chunk-tokens N  tokens per chunk (256)\n"
    "  --codec C         payload codec (k16v8)\n"
    "  --seed S          synthetic data and token seed (1)\n"
    "  --keep            leave the chunks in --remote (default: delete them at the end)\n";

typedef struct pd_cfg {
  uint32_t layers, tokens, heads, head_dim, chunk, seed;
  const char *remote, *server, *codec;
  int keep;
  char spec[512];
  kvt_codec_spec cs;
} pd_cfg;

/* The prompt's token ids: what both sides know. */
static uint32_t *pd_tokens(const pd_cfg *c) {
  uint32_t *t = malloc((size_t)c->tokens * sizeof(*t) + 1);
  uint64_t x = 0x9E3779B97F4A7C15ull * (c->seed + 1);
  for (uint32_t i = 0; t && i < c->tokens; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t[i] = (uint32_t)(x % 128256u); /* a Llama-3 vocabulary */
  }
  return t;
}

/* A context, the model's fingerprint and the chunk keys. */
typedef struct pd_side {
  kvt_ctx *ctx;
  kvt_cache *cache;
  kvt_key fp, *keys;
  uint32_t chunks;
  uint16_t *k, *v; /* one chunk's KV */
  uint8_t *payload;
  uint64_t cap;
} pd_side;

static int pd_fail(pd_side *s, const char *what, int rc) {
  cli_error("demo --pd: %s: %s%s%s", what, kvt_strerror(rc), s && s->ctx ? ": " : "",
            s && s->ctx ? kvt_ctx_last_error(s->ctx) : "");
  return CLI_EFAIL;
}

static void side_free(pd_side *s) {
  kvt_cache_close(s->cache);
  free(s->keys);
  free(s->k);
  free(s->v);
  free(s->payload);
  kvt_ctx_destroy(s->ctx);
}

static int side_open(const pd_cfg *c, const uint32_t *tokens, pd_side *s) {
  memset(s, 0, sizeof(*s));
  int rc = kvt_ctx_create(NULL, &s->ctx);
  if (rc)
    return pd_fail(NULL, "context", rc);
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = "kvtier-demo/synthetic-llama-3.1-8b-shape";
  m.layers = c->layers;
  m.kv_heads = c->heads;
  m.head_dim = c->head_dim;
  if ((rc = kvt_fingerprint(&m, &c->cs, &s->fp)) != 0)
    return pd_fail(s, "fingerprint", rc);
  s->chunks = c->tokens / c->chunk;
  const size_t n = (size_t)c->layers * c->chunk * c->heads * c->head_dim;
  s->keys = malloc(((size_t)s->chunks + 1) * sizeof(*s->keys));
  s->k = malloc(n * 2);
  s->v = malloc(n * 2);
  if ((rc = kvt_encode_bound(s->ctx, &c->cs, 0, c->layers, c->chunk, c->heads, c->head_dim,
                             &s->cap)) != 0)
    return pd_fail(s, "encode bound", rc);
  s->payload = malloc(s->cap);
  if (!s->keys || !s->k || !s->v || !s->payload)
    return pd_fail(s, "allocation", -ENOMEM);
  size_t nk = 0;
  if ((rc = kvt_chunk_keys(&s->fp, tokens, c->tokens, c->chunk, s->keys, s->chunks, &nk)) != 0)
    return pd_fail(s, "chunk keys", rc);
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = c->spec;
  cfg.fingerprint = &s->fp;
  cfg.chunk_tokens = c->chunk;
  if ((rc = kvt_cache_open(s->ctx, &cfg, &s->cache)) != 0)
    return pd_fail(s, c->spec, rc);
  return 0;
}

/* Chunk i's KV (synthetic, from the seed) encoded into s->payload. */
static int encode_chunk(const pd_cfg *c, pd_side *s, uint32_t i, size_t *len) {
  const kvt_synth_shape sh = {c->layers, c->chunk, c->heads, c->head_dim, KVT_DTYPE_BF16, 4,
                              20.0f};
  kvt_synth_kv(&sh, (uint64_t)c->seed * 1000003u + i, s->k, s->v);
  kvt_kv_view view;
  kvt_kv_view_dense(&view, s->k, s->v, KVT_DTYPE_BF16, c->layers, c->chunk, c->heads,
                    c->head_dim);
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  p.spec = c->cs;
  p.key = s->keys[i];
  p.fingerprint = s->fp;
  p.token_begin = (uint64_t)i * c->chunk;
  return kvt_encode(s->ctx, &p, &view, s->payload, s->cap, len);
}

static int prefill(const pd_cfg *c, const uint32_t *tokens) {
  pd_side s;
  int rc = side_open(c, tokens, &s);
  double enc = 0, put = 0;
  uint64_t bytes = 0;
  for (uint32_t i = 0; rc == 0 && i < s.chunks; i++) {
    size_t len = 0;
    double t0 = cli_now();
    if ((rc = encode_chunk(c, &s, i, &len)) != 0) {
      rc = pd_fail(&s, "encode", rc);
      break;
    }
    double t1 = cli_now();
    if ((rc = kvt_cache_put(s.cache, &s.keys[i], i ? &s.keys[i - 1] : NULL, s.payload, len))) {
      rc = pd_fail(&s, "put", rc);
      break;
    }
    put += cli_now() - t1;
    enc += t1 - t0;
    bytes += len;
  }
  if (rc == 0)
    printf("  prefill (pid %d): %u chunks encoded (%.2f s) and put: %.1f MiB in %.3f s, "
           "%.2f GB/s\n", (int)getpid(), s.chunks, enc, bytes / 1048576.0, put,
           put > 0 ? bytes / put / 1e9 : 0);
  fflush(stdout);
  side_free(&s);
  return rc;
}

/* Gets every chunk (batches of 8 in flight) and checks it. */
static int decode_all(const pd_cfg *c, pd_side *s, uint32_t *matched, double *get_s,
                      uint64_t *bytes) {
  enum { B = 8 };
  uint8_t *bufs[B];
  kvt_cache_get_req req[B];
  uint16_t *dk = malloc((size_t)c->layers * c->chunk * c->heads * c->head_dim * 2);
  uint16_t *dv = malloc((size_t)c->layers * c->chunk * c->heads * c->head_dim * 2);
  int rc = dk && dv ? 0 : -ENOMEM;
  for (int j = 0; j < B; j++)
    if (!(bufs[j] = malloc(s->cap)))
      rc = -ENOMEM;
  for (uint32_t i0 = 0; rc == 0 && i0 < s->chunks; i0 += B) {
    const uint32_t n = s->chunks - i0 < B ? s->chunks - i0 : B;
    for (uint32_t j = 0; j < n; j++) {
      memset(&req[j], 0, sizeof(req[j]));
      req[j].key = s->keys[i0 + j];
      req[j].buf = bufs[j];
      req[j].cap = s->cap;
    }
    const double t0 = cli_now();
    if ((rc = kvt_cache_get_many(s->cache, req, n, n)) != 0)
      break;
    *get_s += cli_now() - t0;
    for (uint32_t j = 0; j < n && rc == 0; j++) {
      size_t len = 0;
      if ((rc = req[j].result) != 0)
        break;
      *bytes += req[j].len;
      kvt_kv_view dview;
      kvt_kv_view_dense(&dview, dk, dv, KVT_DTYPE_BF16, c->layers, c->chunk, c->heads,
                        c->head_dim);
      kvt_decode_params dp = KVT_DECODE_PARAMS_INIT;
      dp.expect_key = &s->keys[i0 + j];
      dp.expect_fingerprint = &s->fp;
      if ((rc = kvt_decode(s->ctx, bufs[j], req[j].len, &dp, &dview)) != 0)
        break;
      if ((rc = encode_chunk(c, s, i0 + j, &len)) != 0)
        break;
      if (len == req[j].len && memcmp(s->payload, bufs[j], len) == 0)
        (*matched)++;
      else
        cli_error("demo --pd: chunk %u: the payload read back differs from the decode side's "
                  "own encoding", i0 + j);
    }
  }
  for (int j = 0; j < B; j++)
    free(bufs[j]);
  free(dk);
  free(dv);
  return rc;
}

static int decode(const pd_cfg *c, const uint32_t *tokens) {
  pd_side s;
  int rc = side_open(c, tokens, &s);
  size_t cached = 0;
  double t0 = cli_now(), get_s = 0;
  if (rc == 0 && (rc = kvt_cache_lookup(s.cache, tokens, c->tokens, &cached)) != 0)
    rc = pd_fail(&s, "lookup", rc);
  const double look_us = (cli_now() - t0) * 1e6;
  uint32_t matched = 0;
  uint64_t bytes = 0;
  if (rc == 0 && (rc = decode_all(c, &s, &matched, &get_s, &bytes)) != 0)
    rc = pd_fail(&s, "get and decode", rc);
  if (rc == 0) {
    printf("  decode  (pid %d): lookup found %zu of %u tokens cached (%.0f us); got %u chunks, "
           "%.1f MiB in %.3f s, %.2f GB/s; decoded each (key, fingerprint, checksums)\n",
           (int)getpid(), cached, c->tokens, look_us, s.chunks, bytes / 1048576.0, get_s,
           get_s > 0 ? bytes / get_s / 1e9 : 0);
    printf("  %u of %u payloads byte-identical to the decode side's own encoding\n", matched,
           s.chunks);
    if (matched != s.chunks || cached != (size_t)s.chunks * c->chunk)
      rc = CLI_EFAIL;
  }
  if (rc == 0 && !c->keep && c->remote)
    for (uint32_t i = 0; i < s.chunks; i++)
      (void)kvt_cache_del(s.cache, &s.keys[i]);
  fflush(stdout);
  side_free(&s);
  return rc;
}

/* Runs fn in a child process; returns its exit code (CLI_EFAIL if it died). */
static int in_child(int (*fn)(const pd_cfg *, const uint32_t *), const pd_cfg *c,
                    const uint32_t *tokens) {
  fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0)
    return CLI_EFAIL;
  if (pid == 0)
    _exit(fn(c, tokens));
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : CLI_EFAIL;
}

/* Starts kvtier-server on 127.0.0.1, any port; fills c->spec. */
static int start_server(pd_cfg *c, pid_t *pid) {
  char path[PATH_MAX + 32], self[PATH_MAX];
  if (c->server) {
    snprintf(path, sizeof(path), "%s", c->server);
  } else {
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
      *slash = '\0';
    snprintf(path, sizeof(path), "%s/kvtier-server", n > 0 ? self : ".");
  }
  if (access(path, X_OK) != 0) {
    cli_error("demo --pd: no kvtier-server at %s (this build has no libfabric?): give --server "
              "PATH or --remote SPEC, e.g. --remote 'redis://127.0.0.1:6379?ns=pd-demo'", path);
    return CLI_EFAIL;
  }
  char token[33], tenant[64], tiers[64];
  uint64_t x = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  for (int i = 0; i < 32; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    token[i] = "0123456789abcdef"[x & 15];
  }
  token[32] = '\0';
  snprintf(tenant, sizeof(tenant), "pd-demo:%s", token);
  const uint64_t need = (uint64_t)c->layers * c->tokens * c->heads * c->head_dim * 4;
  snprintf(tiers, sizeof(tiers), "dram:%" PRIu64 "MiB", need / (1 << 20) + 256);
  int fds[2];
  if (pipe(fds))
    return CLI_EFAIL;
  fflush(stdout);
  if ((*pid = fork()) == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execl(path, path, "--listen", "127.0.0.1:0", "--tiers", tiers, "--tenant", tenant,
          "--quiet", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char line[512] = "";
  size_t got = 0;
  struct pollfd pfd = {fds[0], POLLIN, 0};
  const double t0 = cli_now();
  while (!strchr(line, '\n') && cli_now() - t0 < 15 && got < sizeof(line) - 1) {
    if (poll(&pfd, 1, 200) <= 0)
      continue;
    const ssize_t r = read(fds[0], line + got, sizeof(line) - 1 - got);
    if (r <= 0)
      break;
    got += (size_t)r;
    line[got] = '\0';
  }
  close(fds[0]);
  char host[256];
  unsigned port = 0;
  if (sscanf(line, "kvtier-server: ready on %255[^:]:%u", host, &port) != 2) {
    cli_error("demo --pd: %s did not report ready within 15 s (it said: %.200s)", path, line);
    return CLI_EFAIL;
  }
  snprintf(c->spec, sizeof(c->spec), "fabric://%s:%u?tenant=pd-demo&token=%s", host, port,
           token);
  printf("  server: %s on %s:%u (tier %s, tenant pd-demo with a random token)\n", path, host,
         port, tiers);
  return 0;
}

static int pd_parse(int argc, char **argv, pd_cfg *c) {
  memset(c, 0, sizeof(*c));
  c->layers = 32, c->tokens = 4096, c->heads = 8, c->head_dim = 128, c->chunk = 256;
  c->seed = 1;
  c->codec = "k16v8";
  int pd = 0;
  const cli_opt opts[] = {
      {"--pd", NULL, CLI_FLAG, &pd, 0, 0},
      {"--remote", NULL, CLI_STR, &c->remote, 0, 0},
      {"--server", NULL, CLI_STR, &c->server, 0, 0},
      {"--layers", NULL, CLI_U32, &c->layers, 1, KVT_MAX_LAYERS},
      {"--tokens", NULL, CLI_U32, &c->tokens, 1, KVT_MAX_TOKENS},
      {"--heads", NULL, CLI_U32, &c->heads, 1, KVT_MAX_HEADS},
      {"--head-dim", NULL, CLI_U32, &c->head_dim, 2, KVT_MAX_HEAD_DIM},
      {"--chunk-tokens", NULL, CLI_U32, &c->chunk, 1, KVT_MAX_TOKENS},
      {"--codec", NULL, CLI_STR, &c->codec, 0, 0},
      {"--seed", NULL, CLI_U32, &c->seed, 0, UINT32_MAX},
      {"--keep", NULL, CLI_FLAG, &c->keep, 0, 0},
  };
  size_t npos = 0;
  int rc = cli_parse("demo --pd", argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0,
                     &npos);
  if (rc == CLI_HELP)
    fputs(pd_help, stdout);
  if (rc)
    return rc;
  if (c->chunk > c->tokens)
    return cli_usage_error("demo --pd", "--chunk-tokens %u exceeds --tokens %u", c->chunk,
                           c->tokens);
  kvt_ctx *ctx = NULL;
  if (kvt_ctx_create(NULL, &ctx) || kvt_codec_parse(ctx, c->codec, &c->cs)) {
    const int u = cli_usage_error("demo --pd", "--codec '%s': %s", c->codec,
                                  ctx ? kvt_ctx_last_error(ctx) : "no context");
    kvt_ctx_destroy(ctx);
    return u;
  }
  kvt_ctx_destroy(ctx);
  if (c->remote)
    snprintf(c->spec, sizeof(c->spec), "%s", c->remote);
  return 0;
}

int cli_demo_pd_main(int argc, char **argv) {
  pd_cfg c;
  int rc = pd_parse(argc, argv, &c);
  if (rc)
    return rc == CLI_HELP ? CLI_OK : rc;
  printf("kvtier demo --pd: prefill and decode as two processes sharing only a remote tier\n"
         "  context: %u layers x %u tokens x %u KV heads x %u dim, bf16, synthetic; %u-token "
         "chunks, codec %s\n", c.layers, c.tokens, c.heads, c.head_dim, c.chunk, c.codec);
  pid_t server = 0;
  if (!c.remote && (rc = start_server(&c, &server)) != 0) {
    if (server > 0) {
      kill(server, SIGKILL);
      waitpid(server, NULL, 0);
    }
    return rc;
  }
  if (c.remote)
    printf("  remote tier: %s\n", c.spec);
  uint32_t *tokens = pd_tokens(&c);
  rc = tokens ? in_child(prefill, &c, tokens) : CLI_EFAIL;
  if (rc == 0)
    rc = in_child(decode, &c, tokens);
  free(tokens);
  if (server > 0) {
    kill(server, SIGTERM);
    int st = 0;
    waitpid(server, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      cli_error("demo --pd: kvtier-server did not stop cleanly (status %d)", st);
  }
  printf("%s\n", rc == 0 ? "  every chunk went prefill -> remote tier -> decode byte-identical"
                         : "  FAILED");
  return rc;
}
