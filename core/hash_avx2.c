/* core/hash_avx2.c - XXH3-64 and -128 compiled for AVX2 (twice the SSE2 speed on
 * long inputs: section checksums are a full pass over every payload).
 * XXH3's output does not depend on the vector width; core/hash.c picks this
 * at run time when the CPU has AVX2. */
#ifdef KVT_HAVE_AVX2
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvt_internal.h"

uint64_t kvt_hash64_avx2(const void *data, size_t len);
uint64_t kvt_hash64_avx2(const void *data, size_t len) {
  return (uint64_t)XXH3_64bits(data, len);
}

/* XXH3-128 as (high, low): chunk keys hash every token of a lookup. */
void kvt_hash128_avx2(const void *data, size_t len, uint64_t *hi, uint64_t *lo);
void kvt_hash128_avx2(const void *data, size_t len, uint64_t *hi, uint64_t *lo) {
  XXH128_hash_t h = XXH3_128bits(data, len);
  *hi = h.high64;
  *lo = h.low64;
}
#endif
