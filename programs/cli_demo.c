/* programs/cli_demo.c - `kvtier demo`: synthetic KV of a real model's shape,
 * encoded chunk by chunk with every preset as the cache would, decoded back,
 * and judged by element error and by the attention output it gives random
 * queries against a double-precision reference on the original values. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_demo_cache.h"
#include "cli_util.h"
#include "synth.h"

static const char demo_help[] =
    "Usage: kvtier demo [--layers L] [--tokens T] [--heads H] [--head-dim D]\n"
    "                   [--dtype bf16|fp16] [--seed S] [--queries Q] [--json]\n"
    "\n"
    "Builds synthetic KV (keys with fixed outlier channels, values Gaussian), cuts it\n"
    "into chunks of 256 tokens, encodes each chunk into its own payload (chained\n"
    "chunk keys, as the cache stores them) with every preset, decodes it back, and\n"
    "prints per preset: bytes, ratio to raw 16-bit, max abs and relative L2 error of\n"
    "K and of V, the attention-output error, and encode/decode throughput.\n"
    "Attention error: for sampled layers and KV heads, 4 query heads per KV head\n"
    "(GQA) with Q random queries each, q ~ N(0,1)/sqrt(D), softmax(q.K^T) V over all\n"
    "tokens in double from the original and from the decoded values;\n"
    "||o - o_ref|| / ||o_ref||, median and max over queries.\n"
    "\n"
    "Options (defaults: the Llama-3.1-8B KV shape at a long context):\n"
    "  --layers L        layers (32)\n"
    "  --tokens T        context length in tokens (4096)\n"
    "  --heads H         KV heads (8)\n"
    "  --head-dim D      head dimension (128)\n"
    "  --dtype bf16|fp16 source element type (bf16)\n"
    "  --seed S          synthetic data and query seed (1)\n"
    "  --queries Q       random queries per sampled query head (8)\n"
    "  --chunk-tokens N  tokens per chunk and payload (256)\n"
    "  --threads N       worker threads (online CPUs, at most 8); throughput is per\n"
    "                    thread (raw bytes over the time spent in the calls)\n"
    "  --no-cache        skip the cache section\n"
    "  --cache-dir DIR   where the cache section's nvme tier makes its temporary\n"
    "                    directory ($TMPDIR, else /var/tmp)\n"
    "  --json            machine-readable output\n"
    "  --pd              the prefill -> decode flow instead: two processes that share\n"
    "                    only a remote tier (kvtier demo --pd --help)\n"
    "\n"
    "Cache section: the context again, as k16v8 payloads put in order through a\n"
    "cache of a DRAM tier holding about 40%% of it and an NVMe tier below; then a\n"
    "prefix lookup and every chunk read back and compared byte for byte, with the\n"
    "tier each chunk came from and the read bandwidth of each tier.\n";

#define GQA_GROUP 4   /* query heads per KV head sampled */
#define MAX_SAMPLES 8 /* (layer, KV head) planes for the attention check */
#define MAX_WORKERS 8

static const char *const demo_specs[] = {
    "raw", "k16v8", "fp8", "int8", "k16v4", "k8v4", "int4,kgroup=token", "int4,kgroup=dim",
};
#define N_SPECS (sizeof(demo_specs) / sizeof(demo_specs[0]))

typedef struct demo_cfg {
  uint32_t layers, tokens, heads, head_dim, queries, chunk, threads, seed;
  const char *dtype_s, *cache_dir;
  int dtype, json, no_cache;
} demo_cfg;

typedef struct demo_result {
  char spec[KVT_CODEC_SPEC_TEXT_MAX];
  uint64_t bytes;
  double k_max, k_rel, v_max, v_rel, attn_med, attn_max, enc_mbps, dec_mbps;
} demo_result;

/* One worker's context, buffers and sums for one preset pass. */
typedef struct demo_worker {
  kvt_ctx *ctx;
  uint8_t *payload;
  size_t cap;
  uint16_t *dk, *dv; /* one decoded chunk */
  double *scores;    /* attention scratch, one per token */
  double enc_s, dec_s, k_d2, k_x2, k_max, v_d2, v_x2, v_max;
  uint64_t bytes;
  int err;
  char msg[300];
} demo_worker;

