/* tests/test_cli.c - the kvtier command-line tool, run as a program in a
 * temporary directory: encode/verify/inspect/decode round trips, the exit
 * code and message of each failure class, and smoke runs of demo and bench.
 * Exits 77 (skipped) when the tool was not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_harness.h"
#include "kvtier.h"
#include "synth.h"


/* The small chunk every test encodes: 2 layers x 64 tokens x 2 heads x 128. */
enum { L = 2, T = 64, H = 2, D = 128, N = L * T * H * D };
#define SHAPE "--dtype bf16 --layers 2 --tokens 64 --heads 2 --head-dim 128"

static kvt_ctx *ctx;


static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++)
    n += *s == '\n';
  return n;
}

/* A strict-enough JSON syntax check: objects, arrays, strings, numbers,
 * literals; returns the end of the value or NULL. */
static const char *json_value(const char *p);
static const char *json_ws(const char *p) {
  while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
    p++;
  return p;
}
static const char *json_string(const char *p) {
  if (*p++ != '"')
    return NULL;
  for (; *p != '"'; p++) {
    if (*p == '\0' || (unsigned char)*p < 0x20)
      return NULL;
    if (*p == '\\' && *++p == '\0')
      return NULL;
  }
  return p + 1;
}
static const char *json_seq(const char *p, char close, int object) {
  p = json_ws(p + 1);
  if (*p == close)
    return p + 1;
  for (;;) {
    if (object) {
      if (!(p = json_string(json_ws(p))) || *(p = json_ws(p)) != ':')
        return NULL;
      p++;
    }
    if (!(p = json_value(p)))
      return NULL;
    p = json_ws(p);
    if (*p == close)
      return p + 1;
    if (*p++ != ',')
      return NULL;
  }
}
static const char *json_value(const char *p) {
  p = json_ws(p);
  if (*p == '{')
    return json_seq(p, '}', 1);
  if (*p == '[')
    return json_seq(p, ']', 0);
  if (*p == '"')
    return json_string(p);
  for (const char *lit = "true\0false\0null\0"; *lit; lit += strlen(lit) + 1)
    if (strncmp(p, lit, strlen(lit)) == 0)
      return p + strlen(lit);
  char *end;
  strtod(p, &end);
  return end > p && (isdigit((unsigned char)*p) || *p == '-') ? end : NULL;
}
static int is_json(const char *s) {
  const char *e = json_value(s);
  return e && *json_ws(e) == '\0';
}

static int group_setup(void **state) {
  (void)state;
  if (access(CLI_BIN, X_OK) != 0)
    return -1;
  snprintf(dir, sizeof(dir), "/tmp/kvt_test_cli_XXXXXX");
  if (!mkdtemp(dir) || kvt_ctx_create(NULL, &ctx) != 0)
    return -1;
  uint16_t *k = malloc(2 * N), *v = malloc(2 * N);
  if (!k || !v)
    return -1;
  kvt_synth_shape s = {L, T, H, D, KVT_DTYPE_BF16, 0, 0};
  kvt_synth_kv(&s, 7, k, v);
  write_file("K.bin", k, 2 * N);
  write_file("V.bin", v, 2 * N);
  free(k);
  free(v);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  kvt_ctx_destroy(ctx);
  return system(cmd) == 0 ? 0 : -1;
}

static void encode(const char *codec, const char *out) {
  assert_int_equal(run("encode --codec %s " SHAPE " --k K.bin --v V.bin -o %s", codec, out), 0);
  assert_non_null(strstr(res.out, out));
}

static void test_cli_raw_round_trip_is_bit_exact(void **state) {
  (void)state;
  encode("raw", "raw.kvt");
  assert_int_equal(run("verify raw.kvt"), 0);
  assert_non_null(strstr(res.out, "raw.kvt: ok ("));
  assert_int_equal(run("inspect raw.kvt --json"), 0);
  assert_true(is_json(res.out));
  assert_non_null(strstr(res.out, "\"codec\": \"raw\""));
  assert_non_null(strstr(res.out, "\"tokens\": 64"));
  assert_int_equal(run("decode raw.kvt --k K2.bin --v V2.bin"), 0);
  size_t a, b, c, d;
  void *k = read_file("K.bin", &a), *k2 = read_file("K2.bin", &b);
  void *v = read_file("V.bin", &c), *v2 = read_file("V2.bin", &d);
  assert_int_equal(b, 2 * N);
  assert_int_equal(d, 2 * N);
  assert_memory_equal(k, k2, 2 * N);
  assert_memory_equal(v, v2, 2 * N);
  assert_false(exists("K2.bin.tmp"));
  free(k), free(k2), free(v), free(v2);
}

/* Keys stay bit-exact; each value is within e4m3's half step (2^-4
 * relative) plus its subnormal floor at the row scale amax/448, plus bf16
 * rounding of the output. */
