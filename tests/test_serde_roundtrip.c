/* tests/test_serde_roundtrip.c - the encoder and decoder on good input:
 * round trips of every preset with and without zstd, strided views (vLLM
 * interleaved, heads-major) that must give the dense payload and decode
 * into the heads and only them, decode expectations (foreign key or
 * fingerprint, mismatched view, layer subsets), encode failures (too small
 * a buffer, non-finite values in quantized tensors) with NaN/Inf kept bit
 * exact in n16/raw layers, and kvt_encode_bound() for a later view. */
#include "serde_sample.h"

#include <errno.h>
#include <math.h>

/* ---- decode: expectations, views, layer subsets ---- */

static void test_serde_decode_rejects_foreign_key_and_fingerprint(void **state) {
  (void)state;
  sample s;
  small(&s);
  uint16_t *k = malloc(2 * elems(&s)), *v = malloc(2 * elems(&s));
  assert_true(k && v);
  kvt_kv_view view;
  kvt_kv_view_dense(&view, k, v, s.dtype, s.L, s.T, s.H, s.D);
  kvt_decode_params dp = KVT_DECODE_PARAMS_INIT;
  kvt_key other_key = s.p.key, other_fp = s.p.fingerprint;
  other_key.bytes[15] ^= 1;
  other_fp.bytes[0] ^= 0x80;
  dp.expect_key = &s.p.key;
  dp.expect_fingerprint = &s.p.fingerprint;
  assert_int_equal(kvt_decode(ctx, s.buf, s.len, &dp, &view), 0);
  dp.expect_key = &other_key;
  expect_rc(kvt_decode(ctx, s.buf, s.len, &dp, &view), KVT_EFOREIGN, "payload key", "key");
  dp.expect_key = &s.p.key;
  dp.expect_fingerprint = &other_fp;
  expect_rc(kvt_decode(ctx, s.buf, s.len, &dp, &view), KVT_EFOREIGN, "model fingerprint",
            "fingerprint");
  dp.struct_size = sizeof(dp) - 1;
  expect_rc(kvt_decode(ctx, s.buf, s.len, &dp, &view), -EINVAL, "struct_size", "struct_size");
  free(k);
  free(v);
  sample_free(&s);
}

static void test_serde_decode_rejects_mismatched_view(void **state) {
  (void)state;
  sample s;
  small(&s);
  uint16_t *k = malloc(4 * elems(&s)), *v = malloc(4 * elems(&s));
  assert_true(k && v);
  kvt_kv_view good;
  kvt_kv_view_dense(&good, k, v, s.dtype, s.L, s.T, s.H, s.D);
  assert_int_equal(kvt_decode(ctx, s.buf, s.len, NULL, &good), 0);
  for (int i = 0; i < 7; i++) {
    kvt_kv_view bad = good;
    const char *what[] = {"tokens", "heads", "head_dim", "layers", "dtype", "no K", "no V"};
    switch (i) {
    case 0:
      bad.tokens++;
      break;
    case 1:
      bad.heads--;
      break;
    case 2:
      bad.head_dim *= 2;
      break;
    case 3:
      bad.layers = 1;
      break;
    case 4:
      bad.dtype = KVT_DTYPE_F16;
      break;
    case 5:
      bad.k = NULL;
      break;
    default:
      bad.v = NULL;
      break;
    }
    expect_rc(kvt_decode(ctx, s.buf, s.len, NULL, &bad), KVT_ESHAPE, i < 5 ? "view " : "pointer",
              what[i]);
  }
  expect_rc(kvt_decode(ctx, s.buf, s.len, NULL, NULL), KVT_ESHAPE, NULL, "NULL view");
  free(k);
  free(v);
  sample_free(&s);
}

