/* codec/convert.c - scalar element conversions: bf16, fp16 (nearest-even
 * and directed) and OCP FP8 E4M3, plus the scale rules every path shares.
 * These are the reference the SIMD and GPU paths must match bit for bit. */
#include <math.h>

#include "codec_internal.h"
#include "kvt_internal.h"

static inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float kvt_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t kvt_f32_to_bf16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u)
    return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN, sign and payload kept */
  x += 0x7FFFu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float kvt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0) {
    float v = (float)mant * 0x1p-24f; /* exact: at most 10 significant bits */
    return sign ? -v : v;
  }
  if (exp == 31)
    return u2f(sign | 0x7F800000u | (mant << 13));
  return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t kvt_f32_to_f16(float f) {
  uint32_t x = f2u(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u)
    return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  if (ax >= 0x477FF000u) /* >= 65520: rounds to infinity */
    return (uint16_t)(sign | 0x7C00u);
  if (ax >= 0x38800000u) { /* normal in fp16 */
    uint32_t r = ax + 0xFFFu + ((ax >> 13) & 1u) - 0x38000000u;
    return (uint16_t)(sign | (r >> 13));
  }
  /* Subnormal: adding 0.5 (ulp 2^-24) lets the FPU round to nearest even. */
  float t = u2f(ax) + 0.5f;
  return (uint16_t)(sign | (f2u(t) - 0x3F000000u));
}

/* Next fp16 toward -inf / +inf from a finite or infinite h. */
static uint16_t f16_down(uint16_t h) {
  if (h == 0x0000u || h == 0x8000u)
    return 0x8001u;
  return (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
}
static uint16_t f16_up(uint16_t h) {
  if (h == 0x0000u || h == 0x8000u)
    return 0x0001u;
  return (h & 0x8000u) ? (uint16_t)(h - 1u) : (uint16_t)(h + 1u);
}

uint16_t kvt_f32_to_f16_rd(float f) {
  uint16_t h = kvt_f32_to_f16(f);
  if (f == f && kvt_f16_to_f32(h) > f)
    h = f16_down(h);
  return h;
}

uint16_t kvt_f32_to_f16_ru(float f) {
  uint16_t h = kvt_f32_to_f16(f);
  if (f == f && kvt_f16_to_f32(h) < f)
    h = f16_up(h);
  return h;
}

uint8_t kvt_f32_to_e4m3(float f) {
  uint32_t x = f2u(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u)
    return 0x7Fu; /* NaN, canonical, as CUDA gives it */
  if (ax > 0x43E80000u) /* > 464 = 448 + half an ulp: saturate */
    return (uint8_t)(sign | 0x7Eu);
  if (ax >= 0x3C800000u) { /* >= 2^-6: normal in e4m3 */
    uint32_t r = ax + 0x7FFFFu + ((ax >> 20) & 1u) - (120u << 23);
    return (uint8_t)(sign | (r >> 20));
  }
  if (ax <= 0x3A800000u) /* <= 2^-10, half the smallest subnormal */
    return sign;
  /* Subnormal: 2^14 has an ulp of 2^-9, the e4m3 subnormal step. */
  float t = u2f(ax) + 16384.0f;
  return (uint8_t)(sign | (f2u(t) - 0x46800000u));
}

float kvt_e4m3_to_f32(uint8_t b) {
  uint32_t mag = b & 0x7Fu;
  if (mag == 0x7Fu)
    return u2f(0x7FC00000u | ((uint32_t)(b & 0x80u) << 24));
  /* Exponent and mantissa land in fp32's fields and 2^120 re-biases them.
   * Subnormal codes are computed apart: the same product would read an fp32
   * denormal, which a caller's denormals-are-zero mode turns into 0. */
  float v = mag < 8 ? (float)mag * 0x1p-9f : u2f(mag << 20) * 0x1p120f;
  return (b & 0x80u) ? -v : v;
}

int kvt_i4_params(float mn, float mx, uint16_t *scale_h, uint16_t *zero_h,
                  float *scale, float *zero, float *inv) {
  /* -0 + 0 = +0: the sign of a zero extreme depends on the order a min/max
   * scan met its zeros, which vector and GPU reductions need not share. */
  mn += 0.0f;
  mx += 0.0f;
  uint16_t zh = kvt_f32_to_f16_rd(mn);
  float z = kvt_f16_to_f32(zh);
  if (!isfinite(z))
    return KVT_ERANGE;
  uint16_t sh = kvt_f32_to_f16_ru((mx - z) / 15.0f);
  float s = kvt_f16_to_f32(sh);
  if (!isfinite(s))
    return KVT_ERANGE;
  *scale_h = sh;
  *zero_h = zh;
  *scale = s;
  *zero = z;
  *inv = s > 0.0f ? 1.0f / s : 0.0f;
  return 0;
}
