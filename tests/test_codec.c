/* tests/test_codec.c - the CPU reference codecs: round trips of every preset
 * and dtype within the stated bounds (n16 bit-exact, e4m3 within half a grid
 * step, i8 and i4 within half a step), strided views, FP8 edge cases, spec
 * text parsing and canonical form. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec_internal.h"
#include "kvtier.h"
#include "synth.h"

/* Small but awkward: 40 tokens leave a partial KIVI token group and a partial
 * scale block; 3 layers let raw= pick the middle one. */
enum { L = 3, T = 40, H = 2, D = 64 };
#define N ((size_t)L * T * H * D)

static kvt_ctx *ctx;

static int setup(void **state) {
  (void)state;
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.simd = KVT_SIMD_SCALAR; /* the reference path; SIMD has its own tests */
  return kvt_ctx_create(&cfg, &ctx);
}

static int teardown(void **state) {
  (void)state;
  kvt_ctx_destroy(ctx);
  return 0;
}

static float h2f(uint16_t h, int dtype) { return kvt_h2f(h, dtype); }

/* Half an ulp of a 16-bit dtype at magnitude a: the output rounding. */
static double half_ulp16(double a, int dtype) {
  int mant = dtype == KVT_DTYPE_BF16 ? 7 : 10;
  double min_normal = dtype == KVT_DTYPE_BF16 ? 0x1p-126 : 0x1p-14;
  if (a < min_normal)
    return 0.5 * min_normal * ldexp(1.0, -mant);
  return 0.5 * ldexp(1.0, (int)floor(log2(a)) - mant);
}

/* Half the e4m3 grid step at |y| (y in scaled units). */
static double half_step_e4m3(double y) {
  y = fabs(y);
  if (y < 0x1p-6)
    return 0.5 * 0x1p-9;
  if (y >= 448.0)
    return 16.0;
  return 0.5 * ldexp(1.0, (int)floor(log2(y)) - 3);
}

typedef struct bound_ctx {
  const kvt_codec_spec *spec;
  int dtype, fmt, is_value;
  const uint16_t *x; /* dense [layer][token][head][dim] */
} bound_ctx;

static size_t at(uint32_t l, uint32_t t, uint32_t h, uint32_t d) {
  return (((size_t)l * T + t) * H + h) * D + d;
}

/* amax over the scale span that covers (l, t, h). */
static float span_amax(const bound_ctx *b, uint32_t l, uint32_t t, uint32_t h) {
  uint32_t t0 = t, t1 = t + 1, h0 = h, h1 = h + 1;
  if (b->spec->scale == KVT_SCALE_BLOCK) {
    t0 = t / b->spec->block * b->spec->block;
    t1 = t0 + b->spec->block < T ? t0 + b->spec->block : T;
  } else if (b->spec->scale == KVT_SCALE_LAYER) {
    t0 = 0, t1 = T, h0 = 0, h1 = H;
  }
  float m = 0;
  for (uint32_t tt = t0; tt < t1; tt++)
    for (uint32_t hh = h0; hh < h1; hh++)
      for (uint32_t d = 0; d < D; d++)
        m = fmaxf(m, fabsf(h2f(b->x[at(l, tt, hh, d)], b->dtype)));
  return m;
}

/* i4 step of the group holding (l, t, h, d). */
static float i4_step(const bound_ctx *b, uint32_t l, uint32_t t, uint32_t h, uint32_t d) {
  float mn = INFINITY, mx = -INFINITY;
  uint32_t G = b->spec->group;
  if (!b->is_value && b->spec->k_axis == KVT_AXIS_TOKEN) {
    uint32_t t0 = t / G * G, t1 = t0 + G < T ? t0 + G : T;
    for (uint32_t tt = t0; tt < t1; tt++) {
      float x = h2f(b->x[at(l, tt, h, d)], b->dtype);
      mn = fminf(mn, x), mx = fmaxf(mx, x);
    }
  } else {
    for (uint32_t dd = d / G * G; dd < d / G * G + G; dd++) {
      float x = h2f(b->x[at(l, t, h, dd)], b->dtype);
      mn = fminf(mn, x), mx = fmaxf(mx, x);
    }
  }
  uint16_t sh, zh;
  float scale, zero, inv;
  assert_int_equal(kvt_i4_params(mn, mx, &sh, &zh, &scale, &zero, &inv), 0);
  return scale;
}

