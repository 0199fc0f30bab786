/* bench/cli_bench_gpu.c - `kvtier bench gpu`: the fused GPU store and load
 * (kvtier/gpu.h) of every preset between a paged bf16 cache and pinned host
 * payloads, each against cudaMemcpyAsync of the same payload bytes measured
 * in the same run (STYLE.md: a claim is a ratio against a baseline). */
#include <stdlib.h>
#include <string.h>

#include "cli_bench_gpu.h"
#include "cli_util.h"
#include "kvtier/gpu.h"
#include "synth.h"

int cli_bench_gpu_main(int argc, char **argv);

static const char gpu_help[] =
    "Usage: kvtier bench gpu [--iters N] [--max-tokens T] [--batch N]\n"
    "\n"
    "On the first CUDA device, for a Llama-3.1-8B shaped cache (32 layers, 8 KV\n"
    "heads, head_dim 128, bf16, vLLM flash-attn layout, 16-token blocks, 32768\n"
    "slots, blocks in shuffled order), and transfers from one 256-token chunk of\n"
    "one layer to a whole 32K-token context (8 payloads of 4096 tokens x 32\n"
    "layers), times per preset with CUDA events on one stream:\n"
    "  memcpy H2D / D2H  cudaMemcpyAsync of the same payload bytes between pinned\n"
    "                    host memory and device memory (the baseline)\n"
    "  load              kvt_gpu_load from pinned host payloads into the slots\n"
    "                    (KVT_GPU_LOAD_TRUST_HOST: checksums verified once before),\n"
    "                    staged through the layout's device slots by the copy engine\n"
    "  zcopy, staged     the same load forced to read host memory from the kernel\n"
    "                    (KVT_GPU_LOAD_ZERO_COPY) or to be staged (KVT_GPU_LOAD_STAGED),\n"
    "                    as ratios to H2D\n"
    "  gpu-vfy           a verified load, the checksums computed on the GPU as the\n"
    "                    bytes move (kvt_gpu_load_params.verdict): wall time from the\n"
    "                    first call to the last verdict checked after the stream\n"
    "  gv-lyr            the same launched a layer at a time with an event after\n"
    "                    each (kvt_gpu_load_params.layer_events), as an engine\n"
    "                    overlapping the load with the forward pass would\n"
    "  host-vfy          a verified load without a verdict: the checksums on the\n"
    "                    host before each launch; wall time\n"
    "  store             a sealed store, end to end: kvt_gpu_store_async and\n"
    "                    kvt_gpu_store_finish per payload into pinned host memory\n"
    "                    (staged and sealed on the GPU); wall time\n"
    "and on the host: verify (kvt_payload_verify, what a tier's check costs).\n"
    "Reports medians: payload GB/s, the ratio to memcpy, and restored 16-bit KV\n"
    "GB/s (raw K+V bytes / load time).\n"
    "Then the HBM case, payloads in device memory, as GB/s of bytes read and\n"
    "written against cudaMemcpyAsync device-to-device of the payload bytes:\n"
    "load (KVT_GPU_LOAD_TRUST_DEVICE, with the host copy of the header that a\n"
    "caller keeps: kvt_gpu_load_params.header), checked load (GPU checksums of\n"
    "the sections first, then the load; host wall time, it waits), gpu-vfy (with\n"
    "verdicts: the same kernels, the load gated on their outcome on the GPU, no\n"
    "wait between; wall time to the last verdict), and store (kernel + GPU\n"
    "checksums).\n"
    "Last, layer-sized transfers: a context of --batch chunks of 256 tokens (each\n"
    "chunk's layer is 1 MiB of bf16) loaded layer by layer, an event after each\n"
    "layer, verified on the GPU (wall time to the last verdict) against\n"
    "cudaMemcpyAsync of each payload: per chunk (kvt_gpu_load with layer_events,\n"
    "a call per chunk), batched (kvt_gpu_load_batch: one call, each launch loading\n"
    "a layer of up to 64 chunks), batched and trusted (KVT_GPU_LOAD_TRUST_HOST); and\n"
    "the sealed store of the chunks, a call per chunk (store) and batched\n"
    "(kvt_gpu_store_batch_async and _finish: b-store), against cudaMemcpyAsync D2H.\n"
    "\n"
    "Options:\n"
    "  --iters N       timed iterations per measurement (5), after one warm-up\n"
    "  --max-tokens T  skip transfers of more than T tokens per payload set (32768)\n"
    "  --batch N       chunks of the layer-sized case (128: a 32K context; 0: skip it)\n";

#ifndef KVT_HAVE_CUDA

int cli_bench_gpu_main(int argc, char **argv) {
  return cli_without_cuda("bench gpu", argc, argv, gpu_help);
}

#else
#include <cuda_runtime_api.h>

#define LAYERS 32
#define HEADS 8
#define HDIM 128
#define BS 16
#define SLOTS 32768
#define MAX_ITERS 50
#define HDR_COPY 16384 /* bytes of each HBM payload's header kept on the host */

static const char *const gpu_specs[] = {
    "raw", "k16v8", "fp8", "int8", "k16v4", "k8v4", "int4", "int4,kgroup=dim",
};
#define N_SPECS (sizeof(gpu_specs) / sizeof(gpu_specs[0]))

