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
#include <errno.h>
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

/* bench offload: --help in every build; with CUDA it checks its options
 * before it looks for a GPU, then runs (0) or says there is none (4);
 * without CUDA it says so and exits 4 whatever the options. */
static void test_cli_bench_offload_checks_options_then_needs_a_gpu(void **state) {
  (void)state;
  assert_int_equal(run("bench offload --help"), 0);
  assert_non_null(strstr(res.out, "verdict"));
  assert_non_null(strstr(res.out, "Exit status"));
#ifdef KVT_HAVE_CUDA
  assert_int_equal(run("bench offload --chunk 512"), 2);
  assert_non_null(strstr(res.err, "--chunk"));
  assert_int_equal(run("bench offload --tokens 1500"), 2);
  assert_non_null(strstr(res.err, "--tokens"));
  assert_int_equal(run("bench offload --tokens 131072"), 2);
  assert_int_equal(run("bench offload --codecs raw,nope"), 2);
  assert_non_null(strstr(res.err, "'nope'"));
  assert_int_equal(run("bench offload --nvme="), 2);
  /* accepted: the smallest run, past the options to the GPU (none here: 4) */
  const int rc = run("bench offload --tokens 1024 --chunk 1024 --iters 1 --codecs raw "
                     "--nvme off");
  if (rc == 4)
    assert_non_null(strstr(res.err, "no CUDA device"));
  else
    assert_int_equal(rc, 0);
#else
  assert_int_equal(run("bench offload --quick"), 4);
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

/* The bytes of dir/name equal those of dir/want. */
static void assert_same_bytes(const char *name, const char *want) {
  size_t a_len, b_len;
  void *a = read_file(name, &a_len), *b = read_file(want, &b_len);
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(a_len, b_len);
  assert_memory_equal(a, b, a_len);
  free(a);
  free(b);
}

/* Skips the test where device nodes cannot be made or opened. */
static void char_node_or_skip(const char *name, unsigned major, unsigned minor) {
  const int err = make_char_node(name, major, minor);
  if (err == -EPERM || err == -EACCES) {
    print_message("cannot make device nodes here (%s); skipped\n", strerror(-err));
    skip();
  }
  assert_int_equal(err, 0);
}

/* Outputs that are device nodes are opened and written in place: null
 * takes the bytes, full fails with ENOSPC (exit 3); either stays a device. */
static void test_cli_outputs_to_device_nodes_are_written_in_place(void **state) {
  (void)state;
  char_node_or_skip("null", 1, 3);
  char_node_or_skip("full", 1, 7);
  encode("raw", "dev.kvt");
  assert_int_equal(run("decode dev.kvt --k null --v null"), 0);
  assert_int_equal(file_type("null"), S_IFCHR);
  assert_int_equal(run("encode --codec raw " SHAPE " --k K.bin --v V.bin -o null"), 0);
  assert_int_equal(file_type("null"), S_IFCHR);

  assert_int_equal(run("encode --codec raw " SHAPE " --k K.bin --v V.bin -o full"), 3);
  assert_non_null(strstr(res.err, "full"));
  assert_non_null(strstr(res.err, strerror(ENOSPC)));
  assert_int_equal(file_type("full"), S_IFCHR);
  assert_int_equal(run("decode dev.kvt --k Kdev.bin --v full"), 3);
  assert_non_null(strstr(res.err, strerror(ENOSPC)));
  assert_int_equal(file_type("full"), S_IFCHR);
  assert_false(exists("Kdev.bin"));

  /* through a symlink: the device is written, the link stays */
  char target[300], link[300];
  path_of("null", target, sizeof(target));
  path_of("null.link", link, sizeof(link));
  assert_int_equal(symlink(target, link), 0);
  assert_int_equal(run("decode dev.kvt --k null.link --v null.link"), 0);
  assert_int_equal(file_type("null.link"), S_IFLNK);
  assert_int_equal(file_type("null"), S_IFCHR);
  assert_int_equal(tmp_files(""), 0);
}

/* A FIFO output is opened and written like a device: the reader gets the
 * bytes a file output gets, and the FIFO stays a FIFO. */
static void test_cli_output_to_fifo_is_written_in_place(void **state) {
  (void)state;
  encode("raw", "fifo.kvt");
  fifo_reader r;
  fifo_start(&r, "out.fifo");
  int rc = run("encode --codec raw " SHAPE " --k K.bin --v V.bin -o out.fifo");
  fifo_finish(&r);
  assert_int_equal(rc, 0);
  assert_int_equal(file_type("out.fifo"), S_IFIFO);
  size_t len;
  void *want = read_file("fifo.kvt", &len);
  assert_int_equal(r.len, len);
  assert_memory_equal(r.buf, want, len);
  free(want);
  free(r.buf);

  fifo_start(&r, "k.fifo");
  rc = run("decode fifo.kvt --k k.fifo --v Vfifo.bin");
  fifo_finish(&r);
  assert_int_equal(rc, 0);
  assert_int_equal(file_type("k.fifo"), S_IFIFO);
  want = read_file("K.bin", &len);
  assert_int_equal(r.len, len);
  assert_memory_equal(r.buf, want, len);
  free(want);
  free(r.buf);
  assert_same_bytes("Vfifo.bin", "V.bin");
  assert_int_equal(tmp_files(""), 0);
}

/* An output named through a symlink replaces the link's target atomically
 * (its temporary file beside the target); the link stays a link, and a
 * dangling link gets its target created. */
static void test_cli_output_through_symlink_replaces_its_target(void **state) {
  (void)state;
  encode("raw", "sym.kvt");
  char sub[300], link[300];
  path_of("symdir", sub, sizeof(sub));
  assert_int_equal(mkdir(sub, 0755), 0);
  write_file("symdir/target.kvt", "old", 3);
  path_of("sym.link", link, sizeof(link));
  assert_int_equal(symlink("symdir/target.kvt", link), 0);
  assert_int_equal(run("encode --codec raw " SHAPE " --k K.bin --v V.bin -o sym.link"), 0);
  assert_int_equal(file_type("sym.link"), S_IFLNK);
  assert_int_equal(file_type("symdir/target.kvt"), S_IFREG);
  assert_same_bytes("symdir/target.kvt", "sym.kvt");

  path_of("dangling.link", link, sizeof(link));
  assert_int_equal(symlink("symdir/new.bin", link), 0);
  assert_int_equal(run("decode sym.kvt --k dangling.link --v Vsym.bin"), 0);
  assert_int_equal(file_type("dangling.link"), S_IFLNK);
  assert_same_bytes("symdir/new.bin", "K.bin");
  assert_int_equal(tmp_files(""), 0);
  assert_int_equal(tmp_files("symdir"), 0);
}

/* decode writes both files or neither: when the second cannot be written,
 * the first is not left behind, and a file the user had is kept as it was. */
static void test_cli_decode_leaves_no_first_output_when_the_second_fails(void **state) {
  (void)state;
  encode("raw", "half.kvt");
  assert_int_equal(run("decode half.kvt --k Khalf.bin --v nodir/Vhalf.bin"), 3);
  assert_non_null(strstr(res.err, "nodir/Vhalf.bin"));
  assert_false(exists("Khalf.bin"));
  write_file("Kmine.bin", "mine", 4);
  assert_int_equal(run("decode half.kvt --k Kmine.bin --v nodir/Vhalf.bin"), 3);
  char buf[16];
  slurp("Kmine.bin", buf, sizeof(buf));
  assert_string_equal(buf, "mine");
  assert_int_equal(tmp_files(""), 0);
}

/* An output naming an input (by its name, another path, a symlink or a hard
 * link), or both outputs naming one file, is refused before anything is
 * written. */
static void test_cli_outputs_naming_an_input_are_usage_errors(void **state) {
  (void)state;
  encode("raw", "self.kvt");
  size_t len;
  void *orig = read_file("self.kvt", &len);
  char path[300], alias[300];
  path_of("self.kvt", path, sizeof(path));
  path_of("self.alias", alias, sizeof(alias));
  assert_int_equal(symlink("self.kvt", alias), 0);
  path_of("self.hard", alias, sizeof(alias));
  assert_int_equal(link(path, alias), 0);
  const char *cases[] = {"decode self.kvt --k self.kvt --v Vself.bin",
                         "decode self.kvt --k Kself.bin --v ./self.kvt",
                         "decode self.kvt --k self.alias --v Vself.bin",
                         "decode self.alias --k Kself.bin --v self.hard",
                         "decode self.kvt --k Kself.bin --v Kself.bin"};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    if (run("%s", cases[i]) != 2)
      fail_msg("'%s' exited %d: %s", cases[i], res.rc, res.err);
    assert_non_null(strstr(res.err, "same file"));
    assert_false(exists("Kself.bin"));
    assert_false(exists("Vself.bin"));
  }
  void *now = read_file("self.kvt", &len);
  assert_memory_equal(orig, now, len);
  free(now);
  free(orig);
  assert_int_equal(run("encode --codec raw " SHAPE " --k K.bin --v V.bin -o ./K.bin"), 2);
  assert_non_null(strstr(res.err, "same file"));
  size_t k_len;
  free(read_file("K.bin", &k_len));
  assert_int_equal(k_len, 2 * N);
}

