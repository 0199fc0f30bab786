/* gpu/gpu_api.c - the public GPU calls (kvtier/gpu.h): layout registration,
 * the host half of store (header and table before the kernel, checksums
 * after it) and of load (parse and verify before the kernel). Plain C: the
 * CUDA runtime is reached only through gpu_kernels.cu's wrappers, so this
 * file also builds without CUDA, where every call returns KVT_ENOTSUP. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "codec_internal.h"
#include "kvt_gpu_layout.h"
#include "kvtier/gpu.h"
#include "payload_layout.h"

static void desc_init(kvt_gpu_layout_desc *d, int dtype, uint32_t layers, void *const *k,
                      void *const *v, uint32_t num_blocks, uint32_t block_size, uint32_t heads,
                      uint32_t head_dim) {
  memset(d, 0, sizeof(*d));
  d->struct_size = sizeof(*d);
  d->dtype = dtype;
  d->layers = layers;
  d->heads = heads;
  d->head_dim = head_dim;
  d->block_size = block_size;
  d->num_blocks = num_blocks;
  d->k_layers = k;
  d->v_layers = v;
  d->staging_bytes = KVT_GPU_STAGING_DEFAULT;
}

void kvt_gpu_layout_desc_vllm(kvt_gpu_layout_desc *d, int dtype, uint32_t layers,
                              void *const *t, uint32_t num_blocks, uint32_t block_size,
                              uint32_t heads, uint32_t head_dim) {
  desc_init(d, dtype, layers, t, NULL, num_blocks, block_size, heads, head_dim);
  d->stride_head = head_dim;
  d->stride_token = (int64_t)heads * head_dim;
  d->stride_block = (int64_t)block_size * heads * head_dim;
  d->v_offset = (int64_t)num_blocks * d->stride_block;
}

/* KVCacheLayout's stride permutations (vllm/v1/kv_cache_layout.py): the
 * logical axes [L, B, H, N, C] in physical order, outermost first. */
static const uint8_t vllm_orders[6][5] = {
    {0, 1, 2, 3, 4}, /* LBHNC */
    {0, 1, 3, 2, 4}, /* LBNHC */
    {0, 2, 1, 3, 4}, /* LHBNC */
    {1, 0, 2, 3, 4}, /* BLHNC */
    {1, 0, 3, 2, 4}, /* BLNHC */
    {1, 2, 0, 3, 4}, /* BHLNC */
};

void kvt_gpu_layout_desc_vllm_v1(kvt_gpu_layout_desc *d, int dtype, uint32_t layers,
                                 void *const *t, uint32_t num_blocks, uint32_t block_size,
                                 uint32_t heads, uint32_t head_dim, int layout) {
  desc_init(d, dtype, layers, t, NULL, num_blocks, block_size, heads, head_dim);
  if (layout < 0 || layout >= 6) {
    d->layers = 0; /* refused by kvt_gpu_layout_create */
    return;
  }
  /* vLLM's compute_layout_strides, in elements: innermost axis first, each
   * stride the product of the sizes inside it. */
  const uint64_t size[5] = {layers, num_blocks, heads, block_size, 2 * (uint64_t)head_dim};
  int64_t stride[5];
  uint64_t cur = 1;
  for (int i = 4; i >= 0; i--) {
    const int axis = vllm_orders[layout][i];
    stride[axis] = (int64_t)cur;
    cur *= size[axis];
  }
  d->stride_block = stride[1];
  d->stride_head = stride[2];
  d->stride_token = stride[3];
  d->v_offset = head_dim;
}

void kvt_gpu_layout_desc_flashinfer_nhd(kvt_gpu_layout_desc *d, int dtype, uint32_t layers,
                                        void *const *t, uint32_t num_blocks,
                                        uint32_t block_size, uint32_t heads,
                                        uint32_t head_dim) {
  desc_init(d, dtype, layers, t, NULL, num_blocks, block_size, heads, head_dim);
  d->stride_head = head_dim;
  d->stride_token = (int64_t)heads * head_dim;
  d->stride_block = 2 * (int64_t)block_size * heads * head_dim;
  d->v_offset = (int64_t)block_size * heads * head_dim;
}

void kvt_gpu_layout_desc_flashinfer_hnd(kvt_gpu_layout_desc *d, int dtype, uint32_t layers,
                                        void *const *t, uint32_t num_blocks,
                                        uint32_t block_size, uint32_t heads,
                                        uint32_t head_dim) {
  desc_init(d, dtype, layers, t, NULL, num_blocks, block_size, heads, head_dim);
  d->stride_token = head_dim;
  d->stride_head = (int64_t)block_size * head_dim;
  d->stride_block = 2 * (int64_t)heads * block_size * head_dim;
  d->v_offset = (int64_t)heads * block_size * head_dim;
}

void kvt_gpu_layout_desc_separate(kvt_gpu_layout_desc *d, int dtype, uint32_t layers,
                                  void *const *k, void *const *v, uint32_t num_slots,
                                  uint32_t heads, uint32_t head_dim) {
  desc_init(d, dtype, layers, k, v, num_slots, 1, heads, head_dim);
  d->stride_head = head_dim;
  d->stride_token = (int64_t)heads * head_dim;
  d->stride_block = (int64_t)heads * head_dim;
}

#ifndef KVT_HAVE_CUDA

static int no_cuda(kvt_ctx *ctx) {
  return kvt_fail(ctx, KVT_ENOTSUP, "this kvtier was built without CUDA");
}

