/* tests/serde_sample.h - helpers shared by the serde test programs
 * (test_serde_hostile.c, test_serde_roundtrip.c): the context and its
 * group setup, synthetic K/V samples and their payloads, re-sealing edited
 * payloads (header and section checksums recomputed the way serde does),
 * and rc/detail checks. Everything is static: each program gets its own
 * copy. Offsets come from serde/serde_internal.h. */
#ifndef KVT_TESTS_SERDE_SAMPLE_H
#define KVT_TESTS_SERDE_SAMPLE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "serde_internal.h"
#include "synth.h"

static kvt_ctx *ctx;

static inline int group_setup(void **state) {
  (void)state;
  return kvt_ctx_create(NULL, &ctx);
}

static inline int group_teardown(void **state) {
  (void)state;
  kvt_ctx_destroy(ctx);
  return 0;
}

/* ---- samples: synthetic K/V and their payload ---- */

typedef struct sample {
  uint32_t L, T, H, D;
  int dtype;
  uint16_t *k, *v; /* dense input */
  kvt_encode_params p;
  uint8_t *buf; /* payload, with 128 spare bytes for appending */
  size_t len;
} sample;

static inline size_t elems(const sample *s) { return (size_t)s->L * s->T * s->H * s->D; }

static inline void sample_params(sample *s, const char *spec, int zstd) {
  kvt_encode_params init = KVT_ENCODE_PARAMS_INIT;
  s->p = init;
  assert_int_equal(kvt_codec_parse(ctx, spec, &s->p.spec), 0);
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = "test/serde-model";
  m.dtype = s->dtype;
  m.layers = s->L;
  m.kv_heads = s->H;
  m.head_dim = s->D;
  assert_int_equal(kvt_fingerprint(&m, &s->p.spec, &s->p.fingerprint), 0);
  const uint32_t ids[4] = {11, 22, 33, 44};
  assert_int_equal(kvt_chunk_key(&s->p.fingerprint, NULL, ids, 4, &s->p.key), 0);
  s->p.zstd_level = zstd;
}

/* Encodes s->k/s->v with s->p into a fresh s->buf. */
static inline void sample_encode(sample *s) {
  uint64_t bound;
  assert_int_equal(kvt_encode_bound(ctx, &s->p.spec, s->p.layer_begin, s->L, s->T, s->H, s->D, &bound), 0);
  free(s->buf);
  s->buf = malloc(bound + 128);
  assert_non_null(s->buf);
  kvt_kv_view v;
  kvt_kv_view_dense(&v, s->k, s->v, s->dtype, s->L, s->T, s->H, s->D);
  int rc = kvt_encode(ctx, &s->p, &v, s->buf, bound, &s->len);
  if (rc)
    fail_msg("encode: %s: %s", kvt_err_name(rc), kvt_ctx_last_error(ctx));
}

static inline void sample_make(sample *s, const char *spec, int dtype, uint32_t L, uint32_t T,
                               uint32_t H, uint32_t D, int zstd) {
  memset(s, 0, sizeof(*s));
  s->L = L, s->T = T, s->H = H, s->D = D, s->dtype = dtype;
  s->k = malloc(2 * elems(s));
  s->v = malloc(2 * elems(s));
  assert_true(s->k && s->v);
  kvt_synth_shape sh = {L, T, H, D, dtype, 0, 0};
  kvt_synth_kv(&sh, 7, s->k, s->v);
  sample_params(s, spec, zstd);
  sample_encode(s);
}

static inline void sample_free(sample *s) {
  free(s->k);
  free(s->v);
  free(s->buf);
}

/* The small payload most hostile-input tests edit: k16v8, 2 layers x 4
 * tokens x 2 heads x 16 dims. Sections: K 256 B at 320, V 160 B at 576,
 * 32 B of padding at 736, K at 768, V at 1024; 1184 bytes in all. */
static inline void small(sample *s) { sample_make(s, "k16v8", KVT_DTYPE_BF16, 2, 4, 2, 16, 0); }

static inline uint8_t *copy_of(const sample *s) {
  uint8_t *b = malloc(s->len + 128);
  assert_non_null(b);
  memcpy(b, s->buf, s->len);
  return b;
}

static inline uint8_t *entry(uint8_t *b, uint32_t i) {
  return b + HDR_FIXED + (size_t)SEC_ENTRY * i;
}

/* Recomputes the header checksum over the header size the header states,
 * when that lies inside the buffer (else the parser rejects it first). */
static inline void reseal(uint8_t *b, size_t len) {
  uint32_t hsize = kvt_ld32(b + H_HDRSIZE);
  if (hsize >= HDR_FIXED && hsize <= len)
    kvt_st64(b + H_CHECKSUM, kvt_header_checksum(b, hsize));
}

static inline void reseal_section(uint8_t *b, uint32_t i) {
  uint8_t *e = entry(b, i);
  kvt_st64(e + S_CHECKSUM, kvt_hash64(b + kvt_ld64(e + S_OFFSET), kvt_ld64(e + S_STORED)));
  reseal(b, kvt_ld32(b + H_HDRSIZE));
}

/* Whether rc and the context's detail are as expected; says why not. */
static inline int check_rc(int rc, int want, const char *detail, const char *what) {
  if (rc != want) {
    print_error("%s: got %s (%s), expected %s\n", what, kvt_err_name(rc), kvt_ctx_last_error(ctx),
                kvt_err_name(want));
    return 0;
  }
  if (detail && !strstr(kvt_ctx_last_error(ctx), detail)) {
    print_error("%s: detail \"%s\" does not contain \"%s\"\n", what, kvt_ctx_last_error(ctx),
                detail);
    return 0;
  }
  return 1;
}

static inline void expect_rc(int rc, int want, const char *detail, const char *what) {
  if (!check_rc(rc, want, detail, what))
    fail();
}

static inline int decode_dense(const sample *s, const uint8_t *b, size_t len, uint16_t *k,
                               uint16_t *v) {
  kvt_kv_view view;
  kvt_kv_view_dense(&view, k, v, s->dtype, s->L, s->T, s->H, s->D);
  return kvt_decode(ctx, b, len, NULL, &view);
}

#endif /* KVT_TESTS_SERDE_SAMPLE_H */
