/* kvtier/attn.h - decode attention that reads a compressed paged KV cache
 * directly, and the writer that appends a decode step's K/V to such a cache.
 *
 * One layer's cache is a set of device arrays in pages (blocks) of
 * block_size tokens, addressed through a per-sequence block table as vLLM's
 * paged attention:
 *
 *   codes   K and V each [num_blocks][block_size][kv_heads][row], where a
 *           row (one token, one head) is head_dim elements: 16-bit (bf16 or
 *           fp16, the cache's dtype), 1-byte e4m3, or head_dim/2 bytes of
 *           int4 nibbles (element 2j in the low nibble of byte j, offset
 *           binary 0..15, as serde/FORMAT.md section 4).
 *   scales  e4m3: fp32 [num_blocks][kv_heads][block_size], one per (token,
 *           head), scale = amax / 448 over the row (0 for an all-zero row);
 *           int4: [num_blocks][kv_heads][block_size][head_dim / 32] pairs of
 *           (fp16 scale, fp16 zero) in 4 bytes, scale first, one per group of
 *           32 elements along head_dim, as the codec's "i4 along dim".
 *           Scales are head-major within a page (unlike the codes) so the
 *           scales one head reads for a page are contiguous: whole 32-byte
 *           sectors instead of 4 useful bytes in each.
 *
 * Formats (enum kvt_attn_format): RAW (K and V 16-bit: the like-for-like
 * baseline), K16V8 (16-bit K, e4m3 V: keys never need a conversion before
 * q.k), FP8 (e4m3 K and V), INT4 (int4 K and V with scale and zero point).
 * The arithmetic of quantization is the codec's (serde/FORMAT.md section 4):
 * a cache written by kvt_attn_append holds the bytes kvt_encode() would write
 * for the same rows with the same formats (e4m3 per-token scales, i4 groups of
 * 32 along dim). INT4 keeps the codec's zero point: it costs one extra fp16
 * per group (4 bytes per 32 elements instead of 2) and gives asymmetric key
 * channels (outliers with an offset, as real keys have) their full 16 levels.
 *
 * Decode (kvt_attn_decode) is flash-decoding: the context of each sequence
 * is split across CTAs (kvt_attn_num_splits), each CTA handles all query
 * heads of one KV head (GQA; of two neighbouring KV heads for INT4 caches
 * with an even kv_heads) on tensor cores, dequantizing K and V in
 * registers inside its tile loop, and a second small kernel combines the
 * splits' partial results (fp32, in a caller-provided workspace).
 *
 * All pointers in the structs below are device pointers unless said
 * otherwise. Streams are `void *` (a cudaStream_t; NULL is the legacy default
 * stream); calls enqueue work and return without waiting. CUDA failures
 * return KVT_ECUDA with the CUDA error string in kvt_ctx_last_error(ctx).
 *
 * Built without CUDA: kvt_attn_num_splits and kvt_attn_workspace_size work
 * (pure arithmetic); kvt_attn_decode and kvt_attn_append check their
 * arguments first (-EINVAL, KVT_ESHAPE as with CUDA) and then return
 * KVT_ENOTSUP.
 *
 * Thread-safety: every call is reentrant; calls on one ctx write its
 * last-error detail. Compiles as C and C++; includes no CUDA header. */
#ifndef KVTIER_ATTN_H
#define KVTIER_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/core.h"

