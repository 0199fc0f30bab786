/* tests/test_gpu_loadstore.c - the fused GPU store and load (kvtier/gpu.h)
 * against the CPU reference codec: GPU store bytes equal kvt_encode's, a GPU
 * load of a CPU payload leaves every slot equal to kvt_decode's output (and
 * every other element untouched), and store -> load round trips, for every
 * preset and several general specs, every engine layout (legacy vLLM,
 * current vLLM in each of its six KVCacheLayouts, FlashInfer NHD and HND,
 * separate K/V buffers), bf16 and fp16, block sizes 16, 64, 128.
 * Stores into device memory (checksums by the GPU's XXH3) give the same
 * bytes; loads of device payloads are checked on the GPU (their section
 * checksums computed there). The golden payloads
 * (tests/golden) load to kvt_decode's values and their inputs store to their
 * exact bytes. Bad payloads are refused. Label gpu: skips (77) without a
 * CUDA build or device; built without CUDA it first checks the calls return
 * KVT_ENOTSUP. In both builds the current-vLLM filler is first checked on the
 * host against vLLM's stride rule (kvt_gpu_layout_desc_vllm_v1).
 * KVT_GPU_TEST_QUICK=1 runs one block size per layout (for compute-sanitizer). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvtier.h"
#include "kvtier/gpu.h"

/* vLLM 0.33's KVCacheLayout members (vllm/v1/kv_cache_layout.py): the
 * logical axes [L, B, H, N, C] in physical order, outermost first. */
static const struct {
  const char *name;
  int layout;
  int order[5];
} vllm_layouts[] = {
    {"LBHNC", KVT_VLLM_LBHNC, {0, 1, 2, 3, 4}}, {"LBNHC", KVT_VLLM_LBNHC, {0, 1, 3, 2, 4}},
    {"LHBNC", KVT_VLLM_LHBNC, {0, 2, 1, 3, 4}}, {"BLHNC", KVT_VLLM_BLHNC, {1, 0, 2, 3, 4}},
    {"BLNHC", KVT_VLLM_BLNHC, {1, 0, 3, 2, 4}}, {"BHLNC", KVT_VLLM_BHLNC, {1, 2, 0, 3, 4}},
};

/* Element offset of logical [l, b, h, n, c] in a dense tensor of the given
 * sizes stored in the given physical order (what torch.as_strided over
 * vLLM's compute_layout_strides addresses). */
static int64_t vllm_offset(const int order[5], const uint64_t size[5], const uint64_t at[5]) {
  int64_t off = 0;
  for (int i = 0; i < 5; i++)
    off = off * (int64_t)size[order[i]] + (int64_t)at[order[i]];
  return off;
}

/* The current-vLLM filler addresses every K and V element where vLLM puts
 * it: K of (layer l, block b, head h, token n, dim d) at logical
 * [l, b, h, n, d] and V at [l, b, h, n, head_dim + d] of the layers' one
 * backing tensor, each layer's pointer being its view's start [l, 0, 0, 0, 0].
 * The legacy filler keeps [2, blocks, block_size, heads, head_dim]. */
static void test_gpu_layout_desc_vllm_v1_addresses_vllm_elements(void **state) {
  (void)state;
  const uint32_t L = 3, B = 5, H = 4, N = 16, D = 8;
  const uint64_t size[5] = {L, B, H, N, 2 * D};
  static uint16_t backing[3 * 5 * 4 * 16 * 16];
  void *ptrs[3];
  for (size_t i = 0; i < sizeof(vllm_layouts) / sizeof(vllm_layouts[0]); i++) {
    const int *order = vllm_layouts[i].order;
    for (uint32_t l = 0; l < L; l++) {
      const uint64_t at[5] = {l, 0, 0, 0, 0};
      ptrs[l] = backing + vllm_offset(order, size, at);
    }
    kvt_gpu_layout_desc d;
    kvt_gpu_layout_desc_vllm_v1(&d, KVT_DTYPE_BF16, L, ptrs, B, N, H, D, vllm_layouts[i].layout);
    assert_int_equal(d.struct_size, sizeof(d));
    assert_int_equal(d.layers, L);
    assert_int_equal(d.num_blocks, B);
    assert_int_equal(d.block_size, N);
    assert_int_equal(d.heads, H);
    assert_int_equal(d.head_dim, D);
    assert_null(d.v_layers);
    assert_int_equal(d.staging_bytes, KVT_GPU_STAGING_DEFAULT);
    for (uint32_t l = 0; l < L; l++)
      for (uint32_t b = 0; b < B; b++)
        for (uint32_t h = 0; h < H; h++)
          for (uint32_t n = 0; n < N; n++)
            for (uint32_t c = 0; c < 2 * D; c += D - 1) { /* dims 0, D-1 of K and V */
              const uint64_t at[5] = {l, b, h, n, c};
              const int kind = c >= D;
              const int64_t want = vllm_offset(order, size, at);
              const int64_t got = ((uint16_t *)d.k_layers[l] - backing) +
                                  (kind ? d.v_offset : d.k_offset) + b * d.stride_block +
                                  n * d.stride_token + h * d.stride_head + (c - kind * D);
              if (got != want)
                fail_msg("%s: layer %u block %u head %u token %u %s dim %u at %lld, vLLM "
                         "puts it at %lld", vllm_layouts[i].name, l, b, h, n, kind ? "V" : "K",
                         c - kind * D, (long long)got, (long long)want);
            }
  }
  /* The default and its legacy name. */
  assert_int_equal(KVT_VLLM_NHD, KVT_VLLM_LBNHC);
  assert_int_equal(KVT_VLLM_HND, KVT_VLLM_LBHNC);
  /* An unknown layout leaves nothing a layout could be made of. */
  kvt_gpu_layout_desc d;
  kvt_gpu_layout_desc_vllm_v1(&d, KVT_DTYPE_BF16, L, ptrs, B, N, H, D, 6);
  assert_int_equal(d.layers, 0);
  kvt_gpu_layout_desc_vllm_v1(&d, KVT_DTYPE_BF16, L, ptrs, B, N, H, D, -1);
  assert_int_equal(d.layers, 0);
  /* Legacy: K of all blocks, then V. */
  kvt_gpu_layout_desc_vllm(&d, KVT_DTYPE_BF16, 1, ptrs, B, N, H, D);
  assert_int_equal(d.stride_head, D);
  assert_int_equal(d.stride_token, H * D);
  assert_int_equal(d.stride_block, N * H * D);
  assert_int_equal(d.k_offset, 0);
  assert_int_equal(d.v_offset, (int64_t)B * N * H * D);
}

/* The checks that need no device, run first in every build. */
static int run_host_tests(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu_layout_desc_vllm_v1_addresses_vllm_elements),
  };
  return cmocka_run_group_tests_name("host", tests, NULL, NULL);
}

#ifdef KVT_TEST_HAVE_GPU
#include <cuda_runtime_api.h>

#include "golden/golden_common.h"

#define MAXL 8
#define CUDA_OK(x) assert_int_equal((int)(x), 0)

/* LAY_V1 + i: current vLLM in vllm_layouts[i]. */
enum { LAY_VLLM, LAY_NHD, LAY_HND, LAY_SEP, LAY_V1, N_LAYOUTS = LAY_V1 + 6 };
static const char *const layout_names[] = {"vllm-legacy", "flashinfer-nhd", "flashinfer-hnd",
                                           "separate"};

static const char *layout_name(int layout) {
  static char buf[N_LAYOUTS][24];
  if (layout < LAY_V1)
    return layout_names[layout];
  snprintf(buf[layout], sizeof(buf[layout]), "vllm-%s", vllm_layouts[layout - LAY_V1].name);
  return buf[layout];
}

typedef struct shape {
  uint32_t layers, tokens, heads, head_dim;
} shape;

/* An engine cache on the device with a host mirror of what it should hold. */
typedef struct engine {
  int layout, dtype;
  uint32_t layers, nb, bs, H, D;
  size_t elems[2];       /* per layer, per buffer (buffer 1: V of separate) */
  int nbuf;
  uint16_t *host[2][MAXL];
  void *dev[2][MAXL];
  /* Where each layer's view starts in its buffer (elements): current vLLM's
   * block-outer layouts interleave the layers of one backing tensor, so each
   * layer gets a buffer of the whole backing and starts at its own offset. */
  size_t loff[MAXL];
  void *view[MAXL];
  kvt_gpu_layout_desc desc;
} engine;

static kvt_ctx *ctx;
static void *stream;
static int quick;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}

static float rnd_val(float mag) {
  uint32_t r = rnd() % 64;
  if (r == 0)
    return 0.0f;
  if (r == 1)
    return -0.0f;
  float u = (float)(rnd() % 20001) / 10000.0f - 1.0f;
  return u * mag;
}

static uint16_t to16(float f, int dtype) {
  return dtype == KVT_DTYPE_BF16 ? kvt_f32_to_bf16(f) : kvt_f32_to_f16(f);
}

/* Dense [layer][token][head][dim] K and V with row magnitudes from 2^-6 to 2^6. */
static void fill_dense(uint16_t *k, uint16_t *v, const shape *s, int dtype) {
  size_t rows = (size_t)s->layers * s->tokens * s->heads;
  for (size_t r = 0; r < rows; r++) {
    float mk = (float)(1u << (rnd() % 13)) / 64.0f, mv = (float)(1u << (rnd() % 13)) / 64.0f;
    for (uint32_t d = 0; d < s->head_dim; d++) {
      k[r * s->head_dim + d] = to16(rnd_val(mk), dtype);
      v[r * s->head_dim + d] = to16(rnd_val(mv), dtype);
    }
  }
}

/* Element index of (kind, slot, head, dim) within its buffer. */
static size_t eidx(const engine *e, int kind, uint32_t slot, uint32_t h, uint32_t d) {
  const kvt_gpu_layout_desc *g = &e->desc;
  int64_t i = (kind ? g->v_offset : g->k_offset) +
              (int64_t)(slot / g->block_size) * g->stride_block +
              (int64_t)(slot % g->block_size) * g->stride_token + (int64_t)h * g->stride_head + d;
  return (size_t)i;
}

static uint16_t *ebuf(engine *e, int kind, uint32_t layer) {
  return e->host[e->nbuf == 2 ? kind : 0][layer] + e->loff[layer];
}

/* A pattern in every element: a load must leave all but its slots alone. */
static void engine_background(engine *e) {
  for (int b = 0; b < e->nbuf; b++)
    for (uint32_t l = 0; l < e->layers; l++)
      for (size_t i = 0; i < e->elems[b]; i++)
        e->host[b][l][i] = (uint16_t)(0x3C00 ^ ((i + l) * 2654435761u >> 16));
}

static void engine_make(engine *e, int layout, int dtype, uint32_t layers, uint32_t slots_needed,
                        uint32_t bs, uint32_t H, uint32_t D) {
  memset(e, 0, sizeof(*e));
  e->layout = layout;
  e->dtype = dtype;
  e->layers = layers;
  e->bs = layout == LAY_SEP ? 1 : bs;
  e->nb = (slots_needed + e->bs - 1) / e->bs + 3;
  e->H = H;
  e->D = D;
  e->nbuf = layout == LAY_SEP ? 2 : 1;
  size_t per = (size_t)e->nb * e->bs * H * D;
  e->elems[0] = e->elems[1] = layout == LAY_SEP ? per : 2 * per;
  const int *order = layout >= LAY_V1 ? vllm_layouts[layout - LAY_V1].order : NULL;
  const uint64_t vsize[5] = {layers, e->nb, H, e->bs, 2 * (uint64_t)D};
  if (order && order[0] != 0)
    e->elems[0] *= layers; /* block-outer: the whole backing tensor */
  for (int b = 0; b < e->nbuf; b++)
    for (uint32_t l = 0; l < layers; l++) {
      e->host[b][l] = malloc(e->elems[b] * 2);
      assert_non_null(e->host[b][l]);
      CUDA_OK(cudaMalloc(&e->dev[b][l], e->elems[b] * 2));
      const uint64_t at[5] = {l, 0, 0, 0, 0};
      if (b == 0) {
        e->loff[l] = order && order[0] != 0 ? (size_t)vllm_offset(order, vsize, at) : 0;
        e->view[l] = (uint16_t *)e->dev[0][l] + e->loff[l];
      }
    }
  engine_background(e);
  if (order) {
    kvt_gpu_layout_desc_vllm_v1(&e->desc, dtype, layers, e->view, e->nb, e->bs, H, D,
                                vllm_layouts[layout - LAY_V1].layout);
    return;
  }
  switch (layout) {
  case LAY_VLLM:
    kvt_gpu_layout_desc_vllm(&e->desc, dtype, layers, e->dev[0], e->nb, e->bs, H, D);
    break;
  case LAY_NHD:
    kvt_gpu_layout_desc_flashinfer_nhd(&e->desc, dtype, layers, e->dev[0], e->nb, e->bs, H, D);
    break;
  case LAY_HND:
    kvt_gpu_layout_desc_flashinfer_hnd(&e->desc, dtype, layers, e->dev[0], e->nb, e->bs, H, D);
    break;
  default:
    kvt_gpu_layout_desc_separate(&e->desc, dtype, layers, e->dev[0], e->dev[1], e->nb, H, D);
    break;
  }
}

static void engine_upload(engine *e) {
  for (int b = 0; b < e->nbuf; b++)
    for (uint32_t l = 0; l < e->layers; l++)
      CUDA_OK(cudaMemcpy(e->dev[b][l], e->host[b][l], e->elems[b] * 2, cudaMemcpyHostToDevice));
  /* A copy from pageable memory may still be landing when cudaMemcpy
   * returns, and the tests' stream does not wait for the legacy stream. */
  CUDA_OK(cudaDeviceSynchronize());
}

/* The device contents equal the host mirror, every element. */
static void engine_expect(engine *e, const char *what) {
  for (int b = 0; b < e->nbuf; b++)
    for (uint32_t l = 0; l < e->layers; l++) {
      uint16_t *got = malloc(e->elems[b] * 2);
      assert_non_null(got);
      CUDA_OK(cudaMemcpy(got, e->dev[b][l], e->elems[b] * 2, cudaMemcpyDeviceToHost));
      if (memcmp(got, e->host[b][l], e->elems[b] * 2) != 0) {
        size_t i = 0;
        while (got[i] == e->host[b][l][i])
          i++;
        fail_msg("%s: %s buffer %d layer %u element %zu: got %04x, want %04x", what,
                 layout_name(e->layout), b, l, i, got[i], e->host[b][l][i]);
      }
      free(got);
    }
}

static void engine_free(engine *e) {
  for (int b = 0; b < e->nbuf; b++)
    for (uint32_t l = 0; l < e->layers; l++) {
      free(e->host[b][l]);
      cudaFree(e->dev[b][l]);
    }
}