static void check_layer(const bound_ctx *b, const uint16_t *y, uint32_t l) {
  for (uint32_t t = 0; t < T; t++)
    for (uint32_t h = 0; h < H; h++) {
      float amax = b->fmt == KVT_FMT_E4M3 || b->fmt == KVT_FMT_I8 ? span_amax(b, l, t, h) : 0;
      for (uint32_t d = 0; d < D; d++) {
        size_t i = at(l, t, h, d);
        if (b->fmt == KVT_FMT_N16) {
          assert_int_equal(y[i], b->x[i]);
          continue;
        }
        double x = h2f(b->x[i], b->dtype), got = h2f(y[i], b->dtype), bound;
        if (b->fmt == KVT_FMT_E4M3) {
          double scale = amax / 448.0f;
          bound = half_step_e4m3(x / scale) * scale;
        } else if (b->fmt == KVT_FMT_I8) {
          bound = 0.5 * (amax / 127.0f);
        } else {
          bound = 0.5 * i4_step(b, l, t, h, d);
        }
        bound = bound * (1 + 1e-5) + half_ulp16(fabs(x) + bound, b->dtype) + 1e-30;
        if (fabs(got - x) > bound)
          fail_msg("%s %s layer %u token %u head %u dim %u: x %.9g decoded %.9g, bound %.3g",
                   kvt_fmt_name(b->fmt), b->is_value ? "V" : "K", l, t, h, d, x, got, bound);
      }
    }
}