typedef struct gsize {
  const char *name;
  uint32_t tokens, layers, payloads;
} gsize;

static const gsize gpu_sizes[] = {
    {"256 tok x 1 layer", 256, 1, 1},
    {"256 tok x 32 layers", 256, 32, 1},
    {"1024 tok x 32 layers", 1024, 32, 1},
    {"4096 tok x 32 layers", 4096, 32, 1},
    {"32K ctx: 8 x 4096 tok x 32 layers", 4096, 32, 8},
};
#define N_SIZES (sizeof(gpu_sizes) / sizeof(gpu_sizes[0]))

typedef struct gbench {
  kvt_ctx *ctx;
  cudaStream_t st;
  cudaEvent_t e0, e1;
  void *layers[LAYERS];
  int64_t *slots; /* device [SLOTS] */
  kvt_gpu_layout *L;
  uint8_t *pin;   /* pinned, mapped: 8 payloads of up to `each` bytes */
  size_t each;
  void *dev;      /* memcpy target: one payload */
  uint8_t *hbm;   /* device memory: 8 payloads of up to `each` bytes (the HBM case) */
  uint8_t *hdr;   /* host: their headers, HDR_COPY bytes each */
  kvt_gpu_verdict *verdicts; /* pinned: one per payload */
  cudaEvent_t layer_ev[8 * LAYERS]; /* per payload and layer: layer-wise loads */
  uint32_t iters;
} gbench;

static int cu(cudaError_t e, const char *what) {
  if (e == cudaSuccess)
    return 0;
  cli_error("bench gpu: %s: %s", what, cudaGetErrorString(e));
  return CLI_EFAIL;
}

