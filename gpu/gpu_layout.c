/* gpu/gpu_layout.c - the GPU layout handle (kvtier/gpu.h): the descriptor
 * fillers, registration (device pointer table, status word, staging slots,
 * copy stream, events, checksum scratch) and host memory pinning; and what
 * the store (gpu_store.c) and load (gpu_load.c) paths share to plan their
 * launches: kernel parameters, staged pieces, the slots' digest scratch.
 * Plain C: the CUDA runtime is reached only through gpu_runtime.cu's
 * wrappers, so this file also builds without CUDA, where every call but the
 * fillers returns KVT_ENOTSUP. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu_api_internal.h"

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

#else

#define GATE_WORDS (NSLOT * KVT_GPU_BATCH_MAX + NSLOT)

/* Digest words made at layout creation: payloads up to 32 MiB (a 256-token
 * chunk of a 32-layer, 8-head, 128-dim bf16 model) need no allocation on
 * the data path. */
#define DIGESTS_AT_CREATE 8192u

/* Digest scratch for the format 2 checksums of count sections of kp's
 * shape; grows L->digests for larger payloads (cudaFree waits for the
 * device's work: once per new largest size). */
int gpu_digests_for(kvt_gpu_layout *L, uint32_t count, const kvt_gpu_kparams *kp,
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
int gpu_slot_digests(kvt_gpu_layout *L, uint32_t slot, const kvt_gpu_kparams *kp,
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
int gpu_payload_addr(kvt_ctx *ctx, const void *p, int *kind, uint8_t **dev) {
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
int gpu_distinct_ranges(kvt_ctx *ctx, const void *items, size_t stride, size_t field,
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
void gpu_set_chunk(kvt_gpu_layout *L, const kvt_codec_spec *spec, int mode, uint32_t items,
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

int gpu_fill_kparams(kvt_gpu_layout *L, const kvt_codec_spec *spec, uint32_t tokens,
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
  gpu_set_chunk(L, spec, load, 1, kp);
  return 0;
}

/* The bytes of the next staged piece, `left` bytes to go: half of them (at
 * least 8 MiB: each piece costs host calls and launches; 8 MiB gave verified
 * loads of 10 MiB payloads 4-8% more than 2 MiB on an H200), at most a slot. */
static uint64_t piece_target(const kvt_gpu_layout *L, uint64_t left) {
  uint64_t t = left / 2 < (8u << 20) ? (8u << 20) : left / 2;
  return t < L->slot_bytes ? t : L->slot_bytes;
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
void gpu_plan_piece(const kvt_gpu_layout *L, const kvt_gpu_kparams *kp, span_fn span,
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

/* After a failure midway through a staged transfer: work already queued on
 * stream and the copy stream may still use the slots and the caller's
 * memory. Marks slot (NSLOT: none) free after stream's work, joins the copy
 * stream into stream and waits for stream, so that nothing queued runs
 * once the call has returned its error. Best effort: errors are ignored
 * (the caller reports the first one). */
void gpu_staged_abandon(kvt_gpu_layout *L, uint32_t slot, void *stream) {
  if (slot < NSLOT)
    (void)kvt_gpurt_event_record(L->ev_free[slot], stream);
  if (kvt_gpurt_event_record(L->ev_start, L->copy_stream) == 0)
    (void)kvt_gpurt_stream_wait(stream, L->ev_start);
  (void)kvt_gpurt_sync(stream);
  (void)kvt_gpurt_sync(L->copy_stream);
}

#endif