static void roundtrip(const char *text, int dtype) {
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(kvt_codec_parse(ctx, text, &p.spec), 0);
  uint16_t *k = malloc(2 * N), *v = malloc(2 * N), *k2 = malloc(2 * N), *v2 = malloc(2 * N);
  kvt_synth_shape sh = {L, T, H, D, dtype, 3, 20.0f};
  kvt_synth_kv(&sh, 42, k, v);
  uint64_t bound;
  assert_int_equal(kvt_encode_bound(ctx, &p.spec, 0, L, T, H, D, &bound), 0);
  uint8_t *buf = malloc(bound);
  size_t len;
  kvt_kv_view in, out;
  kvt_kv_view_dense(&in, k, v, dtype, L, T, H, D);
  kvt_kv_view_dense(&out, k2, v2, dtype, L, T, H, D);
  int rc = kvt_encode(ctx, &p, &in, buf, bound, &len);
  if (rc)
    fail_msg("%s: %s: %s", text, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  assert_int_equal(len, bound); /* exact without the lossless stage */
  assert_int_equal(kvt_decode(ctx, buf, len, NULL, &out), 0);
  for (uint32_t l = 0; l < L; l++)
    for (int kv = 0; kv < 2; kv++) {
      bound_ctx b = {&p.spec, dtype, kvt_codec_layer_fmt(&p.spec, l, kv), kv, kv ? v : k};
      check_layer(&b, kv ? v2 : k2, l);
    }
  free(buf), free(k), free(v), free(k2), free(v2);
}

static const char *const specs[] = {
    "raw", "k16v8", "fp8", "int8", "k16v4", "k8v4", "int4", "int4,kgroup=dim",
    "int4,group=16", "k=i4,v=e4m3,kgroup=token,group=8", "k16v8,scale=block,block=16",
    "fp8,scale=layer", "int8,scale=block,block=7", "fp8,raw=1", "int4,raw=0,2",
};

static void test_every_preset_round_trips_within_bounds_bf16(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
    roundtrip(specs[i], KVT_DTYPE_BF16);
}

static void test_every_preset_round_trips_within_bounds_fp16(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
    roundtrip(specs[i], KVT_DTYPE_F16);
}

/* Encoding from strided views (K and V interleaved per layer, heads-major)
 * gives the same bytes as from dense arrays; decoding into them writes only
 * their elements. */
static void test_strided_views_encode_and_decode_like_dense(void **state) {
  (void)state;
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(kvt_codec_parse(ctx, "k16v8", &p.spec), 0);
  uint16_t *k = malloc(2 * N), *v = malloc(2 * N);
  kvt_synth_shape sh = {L, T, H, D, KVT_DTYPE_BF16, 0, 0};
  kvt_synth_kv(&sh, 7, k, v);
  /* Layout [layer][kv][head][token][dim + 8 pad]. */
  const int64_t DP = D + 8, sh_ = (int64_t)T * DP, skv = H * sh_, sl = 2 * skv;
  uint16_t *big = calloc((size_t)L * sl, 2);
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t t = 0; t < T; t++)
      for (uint32_t h = 0; h < H; h++) {
        memcpy(big + l * sl + h * sh_ + t * DP, k + at(l, t, h, 0), 2 * D);
        memcpy(big + l * sl + skv + h * sh_ + t * DP, v + at(l, t, h, 0), 2 * D);
      }
  kvt_kv_view dense, strided = {sizeof(kvt_kv_view), big, big + skv, {sl, DP, sh_}, {sl, DP, sh_},
                                L, T, H, D, KVT_DTYPE_BF16};
  kvt_kv_view_dense(&dense, k, v, KVT_DTYPE_BF16, L, T, H, D);
  uint64_t bound;
  assert_int_equal(kvt_encode_bound(ctx, &p.spec, 0, L, T, H, D, &bound), 0);
  uint8_t *a = malloc(bound), *b = malloc(bound);
  size_t la, lb;
  assert_int_equal(kvt_encode(ctx, &p, &dense, a, bound, &la), 0);
  assert_int_equal(kvt_encode(ctx, &p, &strided, b, bound, &lb), 0);
  assert_int_equal(la, lb);
  assert_memory_equal(a, b, la);
  /* Decode into a fresh strided buffer filled with a marker. */
  uint16_t *out = malloc((size_t)L * sl * 2);
  for (size_t i = 0; i < (size_t)L * sl; i++)
    out[i] = 0xBEEF;
  strided.k = out, strided.v = out + skv;
  assert_int_equal(kvt_decode(ctx, a, la, NULL, &strided), 0);
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t h = 0; h < H; h++)
      for (uint32_t t = 0; t < T; t++) {
        const uint16_t *row = out + l * sl + h * sh_ + t * DP;
        assert_memory_equal(row, k + at(l, t, h, 0), 2 * D); /* K is n16: exact */
        for (int pad = D; pad < DP; pad++)
          assert_int_equal(row[pad], 0xBEEF);
        assert_int_equal(row[skv + D], 0xBEEF);
      }
  free(a), free(b), free(out), free(big), free(k), free(v);
}

static uint8_t e4m3(float f) { return kvt_f32_to_e4m3(f); }

