/* tests/test_core.c - the context: config validation, allocator hooks and
 * log callback, the error table, versions. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvtier.h"

static void test_error_table_names_and_messages_every_code(void **state) {
  (void)state;
#define CHECK_(name, value, msg)                                \
  assert_string_equal(kvt_err_name(value), "KVT_" #name);       \
  assert_string_equal(kvt_strerror(value), msg);                \
  assert_true(value < -4000);
  KVT_ERROR_TABLE(CHECK_)
#undef CHECK_
  assert_string_equal(kvt_err_name(0), "OK");
  assert_string_equal(kvt_err_name(-ENOMEM), "ENOMEM");
  assert_string_equal(kvt_strerror(-ENOENT), strerror(ENOENT));
  assert_string_equal(kvt_err_name(-99999), "EUNKNOWN");
  assert_non_null(kvt_strerror(-99999));
  /* Pinned values: stored codes must keep their meaning. */
  assert_int_equal(KVT_EFORMAT, -4001);
  assert_int_equal(KVT_ECHECKSUM, -4005);
  assert_int_equal(KVT_ENOTSUP, -4016);
  assert_int_equal(KVT_EAUTH, -4017);
  assert_int_equal(KVT_EPROTO, -4018);
}

typedef struct counting {
  int allocs, frees;
} counting;

static void *c_alloc(void *opaque, size_t size, size_t align) {
  counting *c = opaque;
  void *p = NULL;
  if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size))
    return NULL;
  c->allocs++;
  return p;
}

static void c_free(void *opaque, void *p) {
  counting *c = opaque;
  if (p)
    c->frees++;
  free(p);
}

static void test_context_uses_the_given_allocator_and_frees_everything(void **state) {
  (void)state;
  counting c = {0, 0};
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.allocator.alloc = c_alloc;
  cfg.allocator.free = c_free;
  cfg.allocator.opaque = &c;
  kvt_ctx *ctx = NULL;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), 0);
  assert_true(c.allocs >= 1);
  kvt_ctx_destroy(ctx);
  assert_int_equal(c.allocs, c.frees);
  kvt_ctx_destroy(NULL); /* accepted */
}

static void test_context_rejects_bad_configs_without_writing_out(void **state) {
  (void)state;
  kvt_ctx *ctx = (kvt_ctx *)(uintptr_t)0x1;
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.struct_size = 4;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), -EINVAL);
  cfg = (kvt_ctx_config)KVT_CTX_CONFIG_INIT;
  cfg.allocator.alloc = c_alloc; /* free missing */
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), -EINVAL);
  cfg = (kvt_ctx_config)KVT_CTX_CONFIG_INIT;
  cfg.simd = 42;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), -EINVAL);
  assert_ptr_equal(ctx, (kvt_ctx *)(uintptr_t)0x1);
  assert_int_equal(kvt_ctx_create(NULL, NULL), -EINVAL);
}

static void test_simd_choice_resolves_to_a_real_path(void **state) {
  (void)state;
  kvt_ctx *ctx;
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.simd = KVT_SIMD_SCALAR;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), 0);
  assert_int_equal(kvt_ctx_simd(ctx), KVT_SIMD_SCALAR);
  kvt_ctx_destroy(ctx);
  cfg.simd = KVT_SIMD_AVX2;
  int rc = kvt_ctx_create(&cfg, &ctx);
  if (kvt_has_feature("avx2")) {
    assert_int_equal(rc, 0);
    assert_int_equal(kvt_ctx_simd(ctx), KVT_SIMD_AVX2);
    kvt_ctx_destroy(ctx);
  } else {
    assert_int_equal(rc, KVT_ENOTSUP);
  }
}

typedef struct logbuf {
  char last[600];
  int lines;
} logbuf;

static void logger(void *opaque, int level, const char *msg) {
  logbuf *b = opaque;
  (void)level;
  snprintf(b->last, sizeof(b->last), "%s", msg);
  b->lines++;
}

static void test_failures_leave_detail_and_reach_the_log_at_debug(void **state) {
  (void)state;
  logbuf lb = {"", 0};
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.log = logger;
  cfg.log_opaque = &lb;
  cfg.log_level = KVT_LOG_DEBUG;
  kvt_ctx *ctx;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), 0);
  assert_string_equal(kvt_ctx_last_error(ctx), "");
  static const uint8_t junk[200] = {1, 2, 3};
  assert_int_equal(kvt_payload_parse(ctx, junk, sizeof(junk), NULL), KVT_EFORMAT);
  assert_non_null(strstr(kvt_ctx_last_error(ctx), "magic"));
  assert_int_equal(lb.lines, 1);
  assert_non_null(strstr(lb.last, "KVT_EFORMAT"));
  kvt_ctx_destroy(ctx);
  /* Without a callback the library stays silent; nothing to observe but no crash. */
  assert_int_equal(kvt_payload_parse(NULL, junk, sizeof(junk), NULL), KVT_EFORMAT);
}

static void test_versions_agree_between_header_and_library(void **state) {
  (void)state;
  assert_int_equal(kvt_version(), KVT_VERSION_NUMBER);
  char want[32];
  snprintf(want, sizeof(want), "%d.%d.%d", KVT_VERSION_MAJOR, KVT_VERSION_MINOR,
           KVT_VERSION_PATCH);
  assert_string_equal(kvt_version_string(), want);
  assert_false(kvt_has_feature("teleport"));
  assert_false(kvt_has_feature(NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_error_table_names_and_messages_every_code),
      cmocka_unit_test(test_context_uses_the_given_allocator_and_frees_everything),
      cmocka_unit_test(test_context_rejects_bad_configs_without_writing_out),
      cmocka_unit_test(test_simd_choice_resolves_to_a_real_path),
      cmocka_unit_test(test_failures_leave_detail_and_reach_the_log_at_debug),
      cmocka_unit_test(test_versions_agree_between_header_and_library),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
