/* bench/cli_bench_attn.c - `kvtier bench attn`: decode attention over
 * compressed paged caches (kvtier/attn.h) for every format, against
 * cudaMemcpy device-to-device bandwidth and our own bf16 kernel, all
 * measured in the same run (STYLE.md: a claim is a ratio against a
 * baseline). The comparison with the fastest bf16 decode (torch SDPA's
 * backends, FlashInfer) is bench/attn_harness.py. */
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "kvtier/attn.h"
#include "synth.h"

int cli_bench_attn_main(int argc, char **argv);

static const char attn_help[] =
    "Usage: kvtier bench attn [--iters N] [--dtype bf16|fp16] [--block-size B] "
    "[--quick | --shape BxT] [--format F] [--splits N]\n"
    "\n"
    "On the first CUDA device, one layer of Llama-3.1-8B attention (32 query "
    "heads,\n"
    "8 KV heads, head_dim 128) decoding one token per sequence over paged "
    "caches\n"
    "(pages in shuffled order, filled by kvt_attn_append from synthetic K/V "
    "with\n"
    "outlier key channels), for batch x context 32 x 8K, 8 x 32K, 8 x 128K, 1 x "
    "32K,\n"
    "4 x 4K, 64 x 2K and 16 x 1K (--quick: the first three), every format (raw "
    "bf16 =\n"
    "our baseline kernel, k16v8, fp8, int4). Times kvt_attn_decode (split kernel "
    "and\n"
    "combine) with CUDA events, the L2 cache flushed before each iteration, "
    "and\n"
    "reports medians: microseconds, KV bytes read (codes + scales) per second, "
    "the\n"
    "ratio of that to cudaMemcpyAsync device-to-device bandwidth of a 1 GiB "
    "buffer\n"
    "measured in the same run (read + write bytes per second), and the "
    "speed-up\n"
    "over the raw format at the same shape. Our raw kernel is not the fastest "
    "bf16\n"
    "decode a user could pick: bench/attn_harness.py times every torch SDPA "
    "backend\n"
    "(cuDNN was the fastest on an H200) and FlashInfer when importable, and "
    "reports\n"
    "speed-ups against the fastest of them.\n"
    "\n"
    "Options:\n"
    "  --iters N        timed iterations per measurement (20), after 2 "
    "warm-ups\n"
    "  --dtype T        bf16 or fp16 (bf16)\n"
    "  --block-size B   tokens per page: 16, 32, 64, 128 or 256 (16)\n"
    "  --quick          only 32 x 8K, 8 x 32K and 8 x 128K\n"
    "  --shape BxT      only batch B x context T (T a multiple of the block "
    "size,\n"
    "                   B x T at most 4M tokens), e.g. 8x65536\n"
    "  --format F       only format F: raw, k16v8, fp8 or int4 (vs raw is "
    "then 0)\n"
    "  --splits N       context splits per sequence, 1 to 64, instead of the "
    "library's\n"
    "                   choice (kvt_attn_decode_splits): to see what the "
    "choice costs\n";

#ifndef KVT_HAVE_CUDA

int cli_bench_attn_main(int argc, char **argv) {
  return cli_without_cuda("bench attn", argc, argv, attn_help);
}

#else
#include <cuda_runtime_api.h>

#define HQ 32
#define HKV 8
#define HDIM 128
#define MAX_ITERS 200
#define FLUSH_BYTES (512ull << 20)
#define FILL_TOKENS 4096u
/* Distinct synthetic chunks of FILL_TOKENS tokens, made once per run and
 * cycled through every cache: synthesizing each chunk of every cache on the
 * host took minutes per run, and repeated values change nothing a decode
 * kernel's speed depends on (no compression, every byte read). */
#define FILL_SOURCES 8

static const char *const fmt_names[] = {"raw", "k16v8", "fp8", "int4"};

typedef struct ashape {
  uint32_t batch, ctx;
} ashape;

static const ashape shapes[] = {{32, 8192}, {8, 32768}, {8, 131072}, {1, 32768},
                                {4, 4096},  {64, 2048}, {16, 1024}};

typedef struct abench {
  kvt_ctx *ctx;
  cudaStream_t st;
  cudaEvent_t e0, e1;
  void *flush;
  uint32_t iters, bs, sms, splits;
  int dtype, only_fmt; /* -1: every format */
  double *t;
  void *src_k[FILL_SOURCES], *src_v[FILL_SOURCES]; /* device, 16-bit K/V */
  int have_src;
} abench;

