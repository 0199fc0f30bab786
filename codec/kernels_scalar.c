/* codec/kernels_scalar.c - the portable element kernels: the reference for
 * every other path. */
#include <math.h>

#include "codec_internal.h"
#include "kvt_internal.h"

static size_t s_amax(const uint16_t *src, size_t n, int dtype, float *amax) {
  float m = 0.0f;
  for (size_t i = 0; i < n; i++) {
    float x = kvt_h2f(src[i], dtype);
    if (!isfinite(x))
      return i;
    float a = fabsf(x);
    m = a > m ? a : m;
  }
  *amax = m;
  return n;
}

static size_t s_minmax(const uint16_t *src, size_t n, int dtype, float *mn, float *mx) {
  float lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    float x = kvt_h2f(src[i], dtype);
    if (!isfinite(x))
      return i;
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
  *mn = lo;
  *mx = hi;
  return n;
}

static size_t s_minmax_groups(const uint16_t *src, size_t n, size_t G, int dtype, float *mn,
                              float *mx) {
  for (size_t g = 0; g < n / G; g++) {
    size_t r = s_minmax(src + g * G, G, dtype, &mn[g], &mx[g]);
    if (r != G)
      return g * G + r;
  }
  return n;
}

static size_t s_minmax_acc(const uint16_t *src, size_t n, int dtype, float *mn,
                           float *mx) {
  for (size_t i = 0; i < n; i++) {
    float x = kvt_h2f(src[i], dtype);
    if (!isfinite(x))
      return i;
    mn[i] = x < mn[i] ? x : mn[i];
    mx[i] = x > mx[i] ? x : mx[i];
  }
  return n;
}

static void s_q_e4m3(const uint16_t *src, size_t n, int dtype, float inv, uint8_t *dst) {
  for (size_t i = 0; i < n; i++)
    dst[i] = kvt_f32_to_e4m3(kvt_h2f(src[i], dtype) * inv);
}

static void s_dq_e4m3(const uint8_t *src, size_t n, float scale, int dtype,
                      uint16_t *dst) {
  for (size_t i = 0; i < n; i++)
    dst[i] = kvt_f2h(kvt_e4m3_to_f32(src[i]) * scale, dtype);
}

static int8_t q8(float y) {
  float r = rintf(y);
  r = r > 127.0f ? 127.0f : r;
  r = r < -127.0f ? -127.0f : r;
  return (int8_t)r;
}

static void s_q_i8(const uint16_t *src, size_t n, int dtype, float inv, int8_t *dst) {
  for (size_t i = 0; i < n; i++)
    dst[i] = q8(kvt_h2f(src[i], dtype) * inv);
}

static void s_dq_i8(const int8_t *src, size_t n, float scale, int dtype, uint16_t *dst) {
  for (size_t i = 0; i < n; i++)
    dst[i] = kvt_f2h((float)src[i] * scale, dtype);
}

static uint8_t q4(float x, float zero, float inv) {
  float r = rintf((x - zero) * inv);
  r = r > 15.0f ? 15.0f : r;
  r = r < 0.0f ? 0.0f : r;
  return (uint8_t)r;
}

static void s_q_i4(const uint16_t *src, size_t n, int dtype, float zero, float inv,
                   uint8_t *dst) {
  for (size_t i = 0; i < n; i += 2) {
    uint8_t lo = q4(kvt_h2f(src[i], dtype), zero, inv);
    uint8_t hi = q4(kvt_h2f(src[i + 1], dtype), zero, inv);
    dst[i / 2] = (uint8_t)(lo | (hi << 4));
  }
}

static void s_dq_i4(const uint8_t *src, size_t n, float scale, float zero, int dtype,
                    uint16_t *dst) {
  for (size_t i = 0; i < n; i += 2) {
    uint8_t b = src[i / 2];
    dst[i] = kvt_f2h((float)(b & 15) * scale + zero, dtype);
    dst[i + 1] = kvt_f2h((float)(b >> 4) * scale + zero, dtype);
  }
}

static void s_q_i4_chan(const uint16_t *src, size_t n, int dtype, const float *zero,
                        const float *inv, uint8_t *dst) {
  for (size_t i = 0; i < n; i += 2) {
    uint8_t lo = q4(kvt_h2f(src[i], dtype), zero[i], inv[i]);
    uint8_t hi = q4(kvt_h2f(src[i + 1], dtype), zero[i + 1], inv[i + 1]);
    dst[i / 2] = (uint8_t)(lo | (hi << 4));
  }
}

static void s_dq_i4_chan(const uint8_t *src, size_t n, const float *scale,
                         const float *zero, int dtype, uint16_t *dst) {
  for (size_t i = 0; i < n; i += 2) {
    uint8_t b = src[i / 2];
    dst[i] = kvt_f2h((float)(b & 15) * scale[i] + zero[i], dtype);
    dst[i + 1] = kvt_f2h((float)(b >> 4) * scale[i + 1] + zero[i + 1], dtype);
  }
}

static size_t s_i4_params(const float *mn, const float *mx, size_t n, uint8_t *params,
                          float *zero, float *inv) {
  for (size_t i = 0; i < n; i++) {
    uint16_t sh, zh;
    float scale;
    if (kvt_i4_params(mn[i], mx[i], &sh, &zh, &scale, &zero[i], &inv[i]))
      return i;
    kvt_st16(params + 4 * i, sh);
    kvt_st16(params + 4 * i + 2, zh);
  }
  return n;
}

static void s_i4_unpack(const uint8_t *params, size_t n, float *scale, float *zero) {
  for (size_t i = 0; i < n; i++) {
    scale[i] = kvt_f16_to_f32(kvt_ld16(params + 4 * i));
    zero[i] = kvt_f16_to_f32(kvt_ld16(params + 4 * i + 2));
  }
}

static void s_scales(const float *amax, size_t n, float qmax, float *scale, float *inv) {
  for (size_t i = 0; i < n; i++)
    kvt_scale_for(amax[i], qmax, &scale[i], &inv[i]);
}

static const kvt_kernels scalar_kernels = {
    "scalar",    s_amax,       s_minmax,    s_minmax_groups, s_minmax_acc, s_q_e4m3,
    s_dq_e4m3,   s_q_i8,       s_dq_i8,     s_q_i4,       s_dq_i4,
    s_q_i4_chan, s_dq_i4_chan, s_i4_params, s_scales,     s_i4_unpack,
};

const kvt_kernels *kvt_kernels_scalar(void) { return &scalar_kernels; }

const kvt_kernels *kvt_kernels_for(const kvt_ctx *ctx) {
  const kvt_kernels *k = NULL;
  if (kvt_ctx_simd(ctx) == KVT_SIMD_AVX2)
    k = kvt_kernels_avx2();
  return k ? k : &scalar_kernels;
}
