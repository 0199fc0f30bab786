/* codec/section.c - encode and decode one section (K or V of one layer)
 * between a strided [token][head][dim] view and its packed bytes. The byte
 * layout of each format is specified in serde/FORMAT.md section 4. */
#include <math.h>

#include "codec_internal.h"
#include "kvt_internal.h"

static uint64_t div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

static int kivi(const kvt_codec_spec *spec, const kvt_section_shape *s) {
  return !s->is_value && spec->k_axis == KVT_AXIS_TOKEN;
}

static uint64_t n_scales(const kvt_codec_spec *spec, const kvt_section_shape *s) {
  switch (spec->scale) {
  case KVT_SCALE_BLOCK:
    return div_up(s->tokens, spec->block) * s->heads;
  case KVT_SCALE_LAYER:
    return 1;
  default:
    return (uint64_t)s->tokens * s->heads;
  }
}

static uint64_t n_i4_groups(const kvt_codec_spec *spec, const kvt_section_shape *s) {
  if (kivi(spec, s))
    return div_up(s->tokens, spec->group) * s->heads * s->head_dim;
  return (uint64_t)s->tokens * s->heads * (s->head_dim / spec->group);
}

uint64_t kvt_section_bytes(const kvt_codec_spec *spec, const kvt_section_shape *s) {
  uint64_t n = (uint64_t)s->tokens * s->heads * s->head_dim;
  switch (s->fmt) {
  case KVT_FMT_N16:
    return 2 * n;
  case KVT_FMT_E4M3:
  case KVT_FMT_I8:
    return kvt_align_up(4 * n_scales(spec, s), 16) + n;
  case KVT_FMT_I4:
    if (s->head_dim % 2 || spec->group < 2 ||
        (!kivi(spec, s) && s->head_dim % spec->group))
      return 0;
    return kvt_align_up(4 * n_i4_groups(spec, s), 16) + n / 2;
  default:
    return 0;
  }
}

static const char *kv_name(const kvt_section_shape *s) { return s->is_value ? "V" : "K"; }

static int fail_nonfinite(kvt_ctx *ctx, const kvt_section_shape *s, uint32_t t,
                          uint32_t h, const kvt_section_src *src, size_t d) {
  const uint16_t *row = src->base + (int64_t)t * src->stride_t + (int64_t)h * src->stride_h;
  float x = kvt_h2f(row[d], s->dtype);
  return kvt_fail(ctx, KVT_ENONFINITE, "%s layer %u token %u head %u dim %zu is %s",
                  kv_name(s), s->layer, t, h, d, isnan(x) ? "NaN" : "Inf");
}

/* Whether a layer's [token][head][dim] elements are one contiguous block. */
static int dense(const kvt_section_shape *s, int64_t stride_t, int64_t stride_h) {
  return stride_h == (int64_t)s->head_dim && stride_t == (int64_t)s->heads * s->head_dim;
}

static inline const uint16_t *row_at(const kvt_section_src *src, uint32_t t, uint32_t h) {
  return src->base + (int64_t)t * src->stride_t + (int64_t)h * src->stride_h;
}

/* Largest |x| over tokens [t0, t1) of one head, or over all heads if h1 > h0+1. */
static int amax_span(kvt_ctx *ctx, const kvt_kernels *k, const kvt_section_shape *s,
                     const kvt_section_src *src, uint32_t t0, uint32_t t1, uint32_t h0,
                     uint32_t h1, float *out) {
  float m = 0.0f;
  for (uint32_t t = t0; t < t1; t++)
    for (uint32_t h = h0; h < h1; h++) {
      float a;
      size_t r = k->amax(row_at(src, t, h), s->head_dim, s->dtype, &a);
      if (r != s->head_dim)
        return fail_nonfinite(ctx, s, t, h, src, r);
      m = a > m ? a : m;
    }
  *out = m;
  return 0;
}

/* Heads whose scales one batched call computes (one vector division for
 * eight scales instead of two scalar divisions each). */
#define SCALE_BATCH 64