static void test_serde_decode_of_layer_subsets_matches_full_decode(void **state) {
  (void)state;
  sample s;
  sample_make(&s, "k8v4,raw=2", KVT_DTYPE_BF16, 4, 6, 2, 32, 0);
  const size_t per_layer = (size_t)s.T * s.H * s.D;
  uint16_t *fk = malloc(2 * elems(&s)), *fv = malloc(2 * elems(&s));
  uint16_t *k = malloc(2 * elems(&s)), *v = malloc(2 * elems(&s));
  assert_true(fk && fv && k && v);
  assert_int_equal(decode_dense(&s, s.buf, s.len, fk, fv), 0);
  for (uint32_t first = 0; first < s.L; first++)
    for (uint32_t count = 0; first + count <= s.L; count++) {
      uint32_t n = count ? count : s.L - first;
      kvt_decode_params dp = KVT_DECODE_PARAMS_INIT;
      dp.layer_first = first;
      dp.layer_count = count;
      kvt_kv_view view;
      kvt_kv_view_dense(&view, k, v, s.dtype, n, s.T, s.H, s.D);
      memset(k, 0xEE, 2 * elems(&s));
      memset(v, 0xEE, 2 * elems(&s));
      assert_int_equal(kvt_decode(ctx, s.buf, s.len, &dp, &view), 0);
      assert_memory_equal(k, fk + first * per_layer, 2 * n * per_layer);
      assert_memory_equal(v, fv + first * per_layer, 2 * n * per_layer);
      /* Nothing past the view's layers is written. */
      if (n < s.L)
        assert_int_equal(k[n * per_layer], 0xEEEE);
    }
  kvt_decode_params dp = KVT_DECODE_PARAMS_INIT;
  kvt_kv_view view;
  kvt_kv_view_dense(&view, k, v, s.dtype, 1, s.T, s.H, s.D);
  dp.layer_first = 4;
  expect_rc(kvt_decode(ctx, s.buf, s.len, &dp, &view), -EINVAL, "layers 4+", "first = 4");
  dp.layer_first = 2, dp.layer_count = 3;
  expect_rc(kvt_decode(ctx, s.buf, s.len, &dp, &view), -EINVAL, "layers 2+3", "2+3 of 4");
  dp.layer_first = 1, dp.layer_count = UINT32_MAX;
  expect_rc(kvt_decode(ctx, s.buf, s.len, &dp, &view), -EINVAL, NULL, "1+2^32-1");
  free(fk);
  free(fv);
  free(k);
  free(v);
  sample_free(&s);
}

/* ---- round trips ---- */

static const char *const presets[] = {"raw",
                                      "k16v8",
                                      "fp8",
                                      "int8",
                                      "k16v4",
                                      "k8v4",
                                      "int4",
                                      "int4,kgroup=dim",
                                      "fp8,scale=block,block=5",
                                      "int8,scale=layer"};

static double h2d(uint16_t h, int dtype) {
  return dtype == KVT_DTYPE_BF16 ? kvt_bf16_to_f32(h) : kvt_f16_to_f32(h);
}

/* RMS error over RMS signal; 0 means bit-exact values. */
static double rel_rms(const uint16_t *a, const uint16_t *b, size_t n, int dtype) {
  double e = 0, s = 0;
  for (size_t i = 0; i < n; i++) {
    double x = h2d(a[i], dtype), y = h2d(b[i], dtype);
    e += (x - y) * (x - y);
    s += x * x;
  }
  return sqrt(e / s);
}

static double tolerance(int fmt) {
  /* About twice what these shapes measure (scale=layer i8 keys: 0.024). */
  return fmt == KVT_FMT_N16 ? 0 : fmt == KVT_FMT_I4 ? 0.25 : 0.05;
}

static void test_serde_round_trips_every_preset_with_and_without_zstd(void **state) {
  (void)state;
  const int dtypes[2] = {KVT_DTYPE_BF16, KVT_DTYPE_F16};
  for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
    for (int d = 0; d < 2; d++) {
      sample s;
      sample_make(&s, presets[i], dtypes[d], 2, 16, 2, 64, 0);
      size_t n = elems(&s);
      uint16_t *k = malloc(2 * n), *v = malloc(2 * n), *zk = malloc(2 * n), *zv = malloc(2 * n);
      assert_true(k && v && zk && zv);
      assert_int_equal(kvt_payload_verify(ctx, s.buf, s.len, NULL), 0);
      assert_int_equal(decode_dense(&s, s.buf, s.len, k, v), 0);
      double ek = rel_rms(s.k, k, n, s.dtype), ev = rel_rms(s.v, v, n, s.dtype);
      if (ek > tolerance(s.p.spec.k_fmt) || ev > tolerance(s.p.spec.v_fmt))
        fail_msg("%s %s: relative RMS error K %.4f V %.4f", presets[i], kvt_dtype_name(s.dtype), ek,
                 ev);
      if (kvt_has_feature("zstd")) {
        s.p.zstd_level = 3;
        sample_encode(&s);
        assert_int_equal(kvt_payload_verify(ctx, s.buf, s.len, NULL), 0);
        assert_int_equal(decode_dense(&s, s.buf, s.len, zk, zv), 0);
        assert_memory_equal(k, zk, 2 * n);
        assert_memory_equal(v, zv, 2 * n);
        if (s.p.spec.k_fmt == KVT_FMT_N16) /* 16-bit KV always pays */
          assert_true(kvt_ld32(s.buf + H_FLAGS) & KVT_FLAG_LOSSLESS);
      }
      free(k), free(v), free(zk), free(zv);
      sample_free(&s);
    }
}

