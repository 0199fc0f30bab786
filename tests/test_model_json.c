/* tests/test_model_json.c - the JSON reader (model/model_json.c) and the
 * Hugging Face config.json reader (kvt_model_from_hf_config) on real config
 * shapes (Llama, Qwen2 with its unused sliding window, Mistral v0.1's
 * all-layer window, Gemma 3's multimodal text_config with layer_types,
 * DeepSeek-V3's MLA and MoE) and on hostile input: every truncation, deep
 * nesting, huge numbers, bad UTF-8, control characters, and mutated bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "kvtier/model.h"
#include "model_json.h"

static const char llama_cfg[] =
    "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"bos_token_id\": 128000,\n"
    "  \"eos_token_id\": 128001,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": 4096,\n"
    "  \"intermediate_size\": 14336,\n  \"max_position_embeddings\": 131072,\n"
    "  \"model_type\": \"llama\",\n  \"num_attention_heads\": 32,\n"
    "  \"num_hidden_layers\": 32,\n  \"num_key_value_heads\": 8,\n  \"rms_norm_eps\": 1e-05,\n"
    "  \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,\n"
    "    \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},\n"
    "  \"rope_theta\": 500000.0,\n  \"tie_word_embeddings\": false,\n"
    "  \"torch_dtype\": \"bfloat16\",\n  \"vocab_size\": 128256\n}\n";

static const char qwen_cfg[] =
    "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":3584,"
    "\"intermediate_size\":18944,\"max_position_embeddings\":131072,\"max_window_layers\":28,"
    "\"model_type\":\"qwen2\",\"num_attention_heads\":28,\"num_hidden_layers\":28,"
    "\"num_key_value_heads\":4,\"sliding_window\":131072,\"tie_word_embeddings\":false,"
    "\"torch_dtype\":\"bfloat16\",\"use_sliding_window\":false,\"vocab_size\":152064}";

static const char mistral01_cfg[] =
    "{\"hidden_size\":4096,\"intermediate_size\":14336,\"model_type\":\"mistral\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
    "\"sliding_window\":4096,\"vocab_size\":32000}";

/* Gemma 3 12B's multimodal file: the language model in text_config, no
 * head_dim (its default, 256), a layer_types list. */
static char gemma_cfg[4096];
static void make_gemma_cfg(void) {
  char *p = gemma_cfg;
  p += sprintf(p, "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],"
                  "\"model_type\":\"gemma3\",\"text_config\":{\"hidden_size\":3840,"
                  "\"intermediate_size\":15360,\"model_type\":\"gemma3_text\","
                  "\"num_attention_heads\":16,\"num_hidden_layers\":48,"
                  "\"num_key_value_heads\":8,\"sliding_window\":1024,\"layer_types\":[");
  for (int l = 0; l < 48; l++)
    p += sprintf(p, "%s\"%s\"", l ? "," : "",
                 (l + 1) % 6 ? "sliding_attention" : "full_attention");
  sprintf(p, "]},\"vision_config\":{\"hidden_size\":1152,\"num_hidden_layers\":27}}");
}

static const char deepseek_cfg[] =
    "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"first_k_dense_replace\":3,"
    "\"hidden_size\":7168,\"intermediate_size\":18432,\"kv_lora_rank\":512,"
    "\"max_position_embeddings\":163840,\"model_type\":\"deepseek_v3\","
    "\"moe_intermediate_size\":2048,\"n_routed_experts\":256,\"n_shared_experts\":1,"
    "\"num_attention_heads\":128,\"num_experts_per_tok\":8,\"num_hidden_layers\":61,"
    "\"num_key_value_heads\":128,\"q_lora_rank\":1536,\"qk_nope_head_dim\":128,"
    "\"qk_rope_head_dim\":64,\"v_head_dim\":128,\"tie_word_embeddings\":false,"
    "\"quantization_config\":{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\","
    "\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]},\"vocab_size\":129280}";

static int read_cfg(const char *text, size_t len, kvt_model_arch *m) {
  kvt_model_arch init = KVT_MODEL_ARCH_INIT;
  *m = init;
  return kvt_model_from_hf_config(NULL, text, len, NULL, m);
}

static void near(double got, double want, double rel) {
  if (!(fabs(got - want) <= rel * fabs(want)))
    fail_msg("got %.17g, want %.17g (rel %g)", got, want, rel);
}

