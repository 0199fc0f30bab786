/* tests/test_cli_store.c - `kvtier store` run as a program against an nvme
 * tier in a temporary directory: the put/ls/stats/get/rm round trip across
 * invocations, refusal of corrupt payloads and mismatched keys, a stored file
 * corrupted on disk, and bad tier specs. Exits 77 (skipped) when the tool was
 * not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_harness.h"
#include "kvtier.h"
#include "synth.h"


/* The chunk every test stores: 2 layers x 64 tokens x 2 heads x 128. */
enum { L = 2, T = 64, H = 2, D = 128, N = L * T * H * D };
#define SHAPE "--dtype bf16 --layers 2 --tokens 64 --heads 2 --head-dim 128"

static kvt_ctx *ctx;
static char payload_key[KVT_KEY_HEX_LEN + 1]; /* of p.kvt */


/* `kvtier store --tiers nvme:DIR/TIER:64MiB ARGS`. */
static int store(const char *tier, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int store(const char *tier, const char *fmt, ...) {
  char args[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof(args), fmt, ap);
  va_end(ap);
  return run("store --tiers nvme:%s/%s:64MiB %s", dir, tier, args);
}

/* Flips every bit of the byte at off in file name. */
static void flip_byte(const char *name, long off) {
  char path[256];
  path_of(name, path, sizeof(path));
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  const int c = fgetc(f);
  assert_true(c != EOF);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  assert_int_equal(fputc(c ^ 0xff, f), c ^ 0xff);
  assert_int_equal(fclose(f), 0);
}

static int group_setup(void **state) {
  (void)state;
  snprintf(dir, sizeof(dir), "/tmp/kvt_test_cli_store_XXXXXX");
  if (!mkdtemp(dir) || kvt_ctx_create(NULL, &ctx) != 0)
    return -1;
  uint16_t *k = malloc(2 * N), *v = malloc(2 * N);
  if (!k || !v)
    return -1;
  kvt_synth_shape s = {L, T, H, D, KVT_DTYPE_BF16, 0, 0};
  kvt_synth_kv(&s, 11, k, v);
  write_file("K.bin", k, 2 * N);
  write_file("V.bin", v, 2 * N);
  free(k);
  free(v);
  if (run("encode --codec k16v8 " SHAPE " --k K.bin --v V.bin -o p.kvt") != 0)
    return -1;
  size_t len;
  void *buf = read_file("p.kvt", &len);
  kvt_payload_info info;
  const int err = buf ? kvt_payload_parse(ctx, buf, len, &info) : -1;
  free(buf);
  if (err)
    return -1;
  kvt_key_hex(&info.key, payload_key);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  kvt_ctx_destroy(ctx);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_cli_store_round_trip_across_invocations(void **state) {
  (void)state;
  assert_int_equal(store("t1", "put p.kvt"), 0);
  assert_non_null(strstr(res.out, payload_key));

  assert_int_equal(store("t1", "ls"), 0);
  assert_non_null(strstr(res.out, payload_key));
  assert_non_null(strstr(res.out, "1 keys"));
  assert_int_equal(store("t1", "ls --json"), 0);
  assert_non_null(strstr(res.out, "\"count\": 1"));

  assert_int_equal(store("t1", "stats"), 0);
  assert_non_null(strstr(res.out, "items      1\n"));
  assert_int_equal(store("t1", "stats --json"), 0);
  assert_non_null(strstr(res.out, "\"items\": 1,"));

  assert_int_equal(store("t1", "get --key %s -o back.kvt", payload_key), 0);
  size_t a_len, b_len;
  void *a = read_file("p.kvt", &a_len), *b = read_file("back.kvt", &b_len);
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(a_len, b_len);
  assert_memory_equal(a, b, a_len);
  free(a);
  free(b);

  assert_int_equal(store("t1", "rm --key %s", payload_key), 0);
  assert_int_equal(store("t1", "get --key %s -o gone.kvt", payload_key), 1);
  assert_non_null(strstr(res.err, "not found"));
  assert_false(exists("gone.kvt"));
  assert_int_equal(store("t1", "rm --key %s", payload_key), 1);
  assert_non_null(strstr(res.err, "not found"));
  assert_int_equal(store("t1", "ls"), 0);
  assert_non_null(strstr(res.out, "0 keys"));
}

static void test_cli_store_put_rejects_corrupt_payload_and_stores_nothing(void **state) {
  (void)state;
  size_t len;
  void *buf = read_file("p.kvt", &len);
  assert_non_null(buf);
  ((uint8_t *)buf)[len - 100] ^= 0x01; /* inside the last section's body */
  write_file("bad.kvt", buf, len);
  free(buf);
  assert_int_equal(store("t2", "put bad.kvt"), 1);
  assert_non_null(strstr(res.err, "bad.kvt: KVT_E"));
  assert_int_equal(store("t2", "ls"), 0);
  assert_non_null(strstr(res.out, "0 keys"));
}

static void test_cli_store_put_rejects_key_mismatch_naming_both_keys(void **state) {
  (void)state;
  const char *other = "00112233445566778899aabbccddeeff";
  assert_int_equal(store("t3", "put --key %s p.kvt", other), 1);
  assert_non_null(strstr(res.err, other));
  assert_non_null(strstr(res.err, payload_key));
  assert_int_equal(store("t3", "ls"), 0);
  assert_non_null(strstr(res.out, "0 keys"));
  assert_int_equal(store("t3", "put --key %s p.kvt", payload_key), 0);
}

static void test_cli_store_get_of_file_corrupted_on_disk_exits_1_writes_nothing(void **state) {
  (void)state;
  assert_int_equal(store("t4", "put p.kvt"), 0);
  char name[128];
  snprintf(name, sizeof(name), "t4/%.2s/%s", payload_key, payload_key);
  assert_true(exists(name));
  flip_byte(name, 4096 + 200); /* past the tier's 4096-byte file header */
  assert_int_equal(store("t4", "get --key %s -o out.kvt", payload_key), 1);
  assert_non_null(strstr(res.err, payload_key));
  assert_false(exists("out.kvt"));
  assert_false(exists("out.kvt.tmp"));
}

static void test_cli_store_bad_tiers_spec_is_a_usage_error(void **state) {
  (void)state;
  assert_int_equal(run("store --tiers nvme:%s/t5 ls", dir), 2);
  assert_non_null(strstr(res.err, "DIR:SIZE"));
  assert_int_equal(run("store --tiers bogus:1GiB ls"), 2);
  assert_non_null(strstr(res.err, "bogus"));
  assert_int_equal(run("store ls"), 2);
  assert_non_null(strstr(res.err, "--tiers"));
  assert_int_equal(store("t5", "frob"), 2);
  assert_int_equal(store("t5", "get --key nothex -o x.kvt"), 2);
  assert_int_equal(store("t5", "get --key %s", payload_key), 2);
}

/* Two nvme tiers through the cache manager: the first holds one payload, so
 * a second put demotes the first payload to the lower tier. */
static void test_cli_store_two_tiers_demote_list_and_get(void **state) {
  (void)state;
  assert_int_equal(run("encode --codec k16v8 " SHAPE " --model-id m2 --k K.bin --v V.bin "
                       "-o p2.kvt"), 0);
  char spec[600];
  snprintf(spec, sizeof(spec), "'nvme:%s/t6a:150KiB;nvme:%s/t6b:1MiB'", dir, dir);
  assert_int_equal(run("store --tiers %s put p.kvt", spec), 0);
  assert_non_null(strstr(res.out, "tier 0"));
  assert_int_equal(run("store --tiers %s put p2.kvt", spec), 0);
  assert_non_null(strstr(res.out, "tier 0"));
  assert_int_equal(run("store --tiers %s put p2.kvt", spec), 0);
  assert_non_null(strstr(res.out, "already held"));
  assert_int_equal(run("store --tiers %s ls", spec), 0);
  assert_non_null(strstr(res.out, "2 keys"));
  assert_non_null(strstr(res.out, "tier 1"));
  char line[128];
  snprintf(line, sizeof(line), "%s", payload_key);
  const char *at = strstr(res.out, line);
  assert_non_null(at);
  assert_non_null(strstr(at, "tier 1")); /* p.kvt, the colder, went down */
  assert_int_equal(run("store --tiers %s stats --json", spec), 0);
  /* One payload in each tier (the counters are this invocation's). */
  const char *first = strstr(res.out, "\"items\": 1,");
  assert_non_null(first);
  assert_non_null(strstr(first + 1, "\"items\": 1,"));
  assert_int_equal(run("store --tiers %s get --key %s -o back6.kvt", spec, payload_key), 0);
  size_t a_len, b_len;
  void *a = read_file("p.kvt", &a_len), *b = read_file("back6.kvt", &b_len);
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(a_len, b_len);
  assert_memory_equal(a, b, a_len);
  free(a);
  free(b);
  assert_int_equal(run("store --tiers %s rm --key %s", spec, payload_key), 0);
  assert_int_equal(run("store --tiers %s ls", spec), 0);
  assert_non_null(strstr(res.out, "1 keys"));
}

/* get -o to device nodes writes in place: null takes the payload, full
 * fails with ENOSPC (exit 3); both stay devices. */
static void test_cli_store_get_to_device_nodes_writes_in_place(void **state) {
  (void)state;
  int err = make_char_node("null", 1, 3);
  if (!err)
    err = make_char_node("full", 1, 7);
  if (err == -EPERM || err == -EACCES) {
    print_message("cannot make device nodes here (%s); skipped\n", strerror(-err));
    skip();
  }
  assert_int_equal(err, 0);
  assert_int_equal(store("t7", "put p.kvt"), 0);
  assert_int_equal(store("t7", "get --key %s -o null", payload_key), 0);
  assert_int_equal(file_type("null"), S_IFCHR);
  assert_int_equal(store("t7", "get --key %s -o full", payload_key), 3);
  assert_non_null(strstr(res.err, "full"));
  assert_non_null(strstr(res.err, strerror(ENOSPC)));
  assert_int_equal(file_type("full"), S_IFCHR);
  assert_int_equal(tmp_files(""), 0);
}

/* A value that is not a payload, or a payload of another chunk, stored
 * under a key (planted through the tier API, as another program could) is
 * a bad payload: exit 1 as the help says, naming the key, nothing written. */
static void test_cli_store_get_of_foreign_or_non_payload_value_exits_1(void **state) {
  (void)state;
  assert_int_equal(run("encode --codec k16v8 " SHAPE " --model-id m8 --k K.bin --v V.bin "
                       "-o p8.kvt"),
                   0);
  size_t len;
  void *other = read_file("p8.kvt", &len);
  assert_non_null(other);
  char spec[300];
  snprintf(spec, sizeof(spec), "nvme:%s/t8:64MiB", dir);
  kvt_tier *tier;
  assert_int_equal(kvt_tier_open(ctx, spec, &tier), 0);
  kvt_key foreign_key, junk_key;
  assert_int_equal(kvt_key_from_hex(payload_key, &foreign_key), 0);
  assert_int_equal(kvt_key_from_hex("00112233445566778899aabbccddeeff", &junk_key), 0);
  assert_int_equal(kvt_tier_put(tier, &foreign_key, other, len), 0);
  static const char junk[8192] = "tenant record, not a kvtier payload";
  assert_int_equal(kvt_tier_put(tier, &junk_key, junk, sizeof(junk)), 0);
  kvt_tier_close(tier);
  free(other);

  assert_int_equal(store("t8", "get --key %s -o f8.kvt", payload_key), 1);
  assert_non_null(strstr(res.err, payload_key));
  assert_non_null(strstr(res.err, "KVT_EFOREIGN"));
  assert_false(exists("f8.kvt"));
  assert_int_equal(store("t8", "get --key 00112233445566778899aabbccddeeff -o j8.kvt"), 1);
  assert_non_null(strstr(res.err, "00112233445566778899aabbccddeeff"));
  assert_non_null(strstr(res.err, "KVT_EFORMAT"));
  assert_false(exists("j8.kvt"));
}

static void test_cli_store_get_empty_output_path_is_a_usage_error(void **state) {
  (void)state;
  assert_int_equal(store("t9", "get --key %s -o ''", payload_key), 2);
  assert_non_null(strstr(res.err, "-o"));
  assert_non_null(strstr(res.err, "empty"));
}

/* A size past 2^64 bytes is called too large, not "not a size above zero". */
static void test_cli_store_overflowing_size_says_too_large(void **state) {
  (void)state;
  const char *sizes[] = {"99999999999999999999GiB", "99999999999TiB", "18446744073709551616"};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    assert_int_equal(run("store --tiers dram:%s ls", sizes[i]), 2);
    assert_non_null(strstr(res.err, "too large"));
    assert_null(strstr(res.err, "above zero"));
    assert_int_equal(run("store --tiers nvme:%s/t10:%s ls", dir, sizes[i]), 2);
    assert_non_null(strstr(res.err, "too large"));
    assert_null(strstr(res.err, "above zero"));
  }
  assert_int_equal(run("store --tiers dram:0 ls"), 2);
  assert_non_null(strstr(res.err, "above zero"));
}

/* Beside the directory's writer (a tier this test holds open, as
 * kvtier-server would): get, ls and stats run and delete nothing - not the
 * writer's temporary of a PUT in flight, not a value that is not a kvtier
 * payload (a get refuses it) - and rm, a writer, fails naming the holder. */
static void test_cli_store_read_commands_beside_a_writer_delete_nothing(void **state) {
  (void)state;
  char spec[300], tmp[300];
  snprintf(spec, sizeof(spec), "nvme:%s/t8:64MiB", dir);
  kvt_tier *w = NULL;
  assert_int_equal(kvt_tier_open(ctx, spec, &w), 0);
  const char *hex = "8899aabbccddeeff0011223344556677";
  kvt_key key;
  assert_int_equal(kvt_key_from_hex(hex, &key), 0);
  static const char value[] = "a tenant's record, not a kvtier payload";
  assert_int_equal(kvt_tier_put(w, &key, value, sizeof(value)), 0);
  snprintf(tmp, sizeof(tmp), "t8/88/.tmp-%s-7", hex);
  write_file(tmp, "a PUT in flight", 15);
  assert_int_equal(store("t8", "ls"), 0);
  assert_non_null(strstr(res.out, hex));
  assert_int_equal(store("t8", "stats"), 0);
  assert_true(store("t8", "get --key %s -o out8.kvt", hex) != 0);
  assert_false(exists("out8.kvt"));
  assert_true(exists(tmp));
  char got[sizeof(value)];
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(w, &key, got, sizeof(got), &len), 0);
  assert_int_equal(len, sizeof(value));
  assert_memory_equal(got, value, sizeof(value));
  char holder[64];
  snprintf(holder, sizeof(holder), "in use by pid %ld", (long)getpid());
  assert_int_equal(store("t8", "rm --key %s", hex), 3);
  assert_non_null(strstr(res.err, holder));
  assert_int_equal(kvt_tier_query(w, &key, NULL), 0);
  kvt_tier_close(w);
}