/* Writes dense layers [l0, l0+n) of k/v into the mirror at the slots. */
static void scatter(engine *e, const uint16_t *k, const uint16_t *v, const shape *s,
                    const uint32_t *slots, uint32_t l0, uint32_t n, uint32_t dense_l0) {
  for (uint32_t l = l0; l < l0 + n; l++)
    for (int kind = 0; kind < 2; kind++) {
      const uint16_t *src = kind ? v : k;
      uint16_t *dst = ebuf(e, kind, l);
      for (uint32_t t = 0; t < s->tokens; t++)
        for (uint32_t h = 0; h < s->heads; h++)
          memcpy(dst + eidx(e, kind, slots[t], h, 0),
                 src + (((size_t)(l - l0 + dense_l0) * s->tokens + t) * s->heads + h) *
                           s->head_dim,
                 2 * (size_t)s->head_dim);
    }
}

typedef struct combo {
  shape s;
  const char *spec;
  int layout, dtype;
  uint32_t bs;
  uint32_t lb, n; /* layers stored: [lb, lb+n) */
} combo;

static void *pinned(size_t n) {
  void *p = NULL;
  CUDA_OK(cudaHostAlloc(&p, n ? n : 1, cudaHostAllocMapped));
  return p;
}

static void run_combo(const combo *c) {
  char what[256];
  snprintf(what, sizeof(what), "%s %s %s bs %u shape %ux%ux%ux%u layers %u+%u", c->spec,
           layout_name(c->layout), kvt_dtype_name(c->dtype), c->bs, c->s.layers, c->s.tokens,
           c->s.heads, c->s.head_dim, c->lb, c->n);
  const shape *s = &c->s;
  const size_t n_el = (size_t)s->layers * s->tokens * s->heads * s->head_dim;
  uint16_t *k = malloc(2 * n_el), *v = malloc(2 * n_el), *dk = malloc(2 * n_el),
           *dv = malloc(2 * n_el);
  assert_true(k && v && dk && dv);
  fill_dense(k, v, s, c->dtype);

  engine src, dst;
  engine_make(&src, c->layout, c->dtype, s->layers, s->tokens, c->bs, s->heads, s->head_dim);
  engine_make(&dst, c->layout, c->dtype, s->layers, s->tokens, c->bs, s->heads, s->head_dim);
  /* Distinct random slots for the chunk's tokens. */
  const uint32_t nslots = src.nb * src.bs;
  uint32_t *perm = malloc(sizeof(uint32_t) * nslots);
  int64_t *slots64 = malloc(sizeof(int64_t) * s->tokens);
  for (uint32_t i = 0; i < nslots; i++)
    perm[i] = i;
  for (uint32_t i = nslots - 1; i > 0; i--) {
    uint32_t j = rnd() % (i + 1), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (uint32_t t = 0; t < s->tokens; t++)
    slots64[t] = perm[t];
  int64_t *dslots;
  CUDA_OK(cudaMalloc((void **)&dslots, sizeof(int64_t) * s->tokens));
  CUDA_OK(cudaMemcpy(dslots, slots64, sizeof(int64_t) * s->tokens, cudaMemcpyHostToDevice));
  scatter(&src, k, v, s, perm, 0, s->layers, 0);
  engine_upload(&src);
  engine_upload(&dst);

  kvt_gpu_layout *Ls, *Ld;
  int rc = kvt_gpu_layout_create(ctx, &src.desc, &Ls);
  if (rc)
    fail_msg("%s: layout: %s %s", what, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  assert_int_equal(kvt_gpu_layout_create(ctx, &dst.desc, &Ld), 0);

  /* CPU reference payload of layers [lb, lb+n). */
  kvt_encode_params ep = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(kvt_codec_parse(ctx, c->spec, &ep.spec), 0);
  memset(ep.key.bytes, 0xA5, 16);
  memset(ep.fingerprint.bytes, 0x5A, 16);
  ep.model_layers = s->layers;
  ep.layer_begin = c->lb;
  ep.token_begin = 512;
  const size_t lay = (size_t)s->tokens * s->heads * s->head_dim;
  kvt_kv_view view;
  kvt_kv_view_dense(&view, k + c->lb * lay, v + c->lb * lay, c->dtype, c->n, s->tokens, s->heads,
                    s->head_dim);
  uint64_t bound;
  assert_int_equal(kvt_encode_bound(ctx, &ep.spec, c->lb, c->n, s->tokens, s->heads,
                                    s->head_dim, &bound),
                   0);
  uint8_t *cpu = pinned(bound), *gpu = pinned(bound);
  size_t cpu_len = 0, gpu_len = 0;
  rc = kvt_encode(ctx, &ep, &view, cpu, bound, &cpu_len);
  if (rc)
    fail_msg("%s: encode: %s %s", what, kvt_err_name(rc), kvt_ctx_last_error(ctx));

  /* 1. GPU store: the CPU encoder's bytes, and a valid payload. */
  kvt_gpu_store_params sp = KVT_GPU_STORE_PARAMS_INIT;
  sp.encode = &ep;
  sp.layer_count = c->n;
  sp.tokens = s->tokens;
  sp.slots = dslots;
  memset(gpu, 0xEE, bound);
  rc = kvt_gpu_store(Ls, &sp, gpu, bound, &gpu_len, stream);
  if (rc)
    fail_msg("%s: gpu store: %s %s", what, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  assert_int_equal(gpu_len, cpu_len);
  if (memcmp(gpu, cpu, cpu_len) != 0) {
    size_t i = 0;
    while (gpu[i] == cpu[i])
      i++;
    fail_msg("%s: GPU store byte %zu of %zu: %02x, CPU %02x", what, i, cpu_len, gpu[i], cpu[i]);
  }
  assert_int_equal(kvt_payload_verify(ctx, gpu, gpu_len, NULL), 0);

  /* 2. GPU load of the CPU payload (pinned host): the slots hold
   * kvt_decode's output, everything else is untouched. */
  kvt_decode_params dp = KVT_DECODE_PARAMS_INIT;
  kvt_kv_view dview;
  kvt_kv_view_dense(&dview, dk, dv, c->dtype, c->n, s->tokens, s->heads, s->head_dim);
  assert_int_equal(kvt_decode(ctx, cpu, cpu_len, &dp, &dview), 0);
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = s->tokens;
  lp.slots = dslots;
  lp.expect_key = &ep.key;
  lp.expect_fingerprint = &ep.fingerprint;
  lp.flags = KVT_GPU_LOAD_STAGED;
  rc = kvt_gpu_load(Ld, cpu, cpu_len, &lp, stream);
  if (rc)
    fail_msg("%s: gpu load: %s %s", what, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  CUDA_OK(cudaStreamSynchronize(stream));
  scatter(&dst, dk, dv, s, perm, c->lb, c->n, 0);
  snprintf(what + strlen(what), sizeof(what) - strlen(what), " (CPU payload -> GPU load)");
  engine_expect(&dst, what);
  /* 2b. The same load read by the kernel from host memory (zero copy), and
   * staged through slots of about one layer each, so that the pieces cycle
   * through the slots (a layer larger than a slot falls back to zero copy):
   * the same values each time. */
  for (int mode = 0; mode < 2; mode++) {
    engine_background(&dst);
    engine_upload(&dst);
    kvt_gpu_layout *Lx = Ld;
    lp.flags = mode == 0 ? KVT_GPU_LOAD_ZERO_COPY : KVT_GPU_LOAD_STAGED;
    if (mode == 1) {
      kvt_gpu_layout_desc dd = dst.desc;
      dd.staging_bytes = 3 * ((cpu_len / c->n + 255) / 256 * 256 + 256);
      assert_int_equal(kvt_gpu_layout_create(ctx, &dd, &Lx), 0);
    }
    rc = kvt_gpu_load(Lx, cpu, cpu_len, &lp, stream);
    if (rc)
      fail_msg("%s: gpu load (%s): %s %s", what, mode ? "small staging" : "zero copy",
               kvt_err_name(rc), kvt_ctx_last_error(ctx));
    CUDA_OK(cudaStreamSynchronize(stream));
    if (mode == 1)
      kvt_gpu_layout_destroy(Lx);
    scatter(&dst, dk, dv, s, perm, c->lb, c->n, 0);
    char mwhat[400];
    snprintf(mwhat, sizeof(mwhat), "%s [%s]", what, mode ? "small staging" : "zero copy");
    engine_expect(&dst, mwhat);
  }
  lp.flags = 0;

  /* 3. GPU store into device memory (checksums by the GPU's XXH3): the same
   * bytes. Then a store -> load round trip through it, the last layer only
   * (layer_first): its slots get kvt_decode's values, nothing else is
   * written. */
  uint8_t *dpay;
  size_t dlen = 0;
  CUDA_OK(cudaMalloc((void **)&dpay, bound));
  rc = kvt_gpu_store(Ls, &sp, dpay, bound, &dlen, stream);
  if (rc)
    fail_msg("%s: gpu store (device): %s %s", what, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  assert_int_equal(dlen, cpu_len);
  memset(gpu, 0, cpu_len);
  CUDA_OK(cudaMemcpy(gpu, dpay, dlen, cudaMemcpyDeviceToHost));
  if (memcmp(gpu, cpu, cpu_len) != 0) {
    size_t i = 0;
    while (gpu[i] == cpu[i])
      i++;
    fail_msg("%s: GPU store to device memory, byte %zu of %zu: %02x, CPU %02x", what, i,
             cpu_len, gpu[i], cpu[i]);
  }
  engine_background(&dst);
  engine_upload(&dst);
  lp.layer_first = c->n - 1;
  lp.layer_count = 1;
  lp.flags = KVT_GPU_LOAD_TRUST_DEVICE;
  rc = kvt_gpu_load(Ld, dpay, gpu_len, &lp, stream);
  if (rc)
    fail_msg("%s: gpu load (device): %s %s", what, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  CUDA_OK(cudaStreamSynchronize(stream));
  scatter(&dst, dk, dv, s, perm, c->lb + c->n - 1, 1, c->n - 1);
  snprintf(what + strlen(what), sizeof(what) - strlen(what), " (GPU payload in HBM -> layer)");
  engine_expect(&dst, what);
  /* Layer by layer with an event after each: the same values. */
  engine_background(&dst);
  engine_upload(&dst);
  cudaEvent_t ev[MAXL];
  for (uint32_t i = 0; i < c->n; i++)
    CUDA_OK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
  lp.layer_first = 0;
  lp.layer_count = 0;
  lp.flags = 0;
  lp.layer_events = (void *const *)ev;
  rc = kvt_gpu_load(Ld, gpu, gpu_len, &lp, stream);
  if (rc)
    fail_msg("%s: gpu load (events): %s %s", what, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  for (uint32_t i = 0; i < c->n; i++) {
    CUDA_OK(cudaEventSynchronize(ev[i]));
    CUDA_OK(cudaEventDestroy(ev[i]));
  }
  lp.layer_events = NULL;
  scatter(&dst, dk, dv, s, perm, c->lb, c->n, 0);
  engine_expect(&dst, what);
  lp.layer_first = c->n - 1;
  lp.layer_count = 1;
  /* Without the trust flag the GPU checks the loaded sections' checksums:
   * fine as stored, refused after one flipped byte of the loaded layer. */
  lp.flags = 0;
  rc = kvt_gpu_load(Ld, dpay, gpu_len, &lp, stream);
  if (rc)
    fail_msg("%s: gpu load (device, checked): %s %s", what, kvt_err_name(rc),
             kvt_ctx_last_error(ctx));
  CUDA_OK(cudaStreamSynchronize(stream));
  uint8_t byte = (uint8_t)(cpu[cpu_len - 1] ^ 0x40);
  CUDA_OK(cudaMemcpy(dpay + cpu_len - 1, &byte, 1, cudaMemcpyHostToDevice));
  assert_int_equal(kvt_gpu_load(Ld, dpay, gpu_len, &lp, stream), KVT_ECHECKSUM);
  lp.flags = KVT_GPU_LOAD_TRUST_DEVICE; /* what the flag means: not checked */
  assert_int_equal(kvt_gpu_load(Ld, dpay, gpu_len, &lp, stream), 0);
  CUDA_OK(cudaStreamSynchronize(stream));

  cudaFree(dpay);
  cudaFree(dslots);
  cudaFreeHost(cpu);
  cudaFreeHost(gpu);
  kvt_gpu_layout_destroy(Ls);
  kvt_gpu_layout_destroy(Ld);
  engine_free(&src);
  engine_free(&dst);
  free(perm);
  free(slots64);
  free(k);
  free(v);
  free(dk);
  free(dv);
}

static const char *const main_specs[] = {
    "raw", "k16v8", "fp8", "int8", "k16v4", "k8v4", "int4", "int4,kgroup=dim",
    "k=e4m3,v=i8,scale=block,block=16", "k=i8,v=e4m3,scale=layer",
    "k=i4,v=i4,group=64,kgroup=token", "k=i4,v=i4,group=2,kgroup=dim", "k16v8,raw=1",
    "k=e4m3,v=i4,group=16,scale=block,block=7",
};
#define N_MAIN (sizeof(main_specs) / sizeof(main_specs[0]))

static void test_gpu_store_and_load_match_cpu_codec_every_preset_and_layout(void **state) {
  (void)state;
  static const uint32_t block_sizes[] = {16, 64, 128};
  const shape s = {3, 100, 2, 64};
  for (int layout = 0; layout < N_LAYOUTS; layout++)
    for (int dt = KVT_DTYPE_BF16; dt <= KVT_DTYPE_F16; dt++)
      for (size_t b = 0; b < 3; b++) {
        if ((layout == LAY_SEP || layout >= LAY_V1 || quick) && b != (size_t)layout % 3)
          continue; /* block size 1 for separate buffers; one size per current-vLLM
                       layout (they cycle through the sizes) and in quick mode */
        for (size_t i = 0; i < N_MAIN; i++) {
          combo c = {s, main_specs[i], layout, dt, block_sizes[b], 1, 2};
          run_combo(&c);
        }
      }
}

/* Odd and unusual shapes: odd head_dim (one-element lane steps), a group
 * that is no power of two of lane chunks, many heads, all layers. */
static void test_gpu_store_and_load_match_cpu_codec_odd_shapes(void **state) {
  (void)state;
  static const struct {
    shape s;
    const char *spec;
  } cases[] = {
      {{2, 37, 3, 7}, "k16v8"},
      {{2, 37, 3, 7}, "fp8,scale=block,block=5"},
      {{2, 37, 3, 7}, "int8,scale=layer"},
      {{2, 37, 3, 96}, "k=i4,v=i4,group=24,kgroup=dim"},
      {{2, 37, 3, 96}, "k=i4,v=i4,group=96,kgroup=token"},
      {{2, 5, 16, 256}, "k8v4"},
      {{2, 300, 1, 6}, "int4,group=6"},
      {{1, 1, 1, 2}, "int4,group=2"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    for (int layout = 0; layout < N_LAYOUTS; layout++) {
      combo c = {cases[i].s, cases[i].spec, layout, KVT_DTYPE_BF16 + (int)(i % 2), 16, 0,
                 cases[i].s.layers};
      run_combo(&c);
    }
}

/* A small vLLM engine with one stored payload, for the refusal tests. */
typedef struct fixture {
  engine e;
  kvt_gpu_layout *L;
  int64_t *dslots;
  uint8_t *pay;
  size_t len, cap; /* cap: room for the raw payload of the shape */
  kvt_encode_params ep;    /* what sp.encode points to */
  kvt_gpu_store_params sp;
} fixture;

static void fixture_make(fixture *f, const char *spec, const shape *s) {
  engine_make(&f->e, LAY_VLLM, KVT_DTYPE_BF16, s->layers, s->tokens, 16, s->heads, s->head_dim);
  const size_t n_el = (size_t)s->layers * s->tokens * s->heads * s->head_dim;
  uint16_t *k = malloc(2 * n_el), *v = malloc(2 * n_el);
  uint32_t *slots = malloc(4 * s->tokens);
  int64_t *s64 = malloc(8 * s->tokens);
  fill_dense(k, v, s, KVT_DTYPE_BF16);
  for (uint32_t t = 0; t < s->tokens; t++) {
    slots[t] = t + 5;
    s64[t] = t + 5;
  }
  scatter(&f->e, k, v, s, slots, 0, s->layers, 0);
  engine_upload(&f->e);
  CUDA_OK(cudaMalloc((void **)&f->dslots, 8 * s->tokens));
  CUDA_OK(cudaMemcpy(f->dslots, s64, 8 * s->tokens, cudaMemcpyHostToDevice));
  assert_int_equal(kvt_gpu_layout_create(ctx, &f->e.desc, &f->L), 0);
  kvt_encode_params ep = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(kvt_codec_parse(ctx, spec, &ep.spec), 0);
  memset(ep.key.bytes, 1, 16);
  f->ep = ep;
  kvt_gpu_store_params sp = KVT_GPU_STORE_PARAMS_INIT;
  sp.encode = &f->ep;
  sp.layer_count = s->layers;
  sp.tokens = s->tokens;
  sp.slots = f->dslots;
  f->sp = sp;
  uint64_t bound;
  assert_int_equal(kvt_gpu_store_bound(f->L, &sp, &bound), 0);
  f->cap = 4 * n_el + 65536;
  assert_true(bound <= f->cap);
  f->pay = pinned(f->cap);
  assert_int_equal(kvt_gpu_store(f->L, &sp, f->pay, f->cap, &f->len, stream), 0);
  assert_int_equal(f->len, bound);
  free(k);
  free(v);
  free(slots);
  free(s64);
}

static void fixture_free(fixture *f) {
  kvt_gpu_layout_destroy(f->L);
  cudaFree(f->dslots);
  cudaFreeHost(f->pay);
  engine_free(&f->e);
}

static int load(fixture *f, const void *p, size_t len) {
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = f->sp.tokens;
  lp.slots = f->dslots;
  int rc = kvt_gpu_load(f->L, p, len, &lp, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  return rc;
}

/* The device cache as one host copy (every buffer and layer in order). */
static uint16_t *engine_download(engine *e) {
  size_t total = 0;
  for (int b = 0; b < e->nbuf; b++)
    total += e->elems[b] * e->layers;
  uint16_t *all = malloc(total * 2), *at = all;
  for (int b = 0; b < e->nbuf; b++)
    for (uint32_t l = 0; l < e->layers; l++, at += e->elems[b])
      CUDA_OK(cudaMemcpy(at, e->dev[b][l], e->elems[b] * 2, cudaMemcpyDeviceToHost));
  return all;
}

static size_t engine_bytes(const engine *e) {
  size_t total = 0;
  for (int b = 0; b < e->nbuf; b++)
    total += e->elems[b] * e->layers * 2;
  return total;
}

/* Loads lent by memory tiers: an hbm tier lends device memory, a pinned dram
 * tier page-locked host memory; the load kernel reads either in place and
 * writes the same cache as a load from the original pinned payload. */
static void test_gpu_load_from_memory_tier_loans_in_place(void **state) {
  (void)state;
  const shape s = {2, 40, 2, 64};
  fixture f;
  fixture_make(&f, "k16v8", &s);
  assert_int_equal(load(&f, f.pay, f.len), 0);
  uint16_t *want = engine_download(&f.e);
  const char *specs[] = {"hbm:0:64MiB", "dram:64MiB,pin=on"};
  const int kinds[] = {KVT_GPU_MEM_DEVICE, KVT_GPU_MEM_PINNED};
  for (int i = 0; i < 2; i++) {
    engine_upload(&f.e); /* back to the values before any load */
    kvt_tier *t = NULL;
    assert_int_equal(kvt_tier_open(ctx, specs[i], &t), 0);
    kvt_key k = {{0x42, (uint8_t)i}};
    assert_int_equal(kvt_tier_put(t, &k, f.pay, f.len), 0);
    kvt_tier_loan loan;
    assert_int_equal(kvt_tier_borrow(t, &k, &loan), 0);
    assert_int_equal(loan.len, f.len);
    int kind = -1;
    assert_int_equal(kvt_gpu_mem_kind(ctx, loan.data, &kind), 0);
    assert_int_equal(kind, kinds[i]);
    /* Deleted while lent: the bytes stay until returned. */
    assert_int_equal(kvt_tier_del(t, &k), 0);
    assert_int_equal(load(&f, loan.data, loan.len), 0);
    uint16_t *got = engine_download(&f.e);
    assert_memory_equal(got, want, engine_bytes(&f.e));
    free(got);
    kvt_tier_return(t, &loan);
    assert_int_equal(kvt_tier_borrow(t, &k, &loan), KVT_ENOTFOUND);
    /* A GET copies device memory back out unchanged. */
    assert_int_equal(kvt_tier_put(t, &k, f.pay, f.len), 0);
    uint8_t *back = malloc(f.len);
    uint64_t len = 0;
    assert_int_equal(kvt_tier_get(t, &k, back, f.len, &len), 0);
    assert_int_equal(len, f.len);
    assert_memory_equal(back, f.pay, f.len);
    free(back);
    kvt_tier_close(t);
  }
  /* Through the cache: an hbm tier over a dram one, the payload lent by
   * whichever holds it. The fixture's key and fingerprint are the store's. */
  kvt_cache_config cc = KVT_CACHE_CONFIG_INIT;
  cc.tiers = "hbm:0:64MiB;dram:64MiB";
  kvt_cache *c = NULL;
  assert_int_equal(kvt_cache_open(ctx, &cc, &c), 0);
  assert_int_equal(kvt_cache_put(c, &f.ep.key, NULL, f.pay, f.len), 0);
  kvt_cache_loan cl;
  engine_upload(&f.e);
  assert_int_equal(kvt_cache_borrow(c, &f.ep.key, &cl), 0);
  assert_int_equal(cl.tier, 0);
  assert_int_equal(load(&f, cl.data, cl.len), 0);
  uint16_t *got = engine_download(&f.e);
  assert_memory_equal(got, want, engine_bytes(&f.e));
  free(got);
  kvt_cache_return(c, &cl);
  kvt_cache_close(c);
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open(ctx, "hbm:999:1GiB", &t), KVT_ENOTSUP);
  assert_int_equal(kvt_tier_open(ctx, "hbm:1GiB", &t), -EINVAL);
  free(want);
  fixture_free(&f);
}

static void test_gpu_load_rejects_bad_payloads(void **state) {
  (void)state;
  const shape s = {2, 40, 2, 64};
  fixture f;
  fixture_make(&f, "k16v8", &s);
  assert_int_equal(load(&f, f.pay, f.len), 0);
  /* A flipped bit in a section body: the section checksum. */
  f.pay[f.len - 3] ^= 0x10;
  assert_int_equal(load(&f, f.pay, f.len), KVT_ECHECKSUM);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "checksum"));
  f.pay[f.len - 3] ^= 0x10;
  /* In the header: the header checksum. */
  f.pay[90] ^= 1;
  assert_int_equal(load(&f, f.pay, f.len), KVT_ECHECKSUM);
  f.pay[90] ^= 1;
  /* Truncated, and not a payload at all. */
  assert_int_equal(load(&f, f.pay, f.len - 1), KVT_ETRUNC);
  f.pay[0] ^= 0xFF;
  assert_int_equal(load(&f, f.pay, f.len), KVT_EFORMAT);
  f.pay[0] ^= 0xFF;
  /* Pageable host memory cannot be read by the kernel. */
  uint8_t *pageable = malloc(f.len);
  memcpy(pageable, f.pay, f.len);
  assert_int_equal(load(&f, pageable, f.len), KVT_ENOTSUP);
  free(pageable);
  /* Another chunk or model. */
  kvt_key other;
  memset(other.bytes, 2, 16);
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = f.sp.tokens;
  lp.slots = f.dslots;
  lp.expect_key = &other;
  assert_int_equal(kvt_gpu_load(f.L, f.pay, f.len, &lp, stream), KVT_EFOREIGN);
  lp.expect_key = NULL;
  /* A slot count that is not the payload's, layers out of range. */
  lp.tokens = f.sp.tokens - 1;
  assert_int_equal(kvt_gpu_load(f.L, f.pay, f.len, &lp, stream), KVT_ESHAPE);
  lp.tokens = f.sp.tokens;
  lp.layer_first = 2;
  assert_int_equal(kvt_gpu_load(f.L, f.pay, f.len, &lp, stream), -EINVAL);
  /* The device-memory path checks the header too. */
  uint8_t *dpay;
  CUDA_OK(cudaMalloc((void **)&dpay, f.len));
  f.pay[70] ^= 4;
  CUDA_OK(cudaMemcpy(dpay, f.pay, f.len, cudaMemcpyHostToDevice));
  f.pay[70] ^= 4;
  lp.layer_first = 0;
  lp.flags = KVT_GPU_LOAD_TRUST_DEVICE;
  assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), KVT_ECHECKSUM);
  cudaFree(dpay);
  fixture_free(&f);
}

/* Format 2's checksums on the GPU: a payload stored into device memory and
 * sealed by the GPU's piecewise checksum kernels is byte for byte the CPU
 * encoder's; then, per preset, single-bit flips at sampled positions of the
 * header, the section table and the section bodies (sections of 10 to 32
 * whole 4 KiB pieces; run_combo's odd shapes cover partial last pieces) are
 * each refused by a checked load of the device payload. Flips in the zero
 * padding between sections are not read by any load and must load. */
static void test_gpu_device_payload_bit_flips_are_caught(void **state) {
  (void)state;
  const shape s = {2, 256, 4, 64};
  static const char *const specs[] = {"raw", "k16v8", "fp8", "int8", "k16v4", "k8v4", "int4"};
  uint64_t lcg = 0x9E3779B97F4A7C15ull;
  int flips = 0, padding = 0;
  for (size_t c = 0; c < sizeof(specs) / sizeof(specs[0]); c++) {
    fixture f;
    fixture_make(&f, specs[c], &s);
    uint8_t *dpay, *back = malloc(f.len);
    CUDA_OK(cudaMalloc((void **)&dpay, f.len));
    size_t dlen = 0;
    assert_int_equal(kvt_gpu_store(f.L, &f.sp, dpay, f.len, &dlen, stream), 0);
    assert_int_equal(dlen, f.len);
    CUDA_OK(cudaMemcpy(back, dpay, f.len, cudaMemcpyDeviceToHost));
    if (memcmp(back, f.pay, f.len) != 0) /* f.pay: stored to host, sealed on the host */
      fail_msg("%s: the GPU-sealed device payload differs from the host-sealed one", specs[c]);
    kvt_payload_info info;
    assert_int_equal(kvt_payload_verify(ctx, back, f.len, &info), 0);
    assert_int_equal(info.version_major, KVT_FORMAT_VERSION);
    kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
    lp.tokens = f.sp.tokens;
    lp.slots = f.dslots;
    assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), 0);
    CUDA_OK(cudaStreamSynchronize(stream));
    const size_t hsize = info.header_size;
    for (int i = 0; i < 384; i++) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      const uint64_t r = lcg >> 11;
      size_t at; /* 64 in the fixed header, 64 in the table, the rest in the body */
      if (i < 64)
        at = r % 128; /* the fixed header (FORMAT.md section 2) */
      else if (i < 128)
        at = 128 + r % (hsize - 128);
      else
        at = hsize + r % (f.len - hsize);
      const uint8_t bit = (uint8_t)(1u << (r >> 40) % 8), flipped = (uint8_t)(back[at] ^ bit);
      int in_section = at < hsize;
      for (uint32_t j = 0; j < info.sections && !in_section; j++) {
        kvt_section_info si;
        assert_int_equal(kvt_payload_section(ctx, back, f.len, j, &si), 0);
        in_section = at >= si.offset && at < si.offset + si.stored_size;
      }
      CUDA_OK(cudaMemcpy(dpay + at, &flipped, 1, cudaMemcpyHostToDevice));
      const int rc = kvt_gpu_load(f.L, dpay, f.len, &lp, stream);
      CUDA_OK(cudaStreamSynchronize(stream));
      CUDA_OK(cudaMemcpy(dpay + at, &back[at], 1, cudaMemcpyHostToDevice));
      if (in_section && !(rc == KVT_ECHECKSUM || rc == KVT_ECORRUPT || rc == KVT_EFORMAT ||
                          rc == KVT_EVERSION || rc == KVT_ETRUNC || rc == KVT_ETOOBIG))
        fail_msg("%s: bit %u of byte %zu (of %zu; header %zu) flipped: the checked load "
                 "returned %s", specs[c], (unsigned)bit, at, f.len, hsize, kvt_err_name(rc));
      if (!in_section && rc != 0)
        fail_msg("%s: a flip in padding byte %zu was refused: %s", specs[c], at,
                 kvt_err_name(rc));
      flips++;
      padding += !in_section;
    }
    cudaFree(dpay);
    free(back);
    fixture_free(&f);
  }
  print_message("%d single-bit flips of device payloads, %d of them in padding\n", flips,
                padding);
}

/* A raw section of 8 MiB (2048 pieces: the combine step hashes 16 KiB of
 * digests), sealed on the GPU, equals the host-sealed bytes and loads
 * checked; a flip in its first 512 KiB is refused. Then a device table that
 * disagrees with the header copy the caller passes (a section size past the
 * payload) is a checksum mismatch, not a read outside the payload. */
static void test_gpu_device_payload_large_section_and_foreign_table(void **state) {
  (void)state;
  const shape s = {1, 4096, 8, 128};
  fixture f;
  fixture_make(&f, "raw", &s);
  uint8_t *dpay, *back = malloc(f.len);
  CUDA_OK(cudaMalloc((void **)&dpay, f.len));
  size_t dlen = 0;
  assert_int_equal(kvt_gpu_store(f.L, &f.sp, dpay, f.len, &dlen, stream), 0);
  CUDA_OK(cudaMemcpy(back, dpay, f.len, cudaMemcpyDeviceToHost));
  assert_int_equal(dlen, f.len);
  assert_memory_equal(back, f.pay, f.len);
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = f.sp.tokens;
  lp.slots = f.dslots;
  assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), 0);
  CUDA_OK(cudaStreamSynchronize(stream));
  kvt_section_info si;
  assert_int_equal(kvt_payload_section(ctx, back, f.len, 0, &si), 0);
  assert_true(si.stored_size == 8u << 20);
  const uint8_t flipped = (uint8_t)(back[si.offset + 1000] ^ 0x20);
  CUDA_OK(cudaMemcpy(dpay + si.offset + 1000, &flipped, 1, cudaMemcpyHostToDevice));
  assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), KVT_ECHECKSUM);
  CUDA_OK(cudaMemcpy(dpay + si.offset + 1000, &back[si.offset + 1000], 1,
                     cudaMemcpyHostToDevice));
  /* The caller's header copy is the good one; the device's table says
   * section 1 runs far past the payload. */
  kvt_payload_info info;
  assert_int_equal(kvt_payload_parse(ctx, back, f.len, &info), 0);
  lp.header = back;
  lp.header_len = info.header_size;
  assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), 0);
  CUDA_OK(cudaStreamSynchronize(stream));
  uint8_t huge[8];
  for (int i = 0; i < 8; i++)
    huge[i] = 0x7F;
  CUDA_OK(cudaMemcpy(dpay + 128 + 48 + 16, huge, 8, cudaMemcpyHostToDevice)); /* entry 1 size */
  assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), KVT_ECHECKSUM);
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError()); /* no fault: the context still works */
  cudaFree(dpay);
  free(back);
  fixture_free(&f);
}