typedef struct demo {
  demo_cfg c;
  size_t n;        /* elements of K (and of V) */
  uint16_t *k, *v; /* [layer][token][head][dim] */
  cli_f16_table *lut;
  uint32_t n_samples, s_layer[MAX_SAMPLES], s_head[MAX_SAMPLES];
  float *ref_k, *ref_v, *dec_k, *dec_v; /* per sample: [token][dim] */
  size_t n_queries;
  double *q, *o_ref, *attn_err; /* per query: [dim], [dim], 1 */
  uint32_t n_chunks;
  demo_worker w[MAX_WORKERS];
  /* The preset in flight. */
  kvt_codec_spec spec;
  kvt_key fp, *keys;
  const float *ak, *av; /* planes the attention pass reads */
  double *ao;           /* its outputs, NULL: compare with o_ref */
} demo;

/* Layer l gets its own seed, so layers generate in parallel and the data
 * does not depend on the thread count. */
static void gen_layers(void *arg, unsigned i, unsigned n) {
  demo *d = arg;
  const size_t per = d->n / d->c.layers;
  for (uint32_t l = i; l < d->c.layers; l += n) {
    kvt_synth_shape s = {1, d->c.tokens, d->c.heads, d->c.head_dim, d->c.dtype, 0, 0};
    kvt_rng r = {((uint64_t)d->c.seed << 32) ^ l};
    kvt_synth_kv(&s, kvt_rng_next(&r), d->k + l * per, d->v + l * per);
  }
}

static size_t idx(const demo *d, uint32_t l, uint32_t t, uint32_t h) {
  return (((size_t)l * d->c.tokens + t) * d->c.heads + h) * d->c.head_dim;
}

/* Spreads up to 4 layers and 2 KV heads evenly, first and last included. */
static void pick_samples(demo *d) {
  const uint32_t nl = d->c.layers < 4 ? d->c.layers : 4, nh = d->c.heads < 2 ? d->c.heads : 2;
  d->n_samples = 0;
  for (uint32_t a = 0; a < nl; a++)
    for (uint32_t b = 0; b < nh; b++) {
      d->s_layer[d->n_samples] = nl > 1 ? a * (d->c.layers - 1) / (nl - 1) : 0;
      d->s_head[d->n_samples] = nh > 1 ? b * (d->c.heads - 1) / (nh - 1) : 0;
      d->n_samples++;
    }
}

/* softmax(q.K^T) V in double, q already scaled by 1/sqrt(D). */
static void attend(const double *q, const float *K, const float *V, uint32_t T, uint32_t D,
                   double *scores, double *out) {
  double mx = -INFINITY, sum = 0.0;
  for (uint32_t t = 0; t < T; t++) {
    const float *kt = K + (size_t)t * D;
    double p[4] = {0.0, 0.0, 0.0, 0.0}; /* independent sums: D is even */
    for (uint32_t j = 0; j + 1 < D; j += 2) {
      p[j & 2] += q[j] * kt[j];
      p[(j & 2) + 1] += q[j + 1] * kt[j + 1];
    }
    const double s = (p[0] + p[1]) + (p[2] + p[3]);
    scores[t] = s;
    mx = s > mx ? s : mx;
  }
  for (uint32_t j = 0; j < D; j++)
    out[j] = 0.0;
  for (uint32_t t = 0; t < T; t++) {
    const double w = exp(scores[t] - mx);
    const float *vt = V + (size_t)t * D;
    sum += w;
    for (uint32_t j = 0; j < D; j++)
      out[j] += w * vt[j];
  }
  for (uint32_t j = 0; j < D; j++)
    out[j] /= sum;
}

static void attn_pass(void *arg, unsigned i, unsigned n) {
  demo *d = arg;
  const uint32_t T = d->c.tokens, D = d->c.head_dim;
  const size_t per_sample = (size_t)GQA_GROUP * d->c.queries, plane = (size_t)T * D;
  double o[KVT_MAX_HEAD_DIM];
  for (size_t qi = i; qi < d->n_queries; qi += n) {
    const size_t s = qi / per_sample;
    const double *q = d->q + qi * D;
    double *out = d->ao ? d->ao + qi * D : o;
    attend(q, d->ak + s * plane, d->av + s * plane, T, D, d->w[i].scores, out);
    if (d->ao)
      continue;
    const double *ref = d->o_ref + qi * D;
    double e2 = 0.0, r2 = 0.0;
    for (uint32_t j = 0; j < D; j++) {
      e2 += (out[j] - ref[j]) * (out[j] - ref[j]);
      r2 += ref[j] * ref[j];
    }
    d->attn_err[qi] = r2 > 0.0 ? sqrt(e2 / r2) : sqrt(e2);
  }
}

