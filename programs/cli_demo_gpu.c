/* programs/cli_demo_gpu.c - the GPU part of `kvtier demo`'s cache section:
 * when a CUDA device is present, the context's payloads are loaded with the
 * fused load kernel (kvt_gpu_load) into a vLLM-layout paged bf16/fp16 cache
 * on the device, and every element the kernel wrote is compared with the CPU
 * reference decode of the same payload. Without CUDA or a device it says so
 * and the demo goes on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_demo_cache.h"
#include "cli_util.h"
#include "kvtier/gpu.h"

#ifndef KVT_HAVE_CUDA

int demo_gpu_run(const demo_cache_in *in, uint8_t *const *payloads, const uint64_t *lens,
                 uint32_t chunks, demo_gpu_result *out) {
  (void)in, (void)payloads, (void)lens, (void)chunks;
  memset(out, 0, sizeof(*out));
  snprintf(out->why, sizeof(out->why), "this kvtier was built without CUDA");
  return 0;
}

#else
#include <cuda_runtime_api.h>

#define BLOCK 16 /* vLLM's default block size */

typedef struct dg {
  const demo_cache_in *in;
  demo_gpu_result *r;
  kvt_ctx *ctx;
  void **layers;   /* per layer: [2, blocks, BLOCK, heads, dim] on the device */
  uint32_t blocks;
  size_t layer_elems;
  int64_t *slots;  /* device: token t lives in slot t */
  uint8_t *stage;  /* pinned staging buffer for one payload */
  cudaStream_t st;
  cudaEvent_t e0, e1;
} dg;

static int cu_ok(demo_gpu_result *r, cudaError_t e, const char *what) {
  if (e == cudaSuccess)
    return 1;
  snprintf(r->why, sizeof(r->why), "%s: %s", what, cudaGetErrorString(e));
  return 0;
}

static int setup(dg *g, uint64_t max_len) {
  const demo_cache_in *in = g->in;
  demo_gpu_result *r = g->r;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    snprintf(r->why, sizeof(r->why), "no CUDA device");
    return 0;
  }
  struct cudaDeviceProp prop;
  if (!cu_ok(r, cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties"))
    return 0;
  snprintf(r->device, sizeof(r->device), "%.120s", prop.name);
  g->blocks = (in->tokens + BLOCK - 1) / BLOCK;
  g->layer_elems = (size_t)2 * g->blocks * BLOCK * in->heads * in->head_dim;
  g->layers = calloc(in->layers, sizeof(void *));
  int64_t *host = malloc(sizeof(int64_t) * in->tokens);
  if (!g->layers || !host) {
    free(host);
    snprintf(r->why, sizeof(r->why), "out of memory");
    return 0;
  }
  for (uint32_t t = 0; t < in->tokens; t++)
    host[t] = t;
  int ok = cu_ok(r, cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking), "stream") &&
           cu_ok(r, cudaEventCreate(&g->e0), "event") && cu_ok(r, cudaEventCreate(&g->e1), "event");
  for (uint32_t l = 0; ok && l < in->layers; l++)
    ok = cu_ok(r, cudaMalloc(&g->layers[l], g->layer_elems * 2), "cudaMalloc cache") &&
         cu_ok(r, cudaMemset(g->layers[l], 0xFF, g->layer_elems * 2), "cudaMemset");
  ok = ok && cu_ok(r, cudaMalloc((void **)&g->slots, sizeof(int64_t) * in->tokens), "slots") &&
       cu_ok(r, cudaMemcpy(g->slots, host, sizeof(int64_t) * in->tokens, cudaMemcpyHostToDevice),
             "slots") &&
       cu_ok(r, cudaHostAlloc((void **)&g->stage, max_len, cudaHostAllocMapped), "cudaHostAlloc");
  free(host);
  return ok;
}

static void teardown(dg *g) {
  for (uint32_t l = 0; g->layers && l < g->in->layers; l++)
    cudaFree(g->layers[l]);
  free(g->layers);
  cudaFree(g->slots);
  cudaFreeHost(g->stage);
  if (g->st) {
    cudaEventDestroy(g->e0);
    cudaEventDestroy(g->e1);
    cudaStreamDestroy(g->st);
  }
}