static void test_gpu_load_refuses_other_shapes_and_lossless_sections(void **state) {
  (void)state;
  const shape s = {2, 40, 2, 64};
  fixture f;
  fixture_make(&f, "raw", &s);
  /* A layout of 4 heads cannot take a 2-head payload. */
  engine e4;
  engine_make(&e4, LAY_VLLM, KVT_DTYPE_BF16, 2, 40, 16, 4, 64);
  kvt_gpu_layout *L4;
  assert_int_equal(kvt_gpu_layout_create(ctx, &e4.desc, &L4), 0);
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = 40;
  lp.slots = f.dslots;
  assert_int_equal(kvt_gpu_load(L4, f.pay, f.len, &lp, stream), KVT_ESHAPE);
  kvt_gpu_layout_destroy(L4);
  engine_free(&e4);
  if (kvt_has_feature("zstd")) {
    /* The same KV with the lossless stage: refused, not misread. */
    const size_t n_el = (size_t)2 * 40 * 2 * 64;
    uint16_t *k = calloc(n_el, 2), *v = calloc(n_el, 2);
    kvt_kv_view view;
    kvt_kv_view_dense(&view, k, v, KVT_DTYPE_BF16, 2, 40, 2, 64);
    kvt_encode_params ep = KVT_ENCODE_PARAMS_INIT;
    ep.zstd_level = 3;
    uint8_t *z = pinned(4 * n_el + 4096);
    size_t zlen;
    assert_int_equal(kvt_encode(ctx, &ep, &view, z, 4 * n_el + 4096, &zlen), 0);
    assert_int_equal(load(&f, z, zlen), KVT_ENOTSUP);
    assert_non_null(strstr(kvt_ctx_last_error(ctx), "lossless"));
    /* ... and the store does not offer it. */
    kvt_encode_params zep = f.ep;
    zep.zstd_level = 3;
    kvt_gpu_store_params sp = f.sp;
    sp.encode = &zep;
    size_t len;
    assert_int_equal(kvt_gpu_store(f.L, &sp, f.pay, f.len, &len, stream), KVT_ENOTSUP);
    cudaFreeHost(z);
    free(k);
    free(v);
  }
  fixture_free(&f);
}