static void quant_rows(const kvt_kernels *k, const kvt_section_shape *s,
                       const kvt_section_src *src, uint32_t t, uint32_t h, float inv,
                       uint8_t *codes) {
  uint8_t *out = codes + ((size_t)t * s->heads + h) * s->head_dim;
  if (s->fmt == KVT_FMT_E4M3)
    k->q_e4m3(row_at(src, t, h), s->head_dim, s->dtype, inv, out);
  else
    k->q_i8(row_at(src, t, h), s->head_dim, s->dtype, inv, (int8_t *)out);
}

static int encode_scaled(kvt_ctx *ctx, const kvt_kernels *k, const kvt_codec_spec *spec,
                         const kvt_section_shape *s, const kvt_section_src *src,
                         uint8_t *dst) {
  const uint32_t T = s->tokens, H = s->heads;
  const float qmax = s->fmt == KVT_FMT_E4M3 ? 448.0f : 127.0f;
  uint8_t *scales = dst;
  uint8_t *codes = dst + kvt_align_up(4 * n_scales(spec, s), 16);
  memset(scales, 0, codes - scales);
  const uint32_t span = spec->scale == KVT_SCALE_TOKEN   ? 1
                        : spec->scale == KVT_SCALE_BLOCK ? spec->block
                                                         : T;
  const int per_head = spec->scale != KVT_SCALE_LAYER;
  const uint32_t nh = per_head ? H : 1;
  float amax[SCALE_BATCH], scale[SCALE_BATCH], inv[SCALE_BATCH];
  uint32_t si = 0; /* index of the next scale, in [span][head] order */
  for (uint32_t t0 = 0; t0 < T; t0 += span) {
    const uint32_t t1 = t0 + span < T ? t0 + span : T;
    for (uint32_t b0 = 0; b0 < nh; b0 += SCALE_BATCH) {
      const uint32_t b1 = b0 + SCALE_BATCH < nh ? b0 + SCALE_BATCH : nh;
      for (uint32_t b = b0; b < b1; b++) {
        int rc = amax_span(ctx, k, s, src, t0, t1, per_head ? b : 0, per_head ? b + 1 : H,
                           &amax[b - b0]);
        if (rc)
          return rc;
      }
      k->scales(amax, b1 - b0, qmax, scale, inv);
      for (uint32_t b = b0; b < b1; b++, si++) {
        uint32_t bits;
        memcpy(&bits, &scale[b - b0], 4);
        kvt_st32(scales + 4 * (size_t)si, bits);
        for (uint32_t t = t0; t < t1; t++)
          for (uint32_t h = per_head ? b : 0; h < (per_head ? b + 1 : H); h++)
            quant_rows(k, s, src, t, h, inv[b - b0], codes);
      }
    }
  }
  return 0;
}

static int fail_range(kvt_ctx *ctx, const kvt_section_shape *s, uint32_t t, uint32_t h,
                      float mn, float mx) {
  return kvt_fail(ctx, KVT_ERANGE,
                  "%s layer %u token %u head %u: range [%g, %g] does not fit the fp16 "
                  "scale and zero of i4 (|x| must stay below 65504)",
                  kv_name(s), s->layer, t, h, mn, mx);
}

/* Groups whose parameters one batched call computes: several rows' worth. */
#define I4_BATCH 256

static int encode_i4_dim(kvt_ctx *ctx, const kvt_kernels *k, const kvt_codec_spec *spec,
                         const kvt_section_shape *s, const kvt_section_src *src,
                         uint8_t *dst) {
  const uint32_t T = s->tokens, H = s->heads, D = s->head_dim, G = spec->group, NG = D / G;
  const uint32_t rows = I4_BATCH / NG ? I4_BATCH / NG : 1; /* NG <= 512 */
  uint8_t *params = dst;
  uint8_t *codes = dst + kvt_align_up(4 * n_i4_groups(spec, s), 16);
  memset(params, 0, codes - params);
  float mn[KVT_MAX_HEAD_DIM_INTERNAL / 2 > I4_BATCH ? KVT_MAX_HEAD_DIM_INTERNAL / 2 : I4_BATCH];
  float mx[sizeof(mn) / sizeof(mn[0])], zero[sizeof(mn) / sizeof(mn[0])];
  float inv[sizeof(mn) / sizeof(mn[0])];
  for (uint32_t t = 0; t < T; t++)
    for (uint32_t h0 = 0; h0 < H; h0 += rows) {
      uint32_t h1 = h0 + rows < H ? h0 + rows : H, n = (h1 - h0) * NG;
      for (uint32_t h = h0; h < h1; h++) {
        uint32_t j = (h - h0) * NG;
        size_t r = k->minmax_groups(row_at(src, t, h), D, G, s->dtype, &mn[j], &mx[j]);
        if (r != D)
          return fail_nonfinite(ctx, s, t, h, src, r);
      }
      size_t base = ((size_t)t * H + h0) * D;
      size_t bad = k->i4_params(mn, mx, n, params + 4 * (base / G), zero, inv);
      if (bad != n)
        return fail_range(ctx, s, t, h0 + (uint32_t)bad / NG, mn[bad], mx[bad]);
      for (uint32_t h = h0; h < h1; h++) {
        const uint16_t *row = row_at(src, t, h);
        size_t b = ((size_t)t * H + h) * D, j = (h - h0) * NG;
        for (uint32_t g = 0; g < NG; g++)
          k->q_i4(row + g * G, G, s->dtype, zero[j + g], inv[j + g], codes + (b + g * G) / 2);
      }
    }
  return 0;
}