static void test_hf_llama_matches_preset(void **state) {
  (void)state;
  kvt_model_arch m, p = KVT_MODEL_ARCH_INIT;
  assert_int_equal(read_cfg(llama_cfg, strlen(llama_cfg), &m), 0);
  assert_int_equal(kvt_model_preset("llama-3.1-8b", &p), 0);
  assert_int_equal(m.layers, p.layers);
  assert_int_equal(m.kv_heads, p.kv_heads);
  assert_int_equal(m.q_heads, p.q_heads);
  assert_int_equal(m.k_dim, p.k_dim);
  assert_int_equal(m.window, 0);
  assert_int_equal(m.max_context, 131072);
  assert_int_equal(m.weight_bits, 16);
  near(m.params, 8.03e9, 0.005); /* estimated from shapes */
  assert_string_equal(m.name, "llama");
  assert_int_equal(kvt_model_from_hf_config(NULL, llama_cfg, strlen(llama_cfg), "mine", &m), 0);
  assert_string_equal(m.name, "mine");
}

static void test_hf_qwen_unused_window_and_mistral_window(void **state) {
  (void)state;
  kvt_model_arch m;
  assert_int_equal(read_cfg(qwen_cfg, strlen(qwen_cfg), &m), 0);
  assert_int_equal(m.layers, 28);
  assert_int_equal(m.kv_heads, 4);
  assert_int_equal(m.k_dim, 128);
  assert_int_equal(m.window, 0); /* use_sliding_window: false */
  near(m.params, 7.61e9, 0.01);
  assert_int_equal(read_cfg(mistral01_cfg, strlen(mistral01_cfg), &m), 0);
  assert_int_equal(m.window, 4096);
  for (uint32_t l = 0; l < 32; l++)
    assert_true((m.window_layers[l / 64] >> (l % 64)) & 1);
}

static void test_hf_gemma3_text_config_layer_types(void **state) {
  (void)state;
  make_gemma_cfg();
  kvt_model_arch m, p = KVT_MODEL_ARCH_INIT;
  assert_int_equal(read_cfg(gemma_cfg, strlen(gemma_cfg), &m), 0);
  assert_int_equal(kvt_model_preset("gemma3-12b", &p), 0);
  assert_int_equal(m.layers, 48); /* not the vision tower's 27 */
  assert_int_equal(m.kv_heads, 8);
  assert_int_equal(m.k_dim, 256);
  assert_int_equal(m.window, 1024);
  assert_memory_equal(m.window_layers, p.window_layers, sizeof(p.window_layers));
  /* the same without layer_types: Gemma 3's default pattern of 6 */
  char *lt = strstr(gemma_cfg, ",\"layer_types\"");
  char *end = strstr(lt, "]}");
  memmove(lt, end + 1, strlen(end + 1) + 1);
  assert_int_equal(read_cfg(gemma_cfg, strlen(gemma_cfg), &m), 0);
  assert_memory_equal(m.window_layers, p.window_layers, sizeof(p.window_layers));
}

static void test_hf_deepseek_mla_and_moe(void **state) {
  (void)state;
  kvt_model_arch m;
  assert_int_equal(read_cfg(deepseek_cfg, strlen(deepseek_cfg), &m), 0);
  assert_int_equal(m.mla, 1);
  assert_int_equal(m.layers, 61);
  assert_int_equal(m.kv_heads, 1);
  assert_int_equal(m.k_dim, 64);
  assert_int_equal(m.v_dim, 512);
  assert_int_equal(m.qk_dim, 192);
  assert_int_equal(m.pv_dim, 128);
  assert_int_equal(m.weight_bits, 8);
  near(m.params, 671e9, 0.01);
  near(m.active_params, 37e9, 0.03);
}