static void test_gpu_store_refuses_nonfinite_and_out_of_range(void **state) {
  (void)state;
  const shape s = {1, 20, 2, 64};
  fixture f;
  fixture_make(&f, "k16v8", &s);
  /* A NaN in V of token 3 (slot 8), head 1, dim 9. */
  uint16_t nan = 0x7FC0;
  size_t at = eidx(&f.e, 1, 8, 1, 9);
  CUDA_OK(cudaMemcpy((uint16_t *)f.e.dev[0][0] + at, &nan, 2, cudaMemcpyHostToDevice));
  size_t len;
  int rc = kvt_gpu_store(f.L, &f.sp, f.pay, f.len, &len, stream);
  assert_int_equal(rc, KVT_ENONFINITE);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "V layer 0 token 3 head 1 dim 9"));
  /* In K a NaN is fine for k16v8 (n16 keys copy bits) but not for int4. */
  kvt_encode_params ep = f.ep;
  kvt_gpu_store_params sp = f.sp;
  sp.encode = &ep;
  assert_int_equal(kvt_codec_parse(ctx, "k=n16,v=n16", &ep.spec), 0);
  assert_int_equal(kvt_gpu_store(f.L, &sp, f.pay, f.cap, &len, stream), 0);
  /* i4 over fp16 range: KVT_ERANGE. */
  uint16_t big = kvt_f32_to_bf16(1e30f);
  CUDA_OK(cudaMemcpy((uint16_t *)f.e.dev[0][0] + at, &big, 2, cudaMemcpyHostToDevice));
  assert_int_equal(kvt_codec_parse(ctx, "k16v4", &ep.spec), 0);
  assert_int_equal(kvt_gpu_store(f.L, &sp, f.pay, f.cap, &len, stream), KVT_ERANGE);
  /* Pageable destination and a too-small one. */
  uint8_t *pageable = malloc(f.len);
  assert_int_equal(kvt_gpu_store(f.L, &f.sp, pageable, f.len, &len, stream), KVT_ENOTSUP);
  free(pageable);
  assert_int_equal(kvt_gpu_store(f.L, &f.sp, f.pay, 100, &len, stream), KVT_ENOBUFS);
  fixture_free(&f);
}

/* A layout over f's engine with staging slots of `slot` bytes (0: none). */
static kvt_gpu_layout *layout_with_staging(fixture *f, uint64_t slot) {
  kvt_gpu_layout_desc d = f->e.desc;
  d.staging_bytes = 3 * slot;
  kvt_gpu_layout *L = NULL;
  assert_int_equal(kvt_gpu_layout_create(ctx, &d, &L), 0);
  return L;
}

/* The section holding payload byte at, or -1 (header or padding). */
static int section_at(const uint8_t *pay, size_t len, size_t at) {
  kvt_payload_info info;
  assert_int_equal(kvt_payload_parse(ctx, pay, len, &info), 0);
  for (uint32_t j = 0; j < info.sections; j++) {
    kvt_section_info si;
    assert_int_equal(kvt_payload_section(ctx, pay, len, j, &si), 0);
    if (at >= si.offset && at < si.offset + si.stored_size)
      return (int)j;
  }
  return -1;
}

/* A load with a verdict, waited for: the call's return code, and the
 * verdict's in *vrc. */
static int load_verdict(fixture *f, kvt_gpu_layout *L, const void *p, size_t len,
                        kvt_gpu_verdict *v, uint32_t flags, int *vrc) {
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = f->sp.tokens;
  lp.slots = f->dslots;
  lp.flags = flags;
  lp.verdict = v;
  const int rc = kvt_gpu_load(L, p, len, &lp, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  *vrc = rc ? rc : kvt_gpu_verdict_check(L, v);
  return rc;
}

/* A device payload of 320 MiB (16 sections of 20 MiB): its digests are too
 * many for the last CTA's combine, so the GPU combines them in a kernel of
 * several CTAs and marks verdicts done after it. The GPU's seal is the CPU
 * codec's bytes; a checked load and a load with a verdict pass, and a flip
 * in the first or the last section is that section's KVT_ECHECKSUM. */
static void test_gpu_device_payload_over_256mib_combined_apart(void **state) {
  (void)state;
  const shape s = {8, 10240, 8, 128};
  fixture f;
  fixture_make(&f, "raw", &s);
  uint8_t *dpay;
  CUDA_OK(cudaMalloc((void **)&dpay, f.len));
  size_t dlen = 0;
  assert_int_equal(kvt_gpu_store(f.L, &f.sp, dpay, f.len, &dlen, stream), 0);
  assert_int_equal(dlen, f.len);
  uint8_t *back = malloc(f.len);
  assert_non_null(back);
  CUDA_OK(cudaMemcpy(back, dpay, f.len, cudaMemcpyDeviceToHost));
  assert_memory_equal(back, f.pay, f.len);
  kvt_gpu_verdict *v = pinned(sizeof(*v));
  int vrc = -1;
  assert_int_equal(load_verdict(&f, f.L, dpay, f.len, v, 0, &vrc), 0);
  assert_int_equal(vrc, 0);
  const uint32_t flips[2] = {0, 2 * s.layers - 1};
  for (int i = 0; i < 2; i++) {
    kvt_section_info si;
    assert_int_equal(kvt_payload_section(ctx, back, f.len, flips[i], &si), 0);
    const size_t at = si.offset + (i ? si.stored_size - 3 : 5);
    const uint8_t bad = (uint8_t)(back[at] ^ 0x04);
    CUDA_OK(cudaMemcpy(dpay + at, &bad, 1, cudaMemcpyHostToDevice));
    assert_int_equal(load_verdict(&f, f.L, dpay, f.len, v, 0, &vrc), 0);
    assert_int_equal(vrc, KVT_ECHECKSUM);
    assert_int_equal(v->bad_section, flips[i]);
    kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
    lp.tokens = f.sp.tokens;
    lp.slots = f.dslots;
    assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), KVT_ECHECKSUM);
    CUDA_OK(cudaMemcpy(dpay + at, &back[at], 1, cudaMemcpyHostToDevice));
  }
  assert_int_equal(load_verdict(&f, f.L, dpay, f.len, v, 0, &vrc), 0);
  assert_int_equal(vrc, 0);
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaFreeHost(v);
  cudaFree(dpay);
  free(back);
  fixture_free(&f);
}

/* Tests of the checksum combine's paths (segment or warp per section; the
 * pieces kernel's last CTA or a combine kernel of several CTAs; batched),
 * after an independent review's coverage list. */

/* 6 layers of 128 KiB raw sections: 12 sections x 32 pieces. The device
 * seal and the unverdicted checked load combine in 2 CTAs of 8 segments. */
static void test_gpu_device_payload_sections_combined_by_several_ctas(void **state) {
  (void)state;
  const shape s = {6, 256, 4, 64};
  fixture f;
  fixture_make(&f, "raw", &s);
  kvt_payload_info info;
  assert_int_equal(kvt_payload_verify(ctx, f.pay, f.len, &info), 0); /* host anchor */
  assert_int_equal(info.sections, 12);
  uint8_t *dpay, *dB, *back = malloc(f.len);
  CUDA_OK(cudaMalloc((void **)&dpay, f.len));
  CUDA_OK(cudaMalloc((void **)&dB, f.len));
  size_t dlen = 0;
  assert_int_equal(kvt_gpu_store(f.L, &f.sp, dpay, f.len, &dlen, stream), 0);
  CUDA_OK(cudaMemcpy(back, dpay, f.len, cudaMemcpyDeviceToHost));
  assert_memory_equal(back, f.pay, f.len); /* sections 8..11 sealed by CTA 1 */
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = f.sp.tokens;
  lp.slots = f.dslots;
  assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), 0);
  CUDA_OK(cudaStreamSynchronize(stream));
  const uint32_t secs[4] = {0, 7, 8, 11}; /* both ends of both CTAs */
  for (int i = 0; i < 4; i++) {
    kvt_section_info si;
    assert_int_equal(kvt_payload_section(ctx, back, f.len, secs[i], &si), 0);
    const size_t at = si.offset + si.stored_size / 2;
    const uint8_t bad = (uint8_t)(back[at] ^ 0x10);
    CUDA_OK(cudaMemcpy(dpay + at, &bad, 1, cudaMemcpyHostToDevice));
    assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), KVT_ECHECKSUM);
    char want[32];
    snprintf(want, sizeof(want), "section %u ", secs[i]);
    assert_non_null(strstr(kvt_ctx_last_error(ctx), want)); /* the gate's atomicMin */
    CUDA_OK(cudaMemcpy(dpay + at, &back[at], 1, cudaMemcpyHostToDevice));
  }
  /* Payload B in device memory, A's header copy: refused by CTA 0's header
   * check of a 2-CTA combine (verify_on_gpu: no counter). */
  kvt_encode_params epB = f.ep;
  memset(epB.key.bytes, 9, 16);
  kvt_gpu_store_params spB = f.sp;
  spB.encode = &epB;
  assert_int_equal(kvt_gpu_store(f.L, &spB, dB, f.len, &dlen, stream), 0);
  lp.header = back;
  lp.header_len = info.header_size;
  assert_int_equal(kvt_gpu_load(f.L, dB, f.len, &lp, stream), KVT_EFOREIGN);
  assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), 0);
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaFree(dB);
  cudaFree(dpay);
  free(back);
  fixture_free(&f);
}

/* 5 layers of 4 MiB raw sections (1024 pieces each, 10 sections).
 * Pinned store/load stage <= 2 layers a piece (slot 21.3 MiB): last-CTA wide.
 * Device seal/verify: 10 > 8 sections of > 256 pieces: combine_kernel of 5
 * CTAs (a warp a section) and, with a verdict, done_kernel. */