/* A password or token in --tiers is shown as *** in errors (the tiers
 * cannot be reached here; test_tier_redis runs the output of a live one). */
static void test_cli_store_shows_passwords_and_tokens_as_stars(void **state) {
  (void)state;
  static const char *const tiers[] = {
      "redis://:S3CRET-pw@127.0.0.1:1?bogus=1", "dram:1MiB;;redis://:S3CRET-pw@127.0.0.1:1",
      "redis://:S3CRET-pw@127.0.0.1:1",
      "dram:1MiB;fabric://127.0.0.1:1?token=S3CRET-tok&timeout_ms=200"};
  for (size_t i = 0; i < sizeof(tiers) / sizeof(tiers[0]); i++) {
    const int rc = run("store --tiers '%s' ls", tiers[i]);
    if (rc == 0 || strstr(res.out, "S3CRET") || strstr(res.err, "S3CRET") ||
        (i < 2 && !strstr(res.err, "***")))
      fail_msg("--tiers '%s': exit %d\n%s%s", tiers[i], rc, res.out, res.err);
  }
}

static void test_cli_store_help_documents_subcommands_and_exit_codes(void **state) {
  (void)state;
  assert_int_equal(run("store --help"), 0);
  const char *want[] = {"put", "get", "rm", "ls", "stats", "nvme:", "dram:", "Exit status"};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
    assert_non_null(strstr(res.out, want[i]));
  assert_int_equal(run("--help"), 0);
  assert_non_null(strstr(res.out, "store"));
}