static void test_e4m3_edges_match_ocp_and_cuda_rules(void **state) {
  (void)state;
  assert_int_equal(e4m3(0.0f), 0x00);
  assert_int_equal(e4m3(-0.0f), 0x80);
  assert_int_equal(e4m3(1.0f), 0x38);
  assert_int_equal(e4m3(448.0f), 0x7E);
  assert_int_equal(e4m3(-448.0f), 0xFE);
  assert_int_equal(e4m3(449.0f), 0x7E);      /* rounds down to the max */
  assert_int_equal(e4m3(464.0f), 0x7E);      /* tie: even mantissa is 448 */
  assert_int_equal(e4m3(464.5f), 0x7E);      /* above: saturates */
  assert_int_equal(e4m3(1e30f), 0x7E);
  assert_int_equal(e4m3(INFINITY), 0x7E);    /* SATFINITE: no infinities */
  assert_int_equal(e4m3(-INFINITY), 0xFE);
  assert_int_equal(e4m3(NAN), 0x7F);
  assert_int_equal(e4m3(-NAN), 0x7F);        /* canonical NaN, as CUDA */
  assert_int_equal(e4m3(0x1p-9f), 0x01);     /* smallest subnormal */
  assert_int_equal(e4m3(0x1p-10f), 0x00);    /* tie to even: zero */
  assert_int_equal(e4m3(0x1.01p-10f), 0x01);
  assert_int_equal(e4m3(-0x1p-12f), 0x80);   /* underflow keeps the sign */
  assert_int_equal(e4m3(0x1.8p-9f), 0x02);   /* subnormal tie 1.5 -> 2 */
  assert_int_equal(e4m3(0x1.4p-8f), 0x02);   /* 2.5 steps -> 2 (even) */
  assert_int_equal(e4m3(0x1.fp-7f), 0x08);   /* 7.75 steps -> smallest normal */
  assert_int_equal(e4m3(0x1p-6f), 0x08);
  assert_int_equal(e4m3(1.0625f), 0x38);     /* tie between 1 and 1.125 -> 1 */
  assert_int_equal(e4m3(1.1875f), 0x3A);     /* tie between 1.125 and 1.25 -> 1.25 */
  assert_true(isnan(kvt_e4m3_to_f32(0x7F)) && isnan(kvt_e4m3_to_f32(0xFF)));
  assert_true(kvt_e4m3_to_f32(0x01) == 0x1p-9f);
  assert_true(kvt_e4m3_to_f32(0x7E) == 448.0f);
  assert_true(signbit(kvt_e4m3_to_f32(0x80)));
  /* Every code survives decode then encode. */
  for (int c = 0; c < 256; c++)
    if ((c & 0x7F) != 0x7F)
      assert_int_equal(e4m3(kvt_e4m3_to_f32((uint8_t)c)), c);
}

static void test_fp16_directed_rounding_brackets_the_value(void **state) {
  (void)state;
  kvt_rng r = {5};
  for (int i = 0; i < 200000; i++) {
    float x = (float)(kvt_rng_normal(&r) * ldexp(1.0, (int)(kvt_rng_next(&r) % 40) - 25));
    float lo = kvt_f16_to_f32(kvt_f32_to_f16_rd(x)), hi = kvt_f16_to_f32(kvt_f32_to_f16_ru(x));
    assert_true(lo <= x && x <= hi);
    assert_true(lo == hi || kvt_f32_to_f16_ru(lo) != kvt_f32_to_f16_ru(x) || lo == x);
  }
  assert_int_equal(kvt_f32_to_f16(65504.0f), 0x7BFF);
  assert_int_equal(kvt_f32_to_f16(65520.0f), 0x7C00); /* tie rounds to infinity */
  assert_int_equal(kvt_f32_to_f16(0x1p-25f), 0x0000); /* tie to even zero */
  assert_int_equal(kvt_f32_to_f16(0x1.8p-24f), 0x0002);
  assert_int_equal(kvt_f32_to_f16_ru(0x1p-30f), 0x0001);
  assert_int_equal(kvt_f32_to_f16_rd(-0x1p-30f), 0x8001);
  assert_int_equal(kvt_f32_to_bf16(1.00390625f), 0x3F80); /* tie to even */
  assert_int_equal(kvt_f32_to_bf16(1.01171875f), 0x3F82);
}

static void expect_spec(const char *text, const char *canon) {
  kvt_codec_spec s;
  int rc = kvt_codec_parse(ctx, text, &s);
  if (rc)
    fail_msg("%s: %s", text, kvt_ctx_last_error(ctx));
  char buf[KVT_CODEC_SPEC_TEXT_MAX];
  assert_int_equal(kvt_codec_format(&s, buf, sizeof(buf)), 0);
  assert_string_equal(buf, canon);
  kvt_codec_spec again; /* the canonical text parses to the same spec */
  assert_int_equal(kvt_codec_parse(ctx, buf, &again), 0);
  assert_memory_equal(&again, &s, sizeof(s));
}