/* Loads every chunk from pinned host memory, timing the kernels alone. */
static int load_all(dg *g, kvt_gpu_layout *L, uint8_t *const *payloads, const uint64_t *lens,
                    uint32_t chunks) {
  demo_gpu_result *r = g->r;
  for (uint32_t c = 0; c < chunks; c++) {
    memcpy(g->stage, payloads[c], lens[c]);
    const uint32_t t0 = c * g->in->chunk;
    kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
    lp.tokens = g->in->tokens - t0 < g->in->chunk ? g->in->tokens - t0 : g->in->chunk;
    lp.slots = g->slots + t0;
    lp.flags = KVT_GPU_LOAD_TRUST_HOST; /* the cache verified these bytes already */
    float ms = 0;
    if (!cu_ok(r, cudaEventRecord(g->e0, g->st), "event"))
      return 0;
    const int rc = kvt_gpu_load(L, g->stage, lens[c], &lp, g->st);
    if (rc) {
      snprintf(r->why, sizeof(r->why), "kvt_gpu_load of chunk %u: %s: %s", c, kvt_err_name(rc),
               kvt_ctx_last_error(g->ctx));
      return 0;
    }
    if (!cu_ok(r, cudaEventRecord(g->e1, g->st), "event") ||
        !cu_ok(r, cudaEventSynchronize(g->e1), "sync") ||
        !cu_ok(r, cudaEventElapsedTime(&ms, g->e0, g->e1), "elapsed"))
      return 0;
    r->load_s += ms / 1e3;
    r->payload_bytes += lens[c];
    r->kv_bytes += (uint64_t)4 * lp.tokens * g->in->layers * g->in->heads * g->in->head_dim;
  }
  return 1;
}

/* Every element the kernel wrote equals the CPU decode of the same payload. */
static int verify(dg *g, uint8_t *const *payloads, const uint64_t *lens, uint32_t chunks) {
  const demo_cache_in *in = g->in;
  demo_gpu_result *r = g->r;
  const size_t hd = (size_t)in->heads * in->head_dim;
  const size_t per_chunk = (size_t)in->layers * in->chunk * hd;
  uint16_t *dev = malloc(g->layer_elems * 2 * in->layers);
  uint16_t *k = malloc(per_chunk * 2), *v = malloc(per_chunk * 2);
  int ok = dev && k && v;
  for (uint32_t l = 0; ok && l < in->layers; l++)
    ok = cu_ok(r, cudaMemcpy(dev + l * g->layer_elems, g->layers[l], g->layer_elems * 2,
                             cudaMemcpyDeviceToHost), "download");
  for (uint32_t c = 0; ok && c < chunks; c++) {
    const uint32_t t0 = c * in->chunk, nt = in->tokens - t0 < in->chunk ? in->tokens - t0 : in->chunk;
    kvt_kv_view dst;
    kvt_kv_view_dense(&dst, k, v, in->dtype, in->layers, nt, in->heads, in->head_dim);
    kvt_decode_params dp = KVT_DECODE_PARAMS_INIT;
    if (kvt_decode(g->ctx, payloads[c], lens[c], &dp, &dst) != 0) {
      snprintf(r->why, sizeof(r->why), "CPU decode of chunk %u: %s", c, kvt_ctx_last_error(g->ctx));
      ok = 0;
      break;
    }
    for (uint32_t l = 0; ok && l < in->layers; l++)
      for (uint32_t t = 0; ok && t < nt; t++) {
        const size_t slot = t0 + t;
        const uint16_t *gk = dev + l * g->layer_elems + slot * hd; /* [0][block][off] = slot */
        const uint16_t *gv = gk + g->layer_elems / 2;
        const size_t at = ((size_t)l * nt + t) * hd;
        if (memcmp(gk, k + at, hd * 2) || memcmp(gv, v + at, hd * 2)) {
          snprintf(r->why, sizeof(r->why), "chunk %u layer %u token %u differs from the CPU decode",
                   c, l, t);
          r->mismatch = 1;
          ok = 0;
        }
      }
    r->verified += ok;
  }
  free(dev);
  free(k);
  free(v);
  return ok;
}

int demo_gpu_run(const demo_cache_in *in, uint8_t *const *payloads, const uint64_t *lens,
                 uint32_t chunks, demo_gpu_result *out) {
  memset(out, 0, sizeof(*out));
  dg g;
  memset(&g, 0, sizeof(g));
  g.in = in;
  g.r = out;
  uint64_t max_len = 0;
  for (uint32_t c = 0; c < chunks; c++)
    max_len = lens[c] > max_len ? lens[c] : max_len;
  if (cli_ctx_create(0, &g.ctx))
    return CLI_EFAIL;
  kvt_gpu_layout *L = NULL;
  if (setup(&g, max_len)) {
    kvt_gpu_layout_desc d;
    kvt_gpu_layout_desc_vllm(&d, in->dtype, in->layers, g.layers, g.blocks, BLOCK, in->heads,
                             in->head_dim);
    int rc = kvt_gpu_layout_create(g.ctx, &d, &L);
    if (rc)
      snprintf(out->why, sizeof(out->why), "kvt_gpu_layout_create: %s",
               kvt_ctx_last_error(g.ctx));
    else if (load_all(&g, L, payloads, lens, chunks) && verify(&g, payloads, lens, chunks))
      out->ran = 1;
  }
  kvt_gpu_layout_destroy(L);
  teardown(&g);
  kvt_ctx_destroy(g.ctx);
  /* A GPU that failed is reported in the output, not as the demo's failure,
   * unless the kernel wrote something other than the CPU decode. */
  if (out->mismatch)
    cli_error("demo: the GPU load %s", out->why);
  return out->mismatch ? CLI_EFAIL : 0;
}
#endif