static void test_gpu_big_sections_combined_by_warps_last_cta_and_apart(void **state) {
  (void)state;
  const shape s = {5, 2048, 8, 128};
  fixture f;
  fixture_make(&f, "raw", &s); /* staged store: last-CTA wide seal */
  kvt_payload_info info;
  assert_int_equal(kvt_payload_verify(ctx, f.pay, f.len, &info), 0);
  uint8_t *dpay, *dB, *back = malloc(f.len);
  CUDA_OK(cudaMalloc((void **)&dpay, f.len));
  CUDA_OK(cudaMalloc((void **)&dB, f.len));
  size_t dlen = 0;
  assert_int_equal(kvt_gpu_store(f.L, &f.sp, dpay, f.len, &dlen, stream), 0);
  CUDA_OK(cudaMemcpy(back, dpay, f.len, cudaMemcpyDeviceToHost));
  assert_memory_equal(back, f.pay, f.len);
  kvt_gpu_verdict *v = pinned(sizeof(*v));
  int vrc = -1;
  assert_int_equal(load_verdict(&f, f.L, dpay, f.len, v, 0, &vrc), 0); /* apart + done_kernel */
  assert_int_equal(vrc, 0);
  assert_int_equal(load_verdict(&f, f.L, f.pay, f.len, v, 0, &vrc), 0); /* last-CTA wide */
  assert_int_equal(vrc, 0);
  const uint32_t secs[3] = {0, 5, 9}; /* CTAs 0, 2, 4 of the combine */
  for (int i = 0; i < 3; i++) {
    kvt_section_info si;
    assert_int_equal(kvt_payload_section(ctx, back, f.len, secs[i], &si), 0);
    const size_t at = si.offset + si.stored_size - 1 - 4096 * (size_t)i;
    const uint8_t bad = (uint8_t)(back[at] ^ 0x01);
    /* device: done must not be seen before the mismatch (poll, then read
     * bad_section at once, as kvt_gpu_verdict_check's caller would) */
    CUDA_OK(cudaMemcpy(dpay + at, &bad, 1, cudaMemcpyHostToDevice));
    kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
    lp.tokens = f.sp.tokens;
    lp.slots = f.dslots;
    lp.verdict = v;
    assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), 0);
    while (!__atomic_load_n(&v->done, __ATOMIC_ACQUIRE))
      ;
    assert_int_equal(__atomic_load_n(&v->bad_section, __ATOMIC_RELAXED), secs[i]);
    CUDA_OK(cudaStreamSynchronize(stream));
    lp.verdict = NULL; /* verify_on_gpu: 5 CTAs, gate */
    assert_int_equal(kvt_gpu_load(f.L, dpay, f.len, &lp, stream), KVT_ECHECKSUM);
    CUDA_OK(cudaMemcpy(dpay + at, &back[at], 1, cudaMemcpyHostToDevice));
    /* pinned, staged pieces of <= 2 layers: last-CTA wide verify */
    f.pay[at] ^= 0x01;
    assert_int_equal(load_verdict(&f, f.L, f.pay, f.len, v, 0, &vrc), 0);
    f.pay[at] ^= 0x01;
    assert_int_equal(vrc, KVT_ECHECKSUM);
    assert_int_equal(v->bad_section, secs[i]);
  }
  /* Stale header copy with a verdict: CTA 0's header check, then done_kernel. */
  kvt_encode_params epB = f.ep;
  memset(epB.key.bytes, 9, 16);
  kvt_gpu_store_params spB = f.sp;
  spB.encode = &epB;
  assert_int_equal(kvt_gpu_store(f.L, &spB, dB, f.len, &dlen, stream), 0);
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = f.sp.tokens;
  lp.slots = f.dslots;
  lp.header = back;
  lp.header_len = info.header_size;
  lp.verdict = v;
  assert_int_equal(kvt_gpu_load(f.L, dB, f.len, &lp, stream), 0);
  CUDA_OK(cudaStreamSynchronize(stream));
  assert_int_equal(kvt_gpu_verdict_check(f.L, v), KVT_EFOREIGN);
  cudaFreeHost(v);
  cudaFree(dB);
  cudaFree(dpay);
  free(back);
  fixture_free(&f);
}

/* 15 one-layer payloads of 1056 tokens x 4 x 128 raw (sections of
 * 1,081,344 B = 264 pieces > SEGMENT_PIECES). Default slots (22,369,536 B):
 * left 15 x 2,162,688 -> target 16,220,160 -> 7 payloads a launch: launches
 * of 7, 7 (sec_batch<true>, 14 sections > 8: combine_kernel of 7 CTAs,
 * done_kernel over 7 verdicts) and 1 (last-CTA wide). */
#define T3_N 15
static void test_gpu_batched_big_sections_combined_apart(void **state) {
  (void)state;
  const shape s = {1, 1056, 4, 128};
  engine e;
  engine_make(&e, LAY_VLLM, KVT_DTYPE_BF16, 1, T3_N * s.tokens + 3, 16, s.heads, s.head_dim);
  const size_t n_el = (size_t)s.tokens * s.heads * s.head_dim;
  uint16_t *k = malloc(2 * n_el), *vv = malloc(2 * n_el);
  uint32_t *slots = malloc(4 * s.tokens);
  int64_t *s64 = malloc(8 * (size_t)T3_N * s.tokens), *dslots = NULL;
  for (uint32_t i = 0; i < T3_N; i++) {
    fill_dense(k, vv, &s, KVT_DTYPE_BF16);
    for (uint32_t t = 0; t < s.tokens; t++)
      s64[(size_t)i * s.tokens + t] = slots[t] = i * s.tokens + 3 + t;
    scatter(&e, k, vv, &s, slots, 0, 1, 0);
  }
  engine_upload(&e);
  CUDA_OK(cudaMalloc((void **)&dslots, 8 * (size_t)T3_N * s.tokens));
  CUDA_OK(cudaMemcpy(dslots, s64, 8 * (size_t)T3_N * s.tokens, cudaMemcpyHostToDevice));
  kvt_gpu_layout *L = NULL;
  assert_int_equal(kvt_gpu_layout_create(ctx, &e.desc, &L), 0);
  kvt_encode_params ep[T3_N];
  kvt_gpu_store_params sp[T3_N];
  kvt_gpu_store_item it[T3_N];
  kvt_gpu_load_item li[T3_N];
  const size_t cap = 4 * n_el + 65536;
  kvt_gpu_verdict *v = pinned(T3_N * sizeof(*v));
  for (uint32_t i = 0; i < T3_N; i++) {
    ep[i] = (kvt_encode_params)KVT_ENCODE_PARAMS_INIT;
    assert_int_equal(kvt_codec_parse(ctx, "raw", &ep[i].spec), 0);
    memset(ep[i].key.bytes, (int)i + 1, 16);
    sp[i] = (kvt_gpu_store_params)KVT_GPU_STORE_PARAMS_INIT;
    sp[i].encode = &ep[i];
    sp[i].layer_count = 1;
    sp[i].tokens = s.tokens;
    sp[i].slots = dslots + (size_t)i * s.tokens;
    const kvt_gpu_store_item one = {sizeof(one), &sp[i], pinned(cap), cap, 0};
    it[i] = one;
  }
  assert_int_equal(kvt_gpu_store_batch_async(L, it, T3_N, stream), 0); /* sealed apart */
  assert_int_equal(kvt_gpu_store_batch_finish(L, it, T3_N, stream), 0);
  for (uint32_t i = 0; i < T3_N; i++) {
    kvt_payload_info info;
    assert_int_equal(kvt_payload_verify(ctx, it[i].dst, it[i].len, &info), 0); /* host anchor */
    const kvt_gpu_load_item one = {sizeof(one), it[i].dst, it[i].len,
                                   dslots + (size_t)i * s.tokens, NULL, &v[i]};
    li[i] = one;
  }
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = s.tokens;
  assert_int_equal(kvt_gpu_load_batch(L, li, T3_N, &lp, stream), 0);
  CUDA_OK(cudaStreamSynchronize(stream));
  for (uint32_t i = 0; i < T3_N; i++)
    assert_int_equal(kvt_gpu_verdict_check(L, &v[i]), 0);
  /* A flip in payload 3's V (launch 1, CTA 3) and payload 13's K (launch 2,
   * CTA 6): those verdicts only. */
  const uint32_t bad_item[2] = {3, 13}, bad_sec[2] = {1, 0};
  size_t at[2];
  for (int j = 0; j < 2; j++) {
    kvt_section_info si;
    uint8_t *p = it[bad_item[j]].dst;
    assert_int_equal(kvt_payload_section(ctx, p, it[bad_item[j]].len, bad_sec[j], &si), 0);
    at[j] = si.offset + 4096 * 200 + 17;
    p[at[j]] ^= 0x40;
  }
  assert_int_equal(kvt_gpu_load_batch(L, li, T3_N, &lp, stream), 0);
  CUDA_OK(cudaStreamSynchronize(stream));
  for (uint32_t i = 0; i < T3_N; i++) {
    const int j = i == bad_item[0] ? 0 : i == bad_item[1] ? 1 : -1;
    assert_int_equal(v[i].done, 1);
    assert_int_equal(kvt_gpu_verdict_check(L, &v[i]), j < 0 ? 0 : KVT_ECHECKSUM);
    if (j >= 0)
      assert_int_equal(v[i].bad_section, bad_sec[j]);
  }
  for (int j = 0; j < 2; j++)
    ((uint8_t *)it[bad_item[j]].dst)[at[j]] ^= 0x40;
  for (uint32_t i = 0; i < T3_N; i++)
    cudaFreeHost(it[i].dst);
  cudaFreeHost(v);
  kvt_gpu_layout_destroy(L);
  cudaFree(dslots);
  engine_free(&e);
  free(k);
  free(vv);
  free(slots);
  free(s64);
}

/* Every layer of the downloaded cache `got` equals `want`'s, except layer
 * `skip`'s, which equals `bg`'s (skip -1: none; -2: every layer is bg's). */
static void expect_layers(const engine *e, const uint16_t *got, const uint16_t *want,
                          const uint16_t *bg, int skip, const char *what) {
  const size_t per = e->elems[0];
  for (uint32_t l = 0; l < e->layers; l++) {
    const int old = skip == -2 || (int)l == skip;
    if (memcmp(got + l * per, (old ? bg : want) + l * per, per * 2) != 0)
      fail_msg("%s: layer %u is not %s", what, l, old ? "untouched" : "loaded");
  }
}

/* Pinned stores through the staging slots are sealed on the GPU: the same
 * bytes as a handle without staging (kernel into host memory, sealed on the
 * host), whether the payload is one piece or cycles through slots of one
 * layer each; a NaN in the last piece is still reported. Loads verified on
 * the GPU (kvt_gpu_load_params.verdict) restore what a checked load does,
 * from pinned and from device payloads. A flipped bit in a section body is
 * the verdict's KVT_ECHECKSUM naming that section, and the load writes none
 * of its piece's layers (one layer a piece here) while the others load; a
 * flip in the header is returned by the call itself. */
