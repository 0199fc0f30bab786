/* gpu/attn_api.c - the public decode-attention calls (kvtier/attn.h): shape
 * checks, the split choice and workspace arithmetic, and the launches
 * through attn_kernels.cu's launchers. Plain C; without CUDA the checks
 * still run and the calls then return KVT_ENOTSUP. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kvt_attn_layout.h"
#include "kvt_gpu_layout.h" /* kvt_gpurt_error_string */
#include "kvt_internal.h"
#include "kvtier/attn.h"
#include "kvtier/codec.h"

size_t kvt_attn_row_bytes(int format, uint32_t head_dim, int is_value) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    return 0;
  switch (format) {
  case KVT_ATTN_RAW:
    return 2 * (size_t)head_dim;
  case KVT_ATTN_K16V8:
    return is_value ? head_dim : 2 * (size_t)head_dim;
  case KVT_ATTN_FP8:
    return head_dim;
  case KVT_ATTN_INT4:
    return head_dim / 2;
  default:
    return 0;
  }
}

size_t kvt_attn_scale_bytes(int format, uint32_t head_dim, int is_value) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    return 0;
  switch (format) {
  case KVT_ATTN_K16V8:
    return is_value ? 4 : 0;
  case KVT_ATTN_FP8:
    return 4;
  case KVT_ATTN_INT4:
    return 4 * (size_t)(head_dim / 32);
  default:
    return 0;
  }
}

uint32_t kvt_attn_num_splits(uint64_t ctas, uint32_t max_seq_len,
                             uint32_t sm_count) {
  if (ctas == 0)
    ctas = 1;
  const uint64_t target =
      (uint64_t)(sm_count ? sm_count : 1) * KVT_ATTN_CTAS_PER_SM;
  uint64_t s =
      target / ctas; /* whole waves: a partial second wave costs a full one */
  const uint64_t by_len =
      ((uint64_t)max_seq_len + KVT_ATTN_MIN_SPLIT_TOKENS - 1) /
      KVT_ATTN_MIN_SPLIT_TOKENS;
  if (s > by_len)
    s = by_len;
  if (s > KVT_ATTN_MAX_SPLITS)
    s = KVT_ATTN_MAX_SPLITS;
  return s < 1 ? 1u : (uint32_t)s;
}

static int check_cache(kvt_ctx *ctx, const kvt_attn_cache *c) {
  if (c->struct_size < sizeof(kvt_attn_cache))
    return kvt_fail(ctx, -EINVAL, "kvt_attn_cache: struct_size %zu too small",
                    c->struct_size);
  if (c->format < KVT_ATTN_RAW || c->format > KVT_ATTN_INT4)
    return kvt_fail(ctx, KVT_ESHAPE, "attention cache format %d unknown",
                    c->format);
  if (c->dtype != KVT_DTYPE_BF16 && c->dtype != KVT_DTYPE_F16)
    return kvt_fail(ctx, KVT_ESHAPE,
                    "attention cache dtype %d: must be bf16 or fp16", c->dtype);
  if (c->head_dim != 64 && c->head_dim != 128 && c->head_dim != 256)
    return kvt_fail(ctx, KVT_ESHAPE,
                    "attention head_dim %u: must be 64, 128 or 256",
                    c->head_dim);
  if (c->block_size < 16 || c->block_size > 256 || c->block_size % 16)
    return kvt_fail(
        ctx, KVT_ESHAPE,
        "attention block_size %u: must be 16..256, a multiple of 16",
        c->block_size);
  if (c->kv_heads == 0 || c->kv_heads > 1024 || c->num_blocks == 0)
    return kvt_fail(ctx, KVT_ESHAPE,
                    "attention cache of %u kv heads, %u blocks", c->kv_heads,
                    c->num_blocks);
  /* the kernels' row indices are 64-bit; the slot limit is what must hold */
  if ((uint64_t)c->num_blocks * c->block_size > INT64_MAX / 1024)
    return kvt_fail(ctx, KVT_ESHAPE, "attention cache of %u blocks too large",
                    c->num_blocks);
  return 0;
}