/* Copies the sampled (layer, head) planes of [layers][tokens][heads][dim]
 * arrays holding tokens t0..t0+nt into float planes. */
static void copy_planes(const demo *d, const uint16_t *k, const uint16_t *v, uint32_t tokens,
                        uint32_t t0, uint32_t nt, float *pk, float *pv) {
  const uint32_t H = d->c.heads, D = d->c.head_dim;
  const size_t plane = (size_t)d->c.tokens * D;
  for (uint32_t s = 0; s < d->n_samples; s++)
    for (uint32_t t = 0; t < nt; t++) {
      const size_t src = (((size_t)d->s_layer[s] * tokens + t) * H + d->s_head[s]) * D;
      float *ok = pk + s * plane + (size_t)(t0 + t) * D,
            *ov = pv + s * plane + (size_t)(t0 + t) * D;
      for (uint32_t j = 0; j < D; j++) {
        ok[j] = d->lut->v[k[src + j]];
        ov[j] = d->lut->v[v[src + j]];
      }
    }
}

/* Sums of squared error and of squares, and the largest error, of n
 * elements; four lanes of partial sums keep the adds independent. */
static void acc_err(const cli_f16_table *lut, const uint16_t *x, const uint16_t *y, size_t n,
                    double *d2, double *x2, double *mx) {
  double a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0}, m = *mx;
  for (size_t i = 0; i < n; i++) {
    const double xi = lut->v[x[i]], di = fabs((double)lut->v[y[i]] - xi);
    a[i & 3] += di * di;
    b[i & 3] += xi * xi;
    m = di > m ? di : m;
  }
  *d2 += (a[0] + a[1]) + (a[2] + a[3]);
  *x2 += (b[0] + b[1]) + (b[2] + b[3]);
  *mx = m;
}

/* Encodes, decodes and measures one chunk. Returns 0 or a library error. */
static int do_chunk(demo *d, demo_worker *w, uint32_t c) {
  const uint32_t L = d->c.layers, T = d->c.tokens, H = d->c.heads, D = d->c.head_dim;
  const uint32_t t0 = c * d->c.chunk, nt = T - t0 < d->c.chunk ? T - t0 : d->c.chunk;
  kvt_kv_view src, dst;
  kvt_kv_view_dense(&src, d->k + idx(d, 0, t0, 0), d->v + idx(d, 0, t0, 0), d->c.dtype, L, nt, H,
                    D);
  src.k_stride[0] = src.v_stride[0] = (int64_t)T * H * D; /* a window of the full context */
  kvt_kv_view_dense(&dst, w->dk, w->dv, d->c.dtype, L, nt, H, D);
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  p.spec = d->spec;
  p.key = d->keys[c];
  p.fingerprint = d->fp;
  p.token_begin = t0;
  size_t len;
  double t = cli_now();
  int rc = kvt_encode(w->ctx, &p, &src, w->payload, w->cap, &len);
  w->enc_s += cli_now() - t;
  if (rc)
    return rc;
  kvt_decode_params dp = KVT_DECODE_PARAMS_INIT;
  dp.expect_key = &d->keys[c];
  dp.expect_fingerprint = &d->fp;
  t = cli_now();
  rc = kvt_decode(w->ctx, w->payload, len, &dp, &dst);
  w->dec_s += cli_now() - t;
  if (rc)
    return rc;
  w->bytes += len;
  const size_t per = (size_t)nt * H * D;
  for (uint32_t l = 0; l < L; l++) {
    acc_err(d->lut, d->k + idx(d, l, t0, 0), w->dk + l * per, per, &w->k_d2, &w->k_x2, &w->k_max);
    acc_err(d->lut, d->v + idx(d, l, t0, 0), w->dv + l * per, per, &w->v_d2, &w->v_x2, &w->v_max);
  }
  copy_planes(d, w->dk, w->dv, nt, t0, nt, d->dec_k, d->dec_v);
  return 0;
}