static void test_gpu_staged_store_and_loads_verified_on_gpu(void **state) {
  (void)state;
  const shape s = {4, 256, 4, 64};
  static const char *const specs[] = {"raw",  "k16v8", "fp8",  "int8",
                                      "k8v4", "int4",  "k=e4m3,v=i8,scale=layer"};
  kvt_gpu_verdict *v = pinned(sizeof(*v));
  uint64_t lcg = 12345;
  int flips = 0;
  for (size_t c = 0; c < sizeof(specs) / sizeof(specs[0]); c++) {
    fixture f;
    fixture_make(&f, specs[c], &s); /* f.pay: stored through f.L's staging */
    kvt_payload_info info;
    assert_int_equal(kvt_payload_verify(ctx, f.pay, f.len, &info), 0);
    uint64_t span = 0; /* the largest layer a store writes */
    for (uint32_t l = 0; l < info.layers; l++) {
      kvt_section_info a, b;
      assert_int_equal(kvt_payload_section(ctx, f.pay, f.len, 2 * l, &a), 0);
      if (l + 1 < info.layers)
        assert_int_equal(kvt_payload_section(ctx, f.pay, f.len, 2 * l + 2, &b), 0);
      const uint64_t end = l + 1 < info.layers ? b.offset : f.len;
      span = end - a.offset > span ? end - a.offset : span;
    }
    kvt_gpu_layout *L0 = layout_with_staging(&f, 0);
    kvt_gpu_layout *L1 = layout_with_staging(&f, (span + 255) / 256 * 256);
    uint8_t *p0 = pinned(f.cap), *p1 = pinned(f.cap);
    size_t n0 = 0, n1 = 0;
    memset(p1, 0xEE, f.cap);
    for (int m = 0; m < 2; m++) {
      const int rc = kvt_gpu_store(m ? L1 : L0, &f.sp, m ? p1 : p0, f.cap, m ? &n1 : &n0, stream);
      if (rc)
        fail_msg("%s: store %s staging: %s %s", specs[c], m ? "through one-layer" : "without",
                 kvt_err_name(rc), kvt_ctx_last_error(ctx));
    }
    assert_int_equal(n0, f.len);
    assert_int_equal(n1, f.len);
    if (memcmp(p0, f.pay, f.len) != 0 || memcmp(p1, f.pay, f.len) != 0)
      fail_msg("%s: the GPU-sealed staged store differs from the host-sealed one", specs[c]);
    cudaFreeHost(p0);
    cudaFreeHost(p1);

    /* Reference: the cache before (bg) and after (want) a checked load. */
    engine_upload(&f.e);
    uint16_t *bg = engine_download(&f.e);
    assert_int_equal(load(&f, f.pay, f.len), 0);
    uint16_t *want = engine_download(&f.e);
    uint8_t *dpay;
    CUDA_OK(cudaMalloc((void **)&dpay, f.len));
    CUDA_OK(cudaMemcpy(dpay, f.pay, f.len, cudaMemcpyHostToDevice));
    for (int m = 0; m < 4; m++) {
      engine_upload(&f.e);
      int vrc = -1;
      const int rc = load_verdict(&f, m % 2 ? L1 : f.L, m < 2 ? (void *)f.pay : (void *)dpay,
                                  f.len, v, 0, &vrc);
      if (rc || vrc)
        fail_msg("%s: verified load %d: %s / %s %s", specs[c], m, kvt_err_name(rc),
                 kvt_err_name(vrc), kvt_ctx_last_error(ctx));
      uint16_t *got = engine_download(&f.e);
      expect_layers(&f.e, got, want, bg, -1, specs[c]);
      free(got);
    }
    /* Single-bit flips anywhere in the payload (32 in the fixed header, 32
     * in the table, the rest in the body), loaded from pinned memory through
     * one-layer slots and from device memory, alternately: a flip in the
     * header or table is refused by the call (the header checksum, on the
     * host), one in a section by the verdict, with that piece's layer (one
     * layer a piece; a device payload is one piece) left as it was; one in
     * the padding between sections, read by no load, loads. */
    for (int i = 0; i < 256; i++) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      const uint64_t r = lcg >> 11;
      const size_t at = i < 32   ? r % 128
                        : i < 64 ? 128 + r % (info.header_size - 128)
                                 : info.header_size + r % (f.len - info.header_size);
      const int sec = at < info.header_size ? -2 : section_at(f.pay, f.len, at);
      const uint8_t bit = (uint8_t)(1u << ((lcg >> 40) % 8));
      const int dev = i % 2;
      if (dev) {
        const uint8_t flipped = (uint8_t)(f.pay[at] ^ bit);
        CUDA_OK(cudaMemcpy(dpay + at, &flipped, 1, cudaMemcpyHostToDevice));
      } else {
        f.pay[at] ^= bit;
      }
      engine_upload(&f.e);
      int vrc = 0;
      const int rc = load_verdict(&f, dev ? f.L : L1, dev ? (void *)dpay : (void *)f.pay, f.len,
                                  v, 0, &vrc);
      if (dev)
        CUDA_OK(cudaMemcpy(dpay + at, &f.pay[at], 1, cudaMemcpyHostToDevice));
      else
        f.pay[at] ^= bit;
      const char *where = dev ? "device" : "pinned";
      if (sec == -2) { /* header or table */
        if (rc == 0)
          fail_msg("%s: flip at %zu of the header (%s): loaded", specs[c], at, where);
      } else if (sec == -1) { /* padding */
        if (rc || vrc)
          fail_msg("%s: flip at padding byte %zu (%s): %s / %s", specs[c], at, where,
                   kvt_err_name(rc), kvt_err_name(vrc));
      } else {
        if (rc != 0 || vrc != KVT_ECHECKSUM || v->bad_section != (uint32_t)sec)
          fail_msg("%s: flip at %zu (section %d, %s): load %s, verdict %s, bad section %u",
                   specs[c], at, sec, where, kvt_err_name(rc), kvt_err_name(vrc),
                   v->bad_section);
        assert_non_null(strstr(kvt_ctx_last_error(ctx), "checksum mismatch"));
      }
      if (sec >= 0 || rc != 0) { /* refused: what was written */
        uint16_t *got = engine_download(&f.e);
        expect_layers(&f.e, got, want, bg, rc ? -2 : dev ? -2 : sec / 2, specs[c]);
        free(got);
      }
      flips++;
    }
    /* The header: refused by the call. */
    int vrc = 0;
    f.pay[90] ^= 1;
    assert_int_equal(load_verdict(&f, L1, f.pay, f.len, v, 0, &vrc), KVT_ECHECKSUM);
    f.pay[90] ^= 1;
    if (c == 1) {
      /* A stale header copy: the caller keeps payload A's header but device
       * memory now holds payload B (another key): refused, nothing loaded,
       * by the verdict and by the checked load without one. */
      uint8_t *dB;
      CUDA_OK(cudaMalloc((void **)&dB, f.len));
      kvt_encode_params epB = f.ep;
      memset(epB.key.bytes, 7, 16);
      kvt_gpu_store_params spB = f.sp;
      spB.encode = &epB;
      size_t nB = 0;
      assert_int_equal(kvt_gpu_store(f.L, &spB, dB, f.len, &nB, stream), 0);
      assert_int_equal(nB, f.len);
      engine_upload(&f.e);
      for (int m = 0; m < 3; m++) {
        kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
        lp.tokens = f.sp.tokens;
        lp.slots = f.dslots;
        lp.header = f.pay;
        lp.header_len = info.header_size;
        lp.verdict = m == 1 ? NULL : v;
        int rc = kvt_gpu_load(f.L, m == 2 ? dpay : dB, f.len, &lp, stream);
        CUDA_OK(cudaStreamSynchronize(stream));
        if (rc == 0 && m != 1)
          rc = kvt_gpu_verdict_check(f.L, v);
        if (m == 2) { /* A's own bytes: loads */
          assert_int_equal(rc, 0);
          continue;
        }
        if (rc != KVT_EFOREIGN)
          fail_msg("stale header copy (%s): %s %s", m ? "checked" : "verdict", kvt_err_name(rc),
                   kvt_ctx_last_error(ctx));
        uint16_t *got = engine_download(&f.e);
        expect_layers(&f.e, got, want, bg, -2, "stale header copy");
        free(got);
      }
      cudaFree(dB);
      /* Two streams on one handle, with a store between: verified loads of
       * the pinned and the device payload alternate with stores into
       * another buffer, 8 rounds; every load restores, every store is the
       * same bytes, every verdict passes. The loads write the slots the
       * store reads, so they start out holding what the loads write (a
       * loaded cache) and the stores are compared with one made alone. */
      cudaStream_t s2;
      CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
      kvt_gpu_verdict *v2 = pinned(2 * sizeof(*v2));
      uint8_t *p2 = pinned(f.cap), *pref = pinned(f.cap);
      engine_upload(&f.e);
      assert_int_equal(load(&f, f.pay, f.len), 0);
      size_t nref = 0;
      assert_int_equal(kvt_gpu_store(L1, &f.sp, pref, f.cap, &nref, stream), 0);
      for (int round = 0; round < 8; round++) {
        kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
        lp.tokens = f.sp.tokens;
        lp.slots = f.dslots;
        lp.verdict = &v2[0];
        assert_int_equal(kvt_gpu_load(L1, f.pay, f.len, &lp, stream), 0);
        size_t n2 = 0;
        assert_int_equal(kvt_gpu_store_async(L1, &f.sp, p2, f.cap, &n2, s2), 0);
        lp.verdict = &v2[1];
        assert_int_equal(kvt_gpu_load(L1, dpay, f.len, &lp, s2), 0);
        assert_int_equal(kvt_gpu_store_finish(L1, p2, n2, s2), 0);
        CUDA_OK(cudaStreamSynchronize(stream));
        CUDA_OK(cudaStreamSynchronize(s2));
        assert_int_equal(kvt_gpu_verdict_check(L1, &v2[0]), 0);
        assert_int_equal(kvt_gpu_verdict_check(L1, &v2[1]), 0);
        assert_int_equal(n2, nref);
        assert_memory_equal(p2, pref, nref);
        uint16_t *got = engine_download(&f.e);
        expect_layers(&f.e, got, want, bg, -1, "two streams");
        free(got);
      }
      cudaFreeHost(p2);
      cudaFreeHost(pref);
      cudaFreeHost(v2);
      cudaStreamDestroy(s2);
      /* Trusted: nothing for the GPU to check, the verdict is done at once. */
      kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
      lp.tokens = f.sp.tokens;
      lp.slots = f.dslots;
      lp.flags = KVT_GPU_LOAD_TRUST_HOST;
      lp.verdict = v;
      assert_int_equal(kvt_gpu_load(f.L, f.pay, f.len, &lp, stream), 0);
      assert_int_equal(v->done, 1);
      assert_int_equal(kvt_gpu_verdict_check(f.L, v), 0);
      CUDA_OK(cudaStreamSynchronize(stream));
      /* Not done yet; a verdict the GPU cannot write. */
      v->done = 0;
      assert_int_equal(kvt_gpu_verdict_check(f.L, v), -EAGAIN);
      kvt_gpu_verdict pageable;
      lp.flags = 0;
      lp.verdict = &pageable;
      assert_int_equal(kvt_gpu_load(f.L, f.pay, f.len, &lp, stream), -EINVAL);
      assert_int_equal(kvt_gpu_verdict_check(f.L, NULL), -EINVAL);
      /* A NaN in V of the last layer, stored a layer a slot: the last
       * piece's launch keeps the status word. */
      uint16_t nan = 0x7FC0;
      const size_t el = eidx(&f.e, 1, 9, 2, 5);
      CUDA_OK(cudaMemcpy((uint16_t *)f.e.dev[0][3] + el, &nan, 2, cudaMemcpyHostToDevice));
      size_t len = 0;
      assert_int_equal(kvt_gpu_store(L1, &f.sp, f.pay, f.cap, &len, stream), KVT_ENONFINITE);
      assert_non_null(strstr(kvt_ctx_last_error(ctx), "V layer 3 token 4 head 2 dim 5"));
    }
    cudaFree(dpay);
    free(bg);
    free(want);
    kvt_gpu_layout_destroy(L0);
    kvt_gpu_layout_destroy(L1);
    fixture_free(&f);
  }
  cudaFreeHost(v);
  print_message("%d single-bit flips loaded with verdicts, every one refused or harmless\n", flips);
}

/* ---- batched loads (kvt_gpu_load_batch) ---- */

#define BATCH_N 70 /* more than one launch's KVT_GPU_BATCH_MAX (64) */

/* Every device buffer of e set to bytes of `byte`: the cache before a load. */
static void engine_fill(engine *e, int byte) {
  for (int b = 0; b < e->nbuf; b++)
    for (uint32_t l = 0; l < e->layers; l++)
      CUDA_OK(cudaMemset(e->dev[b][l], byte, e->elems[b] * 2));
  CUDA_OK(cudaDeviceSynchronize());
}

/* Whether layer l of item k's tokens (slots k*tokens + 3 + t) in the
 * downloaded cache `got` equals `want`'s (a vLLM-layout engine). */
static int item_layer_equal(const engine *e, const uint16_t *got, const uint16_t *want,
                            const shape *s, uint32_t k, uint32_t l) {
  const size_t base = (size_t)l * e->elems[0];
  for (int kind = 0; kind < 2; kind++)
    for (uint32_t t = 0; t < s->tokens; t++)
      for (uint32_t h = 0; h < s->heads; h++) {
        const size_t i = base + eidx(e, kind, k * s->tokens + 3 + t, h, 0);
        if (memcmp(got + i, want + i, 2 * (size_t)s->head_dim) != 0)
          return 0;
      }
  return 1;
}