static int kv_fail(gbench *g, const char *what, int rc) {
  cli_error("bench gpu: %s: %s: %s", what, kvt_err_name(rc), kvt_ctx_last_error(g->ctx));
  return CLI_EFAIL;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *t, uint32_t n) {
  qsort(t, n, sizeof(double), cmp_d);
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

int cli_bench_fill_layers(void *const *layers, uint32_t n, size_t layer_bytes, uint32_t heads,
                          uint32_t head_dim, uint32_t seed0) {
  kvt_synth_shape s = {1, 256, heads, head_dim, KVT_DTYPE_BF16, 4, 20.0f};
  const size_t tile = (size_t)256 * heads * head_dim * 2;
  uint16_t *k = malloc(tile), *v = malloc(tile);
  int rc = 0;
  if (!k || !v) {
    cli_error("bench: out of memory filling the cache");
    rc = CLI_EFAIL;
  }
  for (uint32_t l = 0; l < n && !rc; l++) {
    kvt_synth_kv(&s, seed0 + l, k, v);
    for (size_t off = 0; off + tile <= layer_bytes && !rc; off += tile) {
      const cudaError_t e = cudaMemcpy((uint8_t *)layers[l] + off, (off / tile) % 2 ? v : k,
                                       tile, cudaMemcpyHostToDevice);
      if (e != cudaSuccess) {
        cli_error("bench: filling the cache: %s", cudaGetErrorString(e));
        rc = CLI_EFAIL;
      }
    }
  }
  free(k);
  free(v);
  return rc;
}

static int setup(gbench *g) {
  int rc = kvt_ctx_create(NULL, &g->ctx);
  if (rc)
    return kv_fail(g, "context", rc);
  if ((rc = cu(cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking), "stream")) ||
      (rc = cu(cudaEventCreate(&g->e0), "event")) || (rc = cu(cudaEventCreate(&g->e1), "event")))
    return rc;
  const size_t layer_bytes = (size_t)2 * SLOTS * HEADS * HDIM * 2;
  for (uint32_t l = 0; l < LAYERS; l++)
    if ((rc = cu(cudaMalloc(&g->layers[l], layer_bytes), "cudaMalloc cache")))
      return rc;
  if ((rc = cli_bench_fill_layers(g->layers, LAYERS, layer_bytes, HEADS, HDIM, 1000)))
    return rc;
  /* vLLM-style: a sequence's tokens fill its blocks in order; the blocks are
   * scattered over the cache. */
  int64_t *h = malloc(sizeof(int64_t) * SLOTS);
  uint32_t *perm = malloc(sizeof(uint32_t) * (SLOTS / BS));
  if (!h || !perm)
    return CLI_EFAIL;
  kvt_rng r = {42};
  for (uint32_t i = 0; i < SLOTS / BS; i++)
    perm[i] = i;
  for (uint32_t i = SLOTS / BS - 1; i > 0; i--) {
    uint32_t j = (uint32_t)(kvt_rng_next(&r) % (i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (uint32_t t = 0; t < SLOTS; t++)
    h[t] = (int64_t)perm[t / BS] * BS + t % BS;
  rc = cu(cudaMalloc((void **)&g->slots, sizeof(int64_t) * SLOTS), "cudaMalloc slots");
  if (!rc)
    rc = cu(cudaMemcpy(g->slots, h, sizeof(int64_t) * SLOTS, cudaMemcpyHostToDevice), "slots");
  free(h);
  free(perm);
  if (rc)
    return rc;
  kvt_gpu_layout_desc d;
  kvt_gpu_layout_desc_vllm(&d, KVT_DTYPE_BF16, LAYERS, g->layers, SLOTS / BS, BS, HEADS, HDIM);
  if ((rc = kvt_gpu_layout_create(g->ctx, &d, &g->L)))
    return kv_fail(g, "layout", rc);
  uint64_t bound;
  kvt_codec_spec raw = KVT_CODEC_SPEC_INIT;
  if ((rc = kvt_encode_bound(g->ctx, &raw, 0, LAYERS, 4096, HEADS, HDIM, &bound)))
    return kv_fail(g, "bound", rc);
  g->each = (size_t)((bound + 4095) & ~(uint64_t)4095);
  if ((rc = cu(cudaHostAlloc((void **)&g->pin, 8 * g->each, cudaHostAllocMapped),
               "cudaHostAlloc payloads")) ||
      (rc = cu(cudaMalloc(&g->dev, g->each), "cudaMalloc payload")) ||
      (rc = cu(cudaMalloc((void **)&g->hbm, 8 * g->each), "cudaMalloc HBM payloads")))
    return rc;
  if ((rc = cu(cudaHostAlloc((void **)&g->verdicts, 8 * sizeof(kvt_gpu_verdict),
                             cudaHostAllocMapped), "cudaHostAlloc verdicts")))
    return rc;
  for (int i = 0; i < 8 * LAYERS; i++)
    if ((rc = cu(cudaEventCreateWithFlags(&g->layer_ev[i], cudaEventDisableTiming),
                 "layer events")))
      return rc;
  if (!(g->hdr = malloc(8 * HDR_COPY))) {
    cli_error("bench gpu: out of memory");
    return CLI_EFAIL;
  }
  return 0;
}

static void teardown(gbench *g) {
  kvt_gpu_layout_destroy(g->L);
  for (uint32_t l = 0; l < LAYERS; l++)
    cudaFree(g->layers[l]);
  cudaFree(g->slots);
  cudaFree(g->dev);
  cudaFree(g->hbm);
  free(g->hdr);
  cudaFreeHost(g->pin);
  cudaFreeHost(g->verdicts);
  for (int i = 0; i < 8 * LAYERS; i++)
    if (g->layer_ev[i])
      cudaEventDestroy(g->layer_ev[i]);
  if (g->st)
    cudaStreamDestroy(g->st);
  kvt_ctx_destroy(g->ctx);
}
typedef struct grow {
  uint64_t bytes, raw; /* payload and 16-bit K+V bytes of one measurement */
  double h2d, d2h, load, store, verify, load_host; /* medians, seconds */
  double hstore, hload, hload_checked, d2d;         /* payloads in device memory */
  double load_zc, load_st; /* load with KVT_GPU_LOAD_ZERO_COPY, KVT_GPU_LOAD_STAGED */
  double load_gpu, hload_gpu; /* verified on the GPU (a verdict): pinned, device */
  double load_gpu_ev;         /* the pinned one launched a layer at a time, with events */
} grow;

static double ev_seconds(gbench *g) {
  float ms = 0;
  cudaEventSynchronize(g->e1);
  cudaEventElapsedTime(&ms, g->e0, g->e1);
  return ms / 1e3;
}

/* An untimed copy right before a timed measurement: after the host has
 * worked alone for a while (verify, seal), the first transfer over an idle
 * link runs slower, and that must not fall on one column only. */
static void warm(gbench *g, size_t n) {
  cudaMemcpyAsync(g->dev, g->pin, n < (1u << 20) ? n : (1u << 20), cudaMemcpyHostToDevice,
                  g->st);
}

/* Wall time of loading the n payloads at base (stride g->each) with
 * verdicts, waiting for the stream and checking every verdict: a load
 * verified on the GPU, end to end. */
static int load_verified(gbench *g, const gsize *z, const kvt_gpu_store_params *sp,
                         const size_t *len, uint8_t *base, int per_layer, double *t) {
  int rc = 0;
  warm(g, len[0]);
  cudaStreamSynchronize(g->st);
  const double t0 = cli_now();
  for (uint32_t j = 0; j < z->payloads && !rc; j++) {
    kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
    lp.tokens = z->tokens;
    lp.slots = sp[j].slots;
    lp.verdict = &g->verdicts[j];
    if (per_layer) /* a launch per layer, an event after each */
      lp.layer_events = (void *const *)&g->layer_ev[j * LAYERS];
    rc = kvt_gpu_load(g->L, base + j * g->each, len[j], &lp, g->st);
  }
  if (rc)
    return kv_fail(g, "load verified on the GPU", rc);
  if ((rc = cu(cudaStreamSynchronize(g->st), "load verified on the GPU")))
    return rc;
  for (uint32_t j = 0; j < z->payloads && !rc; j++)
    rc = kvt_gpu_verdict_check(g->L, &g->verdicts[j]);
  *t = cli_now() - t0;
  return rc ? kv_fail(g, "verdict", rc) : 0;
}

/* The HBM case: store into device memory (store kernel + GPU checksums),
 * load from it trusted and checked (the checked load waits for its checksum
 * kernel), and a device-to-device memcpy of the payload bytes: t[0..3]; and
 * loaded verified on the GPU with verdicts: t[5]. */
static int iterate_hbm(gbench *g, const gsize *z, kvt_gpu_store_params *sp, size_t *len,
                       double *t) {
  int rc = 0;
  const uint32_t n = z->payloads;
  cudaEventRecord(g->e0, g->st);
  for (uint32_t j = 0; j < n && !rc; j++)
    rc = kvt_gpu_store_async(g->L, &sp[j], g->hbm + j * g->each, g->each, &len[j], g->st);
  cudaEventRecord(g->e1, g->st);
  if (rc)
    return kv_fail(g, "store to device memory", rc);
  t[0] = ev_seconds(g);
  for (uint32_t j = 0; j < n && !rc; j++)
    rc = kvt_gpu_store_finish(g->L, g->hbm + j * g->each, len[j], g->st);
  if (rc)
    return kv_fail(g, "store finish (device memory)", rc);
  /* The host copy of each header a caller keeps (kvt_gpu_load_params.header),
   * taken outside the timed loads. */
  size_t hlen[8];
  for (uint32_t j = 0; j < n && !rc; j++) {
    hlen[j] = len[j] < HDR_COPY ? len[j] : HDR_COPY;
    rc = cu(cudaMemcpy(g->hdr + j * HDR_COPY, g->hbm + j * g->each, hlen[j],
                       cudaMemcpyDeviceToHost), "header copy");
  }
  if (rc)
    return rc;
  if ((rc = load_verified(g, z, sp, len, g->hbm, 0, &t[5])))
    return rc;
  for (int checked = 0; checked < 2; checked++) {
    warm(g, len[0]);
    double t0 = cli_now();
    cudaEventRecord(g->e0, g->st);
    for (uint32_t j = 0; j < n && !rc; j++) {
      kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
      lp.tokens = z->tokens;
      lp.slots = sp[j].slots;
      lp.flags = checked ? 0 : KVT_GPU_LOAD_TRUST_DEVICE;
      if (!checked) { /* the checked load trusts nothing: it copies the header too */
        lp.header = g->hdr + j * HDR_COPY;
        lp.header_len = hlen[j];
      }
      rc = kvt_gpu_load(g->L, g->hbm + j * g->each, len[j], &lp, g->st);
    }
    cudaEventRecord(g->e1, g->st);
    if (rc)
      return kv_fail(g, "load from device memory", rc);
    t[1 + checked] = ev_seconds(g);
    if (checked) /* it waits on the host for each payload's checksums */
      t[2] = cli_now() - t0; /* ev_seconds waited for the last load too */
  }
  warm(g, len[0]);
  cudaEventRecord(g->e0, g->st);
  for (uint32_t j = 0; j < n; j++)
    cudaMemcpyAsync(g->dev, g->hbm + j * g->each, len[j], cudaMemcpyDeviceToDevice, g->st);
  cudaEventRecord(g->e1, g->st);
  t[3] = ev_seconds(g);
  return 0;
}


/* One iteration of every measurement over z->payloads payloads; t[15]. */
static int iterate(gbench *g, const gsize *z, kvt_gpu_store_params *sp, size_t *len,
                   double *t) {
  int rc = 0;
  const uint32_t n = z->payloads;
  /* A sealed store, end to end: the async call and finish per payload (the
   * handle takes one store at a time), wall time. */
  cudaStreamSynchronize(g->st);
  double t0 = cli_now();
  for (uint32_t j = 0; j < n && !rc; j++)
    if ((rc = kvt_gpu_store_async(g->L, &sp[j], g->pin + j * g->each, g->each, &len[j],
                                  g->st)) == 0)
      rc = kvt_gpu_store_finish(g->L, g->pin + j * g->each, len[j], g->st);
  t[4] = cli_now() - t0;
  if (rc)
    return kv_fail(g, "store", rc);
  t0 = cli_now();
  for (uint32_t j = 0; j < n && !rc; j++)
    rc = kvt_payload_verify(g->ctx, g->pin + j * g->each, len[j], NULL);
  t[3] = cli_now() - t0;
  if (rc)
    return kv_fail(g, "verify of a GPU-stored payload", rc);
  warm(g, len[0]);
  cudaEventRecord(g->e0, g->st);
  for (uint32_t j = 0; j < n && !rc; j++) {
    kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
    lp.tokens = z->tokens;
    lp.slots = sp[j].slots;
    lp.flags = KVT_GPU_LOAD_TRUST_HOST;
    rc = kvt_gpu_load(g->L, g->pin + j * g->each, len[j], &lp, g->st);
  }
  cudaEventRecord(g->e1, g->st);
  if (rc)
    return kv_fail(g, "load", rc);
  t[2] = ev_seconds(g);
  /* Checked loads without a verdict: the section checksums on the host
   * before each launch (the 0.3.1 behaviour), wall time. */
  warm(g, len[0]);
  cudaStreamSynchronize(g->st);
  t0 = cli_now();
  for (uint32_t j = 0; j < n && !rc; j++) {
    kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
    lp.tokens = z->tokens;
    lp.slots = sp[j].slots;
    rc = kvt_gpu_load(g->L, g->pin + j * g->each, len[j], &lp, g->st);
  }
  if (rc || (rc = cu(cudaStreamSynchronize(g->st), "checked load")))
    return rc < 0 ? kv_fail(g, "checked load", rc) : rc;
  t[5] = cli_now() - t0;
  if ((rc = load_verified(g, z, sp, len, g->pin, 0, &t[12])) ||
      (rc = load_verified(g, z, sp, len, g->pin, 1, &t[14])))
    return rc;
  warm(g, len[0]);
  for (int forced = 0; forced < 2 && !rc; forced++) { /* zero copy, then staged */
    cudaEventRecord(g->e0, g->st);
    for (uint32_t j = 0; j < n && !rc; j++) {
      kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
      lp.tokens = z->tokens;
      lp.slots = sp[j].slots;
      lp.flags = KVT_GPU_LOAD_TRUST_HOST |
                 (forced ? KVT_GPU_LOAD_STAGED : KVT_GPU_LOAD_ZERO_COPY);
      rc = kvt_gpu_load(g->L, g->pin + j * g->each, len[j], &lp, g->st);
    }
    cudaEventRecord(g->e1, g->st);
    if (rc)
      return kv_fail(g, forced ? "staged load" : "zero-copy load", rc);
    t[10 + forced] = ev_seconds(g);
    warm(g, len[0]);
  }
  warm(g, len[0]);
  cudaEventRecord(g->e0, g->st);
  for (uint32_t j = 0; j < n; j++)
    cudaMemcpyAsync(g->dev, g->pin + j * g->each, len[j], cudaMemcpyHostToDevice, g->st);
  cudaEventRecord(g->e1, g->st);
  t[0] = ev_seconds(g);
  cudaEventRecord(g->e0, g->st);
  for (uint32_t j = 0; j < n; j++) /* overwrites the payloads: stored again next time */
    cudaMemcpyAsync(g->pin + j * g->each, g->dev, len[j], cudaMemcpyDeviceToHost, g->st);
  cudaEventRecord(g->e1, g->st);
  t[1] = ev_seconds(g);
  if ((rc = cu(cudaStreamSynchronize(g->st), "memcpy")))
    return rc;
  double h[6] = {0};
  if ((rc = iterate_hbm(g, z, sp, len, h)))
    return rc;
  t[6] = h[0], t[7] = h[1], t[8] = h[2], t[9] = h[3], t[13] = h[5];
  return 0;
}

static int run_size(gbench *g, const char *spec_text, const gsize *z, grow *out) {
  kvt_gpu_store_params sp[8];
  kvt_encode_params ep[8];
  size_t len[8];
  for (uint32_t j = 0; j < z->payloads; j++) {
    kvt_encode_params e = KVT_ENCODE_PARAMS_INIT;
    int rc = kvt_codec_parse(g->ctx, spec_text, &e.spec);
    if (rc)
      return kv_fail(g, spec_text, rc);
    memset(e.key.bytes, (int)j + 1, 16);
    e.model_layers = LAYERS;
    e.token_begin = j * z->tokens;
    ep[j] = e;
    kvt_gpu_store_params p = KVT_GPU_STORE_PARAMS_INIT;
    p.encode = &ep[j];
    p.layer_count = z->layers;
    p.tokens = z->tokens;
    p.slots = g->slots + (size_t)j * z->tokens;
    sp[j] = p;
  }
  double t[MAX_ITERS + 1][15], col[MAX_ITERS];
  for (uint32_t it = 0; it <= g->iters; it++) {
    int rc = iterate(g, z, sp, len, t[it]);
    if (rc)
      return rc;
  }
  double *m[15] = {&out->h2d,     &out->d2h,       &out->load,   &out->verify,
                    &out->store,   &out->load_host, &out->hstore, &out->hload,
                    &out->hload_checked, &out->d2d, &out->load_zc, &out->load_st,
                    &out->load_gpu, &out->hload_gpu, &out->load_gpu_ev};
  for (int k = 0; k < 15; k++) {
    for (uint32_t it = 1; it <= g->iters; it++)
      col[it - 1] = t[it][k];
    *m[k] = median(col, g->iters);
  }
  out->bytes = 0;
  for (uint32_t j = 0; j < z->payloads; j++)
    out->bytes += len[j];
  out->raw = (uint64_t)z->payloads * z->layers * z->tokens * HEADS * HDIM * 2 * 2;
  return 0;
}

/* ---- layer-sized transfers, batched ---- */

#define BATCH_TOKENS 256

/* Medians of one preset's layer-sized case, seconds. */
typedef struct brow {
  uint64_t bytes, raw;
  double h2d, d2h, per_chunk, batched, batched_trusted, store, batched_zc, batched_store;
} brow;

/* The payloads of the layer-sized case: n chunks stored per call. */
typedef struct bset {
  uint32_t n;
  size_t each;
  uint8_t *pin;              /* n payloads, `each` apart */
  size_t *len;
  kvt_gpu_verdict *verdicts; /* pinned [n] */
  kvt_gpu_load_item *items;  /* [n] */
  kvt_gpu_store_item *stores; /* [n] */
} bset;

/* Wall time from the first call to every verdict checked after the stream. */
static int batch_verdicts(gbench *g, bset *b, double t0, double *t) {
  int rc = cu(cudaStreamSynchronize(g->st), "batched load");
  for (uint32_t j = 0; j < b->n && !rc; j++)
    if ((rc = kvt_gpu_verdict_check(g->L, &b->verdicts[j])) != 0)
      rc = kv_fail(g, "verdict", rc);
  *t = cli_now() - t0;
  return rc;
}

/* One iteration of the layer-sized case: t[8] in brow's order. */
static int batch_iterate(gbench *g, bset *b, kvt_gpu_store_params *sp, double *t) {
  int rc = 0;
  for (uint32_t j = 0; j < b->n; j++) {
    const kvt_gpu_store_item it = {sizeof(it), &sp[j], b->pin + j * b->each, b->each, 0};
    b->stores[j] = it;
  }
  cudaStreamSynchronize(g->st);
  double t0 = cli_now();
  if ((rc = kvt_gpu_store_batch_async(g->L, b->stores, b->n, g->st)) == 0)
    rc = kvt_gpu_store_batch_finish(g->L, b->stores, b->n, g->st);
  t[7] = cli_now() - t0;
  if (rc)
    return kv_fail(g, "batched store", rc);
  for (uint32_t j = 0; j < b->n && !rc; j++) /* untimed: what the batch sealed is valid */
    rc = kvt_payload_verify(g->ctx, b->pin + j * b->each, b->stores[j].len, NULL);
  if (rc)
    return kv_fail(g, "verify of a batch-stored payload", rc);
  cudaStreamSynchronize(g->st);
  t0 = cli_now();
  for (uint32_t j = 0; j < b->n && !rc; j++)
    if ((rc = kvt_gpu_store_async(g->L, &sp[j], b->pin + j * b->each, b->each, &b->len[j],
                                  g->st)) == 0)
      rc = kvt_gpu_store_finish(g->L, b->pin + j * b->each, b->len[j], g->st);
  t[5] = cli_now() - t0;
  if (rc)
    return kv_fail(g, "store of a chunk", rc);
  void *const *ev = (void *const *)g->layer_ev; /* one per layer, re-recorded per chunk */
  /* Per chunk: a call each, a launch per layer. */
  warm(g, b->len[0]);
  cudaStreamSynchronize(g->st);
  t0 = cli_now();
  for (uint32_t j = 0; j < b->n && !rc; j++) {
    kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
    lp.tokens = BATCH_TOKENS;
    lp.slots = sp[j].slots;
    lp.verdict = &b->verdicts[j];
    lp.layer_events = ev;
    rc = kvt_gpu_load(g->L, b->pin + j * b->each, b->len[j], &lp, g->st);
  }
  if (rc)
    return kv_fail(g, "layer-wise load per chunk", rc);
  if ((rc = batch_verdicts(g, b, t0, &t[2])))
    return rc;
  for (int trusted = 0; trusted < 3; trusted++) {
    for (uint32_t j = 0; j < b->n; j++) {
      const kvt_gpu_load_item it = {sizeof(it), b->pin + j * b->each, b->len[j], sp[j].slots, NULL,
                                    trusted ? NULL : &b->verdicts[j]};
      b->items[j] = it;
    }
    kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
    lp.tokens = BATCH_TOKENS;
    lp.layer_events = ev;
    lp.flags = trusted ? KVT_GPU_LOAD_TRUST_HOST : 0;
    if (trusted == 2) /* the kernels read host memory */
      lp.flags |= KVT_GPU_LOAD_ZERO_COPY;
    warm(g, b->len[0]);
    cudaStreamSynchronize(g->st);
    t0 = cli_now();
    if ((rc = kvt_gpu_load_batch(g->L, b->items, b->n, &lp, g->st)) != 0)
      return kv_fail(g, "batched load", rc);
    if (trusted) {
      if ((rc = cu(cudaStreamSynchronize(g->st), "batched load")))
        return rc;
      t[trusted == 2 ? 6 : 4] = cli_now() - t0;
    } else if ((rc = batch_verdicts(g, b, t0, &t[3]))) {
      return rc;
    }
  }
  warm(g, b->len[0]);
  cudaEventRecord(g->e0, g->st);
  for (uint32_t j = 0; j < b->n; j++)
    cudaMemcpyAsync(g->dev, b->pin + j * b->each, b->len[j], cudaMemcpyHostToDevice, g->st);
  cudaEventRecord(g->e1, g->st);
  t[0] = ev_seconds(g);
  cudaEventRecord(g->e0, g->st);
  for (uint32_t j = 0; j < b->n; j++) /* overwrites the payloads: stored again next time */
    cudaMemcpyAsync(b->pin + j * b->each, g->dev, b->len[j], cudaMemcpyDeviceToHost, g->st);
  cudaEventRecord(g->e1, g->st);
  t[1] = ev_seconds(g);
  return cu(cudaStreamSynchronize(g->st), "memcpy");
}

static int batch_run(gbench *g, bset *b, const char *spec_text, brow *out) {
  kvt_gpu_store_params *sp = calloc(b->n, sizeof(*sp));
  kvt_encode_params *ep = calloc(b->n, sizeof(*ep));
  double(*t)[8] = calloc(g->iters + 1, sizeof(*t));
  double col[MAX_ITERS];
  int rc = sp && ep && t ? 0 : CLI_EFAIL;
  for (uint32_t j = 0; j < b->n && !rc; j++) {
    kvt_encode_params e = KVT_ENCODE_PARAMS_INIT;
    if ((rc = kvt_codec_parse(g->ctx, spec_text, &e.spec)) != 0) {
      rc = kv_fail(g, spec_text, rc);
      break;
    }
    memcpy(e.key.bytes, &j, sizeof(j));
    e.model_layers = LAYERS;
    e.token_begin = j * BATCH_TOKENS;
    ep[j] = e;
    kvt_gpu_store_params p = KVT_GPU_STORE_PARAMS_INIT;
    p.encode = &ep[j];
    p.layer_count = LAYERS;
    p.tokens = BATCH_TOKENS;
    p.slots = g->slots + (size_t)j * BATCH_TOKENS;
    sp[j] = p;
  }
  for (uint32_t it = 0; it <= g->iters && !rc; it++)
    rc = batch_iterate(g, b, sp, t[it]);
  if (!rc) {
    double *m[8] = {&out->h2d,     &out->d2h,             &out->per_chunk,
                    &out->batched, &out->batched_trusted, &out->store,
                    &out->batched_zc, &out->batched_store};
    for (int k = 0; k < 8; k++) {
      for (uint32_t it = 1; it <= g->iters; it++)
        col[it - 1] = t[it][k];
      *m[k] = median(col, g->iters);
    }
    out->bytes = 0;
    for (uint32_t j = 0; j < b->n; j++)
      out->bytes += b->len[j];
    out->raw = (uint64_t)b->n * LAYERS * BATCH_TOKENS * HEADS * HDIM * 2 * 2;
  }
  free(sp);
  free(ep);
  free(t);
  return rc;
}

static int run_batched(gbench *g, uint32_t n) {
  bset b;
  memset(&b, 0, sizeof(b));
  b.n = n;
  uint64_t bound;
  kvt_codec_spec raw = KVT_CODEC_SPEC_INIT;
  int rc = kvt_encode_bound(g->ctx, &raw, 0, LAYERS, BATCH_TOKENS, HEADS, HDIM, &bound);
  if (rc)
    return kv_fail(g, "bound", rc);
  b.each = (size_t)((bound + 4095) & ~(uint64_t)4095);
  b.len = calloc(n, sizeof(*b.len));
  b.items = calloc(n, sizeof(*b.items));
  b.stores = calloc(n, sizeof(*b.stores));
  if (!b.len || !b.items || !b.stores)
    rc = CLI_EFAIL;
  if (!rc)
    rc = cu(cudaHostAlloc((void **)&b.pin, n * b.each, cudaHostAllocMapped),
            "cudaHostAlloc of the chunks");
  if (!rc)
    rc = cu(cudaHostAlloc((void **)&b.verdicts, n * sizeof(kvt_gpu_verdict),
                          cudaHostAllocMapped), "cudaHostAlloc verdicts");
  if (!rc) {
    printf("\nlayer-sized: %u chunks of %u tokens x %u layers (1 MiB of bf16 K+V per chunk "
           "and layer), loaded layer by layer with an event after each, verified on the GPU\n",
           n, BATCH_TOKENS, LAYERS);
    printf("%-16s %9s %8s %8s %7s %8s %7s %7s %7s %8s %8s %8s %7s %8s %7s\n", "preset",
           "payload", "H2D", "chunk", "chunk/", "batch", "batch/", "trust/", "tr-zc/", "KV",
           "D2H", "store", "store/", "b-store", "bst/");
    printf("%-16s %9s %8s %8s %7s %8s %7s %7s %7s %8s %8s %8s %7s %8s %7s\n", "", "MiB",
           "GB/s", "GB/s", "H2D", "GB/s", "H2D", "H2D", "H2D", "GB/s", "GB/s", "GB/s", "D2H",
           "GB/s", "D2H");
  }
  for (size_t i = 0; i < N_SPECS && !rc; i++) {
    brow r;
    if ((rc = batch_run(g, &b, gpu_specs[i], &r)) != 0)
      break;
    const double by = (double)r.bytes / 1e9;
    printf("%-16s %9.1f %8.1f %8.1f %7.2f %8.1f %7.2f %7.2f %7.2f %8.1f %8.1f %8.1f %7.2f %8.1f "
           "%7.2f\n",
           gpu_specs[i], (double)r.bytes / (1 << 20), by / r.h2d, by / r.per_chunk,
           r.h2d / r.per_chunk, by / r.batched, r.h2d / r.batched, r.h2d / r.batched_trusted,
           r.h2d / r.batched_zc,
           (double)r.raw / 1e9 / r.batched, by / r.d2h, by / r.store, r.d2h / r.store,
           by / r.batched_store, r.d2h / r.batched_store);
    fflush(stdout);
  }
  cudaFreeHost(b.pin);
  cudaFreeHost(b.verdicts);
  free(b.len);
  free(b.items);
  free(b.stores);
  return rc;
}

static void print_hbm(const char *spec, const grow *r) {
  /* bytes read + written: payload and 16-bit KV */
  const double rw = (double)(r->bytes + r->raw) / 1e9, d2d = 2.0 * (double)r->bytes / 1e9;
  printf("%-16s %9.2f %8.1f %8.1f %7.2f %8.1f %7.2f %8.1f %7.2f %8.1f %7.2f\n", spec,
         (double)r->bytes / (1 << 20), d2d / r->d2d, rw / r->hload,
         (rw / r->hload) / (d2d / r->d2d), rw / r->hload_checked,
         (rw / r->hload_checked) / (d2d / r->d2d), rw / r->hload_gpu,
         (rw / r->hload_gpu) / (d2d / r->d2d), rw / r->hstore,
         (rw / r->hstore) / (d2d / r->d2d));
}

static void print_header(const gsize *z) {
  printf("\n%s: 16-bit K+V %.1f MiB\n", z->name,
         (double)z->payloads * z->layers * z->tokens * HEADS * HDIM * 4 / (1 << 20));
  printf("%-16s %9s %8s %8s %7s %8s %7s %7s %7s %8s %7s %7s %8s %7s %8s %8s %7s %8s\n",
         "preset", "payload", "H2D", "load", "load/", "KV", "KV/", "zcopy/", "staged/",
         "gpu-vfy", "gv/", "gv-lyr/", "host-vfy", "hv/", "D2H", "store", "store/", "verify");
  printf("%-16s %9s %8s %8s %7s %8s %7s %7s %7s %8s %7s %7s %8s %7s %8s %8s %7s %8s\n", "",
         "MiB", "GB/s", "GB/s", "H2D", "GB/s", "H2D", "H2D", "H2D", "GB/s", "H2D", "H2D", "GB/s",
         "H2D", "GB/s", "GB/s", "D2H", "GB/s");
}

static void print_row(const char *spec, const grow *r) {
  const double b = (double)r->bytes / 1e9, raw = (double)r->raw / 1e9;
  printf("%-16s %9.2f %8.1f %8.1f %7.2f %8.1f %7.2f %7.2f %7.2f %8.1f %7.2f %7.2f %8.1f %7.2f "
         "%8.1f %8.1f %7.2f %8.1f\n",
         spec, (double)r->bytes / (1 << 20), b / r->h2d, b / r->load, r->h2d / r->load,
         raw / r->load, (raw / r->load) / (b / r->h2d), r->h2d / r->load_zc,
         r->h2d / r->load_st, b / r->load_gpu, r->h2d / r->load_gpu, r->h2d / r->load_gpu_ev,
         b / r->load_host, r->h2d / r->load_host, b / r->d2h, b / r->store, r->d2h / r->store,
         b / r->verify);
}

int cli_bench_gpu_main(int argc, char **argv) {
  uint32_t iters = 5, max_tokens = 32768, batch = SLOTS / BATCH_TOKENS;
  const cli_opt opts[] = {
      {"--iters", NULL, CLI_U32, &iters, 1, MAX_ITERS},
      {"--max-tokens", NULL, CLI_U32, &max_tokens, 1, 32768},
      {"--batch", NULL, CLI_U32, &batch, 0, SLOTS / BATCH_TOKENS},
  };
  size_t npos = 0;
  int rc = cli_parse("bench gpu", argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0,
                     &npos);
  if (rc == CLI_HELP) {
    fputs(gpu_help, stdout);
    return CLI_OK;
  }
  if (rc)
    return rc;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    cli_error("bench gpu: no CUDA device");
    return CLI_EFAIL;
  }
  struct cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  gbench g;
  memset(&g, 0, sizeof(g));
  g.iters = iters;
  printf("kvtier bench gpu: %s (%d SMs), kvtier %s\n", prop.name, prop.multiProcessorCount,
         kvt_version_string());
  printf("command: kvtier bench gpu --iters %u --max-tokens %u --batch %u\n", iters,
         max_tokens, batch);
  printf("cache: Llama-3.1-8B shape (32 layers, 8 KV heads, dim 128), bf16, vLLM layout, "
         "16-token blocks, %u slots; payloads in pinned mapped host memory\n", SLOTS);
  printf("medians of %u iterations after 1 warm-up; GB = 1e9 bytes; KV = restored 16-bit K+V\n",
         iters);
  if ((rc = setup(&g)) == 0) {
    for (size_t zi = 0; zi < N_SIZES && rc == 0; zi++) {
      const gsize *z = &gpu_sizes[zi];
      if ((uint64_t)z->tokens * z->payloads > max_tokens)
        continue;
      print_header(z);
      grow r[N_SPECS];
      for (size_t i = 0; i < N_SPECS && rc == 0; i++) {
        if ((rc = run_size(&g, gpu_specs[i], z, &r[i])) == 0)
          print_row(gpu_specs[i], &r[i]);
        fflush(stdout);
      }
      if (rc)
        break;
      printf("HBM (payloads in device memory; GB/s of bytes read + written):\n");
      printf("%-16s %9s %8s %8s %7s %8s %7s %8s %7s %8s %7s\n", "preset", "payload", "D2D",
             "load", "load/", "checked", "chk/", "gpu-vfy", "gv/", "store", "store/");
      printf("%-16s %9s %8s %8s %7s %8s %7s %8s %7s %8s %7s\n", "", "MiB", "GB/s", "GB/s",
             "D2D", "GB/s", "D2D", "GB/s", "D2D", "GB/s", "D2D");
      for (size_t i = 0; i < N_SPECS; i++)
        print_hbm(gpu_specs[i], &r[i]);
    }
    if (rc == 0 && batch)
      rc = run_batched(&g, batch);
  }
  teardown(&g);
  return rc ? CLI_EFAIL : CLI_OK;
}
#endif
