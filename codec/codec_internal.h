/* codec/codec_internal.h - the codec's element kernels (one table per CPU
 * path) and the per-section encoder/decoder that the payload writer and
 * reader drive. Every path of a kernel must produce identical bytes; the
 * arithmetic each one does is fixed in serde/FORMAT.md so GPU kernels can
 * match it too. */
#ifndef KVT_CODEC_INTERNAL_H
#define KVT_CODEC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/codec.h"

/* Largest head_dim the codec handles (stack arrays of this many floats). */
#define KVT_MAX_HEAD_DIM_INTERNAL 1024

/* Groups whose largest magnitude is below this encode as zeros: their scales
 * would need reciprocals beyond fp32's range. */
#define KVT_TINY_AMAX 7.8886090522101181e-31f /* 2^-100 */

typedef struct kvt_kernels {
  const char *name;
  /* Largest |x| of n values into *amax. Returns n, or the index of the first
   * NaN or Inf (then *amax is unspecified). */
  size_t (*amax)(const uint16_t *src, size_t n, int dtype, float *amax);
  /* min and max of n values; same return as amax. */
  size_t (*minmax)(const uint16_t *src, size_t n, int dtype, float *mn, float *mx);
  /* min and max of each group of G consecutive values of a row of n (n a
   * multiple of G) into mn[n/G], mx[n/G]; same return as amax. The sign of
   * a zero result may differ between paths (kvt_i4_params ignores it). */
  size_t (*minmax_groups)(const uint16_t *src, size_t n, size_t G, int dtype, float *mn,
                          float *mx);
  /* Element-wise running min/max: mn[i] = min(mn[i], x[i]), likewise mx. */
  size_t (*minmax_acc)(const uint16_t *src, size_t n, int dtype, float *mn, float *mx);
  /* dst[i] = e4m3(x[i] * inv) */
  void (*q_e4m3)(const uint16_t *src, size_t n, int dtype, float inv, uint8_t *dst);
  /* out[i] = 16-bit(e4m3_to_f32(q[i]) * scale) */
  void (*dq_e4m3)(const uint8_t *src, size_t n, float scale, int dtype, uint16_t *dst);
  /* dst[i] = clamp(rint(x[i] * inv), -127, 127) */
  void (*q_i8)(const uint16_t *src, size_t n, int dtype, float inv, int8_t *dst);
  void (*dq_i8)(const int8_t *src, size_t n, float scale, int dtype, uint16_t *dst);
  /* n even: nibble i = clamp(rint((x[i] - zero) * inv), 0, 15), element 2j
   * in the low nibble of dst[j]. */
  void (*q_i4)(const uint16_t *src, size_t n, int dtype, float zero, float inv,
               uint8_t *dst);
  /* out[i] = 16-bit(q[i] * scale + zero), multiply then add, no FMA. */
  void (*dq_i4)(const uint8_t *src, size_t n, float scale, float zero, int dtype,
                uint16_t *dst);
  /* The same with one zero/inv/scale per element (KIVI channel groups). */
  void (*q_i4_chan)(const uint16_t *src, size_t n, int dtype, const float *zero,
                    const float *inv, uint8_t *dst);
  void (*dq_i4_chan)(const uint8_t *src, size_t n, const float *scale,
                     const float *zero, int dtype, uint16_t *dst);
  /* i4 parameters of n groups from their min and max (kvt_i4_params): the
   * (fp16 scale, fp16 zero) pairs into params[4i..4i+3], and fp32 zero[i] and
   * inv[i]. Returns n, or the index of the first group that does not fit. */
  size_t (*i4_params)(const float *mn, const float *mx, size_t n, uint8_t *params,
                      float *zero, float *inv);
  /* kvt_scale_for over n amax values: scale[i] = amax[i] / qmax and
   * inv[i] = 1 / scale[i], both 0 below KVT_TINY_AMAX. */
  void (*scales)(const float *amax, size_t n, float qmax, float *scale, float *inv);
  /* The (scale, zero) fp16 pairs of n groups widened to fp32. */
  void (*i4_unpack)(const uint8_t *params, size_t n, float *scale, float *zero);
} kvt_kernels;

