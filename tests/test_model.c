/* tests/test_model.c - the bandwidth model's formulas (kvtier/model.h)
 * against hand-computed values, the presets against the models' published
 * config.json shapes, the bytes per token against the codec's own payload
 * sizes, and the published figures of BACKGROUND.md that follow from their
 * stated inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "curve_fit.h"
#include "kvtier.h"
#include "kvtier/model.h"

static void near(double got, double want, double rel) {
  const double tol = rel * fmax(fabs(want), 1e-300);
  if (!(fabs(got - want) <= tol))
    fail_msg("got %.17g, want %.17g (rel %g)", got, want, rel);
}

static kvt_model_arch preset(const char *name) {
  kvt_model_arch m = KVT_MODEL_ARCH_INIT;
  assert_int_equal(kvt_model_preset(name, &m), 0);
  return m;
}

static kvt_model_kv_rate rate(const char *model, const char *codec) {
  kvt_model_arch m = preset(model);
  kvt_codec_spec s;
  assert_int_equal(kvt_codec_parse(NULL, codec, &s), 0);
  kvt_model_kv_rate r = KVT_MODEL_KV_RATE_INIT;
  assert_int_equal(kvt_model_kv_rate_get(NULL, &m, &s, &r), 0);
  return r;
}

static kvt_model_projection_config cfg(double batch, double context, double step_ms, double k) {
  kvt_model_projection_config c = KVT_MODEL_PROJECTION_CONFIG_INIT;
  c.batch = batch;
  c.context = context;
  c.step_ms = step_ms;
  c.spec_k = k;
  return c;
}

/* Shapes from each model's config.json (num_hidden_layers,
 * num_key_value_heads, head_dim or hidden_size / num_attention_heads). */
static void test_presets_match_published_configs(void **state) {
  (void)state;
  static const struct {
    const char *name;
    uint32_t layers, q_heads, kv_heads, k_dim, v_dim, window;
  } want[] = {
      {"llama-3.1-8b", 32, 32, 8, 128, 128, 0},    {"llama-3.1-70b", 80, 64, 8, 128, 128, 0},
      {"mistral-7b", 32, 32, 8, 128, 128, 0},      {"mistral-small-24b", 40, 32, 8, 128, 128, 0},
      {"qwen2.5-0.5b", 24, 14, 2, 64, 64, 0},      {"qwen2.5-1.5b", 28, 12, 2, 128, 128, 0},
      {"qwen2.5-7b", 28, 28, 4, 128, 128, 0},      {"qwen2.5-72b", 80, 64, 8, 128, 128, 0},
      {"qwen3-8b", 36, 32, 8, 128, 128, 0},        {"phi-4", 40, 40, 10, 128, 128, 0},
      {"gemma3-12b", 48, 16, 8, 256, 256, 1024},   {"deepseek-v3", 61, 128, 1, 64, 512, 0},
  };
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    kvt_model_arch m = preset(want[i].name);
    assert_string_equal(m.name, want[i].name);
    assert_int_equal(m.layers, want[i].layers);
    assert_int_equal(m.q_heads, want[i].q_heads);
    assert_int_equal(m.kv_heads, want[i].kv_heads);
    assert_int_equal(m.k_dim, want[i].k_dim);
    assert_int_equal(m.v_dim, want[i].v_dim);
    assert_int_equal(m.window, want[i].window);
    assert_int_equal(kvt_model_validate(NULL, &m), 0);
  }
  kvt_model_arch m;
  size_t n = 0;
  while (kvt_model_preset_at(n, &m) == 0)
    n++;
  assert_int_equal(n, sizeof(want) / sizeof(want[0]));
  assert_int_equal(kvt_model_preset("no-such-model", &m), KVT_ENOTFOUND);
  assert_int_equal(kvt_model_preset("PHI-4-14B", &m), 0); /* alias, any case */
}

