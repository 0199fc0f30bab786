/* tests/test_cli_bench_tier.c - smoke runs of `kvtier bench tier` (a small
 * dram tier and an nvme tier in a temporary directory): exit 0, JSON with
 * the memcpy baseline, and the fio baseline or "fio": null when fio is not
 * on PATH. Not a timed test: the numbers are not checked. Exits 77 (skipped)
 * when the tool was not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_harness.h"

static void test_bench_tier_dram_json_has_memcpy_baseline(void **state) {
  (void)state;
  assert_int_equal(run("bench tier --tiers dram:64MiB --size 1MiB --count 8 --json"), 0);
  assert_non_null(strstr(res.out, "\"memcpy_gbps\""));
  assert_non_null(strstr(res.out, "\"get_vs_memcpy\""));
  assert_non_null(strstr(res.out, "\"put_gbps\""));
}

static void test_bench_tier_nvme_json_has_fio_baseline_or_null(void **state) {
  (void)state;
  char args[256];
  snprintf(args, sizeof(args), "bench tier --tiers nvme:%s/nv:64MiB --size 1MiB --count 8 --json",
           dir);
  assert_int_equal(run("%s", args), 0);
  assert_non_null(strstr(res.out, "\"fio\":"));
  if (!strstr(res.out, "\"fio\": null")) {
    assert_non_null(strstr(res.out, "\"get_vs_fio_read\""));
    assert_non_null(strstr(res.out, "--ioengine=io_uring"));
  }
  /* the fio file is removed afterwards */
  char cmd[256];
  snprintf(cmd, sizeof(cmd), "ls %s/nv | grep -q kvt-bench-fio", dir);
  assert_int_not_equal(system(cmd), 0);
}

static void test_bench_tier_requires_tiers(void **state) {
  (void)state;
  assert_int_equal(run("bench tier --size 1MiB"), 2);
}

static int group_setup(void **state) {
  (void)state;
  snprintf(dir, sizeof(dir), "/tmp/kvt_test_btier_XXXXXX");
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
    fprintf(stderr, "test_cli_bench_tier: %s not built; skipped\n", CLI_BIN);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bench_tier_dram_json_has_memcpy_baseline),
      cmocka_unit_test(test_bench_tier_nvme_json_has_fio_baseline_or_null),
      cmocka_unit_test(test_bench_tier_requires_tiers),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