static void test_hf_missing_and_bad_fields(void **state) {
  (void)state;
  kvt_model_arch m;
  kvt_ctx *ctx;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  kvt_model_arch init = KVT_MODEL_ARCH_INIT;
  m = init;
  static const char no_layers[] = "{\"num_attention_heads\":8,\"hidden_size\":512}";
  assert_int_equal(kvt_model_from_hf_config(ctx, no_layers, strlen(no_layers), NULL, &m),
                   KVT_ENOTFOUND);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "num_hidden_layers"));
  static const char huge[] = "{\"num_hidden_layers\":1e400,\"num_attention_heads\":8}";
  assert_int_equal(kvt_model_from_hf_config(ctx, huge, strlen(huge), NULL, &m), KVT_ERANGE);
  static const char big[] = "{\"num_hidden_layers\":4294967297,\"num_attention_heads\":8}";
  assert_int_equal(kvt_model_from_hf_config(ctx, big, strlen(big), NULL, &m), KVT_ERANGE);
  static const char frac[] = "{\"num_hidden_layers\":2.5,\"num_attention_heads\":8}";
  assert_int_equal(kvt_model_from_hf_config(ctx, frac, strlen(frac), NULL, &m), KVT_ERANGE);
  static const char odd[] = "{\"num_hidden_layers\":2,\"num_attention_heads\":3,"
                            "\"hidden_size\":512}";
  assert_int_equal(kvt_model_from_hf_config(ctx, odd, strlen(odd), NULL, &m), KVT_ENOTFOUND);
  static const char types[] = "{\"num_hidden_layers\":2,\"num_attention_heads\":2,"
                              "\"head_dim\":64,\"sliding_window\":8,\"layer_types\":[\"a\"]}";
  assert_int_equal(kvt_model_from_hf_config(ctx, types, strlen(types), NULL, &m), KVT_ESHAPE);
  static const char arr[] = "[1,2]";
  assert_int_equal(kvt_model_from_hf_config(ctx, arr, strlen(arr), NULL, &m), KVT_ECORRUPT);
  assert_memory_equal(&m, &init, sizeof(m)); /* written only on success */
  kvt_ctx_destroy(ctx);
}

static void test_json_values_and_escapes(void **state) {
  (void)state;
  static const char doc[] = " {\"a\": [1, -2.5e3, true, null,"
                            " {\"b\": \"x\\u00e9\\ud83d\\ude00\\n\"}],"
                            " \"c\\\"d\": 0} ";
  kvt_json root, a, v, k;
  assert_int_equal(kvt_json_parse(NULL, doc, strlen(doc), &root), 0);
  assert_int_equal(root.type, KVT_JSON_OBJECT);
  assert_int_equal(kvt_json_member(&root, "a", &a), 0);
  assert_int_equal(a.type, KVT_JSON_ARRAY);
  size_t pos = 0;
  static const int types[] = {KVT_JSON_NUMBER, KVT_JSON_NUMBER, KVT_JSON_BOOL, KVT_JSON_NULL,
                              KVT_JSON_OBJECT};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(kvt_json_next(&a, &pos, NULL, &v), 1);
    assert_int_equal(v.type, types[i]);
    if (i == 1) {
      double x;
      assert_int_equal(kvt_json_number(&v, &x), 0);
      assert_true(x == -2500.0);
    }
  }
  assert_int_equal(kvt_json_next(&a, &pos, NULL, &v), 0);
  char buf[32];
  assert_int_equal(kvt_json_member(&v, "b", &k), 0);
  assert_int_equal(kvt_json_string(&k, buf, sizeof(buf)), 0);
  assert_string_equal(buf, "x\xc3\xa9\xf0\x9f\x98\x80\n");
  assert_int_equal(kvt_json_string(&k, buf, 3), KVT_ENOBUFS);
  assert_int_equal(kvt_json_member(&root, "c\"d", &v), 0);
  assert_int_equal(kvt_json_member(&root, "zz", &v), KVT_ENOTFOUND);
  unsigned long long u;
  assert_int_equal(kvt_json_uint(&v, 10, &u), 0);
  assert_int_equal(u, 0);
}

static void test_json_rejects_malformed(void **state) {
  (void)state;
  static const char *const bad[] = {
      "",          "   ",        "{",           "{\"a\"}",      "{\"a\":}",     "{\"a\":1,}",
      "[1,]",      "[1 2]",      "01",          "1.",           ".5",           "-",
      "1e",        "+1",         "tru",         "nul",          "\"abc",        "\"a\\x\"",
      "\"\\u12G4\"", "\"a\tb\"", "{} {}",       "{'a':1}",      "[1]]",         "\"\xff\"",
      "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xe2\x82\"", "NaN", "Infinity", "{\"a\" 1}",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    kvt_json root;
    if (kvt_json_parse(NULL, bad[i], strlen(bad[i]), &root) != KVT_ECORRUPT)
      fail_msg("accepted bad JSON #%zu: %s", i, bad[i]);
  }
  /* a NUL byte inside the text */
  static const char nul[] = "{\"a\":\"x\0y\"}";
  kvt_json root;
  assert_int_equal(kvt_json_parse(NULL, nul, sizeof(nul) - 1, &root), KVT_ECORRUPT);
  assert_int_equal(kvt_json_parse(NULL, NULL, 5, &root), KVT_ECORRUPT);
}