static void test_spec_text_parses_presets_options_and_canonicalises(void **state) {
  (void)state;
  expect_spec("raw", "raw");
  expect_spec("k16v8", "k16v8");
  expect_spec("k=n16,v=e4m3", "k16v8");
  expect_spec("k=e4m3,v=e4m3,scale=token", "fp8");
  expect_spec("int8", "int8");
  expect_spec("k=i8,v=i4,group=64", "k8v4,group=64");
  expect_spec("int4,kgroup=dim", "int4,kgroup=dim");
  expect_spec("k16v8,scale=block", "k16v8,scale=block,block=16");
  expect_spec("fp8,scale=block,block=32,raw=0,31,5-7", "fp8,scale=block,block=32,raw=0,5-7,31");
  expect_spec("raw,group=8,scale=layer", "raw"); /* options the formats ignore */
  expect_spec("k=i4,v=i4,kgroup=token,group=16", "int4,group=16");
}

/* Every K/V pair has its own canonical text and fingerprint, including the
 * pairs no preset names; the longest raw= list still formats. */
static void test_every_format_pair_formats_parses_and_fingerprints_apart(void **state) {
  (void)state;
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = "m";
  m.layers = 256, m.kv_heads = 8, m.head_dim = 128;
  kvt_key fps[16];
  for (int k = 0; k < 4; k++)
    for (int v = 0; v < 4; v++) {
      char text[64], canon[KVT_CODEC_SPEC_TEXT_MAX];
      snprintf(text, sizeof(text), "k=%s,v=%s", kvt_fmt_name(k), kvt_fmt_name(v));
      kvt_codec_spec s, back;
      assert_int_equal(kvt_codec_parse(ctx, text, &s), 0);
      assert_int_equal(kvt_codec_format(&s, canon, sizeof(canon)), 0);
      assert_int_equal(kvt_codec_parse(ctx, canon, &back), 0);
      assert_memory_equal(&s, &back, sizeof(s));
      assert_int_equal(kvt_fingerprint(&m, &s, &fps[4 * k + v]), 0);
      for (int j = 0; j < 4 * k + v; j++)
        assert_memory_not_equal(&fps[j], &fps[4 * k + v], 16);
    }
  char text[KVT_CODEC_SPEC_TEXT_MAX] = "k=e4m3,v=i4,group=1024,kgroup=dim,scale=block,block=65535";
  for (int l = 0; l < KVT_MAX_RAW_LAYER; l += 2) /* the longest list: no ranges */
    snprintf(text + strlen(text), sizeof(text) - strlen(text), "%s%d", l ? "," : ",raw=", l);
  kvt_codec_spec s, back;
  assert_int_equal(kvt_codec_parse(ctx, text, &s), 0);
  char canon[KVT_CODEC_SPEC_TEXT_MAX];
  assert_int_equal(kvt_codec_format(&s, canon, sizeof(canon)), 0);
  assert_int_equal(kvt_codec_parse(ctx, canon, &back), 0);
  assert_memory_equal(&s, &back, sizeof(s));
}

/* A spec built by hand, with junk in fields its formats ignore, encodes to
 * the same bytes as the parsed preset; encode and decode need a context. */