static void test_serde_zstd_request_without_zstd_is_not_supported(void **state) {
  (void)state;
  if (kvt_has_feature("zstd"))
    skip();
  sample s;
  small(&s);
  s.p.zstd_level = 3;
  uint8_t buf[4096];
  size_t len;
  kvt_kv_view view;
  kvt_kv_view_dense(&view, s.k, s.v, s.dtype, s.L, s.T, s.H, s.D);
  expect_rc(kvt_encode(ctx, &s.p, &view, buf, sizeof(buf), &len), KVT_ENOTSUP, "zstd", "encode");
  sample_free(&s);
}

/* Fills every element of n with a sentinel, so untouched padding shows. */
static void fill16(uint16_t *p, size_t n, uint16_t x) {
  for (size_t i = 0; i < n; i++)
    p[i] = x;
}

/* Copies dense K/V into a strided view and back, checks the payload is the
 * one the dense view gives, and that decoding writes the heads and only them. */
static void strided_round_trip(sample *s, kvt_kv_view *view, uint16_t *arena, size_t arena_n) {
  const uint32_t L = s->L, T = s->T, H = s->H, D = s->D;
  fill16(arena, arena_n, 0x7E7E);
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t t = 0; t < T; t++)
      for (uint32_t h = 0; h < H; h++) {
        size_t dense = (((size_t)l * T + t) * H + h) * D;
        memcpy((uint16_t *)view->k + l * view->k_stride[0] + t * view->k_stride[1] +
                   h * view->k_stride[2],
               s->k + dense, 2 * D);
        memcpy((uint16_t *)view->v + l * view->v_stride[0] + t * view->v_stride[1] +
                   h * view->v_stride[2],
               s->v + dense, 2 * D);
      }
  uint8_t *b = malloc(s->len);
  size_t len;
  assert_non_null(b);
  assert_int_equal(kvt_encode(ctx, &s->p, view, b, s->len, &len), 0);
  assert_int_equal(len, s->len);
  assert_memory_equal(b, s->buf, len);

  size_t n = elems(s);
  uint16_t *k = malloc(2 * n), *v = malloc(2 * n);
  assert_true(k && v);
  assert_int_equal(decode_dense(s, s->buf, s->len, k, v), 0);
  fill16(arena, arena_n, 0x7E7E);
  assert_int_equal(kvt_decode(ctx, s->buf, s->len, NULL, view), 0);
  uint8_t *mine = calloc(arena_n, 1);
  assert_non_null(mine);
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t t = 0; t < T; t++)
      for (uint32_t h = 0; h < H; h++) {
        size_t dense = (((size_t)l * T + t) * H + h) * D;
        const uint16_t *pk = (uint16_t *)view->k + l * view->k_stride[0] + t * view->k_stride[1] +
                             h * view->k_stride[2];
        const uint16_t *pv = (uint16_t *)view->v + l * view->v_stride[0] + t * view->v_stride[1] +
                             h * view->v_stride[2];
        assert_memory_equal(pk, k + dense, 2 * D);
        assert_memory_equal(pv, v + dense, 2 * D);
        memset(mine + (pk - arena), 1, D);
        memset(mine + (pv - arena), 1, D);
      }
  for (size_t i = 0; i < arena_n; i++)
    if (!mine[i] && arena[i] != 0x7E7E)
      fail_msg("decode wrote element %zu of the arena, outside every head vector", i);
  free(mine), free(b), free(k), free(v);
}

/* vLLM's per-layer cache is [2, blocks, block_size, heads, dim]: K and V of
 * one layer in one buffer, V a whole K-plane later. Padding is added to every
 * stride so a stride mix-up reads or writes the wrong place. */