static void test_cli_k16v8_round_trip_keeps_keys_and_bounds_values(void **state) {
  (void)state;
  encode("k16v8", "k16v8.kvt");
  assert_int_equal(run("verify k16v8.kvt"), 0);
  assert_int_equal(run("decode k16v8.kvt --k K3.bin --v V3.bin"), 0);
  size_t a, b;
  uint16_t *k = read_file("K.bin", &a), *k2 = read_file("K3.bin", &a);
  uint16_t *v = read_file("V.bin", &b), *v2 = read_file("V3.bin", &b);
  assert_memory_equal(k, k2, 2 * N);
  for (size_t row = 0; row < N / D; row++) {
    double amax = 0;
    for (size_t j = 0; j < D; j++)
      amax = fmax(amax, fabs(kvt_bf16_to_f32(v[row * D + j])));
    for (size_t j = 0; j < D; j++) {
      const double x = kvt_bf16_to_f32(v[row * D + j]), y = kvt_bf16_to_f32(v2[row * D + j]);
      if (fabs(y - x) > 0.0664 * fabs(x) + amax / 448.0 / 512.0)
        fail_msg("row %zu dim %zu: %g decoded as %g", row, j, x, y);
    }
  }
  free(k), free(k2), free(v), free(v2);
}

static void test_cli_verify_names_checksum_of_flipped_section_byte(void **state) {
  (void)state;
  encode("k16v8", "good.kvt");
  size_t len;
  uint8_t *buf = read_file("good.kvt", &len);
  kvt_section_info s;
  assert_int_equal(kvt_payload_section(ctx, buf, len, 1, &s), 0);
  buf[s.offset + s.stored_size / 2] ^= 0x10;
  write_file("flipped.kvt", buf, len);
  free(buf);
  assert_int_equal(run("verify flipped.kvt"), 1);
  assert_string_equal(res.out, "");
  assert_int_equal(count_lines(res.err), 1);
  assert_non_null(strstr(res.err, "flipped.kvt: KVT_ECHECKSUM: "));
  assert_int_equal(run("decode flipped.kvt --k Kx.bin --v Vx.bin"), 1);
  assert_non_null(strstr(res.err, "KVT_ECHECKSUM"));
  assert_false(exists("Kx.bin"));
}

static void test_cli_verify_and_inspect_name_truncation(void **state) {
  (void)state;
  encode("fp8", "whole.kvt");
  size_t len;
  void *buf = read_file("whole.kvt", &len);
  write_file("cut.kvt", buf, len / 2);
  free(buf);
  assert_int_equal(run("verify cut.kvt"), 1);
  assert_int_equal(count_lines(res.err), 1);
  assert_non_null(strstr(res.err, "cut.kvt: KVT_ETRUNC: "));
  assert_int_equal(run("inspect cut.kvt"), 1);
  assert_non_null(strstr(res.err, "KVT_ETRUNC"));
}

static void test_cli_missing_input_exits_3_naming_the_file(void **state) {
  (void)state;
  assert_int_equal(run("encode --codec raw " SHAPE " --k nosuch.bin --v V.bin -o m.kvt"), 3);
  assert_non_null(strstr(res.err, "nosuch.bin"));
  assert_false(exists("m.kvt"));
  assert_false(exists("m.kvt.tmp"));
  assert_int_equal(run("verify absent.kvt"), 3);
  assert_non_null(strstr(res.err, "absent.kvt"));
}

static void test_cli_bad_codec_is_a_usage_error(void **state) {
  (void)state;
  assert_int_equal(run("encode --codec k=q9 " SHAPE " --k K.bin --v V.bin -o b.kvt"), 2);
  assert_non_null(strstr(res.err, "--codec"));
  assert_false(exists("b.kvt"));
  assert_int_equal(run("encode --codec raw --dtype bf16 --layers 2 -o b.kvt"), 2);
  assert_int_equal(run("frobnicate"), 2);
  assert_int_equal(run("--help"), 0);
  assert_non_null(strstr(res.out, "Exit status"));
  assert_int_equal(run("--version"), 0);
}

/* bench attn checks its options before it looks for a GPU (a build with
 * CUDA; without, it says so and exits 4 whatever the options) */