static void codec_pass(void *arg, unsigned i, unsigned n) {
  demo *d = arg;
  demo_worker *w = &d->w[i];
  for (uint32_t c = i; c < d->n_chunks && !w->err; c += n) {
    int rc = do_chunk(d, w, c);
    if (rc) {
      w->err = rc;
      snprintf(w->msg, sizeof(w->msg), "chunk %u: %s: %s", c, kvt_err_name(rc),
               kvt_ctx_last_error(w->ctx));
    }
  }
}

static int fail(demo *d, const char *what, int rc) {
  cli_error("demo: %s: %s: %s", what, kvt_err_name(rc), kvt_ctx_last_error(d->w[0].ctx));
  return CLI_EFAIL;
}

/* Fingerprint and chained keys of every chunk, over token ids 0..T-1. */
static int make_keys(demo *d, uint32_t *ids) {
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = "synthetic/Llama-3.1-8B-shape";
  m.dtype = d->c.dtype;
  m.layers = d->c.layers;
  m.kv_heads = d->c.heads;
  m.head_dim = d->c.head_dim;
  int rc = kvt_fingerprint(&m, &d->spec, &d->fp);
  for (uint32_t c = 0; c < d->n_chunks && rc == 0; c++) {
    const uint32_t t0 = c * d->c.chunk,
                   nt = d->c.tokens - t0 < d->c.chunk ? d->c.tokens - t0 : d->c.chunk;
    for (uint32_t t = 0; t < nt; t++)
      ids[t] = t0 + t;
    rc = kvt_chunk_key(&d->fp, c ? &d->keys[c - 1] : NULL, ids, nt, &d->keys[c]);
  }
  return rc;
}

static int run_preset(demo *d, const char *text, uint32_t *ids, demo_result *r) {
  int rc = kvt_codec_parse(d->w[0].ctx, text, &d->spec);
  if (rc || (rc = kvt_codec_format(&d->spec, r->spec, sizeof(r->spec))) || (rc = make_keys(d, ids)))
    return fail(d, text, rc);
  double k_d2 = 0, k_x2 = 0, v_d2 = 0, v_x2 = 0, enc_s = 0, dec_s = 0;
  r->bytes = 0;
  r->k_max = r->v_max = 0;
  for (uint32_t i = 0; i < d->c.threads; i++) {
    demo_worker *w = &d->w[i];
    w->enc_s = w->dec_s = w->k_d2 = w->k_x2 = w->k_max = w->v_d2 = w->v_x2 = w->v_max = 0;
    w->bytes = 0;
    w->err = 0;
  }
  cli_parallel(d->c.threads, codec_pass, d);
  for (uint32_t i = 0; i < d->c.threads; i++) {
    const demo_worker *w = &d->w[i];
    if (w->err) {
      cli_error("demo: %s: %s", text, w->msg);
      return CLI_EFAIL;
    }
    k_d2 += w->k_d2, k_x2 += w->k_x2, v_d2 += w->v_d2, v_x2 += w->v_x2;
    enc_s += w->enc_s, dec_s += w->dec_s, r->bytes += w->bytes;
    r->k_max = w->k_max > r->k_max ? w->k_max : r->k_max;
    r->v_max = w->v_max > r->v_max ? w->v_max : r->v_max;
  }
  const double raw = 4.0 * (double)d->n;
  r->k_rel = k_x2 > 0 ? sqrt(k_d2 / k_x2) : 0;
  r->v_rel = v_x2 > 0 ? sqrt(v_d2 / v_x2) : 0;
  r->enc_mbps = enc_s > 0 ? raw / enc_s / 1e6 : 0;
  r->dec_mbps = dec_s > 0 ? raw / dec_s / 1e6 : 0;
  d->ak = d->dec_k, d->av = d->dec_v, d->ao = NULL;
  cli_parallel(d->c.threads, attn_pass, d);
  r->attn_max = 0;
  for (size_t i = 0; i < d->n_queries; i++)
    r->attn_max = d->attn_err[i] > r->attn_max ? d->attn_err[i] : r->attn_max;
  r->attn_med = cli_median(d->attn_err, d->n_queries);
  return 0;
}

