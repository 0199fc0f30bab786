/* serde/lossless.c - the optional zstd stage for cold tiers, with a byte-plane
 * shuffle of 16-bit sections (low bytes, then high bytes: the high bytes of
 * bf16/fp16 KV hold sign and exponent and compress well, the low bytes hardly
 * at all). Buffers and zstd contexts are cached on the kvt_ctx and allocated
 * through its allocator. */
#include <errno.h>

#include "serde_internal.h"

#ifdef KVT_HAVE_ZSTD
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_customMem: the context's allocator */
#include <zstd.h>
#include <zstd_errors.h>
#endif

struct kvt_serde_scratch {
  uint8_t *buf[2];
  size_t cap[2];
#ifdef KVT_HAVE_ZSTD
  ZSTD_CCtx *cc;
  ZSTD_DCtx *dc;
#endif
};

static void scratch_free(kvt_ctx *ctx, void *state) {
  kvt_serde_scratch *s = state;
  for (int i = 0; i < 2; i++)
    kvt_dealloc(ctx, s->buf[i]);
#ifdef KVT_HAVE_ZSTD
  ZSTD_freeCCtx(s->cc);
  ZSTD_freeDCtx(s->dc);
#endif
  kvt_dealloc(ctx, s);
}

static kvt_serde_scratch *scratch(kvt_ctx *ctx) {
  if (!ctx->serde_state) {
    kvt_serde_scratch *s = kvt_alloc(ctx, sizeof(*s), 64);
    if (!s)
      return NULL;
    memset(s, 0, sizeof(*s));
    ctx->serde_state = s;
    ctx->serde_state_free = scratch_free;
  }
  return ctx->serde_state;
}

int kvt_scratch_get(kvt_ctx *ctx, int slot, size_t n, uint8_t **out) {
  kvt_serde_scratch *s = scratch(ctx);
  if (!s)
    return kvt_fail(ctx, -ENOMEM, "allocating lossless-stage state");
  if (s->cap[slot] < n) {
    uint8_t *p = kvt_alloc(ctx, n, 64);
    if (!p)
      return kvt_fail(ctx, -ENOMEM, "allocating %zu bytes of lossless-stage scratch", n);
    kvt_dealloc(ctx, s->buf[slot]);
    s->buf[slot] = p;
    s->cap[slot] = n;
  }
  *out = s->buf[slot];
  return 0;
}

static void shuffle16(const uint8_t *in, size_t n, uint8_t *out) {
  size_t half = n / 2;
  for (size_t i = 0; i < half; i++) {
    out[i] = in[2 * i];
    out[half + i] = in[2 * i + 1];
  }
}

static void unshuffle16(const uint8_t *in, size_t n, uint8_t *out) {
  size_t half = n / 2;
  for (size_t i = 0; i < half; i++) {
    out[2 * i] = in[i];
    out[2 * i + 1] = in[half + i];
  }
}

#ifdef KVT_HAVE_ZSTD
static void *zalloc(void *opaque, size_t size) { return kvt_alloc(opaque, size, 16); }
static void zfree(void *opaque, void *p) { kvt_dealloc(opaque, p); }
#endif

int kvt_lossless_compress(kvt_ctx *ctx, int level, int shuffle, const uint8_t *raw,
                          size_t n, uint8_t *dst, size_t cap, size_t *out_len) {
#ifdef KVT_HAVE_ZSTD
  kvt_serde_scratch *s = scratch(ctx);
  if (!s)
    return kvt_fail(ctx, -ENOMEM, "allocating lossless-stage state");
  if (!s->cc) {
    ZSTD_customMem mem = {zalloc, zfree, ctx};
    s->cc = ZSTD_createCCtx_advanced(mem);
    if (!s->cc)
      return kvt_fail(ctx, -ENOMEM, "creating a zstd compression context");
  }
  const uint8_t *src = raw;
  if (shuffle) {
    uint8_t *tmp;
    int rc = kvt_scratch_get(ctx, 1, n, &tmp);
    if (rc)
      return rc;
    shuffle16(raw, n, tmp);
    src = tmp;
  }
  size_t r = ZSTD_compressCCtx(s->cc, dst, cap, src, n, level);
  *out_len = 0;
  if (!ZSTD_isError(r)) {
    *out_len = r;
    return 0;
  }
  switch (ZSTD_getErrorCode(r)) {
  case ZSTD_error_dstSize_tooSmall:
    return 0; /* it would not have saved enough: stored plain */
  case ZSTD_error_memory_allocation:
    return kvt_fail(ctx, -ENOMEM, "zstd could not allocate its workspace");
  default:
    return kvt_fail(ctx, KVT_EBACKEND, "zstd compression failed: %s", ZSTD_getErrorName(r));
  }
#else
  (void)level, (void)shuffle, (void)raw, (void)n, (void)dst, (void)cap, (void)out_len;
  return kvt_fail(ctx, KVT_ENOTSUP, "the lossless stage needs zstd, not built in");
#endif
}

int kvt_lossless_decompress(kvt_ctx *ctx, int comp, const uint8_t *src, size_t n,
                            size_t raw_size, const uint8_t **out) {
#ifdef KVT_HAVE_ZSTD
  kvt_serde_scratch *s = scratch(ctx);
  if (!s)
    return kvt_fail(ctx, -ENOMEM, "allocating lossless-stage state");
  if (!s->dc) {
    ZSTD_customMem mem = {zalloc, zfree, ctx};
    s->dc = ZSTD_createDCtx_advanced(mem);
    if (!s->dc)
      return kvt_fail(ctx, -ENOMEM, "creating a zstd decompression context");
  }
  uint8_t *raw = NULL;
  int rc = kvt_scratch_get(ctx, 0, raw_size ? raw_size : 1, &raw);
  if (rc)
    return rc;
  size_t r = ZSTD_decompressDCtx(s->dc, raw, raw_size, src, n);
  if (ZSTD_isError(r) || r != raw_size)
    return kvt_fail(ctx, KVT_ECORRUPT, "zstd section does not decompress to %zu bytes: %s",
                    raw_size, ZSTD_isError(r) ? ZSTD_getErrorName(r) : "wrong length");
  if (comp == KVT_COMP_ZSTD_SHUFFLE16) {
    uint8_t *tmp = NULL;
    rc = kvt_scratch_get(ctx, 1, raw_size, &tmp);
    if (rc)
      return rc;
    unshuffle16(raw, raw_size, tmp);
    raw = tmp;
  }
  *out = raw;
  return 0;
#else
  (void)comp, (void)src, (void)n, (void)raw_size, (void)out;
  return kvt_fail(ctx, KVT_ENOTSUP,
                  "payload uses the zstd lossless stage, which this build lacks");
#endif
}