/* A payload written to stdout is the payload's bytes alone: the summary line
 * goes to stderr then. */
static void test_cli_output_to_stdout_carries_no_summary_line(void **state) {
  (void)state;
  encode("raw", "file.kvt");
  assert_int_equal(run("encode --codec raw " SHAPE " --k K.bin --v V.bin -o /dev/stdout"), 0);
  assert_non_null(strstr(res.err, "bytes, raw"));
  size_t a_len, b_len;
  void *a = read_file("file.kvt", &a_len), *b = read_file("stdout.txt", &b_len);
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(b_len, a_len);
  assert_memory_equal(a, b, a_len);
  free(a);
  free(b);
}

/* -o /dev/stdout (or /dev/fd/N) writes through the descriptor the shell
 * gave: a file it names is appended to where the shell is, never replaced,
 * and what the shell writes after it follows the payload. */
static void test_cli_output_to_dev_stdout_writes_through_the_descriptor(void **state) {
  (void)state;
  encode("raw", "fd.kvt");
  size_t len;
  void *want = read_file("fd.kvt", &len);
  char cmd[1200];
  snprintf(cmd, sizeof(cmd),
           "cd %s && echo header > cat.txt && { %s encode --codec raw " SHAPE
           " --k K.bin --v V.bin -o /dev/stdout 2>/dev/null; echo footer; } >> cat.txt && "
           "exec 5>gone.txt && rm gone.txt && %s encode --codec raw " SHAPE
           " --k K.bin --v V.bin -o /dev/fd/5 >/dev/null 2>&1",
           dir, CLI_BIN, CLI_BIN);
  assert_int_equal(system(cmd), 0);
  size_t got_len;
  char *got = read_file("cat.txt", &got_len);
  assert_non_null(got);
  if (got_len != 7 + len + 7 || memcmp(got, "header\n", 7) != 0 ||
      memcmp(got + 7, want, len) != 0 || memcmp(got + 7 + len, "footer\n", 7) != 0)
    fail_msg("cat.txt: %zu bytes, want header + %zu payload bytes + footer", got_len, len);
  assert_false(exists("gone.txt (deleted)")); /* readlink's name of a deleted file */
  assert_false(exists("gone.txt"));
  assert_int_equal(tmp_files(""), 0);
  free(got);
  free(want);
}