static int cu(cudaError_t e, const char *what) {
  if (e == cudaSuccess)
    return 0;
  cli_error("bench attn: %s: %s", what, cudaGetErrorString(e));
  return CLI_EFAIL;
}

static int kv_fail(abench *a, const char *what, int rc) {
  cli_error("bench attn: %s: %s: %s", what, kvt_err_name(rc),
            kvt_ctx_last_error(a->ctx));
  return CLI_EFAIL;
}

/* Median seconds of `iters` runs of fn(arg) on the stream, L2 flushed first. */
static int time_it(abench *a, int (*fn)(abench *, void *), void *arg,
                   double *sec) {
  for (uint32_t i = 0; i < a->iters + 2; i++) {
    int rc =
        cu(cudaMemsetAsync(a->flush, (int)i, FLUSH_BYTES, a->st), "flush L2");
    if (!rc)
      rc = cu(cudaEventRecord(a->e0, a->st), "event");
    if (!rc)
      rc = fn(a, arg);
    if (!rc)
      rc = cu(cudaEventRecord(a->e1, a->st), "event");
    if (!rc)
      rc = cu(cudaEventSynchronize(a->e1), "sync");
    if (rc)
      return rc;
    float ms = 0;
    if ((rc = cu(cudaEventElapsedTime(&ms, a->e0, a->e1), "elapsed")))
      return rc;
    if (i >= 2)
      a->t[i - 2] = ms * 1e-3;
  }
  *sec = cli_median(a->t, a->iters);
  return 0;
}

typedef struct copy_arg {
  void *dst, *src;
  size_t n;
} copy_arg;

static int run_copy(abench *a, void *arg) {
  const copy_arg *c = arg;
  return cu(
      cudaMemcpyAsync(c->dst, c->src, c->n, cudaMemcpyDeviceToDevice, a->st),
      "copy");
}

typedef struct dec_arg {
  kvt_attn_cache cache;
  kvt_attn_decode_params p;
} dec_arg;

static int run_decode(abench *a, void *arg) {
  dec_arg *d = arg;
  const int rc = kvt_attn_decode(a->ctx, &d->cache, &d->p, a->st);
  return rc ? kv_fail(a, "kvt_attn_decode", rc) : 0;
}

/* FILL_SOURCES chunks of synthetic K/V (keys with outlier channels), made
 * on the host and uploaded once. */
static int sources_make(abench *a) {
  if (a->have_src)
    return 0;
  const size_t tile = (size_t)FILL_TOKENS * HKV * HDIM * 2;
  uint16_t *hk = malloc(tile), *hv = malloc(tile);
  int rc = !hk || !hv ? CLI_EFAIL : 0;
  kvt_synth_shape s = {1, FILL_TOKENS, HKV, HDIM, a->dtype, 4, 20.0f};
  for (uint32_t i = 0; i < FILL_SOURCES && !rc; i++) {
    kvt_synth_kv(&s, 7 + i, hk, hv);
    rc = cu(cudaMalloc(&a->src_k[i], tile), "cudaMalloc") ||
         cu(cudaMalloc(&a->src_v[i], tile), "cudaMalloc") ||
         cu(cudaMemcpy(a->src_k[i], hk, tile, cudaMemcpyHostToDevice),
            "upload") ||
         cu(cudaMemcpy(a->src_v[i], hv, tile, cudaMemcpyHostToDevice),
            "upload");
  }
  free(hk), free(hv);
  a->have_src = rc == 0;
  return rc;
}

/* A device cache of `tokens` slots for format f, filled through
 * kvt_attn_append from the synthetic chunks in turn. */