static int demo_setup(demo *d) {
  const demo_cfg *c = &d->c;
  const size_t plane = (size_t)d->n_samples * c->tokens * c->head_dim;
  const size_t chunk = (size_t)c->layers * c->chunk * c->heads * c->head_dim;
  d->n = (size_t)c->layers * c->tokens * c->heads * c->head_dim;
  d->n_chunks = (c->tokens + c->chunk - 1) / c->chunk;
  d->n_queries = (size_t)d->n_samples * GQA_GROUP * c->queries;
  d->k = malloc(2 * d->n);
  d->v = malloc(2 * d->n);
  d->lut = malloc(sizeof(*d->lut));
  d->ref_k = malloc(4 * plane);
  d->ref_v = malloc(4 * plane);
  d->dec_k = malloc(4 * plane);
  d->dec_v = malloc(4 * plane);
  d->q = malloc(8 * d->n_queries * c->head_dim);
  d->o_ref = malloc(8 * d->n_queries * c->head_dim);
  d->attn_err = malloc(8 * d->n_queries);
  d->keys = malloc(d->n_chunks * sizeof(*d->keys));
  int ok = d->k && d->v && d->lut && d->ref_k && d->ref_v && d->dec_k && d->dec_v && d->q &&
           d->o_ref && d->attn_err && d->keys;
  for (uint32_t i = 0; i < c->threads && ok; i++) {
    demo_worker *w = &d->w[i];
    int rc = cli_ctx_create(KVT_SIMD_AUTO, &w->ctx);
    if (rc)
      return rc;
    for (size_t s = 0; s < N_SPECS; s++) {
      kvt_codec_spec spec;
      uint64_t bound = 0;
      if ((rc = kvt_codec_parse(w->ctx, demo_specs[s], &spec)) ||
          (rc = kvt_encode_bound(NULL, &spec, 0, c->layers, c->chunk, c->heads, c->head_dim, &bound)))
        return cli_usage_error("demo", "shape %ux%ux%ux%u does not fit preset %s: %s", c->layers,
                               c->chunk, c->heads, c->head_dim, demo_specs[s], kvt_strerror(rc));
      w->cap = bound > w->cap ? bound : w->cap;
    }
    /* Pre-faulted, so the first preset's timings hold no page faults. */
    w->payload = cli_alloc_faulted(w->cap);
    w->dk = cli_alloc_faulted(2 * chunk);
    w->dv = cli_alloc_faulted(2 * chunk);
    w->scores = malloc(8 * (size_t)c->tokens);
    ok = w->payload && w->dk && w->dv && w->scores;
  }
  if (!ok) {
    cli_error("demo: out of memory (the context needs %zu MiB)", 4 * d->n >> 20);
    return CLI_EFAIL;
  }
  return 0;
}

static void demo_free(demo *d) {
  for (uint32_t i = 0; i < MAX_WORKERS; i++) {
    kvt_ctx_destroy(d->w[i].ctx);
    free(d->w[i].payload);
    free(d->w[i].dk);
    free(d->w[i].dv);
    free(d->w[i].scores);
  }
  free(d->keys);
  free(d->attn_err);
  free(d->o_ref);
  free(d->q);
  free(d->dec_v);
  free(d->dec_k);
  free(d->ref_v);
  free(d->ref_k);
  free(d->lut);
  free(d->v);
  free(d->k);
}

/* Synthetic KV, queries and the reference outputs. */
static void demo_prepare(demo *d) {
  cli_f16_table_fill(d->lut, d->c.dtype);
  cli_parallel(d->c.threads, gen_layers, d);
  copy_planes(d, d->k, d->v, d->c.tokens, 0, d->c.tokens, d->ref_k, d->ref_v);
  kvt_rng r = {((uint64_t)d->c.seed << 32) ^ 0x51ull};
  const double scale = 1.0 / sqrt((double)d->c.head_dim);
  for (size_t i = 0; i < d->n_queries * d->c.head_dim; i++)
    d->q[i] = kvt_rng_normal(&r) * scale;
  d->ak = d->ref_k, d->av = d->ref_v, d->ao = d->o_ref;
  cli_parallel(d->c.threads, attn_pass, d);
}

static void sample_list(const demo *d, int heads, char *buf, size_t cap) {
  size_t o = 0;
  buf[0] = '\0';
  for (uint32_t s = 0; s < d->n_samples && o < cap; s++) {
    const uint32_t v = heads ? d->s_head[s] : d->s_layer[s];
    int dup = 0;
    for (uint32_t p = 0; p < s; p++)
      dup |= (heads ? d->s_head[p] : d->s_layer[p]) == v;
    if (!dup)
      o += (size_t)snprintf(buf + o, cap - o, "%s%u", o ? "," : "", v);
  }
}