static int check_ptrs(kvt_ctx *ctx, const kvt_attn_cache *c) {
  const int ks = kvt_attn_scale_bytes(c->format, c->head_dim, 0) != 0;
  const int vs = kvt_attn_scale_bytes(c->format, c->head_dim, 1) != 0;
  if (!c->k || !c->v || (ks && !c->k_scale) || (vs && !c->v_scale))
    return kvt_fail(ctx, -EINVAL,
                    "attention cache: NULL codes or scales pointer");
  if (((uintptr_t)c->k | (uintptr_t)c->v | (uintptr_t)c->k_scale |
       (uintptr_t)c->v_scale) %
      16)
    return kvt_fail(ctx, KVT_ESHAPE,
                    "attention cache arrays must be 16-byte aligned");
  return 0;
}

static int check_decode(kvt_ctx *ctx, const kvt_attn_cache *c,
                        const kvt_attn_decode_params *p) {
  int rc = check_cache(ctx, c);
  if (rc)
    return rc;
  if (p->struct_size < sizeof(kvt_attn_decode_params))
    return kvt_fail(ctx, -EINVAL,
                    "kvt_attn_decode_params: struct_size %zu too small",
                    p->struct_size);
  if (p->batch == 0 || p->batch > 65535)
    return kvt_fail(ctx, KVT_ESHAPE, "attention batch %u: must be 1..65535",
                    p->batch);
  if (p->q_heads == 0 || p->q_heads % c->kv_heads ||
      p->q_heads / c->kv_heads > KVT_ATTN_MAX_GQA)
    return kvt_fail(
        ctx, KVT_ESHAPE,
        "attention q_heads %u: must be a multiple of kv_heads %u, ratio <= %u",
        p->q_heads, c->kv_heads, KVT_ATTN_MAX_GQA);
  if (p->max_blocks == 0 || (uint64_t)p->max_blocks * c->block_size > INT32_MAX)
    return kvt_fail(ctx, KVT_ESHAPE, "attention max_blocks %u", p->max_blocks);
  if ((uint64_t)p->max_seq_len > (uint64_t)p->max_blocks * c->block_size)
    return kvt_fail(ctx, KVT_ESHAPE,
                    "attention max_seq_len %u beyond %u blocks of %u",
                    p->max_seq_len, p->max_blocks, c->block_size);
  if (p->num_splits > KVT_ATTN_MAX_SPLITS)
    return kvt_fail(ctx, KVT_ESHAPE, "attention num_splits %u: at most %u",
                    p->num_splits, KVT_ATTN_MAX_SPLITS);
  if (!isfinite(p->softmax_scale))
    return kvt_fail(ctx, KVT_ESHAPE, "attention softmax_scale is not finite");
  return 0;
}

static uint32_t head_chunks(const kvt_attn_cache *c,
                            const kvt_attn_decode_params *p) {
  const uint32_t gqa = p->q_heads / c->kv_heads;
  return (gqa + KVT_ATTN_HEADS_PER_CTA - 1) / KVT_ATTN_HEADS_PER_CTA;
}

/* The kv heads one CTA serves. An INT4 row of one kv head is 64 bytes or
 * less, half a 128-byte line: read head by head, the cache comes at about
 * 0.75 of copy bandwidth (H100, measured). A CTA serving two neighbouring
 * heads copies whole lines (gpu/attn_int4.cuh). Other formats' rows are
 * 128 bytes or more. */
static uint32_t kv_group(const kvt_attn_cache *c) {
  return c->format == KVT_ATTN_INT4 && c->kv_heads % 2 == 0 ? 2u : 1u;
}