static void test_hand_built_specs_encode_like_parsed_ones(void **state) {
  (void)state;
  uint16_t k[2 * 4 * 64], v[2 * 4 * 64];
  kvt_synth_shape sh = {2, 4, 1, 64, KVT_DTYPE_BF16, 0, 0};
  kvt_synth_kv(&sh, 9, k, v);
  kvt_kv_view view;
  kvt_kv_view_dense(&view, k, v, KVT_DTYPE_BF16, 2, 4, 1, 64);
  kvt_encode_params a = KVT_ENCODE_PARAMS_INIT, b = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(kvt_codec_parse(ctx, "k16v8", &a.spec), 0);
  b.spec.k_fmt = KVT_FMT_N16, b.spec.v_fmt = KVT_FMT_E4M3;
  b.spec.group = 0, b.spec.block = 0, b.spec.k_axis = KVT_AXIS_DIM; /* unused by k16v8 */
  uint8_t pa[8192], pb[8192];
  size_t la, lb;
  assert_int_equal(kvt_encode(ctx, &a, &view, pa, sizeof(pa), &la), 0);
  assert_int_equal(kvt_encode(ctx, &b, &view, pb, sizeof(pb), &lb), 0);
  assert_int_equal(la, lb);
  assert_memory_equal(pa, pb, la);
  assert_int_equal(kvt_encode(NULL, &a, &view, pb, sizeof(pb), &lb), -EINVAL);
  assert_int_equal(kvt_decode(NULL, pa, la, NULL, &view), -EINVAL);
}

static void expect_bad_spec(const char *text, const char *detail) {
  kvt_codec_spec s;
  assert_int_equal(kvt_codec_parse(ctx, text, &s), KVT_ESPEC);
  if (!strstr(kvt_ctx_last_error(ctx), detail))
    fail_msg("'%s': detail '%s' lacks '%s'", text, kvt_ctx_last_error(ctx), detail);
}

static void test_spec_text_rejects_bad_words_with_the_cause(void **state) {
  (void)state;
  expect_bad_spec("", "empty");
  expect_bad_spec("int3", "unknown preset 'int3'");
  expect_bad_spec("k=n16", "both k= and v=");
  expect_bad_spec("k=f8,v=i4", "k=f8");
  expect_bad_spec("int4,group=3", "group=3");
  expect_bad_spec("int4,group=0", "group=0");
  expect_bad_spec("fp8,scale=row", "scale=row");
  expect_bad_spec("fp8,block=0", "block=0");
  expect_bad_spec("fp8,raw=9999", "raw=9999");
  expect_bad_spec("fp8,raw=5-2", "raw=5-2");
  expect_bad_spec("fp8,color=red", "unknown option 'color'");
  expect_bad_spec("fp8,17", "expected a preset");
}

static void test_encode_rejects_shapes_the_spec_cannot_hold(void **state) {
  (void)state;
  uint16_t buf16[2 * 3 * 48] = {0};
  uint8_t out[8192];
  size_t len;
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  kvt_kv_view v;
  assert_int_equal(kvt_codec_parse(ctx, "int4,kgroup=dim", &p.spec), 0);
  kvt_kv_view_dense(&v, buf16, buf16 + 144, KVT_DTYPE_BF16, 1, 3, 1, 48);
  assert_int_equal(kvt_encode(ctx, &p, &v, out, sizeof(out), &len), KVT_ESHAPE);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "group 32 does not divide head_dim 48"));
  kvt_kv_view_dense(&v, buf16, buf16 + 144, 9, 1, 3, 1, 48);
  assert_int_equal(kvt_encode(ctx, &p, &v, out, sizeof(out), &len), KVT_ESHAPE);
  assert_int_equal(kvt_codec_parse(ctx, "k16v8", &p.spec), 0);
  kvt_kv_view_dense(&v, buf16, buf16 + 144, KVT_DTYPE_BF16, 1, 3, 1, 48);
  p.layer_begin = 5, p.model_layers = 4;
  assert_int_equal(kvt_encode(ctx, &p, &v, out, sizeof(out), &len), KVT_ESHAPE);
}

/* i4 groups whose values exceed fp16's range are refused, not stored wrong. */
static void test_i4_refuses_ranges_beyond_fp16(void **state) {
  (void)state;
  uint16_t k[64], v[64];
  for (int i = 0; i < 64; i++)
    k[i] = v[i] = kvt_f32_to_bf16(i == 9 ? 1e6f : 1.0f);
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(kvt_codec_parse(ctx, "k16v4", &p.spec), 0);
  kvt_kv_view view;
  kvt_kv_view_dense(&view, k, v, KVT_DTYPE_BF16, 1, 1, 1, 64);
  uint8_t out[4096];
  size_t len;
  assert_int_equal(kvt_encode(ctx, &p, &view, out, sizeof(out), &len), KVT_ERANGE);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "V layer 0 token 0 head 0"));
}