/* Gemma 3: five sliding-window layers, then one global, repeated. */
static void test_gemma3_windows_five_of_every_six_layers(void **state) {
  (void)state;
  kvt_model_arch m = preset("gemma3-12b");
  int windowed = 0;
  for (uint32_t l = 0; l < m.layers; l++) {
    const int w = (m.window_layers[l / 64] >> (l % 64)) & 1;
    assert_int_equal(w, (l + 1) % 6 != 0);
    windowed += w;
  }
  assert_int_equal(windowed, 40);
}

/* BACKGROUND: Llama-3.1-8B at bf16 is 131,072 B per token; 32 sequences at
 * 128K read ~550 GB per step (2^39 bytes exactly). */
static void test_llama8b_raw_is_131072_bytes_per_token_and_550_GB_per_step(void **state) {
  (void)state;
  kvt_model_kv_rate r = rate("llama-3.1-8b", "raw");
  assert_true(r.full_bytes == 131072.0);
  assert_true(r.window_bytes == 0.0);
  near(kvt_model_bytes_per_element(&r), 2.0, 1e-15);
  kvt_model_projection_config c = cfg(32, 131072, 10, 1);
  kvt_model_projection p;
  assert_int_equal(kvt_model_project(NULL, &r, &c, &p), 0);
  assert_true(p.step_bytes == 549755813888.0);
  near(p.required_Bps, 549755813888.0 / 0.010, 1e-15);
  assert_true(p.bytes_per_token == 131072.0);
}

/* Per (layer, head, token), by hand from FORMAT.md's section layouts:
 * raw 2 x 128 x 2 = 512; k16v8 256 + 128 + 4 (fp32 scale) = 388; fp8
 * 2 x (128 + 4) = 264; int4 2 x (64 + 4 x 128/32) = 160. */
static void test_codec_bytes_per_token_by_hand(void **state) {
  (void)state;
  const double lh = 32 * 8; /* Llama-3.1-8B layers x KV heads */
  near(rate("llama-3.1-8b", "k16v8").full_bytes, lh * 388, 0);
  near(rate("llama-3.1-8b", "fp8").full_bytes, lh * 264, 0);
  near(rate("llama-3.1-8b", "int4").full_bytes, lh * 160, 0);
  near(rate("llama-3.1-8b", "int4,kgroup=dim").full_bytes, lh * 160, 0);
  near(rate("llama-3.1-8b", "k8v4").full_bytes, lh * (132 + 80), 0);
  /* raw layers: 30 x 160 + 2 x 512 per head */
  near(rate("llama-3.1-8b", "int4,raw=0,31").full_bytes, 8 * (30 * 160 + 2 * 512), 0);
  /* one fp32 scale per 16 tokens: 128 + 4/16 for V */
  near(rate("llama-3.1-8b", "k16v8,scale=block,block=16").full_bytes, lh * (256 + 128.25), 0);
  near(rate("llama-3.1-8b", "k16v8,scale=block,block=48").full_bytes, lh * (256 + 128 + 4.0 / 48),
       1e-15);
  /* Qwen2.5-7B: 28 x 4 x 512 */
  near(rate("qwen2.5-7b", "raw").full_bytes, 57344, 0);
  /* Qwen2.5-0.5B, head dim 64: k16v8 = 128 + 64 + 4 per head */
  near(rate("qwen2.5-0.5b", "k16v8").full_bytes, 24 * 2 * 196, 0);
}

/* DeepSeek-V3 MLA: one latent of 512 + 64 per token per layer, not x2. */
static void test_deepseek_mla_latent_576_per_layer(void **state) {
  (void)state;
  near(rate("deepseek-v3", "raw").full_bytes, 61 * 576 * 2, 0);
  /* RoPE part in the key format (16-bit), latent in the value format
   * (e4m3 + one fp32 scale) */
  near(rate("deepseek-v3", "k16v8").full_bytes, 61 * (64 * 2 + 512 + 4), 0);
  near(rate("deepseek-v3", "int4").full_bytes, 61 * (32 + 8 + 256 + 64), 0);
}