static int cache_make(abench *a, int f, uint32_t tokens, kvt_attn_cache *c) {
  memset(c, 0, sizeof(*c));
  c->struct_size = sizeof(*c);
  c->format = f;
  c->dtype = a->dtype;
  c->num_blocks = tokens / a->bs;
  c->block_size = a->bs;
  c->kv_heads = HKV;
  c->head_dim = HDIM;
  const size_t rows = (size_t)tokens * HKV;
  const size_t kr = kvt_attn_row_bytes(f, HDIM, 0),
               vr = kvt_attn_row_bytes(f, HDIM, 1);
  const size_t ks = kvt_attn_scale_bytes(f, HDIM, 0),
               vs = kvt_attn_scale_bytes(f, HDIM, 1);
  int rc = cu(cudaMalloc(&c->k, rows * kr), "cudaMalloc K") ||
           cu(cudaMalloc(&c->v, rows * vr), "cudaMalloc V");
  if (!rc && ks)
    rc = cu(cudaMalloc(&c->k_scale, rows * ks), "cudaMalloc K scales");
  if (!rc && vs)
    rc = cu(cudaMalloc(&c->v_scale, rows * vs), "cudaMalloc V scales");
  if (rc)
    return rc;
  int64_t *hs = malloc(sizeof(int64_t) * FILL_TOKENS);
  void *ds = NULL;
  if (!hs)
    rc = CLI_EFAIL;
  if (!rc)
    rc = sources_make(a) ||
         cu(cudaMalloc(&ds, sizeof(int64_t) * FILL_TOKENS), "cudaMalloc");
  for (uint32_t t0 = 0; !rc && t0 < tokens; t0 += FILL_TOKENS) {
    const uint32_t n = tokens - t0 < FILL_TOKENS ? tokens - t0 : FILL_TOKENS;
    for (uint32_t i = 0; i < n; i++)
      hs[i] = (int64_t)t0 + i;
    rc = cu(cudaMemcpy(ds, hs, sizeof(int64_t) * n, cudaMemcpyHostToDevice),
            "upload");
    if (rc)
      break;
    const uint32_t src = (t0 / FILL_TOKENS) % FILL_SOURCES;
    kvt_attn_append_params ap = KVT_ATTN_APPEND_PARAMS_INIT;
    ap.batch = n;
    ap.k = a->src_k[src];
    ap.v = a->src_v[src];
    ap.slots = ds;
    const int e = kvt_attn_append(a->ctx, c, &ap, a->st);
    if (e)
      rc = kv_fail(a, "kvt_attn_append", e);
    else
      rc = cu(cudaStreamSynchronize(a->st), "append");
  }
  free(hs);
  cudaFree(ds);
  return rc;
}

static void cache_free(kvt_attn_cache *c) {
  cudaFree(c->k), cudaFree(c->v), cudaFree(c->k_scale), cudaFree(c->v_scale);
  memset(c, 0, sizeof(*c));
}

/* Block table: sequence b's blocks are a shuffled set of pages. */
static int table_make(abench *a, const ashape *s, int32_t **dtab,
                      int32_t **dlens) {
  const uint32_t mb = s->ctx / a->bs, pages = s->batch * mb;
  int32_t *h = malloc(sizeof(int32_t) * pages),
          *l = malloc(sizeof(int32_t) * s->batch);
  if (!h || !l) {
    free(h), free(l);
    return CLI_EFAIL;
  }
  kvt_rng r = {1234};
  for (uint32_t i = 0; i < pages; i++)
    h[i] = (int32_t)i;
  for (uint32_t i = pages - 1; i > 0; i--) {
    const uint32_t j = (uint32_t)(kvt_rng_next(&r) % (i + 1));
    const int32_t t = h[i];
    h[i] = h[j], h[j] = t;
  }
  for (uint32_t b = 0; b < s->batch; b++)
    l[b] = (int32_t)s->ctx;
  int rc =
      cu(cudaMalloc((void **)dtab, sizeof(int32_t) * pages),
         "cudaMalloc table") ||
      cu(cudaMalloc((void **)dlens, sizeof(int32_t) * s->batch),
         "cudaMalloc lens") ||
      cu(cudaMemcpy(*dtab, h, sizeof(int32_t) * pages, cudaMemcpyHostToDevice),
         "table") ||
      cu(cudaMemcpy(*dlens, l, sizeof(int32_t) * s->batch,
                    cudaMemcpyHostToDevice),
         "lens");
  free(h), free(l);
  return rc;
}

