/* bench/cli_bench.c - `kvtier bench codec`: single-thread encode and
 * decode throughput of every preset on one chunk, each against memcpy of the
 * same bytes measured in the same iterations (STYLE.md: a performance claim
 * is a ratio against a baseline measured in the same run). */
#include <stdlib.h>
#include <string.h>

#include "cli_bench_tier.h"
#include "cli_util.h"
#include "codec_internal.h" /* the kernel table actually in use, for the report */
#include "synth.h"

static const char bench_help[] =
    "Usage: kvtier bench codec [--layers L] [--tokens T] [--heads H] [--head-dim D]\n"
    "                          [--dtype bf16|fp16] [--iters N] [--min-time S]\n"
    "                          [--simd auto|scalar|avx2] [--zstd LEVEL] [--json]\n"
    "\n"
    "On one thread, encodes and decodes one chunk of synthetic KV (default: a\n"
    "Llama-3.1-8B chunk, 32 layers x 256 tokens x 8 KV heads x 128 dim, bf16) with\n"
    "every preset. Each iteration times, back to back: memcpy of the raw K+V bytes\n"
    "between pre-faulted buffers (the baseline), kvt_encode, and kvt_decode (which\n"
    "verifies every section checksum). Reports medians as GB/s of raw 16-bit K+V\n"
    "input and the ratios encode/memcpy and decode/memcpy. One warm-up iteration\n"
    "first; then at least --iters iterations and at least --min-time seconds per\n"
    "preset. Timer: clock_gettime(CLOCK_MONOTONIC).\n"
    "\n"
    "Options:\n"
    "  --layers L, --tokens T, --heads H, --head-dim D   chunk shape (32, 256, 8, 128)\n"
    "  --dtype bf16|fp16  element type (bf16)\n"
    "  --iters N          minimum timed iterations per preset (7)\n"
    "  --min-time S       minimum timed seconds per preset (0.5)\n"
    "  --simd P           CPU code path: auto, scalar or avx2 (auto)\n"
    "  --zstd LEVEL       add the lossless zstd stage at LEVEL (1..19) and report its\n"
    "                     ratio per preset (synthetic data: indicative only)\n"
    "  --json             machine-readable output\n"
    "\n"
    "Also: kvtier bench tier --help (tier throughput against memcpy and fio),\n"
    "kvtier bench cache --help (prefix lookup time over a long context),\n"
    "kvtier bench gpu --help (fused GPU load/store against cudaMemcpy),\n"
    "kvtier bench offload --help (GPU cache to dram and nvme tiers and back, verified),\n"
    "kvtier bench attn --help (decode attention over compressed caches),\n"
    "kvtier bench redis --help (the redis tier against redis-benchmark) and\n"
    "kvtier bench fabric --help (the fabric tier against fi_pingpong).\n";

static const char *const bench_specs[] = {
    "raw", "k16v8", "fp8", "int8", "k16v4", "k8v4", "int4", "int4,kgroup=dim",
};
#define N_BENCH (sizeof(bench_specs) / sizeof(bench_specs[0]))
#define MAX_ITERS 100000

typedef struct bench_cfg {
  uint32_t layers, tokens, heads, head_dim, iters;
  double min_time;
  const char *dtype_s, *simd_s;
  int dtype, simd, zstd, json;
} bench_cfg;

typedef struct bench_row {
  char spec[KVT_CODEC_SPEC_TEXT_MAX];
  uint64_t bytes, bytes_lossy; /* payload size; without the lossless stage */
  uint32_t iters;
  double memcpy_s, enc_s, dec_s; /* medians */
} bench_row;

typedef struct bench {
  bench_cfg c;
  kvt_ctx *ctx;
  size_t half;               /* bytes of K (and of V) */
  uint16_t *k, *v, *dk, *dv; /* input; decode and memcpy destination */
  uint8_t *payload;
  size_t cap;
  double *t_m, *t_e, *t_d; /* per iteration */
} bench;

static int bench_fail(bench *b, const char *spec, const char *what, int rc) {
  cli_error("bench codec: %s: %s: %s: %s", spec, what, kvt_err_name(rc),
            kvt_ctx_last_error(b->ctx));
  return CLI_EFAIL;
}

