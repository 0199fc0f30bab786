/* bench/cli_bench_cache.c - `kvtier bench cache`: how long the cache's
 * prefix lookup takes over a long context (issue 3's target: under 50 us for
 * 128K tokens), next to the chained key hashing any lookup must do, measured
 * in the same run. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli_bench_tier.h"
#include "cli_util.h"

static const char cache_help[] =
    "Usage: kvtier bench cache [--context T] [--chunk N] [--reps R] [--json]\n"
    "\n"
    "Fills a dram cache with every chunk of one context of T tokens (small real\n"
    "payloads: raw codec, 1 layer, 1 head, 16 dims, so the run stays small), then\n"
    "times, R times each, and reports the median and 99th percentile in us:\n"
    "  hash      kvt_chunk_keys over the T tokens: the chained XXH3-128 keys that\n"
    "            any lookup must compute (the baseline)\n"
    "  lookup    kvt_cache_lookup(tokens): keys plus the index walk, all hits\n"
    "  keys      kvt_cache_lookup_keys on precomputed keys: the index walk alone\n"
    "  miss      kvt_cache_lookup of a context whose first chunk is not held\n"
    "\n"
    "Options:\n"
    "  --context T  tokens (131072)\n"
    "  --chunk N    tokens per chunk (256)\n"
    "  --reps R     repetitions, at least 11 (2001)\n"
    "  --json       machine-readable output\n";

#define TARGET_US 50.0

typedef struct bc {
  uint32_t context, chunk, reps;
  int json;
  kvt_ctx *ctx;
  kvt_cache *cache;
  kvt_key fp, *keys;
  uint32_t *tokens, *other;
  size_t chunks;
  double *t;
} bc;

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median and p99 of b->t[0..reps) in microseconds. */
static void quantiles(bc *b, double *med, double *p99) {
  qsort(b->t, b->reps, sizeof(double), cmp_d);
  *med = b->t[b->reps / 2] * 1e6;
  *p99 = b->t[(size_t)((double)(b->reps - 1) * 0.99)] * 1e6;
}

/* One chunk's payload under its key, put with its parent. */
static int put_chunk(bc *b, size_t i, uint16_t *kv, uint8_t *buf, size_t cap) {
  kvt_kv_view view;
  kvt_kv_view_dense(&view, kv, kv, KVT_DTYPE_BF16, 1, b->chunk, 1, 16);
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  int r = kvt_codec_parse(b->ctx, "raw", &p.spec);
  p.key = b->keys[i];
  p.fingerprint = b->fp;
  p.token_begin = (uint32_t)(i * b->chunk);
  size_t len = 0;
  if (!r)
    r = kvt_encode(b->ctx, &p, &view, buf, cap, &len);
  if (!r)
    r = kvt_cache_put(b->cache, &b->keys[i], i ? &b->keys[i - 1] : NULL, buf, len);
  return r;
}

static int setup(bc *b) {
  int r = cli_ctx_create(0, &b->ctx);
  if (r)
    return r;
  kvt_codec_spec spec;
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = "bench/lookup";
  m.layers = 1;
  m.kv_heads = 1;
  m.head_dim = 16;
  b->chunks = b->context / b->chunk;
  b->keys = malloc(b->chunks * sizeof(*b->keys) + 1);
  b->tokens = malloc((size_t)b->context * sizeof(uint32_t));
  b->other = malloc((size_t)b->context * sizeof(uint32_t));
  b->t = malloc(b->reps * sizeof(double));
  if (!b->keys || !b->tokens || !b->other || !b->t)
    return cli_error("out of memory"), CLI_EFAIL;
  for (uint32_t i = 0; i < b->context; i++) {
    b->tokens[i] = i * 2654435761u % 128256u; /* a Llama-3 sized vocabulary */
    b->other[i] = b->tokens[i] ^ 1u;
  }
  if (kvt_codec_parse(b->ctx, "raw", &spec) || kvt_fingerprint(&m, &spec, &b->fp))
    return cli_error("fingerprint: %s", kvt_ctx_last_error(b->ctx)), CLI_EFAIL;
  size_t n = 0;
  r = kvt_chunk_keys(&b->fp, b->tokens, b->context, b->chunk, b->keys, b->chunks, &n);
  uint64_t cap = 0;
  if (!r)
    r = kvt_encode_bound(b->ctx, &spec, 0, 1, b->chunk, 1, 16, &cap);
  char tiers[64];
  snprintf(tiers, sizeof(tiers), "dram:%llu", (unsigned long long)(cap + 256) * b->chunks * 2);
  kvt_cache_config cc = KVT_CACHE_CONFIG_INIT;
  cc.tiers = tiers;
  cc.fingerprint = &b->fp;
  cc.chunk_tokens = b->chunk;
  if (!r)
    r = kvt_cache_open(b->ctx, &cc, &b->cache);
  uint16_t *kv = calloc((size_t)b->chunk * 16, sizeof(uint16_t));
  uint8_t *buf = malloc(cap);
  for (size_t i = 0; !r && kv && buf && i < b->chunks; i++)
    r = put_chunk(b, i, kv, buf, cap);
  free(kv);
  free(buf);
  if (r)
    return cli_error("setting up the cache: %s", kvt_strerror(r)), CLI_EFAIL;
  return 0;
}