/* Sliding-window layers read at most the window. */
static void test_gemma3_window_layers_bounded(void **state) {
  (void)state;
  kvt_model_kv_rate r = rate("gemma3-12b", "raw");
  near(r.full_bytes, 8 * 8 * 256 * 4, 0);    /* 8 global layers */
  near(r.window_bytes, 40 * 8 * 256 * 4, 0); /* 40 local layers */
  assert_int_equal(r.window, 1024);
  near(kvt_model_seq_bytes(&r, 512), (65536.0 + 327680.0) * 512, 0);
  near(kvt_model_seq_bytes(&r, 131072), 65536.0 * 131072 + 327680.0 * 1024, 0);
}

/* The rate is what the codec writes: the payload of all layers grows by
 * exactly rate x tokens when a chunk grows by a multiple of the chunk. */
static void test_rate_matches_encode_bound(void **state) {
  (void)state;
  static const char *const specs[] = {"raw",  "k16v8", "fp8", "int8", "k16v4", "k8v4",
                                      "int4", "int4,kgroup=dim,group=64",
                                      "k16v8,raw=0-3", "int8,scale=block,block=32"};
  kvt_model_arch m = preset("qwen2.5-7b");
  for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
    kvt_codec_spec s;
    assert_int_equal(kvt_codec_parse(NULL, specs[i], &s), 0);
    kvt_model_kv_rate r = KVT_MODEL_KV_RATE_INIT;
    assert_int_equal(kvt_model_kv_rate_get(NULL, &m, &s, &r), 0);
    const uint32_t c = r.chunk_tokens;
    uint64_t a, b;
    assert_int_equal(kvt_encode_bound(NULL, &s, 0, m.layers, c, m.kv_heads, m.k_dim, &a), 0);
    assert_int_equal(kvt_encode_bound(NULL, &s, 0, m.layers, 2 * c, m.kv_heads, m.k_dim, &b), 0);
    near(r.full_bytes * c, (double)(b - a), 0);
  }
}

static void test_codec_that_cannot_encode_shape_is_refused(void **state) {
  (void)state;
  kvt_model_arch m = KVT_MODEL_ARCH_INIT;
  m.layers = 2;
  m.kv_heads = 1;
  m.k_dim = 48;
  kvt_codec_spec s;
  assert_int_equal(kvt_codec_parse(NULL, "int4", &s), 0); /* V groups of 32 along 48 */
  kvt_model_kv_rate r = KVT_MODEL_KV_RATE_INIT;
  kvt_ctx *ctx;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  assert_int_equal(kvt_model_kv_rate_get(ctx, &m, &s, &r), KVT_ESHAPE);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "group"));
  m.layers = 0;
  assert_int_equal(kvt_model_kv_rate_get(ctx, &m, &s, &r), KVT_ESHAPE);
  m.layers = 2;
  m.window_layers[0] = 1u << 5; /* a windowed layer the model does not have */
  assert_int_equal(kvt_model_validate(ctx, &m), KVT_ESHAPE);
  kvt_ctx_destroy(ctx);
}

/* BACKGROUND: at 10 and 50 TB/s, NVLink (900 GB/s) is 11-55x short, PCIe 5
 * x16 (64) 156-781x, CXL 2.0 (32) 312-1562x; speculative k = 2-4 leaves
 * NVLink 3-28x short. */
static void test_published_shortfalls(void **state) {
  (void)state;
  const double lo = 10e12, hi = 50e12;
  const double nvl = kvt_model_link_find("nvlink4")->GBps * 1e9;
  const double pcie = kvt_model_link_find("pcie5-x16")->GBps * 1e9;
  const double cxl = kvt_model_link_find("cxl2")->GBps * 1e9;
  near(kvt_model_shortfall(lo, nvl), 11.1, 0.01);
  near(kvt_model_shortfall(hi, nvl), 55.6, 0.01);
  near(kvt_model_shortfall(lo, pcie), 156.25, 1e-12);
  near(kvt_model_shortfall(hi, pcie), 781.25, 1e-12);
  near(kvt_model_shortfall(lo, cxl), 312.5, 1e-12);
  near(kvt_model_shortfall(hi, cxl), 1562.5, 1e-12);
  near(round(kvt_model_shortfall(lo / 4, nvl)), 3, 0);
  near(round(kvt_model_shortfall(hi / 2, nvl)), 28, 0);
  /* and through kvt_model_project: 10 TB/s at k = 4 needs 2.5 TB/s */
  kvt_model_kv_rate r = KVT_MODEL_KV_RATE_INIT;
  r.full_bytes = 1e7; /* x 1000 tokens x 10 sequences / 10 ms = 10 TB/s */
  kvt_model_projection_config c = cfg(10, 1e3, 10, 4);
  kvt_model_projection p;
  assert_int_equal(kvt_model_project(NULL, &r, &c, &p), 0);
  near(p.required_Bps, 2.5e12, 1e-15);
  /* Llama-3.1-8B raw at 32 x 128K in 10 ms against NVLink: 61x */
  kvt_model_kv_rate l = rate("llama-3.1-8b", "raw");
  c = cfg(32, 131072, 10, 1);
  assert_int_equal(kvt_model_project(NULL, &l, &c, &p), 0);
  near(kvt_model_shortfall(p.required_Bps, nvl), 549755813888.0 / 0.01 / 900e9, 1e-15);
}

