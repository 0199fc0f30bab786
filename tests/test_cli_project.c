/* tests/test_cli_project.c - `kvtier project` run as a program: the table and
 * its JSON agree with the library, the SVG is self-contained and well
 * formed, breakeven/fit/saturation/advise print the published figures, and
 * bad input gives the documented exit codes (1 bad input file, 2 usage,
 * 3 I/O). Exits 77 (skipped) when the tool was not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_harness.h"
#include "curve_fit.h"
#include "kvtier.h"
#include "kvtier/model.h"
#include "model_json.h"

static void write_text(const char *name, const char *text) { write_file(name, text, strlen(text)); }

static void must_run(int want, const char *args) {
  if (run("%s", args) != want)
    fail_msg("kvtier %s: exit %d, want %d\nstdout: %.2000s\nstderr: %s", args, res.rc, want,
             res.out, res.err);
}

/* The number under key in the JSON object obj. */
static double num(const kvt_json *obj, const char *key) {
  kvt_json v;
  double x = NAN;
  if (kvt_json_member(obj, key, &v) != 0 || kvt_json_number(&v, &x) != 0)
    fail_msg("no number \"%s\"", key);
  return x;
}

static kvt_json nth(const kvt_json *arr, size_t i) {
  kvt_json v;
  size_t pos = 0;
  for (size_t k = 0; k <= i; k++)
    if (!kvt_json_next(arr, &pos, NULL, &v))
      fail_msg("array has no element %zu", i);
  return v;
}

static void test_project_table_llama_qwen(void **state) {
  (void)state;
  must_run(0, "project --model llama-3.1-8b --model qwen2.5-7b --codec raw --codec k16v8 "
              "--codec int4 --batch 32 --context 128K --step-ms 10");
  assert_non_null(strstr(res.out, "llama-3.1-8b: 32 layers, 8 KV heads, head dim 128"));
  assert_non_null(strstr(res.out, "131072")); /* raw bytes per token */
  assert_non_null(strstr(res.out, "549.76"));  /* GB per step */
  assert_non_null(strstr(res.out, "57344"));   /* Qwen2.5-7B raw */
  assert_non_null(strstr(res.out, "nvme-gen5-x4"));
}

static void test_project_json_matches_library(void **state) {
  (void)state;
  must_run(0, "project --model llama-3.1-8b --codec raw --codec k16v8 --batch 32 --context "
              "131072 --step-ms 10 --weights --link nvlink4 --link mine=100 --json");
  kvt_json root, models, codecs, links;
  assert_int_equal(kvt_json_parse(NULL, res.out, strlen(res.out), &root), 0);
  assert_true(num(&root, "batch") == 32);
  assert_int_equal(kvt_json_member(&root, "models", &models), 0);
  kvt_json m = nth(&models, 0);
  assert_true(num(&m, "layers") == 32);
  assert_int_equal(kvt_json_member(&m, "codecs", &codecs), 0);
  kvt_json raw = nth(&codecs, 0), k16v8 = nth(&codecs, 1);
  assert_true(num(&raw, "bytes_per_token") == 131072);
  assert_true(num(&raw, "step_bytes") == 549755813888.0);
  assert_true(num(&k16v8, "bytes_per_token") == 32 * 8 * 388);
  assert_true(num(&k16v8, "amdahl_bound") > 1);
  assert_int_equal(kvt_json_member(&raw, "links", &links), 0);
  kvt_json nv = nth(&links, 0), mine = nth(&links, 1);
  const double need = 549755813888.0 / 0.01;
  assert_true(fabs(num(&nv, "shortfall") - need / 900e9) < 1e-9 * need / 900e9);
  assert_true(num(&mine, "GBps") == 100);
  assert_true(num(&mine, "max_context") == floor(100e9 * 0.01 / 32 / 131072));
}

static void test_project_models_from_shape_and_config(void **state) {
  (void)state;
  must_run(0, "project --layers 4 --kv-heads 2 --head-dim 64 --codec raw --batch 1 --context 1K "
              "--step-ms 1000 --link x=1 --json");
  assert_non_null(strstr(res.out, "\"bytes_per_token\":2048,")); /* 4 x 2 x 64 x 2 x 2 */
  write_text("config.json",
             "{\"model_type\":\"mistral\",\"num_hidden_layers\":32,\"num_attention_heads\":32,"
             "\"num_key_value_heads\":8,\"hidden_size\":4096,\"sliding_window\":4096}");
  must_run(0, "project --model config.json --codec raw --context 128K --link pcie5-x16");
  assert_non_null(strstr(res.out, "window 4096"));
  must_run(0, "project --list");
  assert_non_null(strstr(res.out, "deepseek-v3"));
  assert_non_null(strstr(res.out, "nvme-gen4-x4"));
}

static void test_project_svg_self_contained(void **state) {
  (void)state;
  must_run(0, "project --model llama-3.1-8b --model gemma3-12b --svg plot.svg");
  size_t len;
  char *svg = read_file("plot.svg", &len);
  assert_non_null(svg);
  svg = realloc(svg, len + 1);
  svg[len] = '\0';
  assert_true(strncmp(svg, "<?xml", 5) == 0);
  assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  assert_non_null(strstr(svg, "<polyline"));
  assert_non_null(strstr(svg, "Shortfall"));
  assert_non_null(strstr(svg, "gemma3-12b"));
  assert_null(strstr(svg, "<script"));
  assert_null(strstr(svg, "href"));
  assert_null(strstr(svg, "nan"));
  assert_null(strstr(svg, "inf"));
  assert_true(strcmp(svg + len - 7, "</svg>\n") == 0);
  free(svg);
  must_run(3, "project --model llama-3.1-8b --svg no/such/dir/plot.svg");
}

