/* tests/test_alloc.c - out-of-memory paths: a context allocator that fails
 * its Nth allocation, for N = 0, 1, 2, ... until nothing fails.
 *
 * Each run creates a context, encodes with the zstd stage (twice, the second
 * larger so the cached scratch buffers grow), decodes, and destroys it. Every
 * failure must be -ENOMEM, never another code, a crash or a silently
 * different result; what succeeds must give the bytes an unfailing run gives;
 * and after destroy no allocation may be outstanding and nothing may have
 * been freed twice or freed that the allocator never gave. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "synth.h"

#define MAX_LIVE 1024

typedef struct failing_alloc {
  long fail_at; /* index of the allocation to refuse; -1: none */
  long calls;   /* allocations asked for */
  long outstanding;
  long bad_frees; /* frees of pointers not live: double or foreign */
  long misaligned;
  void *live[MAX_LIVE];
} failing_alloc;

static void *fa_alloc(void *opaque, size_t size, size_t alignment) {
  failing_alloc *fa = opaque;
  if (fa->calls++ == fa->fail_at)
    return NULL;
  void *p = NULL;
  if (posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment,
                     size ? size : 1) != 0)
    return NULL;
  if ((uintptr_t)p % alignment)
    fa->misaligned++;
  for (int i = 0; i < MAX_LIVE; i++)
    if (!fa->live[i]) {
      fa->live[i] = p;
      fa->outstanding++;
      return p;
    }
  fail_msg("more than %d live allocations", MAX_LIVE);
  return NULL;
}

static void fa_free(void *opaque, void *ptr) {
  failing_alloc *fa = opaque;
  if (!ptr)
    return;
  for (int i = 0; i < MAX_LIVE; i++)
    if (fa->live[i] == ptr) {
      fa->live[i] = NULL;
      fa->outstanding--;
      free(ptr);
      return;
    }
  fa->bad_frees++; /* not freed: it may already be gone */
}

typedef struct job {
  const char *spec;
  uint32_t L, T, H, D;
} job;

/* Two encodes, the second of more tokens, so scratch buffers are reused and
 * then grown. */
static const job jobs[2] = {{"k16v8", 2, 16, 2, 64}, {"raw", 2, 48, 2, 64}};

typedef struct result {
  uint8_t *payload[2];
  size_t len[2];
  uint16_t *decoded[2]; /* K then V */
} result;

static void result_free(result *r) {
  for (int i = 0; i < 2; i++) {
    free(r->payload[i]);
    free(r->decoded[i]);
  }
}

static size_t job_elems(const job *j) { return (size_t)j->L * j->T * j->H * j->D; }

/* Encodes and decodes job j on ctx into r. Returns 0 or the failing rc. */
static int run_job(kvt_ctx *ctx, int j, result *r) {
  const job *jb = &jobs[j];
  size_t n = job_elems(jb);
  uint16_t *in = malloc(4 * n);
  assert_non_null(in);
  kvt_synth_shape sh = {jb->L, jb->T, jb->H, jb->D, KVT_DTYPE_BF16, 0, 0};
  kvt_synth_kv(&sh, 3, in, in + n);
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(kvt_codec_parse(NULL, jb->spec, &p.spec), 0);
  p.zstd_level = 3;
  uint64_t bound;
  assert_int_equal(kvt_encode_bound(NULL, &p.spec, 0, jb->L, jb->T, jb->H, jb->D, &bound), 0);
  r->payload[j] = malloc(bound);
  r->decoded[j] = malloc(4 * n);
  assert_true(r->payload[j] && r->decoded[j]);
  kvt_kv_view view;
  kvt_kv_view_dense(&view, in, in + n, KVT_DTYPE_BF16, jb->L, jb->T, jb->H, jb->D);
  int rc = kvt_encode(ctx, &p, &view, r->payload[j], bound, &r->len[j]);
  if (rc == 0) {
    kvt_kv_view_dense(&view, r->decoded[j], r->decoded[j] + n, KVT_DTYPE_BF16, jb->L, jb->T, jb->H,
                      jb->D);
    rc = kvt_decode(ctx, r->payload[j], r->len[j], NULL, &view);
  }
  free(in);
  return rc;
}

static long absorbed; /* refusals that changed a successful result */

/* One run with the Nth allocation refused. Returns whether a refusal
 * happened (so larger N are worth trying). */