static int batch_load(kvt_gpu_layout *L, uint8_t *const *pay, const size_t *len,
                      const int64_t *dslots, const shape *s, kvt_gpu_verdict *v, uint32_t flags,
                      void *const *events, uint32_t layer_first, uint32_t layer_count) {
  kvt_gpu_load_item items[BATCH_N];
  for (uint32_t k = 0; k < BATCH_N; k++) {
    const kvt_gpu_load_item it = {sizeof(it), pay[k], len[k], dslots + (size_t)k * s->tokens,
                                  NULL,
                                  v ? &v[k] : NULL};
    items[k] = it;
  }
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = s->tokens;
  lp.flags = flags;
  lp.layer_events = events;
  lp.layer_first = layer_first;
  lp.layer_count = layer_count;
  const int rc = kvt_gpu_load_batch(L, items, BATCH_N, &lp, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  return rc;
}

/* kvt_gpu_store_batch_async writes the bytes single stores write, and
 * names the chunk holding a NaN (also in a second launch's chunks), sealing
 * the others. kvt_gpu_load_batch writes what a
 * kvt_gpu_load of each payload writes - verified on the GPU through the
 * default staging and through slots that hold one layer of 3 payloads
 * (payloads split over pieces), checked on the host and read in place (zero
 * copy, 64 payloads a launch), trusted and verified with layer events (each
 * recorded by the call), layers 1+2 of 4. A flipped section byte of one
 * payload is that payload's verdict (KVT_ECHECKSUM, the section named), its
 * failing piece's layers are left as they were and every other payload
 * loads; checked on the host, the call fails naming the item and loads
 * nothing. Refused: mixed or shared verdicts, shared per-payload fields,
 * a misaligning item size, another geometry, device memory, a foreign key;
 * batched stores of another geometry, into device memory, without staging,
 * with a misaligning item size or overlapping destinations, a finish of
 * other items (also one sharing only the first destination and count). */
static void test_gpu_batched_loads_equal_single_loads_and_fail_per_payload(void **state) {
  (void)state;
  const shape s = {4, 48, 2, 64};
  static const char *const specs[] = {"raw", "k16v8", "int4", "fp8", "k=e4m3,v=i8,scale=layer"};
  engine e;
  engine_make(&e, LAY_VLLM, KVT_DTYPE_BF16, s.layers, BATCH_N * s.tokens + 3, 16, s.heads,
              s.head_dim);
  const size_t n_el = (size_t)s.layers * s.tokens * s.heads * s.head_dim;
  uint16_t *k = malloc(2 * n_el), *vv = malloc(2 * n_el);
  uint32_t *slots = malloc(4 * s.tokens);
  int64_t *s64 = malloc(8 * (size_t)BATCH_N * s.tokens), *dslots = NULL;
  for (uint32_t i = 0; i < BATCH_N; i++) {
    fill_dense(k, vv, &s, KVT_DTYPE_BF16);
    for (uint32_t t = 0; t < s.tokens; t++) {
      slots[t] = i * s.tokens + 3 + t;
      s64[(size_t)i * s.tokens + t] = slots[t];
    }
    scatter(&e, k, vv, &s, slots, 0, s.layers, 0);
  }
  CUDA_OK(cudaMalloc((void **)&dslots, 8 * (size_t)BATCH_N * s.tokens));
  CUDA_OK(cudaMemcpy(dslots, s64, 8 * (size_t)BATCH_N * s.tokens, cudaMemcpyHostToDevice));
  kvt_gpu_layout *L = NULL;
  assert_int_equal(kvt_gpu_layout_create(ctx, &e.desc, &L), 0);
  kvt_gpu_verdict *v = pinned(BATCH_N * sizeof(*v));
  /* Timed events: each must be recorded after a reference event of the
   * call (an event never recorded, or recorded before, fails). */
  void *events[MAXL];
  cudaEvent_t ref;
  CUDA_OK(cudaEventCreate(&ref));
  for (uint32_t l = 0; l < s.layers; l++)
    CUDA_OK(cudaEventCreate((cudaEvent_t *)&events[l]));
  const size_t cap = 4 * n_el + 65536;
  uint8_t *pay[BATCH_N];
  size_t len[BATCH_N];
  for (uint32_t i = 0; i < BATCH_N; i++)
    pay[i] = pinned(cap);
  for (size_t c = 0; c < sizeof(specs) / sizeof(specs[0]); c++) {
    engine_upload(&e);
    kvt_encode_params ep = KVT_ENCODE_PARAMS_INIT;
    assert_int_equal(kvt_codec_parse(ctx, specs[c], &ep.spec), 0);
    kvt_gpu_store_params sp = KVT_GPU_STORE_PARAMS_INIT;
    sp.encode = &ep;
    sp.layer_count = s.layers;
    sp.tokens = s.tokens;
    for (uint32_t i = 0; i < BATCH_N; i++) {
      memset(ep.key.bytes, (int)i, 16);
      sp.slots = dslots + (size_t)i * s.tokens;
      assert_int_equal(kvt_gpu_store(L, &sp, pay[i], cap, &len[i], stream), 0);
    }
    /* Slots of one layer of 3 payloads. */
    kvt_section_info s0, s2;
    assert_int_equal(kvt_payload_section(ctx, pay[0], len[0], 0, &s0), 0);
    assert_int_equal(kvt_payload_section(ctx, pay[0], len[0], 2, &s2), 0);
    kvt_gpu_layout_desc d = e.desc;
    d.staging_bytes = 3 * 3 * ((s2.offset - s0.offset + 255) / 256 * 256);
    kvt_gpu_layout *Ls = NULL;
    assert_int_equal(kvt_gpu_layout_create(ctx, &d, &Ls), 0);

    /* Batched stores write the same bytes as single stores, through the
     * default slots and through slots of one layer of 3 chunks. */
    kvt_gpu_store_params bp[BATCH_N];
    kvt_encode_params bep[BATCH_N];
    kvt_gpu_store_item bitems[BATCH_N];
    uint8_t *bpay = pinned((size_t)BATCH_N * cap);
    for (uint32_t i = 0; i < BATCH_N; i++) {
      bep[i] = ep;
      memset(bep[i].key.bytes, (int)i, 16);
      bp[i] = sp;
      bp[i].encode = &bep[i];
      bp[i].slots = dslots + (size_t)i * s.tokens;
      const kvt_gpu_store_item it = {sizeof(it), &bp[i], bpay + (size_t)i * cap, cap, 0};
      bitems[i] = it;
    }
    for (int m = 0; m < 2; m++) {
      kvt_gpu_layout *Lb = m ? Ls : L;
      memset(bpay, 0xEE, (size_t)BATCH_N * cap);
      int rc = kvt_gpu_store_batch_async(Lb, bitems, BATCH_N, stream);
      if (rc == 0)
        rc = kvt_gpu_store_batch_finish(Lb, bitems, BATCH_N, stream);
      if (rc)
        fail_msg("%s: batched store %d: %s %s", specs[c], m, kvt_err_name(rc),
                 kvt_ctx_last_error(ctx));
      for (uint32_t i = 0; i < BATCH_N; i++)
        if (bitems[i].len != len[i] || memcmp(bitems[i].dst, pay[i], len[i]) != 0)
          fail_msg("%s: batched store %d: item %u differs from its single store", specs[c], m, i);
    }
    /* A NaN in one chunk's values (quantized unless raw): finish names the
     * chunk, sets its len to 0 and seals the others; the cache is then
     * restored. Through slots of one layer of 3 chunks, and through the
     * default slots in the second launch's chunks (64 and up). */
    for (int m = 0; m < 2; m++) {
      kvt_gpu_layout *Lb = m ? L : Ls;
      const uint32_t nan_item =
          c == 0 ? 0 : m ? 64 + rnd() % (BATCH_N - 64) : 1 + rnd() % (BATCH_N - 1);
      const uint16_t nan16 = 0x7FC1;
      CUDA_OK(cudaMemcpy((uint16_t *)e.dev[0][2] +
                             eidx(&e, 1, nan_item * s.tokens + 3 + 7, 1, 5),
                         &nan16, 2, cudaMemcpyHostToDevice));
      int src = kvt_gpu_store_batch_async(Lb, bitems, BATCH_N, stream);
      if (src == 0)
        src = kvt_gpu_store_batch_finish(Lb, bitems, BATCH_N, stream);
      char nan_what[48];
      snprintf(nan_what, sizeof(nan_what), "item %u: V layer 2 token 7 head 1 dim 5", nan_item);
      if (c == 0 ? src != 0
                 : src != KVT_ENONFINITE || !strstr(kvt_ctx_last_error(ctx), nan_what))
        fail_msg("%s: NaN in item %u (%d): %s %s", specs[c], nan_item, m, kvt_err_name(src),
                 kvt_ctx_last_error(ctx));
      /* The other chunks are sealed and are their single stores' bytes. */
      for (uint32_t i = 0; i < BATCH_N && c != 0; i++) {
        if (i == nan_item) {
          assert_int_equal(bitems[i].len, 0);
          continue;
        }
        if (bitems[i].len != len[i] || memcmp(bitems[i].dst, pay[i], len[i]) != 0 ||
            kvt_payload_verify(ctx, bitems[i].dst, len[i], NULL) != 0)
          fail_msg("%s: NaN in item %u (%d): item %u was not sealed as its single store",
                   specs[c], nan_item, m, i);
      }
      engine_upload(&e);
    }
    cudaFreeHost(bpay);

    engine_fill(&e, 0xFF);
    uint16_t *bg = engine_download(&e);
    for (uint32_t i = 0; i < BATCH_N; i++) {
      kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
      lp.tokens = s.tokens;
      lp.slots = dslots + (size_t)i * s.tokens;
      assert_int_equal(kvt_gpu_load(L, pay[i], len[i], &lp, stream), 0);
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    uint16_t *want = engine_download(&e);
    assert_true(memcmp(want, bg, engine_bytes(&e)) != 0);

    for (int m = 0; m < 5; m++) {
      static const char *const modes[] = {"verified on the GPU", "verified, 3 a slot",
                                          "host-checked zero copy", "trusted, layer events",
                                          "verified, layer events"};
      engine_fill(&e, 0xFF);
      memset(v, 0xAB, BATCH_N * sizeof(*v));
      const uint32_t flags[] = {0, 0, KVT_GPU_LOAD_ZERO_COPY,
                                KVT_GPU_LOAD_TRUST_HOST | KVT_GPU_LOAD_STAGED, 0};
      CUDA_OK(cudaEventRecord(ref, stream));
      const int rc = batch_load(m % 2 ? Ls : L, pay, len, dslots, &s, m < 2 || m == 4 ? v : NULL,
                                flags[m], m >= 3 ? events : NULL, 0, 0);
      if (rc)
        fail_msg("%s, %s: %s %s", specs[c], modes[m], kvt_err_name(rc), kvt_ctx_last_error(ctx));
      for (uint32_t i = 0; i < BATCH_N && (m < 2 || m == 4); i++) {
        const int vrc = kvt_gpu_verdict_check(m % 2 ? Ls : L, &v[i]);
        if (vrc)
          fail_msg("%s, %s: item %u verdict %s", specs[c], modes[m], i, kvt_err_name(vrc));
      }
      for (uint32_t l = 0; l < s.layers && m >= 3; l++) {
        float ms = -1;
        if (cudaEventElapsedTime(&ms, ref, (cudaEvent_t)events[l]) != cudaSuccess || ms < 0)
          fail_msg("%s, %s: layer %u's event was not recorded by the call", specs[c], modes[m],
                   l);
      }
      uint16_t *got = engine_download(&e);
      if (memcmp(got, want, engine_bytes(&e)) != 0)
        fail_msg("%s, %s: the cache differs from single loads'", specs[c], modes[m]);
      free(got);
    }

    /* Layers 1 and 2 only: what single loads of them write. */
    engine_fill(&e, 0xFF);
    for (uint32_t i = 0; i < BATCH_N; i++) {
      kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
      lp.tokens = s.tokens;
      lp.slots = dslots + (size_t)i * s.tokens;
      lp.layer_first = 1;
      lp.layer_count = 2;
      assert_int_equal(kvt_gpu_load(L, pay[i], len[i], &lp, stream), 0);
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    uint16_t *part = engine_download(&e);
    for (int m = 0; m < 2; m++) {
      engine_fill(&e, 0xFF);
      const int rc = batch_load(m ? Ls : L, pay, len, dslots, &s, v, 0, NULL, 1, 2);
      for (uint32_t i = 0; i < BATCH_N && rc == 0; i++)
        assert_int_equal(kvt_gpu_verdict_check(L, &v[i]), 0);
      uint16_t *got = engine_download(&e);
      if (rc || memcmp(got, part, engine_bytes(&e)) != 0)
        fail_msg("%s: layers 1+2 batched (%d): %s, or the cache differs from single loads'",
                 specs[c], m, kvt_err_name(rc));
      free(got);
    }
    free(part);

    /* Flipped section bytes: a miss for that payload only - through slots
     * of one layer of 3 payloads (only the flipped layer of that payload is
     * left as it was) and through the default slots (one piece holds every
     * layer of up to 64 payloads: none of that payload's layers is
     * loaded). */
    for (int trial = 0; trial < 12; trial++) {
      kvt_gpu_layout *Lf = trial % 2 ? L : Ls;
      const uint32_t j = rnd() % BATCH_N;
      kvt_payload_info info;
      assert_int_equal(kvt_payload_parse(ctx, pay[j], len[j], &info), 0);
      const uint32_t sec = rnd() % info.sections;
      kvt_section_info si;
      assert_int_equal(kvt_payload_section(ctx, pay[j], len[j], sec, &si), 0);
      const size_t at = si.offset + rnd() % si.stored_size;
      const uint8_t bit = (uint8_t)(1u << (rnd() % 8));
      pay[j][at] ^= bit;
      engine_fill(&e, 0xFF);
      int rc = batch_load(Lf, pay, len, dslots, &s, v, 0, NULL, 0, 0);
      if (rc)
        fail_msg("%s: flip in item %u: the call failed: %s", specs[c], j, kvt_err_name(rc));
      for (uint32_t i = 0; i < BATCH_N; i++) {
        const int vrc = kvt_gpu_verdict_check(Lf, &v[i]);
        if (i == j && (vrc != KVT_ECHECKSUM || v[i].bad_section != sec))
          fail_msg("%s: flip in item %u section %u: verdict %s, bad section %u", specs[c], j,
                   sec, kvt_err_name(vrc), v[i].bad_section);
        if (i != j && vrc)
          fail_msg("%s: flip in item %u: item %u's verdict %s", specs[c], j, i,
                   kvt_err_name(vrc));
      }
      uint16_t *got = engine_download(&e);
      for (uint32_t i = 0; i < BATCH_N; i++)
        for (uint32_t l = 0; l < s.layers; l++) {
          const int skipped = i == j && (Lf == L || l == sec / 2);
          if (!item_layer_equal(&e, got, skipped ? bg : want, &s, i, l))
            fail_msg("%s: flip in item %u section %u: item %u layer %u is not %s", specs[c], j,
                     sec, i, l, skipped ? "untouched" : "loaded");
        }
      free(got);
      /* Checked on the host: the call fails, names the item, loads nothing. */
      engine_fill(&e, 0xFF);
      rc = batch_load(L, pay, len, dslots, &s, NULL, 0, NULL, 0, 0);
      char want_item[32];
      snprintf(want_item, sizeof(want_item), "item %u:", j);
      if (rc != KVT_ECHECKSUM || !strstr(kvt_ctx_last_error(ctx), want_item))
        fail_msg("%s: host-checked flip in item %u: %s %s", specs[c], j, kvt_err_name(rc),
                 kvt_ctx_last_error(ctx));
      got = engine_download(&e);
      assert_memory_equal(got, bg, engine_bytes(&e));
      free(got);
      pay[j][at] ^= bit;
    }
    free(bg);
    free(want);
    kvt_gpu_layout_destroy(Ls);
  }

  /* Refusals, nothing launched. */
  kvt_gpu_load_item items[3];
  for (uint32_t i = 0; i < 3; i++) {
    const kvt_gpu_load_item it = {sizeof(it), pay[i], len[i], dslots + (size_t)i * s.tokens,
                                  NULL, &v[i]};
    items[i] = it;
  }
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = s.tokens;
  items[1].verdict = NULL;
  assert_int_equal(kvt_gpu_load_batch(L, items, 3, &lp, stream), -EINVAL);
  /* Two items sharing a verdict: the first one's last piece would mark it
   * done while the other's checks are still queued. */
  items[1].verdict = &v[0];
  assert_int_equal(kvt_gpu_load_batch(L, items, 3, &lp, stream), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "items 0 and 1 share verdict"));
  items[1].verdict = &v[1];
  /* An item size that would misalign the items after the first. */
  items[0].struct_size = sizeof(items[0]) + 1;
  assert_int_equal(kvt_gpu_load_batch(L, items, 1, &lp, stream), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "multiple"));
  items[0].struct_size = sizeof(items[0]);
  lp.slots = dslots;
  assert_int_equal(kvt_gpu_load_batch(L, items, 3, &lp, stream), -EINVAL);
  lp.slots = NULL;
  kvt_key other;
  memset(other.bytes, 0x77, 16);
  items[2].expect_key = &other;
  assert_int_equal(kvt_gpu_load_batch(L, items, 3, &lp, stream), KVT_EFOREIGN);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "item 2:"));
  items[2].expect_key = NULL;
  /* Another geometry: one layer fewer (stored from the cache's values:
   * the flip trials left it filled with NaNs). */
  engine_upload(&e);
  kvt_encode_params ep = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(kvt_codec_parse(ctx, "fp8", &ep.spec), 0);
  kvt_gpu_store_params sp = KVT_GPU_STORE_PARAMS_INIT;
  sp.encode = &ep;
  sp.layer_count = s.layers - 1;
  sp.tokens = s.tokens;
  sp.slots = dslots;
  uint8_t *short_pay = pinned(cap);
  size_t short_len = 0;
  assert_int_equal(kvt_gpu_store(L, &sp, short_pay, cap, &short_len, stream), 0);
  items[1].payload = short_pay;
  items[1].len = short_len;
  assert_int_equal(kvt_gpu_load_batch(L, items, 3, &lp, stream), KVT_ESHAPE);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "item 1:"));
  /* Batched stores: another geometry, device memory, no staging, an old
   * item size, a finish of other items. */
  kvt_gpu_store_params sp2 = sp;
  sp2.layer_count = s.layers;
  uint8_t *sdst[3] = {pinned(cap), pinned(cap), pinned(cap)};
  kvt_gpu_store_item sitems[2] = {{sizeof(sitems[0]), &sp2, sdst[0], cap, 0},
                                  {sizeof(sitems[0]), &sp, sdst[1], cap, 0}};
  assert_int_equal(kvt_gpu_store_batch_async(L, sitems, 2, stream), KVT_ESHAPE);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "item 1:"));
  uint8_t *ddst = NULL;
  CUDA_OK(cudaMalloc((void **)&ddst, cap));
  sitems[1].params = &sp2;
  sitems[1].dst = ddst;
  assert_int_equal(kvt_gpu_store_batch_async(L, sitems, 2, stream), KVT_ENOTSUP);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "item 1:"));
  cudaFree(ddst);
  sitems[1].dst = sdst[1];
  kvt_gpu_layout *L0 = NULL;
  kvt_gpu_layout_desc d0 = e.desc;
  d0.staging_bytes = 0;
  assert_int_equal(kvt_gpu_layout_create(ctx, &d0, &L0), 0);
  assert_int_equal(kvt_gpu_store_batch_async(L0, sitems, 2, stream), KVT_ENOTSUP);
  kvt_gpu_layout_destroy(L0);
  /* A batch in flight survives a refused batch call and a finish of other
   * items: its own finish seals it. */
  assert_int_equal(kvt_gpu_store_batch_async(L, sitems, 2, stream), 0);
  kvt_gpu_store_item bad[2] = {sitems[0], sitems[1]};
  bad[1].params = &sp; /* another geometry: refused, nothing launched */
  assert_int_equal(kvt_gpu_store_batch_async(L, bad, 2, stream), KVT_ESHAPE);
  bad[0].struct_size = 8;
  assert_int_equal(kvt_gpu_store_batch_async(L, bad, 2, stream), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "struct_size"));
  bad[0].struct_size = sizeof(bad[0]) + 1; /* the items after it misaligned */
  assert_int_equal(kvt_gpu_store_batch_async(L, bad, 1, stream), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "multiple"));
  bad[0] = sitems[0]; /* payloads that would overlap */
  bad[1] = sitems[1];
  bad[1].dst = sdst[0] + 64;
  assert_int_equal(kvt_gpu_store_batch_async(L, bad, 2, stream), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "items 0 and 1 share destination"));
  bad[1].dst = sdst[2]; /* item 0's destination and count, another item 1 */
  assert_int_equal(kvt_gpu_store_batch_finish(L, bad, 2, stream), -EINVAL);
  assert_int_equal(kvt_gpu_store_batch_finish(L, sitems + 1, 1, stream), -EINVAL);
  assert_int_equal(kvt_gpu_store_batch_finish(L, sitems, 2, stream), 0);
  assert_int_equal(kvt_payload_verify(ctx, sdst[0], sitems[0].len, NULL), 0);
  assert_int_equal(kvt_payload_verify(ctx, sdst[1], sitems[1].len, NULL), 0);
  assert_int_equal(kvt_gpu_store_batch_finish(L, sitems, 2, stream), -EINVAL); /* finished */
  kvt_gpu_load_item none = KVT_GPU_LOAD_ITEM_INIT;
  none.struct_size = 8;
  assert_int_equal(kvt_gpu_load_batch(L, &none, 1, &lp, stream), -EINVAL);
  assert_int_equal(kvt_gpu_load_batch(L, items, 0, &lp, stream), -EINVAL);
  for (int i = 0; i < 3; i++)
    cudaFreeHost(sdst[i]);

  /* Device memory. */
  uint8_t *dpay = NULL;
  CUDA_OK(cudaMalloc((void **)&dpay, len[0]));
  CUDA_OK(cudaMemcpy(dpay, pay[0], len[0], cudaMemcpyHostToDevice));
  items[1].payload = dpay;
  items[1].len = len[0];
  assert_int_equal(kvt_gpu_load_batch(L, items, 3, &lp, stream), KVT_ENOTSUP);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "item 1:"));
  cudaFree(dpay);
  cudaFreeHost(short_pay);

  for (uint32_t l = 0; l < s.layers; l++)
    cudaEventDestroy((cudaEvent_t)events[l]);
  cudaEventDestroy(ref);
  for (uint32_t i = 0; i < BATCH_N; i++)
    cudaFreeHost(pay[i]);
  cudaFreeHost(v);
  cudaFree(dslots);
  kvt_gpu_layout_destroy(L);
  engine_free(&e);
  free(k);
  free(vv);
  free(slots);
  free(s64);
}

