/* tests/cache_test_util.h - helpers the cache tests share: a context on the
 * counting allocator, temporary directories for nvme tiers, and real payloads
 * (raw codec, small shape) for chained chunk keys, whose bytes depend on the
 * key so any payload read back can be checked. Include after <cmocka.h>. */
#ifndef KVT_CACHE_TEST_UTIL_H
#define KVT_CACHE_TEST_UTIL_H

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvtier.h"
#include "tier_test_util.h"

#define CT_TOKENS 16u /* tokens per chunk in these tests */

typedef struct cache_fx {
  atomic_long live;   /* outstanding allocations */
  kvt_ctx *ctx;
  kvt_key fp, fp_other;
  char dir[256];      /* a temporary directory for nvme tiers */
} cache_fx;

static inline int rm_entry_cb(const char *path, const struct stat *sb, int flag,
                              struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static inline cache_fx *cache_fx_new(void) {
  cache_fx *fx = calloc(1, sizeof(*fx));
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.allocator.alloc = counting_alloc;
  cfg.allocator.free = counting_free;
  cfg.allocator.opaque = &fx->live;
  if (!fx || kvt_ctx_create(&cfg, &fx->ctx))
    return NULL;
  kvt_codec_spec spec;
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = "test/model";
  m.layers = 1;
  m.kv_heads = 1;
  m.head_dim = 64;
  if (kvt_codec_parse(fx->ctx, "raw", &spec) || kvt_fingerprint(&m, &spec, &fx->fp))
    return NULL;
  m.model_id = "test/other-model";
  if (kvt_fingerprint(&m, &spec, &fx->fp_other))
    return NULL;
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(fx->dir, sizeof(fx->dir), "%s/kvt-cache-XXXXXX", base);
  if (!mkdtemp(fx->dir))
    return NULL;
  return fx;
}

static inline void cache_fx_free(cache_fx *fx) {
  nftw(fx->dir, rm_entry_cb, 16, FTW_DEPTH | FTW_PHYS);
  kvt_ctx_destroy(fx->ctx);
  free(fx);
}

/* Token ids of chunk i of sequence seq. */
static inline void chunk_tokens(uint32_t seq, uint32_t i, uint32_t *out) {
  for (uint32_t j = 0; j < CT_TOKENS; j++)
    out[j] = seq * 1000003u + i * CT_TOKENS + j;
}

/* Keys of chunks 0..n-1 of sequence seq under fp, chained. */
static inline void chain_keys(const kvt_key *fp, uint32_t seq, uint32_t n, kvt_key *keys) {
  uint32_t tok[CT_TOKENS];
  for (uint32_t i = 0; i < n; i++) {
    chunk_tokens(seq, i, tok);
    assert_int_equal(kvt_chunk_key(fp, i ? &keys[i - 1] : NULL, tok, CT_TOKENS, &keys[i]), 0);
  }
}

/* The tokens of sequence seq's first n chunks (caller frees). */
static inline uint32_t *seq_tokens(uint32_t seq, uint32_t n) {
  uint32_t *t = malloc((size_t)n * CT_TOKENS * sizeof(*t) + 1);
  for (uint32_t i = 0; i < n; i++)
    chunk_tokens(seq, i, t + (size_t)i * CT_TOKENS);
  return t;
}

static inline uint64_t key_seed(const kvt_key *key) {
  uint64_t x;
  memcpy(&x, key->bytes, sizeof(x));
  return x;
}

/* A payload (raw, bf16, 1 layer x `tokens` tokens x 1 head x 64 dims) under
 * key with fingerprint fp, values derived from the key. Caller frees. */
static inline uint8_t *payload_of(kvt_ctx *ctx, const kvt_key *fp, const kvt_key *key,
                                  uint32_t tokens, uint64_t *len) {
  size_t n = (size_t)tokens * 64;
  uint16_t *k = malloc(n * 2), *v = malloc(n * 2);
  uint8_t noise[8];
  for (size_t i = 0; i < n; i++) {
    fill(noise, 2, key_seed(key) + i);
    k[i] = kvt_f32_to_bf16((float)(noise[0] - 128) / 64.0f);
    v[i] = kvt_f32_to_bf16((float)(noise[1] - 128) / 32.0f);
  }
  kvt_kv_view view;
  kvt_kv_view_dense(&view, k, v, KVT_DTYPE_BF16, 1, tokens, 1, 64);
  kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
  assert_int_equal(kvt_codec_parse(ctx, "raw", &p.spec), 0);
  p.key = *key;
  p.fingerprint = *fp;
  uint64_t cap = 0;
  assert_int_equal(kvt_encode_bound(ctx, &p.spec, 0, 1, tokens, 1, 64, &cap), 0);
  uint8_t *buf = malloc(cap);
  size_t got = 0;
  assert_int_equal(kvt_encode(ctx, &p, &view, buf, cap, &got), 0);
  free(k);
  free(v);
  *len = got;
  return buf;
}

#ifdef CACHE_TEST_FIXTURE
/* The fixture of the cache test programs that define CACHE_TEST_FIXTURE
 * (test_cache.c, test_cache_review.c): a context per test on the counting
 * allocator, with a leak check at teardown; the length of every CT_TOKENS
 * test payload, and what one takes in a dram tier (256-byte granules). */
static cache_fx *fx;
static uint64_t plen;
static uint64_t pcost;
static long live_base; /* allocations outstanding after setup (the context) */

static int setup(void **state) {
  (void)state;
  fx = cache_fx_new();
  if (!fx)
    return -1;
  kvt_key k = {{1}};
  uint8_t *p = payload_of(fx->ctx, &fx->fp, &k, CT_TOKENS, &plen);
  free(p);
  pcost = (plen + 255) / 256 * 256;
  live_base = atomic_load(&fx->live);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  assert_int_equal(atomic_load(&fx->live), live_base);
  cache_fx_free(fx);
  fx = NULL;
  return 0;
}

static kvt_cache *open_cache(const char *tiers, uint32_t flags, const kvt_key *fp) {
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = tiers;
  cfg.fingerprint = fp;
  cfg.chunk_tokens = CT_TOKENS;
  cfg.flags = flags;
  kvt_cache *c = NULL;
  int r = kvt_cache_open(fx->ctx, &cfg, &c);
  if (r)
    print_error("open %s: %s (%s)\n", tiers, kvt_strerror(r), kvt_ctx_last_error(fx->ctx));
  assert_int_equal(r, 0);
  return c;
}

static kvt_cache_stats stats(kvt_cache *c, int t) {
  kvt_cache_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  assert_int_equal(kvt_cache_stats_get(c, t, &s), 0);
  return s;
}
#endif

#endif