/* The summary line, from the measured rows: the safe default keeps keys
 * bit-exact (key-fragile model families need that) with the lowest attention
 * error; the capacity pick is the smallest payload, ties broken by error. */
static void takeaway(const demo_result *r, uint64_t raw, char *buf, size_t cap) {
  size_t safe = N_SPECS, exact = N_SPECS, small = 0, tok = N_SPECS, dim = N_SPECS;
  for (size_t i = 0; i < N_SPECS; i++) {
    if (r[i].k_max == 0 && r[i].bytes < raw &&
        (safe == N_SPECS || r[i].attn_med < r[safe].attn_med))
      safe = i;
    if (r[i].bytes < r[small].bytes ||
        (r[i].bytes == r[small].bytes && r[i].attn_med < r[small].attn_med))
      small = i;
    if (strcmp(demo_specs[i], "int4,kgroup=token") == 0)
      tok = i;
    if (strcmp(demo_specs[i], "int4,kgroup=dim") == 0)
      dim = i;
  }
  for (size_t i = 0; i < N_SPECS && safe < N_SPECS; i++)
    if (r[i].k_max == 0 && r[i].bytes < r[safe].bytes &&
        (exact == N_SPECS || r[i].bytes < r[exact].bytes))
      exact = i;
  size_t o = 0;
  buf[0] = '\0';
#define TA_PUT(...)                                                                                \
  o += (size_t)snprintf(buf + (o < cap ? o : cap - 1), o < cap ? cap - o : 0, __VA_ARGS__)
  if (safe < N_SPECS)
    TA_PUT("%s is the safe default: keys bit-exact, attention error %.1f%% median (%.1f%% max), "
           "%.2fx the capacity of raw 16-bit.",
           r[safe].spec, 100 * r[safe].attn_med, 100 * r[safe].attn_max,
           (double)raw / (double)r[safe].bytes);
  if (exact < N_SPECS)
    TA_PUT(" %s keeps keys exact at %.2fx for %.1f%% median.", r[exact].spec,
           (double)raw / (double)r[exact].bytes, 100 * r[exact].attn_med);
  TA_PUT(" Most capacity: %s, %.2fx at %.1f%% median%s.", demo_specs[small],
         (double)raw / (double)r[small].bytes, 100 * r[small].attn_med,
         r[small].k_max > 0 ? " (keys quantized: key-tolerant models only)" : "");
  if (tok < N_SPECS && dim < N_SPECS)
    TA_PUT(" int4 keys grouped along %s beat grouping along %s (%.1f%% vs %.1f%% median).",
           r[tok].attn_med <= r[dim].attn_med ? "tokens" : "head dim",
           r[tok].attn_med <= r[dim].attn_med ? "head dim" : "tokens",
           100 * (r[tok].attn_med <= r[dim].attn_med ? r[tok].attn_med : r[dim].attn_med),
           100 * (r[tok].attn_med <= r[dim].attn_med ? r[dim].attn_med : r[tok].attn_med));
#undef TA_PUT
}