static uint8_t *read_pinned(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = pinned((size_t)n);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* One golden case: its input stored by the GPU gives the file's bytes; the
 * file loaded by the GPU gives kvt_decode's values. */
static void golden_case_on_gpu(const char *dir, const golden_case *gc) {
  char path[4200];
  snprintf(path, sizeof(path), "%s/%s.kvt", dir, gc->name);
  size_t flen;
  uint8_t *file = read_pinned(path, &flen);
  const shape s = {gc->layers, gc->tokens, gc->heads, gc->head_dim};
  const size_t n_el = golden_elems(gc);
  uint16_t *k = malloc(2 * n_el), *v = malloc(2 * n_el), *dk = malloc(2 * n_el),
           *dv = malloc(2 * n_el);
  golden_input(gc, k, v);
  assert_true(gc->model_layers <= MAXL);
  engine src, dst;
  engine_make(&src, LAY_VLLM, gc->dtype, gc->model_layers, gc->tokens, 16, gc->heads,
              gc->head_dim);
  engine_make(&dst, LAY_VLLM, gc->dtype, gc->model_layers, gc->tokens, 16, gc->heads,
              gc->head_dim);
  uint32_t *slots = malloc(4 * gc->tokens);
  int64_t *s64 = malloc(8 * gc->tokens), *dslots;
  uint32_t stride = 7, total = src.nb * src.bs;
  while (total % stride == 0) /* a stride prime to the slot count: distinct slots */
    stride += 2;
  for (uint32_t t = 0; t < gc->tokens; t++)
    s64[t] = slots[t] = (t * stride + 3) % total;
  CUDA_OK(cudaMalloc((void **)&dslots, 8 * gc->tokens));
  CUDA_OK(cudaMemcpy(dslots, s64, 8 * gc->tokens, cudaMemcpyHostToDevice));
  scatter(&src, k, v, &s, slots, gc->layer_begin, gc->layers, 0);
  engine_upload(&src);
  engine_upload(&dst);
  kvt_gpu_layout *Ls, *Ld;
  assert_int_equal(kvt_gpu_layout_create(ctx, &src.desc, &Ls), 0);
  assert_int_equal(kvt_gpu_layout_create(ctx, &dst.desc, &Ld), 0);
  kvt_encode_params ep = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(golden_params(ctx, gc, &ep), 0);
  kvt_gpu_store_params sp = KVT_GPU_STORE_PARAMS_INIT;
  sp.encode = &ep;
  sp.layer_count = gc->layers;
  sp.tokens = gc->tokens;
  sp.slots = dslots;
  uint8_t *out = pinned(flen);
  size_t len = 0;
  int rc = kvt_gpu_store(Ls, &sp, out, flen, &len, stream);
  if (rc)
    fail_msg("golden %s: gpu store: %s %s", gc->name, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  if ((unsigned)(file[8] | file[9] << 8) == KVT_FORMAT_VERSION) {
    if (len != flen || memcmp(out, file, flen) != 0)
      fail_msg("golden %s: the GPU store of its input is not the golden file", gc->name);
  } else { /* an older format's file: the GPU writes today's, as the CPU does */
    uint8_t *mine = NULL;
    size_t mlen = 0;
    assert_int_equal(golden_encode(ctx, gc, k, v, &mine, &mlen), 0);
    if (len != mlen || memcmp(out, mine, mlen) != 0)
      fail_msg("golden %s: the GPU store of its input is not the CPU encoder's", gc->name);
    free(mine);
  }
  kvt_kv_view dview;
  kvt_kv_view_dense(&dview, dk, dv, gc->dtype, gc->layers, gc->tokens, gc->heads, gc->head_dim);
  assert_int_equal(kvt_decode(ctx, file, flen, NULL, &dview), 0);
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.tokens = gc->tokens;
  lp.slots = dslots;
  lp.expect_fingerprint = &ep.fingerprint;
  rc = kvt_gpu_load(Ld, file, flen, &lp, stream);
  if (rc)
    fail_msg("golden %s: gpu load: %s %s", gc->name, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  CUDA_OK(cudaStreamSynchronize(stream));
  scatter(&dst, dk, dv, &s, slots, gc->layer_begin, gc->layers, 0);
  engine_expect(&dst, gc->name);
  /* Verified on the GPU, from pinned and from device memory: the file's
   * format (1 or 2) picks the checksum kernels. */
  kvt_gpu_verdict *vd = pinned(sizeof(*vd));
  uint8_t *dfile;
  CUDA_OK(cudaMalloc((void **)&dfile, flen));
  CUDA_OK(cudaMemcpy(dfile, file, flen, cudaMemcpyHostToDevice));
  lp.verdict = vd;
  for (int m = 0; m < 2; m++) {
    engine_background(&dst);
    engine_upload(&dst);
    rc = kvt_gpu_load(Ld, m ? (void *)dfile : (void *)file, flen, &lp, stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    if (rc == 0)
      rc = kvt_gpu_verdict_check(Ld, vd);
    if (rc)
      fail_msg("golden %s: gpu load verified on the GPU (%s): %s %s", gc->name,
               m ? "device" : "pinned", kvt_err_name(rc), kvt_ctx_last_error(ctx));
    scatter(&dst, dk, dv, &s, slots, gc->layer_begin, gc->layers, 0);
    engine_expect(&dst, gc->name);
  }
  /* An older format's file in a batch with a verdict: checked on the host
   * (the GPU verifies format 2 only), the verdict done on return. */
  if ((unsigned)(file[8] | file[9] << 8) != KVT_FORMAT_VERSION) {
    engine_background(&dst);
    engine_upload(&dst);
    kvt_gpu_load_item it = KVT_GPU_LOAD_ITEM_INIT;
    it.payload = file;
    it.len = flen;
    it.slots = dslots;
    it.verdict = vd;
    kvt_gpu_load_params bp = KVT_GPU_LOAD_PARAMS_INIT;
    bp.tokens = gc->tokens;
    bp.expect_fingerprint = &ep.fingerprint;
    rc = kvt_gpu_load_batch(Ld, &it, 1, &bp, stream);
    if (rc || vd->done != 1)
      fail_msg("golden %s: batched load: %s %s, verdict done %u", gc->name, kvt_err_name(rc),
               kvt_ctx_last_error(ctx), vd->done);
    CUDA_OK(cudaStreamSynchronize(stream));
    assert_int_equal(kvt_gpu_verdict_check(Ld, vd), 0);
    scatter(&dst, dk, dv, &s, slots, gc->layer_begin, gc->layers, 0);
    engine_expect(&dst, gc->name);
  }
  cudaFree(dfile);
  cudaFreeHost(vd);
  kvt_gpu_layout_destroy(Ls);
  kvt_gpu_layout_destroy(Ld);
  engine_free(&src);
  engine_free(&dst);
  cudaFree(dslots);
  cudaFreeHost(out);
  cudaFreeHost(file);
  free(slots);
  free(s64);
  free(k);
  free(v);
  free(dk);
  free(dv);
}

static void test_gpu_golden_payloads_load_and_store_bit_exact(void **state) {
  (void)state;
  const char *env = getenv("KVT_SOURCE_DIR");
  char dir[4096], path[4200], line[1024];
  snprintf(dir, sizeof(dir), "%s/tests/golden", env && *env ? env : KVT_SOURCE_DIR);
  snprintf(path, sizeof(path), "%s/MANIFEST", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  int cases = 0;
  while (fgets(line, sizeof(line), f)) {
    golden_case gc;
    if (line[0] == '#' || golden_parse_line(line, &gc) != 0 || gc.zstd_level)
      continue; /* the GPU reads plain sections only */
    golden_case_on_gpu(dir, &gc);
    cases++;
  }
  fclose(f);
  assert_true(cases >= 10);
}

int main(void) {
  int n = 0;
  if (run_host_tests() != 0)
    return 1;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    fprintf(stderr, "skipped: no CUDA device\n");
    return 77;
  }
  quick = getenv("KVT_GPU_TEST_QUICK") && atoi(getenv("KVT_GPU_TEST_QUICK"));
  if (getenv("KVT_GPU_TEST_ONLY")) /* a pattern: the tests to run (compute-sanitizer) */
    cmocka_set_test_filter(getenv("KVT_GPU_TEST_ONLY"));
  if (kvt_ctx_create(NULL, &ctx) != 0)
    return 1;
  cudaStream_t st;
  if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
    return 1;
  stream = st;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu_store_and_load_match_cpu_codec_every_preset_and_layout),
      cmocka_unit_test(test_gpu_store_and_load_match_cpu_codec_odd_shapes),
      cmocka_unit_test(test_gpu_load_rejects_bad_payloads),
      cmocka_unit_test(test_gpu_device_payload_bit_flips_are_caught),
      cmocka_unit_test(test_gpu_device_payload_large_section_and_foreign_table),
      cmocka_unit_test(test_gpu_device_payload_over_256mib_combined_apart),
      cmocka_unit_test(test_gpu_device_payload_sections_combined_by_several_ctas),
      cmocka_unit_test(test_gpu_big_sections_combined_by_warps_last_cta_and_apart),
      cmocka_unit_test(test_gpu_batched_big_sections_combined_apart),
      cmocka_unit_test(test_gpu_staged_store_and_loads_verified_on_gpu),
      cmocka_unit_test(test_gpu_batched_loads_equal_single_loads_and_fail_per_payload),
      cmocka_unit_test(test_gpu_load_from_memory_tier_loans_in_place),
      cmocka_unit_test(test_gpu_load_refuses_other_shapes_and_lossless_sections),
      cmocka_unit_test(test_gpu_store_refuses_nonfinite_and_out_of_range),
      cmocka_unit_test(test_gpu_golden_payloads_load_and_store_bit_exact),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  cudaStreamDestroy(st);
  kvt_ctx_destroy(ctx);
  return rc;
}

#else

/* Built without CUDA: the calls exist and say so. */
static void test_gpu_calls_return_enotsup_without_cuda(void **state) {
  (void)state;
  kvt_ctx *c;
  assert_int_equal(kvt_ctx_create(NULL, &c), 0);
  void *ptrs[1] = {&c};
  kvt_gpu_layout_desc d;
  kvt_gpu_layout_desc_vllm(&d, KVT_DTYPE_BF16, 1, ptrs, 4, 16, 8, 128);
  assert_int_equal(d.stride_block, 16 * 8 * 128);
  assert_int_equal(d.v_offset, 4 * 16 * 8 * 128);
  kvt_gpu_layout *L = NULL;
  assert_int_equal(kvt_gpu_layout_create(c, &d, &L), KVT_ENOTSUP);
  assert_null(L);
  assert_non_null(strstr(kvt_ctx_last_error(c), "without CUDA"));
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  assert_int_equal(kvt_gpu_load(NULL, "x", 1, &lp, NULL), KVT_ENOTSUP);
  assert_int_equal(kvt_gpu_load_batch(NULL, NULL, 0, &lp, NULL), KVT_ENOTSUP);
  assert_int_equal(kvt_gpu_store_batch_async(NULL, NULL, 0, NULL), KVT_ENOTSUP);
  assert_int_equal(kvt_gpu_store_batch_finish(NULL, NULL, 0, NULL), KVT_ENOTSUP);
  size_t len;
  assert_int_equal(kvt_gpu_store(NULL, NULL, NULL, 0, &len, NULL), KVT_ENOTSUP);
  int kind;
  assert_int_equal(kvt_gpu_mem_kind(c, "x", &kind), KVT_ENOTSUP);
  kvt_gpu_layout_destroy(NULL);
  kvt_ctx_destroy(c);
}

int main(void) {
  if (run_host_tests() != 0)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu_calls_return_enotsup_without_cuda),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  if (rc)
    return rc;
  fprintf(stderr, "skipped: built without CUDA (KVT_ENABLE_CUDA)\n");
  return 77;
}
#endif
