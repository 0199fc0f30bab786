/* tests/tier_test_util.h - helpers the tier tests share: an allocator that
 * counts outstanding allocations (opaque: an atomic_long), and deterministic
 * payload bytes. Include after <cmocka.h>. */
#ifndef KVT_TIER_TEST_UTIL_H
#define KVT_TIER_TEST_UTIL_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

static inline void *counting_alloc(void *opaque, size_t size, size_t align) {
  void *p = NULL;
  if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size ? size : 1))
    return NULL;
  atomic_fetch_add((atomic_long *)opaque, 1);
  return p;
}

static inline void counting_free(void *opaque, void *p) {
  if (p)
    atomic_fetch_sub((atomic_long *)opaque, 1);
  free(p);
}

/* xorshift64 bytes from seed: every value a test stores is checkable. */
static inline void fill(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (uint8_t)(x >> 29);
  }
}

#endif