static void test_max_context_per_link(void **state) {
  (void)state;
  kvt_model_kv_rate l = rate("llama-3.1-8b", "raw");
  kvt_model_projection_config c = cfg(32, 0, 10, 1);
  double t;
  /* budget 3.35e12 x 0.01 / 32 = 1.046875e9 B per sequence / 131072 */
  assert_int_equal(kvt_model_max_context(NULL, &l, &c, 3350e9, &t), 0);
  near(t, floor(1.046875e9 / 131072), 0);
  c.spec_k = 2;
  assert_int_equal(kvt_model_max_context(NULL, &l, &c, 3350e9, &t), 0);
  near(t, floor(2 * 1.046875e9 / 131072), 0);
  /* an exact budget lands on the token: 1 seq, 1 s, 131072 B/s -> 1 token */
  c = cfg(1, 0, 1000, 1);
  assert_int_equal(kvt_model_max_context(NULL, &l, &c, 131072 * 7.0, &t), 0);
  near(t, 7, 0);
  /* windowed: below and above the window */
  kvt_model_kv_rate g = KVT_MODEL_KV_RATE_INIT;
  g.full_bytes = 100;
  g.window_bytes = 300;
  g.window = 1000;
  c = cfg(1, 0, 1000, 1);
  assert_int_equal(kvt_model_max_context(NULL, &g, &c, 400 * 500.0, &t), 0);
  near(t, 500, 0);
  assert_int_equal(kvt_model_max_context(NULL, &g, &c, 300 * 1000.0 + 100 * 5000.0, &t), 0);
  near(t, 5000, 0);
  g.full_bytes = 0; /* every layer windowed: any context once the window fits */
  assert_int_equal(kvt_model_max_context(NULL, &g, &c, 300 * 1000.0, &t), 0);
  assert_true(isinf(t));
  assert_int_equal(kvt_model_max_context(NULL, &g, &c, 300 * 999.0, &t), 0);
  near(t, 999, 0);
  c.batch = 0;
  assert_int_equal(kvt_model_max_context(NULL, &g, &c, 1e9, &t), -EINVAL);
}

/* BACKGROUND: S <= 1/(1 - f(1 - r)); INT4 1/(1 - 3f/4), FP8 1/(1 - f/2),
 * K16/V8 1/(1 - f/4). */
static void test_amdahl_bound(void **state) {
  (void)state;
  for (double f = 0; f <= 1.0; f += 0.125) {
    near(kvt_model_amdahl_bound(f, 0.25), 1 / (1 - 3 * f / 4), 1e-15);
    near(kvt_model_amdahl_bound(f, 0.5), 1 / (1 - f / 2), 1e-15);
    near(kvt_model_amdahl_bound(f, 0.75), 1 / (1 - f / 4), 1e-15);
  }
  near(kvt_model_amdahl_bound(1, 0.25), 4, 0);
  near(kvt_model_amdahl_bound(0, 0.25), 1, 0);
  assert_true(isnan(kvt_model_amdahl_bound(1.5, 0.5)));
  assert_true(isnan(kvt_model_amdahl_bound(0.5, -0.1)));
}

