/* tests/test_golden.c - golden payloads must verify and decode forever, and
 * today's encoder must still write those of today's format byte for byte
 * (older formats' files: the same decoded bytes).
 *
 * tests/golden/MANIFEST lists each file with the parameters that made it
 * (tests/golden/golden_common.h) and hashes of its input, its bytes and its
 * decoded K and V. A failure here means the format or a codec's arithmetic
 * changed: bump the format version and add new golden files beside the old
 * ones (make_golden), never rewrite the old ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>
#include <errno.h>

#include "golden/golden_common.h"
#include "kvt_internal.h"

#ifdef KVT_HAVE_ZSTD
#include <zstd.h>
#define ZSTD_VERSION_OR_0 ZSTD_versionNumber()
#else
#define ZSTD_VERSION_OR_0 0u
#endif

#define MAX_CASES 128

static golden_case cases[MAX_CASES];
static size_t n_cases;
static char golden_dir[4096];

static const char *source_dir(void) {
  const char *env = getenv("KVT_SOURCE_DIR");
  return env && *env ? env : KVT_SOURCE_DIR;
}

static int read_file(const char *path, uint8_t **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -errno;
  uint8_t *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? 2 * cap : 65536;
      uint8_t *p = realloc(buf, cap);
      if (!p) {
        free(buf);
        fclose(f);
        return -ENOMEM;
      }
      buf = p;
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0)
      break;
  }
  fclose(f);
  *out = buf;
  *len = n;
  return 0;
}

static int load_manifest(void **state) {
  (void)state;
  snprintf(golden_dir, sizeof(golden_dir), "%s/tests/golden", source_dir());
  char path[4200];
  snprintf(path, sizeof(path), "%s/MANIFEST", golden_dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  char line[1024];
  int bad = 0;
  while (fgets(line, sizeof(line), f) && n_cases < MAX_CASES) {
    if (line[0] == '#' || line[0] == '\n')
      continue;
    if (golden_parse_line(line, &cases[n_cases]) != 0) {
      fprintf(stderr, "malformed MANIFEST line: %s", line);
      bad = 1;
      continue;
    }
    n_cases++;
  }
  fclose(f);
  return bad || n_cases == 0 ? -1 : 0;
}

static uint8_t *load_case(const golden_case *c, size_t *len) {
  char path[4200];
  snprintf(path, sizeof(path), "%s/%s.kvt", golden_dir, c->name);
  uint8_t *buf = NULL;
  if (read_file(path, &buf, len) != 0)
    fail_msg("%s: cannot read %s", c->name, path);
  return buf;
}

static kvt_ctx *make_ctx(int simd) {
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.simd = simd;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), 0);
  return ctx;
}

/* The SIMD paths this machine can run: scalar always, AVX2 when present. */
static int simd_paths(int out[2]) {
  out[0] = KVT_SIMD_SCALAR;
  if (kvt_has_feature("avx2")) {
    out[1] = KVT_SIMD_AVX2;
    return 2;
  }
  return 1;
}

/* Today's format has its own golden files, one for every case of the
 * oldest format: otherwise every file would take the decoded-bytes path of
 * test_golden_reencoding_gives_identical_bytes and nothing would pin the
 * writer's bytes. */
static void test_golden_todays_format_has_files_for_every_case(void **state) {
  (void)state;
  char prefix[16];
  snprintf(prefix, sizeof(prefix), "v%d_", KVT_FORMAT_VERSION);
  size_t mine = 0;
  for (size_t i = 0; i < n_cases; i++) {
    size_t len;
    uint8_t *buf = load_case(&cases[i], &len);
    const unsigned major = len >= 10 ? (unsigned)buf[8] | (unsigned)buf[9] << 8 : 0;
    free(buf);
    if (major == KVT_FORMAT_VERSION) {
      mine++;
      continue;
    }
    if (KVT_FORMAT_VERSION < 2 || strncmp(cases[i].name, "v", 1) == 0)
      continue; /* a prefixed file of an intermediate format */
    int found = 0;
    for (size_t j = 0; j < n_cases && !found; j++)
      found = strncmp(cases[j].name, prefix, strlen(prefix)) == 0 &&
              strcmp(cases[j].name + strlen(prefix), cases[i].name) == 0;
    if (!found)
      fail_msg("%s (format %u) has no %s%s: run make_golden for format %d", cases[i].name, major,
               prefix, cases[i].name, KVT_FORMAT_VERSION);
  }
  if (mine == 0)
    fail_msg("no golden file of format %d", KVT_FORMAT_VERSION);
}