static void test_cli_bench_attn_bad_options_are_usage_errors(void **state) {
  (void)state;
#ifdef KVT_HAVE_CUDA
  assert_int_equal(run("bench attn --shape 8x100"), 2); /* not x 16 */
  assert_non_null(strstr(res.err, "--shape"));
  assert_int_equal(run("bench attn --shape 0x64"), 2);
  assert_int_equal(run("bench attn --shape 8x64x2"), 2);
  assert_int_equal(run("bench attn --shape 1024x8192"), 2); /* > 4M tokens */
  assert_int_equal(run("bench attn --shape 8x64 --quick"), 2);
  assert_int_equal(run("bench attn --format int8"), 2);
  assert_non_null(strstr(res.err, "expected raw, k16v8, fp8 or int4"));
  assert_int_equal(run("bench attn --splits 0"), 2);
  assert_non_null(strstr(res.err, "1..64"));
  assert_int_equal(run("bench attn --splits 65"), 2);
  assert_non_null(strstr(res.err, "1..64"));
  /* accepted: past the options to the GPU (none here: 4; with one: 0) */
  const int ok = run("bench attn --format int4 --splits 4 --shape 1x16 --iters 1");
  assert_true(ok == 0 || ok == 4);
#else
  assert_int_equal(run("bench attn --shape 8x100"), 4);
  assert_non_null(strstr(res.err, "without CUDA"));
#endif
}

static void test_cli_wrong_size_input_gives_expected_and_actual_bytes(void **state) {
  (void)state;
  assert_int_equal(run("encode --codec raw --dtype bf16 --layers 3 --tokens 64 --heads 2 "
                       "--head-dim 128 --k K.bin --v V.bin -o w.kvt"),
                   2);
  assert_non_null(strstr(res.err, "K.bin: expected 98304 bytes"));
  assert_non_null(strstr(res.err, "file has 65536"));
  assert_false(exists("w.kvt"));
}

/* The key of --tokens-file is the library's chained key of its last chunk. */
static void test_cli_tokens_file_key_is_the_chained_chunk_key(void **state) {
  (void)state;
  uint32_t ids[2 * T];
  for (uint32_t i = 0; i < 2 * T; i++)
    ids[i] = 1000 + 3 * i;
  write_file("ids.bin", ids, sizeof(ids));
  assert_int_equal(run("encode --codec k16v8 " SHAPE " --model-id m/x --k K.bin --v V.bin "
                       "--tokens-file ids.bin -o ids.kvt"),
                   0);
  kvt_codec_spec spec;
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = "m/x";
  m.layers = L, m.kv_heads = H, m.head_dim = D;
  kvt_key fp, k0, k1;
  char hex[KVT_KEY_HEX_LEN + 1], want[80];
  assert_int_equal(kvt_codec_parse(ctx, "k16v8", &spec), 0);
  assert_int_equal(kvt_fingerprint(&m, &spec, &fp), 0);
  assert_int_equal(kvt_chunk_key(&fp, NULL, ids, T, &k0), 0);
  assert_int_equal(kvt_chunk_key(&fp, &k0, ids + T, T, &k1), 0);
  assert_int_equal(run("inspect ids.kvt --json"), 0);
  snprintf(want, sizeof(want), "\"key\": \"%s\"", kvt_key_hex(&k1, hex));
  assert_non_null(strstr(res.out, want));
  assert_non_null(strstr(res.out, "\"token_begin\": 64"));
}

static void test_cli_demo_small_runs(void **state) {
  (void)state;
  assert_int_equal(run("demo --tokens 256 --layers 2"), 0);
  assert_non_null(strstr(res.out, "k16v8"));
  assert_non_null(strstr(res.out, "takeaway"));
  assert_int_equal(run("demo --tokens 256 --layers 2 --heads 2 --json"), 0);
  assert_true(is_json(res.out));
}

static void test_cli_bench_codec_json_has_memcpy_baseline(void **state) {
  (void)state;
  assert_int_equal(run("bench codec --layers 2 --iters 3 --json"), 0);
  assert_true(is_json(res.out));
  assert_non_null(strstr(res.out, "memcpy"));
  assert_non_null(strstr(res.out, "\"encode_vs_memcpy\""));
}

int main(void) {
  if (access(CLI_BIN, X_OK) != 0) {
    fprintf(stderr, "test_cli: %s not built; skipped\n", CLI_BIN);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cli_raw_round_trip_is_bit_exact),
      cmocka_unit_test(test_cli_k16v8_round_trip_keeps_keys_and_bounds_values),
      cmocka_unit_test(test_cli_verify_names_checksum_of_flipped_section_byte),
      cmocka_unit_test(test_cli_verify_and_inspect_name_truncation),
      cmocka_unit_test(test_cli_missing_input_exits_3_naming_the_file),
      cmocka_unit_test(test_cli_bad_codec_is_a_usage_error),
      cmocka_unit_test(test_cli_wrong_size_input_gives_expected_and_actual_bytes),
      cmocka_unit_test(test_cli_tokens_file_key_is_the_chained_chunk_key),
      cmocka_unit_test(test_cli_demo_small_runs),
      cmocka_unit_test(test_cli_bench_codec_json_has_memcpy_baseline),
      cmocka_unit_test(test_cli_bench_attn_bad_options_are_usage_errors),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