/* A symlink that another user planted in a sticky, world-writable
 * directory (/tmp) is not followed: the kernel's fs.protected_symlinks
 * refuses root the same link, and following it by hand would replace
 * whatever file it names. */
static void test_cli_output_refuses_a_strangers_symlink_in_a_sticky_dir(void **state) {
  (void)state;
  if (geteuid() != 0)
    skip(); /* a link owned by another user needs root to make */
  encode("raw", "sticky.kvt");
  assert_int_equal(run("decode sticky.kvt --k victim.bin --v /dev/null"), 0);
  size_t len;
  void *before = read_file("victim.bin", &len);
  char pub[300], victim[300], link[320];
  path_of("pub", pub, sizeof(pub));
  path_of("victim.bin", victim, sizeof(victim));
  assert_int_equal(mkdir(pub, 0777), 0);
  assert_int_equal(chmod(pub, 01777), 0);
  snprintf(link, sizeof(link), "%s/out.bin", pub);
  assert_int_equal(symlink(victim, link), 0);
  assert_int_equal(lchown(link, 65534, 65534), 0);
  assert_int_equal(run("decode sticky.kvt --k pub/out.bin --v pub/v.bin"), 3);
  assert_non_null(strstr(res.err, "pub/out.bin"));
  size_t after_len;
  void *after = read_file("victim.bin", &after_len);
  assert_int_equal(after_len, len);
  assert_memory_equal(after, before, len);
  assert_false(exists("pub/v.bin"));
  /* the directory's owner's link, and one of the writer's own, are followed */
  assert_int_equal(lchown(link, 0, 0), 0);
  assert_int_equal(run("decode sticky.kvt --k pub/out.bin --v /dev/null"), 0);
  assert_int_equal(file_type("pub/out.bin"), S_IFLNK);
  free(before);
  free(after);
}