static int encode_i4_tok(kvt_ctx *ctx, const kvt_kernels *k, const kvt_codec_spec *spec,
                         const kvt_section_shape *s, const kvt_section_src *src,
                         uint8_t *dst) {
  const uint32_t T = s->tokens, H = s->heads, D = s->head_dim, G = spec->group;
  uint8_t *params = dst;
  uint8_t *codes = dst + kvt_align_up(4 * n_i4_groups(spec, s), 16);
  memset(params, 0, codes - params);
  float mn[KVT_MAX_HEAD_DIM_INTERNAL], mx[KVT_MAX_HEAD_DIM_INTERNAL];
  float zero[KVT_MAX_HEAD_DIM_INTERNAL], inv[KVT_MAX_HEAD_DIM_INTERNAL];
  for (uint32_t t0 = 0; t0 < T; t0 += G) {
    uint32_t t1 = t0 + G < T ? t0 + G : T;
    for (uint32_t h = 0; h < H; h++) {
      for (uint32_t d = 0; d < D; d++) {
        mn[d] = INFINITY;
        mx[d] = -INFINITY;
      }
      for (uint32_t t = t0; t < t1; t++) {
        size_t r = k->minmax_acc(row_at(src, t, h), D, s->dtype, mn, mx);
        if (r != D)
          return fail_nonfinite(ctx, s, t, h, src, r);
      }
      uint8_t *p = params + 4 * (((size_t)(t0 / G) * H + h) * D);
      size_t bad = k->i4_params(mn, mx, D, p, zero, inv);
      if (bad != D)
        return fail_range(ctx, s, t0, h, mn[bad], mx[bad]);
      for (uint32_t t = t0; t < t1; t++)
        k->q_i4_chan(row_at(src, t, h), D, s->dtype, zero, inv,
                     codes + ((size_t)t * H + h) * D / 2);
    }
  }
  return 0;
}

int kvt_section_encode(kvt_ctx *ctx, const kvt_codec_spec *spec,
                       const kvt_section_shape *s, const kvt_section_src *src,
                       uint8_t *dst) {
  const kvt_kernels *k = kvt_kernels_for(ctx);
  switch (s->fmt) {
  case KVT_FMT_N16:
    if (dense(s, src->stride_t, src->stride_h)) {
      memcpy(dst, src->base, 2 * (size_t)s->tokens * s->heads * s->head_dim);
      return 0;
    }
    for (uint32_t t = 0; t < s->tokens; t++)
      for (uint32_t h = 0; h < s->heads; h++)
        memcpy(dst + 2 * ((size_t)t * s->heads + h) * s->head_dim, row_at(src, t, h),
               2 * (size_t)s->head_dim);
    return 0;
  case KVT_FMT_E4M3:
  case KVT_FMT_I8:
    return encode_scaled(ctx, k, spec, s, src, dst);
  case KVT_FMT_I4:
    return kivi(spec, s) ? encode_i4_tok(ctx, k, spec, s, src, dst)
                         : encode_i4_dim(ctx, k, spec, s, src, dst);
  default:
    return kvt_fail(ctx, KVT_ESPEC, "unknown format %d", s->fmt);
  }
}

