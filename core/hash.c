/* core/hash.c - XXH3 wrappers. The hash comes from the system's xxHash
 * (Debian's libxxhash-dev) used header-only, so no link dependency; XXH3 is
 * stable across xxHash releases since 0.8.0, which payload checksums and
 * chunk keys rely on. */
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "kvt_internal.h"

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((kvt_hash128_stream *)0)->opaque),
               "kvt_hash128_stream too small for XXH3_state_t");
_Static_assert(_Alignof(XXH3_state_t) <= 64, "XXH3_state_t alignment");

static uint64_t hash64_base(const void *data, size_t len) {
  return (uint64_t)XXH3_64bits(data, len);
}

#ifdef KVT_HAVE_AVX2
uint64_t kvt_hash64_avx2(const void *data, size_t len);
#endif

typedef uint64_t (*hash64_fn)(const void *, size_t);
static hash64_fn hash64_impl; /* chosen once; every choice gives the same hash */

uint64_t kvt_hash64(const void *data, size_t len) {
  hash64_fn f = __atomic_load_n(&hash64_impl, __ATOMIC_RELAXED);
  if (KVT_UNLIKELY(!f)) {
    f = hash64_base;
#ifdef KVT_HAVE_AVX2
    if (kvt_cpu_has_avx2())
      f = kvt_hash64_avx2;
#endif
    __atomic_store_n(&hash64_impl, f, __ATOMIC_RELAXED);
  }
  return f(data, len);
}

uint64_t kvt_hash64_2(const void *a, size_t na, const void *b, size_t nb) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, a, na);
  XXH3_64bits_update(&st, b, nb);
  return (uint64_t)XXH3_64bits_digest(&st);
}

uint64_t kvt_hash64_blocks(const void *data, size_t len, size_t block) {
  /* Digests of up to 128 blocks at a time into the outer hash: streaming
   * XXH3 over pieces equals one-shot XXH3 over their concatenation. */
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  const uint8_t *p = data;
  uint8_t batch[128 * 8];
  size_t n = 0;
  do {
    const size_t take = len < block ? len : block;
    kvt_st64(batch + 8 * n, kvt_hash64(p, take));
    p += take;
    len -= take;
    if (++n == 128 || len == 0) {
      XXH3_64bits_update(&st, batch, 8 * n);
      n = 0;
    }
  } while (len > 0);
  return (uint64_t)XXH3_64bits_digest(&st);
}

static void put128(XXH128_hash_t h, uint8_t out[16]) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h); /* big-endian high then low */
  memcpy(out, c.digest, 16);
}

#ifdef KVT_HAVE_AVX2
void kvt_hash128_avx2(const void *data, size_t len, uint64_t *hi, uint64_t *lo);
void kvt_hash128_avx512(const void *data, size_t len, uint64_t *hi, uint64_t *lo);
#endif

void kvt_hash128(const void *data, size_t len, uint8_t out[16]) {
#ifdef KVT_HAVE_AVX2
  if (len > 240) { /* shorter inputs take no vector path */
    XXH128_hash_t h;
    if (kvt_cpu_has_avx512())
      kvt_hash128_avx512(data, len, &h.high64, &h.low64);
    else if (kvt_cpu_has_avx2())
      kvt_hash128_avx2(data, len, &h.high64, &h.low64);
    else
      h = XXH3_128bits(data, len);
    put128(h, out);
    return;
  }
#endif
  put128(XXH3_128bits(data, len), out);
}

void kvt_hash128_begin(kvt_hash128_stream *s) {
  XXH3_128bits_reset((XXH3_state_t *)(void *)s->opaque);
}

void kvt_hash128_update(kvt_hash128_stream *s, const void *data, size_t len) {
  XXH3_128bits_update((XXH3_state_t *)(void *)s->opaque, data, len);
}

void kvt_hash128_end(kvt_hash128_stream *s, uint8_t out[16]) {
  put128(XXH3_128bits_digest((XXH3_state_t *)(void *)s->opaque), out);
}
