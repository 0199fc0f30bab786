/* programs/cli_demo_cache.c - the cache section of `kvtier demo`: the
 * demo's whole context, encoded k16v8 chunk by chunk, put through a cache of
 * a DRAM tier holding about 40% of it and an NVMe tier (O_DIRECT files in a
 * temporary directory) below; then a prefix lookup, and every chunk read back
 * (kvt_cache_get_many, several reads in flight) and compared byte for byte
 * with what was put, timing the reads of each tier. */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_demo_cache.h"
#include "cli_util.h"

#define DRAM_SHARE 0.4 /* of the context's payload bytes */

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

typedef struct dc {
  const demo_cache_in *in;
  demo_cache_result *r;
  kvt_ctx *ctx;
  kvt_cache *cache;
  kvt_codec_spec spec;
  kvt_key fp, *keys;
  uint8_t **payloads; /* what was put, for the byte comparison */
  uint64_t *lens;
  uint32_t *ids;
  char dir[512];
} dc;

static uint32_t chunk_len(const dc *d, uint32_t c) {
  const uint32_t t0 = c * d->in->chunk;
  return d->in->tokens - t0 < d->in->chunk ? d->in->tokens - t0 : d->in->chunk;
}

/* Encodes chunk c of the context into d->payloads[c]. */
static int encode_chunk(dc *d, uint32_t c, uint64_t cap) {
  const demo_cache_in *in = d->in;
  const uint32_t t0 = c * in->chunk, nt = chunk_len(d, c);
  const size_t at = (size_t)t0 * in->heads * in->head_dim;
  kvt_kv_view src;
  kvt_kv_view_dense(&src, (void *)(uintptr_t)(in->k + at), (void *)(uintptr_t)(in->v + at),
                    in->dtype, in->layers, nt, in->heads, in->head_dim);
  src.k_stride[0] = src.v_stride[0] = (int64_t)in->tokens * in->heads * in->head_dim;
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  p.spec = d->spec;
  p.key = d->keys[c];
  p.fingerprint = d->fp;
  p.token_begin = t0;
  if (!(d->payloads[c] = malloc(cap)))
    return -ENOMEM;
  size_t len = 0;
  int rc = kvt_encode(d->ctx, &p, &src, d->payloads[c], cap, &len);
  d->lens[c] = len;
  return rc;
}

/* Keys over token ids 0..T-1, every payload encoded, bound of one payload. */
static int prepare(dc *d, uint64_t *cap) {
  const demo_cache_in *in = d->in;
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = "synthetic/Llama-3.1-8B-shape";
  m.dtype = in->dtype;
  m.layers = in->layers;
  m.kv_heads = in->heads;
  m.head_dim = in->head_dim;
  int rc = kvt_codec_parse(d->ctx, "k16v8", &d->spec);
  if (!rc)
    rc = kvt_codec_format(&d->spec, d->r->codec, sizeof(d->r->codec));
  if (!rc)
    rc = kvt_fingerprint(&m, &d->spec, &d->fp);
  if (!rc)
    rc = kvt_encode_bound(d->ctx, &d->spec, 0, in->layers, in->chunk, in->heads, in->head_dim,
                          cap);
  for (uint32_t t = 0; t < in->tokens; t++)
    d->ids[t] = t;
  for (uint32_t c = 0; !rc && c < d->r->chunks; c++) {
    rc = kvt_chunk_key(&d->fp, c ? &d->keys[c - 1] : NULL, d->ids + (size_t)c * in->chunk,
                       chunk_len(d, c), &d->keys[c]);
    if (!rc)
      rc = encode_chunk(d, c, *cap);
    if (!rc)
      d->r->payload_bytes += d->lens[c];
  }
  return rc;
}