static float ld_f32(const uint8_t *p) {
  uint32_t u = kvt_ld32(p);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void decode_scaled(const kvt_kernels *k, const kvt_codec_spec *spec,
                          const kvt_section_shape *s, const uint8_t *src, uint16_t *base,
                          int64_t st, int64_t sh) {
  const uint32_t T = s->tokens, H = s->heads, D = s->head_dim;
  const uint8_t *codes = src + kvt_align_up(4 * n_scales(spec, s), 16);
  for (uint32_t t = 0; t < T; t++)
    for (uint32_t h = 0; h < H; h++) {
      size_t si = spec->scale == KVT_SCALE_TOKEN   ? (size_t)t * H + h
                  : spec->scale == KVT_SCALE_BLOCK ? (size_t)(t / spec->block) * H + h
                                                   : 0;
      float scale = ld_f32(src + 4 * si);
      const uint8_t *in = codes + ((size_t)t * H + h) * D;
      uint16_t *out = base + (int64_t)t * st + (int64_t)h * sh;
      if (s->fmt == KVT_FMT_E4M3)
        k->dq_e4m3(in, D, scale, s->dtype, out);
      else
        k->dq_i8((const int8_t *)in, D, scale, s->dtype, out);
    }
}

static void decode_i4(const kvt_kernels *k, const kvt_codec_spec *spec,
                      const kvt_section_shape *s, const uint8_t *src, uint16_t *base,
                      int64_t st, int64_t sh) {
  const uint32_t T = s->tokens, H = s->heads, D = s->head_dim, G = spec->group;
  const uint8_t *params = src;
  const uint8_t *codes = src + kvt_align_up(4 * n_i4_groups(spec, s), 16);
  float scale[KVT_MAX_HEAD_DIM_INTERNAL], zero[KVT_MAX_HEAD_DIM_INTERNAL];
  if (!kivi(spec, s)) {
    const uint32_t NG = D / G;
    for (uint32_t t = 0; t < T; t++)
      for (uint32_t h = 0; h < H; h++) {
        size_t b = ((size_t)t * H + h) * D;
        uint16_t *out = base + (int64_t)t * st + (int64_t)h * sh;
        k->i4_unpack(params + 4 * (b / G), NG, scale, zero);
        for (uint32_t g = 0; g < NG; g++)
          k->dq_i4(codes + (b + g * G) / 2, G, scale[g], zero[g], s->dtype, out + g * G);
      }
    return;
  }
  for (uint32_t t0 = 0; t0 < T; t0 += G) {
    uint32_t t1 = t0 + G < T ? t0 + G : T;
    for (uint32_t h = 0; h < H; h++) {
      k->i4_unpack(params + 4 * (((size_t)(t0 / G) * H + h) * D), D, scale, zero);
      for (uint32_t t = t0; t < t1; t++)
        k->dq_i4_chan(codes + ((size_t)t * H + h) * D / 2, D, scale, zero, s->dtype,
                      base + (int64_t)t * st + (int64_t)h * sh);
    }
  }
}

void kvt_section_decode(kvt_ctx *ctx, const kvt_codec_spec *spec,
                        const kvt_section_shape *s, const uint8_t *src, uint16_t *base,
                        int64_t stride_t, int64_t stride_h) {
  const kvt_kernels *k = kvt_kernels_for(ctx);
  switch (s->fmt) {
  case KVT_FMT_N16:
    if (dense(s, stride_t, stride_h)) {
      memcpy(base, src, 2 * (size_t)s->tokens * s->heads * s->head_dim);
      return;
    }
    for (uint32_t t = 0; t < s->tokens; t++)
      for (uint32_t h = 0; h < s->heads; h++)
        memcpy(base + (int64_t)t * stride_t + (int64_t)h * stride_h,
               src + 2 * ((size_t)t * s->heads + h) * s->head_dim,
               2 * (size_t)s->head_dim);
    return;
  case KVT_FMT_E4M3:
  case KVT_FMT_I8:
    decode_scaled(k, spec, s, src, base, stride_t, stride_h);
    return;
  case KVT_FMT_I4:
    decode_i4(k, spec, s, src, base, stride_t, stride_h);
    return;
  default:
    return;
  }
}