#if defined(__x86_64__)
#include <xmmintrin.h>
/* An engine running with flush-to-zero, denormals-are-zero and another
 * rounding mode gets the same payload bytes and decoded values, and its own
 * floating-point mode back. */
static void test_encode_decode_ignore_and_restore_the_callers_fp_mode(void **state) {
  (void)state;
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(kvt_codec_parse(ctx, "int4", &p.spec), 0);
  uint16_t *k = malloc(2 * N), *v = malloc(2 * N), *out1 = malloc(4 * N), *out2 = malloc(4 * N);
  kvt_synth_shape sh = {L, T, H, D, KVT_DTYPE_BF16, 3, 20.0f};
  kvt_synth_kv(&sh, 3, k, v);
  for (size_t i = 0; i < N; i += 7) /* tiny values: e4m3/fp16 subnormals */
    v[i] = kvt_f32_to_bf16((float)(i % 5) * 1e-7f);
  uint64_t bound;
  assert_int_equal(kvt_encode_bound(ctx, &p.spec, 0, L, T, H, D, &bound), 0);
  uint8_t *a = malloc(bound), *b = malloc(bound);
  size_t la, lb;
  kvt_kv_view in, o1, o2;
  kvt_kv_view_dense(&in, k, v, KVT_DTYPE_BF16, L, T, H, D);
  kvt_kv_view_dense(&o1, out1, out1 + N, KVT_DTYPE_BF16, L, T, H, D);
  kvt_kv_view_dense(&o2, out2, out2 + N, KVT_DTYPE_BF16, L, T, H, D);
  assert_int_equal(kvt_encode(ctx, &p, &in, a, bound, &la), 0);
  assert_int_equal(kvt_decode(ctx, a, la, NULL, &o1), 0);
  const unsigned saved = _mm_getcsr();
  const unsigned odd = (saved & ~0x6000u) | 0x8040u | 0x6000u; /* FTZ, DAZ, toward zero */
  _mm_setcsr(odd);
  int rc1 = kvt_encode(ctx, &p, &in, b, bound, &lb);
  int rc2 = kvt_decode(ctx, b, lb, NULL, &o2);
  unsigned after = _mm_getcsr();
  _mm_setcsr(saved);
  assert_int_equal(rc1, 0);
  assert_int_equal(rc2, 0);
  assert_int_equal(after & ~0x3Fu, odd & ~0x3Fu);
  assert_int_equal(la, lb);
  assert_memory_equal(a, b, la);
  assert_memory_equal(out1, out2, 4 * N);
  free(a), free(b), free(k), free(v), free(out1), free(out2);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_preset_round_trips_within_bounds_bf16),
      cmocka_unit_test(test_every_preset_round_trips_within_bounds_fp16),
      cmocka_unit_test(test_strided_views_encode_and_decode_like_dense),
      cmocka_unit_test(test_e4m3_edges_match_ocp_and_cuda_rules),
      cmocka_unit_test(test_fp16_directed_rounding_brackets_the_value),
      cmocka_unit_test(test_spec_text_parses_presets_options_and_canonicalises),
      cmocka_unit_test(test_spec_text_rejects_bad_words_with_the_cause),
      cmocka_unit_test(test_every_format_pair_formats_parses_and_fingerprints_apart),
      cmocka_unit_test(test_hand_built_specs_encode_like_parsed_ones),
      cmocka_unit_test(test_encode_rejects_shapes_the_spec_cannot_hold),
      cmocka_unit_test(test_i4_refuses_ranges_beyond_fp16),
#if defined(__x86_64__)
      cmocka_unit_test(test_encode_decode_ignore_and_restore_the_callers_fp_mode),
#endif
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