static void test_golden_manifest_names_every_file(void **state) {
  (void)state;
  DIR *d = opendir(golden_dir);
  assert_non_null(d);
  struct dirent *e;
  size_t files = 0;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".kvt") != 0)
      continue;
    files++;
    int listed = 0;
    for (size_t i = 0; i < n_cases; i++)
      listed |= strlen(cases[i].name) == n - 4 && strncmp(cases[i].name, e->d_name, n - 4) == 0;
    if (!listed)
      fail_msg("%s is not in MANIFEST", e->d_name);
  }
  closedir(d);
  assert_int_equal(files, n_cases);
}

static void test_golden_payloads_verify_and_match_manifest(void **state) {
  (void)state;
  kvt_ctx *ctx = make_ctx(KVT_SIMD_AUTO);
  for (size_t i = 0; i < n_cases; i++) {
    const golden_case *c = &cases[i];
    size_t len;
    uint8_t *buf = load_case(c, &len);
    if (kvt_hash64(buf, len) != c->payload_hash)
      fail_msg("%s: file bytes differ from MANIFEST (hash %016llx, recorded %016llx)", c->name,
               (unsigned long long)kvt_hash64(buf, len), c->payload_hash);
    kvt_payload_info info;
    int rc = kvt_payload_verify(ctx, buf, len, &info);
    if (rc)
      fail_msg("%s: verify: %s: %s", c->name, kvt_err_name(rc), kvt_ctx_last_error(ctx));
    assert_int_equal(info.size, len);
    assert_int_equal(info.dtype, c->dtype);
    assert_int_equal(info.layers, c->layers);
    assert_int_equal(info.tokens, c->tokens);
    assert_int_equal(info.heads, c->heads);
    assert_int_equal(info.head_dim, c->head_dim);
    assert_int_equal(info.layer_begin, c->layer_begin);
    assert_int_equal(info.model_layers, c->model_layers);
    assert_int_equal(info.token_begin, c->token_begin);
    assert_int_equal(!!(info.flags & 1u), c->zstd_level > 0);
    /* The header carries the very key and fingerprint the case derives. */
    kvt_encode_params p;
    assert_int_equal(golden_params(ctx, c, &p), 0);
    assert_memory_equal(info.key.bytes, p.key.bytes, 16);
    assert_memory_equal(info.fingerprint.bytes, p.fingerprint.bytes, 16);
    free(buf);
  }
  kvt_ctx_destroy(ctx);
}

static void decode_and_check(kvt_ctx *ctx, const golden_case *c, const uint8_t *buf, size_t len,
                             const char *what) {
  size_t n = golden_elems(c);
  uint16_t *out = malloc(4 * n);
  assert_non_null(out);
  memset(out, 0xA5, 4 * n);
  kvt_kv_view view;
  kvt_kv_view_dense(&view, out, out + n, c->dtype, c->layers, c->tokens, c->heads, c->head_dim);
  int rc = kvt_decode(ctx, buf, len, NULL, &view);
  if (rc)
    fail_msg("%s (%s): decode: %s: %s", c->name, what, kvt_err_name(rc), kvt_ctx_last_error(ctx));
  unsigned long long hk = kvt_hash64(out, 2 * n), hv = kvt_hash64(out + n, 2 * n);
  if (hk != c->k_hash || hv != c->v_hash)
    fail_msg("%s (%s): decoded K/V hash %016llx/%016llx, MANIFEST says %016llx/%016llx", c->name,
             what, hk, hv, c->k_hash, c->v_hash);
  free(out);
}