/* AVX2 conversions of fp32 arrays, exported for the exhaustive tests. */
void kvt_avx2_f32_to_e4m3(const float *src, size_t n, uint8_t *dst);
void kvt_avx2_f32_to_16(const float *src, size_t n, int dtype, uint16_t *dst);

const kvt_kernels *kvt_kernels_scalar(void);
/* NULL when the build has no AVX2 path. */
const kvt_kernels *kvt_kernels_avx2(void);
/* The table for a context's resolved SIMD choice. */
const kvt_kernels *kvt_kernels_for(const kvt_ctx *ctx);

/* 16-bit <-> fp32 by dtype. */
static inline float kvt_h2f(uint16_t h, int dtype) {
  return dtype == KVT_DTYPE_BF16 ? kvt_bf16_to_f32(h) : kvt_f16_to_f32(h);
}
static inline uint16_t kvt_f2h(float f, int dtype) {
  return dtype == KVT_DTYPE_BF16 ? kvt_f32_to_bf16(f) : kvt_f32_to_f16(f);
}

/* Resets the fields a spec's formats do not use to their defaults, so equal
 * encodings have equal specs, headers and canonical text. */
void kvt_codec_normalise(kvt_codec_spec *spec);

/* fp16 with directed rounding: toward -inf and toward +inf. */
uint16_t kvt_f32_to_f16_rd(float f);
uint16_t kvt_f32_to_f16_ru(float f);

/* Scale parameters, computed once by scalar code for every path; inline so
 * their divisions overlap the row's other work. */
static inline void kvt_scale_for(float amax, float qmax, float *scale, float *inv) {
  if (!(amax >= KVT_TINY_AMAX)) {
    *scale = 0.0f;
    *inv = 0.0f;
    return;
  }
  *scale = amax / qmax;
  *inv = 1.0f / *scale;
}
static inline void kvt_e4m3_scale(float amax, float *scale, float *inv) {
  kvt_scale_for(amax, 448.0f, scale, inv);
}
static inline void kvt_i8_scale(float amax, float *scale, float *inv) {
  kvt_scale_for(amax, 127.0f, scale, inv);
}
/* i4: zero = f16_rd(min), scale = f16_ru((max - zero) / 15), with a zero
 * min or max taken as +0 whatever its sign. Returns 0, or KVT_ERANGE when
 * either does not fit fp16. */
int kvt_i4_params(float mn, float mx, uint16_t *scale_h, uint16_t *zero_h,
                  float *scale, float *zero, float *inv);

/* One section: K or V of one layer. */
typedef struct kvt_section_src {
  const uint16_t *base; /* element (token 0, head 0, dim 0) of the layer */
  int64_t stride_t, stride_h;
} kvt_section_src;

typedef struct kvt_section_shape {
  int fmt, dtype, is_value;
  uint32_t layer; /* absolute, for error messages */
  uint32_t tokens, heads, head_dim;
} kvt_section_shape;

/* Bytes of one section of fmt (0 for an invalid combination). */
uint64_t kvt_section_bytes(const kvt_codec_spec *spec, const kvt_section_shape *s);

/* Encodes one section into dst (kvt_section_bytes long). Returns 0,
 * KVT_ENONFINITE or KVT_ERANGE with the place in ctx's detail. */
int kvt_section_encode(kvt_ctx *ctx, const kvt_codec_spec *spec,
                       const kvt_section_shape *s, const kvt_section_src *src,
                       uint8_t *dst);

/* Decodes a section of kvt_section_bytes bytes into the strided destination. */
void kvt_section_decode(kvt_ctx *ctx, const kvt_codec_spec *spec,
                        const kvt_section_shape *s, const uint8_t *src,
                        uint16_t *base, int64_t stride_t, int64_t stride_h);

#endif