enum { M_HASH, M_LOOKUP, M_KEYS, M_MISS, N_MODES };
static const char *const mode_names[N_MODES] = {"hash", "lookup", "keys", "miss"};

/* Times one mode b->reps times; checks every answer. */
static int measure(bc *b, int mode, double *med, double *p99) {
  for (uint32_t r = 0; r < b->reps; r++) {
    size_t n = 0, want = b->chunks;
    int rc = 0;
    const double t0 = cli_now();
    switch (mode) {
    case M_HASH:
      rc = kvt_chunk_keys(&b->fp, b->tokens, b->context, b->chunk, b->keys, b->chunks, &n);
      break;
    case M_LOOKUP:
      rc = kvt_cache_lookup(b->cache, b->tokens, b->context, &n);
      want = (size_t)b->chunks * b->chunk;
      break;
    case M_KEYS:
      rc = kvt_cache_lookup_keys(b->cache, b->keys, b->chunks, &n);
      break;
    default:
      rc = kvt_cache_lookup(b->cache, b->other, b->context, &n);
      want = 0;
      break;
    }
    b->t[r] = cli_now() - t0;
    if (rc || n != want) {
      cli_error("bench cache: %s returned %d with %zu, expected %zu", mode_names[mode], rc, n,
                want);
      return CLI_EFAIL;
    }
  }
  quantiles(b, med, p99);
  return 0;
}

int cli_bench_cache_main(int argc, char **argv) {
  bc b;
  memset(&b, 0, sizeof(b));
  b.context = 131072;
  b.chunk = 256;
  b.reps = 2001;
  const cli_opt opts[] = {{"--context", NULL, CLI_U32, &b.context, 1, 1u << 26},
                          {"--chunk", NULL, CLI_U32, &b.chunk, 1, 1u << 20},
                          {"--reps", NULL, CLI_U32, &b.reps, 11, 1000000},
                          {"--json", NULL, CLI_FLAG, &b.json, 0, 0}};
  size_t n_pos;
  int rc = cli_parse("bench cache", argc, argv, opts, 4, NULL, 0, &n_pos);
  if (rc == CLI_HELP)
    return fputs(cache_help, stdout), CLI_OK;
  if (rc)
    return rc;
  if (b.context < b.chunk)
    return cli_usage_error("bench cache", "--context must hold at least one --chunk");
  rc = setup(&b);
  double med[N_MODES] = {0}, p99[N_MODES] = {0};
  for (int m = 0; m < N_MODES && !rc; m++)
    rc = measure(&b, m, &med[m], &p99[m]);
  if (!rc) {
    char cpu[128];
    cli_cpu_model(cpu, sizeof(cpu));
    if (b.json) {
      printf("{\"bench\": \"cache\", \"cpu\": ");
      cli_json_str(stdout, cpu);
      printf(", \"context\": %u, \"chunk\": %u, \"chunks\": %zu, \"reps\": %u", b.context,
             b.chunk, b.chunks, b.reps);
      for (int m = 0; m < N_MODES; m++)
        printf(", \"%s_us\": {\"median\": %.2f, \"p99\": %.2f}", mode_names[m], med[m], p99[m]);
      printf(", \"target_us\": %.0f, \"lookup_meets_target\": %s}\n", TARGET_US,
             med[M_LOOKUP] < TARGET_US ? "true" : "false");
    } else {
      printf("kvtier bench cache: %u tokens in %zu chunks of %u, %u reps, one thread\n",
             b.context, b.chunks, b.chunk, b.reps);
      printf("cpu: %s\n\n%-8s %12s %12s\n", cpu, "op", "median us", "p99 us");
      for (int m = 0; m < N_MODES; m++)
        printf("%-8s %12.2f %12.2f\n", mode_names[m], med[m], p99[m]);
      printf("\nlookup: %.2f us median, target < %.0f us: %s; hashing is %.0f%% of it\n",
             med[M_LOOKUP], TARGET_US, med[M_LOOKUP] < TARGET_US ? "met" : "NOT met",
             med[M_LOOKUP] > 0 ? 100.0 * med[M_HASH] / med[M_LOOKUP] : 0.0);
    }
  }
  kvt_cache_close(b.cache);
  kvt_ctx_destroy(b.ctx);
  free(b.keys);
  free(b.tokens);
  free(b.other);
  free(b.t);
  return rc;
}