static void test_json_depth_limit(void **state) {
  (void)state;
  char doc[2 * (KVT_JSON_MAX_DEPTH + 2) + 1];
  kvt_json root;
  for (int depth = KVT_JSON_MAX_DEPTH; depth <= KVT_JSON_MAX_DEPTH + 1; depth++) {
    memset(doc, '[', (size_t)depth);
    memset(doc + depth, ']', (size_t)depth);
    const int rc = kvt_json_parse(NULL, doc, 2 * (size_t)depth, &root);
    assert_int_equal(rc, depth <= KVT_JSON_MAX_DEPTH ? 0 : KVT_ETOOBIG);
  }
  /* very deep input fails fast without recursing through it */
  const size_t n = 1 << 20;
  char *deep = malloc(n);
  assert_non_null(deep);
  memset(deep, '{', n);
  assert_int_equal(kvt_json_parse(NULL, deep, n, &root), KVT_ECORRUPT);
  memset(deep, '[', n);
  assert_int_equal(kvt_json_parse(NULL, deep, n, &root), KVT_ETOOBIG);
  free(deep);
}

static void test_json_huge_numbers(void **state) {
  (void)state;
  kvt_json root;
  double x;
  static const char big[] = "1e999";
  assert_int_equal(kvt_json_parse(NULL, big, strlen(big), &root), 0);
  assert_int_equal(kvt_json_number(&root, &x), KVT_ERANGE);
  char longnum[2000];
  memset(longnum, '9', sizeof(longnum) - 1);
  longnum[sizeof(longnum) - 1] = '\0';
  assert_int_equal(kvt_json_parse(NULL, longnum, strlen(longnum), &root), 0);
  assert_int_equal(kvt_json_number(&root, &x), KVT_ERANGE);
  static const char tiny[] = "1e-999";
  assert_int_equal(kvt_json_parse(NULL, tiny, strlen(tiny), &root), 0);
  assert_int_equal(kvt_json_number(&root, &x), 0);
  assert_true(x == 0.0);
}

/* Every prefix of a valid config is refused cleanly (no read past it). */
static void test_hf_every_truncation_refused(void **state) {
  (void)state;
  const size_t n = strlen(deepseek_cfg);
  for (size_t len = 0; len < n; len++) {
    char *copy = malloc(len ? len : 1); /* exact size: ASan sees any overread */
    assert_non_null(copy);
    memcpy(copy, deepseek_cfg, len);
    kvt_model_arch m;
    const int rc = read_cfg(copy, len, &m);
    free(copy);
    if (rc == 0)
      fail_msg("accepted a config truncated to %zu of %zu bytes", len, n);
  }
}

/* Mutated configs: each result is an error or a valid model, never a crash. */
static void test_hf_mutations_never_crash(void **state) {
  (void)state;
  make_gemma_cfg();
  const size_t n = strlen(gemma_cfg);
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  static const char alphabet[] = "{}[]\",:0123456789eE.-+tfnul\\ \xff\x80";
  for (int iter = 0; iter < 3000; iter++) {
    char *copy = malloc(n);
    assert_non_null(copy);
    memcpy(copy, gemma_cfg, n);
    for (int k = 0; k < 3; k++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      copy[(seed >> 33) % n] = alphabet[(seed >> 20) % (sizeof(alphabet) - 1)];
    }
    kvt_model_arch m;
    if (read_cfg(copy, n, &m) == 0)
      assert_int_equal(kvt_model_validate(NULL, &m), 0);
    free(copy);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hf_llama_matches_preset),
      cmocka_unit_test(test_hf_qwen_unused_window_and_mistral_window),
      cmocka_unit_test(test_hf_gemma3_text_config_layer_types),
      cmocka_unit_test(test_hf_deepseek_mla_and_moe),
      cmocka_unit_test(test_hf_missing_and_bad_fields),
      cmocka_unit_test(test_json_values_and_escapes),
      cmocka_unit_test(test_json_rejects_malformed),
      cmocka_unit_test(test_json_depth_limit),
      cmocka_unit_test(test_json_huge_numbers),
      cmocka_unit_test(test_hf_every_truncation_refused),
      cmocka_unit_test(test_hf_mutations_never_crash),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
