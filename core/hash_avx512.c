/* core/hash_avx512.c - XXH3-128 compiled for AVX-512: chunk keys hash every
 * token of a lookup, and on AVX-512 CPUs (the Xeons of GPU hosts) this runs
 * a 64-byte stripe per instruction. The output does not depend on the
 * vector width; core/hash.c picks this at run time when the CPU and the OS
 * support it. */
#ifdef KVT_HAVE_AVX2
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvt_internal.h"

void kvt_hash128_avx512(const void *data, size_t len, uint64_t *hi, uint64_t *lo);
void kvt_hash128_avx512(const void *data, size_t len, uint64_t *hi, uint64_t *lo) {
  XXH128_hash_t h = XXH3_128bits(data, len);
  *hi = h.high64;
  *lo = h.low64;
}
#endif
