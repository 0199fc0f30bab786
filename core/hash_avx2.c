/* core/hash_avx2.c - XXH3-64 compiled for AVX2 (twice the SSE2 speed on
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
#endif