/* BACKGROUND: at 7B and 2K context, weights are 94-99% of a step's bytes
 * (small batches). */
static void test_weights_dominate_short_context(void **state) {
  (void)state;
  static const char *const models[] = {"llama-3.1-8b", "mistral-7b"};
  for (size_t i = 0; i < 2; i++)
    for (double b = 1; b <= 2; b++) {
      kvt_model_arch m = preset(models[i]);
      kvt_model_kv_rate r = rate(models[i], "raw");
      const double w = kvt_model_weight_bytes(&m), kv = b * kvt_model_seq_bytes(&r, 2048);
      const double share = w / (w + kv);
      assert_true(share >= 0.94 && share <= 0.99);
    }
  kvt_model_arch m = preset("llama-3.1-8b");
  near(kvt_model_weight_bytes(&m), 8.03e9 * 2, 1e-15);
  m = preset("deepseek-v3"); /* FP8 weights, 37B active */
  near(kvt_model_weight_bytes(&m), 37e9, 1e-15);
}

/* BACKGROUND: vLLM, H100, Llama-3.1-8B: bf16 4.37e-5 ms/token + 6.44 ms,
 * fp8 2.37e-5 + 6.58: fp8 wins past ~7,000 tokens. */
static void test_itl_breakeven_vllm_7000(void **state) {
  (void)state;
  double t;
  assert_int_equal(curve_itl_breakeven(4.37e-5, 6.44, 2.37e-5, 6.58, &t), 0);
  near(t, 7000, 1e-9);
  assert_int_equal(curve_itl_breakeven(1e-5, 1, 1e-5, 2, &t), KVT_ERANGE);
  assert_int_equal(curve_itl_breakeven(2, 1, 1, 0, &t), 0); /* new faster everywhere */
  near(t, -1, 0);
}

static void test_fit_line_by_hand(void **state) {
  (void)state;
  const double x[] = {1, 2, 3}, y[] = {1, 2, 2};
  curve_line_fit f;
  assert_int_equal(curve_fit_line(x, y, 3, &f, NULL, 0), 0);
  near(f.slope, 0.5, 1e-15);
  near(f.intercept, 2.0 / 3, 1e-15);
  near(f.r2, 0.75, 1e-14);
  assert_int_equal(f.n, 3);
  const double tx[] = {1024, 8192, 32768, 131072};
  double ty[4];
  for (int i = 0; i < 4; i++)
    ty[i] = 4.37e-5 * tx[i] + 6.44;
  assert_int_equal(curve_fit_line(tx, ty, 4, &f, NULL, 0), 0);
  near(f.slope, 4.37e-5, 1e-9);
  near(f.intercept, 6.44, 1e-12);
  near(f.r2, 1, 1e-12);
  const double same[] = {5, 5, 5};
  assert_int_equal(curve_fit_line(same, y, 3, &f, NULL, 0), KVT_ERANGE);
  assert_int_equal(curve_fit_line(x, y, 1, &f, NULL, 0), -EINVAL);
  const double bad[] = {1, NAN, 3};
  assert_int_equal(curve_fit_line(bad, y, 3, &f, NULL, 0), -EINVAL);
}

/* BACKGROUND: S(B) = 3.75 B^1.32 / (5.1^1.32 + B^1.32). */
static void test_hill_curve_and_batches(void **state) {
  (void)state;
  near(curve_hill(3.75, 5.1, 1.32, 5.1), 3.75 / 2, 1e-15);
  near(curve_hill(3.75, 5.1, 1.32, 32), 3.75 * pow(32, 1.32) / (pow(5.1, 1.32) + pow(32, 1.32)),
       1e-15);
  near(curve_hill_batch_at(5.1, 1.32, 0.8), 5.1 * pow(4, 1 / 1.32), 1e-15);
  near(curve_hill_batch_at(5.1, 1.32, 0.95), 5.1 * pow(19, 1 / 1.32), 1e-15);
  near(curve_hill(3.75, 5.1, 1.32, curve_hill_batch_at(5.1, 1.32, 0.8)), 0.8 * 3.75, 1e-12);
  assert_true(isnan(curve_hill_batch_at(5.1, 1.32, 1.0)));
  near(curve_hill(3.75, 5.1, 1.32, 0), 0, 0);
}