static void test_golden_payloads_decode_to_recorded_bytes(void **state) {
  (void)state;
  int simd[2], n_simd = simd_paths(simd);
  for (int s = 0; s < n_simd; s++) {
    kvt_ctx *ctx = make_ctx(simd[s]);
    for (size_t i = 0; i < n_cases; i++) {
      const golden_case *c = &cases[i];
      if (c->zstd_level && !kvt_has_feature("zstd")) {
        print_message("%s: zstd not built in, decode not checked\n", c->name);
        continue;
      }
      size_t len;
      uint8_t *buf = load_case(c, &len);
      decode_and_check(ctx, c, buf, len, s ? "avx2" : "scalar");
      free(buf);
    }
    kvt_ctx_destroy(ctx);
  }
}

/* Whether this library's zstd writes the bytes the golden writer's did:
 * zstd does not promise identical compressed output across releases. */
static int same_zstd(const golden_case *c) {
  if (!c->zstd_level)
    return 1;
#ifdef KVT_HAVE_ZSTD
  return ZSTD_versionNumber() == c->zstd_version;
#else
  return 0;
#endif
}

static void test_golden_reencoding_gives_identical_bytes(void **state) {
  (void)state;
  int simd[2], n_simd = simd_paths(simd);
  for (int s = 0; s < n_simd; s++) {
    kvt_ctx *ctx = make_ctx(simd[s]);
    const char *path = s ? "avx2" : "scalar";
    for (size_t i = 0; i < n_cases; i++) {
      const golden_case *c = &cases[i];
      if (c->zstd_level && !kvt_has_feature("zstd"))
        continue;
      size_t n = golden_elems(c), len, glen;
      uint16_t *in = malloc(4 * n);
      assert_non_null(in);
      golden_input(c, in, in + n);
      if (kvt_hash64(in, 4 * n) != c->input_hash)
        fail_msg("%s: bench/synth.c no longer gives the recorded input (libm or generator "
                 "changed); the encoder itself is not at fault",
                 c->name);
      uint8_t *mine = NULL, *golden = load_case(c, &glen);
      int rc = golden_encode(ctx, c, in, in + n, &mine, &len);
      if (rc)
        fail_msg("%s (%s): encode: %s: %s", c->name, path, kvt_err_name(rc),
                 kvt_ctx_last_error(ctx));
      const unsigned major = glen >= 10 ? (unsigned)golden[8] | (unsigned)golden[9] << 8 : 0;
      if (major != KVT_FORMAT_VERSION) {
        /* An older format's file: today's encoder writes today's format, so
         * the bytes differ by design; what they decode to must not. */
        decode_and_check(ctx, c, mine, len, path);
      } else if (same_zstd(c)) {
        if (len != glen || memcmp(mine, golden, len) != 0) {
          size_t at = 0;
          while (at < len && at < glen && mine[at] == golden[at])
            at++;
          fail_msg("%s (%s): re-encoded payload differs from the golden file at byte %zu "
                   "(%zu vs %zu bytes)",
                   c->name, path, at, len, glen);
        }
      } else {
        print_message("%s: zstd %u differs from the writer's %u; checking decoded bytes only\n",
                      c->name, ZSTD_VERSION_OR_0, c->zstd_version);
        decode_and_check(ctx, c, mine, len, path);
      }
      free(mine);
      free(golden);
      free(in);
    }
    kvt_ctx_destroy(ctx);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden_todays_format_has_files_for_every_case),
      cmocka_unit_test(test_golden_manifest_names_every_file),
      cmocka_unit_test(test_golden_payloads_verify_and_match_manifest),
      cmocka_unit_test(test_golden_payloads_decode_to_recorded_bytes),
      cmocka_unit_test(test_golden_reencoding_gives_identical_bytes),
  };
  return cmocka_run_group_tests(tests, load_manifest, NULL);
}