static int open_cache(dc *d) {
  demo_cache_result *r = d->r;
  const char *base = d->in->dir ? d->in->dir : (getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp");
  snprintf(d->dir, sizeof(d->dir), "%s/kvtier-demo-XXXXXX", base);
  if (!mkdtemp(d->dir)) {
    snprintf(r->why, sizeof(r->why), "cannot create a directory under %s: %s", base,
             strerror(errno));
    d->dir[0] = 0;
    return 1;
  }
  const uint64_t dram = (uint64_t)((double)r->payload_bytes * DRAM_SHARE);
  const uint64_t nvme = 2 * r->payload_bytes + (uint64_t)r->chunks * 8192;
  char tiers[800];
  snprintf(tiers, sizeof(tiers), "dram:%" PRIu64 ";nvme:%s:%" PRIu64, dram, d->dir, nvme);
  kvt_cache_config cc = KVT_CACHE_CONFIG_INIT;
  cc.tiers = tiers;
  cc.fingerprint = &d->fp;
  cc.chunk_tokens = d->in->chunk;
  int rc = kvt_cache_open(d->ctx, &cc, &d->cache);
  if (rc) {
    snprintf(r->why, sizeof(r->why), "cannot open the tiers: %.200s", kvt_ctx_last_error(d->ctx));
    return 1;
  }
  r->ntiers = 2;
  for (int t = 0; t < 2; t++)
    snprintf(r->t[t].spec, sizeof(r->t[t].spec), "%s", kvt_tier_spec(kvt_cache_tier(d->cache, t)));
  return 0;
}

static void add_range(demo_cache_result *r, uint32_t c, int tier) {
  uint32_t n = r->nranges;
  if (n && r->r_tier[n - 1] == tier && r->r_last[n - 1] + 1 == c) {
    r->r_last[n - 1] = c;
  } else if (n < DEMO_CACHE_RANGES) {
    r->r_first[n] = r->r_last[n] = c;
    r->r_tier[n] = tier;
    r->nranges++;
  }
}

/* Puts, looks up and reads back every chunk. */
static int exercise(dc *d, uint64_t cap) {
  demo_cache_result *r = d->r;
  double t = cli_now();
  for (uint32_t c = 0; c < r->chunks; c++) {
    int rc = kvt_cache_put(d->cache, &d->keys[c], c ? &d->keys[c - 1] : NULL, d->payloads[c],
                           d->lens[c]);
    if (rc)
      return cli_error("demo: cache put of chunk %u: %s", c, kvt_strerror(rc)), CLI_EFAIL;
  }
  r->put_s = cli_now() - t;
  t = cli_now();
  int rc = kvt_cache_lookup(d->cache, d->ids, d->in->tokens, &r->cached_tokens);
  r->lookup_us = (cli_now() - t) * 1e6;
  if (rc)
    return cli_error("demo: cache lookup: %s", kvt_strerror(rc)), CLI_EFAIL;
  /* Restore or recompute? The bandwidth model's answer for this prefix; the
   * recompute side needs the model's weights, so only for the default
   * (Llama-3.1-8B) shape. */
  kvt_model_arch arch;
  const demo_cache_in *in = d->in;
  r->plan_model = in->layers == 32 && in->heads == 8 && in->head_dim == 128 &&
                  kvt_model_preset("llama-3.1-8b", &arch) == 0;
  r->plan.struct_size = sizeof(r->plan);
  rc = kvt_cache_plan_restore(d->cache, d->ids, in->tokens, r->plan_model ? &arch : NULL, 0, 0,
                              &r->plan);
  if (rc)
    return cli_error("demo: cache plan: %s", kvt_strerror(rc)), CLI_EFAIL;
  /* Where each chunk is, before any read moves it. */
  int *where = malloc(r->chunks * sizeof(int));
  if (!where)
    return cli_error("demo: out of memory"), CLI_EFAIL;
  for (uint32_t c = 0; c < r->chunks; c++) {
    where[c] = -1;
    kvt_cache_query(d->cache, &d->keys[c], NULL, &where[c]);
  }
  /* Read back, tier by tier, READ_GROUP chunks per kvt_cache_get_many with
   * all of them in flight; buffers 4096-aligned so the nvme tier reads into
   * them directly. */
  enum { READ_GROUP = 8 };
  const uint64_t bcap = (cap + 4095) / 4096 * 4096;
  kvt_cache_get_req req[READ_GROUP];
  uint32_t idx[READ_GROUP];
  memset(req, 0, sizeof(req));
  for (int g = 0; g < READ_GROUP; g++) {
    if (!(req[g].buf = aligned_alloc(4096, bcap)))
      rc = CLI_EFAIL;
    else
      memset(req[g].buf, 0, bcap); /* fault the pages in before the timing */
  }
  for (int tier = 0; tier < 2 && !rc; tier++) {
    uint32_t c = 0;
    while (!rc) {
      int m = 0;
      for (; c < r->chunks && m < READ_GROUP; c++)
        if (where[c] == tier) {
          idx[m] = c;
          req[m].key = d->keys[c];
          req[m].cap = bcap;
          m++;
        }
      if (!m)
        break;
      t = cli_now();
      rc = kvt_cache_get_many(d->cache, req, (size_t)m, READ_GROUP);
      r->t[tier].read_s += cli_now() - t;
      for (int g = 0; g < m && !rc; g++) {
        const uint32_t k = idx[g];
        if (req[g].result) {
          cli_error("demo: cache get of chunk %u: %s", k, kvt_strerror(req[g].result));
          rc = CLI_EFAIL;
          break;
        }
        r->t[req[g].tier].read_bytes += req[g].len;
        if (req[g].len == d->lens[k] && !memcmp(req[g].buf, d->payloads[k], req[g].len))
          r->verified++;
      }
    }
  }
  for (uint32_t c = 0; c < r->chunks; c++)
    add_range(r, c, where[c]);
  for (int g = 0; g < READ_GROUP; g++)
    free(req[g].buf);
  free(where);
  if (rc)
    return CLI_EFAIL;
  for (int i = 0; i < 2; i++) {
    kvt_cache_stats s;
    memset(&s, 0, sizeof(s));
    s.struct_size = sizeof(s);
    kvt_cache_stats_get(d->cache, i, &s);
    r->t[i].capacity = s.capacity;
    r->t[i].used = s.used;
    r->t[i].items = s.items;
    r->t[i].demotions = s.demotions;
    r->t[i].promotions = s.promotions;
    r->t[i].evictions = s.evictions;
  }
  if (r->verified != r->chunks)
    return cli_error("demo: %u of %u chunks came back different", r->chunks - r->verified,
                     r->chunks),
           CLI_EFAIL;
  r->ran = 1;
  return 0;
}

int demo_cache_run(const demo_cache_in *in, demo_cache_result *r) {
  memset(r, 0, sizeof(*r));
  dc d;
  memset(&d, 0, sizeof(d));
  d.in = in;
  d.r = r;
  r->chunks = (in->tokens + in->chunk - 1) / in->chunk;
  int rc = cli_ctx_create(0, &d.ctx);
  if (rc)
    return rc;
  d.keys = calloc(r->chunks, sizeof(*d.keys));
  d.payloads = calloc(r->chunks, sizeof(*d.payloads));
  d.lens = calloc(r->chunks, sizeof(*d.lens));
  d.ids = malloc((size_t)in->tokens * sizeof(*d.ids));
  uint64_t cap = 0;
  if (!d.keys || !d.payloads || !d.lens || !d.ids)
    rc = (cli_error("demo: out of memory"), CLI_EFAIL);
  else if ((rc = prepare(&d, &cap)) != 0)
    rc = (cli_error("demo: cache section: %s: %s", kvt_err_name(rc), kvt_ctx_last_error(d.ctx)),
          CLI_EFAIL);
  else if (open_cache(&d) == 0)
    rc = exercise(&d, cap);
  if (rc == 0 && r->ran)
    rc = demo_gpu_run(in, d.payloads, d.lens, r->chunks, &r->gpu);
  kvt_cache_close(d.cache);
  if (d.dir[0])
    nftw(d.dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  for (uint32_t c = 0; d.payloads && c < r->chunks; c++)
    free(d.payloads[c]);
  free(d.payloads);
  free(d.keys);
  free(d.lens);
  free(d.ids);
  kvt_ctx_destroy(d.ctx);
  return rc;
}

static double gbps(const demo_cache_tier *t) {
  return t->read_s > 0 ? (double)t->read_bytes / t->read_s / 1e9 : 0;
}

void demo_cache_print_text(const demo_cache_result *r) {
  printf("\ncache: the context as %u %s payloads (%.1f MiB) through a DRAM tier that holds\n"
         "       about %.0f%% of it and an NVMe tier below (O_DIRECT files, removed afterwards)\n",
         r->chunks, r->codec, (double)r->payload_bytes / 1048576.0, DRAM_SHARE * 100);
  if (!r->ran) {
    printf("       skipped: %s\n", r->why);
    return;
  }
  printf("       put all chunks in order: %.3f s; lookup: %zu tokens cached, %.1f us\n", r->put_s,
         r->cached_tokens, r->lookup_us);
  const kvt_cache_plan *p = &r->plan;
  printf("       restore plan (kvt_cache_plan_restore): %.1f MiB from dram over %.0f GB/s +\n"
         "       %.1f MiB from nvme over %.0f GB/s = %.1f ms",
         (double)p->tier_bytes[0] / 1048576.0, p->link_GBps[0],
         (double)p->tier_bytes[1] / 1048576.0, p->link_GBps[1], p->restore_s * 1e3);
  if (r->plan_model)
    printf("; recomputing the prefill: %.1f ms\n       (Llama-3.1-8B FLOP model at 989 TFLOP/s x "
           "0.5 MFU): %s\n",
           p->recompute_s * 1e3, p->restore_pays ? "restoring pays" : "recomputing is faster");
  else
    printf("\n");
  printf("       where each chunk was (and was read from):\n");
  for (uint32_t i = 0; i < r->nranges; i++)
    printf("         chunks %4u-%-4u  %s\n", r->r_first[i], r->r_last[i],
           r->r_tier[i] == 0 ? "dram" : "nvme");
  printf("       %-44s %8s %8s %9s %9s %9s\n", "tier", "items", "MiB", "demoted", "promoted",
         "read GB/s");
  for (int t = 0; t < r->ntiers; t++)
    printf("       %-44.44s %8" PRIu64 " %8.1f %9" PRIu64 " %9" PRIu64 " %9.2f\n", r->t[t].spec,
           r->t[t].items, (double)r->t[t].used / 1048576.0, r->t[t].demotions,
           r->t[t].promotions, gbps(&r->t[t]));
  const demo_gpu_result *g = &r->gpu;
  if (g->ran)
    printf("       GPU (%s): kvt_gpu_load put the %u chunks into a vLLM paged cache at\n"
           "       %.1f GB/s of payload (%.1f GB/s of restored 16-bit KV, kernel time); every\n"
           "       element equals the CPU decode of the same payload.\n",
           g->device, g->verified, g->load_s > 0 ? (double)g->payload_bytes / g->load_s / 1e9 : 0,
           g->load_s > 0 ? (double)g->kv_bytes / g->load_s / 1e9 : 0);
  else
    printf("       GPU load: skipped (%s).\n", g->why);
  printf("       all %u chunks read back byte-identical.", r->verified);
  if (r->nranges > 1 && r->r_tier[0] == 0)
    printf(" The head of the context stays in\n"
           "       DRAM and its tail goes to NVMe: a chunk is useless without the ones before it.");
  printf("\n       Read GB/s: one thread, 8 payloads in flight (kvt_cache_get_many); information,\n"
         "       not a benchmark: 'kvtier bench tier'.\n");
}

void demo_cache_print_json(const demo_cache_result *r) {
  printf(",\n \"cache\": {\"ran\": %s", r->ran ? "true" : "false");
  if (!r->ran) {
    printf(", \"why\": ");
    cli_json_str(stdout, r->why);
    printf("}");
    return;
  }
  printf(", \"codec\": \"%s\", \"chunks\": %u, \"payload_bytes\": %" PRIu64
         ", \"put_s\": %.4f, \"lookup_us\": %.1f, \"cached_tokens\": %zu, \"verified\": %u,\n"
         "   \"ranges\": [",
         r->codec, r->chunks, r->payload_bytes, r->put_s, r->lookup_us, r->cached_tokens,
         r->verified);
  for (uint32_t i = 0; i < r->nranges; i++)
    printf("%s{\"first\": %u, \"last\": %u, \"tier\": %d}", i ? ", " : "", r->r_first[i],
           r->r_last[i], r->r_tier[i]);
  const demo_gpu_result *g = &r->gpu;
  printf("],\n   \"gpu\": {\"ran\": %s, \"device\": ", g->ran ? "true" : "false");
  cli_json_str(stdout, g->ran ? g->device : "");
  printf(", \"why\": ");
  cli_json_str(stdout, g->ran ? "" : g->why);
  printf(", \"verified_chunks\": %u, \"load_s\": %.6f, \"payload_bytes\": %" PRIu64
         ", \"kv_bytes\": %" PRIu64 "}",
         g->verified, g->load_s, g->payload_bytes, g->kv_bytes);
  printf(",\n   \"plan\": {\"restore_s\": %.6f, \"recompute_s\": %.6f, \"restore_pays\": %s, "
         "\"link_GBps\": [%.1f, %.1f]}",
         r->plan.restore_s, r->plan.recompute_s, r->plan.restore_pays ? "true" : "false",
         r->plan.link_GBps[0], r->plan.link_GBps[1]);
  printf(",\n   \"tiers\": [");
  for (int t = 0; t < r->ntiers; t++) {
    printf("%s{\"spec\": ", t ? ", " : "");
    cli_json_str(stdout, r->t[t].spec);
    printf(", \"capacity\": %" PRIu64 ", \"used\": %" PRIu64 ", \"items\": %" PRIu64
           ", \"demotions\": %" PRIu64 ", \"promotions\": %" PRIu64 ", \"evictions\": %" PRIu64
           ", \"read_bytes\": %" PRIu64 ", \"read_gbps\": %.3f}",
           r->t[t].capacity, r->t[t].used, r->t[t].items, r->t[t].demotions, r->t[t].promotions,
           r->t[t].evictions, r->t[t].read_bytes, gbps(&r->t[t]));
  }
  printf("]}");
}