/* One iteration: memcpy, encode, decode, each timed. */
static int bench_iter(bench *b, const kvt_encode_params *p, const kvt_kv_view *src,
                      const kvt_kv_view *dst, size_t *len, double t[3]) {
  double t0 = cli_now();
  memcpy(b->dk, b->k, b->half);
  memcpy(b->dv, b->v, b->half);
  double t1 = cli_now();
  int rc = kvt_encode(b->ctx, p, src, b->payload, b->cap, len);
  double t2 = cli_now();
  if (rc)
    return rc;
  rc = kvt_decode(b->ctx, b->payload, *len, NULL, dst);
  double t3 = cli_now();
  t[0] = t1 - t0;
  t[1] = t2 - t1;
  t[2] = t3 - t2;
  return rc;
}

static int bench_preset(bench *b, const char *text, bench_row *r) {
  const bench_cfg *c = &b->c;
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  int rc = kvt_codec_parse(b->ctx, text, &p.spec);
  if (rc || (rc = kvt_codec_format(&p.spec, r->spec, sizeof(r->spec))))
    return bench_fail(b, text, "spec", rc);
  if ((rc =
           kvt_encode_bound(NULL, &p.spec, 0, c->layers, c->tokens, c->heads, c->head_dim, &r->bytes_lossy)))
    return bench_fail(b, text, "bound", rc);
  p.zstd_level = c->zstd;
  kvt_kv_view src, dst;
  kvt_kv_view_dense(&src, b->k, b->v, c->dtype, c->layers, c->tokens, c->heads, c->head_dim);
  kvt_kv_view_dense(&dst, b->dk, b->dv, c->dtype, c->layers, c->tokens, c->heads, c->head_dim);
  size_t len = 0;
  double t[3];
  if ((rc = bench_iter(b, &p, &src, &dst, &len, t))) /* warm-up */
    return bench_fail(b, text, "warm-up", rc);
  const double start = cli_now();
  uint32_t n = 0;
  while (n < MAX_ITERS && (n < c->iters || cli_now() - start < c->min_time)) {
    if ((rc = bench_iter(b, &p, &src, &dst, &len, t)))
      return bench_fail(b, text, "iteration", rc);
    b->t_m[n] = t[0], b->t_e[n] = t[1], b->t_d[n] = t[2];
    n++;
  }
  r->bytes = len;
  r->iters = n;
  r->memcpy_s = cli_median(b->t_m, n);
  r->enc_s = cli_median(b->t_e, n);
  r->dec_s = cli_median(b->t_d, n);
  return 0;
}

static int bench_setup(bench *b) {
  const bench_cfg *c = &b->c;
  int rc = cli_ctx_create(c->simd, &b->ctx);
  if (rc)
    return rc;
  b->half = (size_t)c->layers * c->tokens * c->heads * c->head_dim * 2;
  for (size_t i = 0; i < N_BENCH; i++) {
    kvt_codec_spec spec;
    uint64_t bound;
    if ((rc = kvt_codec_parse(b->ctx, bench_specs[i], &spec)) ||
        (rc = kvt_encode_bound(NULL, &spec, 0, c->layers, c->tokens, c->heads, c->head_dim, &bound)))
      return cli_usage_error("bench codec", "shape %ux%ux%ux%u does not fit preset %s: %s",
                             c->layers, c->tokens, c->heads, c->head_dim, bench_specs[i],
                             kvt_strerror(rc));
    b->cap = bound > b->cap ? bound : b->cap;
  }
  b->k = cli_alloc_faulted(b->half);
  b->v = cli_alloc_faulted(b->half);
  b->dk = cli_alloc_faulted(b->half);
  b->dv = cli_alloc_faulted(b->half);
  b->payload = cli_alloc_faulted(b->cap);
  b->t_m = malloc(MAX_ITERS * sizeof(double));
  b->t_e = malloc(MAX_ITERS * sizeof(double));
  b->t_d = malloc(MAX_ITERS * sizeof(double));
  if (!b->k || !b->v || !b->dk || !b->dv || !b->payload || !b->t_m || !b->t_e || !b->t_d) {
    cli_error("bench codec: out of memory");
    return CLI_EFAIL;
  }
  kvt_synth_shape s = {c->layers, c->tokens, c->heads, c->head_dim, c->dtype, 0, 0};
  kvt_synth_kv(&s, 1, b->k, b->v);
  return 0;
}

static void bench_free(bench *b) {
  free(b->t_d);
  free(b->t_e);
  free(b->t_m);
  free(b->payload);
  free(b->dv);
  free(b->dk);
  free(b->v);
  free(b->k);
  kvt_ctx_destroy(b->ctx);
}

/* A time below the clock's resolution reads 0: report 0, never inf. */
static double gbps(double bytes, double s) { return s > 0 ? bytes / s / 1e9 : 0.0; }
static double rel(double a, double b) { return b > 0 ? a / b : 0.0; }