static void test_fit_hill_recovers_published_curve(void **state) {
  (void)state;
  const double b[] = {1, 2, 4, 8, 16, 32, 64, 128};
  double s[8];
  for (int i = 0; i < 8; i++)
    s[i] = curve_hill(3.75, 5.1, 1.32, b[i]);
  curve_hill_fit h;
  assert_int_equal(curve_fit_hill(b, s, 8, &h, NULL, 0), 0);
  near(h.smax, 3.75, 1e-5);
  near(h.bhalf, 5.1, 1e-5);
  near(h.gamma, 1.32, 1e-5);
  near(h.r2, 1, 1e-9);
  near(h.batch80, 5.1 * pow(4, 1 / 1.32), 1e-4);
  /* noise: a worse but still sane fit */
  const double noise[] = {0.1, -0.2, 0.15, -0.1, 0.2, -0.15, 0.1, -0.05};
  for (int i = 0; i < 8; i++)
    s[i] += noise[i];
  assert_int_equal(curve_fit_hill(b, s, 8, &h, NULL, 0), 0);
  assert_true(h.r2 < 1 && h.r2 > 0.9);
  assert_true(fabs(h.smax - 3.75) < 0.5);
  const double flat[] = {2, 2, 2, 2}; /* saturated from the start: still terminates */
  assert_int_equal(curve_fit_hill(b, flat, 4, &h, NULL, 0), 0);
  near(h.smax, 2, 1e-6);
  assert_int_equal(curve_fit_hill(b, s, 2, &h, NULL, 0), -EINVAL);
  const double zero_b[] = {0, 1, 2};
  assert_int_equal(curve_fit_hill(zero_b, s, 3, &h, NULL, 0), -EINVAL);
  const double neg[] = {-1, -1, -1};
  assert_int_equal(curve_fit_hill(b, neg, 3, &h, NULL, 0), KVT_ERANGE);
}

/* 2 N T + per layer 2 P q_heads (dqk + dpv). */
static void test_prefill_flops_by_hand(void **state) {
  (void)state;
  kvt_model_arch m = KVT_MODEL_ARCH_INIT;
  m.layers = 2;
  m.q_heads = 4;
  m.kv_heads = 1;
  m.k_dim = 8;
  m.params = 1000;
  /* T = 10: 2 x 1000 x 10 + 2 layers x 2 x 55 pairs x 4 x 16 */
  near(kvt_model_prefill_flops(&m, 10), 20000 + 2 * 2 * 55 * 4 * 16, 0);
  m.window = 4;
  m.window_layers[0] = 2; /* layer 1: pairs 10 + 6 x 4 = 34 */
  near(kvt_model_prefill_flops(&m, 10), 20000 + 2 * (55 + 34) * 4 * 16, 0);
  /* MoE counts active parameters; MLA its own q.k / p.v dims */
  kvt_model_arch d = preset("deepseek-v3");
  near(kvt_model_prefill_flops(&d, 1000), 2 * 37e9 * 1000 + 61 * 2 * 500500.0 * 128 * (192 + 128),
       1e-12);
}

static void test_advise_capacity_and_restore(void **state) {
  (void)state;
  kvt_model_arch m = preset("llama-3.1-8b");
  kvt_model_kv_rate r = rate("llama-3.1-8b", "raw");
  kvt_model_advice_config c = KVT_MODEL_ADVICE_CONFIG_INIT;
  c.hbm_free_bytes = 40.0 * 1073741824;
  c.batch = 3;
  c.context = 131072; /* 16 GiB a sequence */
  kvt_model_advice a;
  assert_int_equal(kvt_model_advise(NULL, &m, &r, &c, &a), 0);
  near(a.seq_bytes, 131072.0 * 131072, 0);
  near(a.sequences_fit, 2, 0);
  assert_false(a.batch_fits);
  near(a.prefill_s, kvt_model_prefill_flops(&m, 131072) / (989e12 * 0.5), 1e-15);
  c.tflops = 100;
  c.mfu = 1;
  assert_int_equal(kvt_model_advise(NULL, &m, &r, &c, &a), 0);
  near(a.prefill_s, kvt_model_prefill_flops(&m, 131072) / 100e12, 1e-15);
  near(kvt_model_restore_seconds(64e9, 64e9, 0), 1, 0);
  near(kvt_model_restore_seconds(55.6e9, 64e9, 55.6 / 64), 1, 1e-15);
  assert_true(isinf(kvt_model_restore_seconds(1, 0, 1)));
  c.mfu = 2;
  assert_int_equal(kvt_model_advise(NULL, &m, &r, &c, &a), -EINVAL);
}

