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

#define CLI_BIN KVT_BINARY_DIR "/programs/kvtier"

static char dir[64];
static char out[65536];

/* Runs `kvtier ARGS` with stdout into out; returns the exit status. */
static int run(const char *args) {
  char cmd[1024], path[128];
  snprintf(cmd, sizeof(cmd), "cd %s && %s %s >stdout.txt 2>stderr.txt", dir, CLI_BIN, args);
  const int st = system(cmd);
  snprintf(path, sizeof(path), "%s/stdout.txt", dir);
  out[0] = '\0';
  FILE *f = fopen(path, "rb");
  if (f) {
    out[fread(out, 1, sizeof(out) - 1, f)] = '\0';
    fclose(f);
  }
  return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_bench_tier_dram_json_has_memcpy_baseline(void **state) {
  (void)state;
  assert_int_equal(run("bench tier --tiers dram:64MiB --size 1MiB --count 8 --json"), 0);
  assert_non_null(strstr(out, "\"memcpy_gbps\""));
  assert_non_null(strstr(out, "\"get_vs_memcpy\""));
  assert_non_null(strstr(out, "\"put_gbps\""));
}

static void test_bench_tier_nvme_json_has_fio_baseline_or_null(void **state) {
  (void)state;
  char args[256];
  snprintf(args, sizeof(args), "bench tier --tiers nvme:%s/nv:64MiB --size 1MiB --count 8 --json",
           dir);
  assert_int_equal(run(args), 0);
  assert_non_null(strstr(out, "\"fio\":"));
  if (!strstr(out, "\"fio\": null")) {
    assert_non_null(strstr(out, "\"get_vs_fio_read\""));
    assert_non_null(strstr(out, "--ioengine=io_uring"));
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