static void print_json(const demo *d, const demo_result *r, const demo_cache_result *cr,
                       double secs) {
  const demo_cfg *c = &d->c;
  char ta[1024];
  takeaway(r, 4 * d->n, ta, sizeof(ta));
  printf("{\"layers\": %u, \"tokens\": %u, \"heads\": %u, \"head_dim\": %u, \"dtype\": \"%s\", "
         "\"seed\": %u,\n \"chunk_tokens\": %u, \"chunks\": %u, \"threads\": %u, "
         "\"raw_bytes\": %zu,\n \"attention\": {\"samples\": [",
         c->layers, c->tokens, c->heads, c->head_dim, kvt_dtype_name(c->dtype), c->seed, c->chunk,
         d->n_chunks, c->threads, 4 * d->n);
  for (uint32_t s = 0; s < d->n_samples; s++)
    printf("%s{\"layer\": %u, \"kv_head\": %u}", s ? ", " : "", d->s_layer[s], d->s_head[s]);
  printf("], \"query_heads_per_kv_head\": %d, \"queries_per_query_head\": %u, "
         "\"queries\": %zu},\n \"presets\": [",
         GQA_GROUP, c->queries, d->n_queries);
  for (size_t i = 0; i < N_SPECS; i++) {
    printf("%s\n  {\"preset\": \"%s\", \"spec\": ", i ? "," : "", demo_specs[i]);
    cli_json_str(stdout, r[i].spec);
    printf(", \"bytes\": %llu, \"ratio\": %.6f, \"k_max_abs_err\": %.6g, \"k_rel_err\": %.6g, "
           "\"v_max_abs_err\": %.6g, \"v_rel_err\": %.6g, \"attn_rel_err_median\": %.6g, "
           "\"attn_rel_err_max\": %.6g, \"encode_mbps\": %.1f, \"decode_mbps\": %.1f}",
           (unsigned long long)r[i].bytes, (double)r[i].bytes / (4.0 * (double)d->n), r[i].k_max,
           r[i].k_rel, r[i].v_max, r[i].v_rel, r[i].attn_med, r[i].attn_max, r[i].enc_mbps,
           r[i].dec_mbps);
  }
  printf("],\n \"takeaway\": ");
  cli_json_str(stdout, ta);
  if (cr)
    demo_cache_print_json(cr);
  printf(",\n \"seconds\": %.2f}\n", secs);
}

static void print_text(const demo *d, const demo_result *r, double secs) {
  const demo_cfg *c = &d->c;
  char ls[64], hs[64];
  sample_list(d, 0, ls, sizeof(ls));
  sample_list(d, 1, hs, sizeof(hs));
  printf("kvtier demo: %u layers x %u tokens x %u KV heads x %u dim, %s, seed %u%s\n", c->layers,
         c->tokens, c->heads, c->head_dim, kvt_dtype_name(c->dtype), c->seed,
         c->layers == 32 && c->heads == 8 && c->head_dim == 128 ? " (the Llama-3.1-8B KV shape)"
                                                                : "");
  printf("  data:      synthetic: keys N(0,1) per channel plus 4 fixed outlier channels per layer\n"
         "             and head (offset and gain up to 20x); values N(0,1)\n");
  printf(
      "  cache use: %u chunks of %u tokens, one payload each, keys chained over token ids\n"
      "             0..%u; each payload decoded back with key, fingerprint and checksums checked\n",
      d->n_chunks, c->chunk, c->tokens - 1);
  printf("  attention: layers %s x KV heads %s x %d query heads (GQA) x %u queries = %zu queries;\n"
         "             q ~ N(0,1)/sqrt(%u), softmax(q.K^T) V over %u tokens in double, decoded vs\n"
         "             original; error ||o - o_ref|| / ||o_ref||\n",
         ls, hs, GQA_GROUP, c->queries, d->n_queries, c->head_dim, c->tokens);
  printf("  raw K+V:   %zu bytes (%.1f MiB) of 16-bit values; %u threads\n\n", 4 * d->n,
         (double)(4 * d->n) / 1048576.0, c->threads);
  printf("%-18s %-16s %10s %6s %6s %9s %9s %9s %9s %9s %9s %8s %8s\n", "preset", "canonical spec",
         "bytes", "ratio", "capac", "K maxerr", "K relerr", "V maxerr", "V relerr", "attn med",
         "attn max", "enc MB/s", "dec MB/s");
  for (size_t i = 0; i < N_SPECS; i++)
    printf("%-18s %-16s %10llu %6.3f %5.2fx %9.3g %9.3g %9.3g %9.3g %9.3g %9.3g %8.0f %8.0f\n",
           demo_specs[i], r[i].spec, (unsigned long long)r[i].bytes,
           (double)r[i].bytes / (4.0 * (double)d->n), 4.0 * (double)d->n / (double)r[i].bytes,
           r[i].k_max, r[i].k_rel, r[i].v_max, r[i].v_rel, r[i].attn_med, r[i].attn_max,
           r[i].enc_mbps, r[i].dec_mbps);
  char ta[1024];
  takeaway(r, 4 * d->n, ta, sizeof(ta));
  printf("\nenc/dec MB/s: raw 16-bit bytes per second of one thread (information, not a "
         "benchmark: 'kvtier bench codec'); ran in %.1f s.\n\ntakeaway:",
         secs);
  for (const char *p = ta; *p;) { /* one sentence a line */
    const char *e = strstr(p, ". ");
    const int n = e ? (int)(e - p + 1) : (int)strlen(p);
    printf(" %.*s\n%s", n, p, e ? "         " : "");
    p += e ? n + 1 : n;
  }
}