static int bench_shape(abench *a, const ashape *s, double copy_bw) {
  const uint32_t tokens = s->batch * s->ctx;
  int32_t *dtab = NULL, *dlens = NULL;
  void *dq = NULL, *dout = NULL, *dws = NULL;
  int rc = table_make(a, s, &dtab, &dlens);
  const size_t qbytes = (size_t)s->batch * HQ * HDIM * 2;
  if (!rc)
    rc = cu(cudaMalloc(&dq, qbytes), "cudaMalloc q") ||
         cu(cudaMalloc(&dout, qbytes), "cudaMalloc out") ||
         cu(cudaMemset(dq, 0x3C, qbytes),
            "q"); /* 0x3C3C: 0.0115 in bf16, 1.06 in fp16 */
  double t_raw = 0;
  for (int f = 0; f < 4 && !rc; f++) {
    if (a->only_fmt >= 0 && f != a->only_fmt)
      continue;
    dec_arg d;
    if ((rc = cache_make(a, f, tokens, &d.cache)))
      break;
    kvt_attn_decode_params p = KVT_ATTN_DECODE_PARAMS_INIT;
    p.batch = s->batch;
    p.q_heads = HQ;
    p.max_blocks = s->ctx / a->bs;
    p.max_seq_len = s->ctx;
    p.softmax_scale = 0.08838834764831845f;
    p.q = dq;
    p.block_table = dtab;
    p.seq_lens = dlens;
    p.out = dout;
    p.num_splits = a->splits;
    size_t ws = 0;
    uint32_t splits = 0;
    int e = kvt_attn_workspace_size(a->ctx, &d.cache, &p, &ws);
    if (!e)
      e = kvt_attn_decode_splits(a->ctx, &d.cache, &p, &splits);
    if (e) {
      rc = kv_fail(a, "kvt_attn_workspace_size", e);
      cache_free(&d.cache);
      break;
    }
    if (ws && !dws &&
        (rc = cu(cudaMalloc(&dws, (size_t)64 << 20), "cudaMalloc workspace")))
      break;
    if (ws > ((size_t)64 << 20)) {
      cli_error("bench attn: workspace of %zu bytes", ws);
      rc = CLI_EFAIL;
      break;
    }
    p.workspace = dws;
    p.workspace_size = (size_t)64 << 20;
    d.p = p;
    double sec = 0;
    rc = time_it(a, run_decode, &d, &sec);
#ifdef KVT_ATTN_TRACE
    { /* diagnostic builds: the per-CTA timeline (bench/attn_trace.py) */
      extern int kvt_attnrt_trace_read(unsigned long long *dst, size_t n);
      static unsigned long long tr[4 * 65536];
      const char *tf = getenv("KVT_ATTN_TRACE_FILE");
      if (!rc && tf && !kvt_attnrt_trace_read(tr, 4 * 65536)) {
        FILE *fp = fopen(tf, "a");
        const uint32_t kg = f == 3 ? 2 : 1; /* INT4 pairs: HKV is even */
        const size_t n = (size_t)splits * (HKV / kg) * s->batch;
        for (size_t i = 0; fp && i < n && i < 65536; i++)
          fprintf(fp, "%s %u %u %zu %llu %llu %llu %llu\n", fmt_names[f],
                  s->batch, s->ctx, i, tr[4 * i], tr[4 * i + 1],
                  tr[4 * i + 2], tr[4 * i + 3]);
        if (fp)
          fclose(fp);
      }
    }
#endif
    cache_free(&d.cache);
    if (rc)
      break;
    const double bytes = (double)tokens * HKV *
                         (double)(kvt_attn_row_bytes(f, HDIM, 0) +
                                  kvt_attn_row_bytes(f, HDIM, 1) +
                                  kvt_attn_scale_bytes(f, HDIM, 0) +
                                  kvt_attn_scale_bytes(f, HDIM, 1));
    if (f == 0)
      t_raw = sec;
    printf("%4u x %6u  %-6s %6u %10.1f %8.3f %10.1f %8.2f %7.2f\n", s->batch,
           s->ctx, fmt_names[f], splits, sec * 1e6, bytes / 1e9,
           bytes / sec / 1e9, bytes / sec / copy_bw,
           t_raw > 0 ? t_raw / sec : 0.0);
    fflush(stdout);
  }
  cudaFree(dtab), cudaFree(dlens), cudaFree(dq), cudaFree(dout), cudaFree(dws);
  return rc;
}

static int copy_bandwidth(abench *a, double *bw) {
  copy_arg c = {NULL, NULL, (size_t)1 << 30};
  int rc = cu(cudaMalloc(&c.src, c.n), "cudaMalloc") ||
           cu(cudaMalloc(&c.dst, c.n), "cudaMalloc") ||
           cu(cudaMemset(c.src, 1, c.n), "memset");
  double sec = 0;
  if (!rc)
    rc = time_it(a, run_copy, &c, &sec);
  cudaFree(c.src), cudaFree(c.dst);
  *bw = rc ? 0 : 2.0 * (double)c.n / sec;
  return rc;
}