/* The split count of a checked decode. */
static int splits_for(kvt_ctx *ctx, const kvt_attn_cache *c,
                      const kvt_attn_decode_params *p, uint32_t *splits) {
  if (p->num_splits) {
    *splits = p->num_splits;
    return 0;
  }
  uint32_t sm = p->sm_count;
  if (!sm) {
#ifdef KVT_HAVE_CUDA
    const int e = kvt_attnrt_sm_count(&sm);
    if (e)
      return kvt_fail(ctx, KVT_ECUDA,
                      "cudaDeviceGetAttribute(multiprocessors): CUDA error %d",
                      e);
#else
    return kvt_fail(ctx, KVT_ENOTSUP,
                    "this kvtier was built without CUDA: give sm_count");
#endif
  }
  const uint32_t len =
      p->max_seq_len ? p->max_seq_len : p->max_blocks * c->block_size;
  *splits = kvt_attn_num_splits(
      (uint64_t)p->batch * (c->kv_heads / kv_group(c)) * head_chunks(c, p),
      len, sm);
  return 0;
}

static size_t ws_bytes(const kvt_attn_cache *c, const kvt_attn_decode_params *p,
                       uint32_t splits, size_t *ml_off) {
  if (splits <= 1) {
    *ml_off = 0;
    return 0;
  }
  const size_t rows = (size_t)p->batch * p->q_heads * splits;
  *ml_off = (rows * c->head_dim * sizeof(float) + 15) & ~(size_t)15;
  return *ml_off + rows * 2 * sizeof(float);
}

int kvt_attn_workspace_size(kvt_ctx *ctx, const kvt_attn_cache *cache,
                            const kvt_attn_decode_params *p, size_t *bytes) {
  if (!cache || !p || !bytes)
    return kvt_fail(ctx, -EINVAL, "kvt_attn_workspace_size: NULL argument");
  int rc = check_decode(ctx, cache, p);
  uint32_t splits = 1;
  if (!rc)
    rc = splits_for(ctx, cache, p, &splits);
  if (rc)
    return rc;
  size_t ml_off;
  *bytes = ws_bytes(cache, p, splits, &ml_off);
  return 0;
}

int kvt_attn_decode_splits(kvt_ctx *ctx, const kvt_attn_cache *cache,
                           const kvt_attn_decode_params *p, uint32_t *splits) {
  if (!cache || !p || !splits)
    return kvt_fail(ctx, -EINVAL, "kvt_attn_decode_splits: NULL argument");
  int rc = check_decode(ctx, cache, p);
  if (!rc)
    rc = splits_for(ctx, cache, p, splits);
  return rc;
}

#ifdef KVT_HAVE_CUDA
static int cuda_fail(kvt_ctx *ctx, int err, const char *what) {
  return kvt_fail(ctx, KVT_ECUDA, "%s: %s (CUDA error %d)", what,
                  kvt_gpurt_error_string(err), err);
}
#endif

