/* gpu/kvt_attn_layout.h - what the host side of decode attention (attn_api.c,
 * C) hands its kernels (attn_kernels.cu, CUDA): one plain struct per launch,
 * with its size asserted so the two compilers never disagree, the split
 * arithmetic both sides use, and the launchers. Internal: not installed. */
#ifndef KVT_ATTN_LAYOUT_H
#define KVT_ATTN_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define KVT_ATTN_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define KVT_ATTN_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

/* Tokens per tile: one m16n8k16 tile of keys; block sizes are multiples of
 * it, so a tile never straddles a page. */
#define KVT_ATTN_TILE 16u
/* Query heads one CTA serves: the n dimension of the MMA. */
#define KVT_ATTN_HEADS_PER_CTA 8u
/* Warps per decode CTA, and the CTAs per multiprocessor the split choice
 * assumes resident. */
#define KVT_ATTN_WARPS 4u
#define KVT_ATTN_CTAS_PER_SM 4u
/* Fewest tokens a split is given. */
#define KVT_ATTN_MIN_SPLIT_TOKENS 256u

/* One decode launch. Addresses are device addresses as integers. */
typedef struct kvt_attn_kparams {
  uint64_t q, out, k, v, k_scale, v_scale;
  uint64_t block_table, seq_lens;
  uint64_t part_o;  /* workspace: fp32 [batch][q_heads][splits][head_dim] */
  uint64_t part_ml; /* workspace: fp32 [batch][q_heads][splits][2] (max, sum) */
  uint32_t batch, q_heads, kv_heads, head_dim;
  uint32_t gqa;         /* q_heads / kv_heads */
  uint32_t head_chunks; /* ceil(gqa / KVT_ATTN_HEADS_PER_CTA) */
  uint32_t block_size, max_blocks, splits;
  int32_t format, dtype;
  float scale_log2; /* softmax_scale * log2(e) */
  uint32_t kv_group; /* kv heads one CTA serves: 1, or 2 (INT4, even kv_heads) */
  uint32_t reserved;
} kvt_attn_kparams;
KVT_ATTN_STATIC_ASSERT(sizeof(kvt_attn_kparams) == 136,
                       "kvt_attn_kparams layout");
KVT_ATTN_STATIC_ASSERT(offsetof(kvt_attn_kparams, batch) == 80,
                       "kvt_attn_kparams layout");
KVT_ATTN_STATIC_ASSERT(offsetof(kvt_attn_kparams, format) == 116,
                       "kvt_attn_kparams layout");

/* One append launch. */
typedef struct kvt_attn_aparams {
  uint64_t k_src, v_src, slots;
  uint64_t k, v, k_scale, v_scale;
  uint32_t batch, kv_heads, head_dim, block_size;
  uint64_t slot_limit; /* num_blocks * block_size */
  int32_t format, dtype;
} kvt_attn_aparams;
KVT_ATTN_STATIC_ASSERT(sizeof(kvt_attn_aparams) == 88,
                       "kvt_attn_aparams layout");
KVT_ATTN_STATIC_ASSERT(offsetof(kvt_attn_aparams, slot_limit) == 72,
                       "kvt_attn_aparams layout");

#ifdef __cplusplus
extern "C" {
#endif

/* Launchers (attn_kernels.cu); each returns a cudaError_t as int. decode
 * launches the split kernel and, with more than one split, the combine. */
int kvt_attnrt_decode(const kvt_attn_kparams *p, void *stream);
int kvt_attnrt_append(const kvt_attn_aparams *p, void *stream);
/* Multiprocessors of the current device. */
int kvt_attnrt_sm_count(uint32_t *n);
/* Which path FP8 decodes at head dim 128 take, for the whole process:
 * 0 registers, 1 staged (shared-memory stages); anything else goes back to
 * the default: the environment's KVT_ATTN_FP8_PATH (registers / staged),
 * read at the next decode, else the device (staged on sm_90 devices of
 * 4 TB/s or more). A decode captured in a CUDA graph keeps the path it was
 * captured with. For tests (gpu/attn_staged.cuh). */
void kvt_attnrt_set_fp8_path(int mode);

#ifdef __cplusplus
}
#endif
#endif