int cli_bench_attn_main(int argc, char **argv) {
  uint32_t iters = 20, bs = 16;
  const char *dtype_s = "bf16";
  const char *shape_s = NULL, *format_s = NULL;
  uint32_t splits = 0;
  int quick = 0;
  const cli_opt opts[] = {
      {"--iters", NULL, CLI_U32, &iters, 1, MAX_ITERS},
      {"--dtype", NULL, CLI_STR, &dtype_s, 0, 0},
      {"--block-size", NULL, CLI_U32, &bs, 16, 256},
      {"--quick", NULL, CLI_FLAG, &quick, 0, 0},
      {"--shape", NULL, CLI_STR, &shape_s, 0, 0},
      {"--format", NULL, CLI_STR, &format_s, 0, 0},
      {"--splits", NULL, CLI_U32, &splits, 1, KVT_ATTN_MAX_SPLITS},
  };
  size_t npos = 0;
  int rc = cli_parse("bench attn", argc, argv, opts,
                     sizeof(opts) / sizeof(opts[0]), NULL, 0, &npos);
  if (rc == CLI_HELP) {
    fputs(attn_help, stdout);
    return CLI_OK;
  }
  if (rc)
    return rc;
  abench a;
  memset(&a, 0, sizeof(a));
  a.iters = iters;
  a.bs = bs;
  a.splits = splits;
  a.only_fmt = -1;
  if (format_s) {
    for (int f = 0; f < 4; f++)
      if (strcmp(format_s, fmt_names[f]) == 0)
        a.only_fmt = f;
    if (a.only_fmt < 0)
      return cli_usage_error(
          "bench attn", "--format: expected raw, k16v8, fp8 or int4, got '%s'",
          format_s);
  }
  if ((a.dtype = cli_parse_dtype(dtype_s)) < 0)
    return cli_usage_error("bench attn",
                           "--dtype: expected bf16 or fp16, got '%s'", dtype_s);
  if (bs & (bs - 1))
    return cli_usage_error("bench attn",
                           "--block-size: 16, 32, 64, 128 or 256");
  ashape one = {0, 0};
  if (shape_s) {
    char tail = 0;
    if (quick)
      return cli_usage_error("bench attn", "--shape and --quick together");
    if (sscanf(shape_s, "%ux%u%c", &one.batch, &one.ctx, &tail) != 2 ||
        one.batch == 0 || one.ctx == 0 || one.ctx % bs ||
        (uint64_t)one.batch * one.ctx > ((uint64_t)4 << 20))
      return cli_usage_error(
          "bench attn",
          "--shape: expected BxT with T a multiple of the block size (%u) "
          "and B x T at most 4M tokens, got '%s'",
          bs, shape_s);
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    cli_error("bench attn: no CUDA device");
    return CLI_EFAIL;
  }
  if ((rc = kvt_ctx_create(NULL, &a.ctx)))
    return kv_fail(&a, "context", rc);
  a.t = calloc(iters, sizeof(double));
  rc = !a.t ||
       cu(cudaStreamCreateWithFlags(&a.st, cudaStreamNonBlocking), "stream") ||
       cu(cudaEventCreate(&a.e0), "event") ||
       cu(cudaEventCreate(&a.e1), "event") ||
       cu(cudaMalloc(&a.flush, FLUSH_BYTES), "cudaMalloc flush");
  double copy_bw = 0;
  if (!rc)
    rc = copy_bandwidth(&a, &copy_bw);
  if (!rc) {
    struct cudaDeviceProp prop;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    a.sms = (uint32_t)prop.multiProcessorCount;
    printf("device: %s, %d SMs; cudaMemcpy D2D of 1 GiB: %.1f GB/s (read + "
           "write)\n",
           prop.name, prop.multiProcessorCount, copy_bw / 1e9);
    printf("decode attention, %d q heads, %d kv heads, dim %d, %s, block %u; "
           "medians of %u\n",
           HQ, HKV, HDIM, dtype_s, bs, iters);
    printf("   B x      T  format splits         us    KV GB  read GB/s  vs "
           "copy  vs raw\n");
    const size_t n =
        shape_s ? 1 : quick ? 3 : sizeof(shapes) / sizeof(shapes[0]);
    for (size_t i = 0; i < n && !rc; i++)
      rc = bench_shape(&a, shape_s ? &one : &shapes[i], copy_bw);
  }
  cudaFree(a.flush);
  for (int i = 0; i < FILL_SOURCES; i++)
    cudaFree(a.src_k[i]), cudaFree(a.src_v[i]);
  if (a.st)
    cudaStreamDestroy(a.st);
  free(a.t);
  kvt_ctx_destroy(a.ctx);
  return rc ? CLI_EFAIL : CLI_OK;
}
#endif