static void test_serde_round_trips_vllm_interleaved_strided_view(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
    sample s;
    sample_make(&s, presets[i], KVT_DTYPE_BF16, 2, 16, 2, 64, 0);
    const int64_t sh = s.D + 8, st = s.H * sh + 24, plane = s.T * st + 40, sl = 2 * plane + 64;
    size_t arena_n = (size_t)(s.L * sl);
    uint16_t *arena = malloc(2 * arena_n);
    assert_non_null(arena);
    kvt_kv_view view = {sizeof(kvt_kv_view), arena, arena + plane, {sl, st, sh}, {sl, st, sh},
                        s.L, s.T, s.H, s.D, s.dtype};
    strided_round_trip(&s, &view, arena, arena_n);
    free(arena);
    sample_free(&s);
  }
}

static void test_serde_round_trips_heads_major_view(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
    sample s;
    sample_make(&s, presets[i], KVT_DTYPE_F16, 3, 10, 4, 32, 0);
    const int64_t st = s.D, sh = (int64_t)s.T * s.D, sl = s.H * sh;
    size_t arena_n = 2 * (size_t)(s.L * sl);
    uint16_t *arena = malloc(2 * arena_n);
    assert_non_null(arena);
    /* K [layer][head][token][dim], V the same after all of K. */
    kvt_kv_view view = {sizeof(kvt_kv_view), arena, arena + s.L * sl, {sl, st, sh}, {sl, st, sh},
                        s.L, s.T, s.H, s.D, s.dtype};
    strided_round_trip(&s, &view, arena, arena_n);
    free(arena);
    sample_free(&s);
  }
}

/* ---- encode failures ---- */

static void test_serde_encode_rejects_too_small_buffer(void **state) {
  (void)state;
  sample s;
  small(&s);
  kvt_kv_view view;
  kvt_kv_view_dense(&view, s.k, s.v, s.dtype, s.L, s.T, s.H, s.D);
  uint8_t *b = malloc(s.len);
  assert_non_null(b);
  size_t len, caps[] = {1, HDR_FIXED, 319, 320, 576, 1024, s.len - 1};
  for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++)
    expect_rc(kvt_encode(ctx, &s.p, &view, b, caps[i], &len), KVT_ENOBUFS, "bytes given",
              "small cap");
  /* Without the lossless stage the bound is exact. */
  assert_int_equal(kvt_encode(ctx, &s.p, &view, b, s.len, &len), 0);
  assert_int_equal(len, s.len);
  free(b);
  sample_free(&s);
}

/* kvt_encode_bound() must hold for a view that does not start at layer 0:
 * raw= names absolute layers, and a raw layer is larger than a quantized one. */
static void test_serde_encode_bound_covers_raw_layers_of_a_later_view(void **state) {
  (void)state;
  sample s;
  sample_make(&s, "fp8", KVT_DTYPE_BF16, 2, 4, 2, 16, 0);
  kvt_encode_params p = s.p;
  assert_int_equal(kvt_codec_parse(ctx, "fp8,raw=5", &p.spec), 0);
  p.layer_begin = 4;
  p.model_layers = 8;
  uint64_t bound;
  assert_int_equal(kvt_encode_bound(ctx, &p.spec, p.layer_begin, s.L, s.T, s.H, s.D, &bound), 0);
  uint8_t *b = malloc(bound + 4096);
  assert_non_null(b);
  kvt_kv_view view;
  kvt_kv_view_dense(&view, s.k, s.v, s.dtype, s.L, s.T, s.H, s.D);
  size_t len = 0;
  assert_int_equal(kvt_encode(ctx, &p, &view, b, bound + 4096, &len), 0);
  free(b);
  sample_free(&s);
  if (len > bound)
    fail_msg("kvt_encode_bound said %llu bytes; layers 4..5 with raw=5 need %zu",
             (unsigned long long)bound, len);
}

static const uint16_t NAN16 = 0x7FC0, INF_BF16 = 0x7F80, INF_F16 = 0x7C00;