int main(void) {
  if (access(CLI_BIN, X_OK) != 0) {
    fprintf(stderr, "test_cli_store: %s not built; skipped\n", CLI_BIN);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cli_store_round_trip_across_invocations),
      cmocka_unit_test(test_cli_store_put_rejects_corrupt_payload_and_stores_nothing),
      cmocka_unit_test(test_cli_store_put_rejects_key_mismatch_naming_both_keys),
      cmocka_unit_test(test_cli_store_get_of_file_corrupted_on_disk_exits_1_writes_nothing),
      cmocka_unit_test(test_cli_store_bad_tiers_spec_is_a_usage_error),
      cmocka_unit_test(test_cli_store_two_tiers_demote_list_and_get),
      cmocka_unit_test(test_cli_store_read_commands_beside_a_writer_delete_nothing),
      cmocka_unit_test(test_cli_store_help_documents_subcommands_and_exit_codes),
      cmocka_unit_test(test_cli_store_get_to_device_nodes_writes_in_place),
      cmocka_unit_test(test_cli_store_get_of_foreign_or_non_payload_value_exits_1),
      cmocka_unit_test(test_cli_store_get_empty_output_path_is_a_usage_error),
      cmocka_unit_test(test_cli_store_overflowing_size_says_too_large),
      cmocka_unit_test(test_cli_store_shows_passwords_and_tokens_as_stars),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