#ifdef __cplusplus
extern "C" {
#endif

enum kvt_attn_format {
  KVT_ATTN_RAW = 0, /* K and V in the cache dtype (bf16 or fp16) */
  KVT_ATTN_K16V8 =
      1, /* K in the cache dtype, V e4m3 + fp32 scale per (token, head) */
  KVT_ATTN_FP8 = 2, /* K and V e4m3 + fp32 scale per (token, head) */
  KVT_ATTN_INT4 =
      3 /* K and V int4, (fp16 scale, fp16 zero) per 32 along head_dim */
};

/* Limits. */
#define KVT_ATTN_MAX_SPLITS 64u /* context splits per sequence */
#define KVT_ATTN_MAX_GQA 64u    /* q_heads / kv_heads */

/* One layer's paged cache. dtype is the 16-bit type of q, of the output, of
 * the new K/V given to kvt_attn_append, and of K (and V) in RAW and K16V8
 * caches. block_size is a multiple of 16 in [16, 256]; head_dim is 64, 128
 * or 256. k_scale / v_scale are NULL for 16-bit parts. Codes arrays and
 * scale arrays must be 16-byte aligned. */
typedef struct kvt_attn_cache {
  size_t struct_size; /* sizeof(kvt_attn_cache) */
  int format;         /* enum kvt_attn_format */
  int dtype;          /* enum kvt_dtype: KVT_DTYPE_BF16 or KVT_DTYPE_F16 */
  uint32_t num_blocks, block_size, kv_heads, head_dim;
  void *k, *v; /* codes, as described above */
  void *k_scale,
      *v_scale; /* scales, as described above; NULL for 16-bit parts */
} kvt_attn_cache;

#define KVT_ATTN_CACHE_INIT                                                    \
  {                                                                            \
    sizeof(kvt_attn_cache), KVT_ATTN_RAW, 1, 0, 0, 0, 0, NULL, NULL, NULL,     \
        NULL                                                                   \
  }

/* Bytes of one (token, head) row of codes of K (is_value 0) or V (1), and
 * of one (token, head)'s scales (0 for a 16-bit part); 0 for an invalid
 * format or head_dim. Sizes of the arrays: num_blocks * block_size *
 * kv_heads times these. */
KVT_API size_t kvt_attn_row_bytes(int format, uint32_t head_dim, int is_value);
KVT_API size_t kvt_attn_scale_bytes(int format, uint32_t head_dim,
                                    int is_value);

/* One decode step: one query token per sequence. */
typedef struct kvt_attn_decode_params {
  size_t struct_size;   /* sizeof(kvt_attn_decode_params) */
  uint32_t batch;       /* sequences */
  uint32_t q_heads;     /* a multiple of the cache's kv_heads, ratio <=
                           KVT_ATTN_MAX_GQA */
  uint32_t max_blocks;  /* columns of block_table */
  uint32_t max_seq_len; /* host-side upper bound of seq_lens (0: max_blocks *
                           block_size); chooses the number of splits */
  float softmax_scale;  /* usually 1/sqrt(head_dim) */
  uint32_t num_splits;  /* 0: kvt_attn_num_splits' choice;
                           else 1..KVT_ATTN_MAX_SPLITS */
  uint32_t sm_count;    /* 0: the current device's multiprocessor count */
  const void *q;        /* [batch][q_heads][head_dim] of dtype */
  const int32_t
      *block_table; /* [batch][max_blocks]: page of each block of a sequence */
  const int32_t
      *seq_lens; /* [batch]: tokens of each sequence, 0..max_blocks*block_size
                    (a sequence of 0 tokens gets a zero output) */
  void *out;     /* [batch][q_heads][head_dim] of dtype */
  void *
      workspace; /* kvt_attn_workspace_size bytes, 16-byte aligned; NULL if 0 */
  size_t workspace_size;
} kvt_attn_decode_params;

#define KVT_ATTN_DECODE_PARAMS_INIT                                            \
  {                                                                            \
    sizeof(kvt_attn_decode_params), 0, 0, 0, 0, 0.0f, 0, 0, NULL, NULL, NULL,  \
        NULL, NULL, 0                                                          \
  }

/* The number of context splits for `ctas` CTAs per split (batch * kv_heads
 * * ceil(gqa / 8), halved for INT4 caches of an even kv_heads: one CTA
 * serves two kv heads there) on a device of sm_count multiprocessors and
 * contexts up
 * to max_seq_len tokens: as many as fill about one wave of resident CTAs
 * (4 per multiprocessor), at least 256 tokens each, at most
 * KVT_ATTN_MAX_SPLITS. Pure arithmetic, both builds. */
KVT_API uint32_t kvt_attn_num_splits(uint64_t ctas, uint32_t max_seq_len,
                                     uint32_t sm_count);

/* Workspace bytes a decode with these parameters needs (0 with one split):
 * fp32 partial outputs and (max, sum) pairs of every split. Uses
 * p->num_splits, or the split choice from p->sm_count (0: the current
 * device's, which needs CUDA). Returns 0, -EINVAL, KVT_ESHAPE, KVT_ENOTSUP
 * (sm_count 0 without CUDA), KVT_ECUDA. Fields checked: as kvt_attn_decode's
 * shape checks; pointers are not looked at. */
KVT_API int kvt_attn_workspace_size(kvt_ctx *ctx, const kvt_attn_cache *cache,
                                    const kvt_attn_decode_params *p,
                                    size_t *bytes);

/* The number of context splits a decode with these parameters runs:
 * p->num_splits, or the split choice as kvt_attn_workspace_size makes it.
 * Returns as kvt_attn_workspace_size. */
KVT_API int kvt_attn_decode_splits(kvt_ctx *ctx, const kvt_attn_cache *cache,
                                   const kvt_attn_decode_params *p,
                                   uint32_t *splits);

/* Decode attention: out[b][h] = softmax(scale * q[b][h] . K_b^T) V_b over
 * the first seq_lens[b] tokens of sequence b (token t in page
 * block_table[b][t / block_size], offset t % block_size), K/V of kv head
 * h / (q_heads / kv_heads). Enqueued on stream. Returns 0, -EINVAL (NULL
 * argument or pointer, struct too small), KVT_ESHAPE (format, dtype, sizes,
 * alignment), KVT_ENOBUFS (workspace too small), KVT_ENOTSUP (built without
 * CUDA), KVT_ECUDA. Block-table entries and seq_lens are device data and
 * are not checked: they must be within the cache. FP8 at head_dim 128 has
 * two kernels with the same results, chosen by the device's memory
 * bandwidth (docs/ATTENTION.md); KVT_ATTN_FP8_PATH=registers or staged in
 * the environment picks one for the process. */
KVT_API int kvt_attn_decode(kvt_ctx *ctx, const kvt_attn_cache *cache,
                            const kvt_attn_decode_params *p, void *stream);

/* One decode step's new K/V: token b of the batch goes into slot slots[b]
 * (page slots[b] / block_size, offset slots[b] % block_size; a negative
 * slot is skipped), quantized to the cache's format on the way in with the
 * codec's arithmetic. Rows holding NaN or Inf give unspecified codes (the
 * codec refuses them; this writer has no status word). */
typedef struct kvt_attn_append_params {
  size_t struct_size;   /* sizeof(kvt_attn_append_params) */
  uint32_t batch;       /* tokens written */
  const void *k, *v;    /* [batch][kv_heads][head_dim] of the cache dtype */
  const int64_t *slots; /* [batch] */
} kvt_attn_append_params;

#define KVT_ATTN_APPEND_PARAMS_INIT                                            \
  { sizeof(kvt_attn_append_params), 0, NULL, NULL, NULL }

/* Enqueues the append on stream. Returns 0, -EINVAL, KVT_ESHAPE, KVT_ENOTSUP,
 * KVT_ECUDA. Int4 groups whose scale or zero do not fit fp16 (which the
 * codec refuses with KVT_ERANGE) also give unspecified codes. */
KVT_API int kvt_attn_append(kvt_ctx *ctx, const kvt_attn_cache *cache,
                            const kvt_attn_append_params *p, void *stream);

#ifdef __cplusplus
}
#endif
#endif