static int demo_parse(int argc, char **argv, demo_cfg *c) {
  const unsigned cpus = cli_cpu_count();
  memset(c, 0, sizeof(*c));
  c->layers = 32;
  c->tokens = 4096;
  c->heads = 8;
  c->head_dim = 128;
  c->queries = 8;
  c->chunk = 256;
  c->threads = cpus < MAX_WORKERS ? cpus : MAX_WORKERS;
  c->seed = 1;
  c->dtype_s = "bf16";
  const cli_opt opts[] = {
      {"--layers", NULL, CLI_U32, &c->layers, 1, KVT_MAX_LAYERS},
      {"--tokens", NULL, CLI_U32, &c->tokens, 1, KVT_MAX_TOKENS},
      {"--heads", NULL, CLI_U32, &c->heads, 1, KVT_MAX_HEADS},
      {"--head-dim", NULL, CLI_U32, &c->head_dim, 2, KVT_MAX_HEAD_DIM},
      {"--dtype", NULL, CLI_STR, &c->dtype_s, 0, 0},
      {"--seed", NULL, CLI_U32, &c->seed, 0, UINT32_MAX},
      {"--queries", NULL, CLI_U32, &c->queries, 1, 4096},
      {"--chunk-tokens", NULL, CLI_U32, &c->chunk, 1, KVT_MAX_TOKENS},
      {"--threads", NULL, CLI_U32, &c->threads, 1, MAX_WORKERS},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0},
      {"--no-cache", NULL, CLI_FLAG, &c->no_cache, 0, 0},
      {"--cache-dir", NULL, CLI_STR, &c->cache_dir, 0, 0},
  };
  size_t n_pos;
  int rc = cli_parse("demo", argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0, &n_pos);
  if (rc == CLI_HELP) {
    fputs(demo_help, stdout);
    return CLI_HELP;
  }
  if (rc)
    return rc;
  if ((c->dtype = cli_parse_dtype(c->dtype_s)) < 0)
    return cli_usage_error("demo", "--dtype: expected bf16 or fp16, got '%s'", c->dtype_s);
  if ((uint64_t)c->layers * c->tokens * c->heads * c->head_dim > ((uint64_t)1 << 31))
    return cli_usage_error("demo", "shape of %llu elements per K: keep it under 2^31",
                           (unsigned long long)c->layers * c->tokens * c->heads * c->head_dim);
  if (c->chunk > c->tokens)
    c->chunk = c->tokens;
  return 0;
}

int cli_demo_pd_main(int argc, char **argv); /* cli_demo_pd.c */

int cli_demo_main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--pd") == 0)
      return cli_demo_pd_main(argc, argv);
  demo d;
  memset(&d, 0, sizeof(d));
  int rc = demo_parse(argc, argv, &d.c);
  if (rc)
    return rc == CLI_HELP ? CLI_OK : rc;
  const double t0 = cli_now();
  pick_samples(&d);
  demo_result res[N_SPECS];
  uint32_t *ids = malloc((size_t)d.c.chunk * sizeof(*ids));
  rc = ids ? demo_setup(&d) : CLI_EFAIL;
  if (rc == 0) {
    demo_prepare(&d);
    for (size_t i = 0; i < N_SPECS && rc == 0; i++)
      rc = run_preset(&d, demo_specs[i], ids, &res[i]);
  }
  demo_cache_result cache_res;
  if (rc == 0 && !d.c.no_cache) {
    const demo_cache_in in = {d.k,         d.v,       d.c.layers, d.c.tokens, d.c.heads,
                              d.c.head_dim, d.c.chunk, d.c.dtype,  d.c.cache_dir};
    rc = demo_cache_run(&in, &cache_res);
  }
  if (rc == 0) {
    const demo_cache_result *cr = d.c.no_cache ? NULL : &cache_res;
    if (d.c.json) {
      print_json(&d, res, cr, cli_now() - t0);
    } else {
      print_text(&d, res, cli_now() - t0);
      if (cr)
        demo_cache_print_text(cr);
    }
  }
  free(ids);
  demo_free(&d);
  return rc;
}