static int run_failing_at(long n, const result *ref) {
  failing_alloc *fa = calloc(1, sizeof(*fa));
  assert_non_null(fa);
  fa->fail_at = n;
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.allocator.alloc = fa_alloc;
  cfg.allocator.free = fa_free;
  cfg.allocator.opaque = fa;
  kvt_ctx *ctx = NULL;
  int rc = kvt_ctx_create(&cfg, &ctx);
  result r;
  memset(&r, 0, sizeof(r));
  for (int j = 0; rc == 0 && j < 2; j++) {
    const char *stage = "encode/decode";
    rc = run_job(ctx, j, &r);
    if (rc && rc != -ENOMEM)
      fail_msg("allocation %ld refused: %s of job %d gave %s (%s), not ENOMEM", n, stage, j,
               kvt_err_name(rc), kvt_ctx_last_error(ctx));
    if (rc == 0 && ref) {
      /* A refusal the library absorbed must not change what it wrote. */
      if (r.len[j] != ref->len[j] || memcmp(r.payload[j], ref->payload[j], r.len[j]) != 0) {
        print_error("allocation %ld refused: job %d (%s) succeeded but wrote a different "
                    "payload (%zu bytes, not %zu)\n",
                    n, j, jobs[j].spec, r.len[j], ref->len[j]);
        absorbed++;
      }
      assert_memory_equal(r.decoded[j], ref->decoded[j], 4 * job_elems(&jobs[j]));
    }
  }
  if (rc && rc != -ENOMEM)
    fail_msg("allocation %ld refused: kvt_ctx_create gave %s", n, kvt_err_name(rc));
  if (ctx && rc == -ENOMEM && fa->calls <= n)
    fail_msg("ENOMEM without a refused allocation (%ld calls)", fa->calls);
  kvt_ctx_destroy(ctx);
  if (fa->outstanding || fa->bad_frees || fa->misaligned)
    fail_msg("allocation %ld refused: %ld allocations leaked, %ld bad frees, %ld misaligned", n,
             fa->outstanding, fa->bad_frees, fa->misaligned);
  int refused = n >= 0 && fa->calls > n;
  free(fa);
  result_free(&r);
  return refused;
}

static void test_alloc_every_refusal_is_enomem_and_leaks_nothing(void **state) {
  (void)state;
  if (!kvt_has_feature("zstd"))
    skip(); /* without the lossless stage encode and decode allocate nothing */
  result ref;
  memset(&ref, 0, sizeof(ref));
  assert_int_equal(run_failing_at(-1, NULL), 0);
  /* The reference: the same work with the default allocator. */
  kvt_ctx *ctx;
  assert_int_equal(kvt_ctx_create(NULL, &ctx), 0);
  for (int j = 0; j < 2; j++)
    assert_int_equal(run_job(ctx, j, &ref), 0);
  kvt_ctx_destroy(ctx);
  long n = 0;
  while (run_failing_at(n, &ref))
    assert_true(++n < 100000);
  print_message("%ld allocation points refused in turn\n", n);
  result_free(&ref);
  assert_true(n >= 3); /* context, scratch state, a zstd context at least */
  if (absorbed)
    fail_msg("%ld refused allocations were absorbed into a different payload instead of "
             "returning -ENOMEM",
             absorbed);
}

static void test_alloc_context_create_refused_gives_enomem(void **state) {
  (void)state;
  failing_alloc fa;
  memset(&fa, 0, sizeof(fa));
  fa.fail_at = 0;
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.allocator.alloc = fa_alloc;
  cfg.allocator.free = fa_free;
  cfg.allocator.opaque = &fa;
  kvt_ctx *ctx = (kvt_ctx *)&fa; /* must stay untouched on failure */
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), -ENOMEM);
  assert_ptr_equal(ctx, (kvt_ctx *)&fa);
  assert_int_equal(fa.outstanding, 0);
}

/* Without the lossless stage, encode and decode must not allocate at all. */
static void test_alloc_plain_encode_and_decode_allocate_nothing(void **state) {
  (void)state;
  failing_alloc fa;
  memset(&fa, 0, sizeof(fa));
  fa.fail_at = -1;
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.allocator.alloc = fa_alloc;
  cfg.allocator.free = fa_free;
  cfg.allocator.opaque = &fa;
  kvt_ctx *ctx;
  assert_int_equal(kvt_ctx_create(&cfg, &ctx), 0);
  long after_create = fa.calls;
  const char *specs[] = {"raw", "k16v8", "fp8", "int8", "k16v4", "k8v4", "int4"};
  uint32_t L = 2, T = 16, H = 2, D = 64;
  size_t n = (size_t)L * T * H * D;
  uint16_t *in = malloc(4 * n), *out = malloc(4 * n);
  uint8_t *buf = malloc(8 * n);
  assert_true(in && out && buf);
  kvt_synth_shape sh = {L, T, H, D, KVT_DTYPE_BF16, 0, 0};
  kvt_synth_kv(&sh, 5, in, in + n);
  for (int i = 0; i < 7; i++) {
    kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
    assert_int_equal(kvt_codec_parse(ctx, specs[i], &p.spec), 0);
    kvt_kv_view view;
    kvt_kv_view_dense(&view, in, in + n, KVT_DTYPE_BF16, L, T, H, D);
    size_t len;
    assert_int_equal(kvt_encode(ctx, &p, &view, buf, 8 * n, &len), 0);
    assert_int_equal(kvt_payload_verify(ctx, buf, len, NULL), 0);
    kvt_kv_view_dense(&view, out, out + n, KVT_DTYPE_BF16, L, T, H, D);
    assert_int_equal(kvt_decode(ctx, buf, len, NULL, &view), 0);
  }
  assert_int_equal(fa.calls, after_create);
  kvt_ctx_destroy(ctx);
  assert_int_equal(fa.outstanding, 0);
  free(in), free(out), free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc_context_create_refused_gives_enomem),
      cmocka_unit_test(test_alloc_plain_encode_and_decode_allocate_nothing),
      cmocka_unit_test(test_alloc_every_refusal_is_enomem_and_leaks_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