static void test_serde_encode_names_nonfinite_in_quantized_tensor(void **state) {
  (void)state;
  static const struct {
    const char *spec;
    int dtype, in_v;
    uint16_t bad;
    const char *detail;
  } cases[] = {
      {"fp8", KVT_DTYPE_BF16, 1, 0x7FC0, "V layer 1 token 3 head 1 dim 5 is NaN"},
      {"int8", KVT_DTYPE_BF16, 0, 0x7F80, "K layer 1 token 3 head 1 dim 5 is Inf"},
      {"int8", KVT_DTYPE_F16, 0, 0xFC00, "K layer 1 token 3 head 1 dim 5 is Inf"},
      {"k16v8", KVT_DTYPE_F16, 1, 0x7E01, "V layer 1 token 3 head 1 dim 5 is NaN"},
      {"int4", KVT_DTYPE_BF16, 0, 0xFFC0, "K layer 1 token 3 head 1 dim 5 is NaN"},
      {"int4,kgroup=dim", KVT_DTYPE_BF16, 0, 0x7F80, "K layer 1 token 3 head 1 dim 5 is Inf"},
      {"k16v4", KVT_DTYPE_F16, 1, 0x7C00, "V layer 1 token 3 head 1 dim 5 is Inf"},
      {"fp8,scale=layer", KVT_DTYPE_BF16, 1, 0x7FC0, "V layer 1 token 3 head 1 dim 5"},
      {"int8,scale=block,block=4", KVT_DTYPE_BF16, 0, 0x7FC0, "K layer 1 token 3 head 1 dim 5"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    sample s;
    sample_make(&s, cases[i].spec, cases[i].dtype, 2, 4, 2, 32, 0);
    uint16_t *t = cases[i].in_v ? s.v : s.k;
    t[(((size_t)1 * s.T + 3) * s.H + 1) * s.D + 5] = cases[i].bad;
    kvt_kv_view view;
    kvt_kv_view_dense(&view, s.k, s.v, s.dtype, s.L, s.T, s.H, s.D);
    size_t len;
    expect_rc(kvt_encode(ctx, &s.p, &view, s.buf, s.len, &len), KVT_ENONFINITE, cases[i].detail,
              cases[i].spec);
    sample_free(&s);
  }
}

/* n16 sections copy bits: NaN and Inf are the engine's business there. */
static void test_serde_encode_keeps_nonfinite_in_n16_tensor_bit_exact(void **state) {
  (void)state;
  const char *specs[] = {"k16v8", "raw", "fp8,raw=1"};
  for (int i = 0; i < 3; i++)
    for (int d = 0; d < 2; d++) {
      int dtype = d ? KVT_DTYPE_F16 : KVT_DTYPE_BF16;
      sample s;
      sample_make(&s, specs[i], dtype, 2, 4, 2, 16, 0);
      const uint16_t odd[] = {NAN16, 0xFFFF, 0x7F81, 0x8001, d ? INF_F16 : INF_BF16, 0xFC01};
      uint16_t *t = i == 2 ? s.v : s.k; /* fp8,raw=1: V of layer 1 is n16 */
      size_t layer1 = (size_t)s.T * s.H * s.D;
      for (size_t j = 0; j < sizeof(odd) / sizeof(odd[0]); j++)
        t[layer1 + 7 * j + 1] = odd[j];
      sample_encode(&s);
      uint16_t *k = malloc(2 * elems(&s)), *v = malloc(2 * elems(&s));
      assert_true(k && v);
      assert_int_equal(decode_dense(&s, s.buf, s.len, k, v), 0);
      assert_memory_equal((i == 2 ? v : k) + layer1, t + layer1, 2 * layer1);
      free(k);
      free(v);
      sample_free(&s);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_serde_decode_rejects_foreign_key_and_fingerprint),
      cmocka_unit_test(test_serde_decode_rejects_mismatched_view),
      cmocka_unit_test(test_serde_decode_of_layer_subsets_matches_full_decode),
      cmocka_unit_test(test_serde_round_trips_every_preset_with_and_without_zstd),
      cmocka_unit_test(test_serde_zstd_request_without_zstd_is_not_supported),
      cmocka_unit_test(test_serde_round_trips_vllm_interleaved_strided_view),
      cmocka_unit_test(test_serde_round_trips_heads_major_view),
      cmocka_unit_test(test_serde_encode_rejects_too_small_buffer),
      cmocka_unit_test(test_serde_encode_bound_covers_raw_layers_of_a_later_view),
      cmocka_unit_test(test_serde_encode_names_nonfinite_in_quantized_tensor),
      cmocka_unit_test(test_serde_encode_keeps_nonfinite_in_n16_tensor_bit_exact),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