static void test_cli_empty_output_path_is_a_usage_error(void **state) {
  (void)state;
  encode("raw", "empty.kvt");
  assert_int_equal(run("encode --codec raw " SHAPE " --k K.bin --v V.bin -o ''"), 2);
  assert_non_null(strstr(res.err, "-o"));
  assert_non_null(strstr(res.err, "empty"));
  assert_int_equal(run("encode --codec raw " SHAPE " --k K.bin --v V.bin --output="), 2);
  assert_int_equal(run("decode empty.kvt --k '' --v Vempty.bin"), 2);
  assert_non_null(strstr(res.err, "--k"));
  assert_int_equal(run("decode empty.kvt --k Kempty.bin --v ''"), 2);
  assert_non_null(strstr(res.err, "--v"));
  assert_false(exists("Kempty.bin"));
  assert_false(exists("Vempty.bin"));
}

/* The help of each command that writes files says how. */
static void test_cli_help_says_how_outputs_are_written(void **state) {
  (void)state;
  const char *cmds[] = {"encode", "decode", "store", ""};
  for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
    assert_int_equal(run("%s --help", cmds[i]), 0);
    assert_non_null(strstr(res.out, "in place"));
    assert_non_null(strstr(res.out, "atomically"));
    assert_non_null(strstr(res.out, "Exit status"));
  }
  assert_int_equal(run("decode --help"), 0);
  assert_non_null(strstr(res.out, "both files are written or neither"));
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

/* `kvtier quality` runs the Python tool kvtier.quality: with KVT_PYTHON, this
 * build's python/ on PYTHONPATH and its library in KVTIER_LIBRARY; without a
 * Python it says how to get one. */
static void test_cli_quality_runs_the_python_tool(void **state) {
  (void)state;
  setenv("KVT_PYTHON", "/nonexistent/python", 1);
  assert_int_equal(run("quality --prefix 256"), 4);
  assert_non_null(strstr(res.err, "./bootstrap.sh vllm"));
  const char script[] = "#!/bin/sh\necho \"args: $*\"\necho \"path: $PYTHONPATH\"\n"
                        "echo \"lib: $KVTIER_LIBRARY\"\n";
  write_file("fakepy", script, sizeof(script) - 1);
  char py[256];
  path_of("fakepy", py, sizeof(py));
  assert_int_equal(chmod(py, 0755), 0);
  setenv("KVT_PYTHON", py, 1);
  unsetenv("KVTIER_LIBRARY");
  assert_int_equal(run("quality --prefix 256 --codecs raw"), 0);
  assert_non_null(strstr(res.out, "args: -m kvtier.quality --prefix 256 --codecs raw"));
  assert_non_null(strstr(res.out, "/python"));
  if (access(KVT_BINARY_DIR "/libkvtier.so", R_OK) == 0) /* a build with the shared library */
    assert_non_null(strstr(res.out, "lib: " KVT_BINARY_DIR "/libkvtier.so"));
  unsetenv("KVT_PYTHON");
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
      cmocka_unit_test(test_cli_outputs_to_device_nodes_are_written_in_place),
      cmocka_unit_test(test_cli_output_to_fifo_is_written_in_place),
      cmocka_unit_test(test_cli_output_through_symlink_replaces_its_target),
      cmocka_unit_test(test_cli_decode_leaves_no_first_output_when_the_second_fails),
      cmocka_unit_test(test_cli_outputs_naming_an_input_are_usage_errors),
      cmocka_unit_test(test_cli_output_to_dev_stdout_writes_through_the_descriptor),
      cmocka_unit_test(test_cli_output_refuses_a_strangers_symlink_in_a_sticky_dir),
      cmocka_unit_test(test_cli_empty_output_path_is_a_usage_error),
      cmocka_unit_test(test_cli_output_to_stdout_carries_no_summary_line),
      cmocka_unit_test(test_cli_help_says_how_outputs_are_written),
      cmocka_unit_test(test_cli_demo_small_runs),
      cmocka_unit_test(test_cli_bench_codec_json_has_memcpy_baseline),
      cmocka_unit_test(test_cli_bench_attn_bad_options_are_usage_errors),
      cmocka_unit_test(test_cli_bench_offload_checks_options_then_needs_a_gpu),
      cmocka_unit_test(test_cli_quality_runs_the_python_tool),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