int kvt_gpu_layout_create(kvt_ctx *ctx, const kvt_gpu_layout_desc *desc, kvt_gpu_layout **out) {
  (void)desc;
  (void)out;
  return no_cuda(ctx);
}
void kvt_gpu_layout_destroy(kvt_gpu_layout *layout) { (void)layout; }
int kvt_gpu_mem_kind(kvt_ctx *ctx, const void *p, int *kind) {
  (void)p;
  (void)kind;
  return no_cuda(ctx);
}
int kvt_gpu_host_register(kvt_ctx *ctx, void *p, size_t len) {
  (void)p, (void)len;
  return no_cuda(ctx);
}
int kvt_gpu_host_unregister(kvt_ctx *ctx, void *p) {
  (void)p;
  return no_cuda(ctx);
}
int kvt_gpu_store_bound(kvt_gpu_layout *layout, const kvt_gpu_store_params *p, uint64_t *out) {
  (void)layout, (void)p, (void)out;
  return KVT_ENOTSUP;
}
int kvt_gpu_store_async(kvt_gpu_layout *layout, const kvt_gpu_store_params *p, void *dst,
                        size_t cap, size_t *len, void *stream) {
  (void)layout, (void)p, (void)dst, (void)cap, (void)len, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_store_finish(kvt_gpu_layout *layout, void *dst, size_t len, void *stream) {
  (void)layout, (void)dst, (void)len, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_store(kvt_gpu_layout *layout, const kvt_gpu_store_params *p, void *dst, size_t cap,
                  size_t *len, void *stream) {
  (void)layout, (void)p, (void)dst, (void)cap, (void)len, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_load(kvt_gpu_layout *layout, const void *payload, size_t len,
                 const kvt_gpu_load_params *p, void *stream) {
  (void)layout, (void)payload, (void)len, (void)p, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_store_batch_async(kvt_gpu_layout *layout, kvt_gpu_store_item *items, uint32_t n,
                              void *stream) {
  (void)layout, (void)items, (void)n, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_store_batch_finish(kvt_gpu_layout *layout, kvt_gpu_store_item *items, uint32_t n,
                               void *stream) {
  (void)layout, (void)items, (void)n, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_load_batch(kvt_gpu_layout *layout, const kvt_gpu_load_item *items, uint32_t n,
                       const kvt_gpu_load_params *p, void *stream) {
  (void)layout, (void)items, (void)n, (void)p, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_verdict_check(kvt_gpu_layout *layout, const kvt_gpu_verdict *verdict) {
  (void)layout, (void)verdict;
  return KVT_ENOTSUP;
}

#else

#define NSLOT 3
/* Loads from pinned host memory smaller than this read it from the kernel
 * (zero copy). On an H200 (PCIe 5) staging reached 0.88-0.97x of cudaMemcpy
 * at 10-32 MiB and 0.96-0.99x beyond, zero copy 0.88-0.93x at every size;
 * at 1 MiB both are launch-bound and neither wins. */
#define STAGE_MIN_BYTES (4ull << 20)

struct kvt_gpu_layout {
  kvt_ctx *ctx;
  kvt_gpu_layout_desc d; /* the descriptor, pointer arrays dropped */
  uint64_t *dev_ptrs;    /* [2 * layers]: K bases, then V bases */
  uint8_t *dev_aux;      /* kvt_gpu_status, then the amax floats (AUX_BYTES) */
  int align16, align4;   /* every base and stride allows 16- / 4-byte accesses */
  /* Staged loads (kvt_gpu_load): NSLOT device slots of slot_bytes, a copy
   * stream, and per slot an event after its copy and one after the kernels
   * that read it. */
  uint8_t *staging;
  uint64_t slot_bytes;
  void *copy_stream, *ev_start;
  void *ev_copied[NSLOT], *ev_free[NSLOT];
  uint32_t next_slot;
  /* Per slot, for the checksum kernels of staged stores and of loads
   * verified on the GPU: a gate word per payload of a batched piece (device
   * [NSLOT][KVT_GPU_BATCH_MAX], then a counter per slot: slot_gate,
   * slot_counter) and digest scratch; guarded by the slot's events like its
   * bytes. */
  uint32_t *gates;
  uint64_t *slot_digests[NSLOT];
  uint64_t slot_digest_words[NSLOT];
  /* The pinned payload the last kvt_gpu_store_async sealed on the GPU; the
   * first payload, count and every destination (batch_tag) of the last
   * kvt_gpu_store_batch_async. */
  const void *sealed_dst;
  const void *batch_dst;
  uint32_t batch_n;
  uint64_t batch_tag;
  /* A batched store's per-payload error codes (device [item_words], grown on
   * demand), so that finish seals the payloads that stored cleanly. */
  uint32_t *item_codes;
  uint32_t item_words;
  /* Format 2 checksums of device payloads: the pieces' digests (device
   * scratch, grown on demand; calls on one layout take turns). */
  uint64_t *digests;
  uint64_t digest_words;
};

/* The status word, then the layer-scale maxima of a store launch (of up to
 * KVT_GPU_BATCH_MAX payloads). */
#define AUX_BYTES \
  (sizeof(kvt_gpu_status) + 2 * KVT_MAX_LAYERS * KVT_GPU_BATCH_MAX * sizeof(float))
#define GATE_WORDS (NSLOT * KVT_GPU_BATCH_MAX + NSLOT)

/* The gate of payload k of slot's piece, and the slot's checksum counter. */
static uint32_t *slot_gate(const kvt_gpu_layout *L, uint32_t slot, uint32_t k) {
  return L->gates + (uint64_t)slot * KVT_GPU_BATCH_MAX + k;
}
static unsigned *slot_counter(const kvt_gpu_layout *L, uint32_t slot) {
  return L->gates + NSLOT * KVT_GPU_BATCH_MAX + slot;
}

/* The largest section of kp's layers [first, first + count) (stored = raw:
 * the GPU path has no lossless stage): an n16 section only where a raw layer
 * is among them. */
static uint64_t max_section(const kvt_gpu_kparams *kp) {
  uint64_t m = kp->sec_bytes[0] > kp->sec_bytes[1] ? kp->sec_bytes[0] : kp->sec_bytes[1];
  const uint32_t lo = kp->layer_begin + kp->first, hi = lo + kp->count;
  if (kvt_gpu_raw_below(kp, hi) > kvt_gpu_raw_below(kp, lo) && kp->raw_bytes > m)
    m = kp->raw_bytes;
  return m;
}

/* Digest words made at layout creation: payloads up to 32 MiB (a 256-token
 * chunk of a 32-layer, 8-head, 128-dim bf16 model) need no allocation on
 * the data path. */
#define DIGESTS_AT_CREATE 8192u

/* Digest scratch for the format 2 checksums of count sections of kp's
 * shape; grows L->digests for larger payloads (cudaFree waits for the
 * device's work: once per new largest size). */
static int digests_for(kvt_gpu_layout *L, uint32_t count, const kvt_gpu_kparams *kp,
                       uint64_t **out) {
  const uint64_t need = kvt_gpurt_digest_words(count, max_section(kp));
  if (need > L->digest_words) {
    kvt_gpurt_free(L->digests);
    L->digests = NULL;
    L->digest_words = 0;
    int e = kvt_gpurt_malloc((void **)&L->digests, need * sizeof(uint64_t));
    if (e)
      return e;
    L->digest_words = need;
  }
  *out = L->digests;
  return 0;
}

static int cuda_fail(kvt_ctx *ctx, int err, const char *what) {
  return kvt_fail(ctx, KVT_ECUDA, "%s: %s (CUDA error %d)", what, kvt_gpurt_error_string(err),
                  err);
}

static int check_desc(kvt_ctx *ctx, const kvt_gpu_layout_desc *d) {
  if (d->dtype != KVT_DTYPE_BF16 && d->dtype != KVT_DTYPE_F16)
    return kvt_fail(ctx, KVT_ESHAPE, "layout dtype %d: must be bf16 or fp16", d->dtype);
  if (!d->layers || (uint64_t)d->layer_begin + d->layers > KVT_MAX_LAYERS)
    return kvt_fail(ctx, KVT_ESHAPE, "layout layers %u+%u: must be 1.. within %u",
                    d->layer_begin, d->layers, KVT_MAX_LAYERS);
  if (!d->heads || d->heads > KVT_MAX_HEADS || !d->head_dim || d->head_dim > KVT_MAX_HEAD_DIM)
    return kvt_fail(ctx, KVT_ESHAPE, "layout heads %u head_dim %u: limits %u and %u", d->heads,
                    d->head_dim, KVT_MAX_HEADS, KVT_MAX_HEAD_DIM);
  if (!d->block_size || d->block_size > (1u << 31) || !d->num_blocks ||
      (uint64_t)d->block_size * d->num_blocks > ((uint64_t)1 << 40))
    return kvt_fail(ctx, KVT_ESHAPE, "layout of %u blocks of %u tokens", d->num_blocks,
                    d->block_size);
  const int64_t sh = d->stride_head, hd = (int64_t)d->head_dim;
  if (d->heads > 1 && sh < hd && sh > -hd)
    return kvt_fail(ctx, KVT_ESHAPE, "stride_head %" PRId64 " overlaps head_dim %u rows",
                    d->stride_head, d->head_dim);
  if (!d->k_layers)
    return kvt_fail(ctx, KVT_ESHAPE, "layout has no layer pointers");
  for (uint32_t l = 0; l < d->layers; l++)
    if (!d->k_layers[l] || (d->v_layers && !d->v_layers[l]))
      return kvt_fail(ctx, KVT_ESHAPE, "layout layer %u has a NULL pointer", l);
  return 0;
}

static int fill_ptrs(kvt_gpu_layout *L, const kvt_gpu_layout_desc *d, uint64_t *host) {
  uint64_t orv = 0;
  for (uint32_t l = 0; l < d->layers; l++) {
    uintptr_t k = (uintptr_t)d->k_layers[l];
    uintptr_t v = (uintptr_t)(d->v_layers ? d->v_layers[l] : d->k_layers[l]);
    host[l] = (uint64_t)k + 2 * (uint64_t)d->k_offset;
    host[d->layers + l] = (uint64_t)v + 2 * (uint64_t)d->v_offset;
    orv |= host[l] | host[d->layers + l];
  }
  const uint64_t s = 2 * ((uint64_t)d->stride_block | (uint64_t)d->stride_token |
                          (uint64_t)d->stride_head);
  L->align16 = ((orv | s) & 15) == 0;
  L->align4 = ((orv | s) & 3) == 0;
  return 0;
}

/* The staging slots, copy stream and events of staged loads. */
static int staging_create(kvt_gpu_layout *L, const char **what) {
  L->slot_bytes = L->d.staging_bytes / NSLOT / 256 * 256;
  if (L->slot_bytes == 0) {
    L->d.staging_bytes = 0; /* too small to hold anything: no staging */
    return 0;
  }
  int e;
  *what = "cudaMalloc of the staging memory";
  if ((e = kvt_gpurt_malloc((void **)&L->staging, NSLOT * L->slot_bytes)) != 0)
    return e;
  *what = "cudaStreamCreate of the copy stream";
  if ((e = kvt_gpurt_stream_create(&L->copy_stream)) != 0)
    return e;
  *what = "cudaEventCreate";
  if ((e = kvt_gpurt_event_create(&L->ev_start)) != 0)
    return e;
  for (int i = 0; i < NSLOT; i++)
    if ((e = kvt_gpurt_event_create(&L->ev_copied[i])) != 0 ||
        (e = kvt_gpurt_event_create(&L->ev_free[i])) != 0)
      return e;
  *what = "cudaMalloc of the checksum scratch";
  /* [NSLOT][KVT_GPU_BATCH_MAX] gates, then [NSLOT] counters of the
   * one-launch checksums. */
  if ((e = kvt_gpurt_malloc((void **)&L->gates, GATE_WORDS * sizeof(uint32_t))) != 0 ||
      (e = kvt_gpurt_zero(L->gates, GATE_WORDS * sizeof(uint32_t))) != 0)
    return e;
  /* A slot's pieces: one digest per 4 KiB, plus a partial piece for each of
   * up to 2 * KVT_MAX_LAYERS sections (more only where sections differ
   * much in size: then slot_digests grows). */
  const uint64_t words = L->slot_bytes / KVT_PL_CHECKSUM_BLOCK + 2 * KVT_MAX_LAYERS;
  for (int i = 0; i < NSLOT; i++) {
    if ((e = kvt_gpurt_malloc((void **)&L->slot_digests[i], words * sizeof(uint64_t))) != 0)
      return e;
    L->slot_digest_words[i] = words;
  }
  return 0;
}

/* Digest scratch of slot for the sections of kp's layers (kp->first and
 * kp->count: the piece's) of `items` payloads of kp's shape; grows it when
 * a piece needs more. */
static int slot_digests(kvt_gpu_layout *L, uint32_t slot, const kvt_gpu_kparams *kp,
                        uint32_t items, uint64_t **out) {
  const uint64_t need = kvt_gpurt_digest_words(2 * kp->count, max_section(kp)) * items;
  if (need > L->slot_digest_words[slot]) {
    kvt_gpurt_free(L->slot_digests[slot]); /* waits for the device's work */
    L->slot_digests[slot] = NULL;
    L->slot_digest_words[slot] = 0;
    int e = kvt_gpurt_malloc((void **)&L->slot_digests[slot], need * sizeof(uint64_t));
    if (e)
      return e;
    L->slot_digest_words[slot] = need;
  }
  *out = L->slot_digests[slot];
  return 0;
}

int kvt_gpu_layout_create(kvt_ctx *ctx, const kvt_gpu_layout_desc *d, kvt_gpu_layout **out) {
  kvt_clear_error(ctx);
  if (!ctx || !d || !out || d->struct_size < offsetof(kvt_gpu_layout_desc, staging_bytes))
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_layout_create: NULL argument or old descriptor");
  int rc = check_desc(ctx, d), n = 0, e;
  if (rc)
    return rc;
  if ((e = kvt_gpurt_device_count(&n)) != 0 || n == 0)
    return e ? cuda_fail(ctx, e, "cudaGetDeviceCount")
             : kvt_fail(ctx, KVT_ECUDA, "no CUDA device");
  kvt_gpu_layout *L = kvt_alloc(ctx, sizeof(*L), 16);
  uint64_t *host = kvt_alloc(ctx, 2 * sizeof(uint64_t) * d->layers, 16);
  if (!L || !host) {
    kvt_dealloc(ctx, L);
    kvt_dealloc(ctx, host);
    return kvt_fail(ctx, -ENOMEM, "kvt_gpu_layout_create: out of memory");
  }
  memset(L, 0, sizeof(*L));
  L->ctx = ctx;
  memcpy(&L->d, d, d->struct_size < sizeof(L->d) ? d->struct_size : sizeof(L->d));
  L->d.struct_size = sizeof(L->d);
  L->d.k_layers = L->d.v_layers = NULL;
  fill_ptrs(L, d, host);
  const size_t pbytes = 2 * sizeof(uint64_t) * d->layers;
  const char *what = "cudaMalloc";
  if ((e = kvt_gpurt_malloc((void **)&L->dev_ptrs, pbytes)) == 0 &&
      (e = kvt_gpurt_malloc((void **)&L->dev_aux, AUX_BYTES)) == 0 &&
      (e = kvt_gpurt_malloc((void **)&L->digests, DIGESTS_AT_CREATE * sizeof(uint64_t))) == 0) {
    L->digest_words = DIGESTS_AT_CREATE;
    what = "cudaMemcpy";
    if ((e = kvt_gpurt_copy_h2d(L->dev_ptrs, host, pbytes)) == 0)
      e = kvt_gpurt_zero(L->dev_aux, AUX_BYTES); /* the status word is read whole */
  }
  kvt_dealloc(ctx, host);
  if (e == 0 && L->d.staging_bytes)
    e = staging_create(L, &what);
  if (e) {
    kvt_gpu_layout_destroy(L);
    return cuda_fail(ctx, e, what);
  }
  *out = L;
  return 0;
}

void kvt_gpu_layout_destroy(kvt_gpu_layout *L) {
  if (!L)
    return;
  kvt_gpurt_free(L->dev_ptrs);
  kvt_gpurt_free(L->dev_aux);
  kvt_gpurt_free(L->digests);
  kvt_gpurt_free(L->item_codes);
  if (L->copy_stream)
    (void)kvt_gpurt_sync(L->copy_stream);
  kvt_gpurt_stream_destroy(L->copy_stream);
  kvt_gpurt_event_destroy(L->ev_start);
  for (int i = 0; i < NSLOT; i++) {
    kvt_gpurt_event_destroy(L->ev_copied[i]);
    kvt_gpurt_event_destroy(L->ev_free[i]);
  }
  kvt_gpurt_free(L->staging);
  kvt_gpurt_free(L->gates);
  for (int i = 0; i < NSLOT; i++)
    kvt_gpurt_free(L->slot_digests[i]);
  kvt_dealloc(L->ctx, L);
}

int kvt_gpu_mem_kind(kvt_ctx *ctx, const void *p, int *kind) {
  void *dev;
  int e = kvt_gpurt_pointer(p, kind, &dev);
  return e ? cuda_fail(ctx, e, "cudaPointerGetAttributes") : 0;
}

int kvt_gpu_host_register(kvt_ctx *ctx, void *p, size_t len) {
  if (!p || !len)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_host_register: NULL or empty range");
  int n = 0, e = kvt_gpurt_device_count(&n);
  if (e || n == 0) /* no driver, or no device: ordinary memory it is */
    return kvt_fail(ctx, KVT_ENOTSUP, "no CUDA device to pin host memory for");
  e = kvt_gpurt_host_register(p, len);
  return e ? cuda_fail(ctx, e, "cudaHostRegister") : 0;
}

int kvt_gpu_host_unregister(kvt_ctx *ctx, void *p) {
  if (!p)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_host_unregister: NULL");
  int e = kvt_gpurt_host_unregister(p);
  return e ? cuda_fail(ctx, e, "cudaHostUnregister") : 0;
}

/* The device address of a payload buffer, with its kind. */
static int payload_addr(kvt_ctx *ctx, const void *p, int *kind, uint8_t **dev) {
  void *d = NULL;
  int e = kvt_gpurt_pointer(p, kind, &d);
  if (e)
    return cuda_fail(ctx, e, "cudaPointerGetAttributes");
  if (*kind == KVT_GPU_MEM_PAGEABLE || !d)
    return kvt_fail(ctx, KVT_ENOTSUP, "payload at %p is pageable host memory: the GPU needs "
                    "pinned, mapped memory (cudaHostAlloc) or device memory", p);
  if ((uintptr_t)d % 16)
    return kvt_fail(ctx, KVT_ESHAPE, "payload at %p is not 16-byte aligned", p);
  *dev = d;
  return 0;
}

/* One item's bytes in a batch (its destination or its verdict). */
typedef struct item_range {
  uintptr_t lo, hi;
  uint32_t k;
} item_range;

static int range_cmp(const void *a, const void *b) {
  const item_range *x = a, *y = b;
  if (x->lo != y->lo)
    return x->lo < y->lo ? -1 : 1;
  return x->k < y->k ? -1 : x->k > y->k;
}

/* Refuses (-EINVAL, naming the two items) a batch where two items' `what`
 * overlap: the pointer at byte `field` of each of the n items (`stride`
 * bytes apart) and the len bytes after it. Two chunks stored into one
 * destination race; two loads sharing a verdict end it early. */
static int distinct_ranges(kvt_ctx *ctx, const void *items, size_t stride, size_t field,
                           uint64_t len, uint32_t n, const char *fn, const char *what) {
  if (n < 2)
    return 0;
  item_range *r = kvt_alloc(ctx, (size_t)n * sizeof(*r), 64);
  if (!r)
    return kvt_fail(ctx, -ENOMEM, "%s: %u items", fn, n);
  for (uint32_t k = 0; k < n; k++) {
    const void *p;
    memcpy(&p, (const char *)items + (size_t)k * stride + field, sizeof(p));
    r[k].lo = (uintptr_t)p;
    r[k].hi = (uintptr_t)p + len;
    r[k].k = k;
  }
  qsort(r, n, sizeof(*r), range_cmp);
  int rc = 0;
  for (uint32_t i = 1; i < n && rc == 0; i++)
    if (r[i].lo < r[i - 1].hi)
      rc = kvt_fail(ctx, -EINVAL, "%s: items %u and %u share %s bytes: each needs its own", fn,
                    r[i - 1].k < r[i].k ? r[i - 1].k : r[i].k,
                    r[i - 1].k < r[i].k ? r[i].k : r[i - 1].k, what);
  kvt_dealloc(ctx, r);
  return rc;
}

/* What a launch reads and writes, for the choice of its chunk. */
enum { CHUNK_STORE = 0, CHUNK_LOAD_DEVICE = 1, CHUNK_LOAD_HOST = 2 };

/* Elements per lane step: 32 (loads reading host memory: larger PCIe
 * requests per warp), 16 (stores; loads reading device memory, where 32
 * would cost occupancy for nothing), 8 (16-byte engine accesses), 2, 1. */
static uint32_t pick_chunk(const kvt_gpu_layout *L, const kvt_codec_spec *spec, int mode) {
  const uint32_t D = L->d.head_dim;
  const int i4 = spec->k_fmt == KVT_FMT_I4 || spec->v_fmt == KVT_FMT_I4;
  const int dim_groups = spec->v_fmt == KVT_FMT_I4 ||
                         (spec->k_fmt == KVT_FMT_I4 && spec->k_axis == KVT_AXIS_DIM);
  for (uint32_t c = mode == CHUNK_LOAD_HOST ? 32 : 16; c >= 16; c /= 2)
    if (D % c == 0 && L->align16 && (!dim_groups || spec->group % c == 0))
      return c;
  if (D % 8 == 0 && L->align16 && (!dim_groups || spec->group % 8 == 0))
    return 8;
  if (D % 2 == 0 && L->align4)
    return 2;
  return i4 ? 0 : 1;
}

/* The launch's fixed divisors (kvt_gpu_fdiv), from its shape and chunk. */
static void set_divisors(kvt_gpu_kparams *kp) {
  const uint32_t D = kp->head_dim, g = kp->group ? kp->group : 1;
  const uint32_t cpr = kp->chunk ? D / kp->chunk : 1;
  kp->fd_heads = kvt_gpu_fdiv_make(kp->heads);
  kp->fd_block_size = kvt_gpu_fdiv_make(kp->block_size);
  kp->fd_block = kvt_gpu_fdiv_make(kp->block ? kp->block : 1);
  kp->fd_cpr = kvt_gpu_fdiv_make(cpr ? cpr : 1);
  kp->fd_cpr8 = kvt_gpu_fdiv_make(D % 8 == 0 ? D / 8 : 1);
  kp->fd_cpr16 = kvt_gpu_fdiv_make(D % 16 == 0 ? D / 16 : 1);
  kp->fd_group = kvt_gpu_fdiv_make(g);
  const uint64_t groups = ((uint64_t)kp->tokens + g - 1) / g * kp->heads * (cpr ? cpr : 1);
  kp->fd_groups = kvt_gpu_fdiv_make((uint32_t)groups);
}

/* Sets kp->chunk to the chunk for mode and what depends on it: the
 * divisors, and how many tokens of an i4 token group one thread loads from
 * device memory (measured on an H200: 8 while there are few groups, 16
 * beyond; 0 leaves the kernel's choice for host reads, which favour fewer,
 * longer threads). */
static void set_chunk(kvt_gpu_layout *L, const kvt_codec_spec *spec, int mode, uint32_t items,
                      kvt_gpu_kparams *kp) {
  kp->chunk = pick_chunk(L, spec, mode);
  set_divisors(kp);
  kp->part = 0;
  if (mode == CHUNK_LOAD_DEVICE && kp->chunk) {
    const uint32_t g = kp->group ? kp->group : 1;
    const uint64_t groups = ((uint64_t)kp->tokens + g - 1) / g * kp->heads *
                            (kp->head_dim / kp->chunk) * 2 * kp->count * items;
    kp->part = groups < 65536 ? 8 : 16;
  }
}

static int fill_kparams(kvt_gpu_layout *L, const kvt_codec_spec *spec, uint32_t tokens,
                        uint32_t layer_begin, uint32_t payload_layers, uint32_t first,
                        uint32_t count, const int64_t *slots, uint8_t *payload, int load,
                        kvt_gpu_kparams *kp) {
  const kvt_gpu_layout_desc *d = &L->d;
  const uint32_t abs0 = layer_begin + first;
  if (abs0 < d->layer_begin || (uint64_t)abs0 + count > (uint64_t)d->layer_begin + d->layers)
    return kvt_fail(L->ctx, KVT_ESHAPE, "layers %u..%u are outside the layout's %u..%u", abs0,
                    abs0 + count, d->layer_begin, d->layer_begin + d->layers);
  memset(kp, 0, sizeof(*kp));
  kp->chunk = pick_chunk(L, spec, load);
  if (!kp->chunk)
    return kvt_fail(L->ctx, KVT_ESHAPE, "i4 needs 4-byte aligned engine rows and strides");
  kp->ptrs = L->dev_ptrs;
  kp->slots = slots;
  kp->payload = payload;
  kp->status = (kvt_gpu_status *)L->dev_aux;
  kp->amax = (float *)(L->dev_aux + sizeof(kvt_gpu_status));
  kp->stride_block = d->stride_block;
  kp->stride_token = d->stride_token;
  kp->stride_head = d->stride_head;
  kp->slot_limit = (uint64_t)d->num_blocks * d->block_size;
  kp->header_size = kvt_header_size(2 * payload_layers);
  kvt_section_shape sh = {spec->k_fmt, d->dtype, 0, 0, tokens, d->heads, d->head_dim};
  kp->sec_bytes[0] = kvt_section_bytes(spec, &sh);
  sh.fmt = spec->v_fmt;
  sh.is_value = 1;
  kp->sec_bytes[1] = kvt_section_bytes(spec, &sh);
  kp->raw_bytes = 2 * (uint64_t)tokens * d->heads * d->head_dim;
  memcpy(kp->raw_layers, spec->raw_layers, sizeof(kp->raw_layers));
  kp->block_size = d->block_size;
  kp->layout_layers = d->layers;
  kp->layout_begin = d->layer_begin;
  kp->tokens = tokens;
  kp->heads = d->heads;
  kp->head_dim = d->head_dim;
  kp->dtype = (uint32_t)d->dtype;
  kp->layer_begin = layer_begin;
  kp->payload_layers = payload_layers;
  kp->first = first;
  kp->count = count;
  kp->group = spec->group;
  kp->block = spec->block;
  kp->fmt[0] = spec->k_fmt;
  kp->fmt[1] = spec->v_fmt;
  kp->scale = spec->scale;
  kp->k_axis = spec->k_axis;
  /* The kernels index with 32-bit numerators (kvt_gpu_fdiv). */
  if ((uint64_t)tokens * d->heads * d->head_dim >= (1ull << 31))
    return kvt_fail(L->ctx, KVT_ETOOBIG, "%u tokens x %u heads x %u dim: a section of 2^31 "
                    "elements or more is not supported by the GPU kernels", tokens, d->heads,
                    d->head_dim);
  set_chunk(L, spec, load, 1, kp);
  return 0;
}

/* ---- store ---- */

static int store_check(kvt_gpu_layout *L, const kvt_gpu_store_params *p, kvt_codec_spec *spec,
                       uint32_t *model_layers, uint64_t *size) {
  kvt_ctx *ctx = L->ctx;
  if (!p || p->struct_size < sizeof(*p) || !p->encode ||
      p->encode->struct_size < sizeof(kvt_encode_params))
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store: missing or old params");
  if (!p->slots || !p->tokens || !p->layer_count)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store: no slots, tokens or layers");
  if (p->encode->zstd_level)
    return kvt_fail(ctx, KVT_ENOTSUP, "the GPU store has no lossless stage (zstd level %d)",
                    p->encode->zstd_level);
  *spec = p->encode->spec;
  kvt_codec_normalise(spec);
  int rc = kvt_codec_validate(ctx, spec);
  if (rc)
    return rc;
  const uint32_t lb = p->encode->layer_begin;
  *model_layers = p->encode->model_layers ? p->encode->model_layers : p->layer_count;
  if (*model_layers > KVT_MAX_LAYERS || (uint64_t)lb + p->layer_count > *model_layers)
    return kvt_fail(ctx, KVT_ESHAPE, "layers %u..%u do not fit a model of %u layers (max %u)",
                    lb, lb + p->layer_count, *model_layers, KVT_MAX_LAYERS);
  return kvt_encode_bound(ctx, spec, lb, p->layer_count, p->tokens, L->d.heads, L->d.head_dim,
                          size);
}

int kvt_gpu_store_bound(kvt_gpu_layout *L, const kvt_gpu_store_params *p, uint64_t *out) {
  if (!L || !out)
    return -EINVAL;
  kvt_clear_error(L->ctx);
  kvt_codec_spec spec;
  uint32_t model_layers = 0;
  return store_check(L, p, &spec, &model_layers, out);
}

/* The header and section table with zero checksums (sealed by finish). */
static void put_header(const kvt_gpu_store_params *p, const kvt_codec_spec *spec, int dtype,
                       uint32_t heads, uint32_t head_dim, uint32_t model_layers,
                       const kvt_gpu_kparams *kp, uint64_t size, uint8_t *dst) {
  kvt_payload_info h;
  memset(&h, 0, sizeof(h));
  h.size = size;
  h.header_size = (uint32_t)kp->header_size;
  h.sections = 2 * p->layer_count;
  h.key = p->encode->key;
  h.fingerprint = p->encode->fingerprint;
  h.spec = *spec;
  h.dtype = dtype;
  h.model_layers = model_layers;
  h.layer_begin = p->encode->layer_begin;
  h.layers = p->layer_count;
  h.tokens = p->tokens;
  h.heads = heads;
  h.head_dim = head_dim;
  h.token_begin = p->encode->token_begin;
  kvt_header_put(dst, &h);
  for (uint32_t i = 0; i < h.sections; i++) {
    const uint32_t layer = p->encode->layer_begin + i / 2;
    const int kind = (int)(i % 2);
    const uint64_t raw = kvt_gpu_sec_size(kp, layer, kind);
    const kvt_section_info e = {layer, kind, kvt_gpu_sec_fmt(kp, layer, kind), KVT_COMP_NONE,
                                kvt_gpu_sec_offset(kp, i / 2, kind), raw, raw, 0, {0, 0}};
    kvt_section_entry_put(dst, i, &e);
  }
}

/* The bytes of the next staged piece, `left` bytes to go: half of them (at
 * least 8 MiB: each piece costs host calls and launches; 8 MiB gave verified
 * loads of 10 MiB payloads 4-8% more than 2 MiB on an H200), at most a slot. */
static uint64_t piece_target(const kvt_gpu_layout *L, uint64_t left) {
  uint64_t t = left / 2 < (8u << 20) ? (8u << 20) : left / 2;
  return t < L->slot_bytes ? t : L->slot_bytes;
}

/* The next staging slot in turn. */
static uint32_t take_slot(kvt_gpu_layout *L) {
  const uint32_t slot = L->next_slot;
  L->next_slot = (slot + 1) % NSLOT;
  return slot;
}

/* Bytes [*begin, *end) of payload-relative layer i that a transfer moves. */
typedef void (*span_fn)(const kvt_gpu_kparams *kp, uint32_t i, uint64_t size, uint64_t *begin,
                        uint64_t *end);

/* Bytes [*begin, *end) a store writes for payload-relative layer i: its K
 * and V sections and the padding after them (none after the last). */
static void store_span(const kvt_gpu_kparams *kp, uint32_t i, uint64_t size, uint64_t *begin,
                       uint64_t *end) {
  *begin = kvt_gpu_sec_offset(kp, i, 0);
  *end = i + 1 < kp->payload_layers ? kvt_gpu_sec_offset(kp, i + 1, 0) : size;
}

/* Bytes [*begin, *end) of payload-relative layer i: its K and V sections. */
static void layer_span(const kvt_gpu_kparams *kp, uint32_t i, uint64_t *begin, uint64_t *end) {
  *begin = kvt_gpu_sec_offset(kp, i, 0);
  *end = kvt_gpu_sec_offset(kp, i, 1) + kvt_gpu_sec_size(kp, kp->layer_begin + i, 1);
}

/* layer_span as a span_fn (a load moves the sections only). */
static void load_span(const kvt_gpu_kparams *kp, uint32_t i, uint64_t size, uint64_t *begin,
                      uint64_t *end) {
  (void)size;
  layer_span(kp, i, begin, end);
}

/* The copy of each payload in a piece of a batched staged transfer is at least
 * this long (where a slot allows): on an H200, 128 chunks of 256 tokens x
 * 32 layers loaded at 0.61-0.83x of cudaMemcpy with one layer per copy (0.3-1
 * MiB: the copy engine's cost per copy), 0.89-0.93x with 2 MiB copies,
 * 0.93-0.94x with 4 MiB and 0.95-0.97x with 8 MiB; 4 MiB keeps layer groups
 * short (4 layers of a bf16 chunk, 13 of an int4 one). At most a quarter of
 * a slot, so that a slot holds several payloads. */
#define MIN_COPY (4ull << 20)

/* The next piece of a staged transfer of n payloads of kp's shape (and
 * size bytes), from layer a (of those before stop), `left` bytes to go in
 * all: whole layers [a, a + *nl), bytes [*begin, *end) of each payload
 * (span: what a load or a store moves of a layer), laid out in a slot every
 * *stride bytes, *per payloads a piece. As many layers as fit
 * piece_target(left) for the payloads of one launch, or more - up to what
 * fits the target for one payload - until a payload's copy is MIN_COPY
 * long (a quarter of a slot at most); where they do not fit, their payloads
 * are split over pieces. one_layer: layer a alone (a load's first, when an
 * engine waits for it: its event comes early). With
 * one payload: pieces of whole layers that shrink towards the end (half of
 * what is left), so the kernel left after the last copy is a short one. */
static void plan_piece(const kvt_gpu_layout *L, const kvt_gpu_kparams *kp, span_fn span,
                       uint64_t size, uint32_t a, uint32_t stop, uint32_t n, uint64_t left,
                       int one_layer, uint32_t *nl, uint64_t *begin, uint64_t *end,
                       uint64_t *stride, uint32_t *per) {
  const uint64_t target = piece_target(L, left);
  const uint32_t group = n < KVT_GPU_BATCH_MAX ? n : KVT_GPU_BATCH_MAX;
  const uint64_t min_copy = MIN_COPY < L->slot_bytes / 4 ? MIN_COPY : L->slot_bytes / 4;
  uint64_t nb, ne;
  span(kp, a, size, begin, end);
  *nl = 1;
  while (a + *nl < stop && !one_layer) {
    span(kp, a + *nl, size, &nb, &ne);
    const uint64_t cur = kvt_gpu_align(*end - *begin, 256);
    const uint64_t next = kvt_gpu_align(ne - *begin, 256);
    if ((group * next > target && cur >= min_copy) || next > target)
      break;
    *end = ne;
    (*nl)++;
  }
  *stride = kvt_gpu_align(*end - *begin, 256);
  const uint64_t fit = target / *stride;
  *per = fit < 1 ? 1 : fit > group ? group : (uint32_t)fit;
}

/* Whether every layer of a store fits one staging slot. */
static int store_stageable(const kvt_gpu_layout *L, const kvt_gpu_kparams *kp, uint64_t size) {
  if (!L->staging)
    return 0;
  for (uint32_t i = 0; i < kp->payload_layers; i++) {
    uint64_t b, e;
    store_span(kp, i, size, &b, &e);
    if (e - b > L->slot_bytes)
      return 0;
  }
  return 1;
}

/* After a failure midway through a staged transfer: work already queued on
 * stream and the copy stream may still use the slots and the caller's
 * memory. Marks slot (NSLOT: none) free after stream's work, joins the copy
 * stream into stream and waits for stream, so that nothing queued runs
 * once the call has returned its error. Best effort: errors are ignored
 * (the caller reports the first one). */
static void staged_abandon(kvt_gpu_layout *L, uint32_t slot, void *stream) {
  if (slot < NSLOT)
    (void)kvt_gpurt_event_record(L->ev_free[slot], stream);
  if (kvt_gpurt_event_record(L->ev_start, L->copy_stream) == 0)
    (void)kvt_gpurt_stream_wait(stream, L->ev_start);
  (void)kvt_gpurt_sync(stream);
  (void)kvt_gpurt_sync(L->copy_stream);
}

/* Where a staged store writes one payload: its pinned memory (host and
 * device addresses) and the slots it stores. */
typedef struct store_target {
  uint8_t *dst, *dst_dev;
  const int64_t *slots;
} store_target;

/* A store of n payloads of kp's shape (size bytes each; headers written)
 * into pinned memory through the staging slots, in pieces of whole layers
 * of up to KVT_GPU_BATCH_MAX payloads (as load_staged): the store kernel
 * writes a piece into a slot, the checksum kernels seal its sections there
 * (checksums into each dst's table, through its device address), and the
 * copy stream moves each payload's part to its dst while the next piece is
 * stored. The caller's stream waits for the last copy. */
static int store_staged(kvt_gpu_layout *L, const kvt_gpu_kparams *kp, const store_target *t,
                        uint32_t n, uint64_t size, void *stream) {
  const uint32_t stop = kp->payload_layers;
  uint64_t left = (size - kvt_gpu_sec_offset(kp, 0, 0)) * n;
  int e = 0;
  for (uint32_t a = 0; e == 0 && a < stop;) {
    uint64_t begin, end, stride;
    uint32_t nl, per, ni;
    plan_piece(L, kp, store_span, size, a, stop, n, left, 0, &nl, &begin, &end, &stride,
               &per);
    for (uint32_t i0 = 0; e == 0 && i0 < n; i0 += ni) {
      ni = n - i0 < per ? n - i0 : per;
      const uint32_t slot = take_slot(L);
      uint8_t *buf = L->staging + (uint64_t)slot * L->slot_bytes;
      kvt_gpu_kparams piece = *kp;
      piece.payload = (uint8_t *)((uintptr_t)buf - begin); /* section offsets stay the payload's */
      piece.slots = t[i0].slots;
      piece.first = a;
      piece.count = nl;
      if (a > 0 || i0 > 0)
        piece.flags |= KVT_GPU_KP_KEEP_STATUS; /* the first piece's launch reset it */
      uint64_t *dig = NULL; /* allocated before the slot is touched */
      if ((e = slot_digests(L, slot, &piece, ni, &dig)) != 0) {
        if (a > 0 || i0 > 0) /* earlier pieces' copies into dst are queued */
          staged_abandon(L, NSLOT, stream);
        return cuda_fail(L->ctx, e, "cudaMalloc of the checksum scratch");
      }
      /* One payload: kp's own fields (no item array to pass). A batch
       * passes its items whatever their number, so that a store's status
       * names the item (items.base). */
      const int batched = n > 1;
      kvt_gpu_items items;
      kvt_gpu_sec_items seals;
      items.n = seals.n = ni;
      items.base = i0;
      items.codes = batched ? L->item_codes : NULL;
      seals.reserved = 0;
      for (uint32_t k = 0; k < ni && batched; k++) {
        uint8_t *body = (uint8_t *)((uintptr_t)(buf + k * stride) - begin);
        const kvt_gpu_item one = {body, t[i0 + k].slots, NULL};
        const kvt_gpu_sec_item c = {t[i0 + k].dst_dev, body, NULL, NULL};
        items.it[k] = one;
        seals.it[k] = c;
      }
      const char *what = "staged store (copy stream, events)";
      if ((e = kvt_gpurt_stream_wait(stream, L->ev_free[slot])) != 0)
        break;
      const kvt_gpu_sections sec = {t[i0].dst_dev, piece.payload, begin, end, 2 * a, 2 * nl,
                                    KVT_FORMAT_VERSION, 1, max_section(&piece), dig,
                                    NULL, NULL, 0, slot_counter(L, slot), 0, 0};
      if ((e = kvt_gpurt_store_batch(&piece, batched ? &items : NULL, stream)) != 0)
        what = "store kernel launch";
      else if ((e = kvt_gpurt_sections_batch(&sec, batched ? &seals : NULL, stream)) != 0)
        what = "checksum kernel launch";
      else if ((e = kvt_gpurt_event_record(L->ev_copied[slot], stream)) == 0 &&
               (e = kvt_gpurt_stream_wait(L->copy_stream, L->ev_copied[slot])) == 0) {
        for (uint32_t k = 0; e == 0 && k < ni; k++)
          e = kvt_gpurt_copy_d2h_async(t[i0 + k].dst + begin, buf + k * stride, end - begin,
                                       L->copy_stream);
        if (e == 0)
          e = kvt_gpurt_event_record(L->ev_free[slot], L->copy_stream);
      }
      if (e) {
        staged_abandon(L, slot, stream);
        return cuda_fail(L->ctx, e, what);
      }
      const uint64_t moved = (uint64_t)ni * (end - begin);
      left -= left < moved ? left : moved;
    }
    a += nl;
  }
  if (e == 0 && (e = kvt_gpurt_event_record(L->ev_start, L->copy_stream)) == 0)
    e = kvt_gpurt_stream_wait(stream, L->ev_start);
  if (e) {
    staged_abandon(L, NSLOT, stream);
    return cuda_fail(L->ctx, e, "staged store (copy stream, events)");
  }
  return 0;
}

int kvt_gpu_store_async(kvt_gpu_layout *L, const kvt_gpu_store_params *p, void *dst, size_t cap,
                        size_t *len, void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  if (!dst || !len)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store: NULL destination or length");
  kvt_codec_spec spec;
  uint32_t model_layers = 0;
  uint64_t size;
  int rc = store_check(L, p, &spec, &model_layers, &size);
  if (rc)
    return rc;
  if (size > cap)
    return kvt_fail(ctx, KVT_ENOBUFS, "payload needs %" PRIu64 " bytes, %zu given", size, cap);
  int kind = 0;
  uint8_t *dev = NULL;
  if ((rc = payload_addr(ctx, dst, &kind, &dev)) != 0)
    return rc;
  kvt_gpu_kparams kp;
  if ((rc = fill_kparams(L, &spec, p->tokens, p->encode->layer_begin, p->layer_count, 0,
                         p->layer_count, p->slots, dev, 0, &kp)) != 0)
    return rc;
  int e;
  L->sealed_dst = NULL;
  L->batch_dst = NULL;
  if (kind == KVT_GPU_MEM_PINNED) {
    put_header(p, &spec, L->d.dtype, L->d.heads, L->d.head_dim, model_layers, &kp, size, dst);
    if (store_stageable(L, &kp, size)) {
      const store_target one = {dst, dev, p->slots};
      if ((rc = store_staged(L, &kp, &one, 1, size, stream)) != 0)
        return rc;
      L->sealed_dst = dst;
      *len = (size_t)size;
      return 0;
    }
  } else { /* device memory: the header goes over in stream order */
    uint8_t *hdr = kvt_alloc(ctx, kp.header_size, 64);
    if (!hdr)
      return kvt_fail(ctx, -ENOMEM, "kvt_gpu_store: header staging");
    put_header(p, &spec, L->d.dtype, L->d.heads, L->d.head_dim, model_layers, &kp, size, hdr);
    /* From pageable memory the copy has taken the bytes when it returns. */
    e = kvt_gpurt_copy_h2d_async(dev, hdr, kp.header_size, stream);
    kvt_dealloc(ctx, hdr);
    if (e)
      return cuda_fail(ctx, e, "cudaMemcpyAsync of the payload header");
  }
  if ((e = kvt_gpurt_store(&kp, stream)) != 0)
    return cuda_fail(ctx, e, "store kernel launch");
  if (kind == KVT_GPU_MEM_DEVICE) {
    uint64_t *dig = NULL;
    if ((e = digests_for(L, 2 * p->layer_count, &kp, &dig)) != 0)
      return cuda_fail(ctx, e, "cudaMalloc of the checksum scratch");
    if ((e = kvt_gpurt_seal(dev, size, 2 * p->layer_count, kp.header_size, KVT_FORMAT_VERSION,
                            max_section(&kp), dig, stream)) != 0)
      return cuda_fail(ctx, e, "checksum kernel launch");
  }
  *len = (size_t)size;
  return 0;
}

/* The store kernels' verdict, after the stream: 0, or KVT_ENONFINITE /
 * KVT_ERANGE naming where (and, for a batch, which item). */
static int store_status(kvt_gpu_layout *L, int batch) {
  kvt_gpu_status st;
  int e = kvt_gpurt_status((const kvt_gpu_status *)L->dev_aux, &st);
  if (e)
    return cuda_fail(L->ctx, e, "reading the store status");
  char item[32] = "";
  if (batch)
    snprintf(item, sizeof(item), "item %u: ", st.item);
  if (st.code == KVT_ENONFINITE)
    return kvt_fail(L->ctx, KVT_ENONFINITE, "%s%s layer %u token %u head %u dim %u is NaN or "
                    "Inf", item, st.kind ? "V" : "K", st.layer, st.token, st.head, st.dim);
  if (st.code)
    return kvt_fail(L->ctx, KVT_ERANGE, "%s%s layer %u token %u head %u (dim %u): the i4 range "
                    "does not fit the fp16 scale and zero", item, st.kind ? "V" : "K", st.layer,
                    st.token, st.head, st.dim);
  return 0;
}

int kvt_gpu_store_finish(kvt_gpu_layout *L, void *dst_, size_t len, void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  uint8_t *dst = dst_;
  /* Whether kvt_gpu_store_async sealed this payload on the GPU; forgotten on
   * every return, so a later store into the same memory is not mistaken. */
  const int gpu_sealed = dst && L->sealed_dst == dst;
  L->sealed_dst = NULL;
  int e = kvt_gpurt_sync(stream);
  if (e)
    return cuda_fail(ctx, e, "cudaStreamSynchronize after the store kernel");
  if ((e = store_status(L, 0)) != 0)
    return e;
  if (!dst || len < HDR_FIXED)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_finish: no payload");
  int kind = 0, rc;
  uint8_t *dev;
  if ((rc = payload_addr(ctx, dst, &kind, &dev)) != 0)
    return rc;
  if (kind == KVT_GPU_MEM_DEVICE)
    return 0; /* sealed on the GPU by the checksum kernels */
  kvt_payload_info h;
  kvt_header_get(dst, &h);
  if (h.header_size != kvt_header_size(h.sections) || h.header_size > len || h.size != len)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_finish: not the payload kvt_gpu_store_async "
                    "wrote (length %zu)", len);
  for (uint32_t i = 0; i < h.sections && !gpu_sealed; i++) {
    kvt_section_info s;
    kvt_section_entry_get(dst, i, &s);
    if (s.offset + s.stored_size > len)
      return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_finish: section %u outside the payload", i);
    kvt_section_entry_set_checksum(
        dst, i, kvt_section_checksum(h.version_major, dst + s.offset, s.stored_size));
  }
  kvt_header_seal(dst);
  return 0;
}

int kvt_gpu_store(kvt_gpu_layout *L, const kvt_gpu_store_params *p, void *dst, size_t cap,
                  size_t *len, void *stream) {
  int rc = kvt_gpu_store_async(L, p, dst, cap, len, stream);
  return rc ? rc : kvt_gpu_store_finish(L, dst, *len, stream);
}

/* A batch's item k failed its checks: the detail prefixed with the item. */
static int store_item_fail(kvt_ctx *ctx, uint32_t k, int rc) {
  char why[256];
  snprintf(why, sizeof(why), "%s", kvt_ctx_last_error(ctx));
  return kvt_fail(ctx, rc, "kvt_gpu_store_batch_async: item %u: %s", k, why);
}

/* Item k of an array whose items are items[0].struct_size bytes apart. */
static kvt_gpu_store_item *store_item(kvt_gpu_store_item *items, uint32_t k) {
  return (kvt_gpu_store_item *)(void *)((char *)items + (size_t)k * items->struct_size);
}

/* A batch's destinations in one word (FNV-1a over their addresses), so that
 * finish knows the items it is given for those of the batch in flight. */
static uint64_t batch_tag(kvt_gpu_store_item *items, uint32_t n) {
  uint64_t h = 14695981039346656037ull;
  for (uint32_t k = 0; k < n; k++) {
    h ^= (uint64_t)(uintptr_t)store_item(items, k)->dst;
    h *= 1099511628211ull;
  }
  return h;
}

int kvt_gpu_store_batch_async(kvt_gpu_layout *L, kvt_gpu_store_item *items_, uint32_t n,
                              void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  if (!items_ || !n)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_batch_async: no items");
  if (items_->struct_size < sizeof(*items_) ||
      items_->struct_size % _Alignof(kvt_gpu_store_item))
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_batch_async: items[0].struct_size %zu, at "
                    "least %zu and a multiple of %zu (KVT_GPU_STORE_ITEM_INIT)",
                    items_->struct_size, sizeof(*items_), _Alignof(kvt_gpu_store_item));
  store_target *t = kvt_alloc(ctx, (size_t)n * sizeof(*t), 64);
  if (!t)
    return kvt_fail(ctx, -ENOMEM, "kvt_gpu_store_batch_async: %u items", n);
  const kvt_gpu_store_params *p0 = items_->params; /* item 0's: the batch's geometry */
  kvt_codec_spec spec0;
  uint32_t ml0 = 0;
  uint64_t size0 = 0;
  kvt_gpu_kparams kp;
  int rc = 0;
  uint32_t k = 0;
  for (; k < n && rc == 0; k++) {
    const kvt_gpu_store_item *it = store_item(items_, k);
    const kvt_gpu_store_params *p = it->params;
    kvt_codec_spec spec;
    uint32_t ml = 0;
    uint64_t size = 0;
    int kind = 0;
    uint8_t *dev = NULL;
    if (!p) {
      rc = kvt_fail(ctx, -EINVAL, "NULL params");
      break;
    }
    if ((rc = store_check(L, p, &spec, &ml, &size)) != 0)
      break;
    if (k == 0) {
      spec0 = spec;
      ml0 = ml;
      size0 = size;
    } else if (memcmp(&spec, &spec0, sizeof(spec)) != 0 || ml != ml0 ||
               p->encode->layer_begin != p0->encode->layer_begin ||
               p->layer_count != p0->layer_count || p->tokens != p0->tokens) {
      rc = kvt_fail(ctx, KVT_ESHAPE, "its spec, layers %u+%u of %u or %u tokens differ from "
                    "item 0's (%u+%u of %u, %u tokens): a batch's chunks share one geometry",
                    p->encode->layer_begin, p->layer_count, ml, p->tokens,
                    p0->encode->layer_begin, p0->layer_count, ml0, p0->tokens);
      break;
    }
    if (!it->dst) {
      rc = kvt_fail(ctx, -EINVAL, "NULL destination");
      break;
    }
    if (size > it->cap) {
      rc = kvt_fail(ctx, KVT_ENOBUFS, "payload needs %" PRIu64 " bytes, %zu given", size,
                    it->cap);
      break;
    }
    if ((rc = payload_addr(ctx, it->dst, &kind, &dev)) != 0)
      break;
    if (kind != KVT_GPU_MEM_PINNED) {
      rc = kvt_fail(ctx, KVT_ENOTSUP, "the destination at %p is device memory: a batch "
                    "stores into pinned host memory (use kvt_gpu_store_async)", it->dst);
      break;
    }
    if (k == 0 && (rc = fill_kparams(L, &spec, p->tokens, p->encode->layer_begin,
                                     p->layer_count, 0, p->layer_count, p->slots, dev, 0,
                                     &kp)) != 0)
      break;
    const store_target one = {it->dst, dev, p->slots};
    t[k] = one;
  }
  if (rc) /* k: the item that failed */
    rc = store_item_fail(ctx, k, rc);
  else if (!store_stageable(L, &kp, size0))
    rc = kvt_fail(ctx, KVT_ENOTSUP, "kvt_gpu_store_batch_async: the handle has no staging "
                  "memory, or a layer of the chunk is larger than a staging slot (%" PRIu64
                  " bytes): use kvt_gpu_store_async", L->slot_bytes);
  else
    rc = distinct_ranges(ctx, items_, items_->struct_size, offsetof(kvt_gpu_store_item, dst),
                         size0, n, "kvt_gpu_store_batch_async", "destination");
  if (rc) { /* nothing launched: a store or batch in flight keeps its finish */
    kvt_dealloc(ctx, t);
    return rc;
  }
  int e = 0;
  if (n > L->item_words) { /* grown once per new largest batch (cudaFree waits) */
    kvt_gpurt_free(L->item_codes);
    L->item_codes = NULL;
    L->item_words = 0;
    if ((e = kvt_gpurt_malloc((void **)&L->item_codes, (size_t)n * sizeof(uint32_t))) == 0)
      L->item_words = n;
  }
  if (e == 0)
    e = kvt_gpurt_zero_async(L->item_codes, (size_t)n * sizeof(uint32_t), stream);
  if (e) {
    kvt_dealloc(ctx, t);
    return cuda_fail(ctx, e, "the batch's error codes (cudaMalloc, cudaMemsetAsync)");
  }
  L->sealed_dst = NULL;
  L->batch_dst = NULL;
  for (k = 0; k < n; k++) {
    kvt_gpu_store_item *it = store_item(items_, k);
    put_header(it->params, &spec0, L->d.dtype, L->d.heads, L->d.head_dim, ml0, &kp, size0,
               it->dst);
  }
  if ((rc = store_staged(L, &kp, t, n, size0, stream)) == 0) {
    for (k = 0; k < n; k++)
      store_item(items_, k)->len = (size_t)size0;
    L->batch_dst = items_->dst;
    L->batch_n = n;
    L->batch_tag = batch_tag(items_, n);
  }
  kvt_dealloc(ctx, t);
  return rc;
}

int kvt_gpu_store_batch_finish(kvt_gpu_layout *L, kvt_gpu_store_item *items, uint32_t n,
                               void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  const int ours = items && n && items->struct_size >= sizeof(*items) &&
                   items->struct_size % _Alignof(kvt_gpu_store_item) == 0 && L->batch_dst &&
                   L->batch_dst == items->dst && L->batch_n == n &&
                   L->batch_tag == batch_tag(items, n);
  if (!ours) /* the batch in flight, if any, keeps its finish */
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_batch_finish: not the items the last "
                    "kvt_gpu_store_batch_async on this handle stored");
  L->batch_dst = NULL;
  int e = kvt_gpurt_sync(stream);
  if (e)
    return cuda_fail(ctx, e, "cudaStreamSynchronize after the batched store");
  const int rc = store_status(L, 1);
  if (rc == 0) {
    for (uint32_t k = 0; k < n; k++)
      kvt_header_seal(store_item(items, k)->dst);
    return 0;
  }
  /* Seal the payloads that stored cleanly; a failed one's len becomes 0. */
  uint32_t *codes = kvt_alloc(ctx, (size_t)n * sizeof(uint32_t), 64);
  e = codes ? kvt_gpurt_copy_d2h(codes, L->item_codes, (size_t)n * sizeof(uint32_t)) : -ENOMEM;
  if (e) { /* none sealed: every payload counts as failed */
    for (uint32_t k = 0; k < n; k++)
      store_item(items, k)->len = 0;
    kvt_dealloc(ctx, codes);
    return rc;
  }
  char why[256];
  snprintf(why, sizeof(why), "%s", kvt_ctx_last_error(ctx));
  uint32_t failed = 0;
  for (uint32_t k = 0; k < n; k++) {
    kvt_gpu_store_item *it = store_item(items, k);
    if (codes[k]) {
      it->len = 0;
      failed++;
    } else {
      kvt_header_seal(it->dst);
    }
  }
  kvt_dealloc(ctx, codes);
  return kvt_fail(ctx, rc, "%s (%u of %u chunks failed, their len set to 0; the others are "
                  "sealed and valid)", why, failed, n);
}

/* ---- load ---- */

/* The header and table of a payload as host bytes: the payload itself when
 * it is host memory, else a copy of its first header_size bytes. */
static int load_header(kvt_ctx *ctx, const uint8_t *payload, size_t len, int kind, uint8_t **copy,
                       const uint8_t **hdr) {
  *copy = NULL;
  if (kind == KVT_GPU_MEM_PINNED) {
    *hdr = payload;
    return 0;
  }
  uint8_t fixed[HDR_FIXED];
  if (len < HDR_FIXED)
    return kvt_fail(ctx, KVT_ETRUNC, "payload of %zu bytes is shorter than the %d-byte header",
                    len, HDR_FIXED);
  int e = kvt_gpurt_copy_d2h(fixed, payload, HDR_FIXED);
  if (e)
    return cuda_fail(ctx, e, "cudaMemcpy of the payload header");
  kvt_payload_info h;
  kvt_header_get(fixed, &h);
  const uint32_t nsec = h.sections;
  uint64_t hsize = h.header_size;
  if (nsec == 0 || nsec % 2 || nsec > 2 * KVT_MAX_LAYERS || hsize != kvt_header_size(nsec) ||
      hsize > len)
    hsize = HDR_FIXED; /* let the parser name what is wrong */
  if (!(*copy = kvt_alloc(ctx, hsize, 64)))
    return kvt_fail(ctx, -ENOMEM, "payload header copy");
  if ((e = kvt_gpurt_copy_d2h(*copy, payload, hsize)) != 0) {
    kvt_dealloc(ctx, *copy);
    *copy = NULL;
    return cuda_fail(ctx, e, "cudaMemcpy of the payload header");
  }
  *hdr = *copy;
  return 0;
}

static int load_expect(kvt_ctx *ctx, const kvt_payload_info *in, const kvt_gpu_load_params *p) {
  char a[33], b[33];
  if (p->expect_key && memcmp(p->expect_key, &in->key, 16) != 0)
    return kvt_fail(ctx, KVT_EFOREIGN, "payload key %s, expected %s", kvt_key_hex(&in->key, a),
                    kvt_key_hex(p->expect_key, b));
  if (p->expect_fingerprint && memcmp(p->expect_fingerprint, &in->fingerprint, 16) != 0)
    return kvt_fail(ctx, KVT_EFOREIGN, "payload model fingerprint %s, expected %s",
                    kvt_key_hex(&in->fingerprint, a), kvt_key_hex(p->expect_fingerprint, b));
  return 0;
}

/* Every loaded section: plain (no lossless stage), where the kernel expects
 * it, and - for host payloads - its checksum. */
static int load_sections(kvt_ctx *ctx, const uint8_t *hdr, const uint8_t *body, unsigned major,
                         const kvt_gpu_kparams *kp) {
  for (uint32_t l = kp->first; l < kp->first + kp->count; l++)
    for (int kind = 0; kind < 2; kind++) {
      const uint32_t i = 2 * l + (uint32_t)kind;
      kvt_section_info s;
      kvt_section_entry_get(hdr, i, &s);
      const uint64_t off = s.offset, n = s.stored_size;
      if (s.comp != KVT_COMP_NONE)
        return kvt_fail(ctx, KVT_ENOTSUP, "section %u (layer %u %s) uses the lossless stage: "
                        "the GPU load reads plain sections only", i, kp->layer_begin + l,
                        kind ? "V" : "K");
      if (off != kvt_gpu_sec_offset(kp, l, kind) ||
          n != kvt_gpu_sec_size(kp, kp->layer_begin + l, kind))
        return kvt_fail(ctx, KVT_ECORRUPT, "section %u at %" PRIu64 "+%" PRIu64 " is not where "
                        "its shape puts it", i, off, n);
      if (body) {
        const uint64_t want = s.checksum, got = kvt_section_checksum(major, body + off, n);
        if (want != got)
          return kvt_fail(ctx, KVT_ECHECKSUM, "section %u (layer %u %s) at offset %" PRIu64
                          ": stored checksum %016" PRIx64 ", computed %016" PRIx64, i,
                          kp->layer_begin + l, kind ? "V" : "K", off, want, got);
      }
    }
  return 0;
}

static int load_check(kvt_gpu_layout *L, const kvt_payload_info *in,
                      const kvt_gpu_load_params *p, uint32_t *count) {
  kvt_ctx *ctx = L->ctx;
  int rc = load_expect(ctx, in, p);
  if (rc)
    return rc;
  *count = p->layer_count ? p->layer_count
                          : (p->layer_first < in->layers ? in->layers - p->layer_first : 0);
  if (p->layer_first >= in->layers || *count > in->layers - p->layer_first)
    return kvt_fail(ctx, -EINVAL, "layers %u+%u requested from a payload of %u", p->layer_first,
                    *count, in->layers);
  if (in->dtype != L->d.dtype || in->heads != L->d.heads || in->head_dim != L->d.head_dim ||
      in->tokens != p->tokens)
    return kvt_fail(ctx, KVT_ESHAPE, "payload %s %u tokens x %u heads x %u dim; layout %s "
                    "%u slots x %u heads x %u dim", kvt_dtype_name(in->dtype), in->tokens,
                    in->heads, in->head_dim, kvt_dtype_name(L->d.dtype), p->tokens, L->d.heads,
                    L->d.head_dim);
  return 0;
}

/* The loaded sections' checksums of a device payload, on the GPU; waits. */
/* The detail of a verify's mismatch `bad` on the GPU (a section, or
 * KVT_GPU_BAD_HEADER) in ctx: KVT_ECHECKSUM or KVT_EFOREIGN. */
static int gpu_mismatch(kvt_ctx *ctx, uint32_t bad, uint32_t layer_begin) {
  if (bad == KVT_GPU_BAD_HEADER)
    return kvt_fail(ctx, KVT_EFOREIGN, "the device payload's header checksum is not that of "
                    "the header copy passed with it (another payload, or a damaged header); "
                    "nothing was loaded");
  return kvt_fail(ctx, KVT_ECHECKSUM, "section %u (layer %u %s) of the payload: checksum "
                  "mismatch (computed on the GPU); its layers were not loaded, treat the chunk "
                  "as a miss", bad, layer_begin + bad / 2, bad % 2 ? "V" : "K");
}

static int verify_on_gpu(kvt_gpu_layout *L, const uint8_t *dev, size_t len, unsigned major,
                         const kvt_gpu_kparams *kp, const uint64_t *expect_header,
                         void *stream) {
  kvt_gpu_status *st = (kvt_gpu_status *)L->dev_aux, host;
  uint64_t *dig = NULL;
  int e = major >= 2 ? digests_for(L, 2 * kp->count, kp, &dig) : 0;
  if (e == 0)
    e = kvt_gpurt_verify(dev, len, 2 * kp->first, 2 * kp->count, major, max_section(kp), dig,
                         st, expect_header, stream);
  if (e == 0)
    e = kvt_gpurt_sync(stream);
  if (e == 0)
    e = kvt_gpurt_status(st, &host);
  if (e)
    return cuda_fail(L->ctx, e, "checksum kernel");
  if (host.bad_section != UINT32_MAX)
    return gpu_mismatch(L->ctx, host.bad_section, kp->layer_begin);
  return 0;
}

/* Launches the load of kp's layers (of the payloads of items, or NULL: of
 * kp's one): one kernel, or with events one per layer, recording
 * events[ev0 + i] after layer kp->first + i. */
static int launch_layers(kvt_gpu_layout *L, const kvt_gpu_kparams *kp, const kvt_gpu_items *items,
                         void *const *events, uint32_t ev0, void *stream) {
  if (!events) {
    const int e = kvt_gpurt_load_batch(kp, items, stream);
    return e ? cuda_fail(L->ctx, e, "load kernel launch") : 0;
  }
  kvt_gpu_kparams one = *kp;
  for (uint32_t i = 0; i < kp->count; i++) {
    one.first = kp->first + i;
    one.count = 1;
    int e = kvt_gpurt_load_batch(&one, items, stream);
    if (e)
      return cuda_fail(L->ctx, e, "load kernel launch");
    if ((e = kvt_gpurt_event_record(events[ev0 + i], stream)) != 0)
      return cuda_fail(L->ctx, e, "cudaEventRecord after a layer");
  }
  return 0;
}

/* Bytes of the loaded layers' sections. */
static uint64_t loaded_bytes(const kvt_gpu_kparams *kp) {
  uint64_t b0, e0, b1, e1;
  layer_span(kp, kp->first, &b0, &e0);
  layer_span(kp, kp->first + kp->count - 1, &b1, &e1);
  return e1 - b0;
}

/* Whether every loaded layer fits one staging slot. */
static int stageable(const kvt_gpu_layout *L, const kvt_gpu_kparams *kp) {
  for (uint32_t i = kp->first; i < kp->first + kp->count; i++) {
    uint64_t b, e;
    layer_span(kp, i, &b, &e);
    if (e - b > L->slot_bytes)
      return 0;
  }
  return 1;
}

/* Pieces of whole layers, so the copy of one overlaps the kernel of the one
 * before and only the last piece's kernel is left after the copies end.
 * Each piece costs host calls and cross-stream waits, so there are few. */
/* What the checksum kernels of a load verified on the GPU need: the
 * payload's table (device-accessible), its format and the verdict's device
 * address. */
typedef struct gpu_check {
  uint8_t *table;
  unsigned major;
  uint32_t *verdict;
  int check_header;       /* a device payload loaded with a caller's header copy: */
  uint64_t expect_header; /* the copy's header checksum */
} gpu_check;

/* Queues the checks of piece's layers (payload bytes [lo, hi) at body + lo;
 * with items, of items->n payloads, each with its own table, body, gate
 * and verdict) on stream, gating piece's load kernels on slot's gates. */
static int check_piece(kvt_gpu_layout *L, const gpu_check *chk, uint32_t slot,
                       kvt_gpu_kparams *piece, const uint8_t *body, uint64_t lo, uint64_t hi,
                       int last, const kvt_gpu_sec_items *items, void *stream) {
  uint64_t *dig = NULL;
  int e = chk->major >= 2 ? slot_digests(L, slot, piece, items ? items->n : 1, &dig) : 0;
  if (e)
    return cuda_fail(L->ctx, e, "cudaMalloc of the checksum scratch");
  const kvt_gpu_sections sec = {chk->table,          body,
                                lo,                  hi,
                                2 * piece->first,    2 * piece->count,
                                chk->major,          0,
                                max_section(piece),  dig,
                                slot_gate(L, slot, 0), chk->verdict,
                                last,                slot_counter(L, slot),
                                chk->check_header,   chk->expect_header};
  if ((e = kvt_gpurt_sections_batch(&sec, items, stream)) != 0)
    return cuda_fail(L->ctx, e, "checksum kernel launch");
  piece->gate = slot_gate(L, slot, 0);
  return 0;
}

/* One payload of a staged load: where the copies read it, its slots, the
 * device address of its byte 0 (its table, for a load verified on the GPU)
 * and of its verdict. */
typedef struct staged_item {
  const uint8_t *host;
  const int64_t *slots;
  uint8_t *table;
  uint32_t *verdict;
} staged_item;

/* Pieces of whole layers, so the copy of one overlaps the kernel of the one
 * before and only the last piece's kernel is left after the copies end.
 * Each piece costs host calls and cross-stream waits, so there are few. A
 * piece holds a layer range of up to KVT_GPU_BATCH_MAX payloads (one copy
 * each), checked and loaded by one launch each. chk: NULL, or the check on
 * the GPU (its table and verdict are the items'). events: recorded after
 * each layer of every payload. */
static int load_staged(kvt_gpu_layout *L, const staged_item *it, uint32_t n,
                       const kvt_gpu_kparams *kp, const gpu_check *chk, void *const *events,
                       void *stream) {
  const uint32_t stop = kp->first + kp->count;
  uint64_t left = loaded_bytes(kp) * n;
  int e = kvt_gpurt_event_record(L->ev_start, stream);
  if (e == 0)
    e = kvt_gpurt_stream_wait(L->copy_stream, L->ev_start);
  for (uint32_t a = kp->first; e == 0 && a < stop;) {
    uint64_t begin, end, stride;
    uint32_t nl, per, ni;
    plan_piece(L, kp, load_span, 0, a, stop, n, left, events && n > 1 && a == kp->first, &nl,
               &begin, &end, &stride, &per);
    for (uint32_t i0 = 0; e == 0 && i0 < n; i0 += ni) {
      ni = n - i0 < per ? n - i0 : per;
      const uint32_t slot = take_slot(L);
      uint8_t *buf = L->staging + (uint64_t)slot * L->slot_bytes;
      if ((e = kvt_gpurt_stream_wait(L->copy_stream, L->ev_free[slot])) != 0)
        break;
      for (uint32_t k = 0; e == 0 && k < ni; k++)
        e = kvt_gpurt_copy_h2d_async(buf + k * stride, it[i0 + k].host + begin, end - begin,
                                     L->copy_stream);
      if (e || (e = kvt_gpurt_event_record(L->ev_copied[slot], L->copy_stream)) != 0 ||
          (e = kvt_gpurt_stream_wait(stream, L->ev_copied[slot])) != 0)
        break;
      kvt_gpu_kparams piece = *kp;
      piece.payload = (uint8_t *)((uintptr_t)buf - begin); /* section offsets stay the payload's */
      piece.slots = it[i0].slots;
      piece.first = a;
      piece.count = nl;
      /* One payload: kp's own fields (no item array to pass). */
      kvt_gpu_items items;
      kvt_gpu_sec_items checks;
      items.n = checks.n = ni;
      items.base = i0;
      items.codes = NULL;
      checks.reserved = 0;
      for (uint32_t k = 0; k < ni && ni > 1; k++) {
        uint8_t *body = (uint8_t *)((uintptr_t)(buf + k * stride) - begin);
        const kvt_gpu_item one = {body, it[i0 + k].slots, chk ? slot_gate(L, slot, k) : NULL};
        const kvt_gpu_sec_item c = {it[i0 + k].table, body, slot_gate(L, slot, k),
                                    it[i0 + k].verdict};
        items.it[k] = one;
        checks.it[k] = c;
      }
      int rc = 0;
      if (chk) {
        const gpu_check c1 = {it[i0].table, chk->major, it[i0].verdict, 0, 0};
        rc = check_piece(L, &c1, slot, &piece, piece.payload, begin, end, a + nl == stop,
                         ni > 1 ? &checks : NULL, stream);
      }
      /* Layer events go after the last payloads' launches (stream order:
       * the earlier ones' layers are loaded by then). */
      if (rc == 0)
        rc = launch_layers(L, &piece, ni > 1 ? &items : NULL, i0 + ni == n ? events : NULL,
                           a - kp->first, stream);
      if (rc) {
        staged_abandon(L, slot, stream);
        return rc;
      }
      if ((e = kvt_gpurt_event_record(L->ev_free[slot], stream)) != 0)
        break;
      const uint64_t moved = (uint64_t)ni * (end - begin);
      left -= left < moved ? left : moved;
    }
    a += nl;
  }
  if (e) {
    staged_abandon(L, NSLOT, stream);
    return cuda_fail(L->ctx, e, "staged load (copy stream, events)");
  }
  return 0;
}

/* A device payload verified on the GPU: the checksum kernels of every
 * loaded section, then the load gated on their verdict, all in stream
 * order; a slot's gate and digest scratch, ordered by its events as a
 * staged load's. (Hashing 8 MiB of layers before each one's load, for L2
 * hits, measured 4x slower on an H200: the small launches do not fill the
 * GPU.) */
static int load_device_checked(kvt_gpu_layout *L, const uint8_t *dev, size_t len,
                               kvt_gpu_kparams *kp, const gpu_check *chk, void *const *events,
                               void *stream) {
  const uint32_t slot = take_slot(L);
  int e = kvt_gpurt_stream_wait(stream, L->ev_free[slot]);
  if (e)
    return cuda_fail(L->ctx, e, "cudaStreamWaitEvent");
  int rc = check_piece(L, chk, slot, kp, dev, 0, len, 1, NULL, stream);
  if (rc == 0)
    rc = launch_layers(L, kp, NULL, events, 0, stream);
  if (rc) {
    staged_abandon(L, slot, stream);
    return rc;
  }
  if ((e = kvt_gpurt_event_record(L->ev_free[slot], stream)) != 0) {
    staged_abandon(L, NSLOT, stream);
    return cuda_fail(L->ctx, e, "cudaEventRecord");
  }
  return 0;
}

int kvt_gpu_verdict_check(kvt_gpu_layout *L, const kvt_gpu_verdict *v) {
  if (!L)
    return -EINVAL;
  kvt_clear_error(L->ctx);
  if (!v)
    return kvt_fail(L->ctx, -EINVAL, "kvt_gpu_verdict_check: NULL verdict");
  /* Acquire: bad_section is written before done (a system fence between). */
  if (!__atomic_load_n(&v->done, __ATOMIC_ACQUIRE))
    return kvt_fail(L->ctx, -EAGAIN, "the load's checks have not run yet: wait for its stream "
                    "before reading the verdict");
  const uint32_t bad = __atomic_load_n(&v->bad_section, __ATOMIC_RELAXED);
  return bad == UINT32_MAX ? 0 : gpu_mismatch(L->ctx, bad, v->layer_begin);
}

KVT_GPU_STATIC_ASSERT(offsetof(kvt_gpu_verdict, done) == 4 * KVT_GPU_VERDICT_DONE,
                      "verdict words");
KVT_GPU_STATIC_ASSERT(offsetof(kvt_gpu_verdict, bad_section) == 4 * KVT_GPU_VERDICT_BAD,
                      "verdict words");

/* A load's verdict before the launch: no mismatch, and done unless the GPU
 * checks the load (else every check has run). */
static void verdict_reset(kvt_gpu_verdict *v, uint32_t layer_begin, uint32_t count,
                          int gpu_checked) {
  memset(v, 0, sizeof(*v));
  v->bad_section = UINT32_MAX;
  v->layer_begin = layer_begin;
  v->sections = 2 * count;
  v->done = gpu_checked ? 0 : 1;
}

int kvt_gpu_load(kvt_gpu_layout *L, const void *payload, size_t len,
                 const kvt_gpu_load_params *p, void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  if (!payload || !p || p->struct_size < offsetof(kvt_gpu_load_params, header) || !p->slots)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_load: NULL payload, params or slots");
  const int has_header =
      p->struct_size >= offsetof(kvt_gpu_load_params, verdict) && p->header;
  kvt_gpu_verdict *verdict =
      p->struct_size >= sizeof(*p) ? p->verdict : NULL;
  int kind, rc;
  uint8_t *dev = NULL, *copy = NULL;
  const uint8_t *hdr = NULL;
  if ((rc = payload_addr(ctx, payload, &kind, &dev)) != 0)
    return rc;
  if (kind == KVT_GPU_MEM_DEVICE && has_header) {
    kvt_payload_info h;
    memset(&h, 0, sizeof(h));
    if (p->header_len >= HDR_FIXED)
      kvt_header_get(p->header, &h);
    if (p->header_len < HDR_FIXED || p->header_len > len || h.header_size > p->header_len)
      return kvt_fail(ctx, -EINVAL, "kvt_gpu_load: a header copy of %zu bytes, for a payload "
                      "of %zu whose header says %u", p->header_len, len, h.header_size);
    hdr = p->header;
  } else if ((rc = load_header(ctx, payload, len, kind, &copy, &hdr)) != 0) {
    return rc;
  }
  /* For a device payload only the header bytes are host-side: the parser
   * reads nothing past header_size (it checks len against the header's
   * payload_size and the table's offsets, and reads no section body). */
  kvt_payload_info in;
  uint32_t count = 0;
  kvt_gpu_kparams kp;
  int gpu_checked = 0;
  uint32_t *vdev = NULL;
  if (verdict) {
    int vkind = 0;
    void *vd = NULL;
    int e = kvt_gpurt_pointer(verdict, &vkind, &vd);
    if (e) {
      kvt_dealloc(ctx, copy);
      return cuda_fail(ctx, e, "cudaPointerGetAttributes of the verdict");
    }
    if (vkind != KVT_GPU_MEM_PINNED || !vd || (uintptr_t)verdict % 4) {
      kvt_dealloc(ctx, copy);
      return kvt_fail(ctx, -EINVAL, "kvt_gpu_load: the verdict at %p must be pinned host "
                      "memory mapped into the device (cudaHostAlloc)", (void *)verdict);
    }
    vdev = vd;
  }
  if ((rc = kvt_payload_parse(ctx, hdr, len, &in)) == 0 &&
      (rc = load_check(L, &in, p, &count)) == 0 &&
      (rc = fill_kparams(L, &in.spec, in.tokens, in.layer_begin, in.layers, p->layer_first, count,
                         p->slots, dev,
                         kind == KVT_GPU_MEM_PINNED ? CHUNK_LOAD_HOST : CHUNK_LOAD_DEVICE,
                         &kp)) == 0) {
    /* With a verdict the GPU verifies where it can: a device payload, or a
     * pinned one it stages (ZERO_COPY asks for neither). */
    const uint32_t trust = kind == KVT_GPU_MEM_PINNED ? KVT_GPU_LOAD_TRUST_HOST
                                                      : KVT_GPU_LOAD_TRUST_DEVICE;
    gpu_checked = verdict && L->staging && !(p->flags & trust) &&
                  (kind == KVT_GPU_MEM_DEVICE ||
                   (!(p->flags & KVT_GPU_LOAD_ZERO_COPY) && stageable(L, &kp)));
    const int host_check =
        kind == KVT_GPU_MEM_PINNED && !(p->flags & KVT_GPU_LOAD_TRUST_HOST) && !gpu_checked;
    rc = load_sections(ctx, hdr, host_check ? payload : NULL, in.version_major, &kp);
  }
  kvt_dealloc(ctx, copy);
  /* A caller's header copy: the device table the kernels read must be the
   * header checked here (its checksum field, which covers the table). */
  const int copy_used = kind == KVT_GPU_MEM_DEVICE && has_header;
  const uint64_t expect_header = copy_used ? kvt_ld64(hdr + KVT_PL_HEADER_CHECKSUM) : 0;
  if (rc == 0 && kind == KVT_GPU_MEM_DEVICE && !(p->flags & KVT_GPU_LOAD_TRUST_DEVICE) &&
      !gpu_checked)
    rc = verify_on_gpu(L, dev, len, in.version_major, &kp, copy_used ? &expect_header : NULL,
                       stream);
  if (rc)
    return rc;
  gpu_check chk = {dev, in.version_major, vdev, copy_used, expect_header};
  if (verdict)
    verdict_reset(verdict, in.layer_begin, count, gpu_checked);
  if (gpu_checked && kind == KVT_GPU_MEM_DEVICE)
    return load_device_checked(L, dev, len, &kp, &chk, p->layer_events, stream);
  if (kind == KVT_GPU_MEM_PINNED && L->staging && !(p->flags & KVT_GPU_LOAD_ZERO_COPY) &&
      stageable(L, &kp) &&
      (gpu_checked || (p->flags & KVT_GPU_LOAD_STAGED) ||
       loaded_bytes(&kp) >= STAGE_MIN_BYTES)) {
    set_chunk(L, &in.spec, CHUNK_LOAD_DEVICE, 1, &kp); /* the kernel reads the staging slots */
    const staged_item one = {(const uint8_t *)payload, p->slots, dev, vdev};
    return load_staged(L, &one, 1, &kp, gpu_checked ? &chk : NULL, p->layer_events, stream);
  }
  return launch_layers(L, &kp, NULL, p->layer_events, 0, stream);
}

/* ---- batched loads ---- */

/* A batch item's failure: the detail prefixed with the item, rc kept. */
static int item_fail(kvt_ctx *ctx, uint32_t k, int rc) {
  char why[256];
  snprintf(why, sizeof(why), "%s", kvt_ctx_last_error(ctx));
  return kvt_fail(ctx, rc, "kvt_gpu_load_batch: item %u: %s", k, why);
}

/* The device address of a verdict (pinned, mapped host memory). */
static int verdict_addr(kvt_ctx *ctx, kvt_gpu_verdict *v, uint32_t **dev) {
  int vkind = 0;
  void *vd = NULL;
  int e = kvt_gpurt_pointer(v, &vkind, &vd);
  if (e)
    return cuda_fail(ctx, e, "cudaPointerGetAttributes of the verdict");
  if (vkind != KVT_GPU_MEM_PINNED || !vd || (uintptr_t)v % 4)
    return kvt_fail(ctx, -EINVAL, "the verdict at %p must be pinned host memory mapped into "
                    "the device (cudaHostAlloc)", (void *)v);
  *dev = vd;
  return 0;
}

/* Checks item k of a batch on the host (kvt_gpu_load's checks) and that it
 * has item 0's geometry (*first, filled from item 0); the staged item's
 * addresses go to *out. host_check: verify the loaded sections' checksums
 * here (no GPU verify); kp: item 0's launch parameters (filled at k 0). */
static int batch_item(kvt_gpu_layout *L, const kvt_gpu_load_item *item, uint32_t k,
                      const kvt_gpu_load_params *p, kvt_payload_info *first,
                      kvt_gpu_kparams *kp, int host_check, staged_item *out) {
  kvt_ctx *ctx = L->ctx;
  int kind = 0, rc;
  uint8_t *dev = NULL;
  if (!item->payload || !item->slots)
    return kvt_fail(ctx, -EINVAL, "NULL payload or slots");
  if ((rc = payload_addr(ctx, item->payload, &kind, &dev)) != 0)
    return rc;
  if (kind != KVT_GPU_MEM_PINNED)
    return kvt_fail(ctx, KVT_ENOTSUP, "the payload at %p is in device memory: a batch loads "
                    "pinned host payloads (use kvt_gpu_load)", item->payload);
  kvt_gpu_load_params one = *p;
  one.expect_key = item->expect_key;
  kvt_payload_info in;
  memset(&in, 0, sizeof(in));
  uint32_t count = 0;
  if ((rc = kvt_payload_parse(ctx, item->payload, item->len, &in)) != 0 ||
      (rc = load_check(L, &in, &one, &count)) != 0)
    return rc;
  if (k == 0) {
    *first = in;
    if ((rc = fill_kparams(L, &in.spec, in.tokens, in.layer_begin, in.layers, p->layer_first,
                           count, item->slots, dev, CHUNK_LOAD_HOST, kp)) != 0)
      return rc;
  } else if (memcmp(&in.spec, &first->spec, sizeof(in.spec)) != 0 ||
             in.layer_begin != first->layer_begin || in.layers != first->layers ||
             in.version_major != first->version_major ||
             in.header_size != first->header_size) {
    return kvt_fail(ctx, KVT_ESHAPE, "its spec, layers %u+%u or format %u differ from item "
                    "0's (%u+%u, format %u): a batch's payloads share one geometry",
                    in.layer_begin, in.layers, in.version_major, first->layer_begin,
                    first->layers, first->version_major);
  }
  if ((rc = load_sections(ctx, item->payload, host_check ? item->payload : NULL,
                          in.version_major, kp)) != 0)
    return rc;
  out->host = item->payload;
  out->slots = item->slots;
  out->table = dev;
  out->verdict = NULL;
  if (item->verdict && (rc = verdict_addr(ctx, item->verdict, &out->verdict)) != 0)
    return rc;
  return 0;
}

/* Item k of an array whose items are items[0].struct_size bytes apart. */
static const kvt_gpu_load_item *load_item(const kvt_gpu_load_item *items, uint32_t k) {
  return (const kvt_gpu_load_item *)(const void *)((const char *)items +
                                                   (size_t)k * items->struct_size);
}

/* A batch the kernels read from host memory (zero copy), up to
 * KVT_GPU_BATCH_MAX payloads a launch; layer events after the last group's
 * layers. */
static int load_in_place(kvt_gpu_layout *L, const staged_item *st, uint32_t n,
                         const kvt_gpu_kparams *kp, void *const *events, void *stream) {
  kvt_gpu_items group;
  int rc = 0;
  for (uint32_t i0 = 0; rc == 0 && i0 < n; i0 += group.n) {
    group.n = n - i0 < KVT_GPU_BATCH_MAX ? n - i0 : KVT_GPU_BATCH_MAX;
    group.base = i0;
    group.codes = NULL;
    for (uint32_t k = 0; k < group.n; k++) {
      const kvt_gpu_item one = {st[i0 + k].table, st[i0 + k].slots, NULL};
      group.it[k] = one;
    }
    rc = launch_layers(L, kp, &group, i0 + group.n == n ? events : NULL, 0, stream);
  }
  if (rc) /* earlier groups' kernels may still read the payloads: let them end */
    (void)kvt_gpurt_sync(stream);
  return rc;
}

int kvt_gpu_load_batch(kvt_gpu_layout *L, const kvt_gpu_load_item *items_, uint32_t n,
                       const kvt_gpu_load_params *p, void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  if (!items_ || !n || !p || p->struct_size < sizeof(*p))
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_load_batch: NULL items or params, or old params");
  if (items_->struct_size < sizeof(*items_) ||
      items_->struct_size % _Alignof(kvt_gpu_load_item))
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_load_batch: items[0].struct_size %zu, at least %zu "
                    "and a multiple of %zu (KVT_GPU_LOAD_ITEM_INIT)", items_->struct_size,
                    sizeof(*items_), _Alignof(kvt_gpu_load_item));
  if (p->expect_key || p->slots || p->header || p->verdict)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_load_batch: expect_key, slots, header and verdict "
                    "are per payload (kvt_gpu_load_item), not in the shared params");
  const int verdicts = load_item(items_, 0)->verdict != NULL;
  for (uint32_t k = 1; k < n; k++)
    if ((load_item(items_, k)->verdict != NULL) != verdicts)
      return kvt_fail(ctx, -EINVAL, "kvt_gpu_load_batch: item %u %s a verdict and item 0 "
                      "%s: all items have one or none does", k,
                      verdicts ? "lacks" : "has", verdicts ? "has" : "does not");
  int rc = verdicts ? distinct_ranges(ctx, items_, items_->struct_size,
                                      offsetof(kvt_gpu_load_item, verdict),
                                      sizeof(kvt_gpu_verdict), n, "kvt_gpu_load_batch",
                                      "verdict")
                    : 0;
  if (rc)
    return rc;
  staged_item *st = kvt_alloc(ctx, (size_t)n * sizeof(*st), 64);
  if (!st)
    return kvt_fail(ctx, -ENOMEM, "kvt_gpu_load_batch: %u items", n);
  /* Item 0 first, for the geometry; then whether the GPU verifies, which
   * decides whether the others' sections are hashed here. */
  kvt_payload_info first;
  kvt_gpu_kparams kp;
  rc = batch_item(L, load_item(items_, 0), 0, p, &first, &kp, 0, &st[0]);
  const int gpu_checked = rc == 0 && verdicts && L->staging && first.version_major >= 2 &&
                          !(p->flags & (KVT_GPU_LOAD_TRUST_HOST | KVT_GPU_LOAD_ZERO_COPY)) &&
                          stageable(L, &kp);
  const int host_check = !(p->flags & KVT_GPU_LOAD_TRUST_HOST) && !gpu_checked;
  if (rc == 0 && host_check)
    rc = load_sections(ctx, st[0].host, st[0].host, first.version_major, &kp);
  if (rc) {
    kvt_dealloc(ctx, st);
    return item_fail(ctx, 0, rc);
  }
  for (uint32_t k = 1; k < n; k++)
    if ((rc = batch_item(L, load_item(items_, k), k, p, &first, &kp, host_check, &st[k]))) {
      kvt_dealloc(ctx, st);
      return item_fail(ctx, k, rc);
    }
  for (uint32_t k = 0; k < n && verdicts; k++)
    verdict_reset(load_item(items_, k)->verdict, first.layer_begin, kp.count, gpu_checked);
  const int staged = L->staging && !(p->flags & KVT_GPU_LOAD_ZERO_COPY) && stageable(L, &kp) &&
                     (gpu_checked || (p->flags & KVT_GPU_LOAD_STAGED) ||
                      loaded_bytes(&kp) * n >= STAGE_MIN_BYTES);
  if (staged) {
    const gpu_check chk = {NULL, first.version_major, NULL, 0, 0};
    set_chunk(L, &first.spec, CHUNK_LOAD_DEVICE, n < KVT_GPU_BATCH_MAX ? n : KVT_GPU_BATCH_MAX,
              &kp);
    rc = load_staged(L, st, n, &kp, gpu_checked ? &chk : NULL, p->layer_events, stream);
  } else {
    rc = load_in_place(L, st, n, &kp, p->layer_events, stream);
  }
  kvt_dealloc(ctx, st);
  return rc;
}

#endif