int kvt_attn_decode(kvt_ctx *ctx, const kvt_attn_cache *cache,
                    const kvt_attn_decode_params *p, void *stream) {
  if (!cache || !p)
    return kvt_fail(ctx, -EINVAL, "kvt_attn_decode: NULL argument");
  int rc = check_decode(ctx, cache, p);
  if (!rc)
    rc = check_ptrs(ctx, cache);
  if (rc)
    return rc;
  if (!p->q || !p->block_table || !p->seq_lens || !p->out)
    return kvt_fail(ctx, -EINVAL,
                    "kvt_attn_decode: NULL q, block_table, seq_lens or out");
  if (((uintptr_t)p->q % 8) || ((uintptr_t)p->out % 2) ||
      ((uintptr_t)p->workspace % 16))
    return kvt_fail(ctx, KVT_ESHAPE,
                    "kvt_attn_decode: q must be 8-byte aligned, out 2-byte, "
                    "workspace 16-byte");
#ifndef KVT_HAVE_CUDA
  (void)stream;
  return kvt_fail(ctx, KVT_ENOTSUP, "this kvtier was built without CUDA");
#else
  uint32_t splits = 1;
  if ((rc = splits_for(ctx, cache, p, &splits)) != 0)
    return rc;
  size_t ml_off;
  const size_t need = ws_bytes(cache, p, splits, &ml_off);
  if (need && (!p->workspace || p->workspace_size < need))
    return kvt_fail(ctx, KVT_ENOBUFS,
                    "kvt_attn_decode: workspace of %zu bytes, %zu needed",
                    p->workspace_size, need);
  kvt_attn_kparams k;
  memset(&k, 0, sizeof(k));
  k.q = (uintptr_t)p->q;
  k.out = (uintptr_t)p->out;
  k.k = (uintptr_t)cache->k;
  k.v = (uintptr_t)cache->v;
  k.k_scale = (uintptr_t)cache->k_scale;
  k.v_scale = (uintptr_t)cache->v_scale;
  k.block_table = (uintptr_t)p->block_table;
  k.seq_lens = (uintptr_t)p->seq_lens;
  k.part_o = need ? (uintptr_t)p->workspace : 0;
  k.part_ml = need ? (uintptr_t)p->workspace + ml_off : 0;
  k.batch = p->batch;
  k.q_heads = p->q_heads;
  k.kv_heads = cache->kv_heads;
  k.head_dim = cache->head_dim;
  k.gqa = p->q_heads / cache->kv_heads;
  k.head_chunks = head_chunks(cache, p);
  k.block_size = cache->block_size;
  k.max_blocks = p->max_blocks;
  k.splits = splits;
  k.format = cache->format;
  k.dtype = cache->dtype;
  k.scale_log2 = p->softmax_scale * 1.4426950408889634f;
  k.kv_group = kv_group(cache);
  if ((uint64_t)cache->kv_heads * k.head_chunks > 65535)
    return kvt_fail(ctx, KVT_ESHAPE, "kvt_attn_decode: too many kv heads");
  const int e = kvt_attnrt_decode(&k, stream);
  return e ? cuda_fail(ctx, e, "attention decode launch") : 0;
#endif
}

int kvt_attn_append(kvt_ctx *ctx, const kvt_attn_cache *cache,
                    const kvt_attn_append_params *p, void *stream) {
  if (!cache || !p)
    return kvt_fail(ctx, -EINVAL, "kvt_attn_append: NULL argument");
  int rc = check_cache(ctx, cache);
  if (!rc)
    rc = check_ptrs(ctx, cache);
  if (rc)
    return rc;
  if (p->struct_size < sizeof(kvt_attn_append_params))
    return kvt_fail(ctx, -EINVAL,
                    "kvt_attn_append_params: struct_size %zu too small",
                    p->struct_size);
  if (p->batch == 0)
    return 0;
  if (p->batch > INT32_MAX)
    return kvt_fail(ctx, KVT_ESHAPE, "kvt_attn_append: batch %u", p->batch);
  if (!p->k || !p->v || !p->slots)
    return kvt_fail(ctx, -EINVAL, "kvt_attn_append: NULL k, v or slots");
  if (((uintptr_t)p->k | (uintptr_t)p->v) % 2 || (uintptr_t)p->slots % 8)
    return kvt_fail(ctx, KVT_ESHAPE,
                    "kvt_attn_append: misaligned k, v or slots");
#ifndef KVT_HAVE_CUDA
  (void)stream;
  return kvt_fail(ctx, KVT_ENOTSUP, "this kvtier was built without CUDA");
#else
  kvt_attn_aparams a;
  memset(&a, 0, sizeof(a));
  a.k_src = (uintptr_t)p->k;
  a.v_src = (uintptr_t)p->v;
  a.slots = (uintptr_t)p->slots;
  a.k = (uintptr_t)cache->k;
  a.v = (uintptr_t)cache->v;
  a.k_scale = (uintptr_t)cache->k_scale;
  a.v_scale = (uintptr_t)cache->v_scale;
  a.batch = p->batch;
  a.kv_heads = cache->kv_heads;
  a.head_dim = cache->head_dim;
  a.block_size = cache->block_size;
  a.slot_limit = (uint64_t)cache->num_blocks * cache->block_size;
  a.format = cache->format;
  a.dtype = cache->dtype;
  const int e = kvt_attnrt_append(&a, stream);
  return e ? cuda_fail(ctx, e, "attention append launch") : 0;
#endif
}