static const char *simd_name(int simd) { return simd == KVT_SIMD_AVX2 ? "avx2" : "scalar"; }

static void print_rows(const bench *b, const bench_row *r, int argc, char **argv) {
  const bench_cfg *c = &b->c;
  const double raw = 2.0 * (double)b->half;
  char cpu[256];
  cli_cpu_model(cpu, sizeof(cpu));
  const int simd = kvt_ctx_simd(b->ctx);
  const char *kern = kvt_kernels_for(b->ctx)->name;
  if (c->json) {
    printf("{\"machine\": {\"cpu\": ");
    cli_json_str(stdout, cpu);
    printf(", \"cpus_online\": %u, \"simd\": \"%s\", \"kernels\": \"%s\", \"threads\": 1},\n",
           cli_cpu_count(), simd_name(simd), kern);
    printf(" \"shape\": {\"layers\": %u, \"tokens\": %u, \"heads\": %u, \"head_dim\": %u, "
           "\"dtype\": \"%s\"}, \"raw_bytes\": %.0f, \"zstd\": %d, \"min_iters\": %u, "
           "\"min_time_s\": %g,\n \"presets\": [",
           c->layers, c->tokens, c->heads, c->head_dim, kvt_dtype_name(c->dtype), raw, c->zstd,
           c->iters, c->min_time);
  } else {
    printf("command: kvtier");
    for (int i = 0; i < argc; i++)
      printf(" %s", argv[i]);
    printf("\nmachine: %s, %u CPUs online; simd %s (kernel table: %s); 1 thread\n", cpu,
           cli_cpu_count(), simd_name(simd), kern);
    printf("chunk: %u layers x %u tokens x %u heads x %u dim, %s: %.0f raw K+V bytes; "
           "zstd %s; medians of >= %u iterations and >= %g s per preset\n\n",
           c->layers, c->tokens, c->heads, c->head_dim, kvt_dtype_name(c->dtype), raw,
           c->zstd ? "on" : "off", c->iters, c->min_time);
    printf("%-16s %10s %6s %s%6s %8s %8s %8s %7s %7s\n", "preset", "bytes", "ratio",
           c->zstd ? " zstd gain " : "", "iters", "memcpy", "encode", "decode", "enc/mc", "dec/mc");
    printf("%-16s %10s %6s %s%6s %8s %8s %8s %7s %7s\n", "", "", "", c->zstd ? "           " : "",
           "", "GB/s", "GB/s", "GB/s", "", "");
  }
  for (size_t i = 0; i < N_BENCH; i++) {
    const bench_row *x = &r[i];
    const double m = gbps(raw, x->memcpy_s), e = gbps(raw, x->enc_s), d = gbps(raw, x->dec_s);
    if (c->json)
      printf("%s\n  {\"preset\": \"%s\", \"spec\": \"%s\", \"bytes\": %llu, \"ratio\": %.6f, "
             "\"bytes_without_zstd\": %llu, \"iters\": %u, \"memcpy_gbps\": %.4f, "
             "\"encode_gbps\": %.4f, \"decode_gbps\": %.4f, \"encode_vs_memcpy\": %.4f, "
             "\"decode_vs_memcpy\": %.4f}",
             i ? "," : "", bench_specs[i], x->spec, (unsigned long long)x->bytes,
             (double)x->bytes / raw, (unsigned long long)x->bytes_lossy, x->iters, m, e, d, e / m,
             d / m);
    else if (c->zstd)
      printf("%-16s %10llu %6.3f %9.3fx %6u %8.2f %8.3f %8.3f %7.3f %7.3f\n", bench_specs[i],
             (unsigned long long)x->bytes, (double)x->bytes / raw,
             (double)x->bytes_lossy / (double)x->bytes, x->iters, m, e, d, rel(e, m), rel(d, m));
    else
      printf("%-16s %10llu %6.3f %6u %8.2f %8.3f %8.3f %7.3f %7.3f\n", bench_specs[i],
             (unsigned long long)x->bytes, (double)x->bytes / raw, x->iters, m, e, d, rel(e, m),
             rel(d, m));
  }
  if (c->json)
    printf("]}\n");
  else
    printf("\nGB/s: raw 16-bit K+V bytes per second (1e9). decode includes checksum "
           "verification.%s\n",
           c->zstd ? "\nzstd gain: payload without the lossless stage / with it (synthetic data: "
                     "indicative only)."
                   : "");
}