static void test_links(void **state) {
  (void)state;
  static const char *const want[] = {"hbm3-h100", "hbm3e-h200", "hbm3e-b200", "nvlink4",
                                     "nvlink5", "pcie4-x16", "pcie5-x16", "cxl2", "rdma-400g",
                                     "rdma-200g", "nvme-gen4", "nvme-gen4-x4", "nvme-gen5",
                                     "nvme-gen5-x4"};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    const kvt_model_link *l = kvt_model_link_find(want[i]);
    assert_non_null(l);
    assert_true(l->GBps > 0);
  }
  near(kvt_model_link_find("hbm3-h100")->GBps, 3350, 0);
  near(kvt_model_link_find("NVLINK4")->GBps, 900, 0);
  near(kvt_model_link_find("pcie5-x16")->GBps, 64, 0);
  near(kvt_model_link_find("rdma-400g")->GBps, 50, 0);
  near(kvt_model_link_find("nvme-gen5-x4")->GBps, 4 * kvt_model_link_find("nvme-gen5")->GBps, 0);
  assert_null(kvt_model_link_find("token-ring"));
  assert_null(kvt_model_link_preset(sizeof(want) / sizeof(want[0])));
}

static void test_project_rejects_bad_config(void **state) {
  (void)state;
  kvt_model_kv_rate r = rate("llama-3.1-8b", "raw");
  kvt_model_projection p;
  kvt_model_projection_config c = cfg(0, 1024, 10, 1);
  assert_int_equal(kvt_model_project(NULL, &r, &c, &p), -EINVAL);
  c = cfg(1, 1024, 0, 1);
  assert_int_equal(kvt_model_project(NULL, &r, &c, &p), -EINVAL);
  c = cfg(1, INFINITY, 10, 1);
  assert_int_equal(kvt_model_project(NULL, &r, &c, &p), -EINVAL);
  c = cfg(1, 1024, 10, 1);
  c.struct_size = 8;
  assert_int_equal(kvt_model_project(NULL, &r, &c, &p), -EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_presets_match_published_configs),
      cmocka_unit_test(test_gemma3_windows_five_of_every_six_layers),
      cmocka_unit_test(test_llama8b_raw_is_131072_bytes_per_token_and_550_GB_per_step),
      cmocka_unit_test(test_codec_bytes_per_token_by_hand),
      cmocka_unit_test(test_deepseek_mla_latent_576_per_layer),
      cmocka_unit_test(test_gemma3_window_layers_bounded),
      cmocka_unit_test(test_rate_matches_encode_bound),
      cmocka_unit_test(test_codec_that_cannot_encode_shape_is_refused),
      cmocka_unit_test(test_published_shortfalls),
      cmocka_unit_test(test_max_context_per_link),
      cmocka_unit_test(test_amdahl_bound),
      cmocka_unit_test(test_weights_dominate_short_context),
      cmocka_unit_test(test_itl_breakeven_vllm_7000),
      cmocka_unit_test(test_fit_line_by_hand),
      cmocka_unit_test(test_hill_curve_and_batches),
      cmocka_unit_test(test_fit_hill_recovers_published_curve),
      cmocka_unit_test(test_prefill_flops_by_hand),
      cmocka_unit_test(test_advise_capacity_and_restore),
      cmocka_unit_test(test_links),
      cmocka_unit_test(test_project_rejects_bad_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