static void test_breakeven_fit_saturation(void **state) {
  (void)state;
  must_run(0, "project breakeven --base 4.37e-5,6.44 --new 2.37e-5,6.58");
  assert_non_null(strstr(res.out, "7000 tokens"));
  must_run(2, "project breakeven --base 1,2 --new 1,3");
  must_run(2, "project breakeven --base 1 --new 1,3");
  write_text("itl.jsonl", "{\"context\":1024,\"itl_ms\":6.4847488,\"series\":\"bf16\"}\n"
                          "{\"context\":131072,\"itl_ms\":12.1678464,\"series\":\"bf16\"}\n"
                          "\n"
                          "{\"context\":1024,\"itl_ms\":6.6042688,\"series\":\"fp8\"}\n"
                          "{\"context\":131072,\"itl_ms\":9.6864064,\"series\":\"fp8\"}\n");
  must_run(0, "project fit itl.jsonl");
  assert_non_null(strstr(res.out, "4.3700e-05"));
  assert_non_null(strstr(res.out, "7000 tokens"));
  must_run(0, "project saturation --smax 3.75 --bhalf 5.1 --gamma 1.32 --batch 32");
  assert_non_null(strstr(res.out, "80% of Smax: 14.6"));
  assert_non_null(strstr(res.out, "95%: 47.5"));
  char lines[1024] = "";
  for (int b = 1; b <= 128; b *= 2) {
    char l[96];
    snprintf(l, sizeof(l), "{\"batch\":%d,\"speedup\":%.17g}\n", b,
             curve_hill(3.75, 5.1, 1.32, b));
    strcat(lines, l);
  }
  write_text("sat.jsonl", lines);
  must_run(0, "project saturation sat.jsonl --json");
  kvt_json root;
  assert_int_equal(kvt_json_parse(NULL, res.out, strlen(res.out), &root), 0);
  assert_true(fabs(num(&root, "smax") - 3.75) < 1e-4);
  assert_true(fabs(num(&root, "gamma") - 1.32) < 1e-4);
  assert_true(num(&root, "r2") > 0.999999);
}

static void test_advise(void **state) {
  (void)state;
  must_run(0, "project advise --model llama-3.1-8b --hbm-free 40 --batch 32 --context 32K "
              "--measured pcie5-x16=55.6");
  assert_non_null(strstr(res.out, "prefill"));
  assert_non_null(strstr(res.out, "pcie5-x16"));
  assert_non_null(strstr(res.out, "0.87")); /* 55.6 / 64 */
  must_run(0, "project advise --model qwen2.5-7b --hbm-free 10 --codec k16v8 --link nvme-gen5 "
              "--json");
  kvt_json root;
  assert_int_equal(kvt_json_parse(NULL, res.out, strlen(res.out), &root), 0);
  must_run(2, "project advise --model qwen2.5-7b");                   /* no --hbm-free */
  must_run(2, "project advise --model qwen2.5-7b --hbm-free 1 --measured foo=3");
}

static void test_errors_and_help(void **state) {
  (void)state;
  static const char *const helps[] = {"project --help", "project breakeven --help",
                                      "project fit --help", "project saturation --help",
                                      "project advise --help"};
  for (size_t i = 0; i < sizeof(helps) / sizeof(helps[0]); i++) {
    must_run(0, helps[i]);
    assert_non_null(strstr(res.out, "Usage: kvtier project"));
  }
  must_run(2, "project");                                  /* no model */
  must_run(2, "project --model gpt-7");                    /* unknown preset */
  must_run(2, "project --model llama-3.1-8b --codec k=n17,v=n16");
  must_run(2, "project --model llama-3.1-8b --context lots");
  must_run(2, "project --model llama-3.1-8b --link warp=fast");
  must_run(2, "project --model llama-3.1-8b --batch 0");
  must_run(2, "project --layers 4 --kv-heads 2 --head-dim 48 --codec int4"); /* group 32 */
  must_run(3, "project --model missing.json");
  must_run(2, "project --layers 4 --kv-heads 2 --head-dim 64 --weights");  /* no --params */
  must_run(0, "project --layers 4 --kv-heads 2 --head-dim 64 --weights --params 1.5B");
  assert_non_null(strstr(res.out, "3.00")); /* 1.5e9 x 16 bits = 3.00 GB of weights */
  write_text("bad.json", "{\"num_hidden_layers\": 32,");
  must_run(1, "project --model bad.json");
  assert_non_null(strstr(res.err, "KVT_ECORRUPT"));
  write_text("bad.jsonl", "{\"context\":1,\"itl_ms\":2}\n{\"context\":2,\"itl_ms\":}\n");
  must_run(1, "project fit bad.jsonl");
  assert_non_null(strstr(res.err, "bad.jsonl:2"));
  write_text("one.jsonl", "{\"context\":1,\"itl_ms\":2}\n");
  must_run(1, "project fit one.jsonl");
  must_run(3, "project fit none.jsonl");
  must_run(2, "project fit");
}

static int group_setup(void **state) {
  (void)state;
  if (access(CLI_BIN, X_OK) != 0)
    return -1;
  snprintf(dir, sizeof(dir), "/tmp/kvt_test_cli_project_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  if (access(CLI_BIN, X_OK) != 0) {
    fprintf(stderr, "%s not built: skipped\n", CLI_BIN);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_project_table_llama_qwen),
      cmocka_unit_test(test_project_json_matches_library),
      cmocka_unit_test(test_project_models_from_shape_and_config),
      cmocka_unit_test(test_project_svg_self_contained),
      cmocka_unit_test(test_breakeven_fit_saturation),
      cmocka_unit_test(test_advise),
      cmocka_unit_test(test_errors_and_help),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