static int bench_parse(int argc, char **argv, bench_cfg *c) {
  *c = (bench_cfg){32, 256, 8, 128, 7, 0.5, "bf16", "auto", 0, 0, 0, 0};
  const cli_opt opts[] = {
      {"--layers", NULL, CLI_U32, &c->layers, 1, KVT_MAX_LAYERS},
      {"--tokens", NULL, CLI_U32, &c->tokens, 1, KVT_MAX_TOKENS},
      {"--heads", NULL, CLI_U32, &c->heads, 1, KVT_MAX_HEADS},
      {"--head-dim", NULL, CLI_U32, &c->head_dim, 2, KVT_MAX_HEAD_DIM},
      {"--dtype", NULL, CLI_STR, &c->dtype_s, 0, 0},
      {"--iters", NULL, CLI_U32, &c->iters, 1, MAX_ITERS},
      {"--min-time", NULL, CLI_DBL, &c->min_time, 0, 600},
      {"--simd", NULL, CLI_STR, &c->simd_s, 0, 0},
      {"--zstd", NULL, CLI_INT, &c->zstd, 0, 19},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0},
  };
  size_t n_pos;
  int rc =
      cli_parse("bench codec", argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0, &n_pos);
  if (rc == CLI_HELP)
    fputs(bench_help, stdout);
  if (rc)
    return rc;
  if ((c->dtype = cli_parse_dtype(c->dtype_s)) < 0)
    return cli_usage_error("bench codec", "--dtype: expected bf16 or fp16, got '%s'", c->dtype_s);
  if (strcmp(c->simd_s, "auto") == 0)
    c->simd = KVT_SIMD_AUTO;
  else if (strcmp(c->simd_s, "scalar") == 0)
    c->simd = KVT_SIMD_SCALAR;
  else if (strcmp(c->simd_s, "avx2") == 0)
    c->simd = KVT_SIMD_AVX2;
  else
    return cli_usage_error("bench codec", "--simd: expected auto, scalar or avx2, got '%s'",
                           c->simd_s);
  if (c->zstd && !kvt_has_feature("zstd"))
    return cli_usage_error("bench codec", "--zstd: this build has no zstd");
  return 0;
}

int cli_bench_gpu_main(int argc, char **argv); /* cli_bench_gpu.c */
int cli_bench_attn_main(int argc, char **argv); /* cli_bench_attn.c */
int cli_bench_offload_main(int argc, char **argv); /* cli_bench_offload.c */
#ifdef KVT_HAVE_HIREDIS
int cli_bench_redis_main(int argc, char **argv); /* cli_bench_redis.c */
#endif
#ifdef KVT_HAVE_FABRIC
int cli_bench_fabric_main(int argc, char **argv); /* cli_bench_fabric.c */
#endif

int cli_bench_main(int argc, char **argv) {
#ifdef KVT_HAVE_HIREDIS
  if (argc >= 2 && strcmp(argv[1], "redis") == 0)
    return cli_bench_redis_main(argc - 1, argv + 1);
#endif
#ifdef KVT_HAVE_FABRIC
  if (argc >= 2 && strcmp(argv[1], "fabric") == 0)
    return cli_bench_fabric_main(argc - 1, argv + 1);
#endif
  if (argc >= 2 && strcmp(argv[1], "gpu") == 0)
    return cli_bench_gpu_main(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "offload") == 0)
    return cli_bench_offload_main(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "attn") == 0)
    return cli_bench_attn_main(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "tier") == 0)
    return cli_bench_tier_main(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "cache") == 0)
    return cli_bench_cache_main(argc - 1, argv + 1);
  if (argc < 2 || strcmp(argv[1], "codec") != 0) {
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
      fputs(bench_help, stdout);
      return CLI_OK;
    }
    return cli_usage_error("bench", "expected 'kvtier bench codec|tier|cache|gpu|offload|attn|redis|fabric [OPTIONS]'");
  }
  bench b;
  memset(&b, 0, sizeof(b));
  int rc = bench_parse(argc - 1, argv + 1, &b.c);
  if (rc)
    return rc == CLI_HELP ? CLI_OK : rc;
  bench_row rows[N_BENCH];
  memset(rows, 0, sizeof(rows));
  rc = bench_setup(&b);
  for (size_t i = 0; i < N_BENCH && rc == 0; i++)
    rc = bench_preset(&b, bench_specs[i], &rows[i]);
  if (rc == 0)
    print_rows(&b, rows, argc, argv);
  bench_free(&b);
  return rc;
}
