/* tests/test_key.c - fingerprints and chained chunk keys: golden values
 * (computed once, and independently from FORMAT.md's byte definition with
 * Python's xxhash), determinism, and separation of models, codecs and ranks. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvtier.h"

static kvt_model_desc llama(void) {
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = "meta-llama/Llama-3.1-8B";
  m.layers = 32;
  m.kv_heads = 8;
  m.head_dim = 128;
  return m;
}

static kvt_key fingerprint(const kvt_model_desc *m, const char *codec) {
  kvt_codec_spec s;
  assert_int_equal(kvt_codec_parse(NULL, codec, &s), 0);
  kvt_key fp;
  assert_int_equal(kvt_fingerprint(m, &s, &fp), 0);
  return fp;
}

static void tokens(uint32_t *t, size_t n) {
  for (size_t i = 0; i < n; i++)
    t[i] = (uint32_t)(i * 7919u % 128256u);
}

static void assert_hex(const kvt_key *k, const char *hex) {
  char buf[KVT_KEY_HEX_LEN + 1];
  assert_string_equal(kvt_key_hex(k, buf), hex);
}

static void test_golden_fingerprint_and_chunk_keys_never_change(void **state) {
  (void)state;
  kvt_model_desc m = llama();
  kvt_key fp = fingerprint(&m, "k16v8"), keys[3];
  assert_hex(&fp, "3abcab9dfa85437100ed970bc72bacca");
  uint32_t t[768];
  tokens(t, 768);
  size_t n = 0;
  assert_int_equal(kvt_chunk_keys(&fp, t, 768, 256, keys, 3, &n), 0);
  assert_int_equal(n, 3);
  assert_hex(&keys[0], "53f548eb172990c2e75d0f6799d31cf2");
  assert_hex(&keys[1], "63dadc4719b6826b3c3d8cb3dbdd1a8d");
  assert_hex(&keys[2], "1d67eae50faae5466055bc28eb23b78f");
}

static void test_chunk_keys_chain_like_single_calls_and_skip_partial_chunks(void **state) {
  (void)state;
  kvt_model_desc m = llama();
  kvt_key fp = fingerprint(&m, "int4"), many[4], one;
  uint32_t t[1000];
  tokens(t, 1000);
  size_t n = 0;
  assert_int_equal(kvt_chunk_keys(&fp, t, 1000, 256, many, 4, &n), 0);
  assert_int_equal(n, 3); /* 1000 tokens: three full chunks, 232 left over */
  assert_int_equal(kvt_chunk_key(&fp, NULL, t, 256, &one), 0);
  assert_memory_equal(&one, &many[0], 16);
  assert_int_equal(kvt_chunk_key(&fp, &many[1], t + 512, 256, &one), 0);
  assert_memory_equal(&one, &many[2], 16);
  /* max_keys caps the output. */
  assert_int_equal(kvt_chunk_keys(&fp, t, 1000, 256, many, 2, &n), 0);
  assert_int_equal(n, 2);
}

static void test_keys_separate_models_codecs_ranks_and_prefixes(void **state) {
  (void)state;
  kvt_model_desc m = llama();
  kvt_key base = fingerprint(&m, "k16v8");
  kvt_key other[7];
  other[0] = fingerprint(&m, "fp8");
  other[1] = fingerprint(&m, "k16v8,raw=0");
  m.tp_size = 2, m.tp_rank = 1;
  other[2] = fingerprint(&m, "k16v8");
  m = llama(), m.dtype = KVT_DTYPE_F16;
  other[3] = fingerprint(&m, "k16v8");
  m = llama(), m.model_id = "meta-llama/Llama-3.1-8B-Instruct";
  other[4] = fingerprint(&m, "k16v8");
  m = llama(), m.layers = 31;
  other[5] = fingerprint(&m, "k16v8");
  m = llama(), m.head_dim = 64;
  other[6] = fingerprint(&m, "k16v8");
  for (int i = 0; i < 7; i++)
    assert_memory_not_equal(&base, &other[i], 16);
  /* Same tokens after a different prefix: different key. */
  uint32_t t[512];
  tokens(t, 512);
  kvt_key a0, a1, b0, b1;
  assert_int_equal(kvt_chunk_key(&base, NULL, t, 256, &a0), 0);
  assert_int_equal(kvt_chunk_key(&base, &a0, t + 256, 256, &a1), 0);
  t[3] ^= 1;
  assert_int_equal(kvt_chunk_key(&base, NULL, t, 256, &b0), 0);
  assert_int_equal(kvt_chunk_key(&base, &b0, t + 256, 256, &b1), 0);
  assert_memory_not_equal(&a0, &b0, 16);
  assert_memory_not_equal(&a1, &b1, 16);
}

static void test_key_hex_round_trips_and_rejects_bad_text(void **state) {
  (void)state;
  kvt_key k, back;
  for (int i = 0; i < 16; i++)
    k.bytes[i] = (uint8_t)(i * 17 + 3);
  char hex[KVT_KEY_HEX_LEN + 1];
  kvt_key_hex(&k, hex);
  assert_int_equal(kvt_key_from_hex(hex, &back), 0);
  assert_memory_equal(&k, &back, 16);
  assert_int_equal(kvt_key_from_hex("12", &back), -EINVAL);
  hex[5] = 'g';
  assert_int_equal(kvt_key_from_hex(hex, &back), -EINVAL);
}

static void test_fingerprint_rejects_incomplete_models(void **state) {
  (void)state;
  kvt_codec_spec s;
  kvt_key fp;
  assert_int_equal(kvt_codec_parse(NULL, "raw", &s), 0);
  kvt_model_desc m = llama();
  m.model_id = NULL;
  assert_int_equal(kvt_fingerprint(&m, &s, &fp), -EINVAL);
  m = llama(), m.tp_rank = 2, m.tp_size = 2;
  assert_int_equal(kvt_fingerprint(&m, &s, &fp), -EINVAL);
  m = llama(), m.kv_heads = 0;
  assert_int_equal(kvt_fingerprint(&m, &s, &fp), -EINVAL);
  m = llama(), m.struct_size = 8;
  assert_int_equal(kvt_fingerprint(&m, &s, &fp), -EINVAL);
  uint32_t t = 1;
  assert_int_equal(kvt_chunk_key(&fp, NULL, &t, 0, &fp), -EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden_fingerprint_and_chunk_keys_never_change),
      cmocka_unit_test(test_chunk_keys_chain_like_single_calls_and_skip_partial_chunks),
      cmocka_unit_test(test_keys_separate_models_codecs_ranks_and_prefixes),
      cmocka_unit_test(test_key_hex_round_trips_and_rejects_bad_text),
      cmocka_unit_test(test_fingerprint_rejects_incomplete_models),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
