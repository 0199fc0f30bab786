/* core/kvt_internal.h - what the modules share behind the public API: the
 * context's insides, error and log helpers, allocation, hashing, byte order. */
#ifndef KVT_INTERNAL_H
#define KVT_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvtier/core.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvtier's codecs copy 16-bit elements as little-endian bytes"
#endif

#if defined(__i386__) && !defined(__SSE2_MATH__)
#error "build with -msse2 -mfpmath=sse: x87 excess precision would change the codecs' bytes"
#endif

#define KVT_ERR_DETAIL_MAX 512

struct kvt_ctx {
  kvt_allocator alloc;
  kvt_log_fn log;
  void *log_opaque;
  int log_level;
  int simd; /* resolved: KVT_SIMD_SCALAR or KVT_SIMD_AVX2 */
  char err[KVT_ERR_DETAIL_MAX];
  /* Module state that core cannot know the type of (the serde module's
   * lossless-stage buffers); released through the hook on destroy. */
  void *serde_state;
  void (*serde_state_free)(kvt_ctx *ctx, void *state);
};

#if defined(__GNUC__)
#define KVT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define KVT_LIKELY(x) __builtin_expect(!!(x), 1)
#define KVT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define KVT_PRINTF(a, b)
#define KVT_LIKELY(x) (x)
#define KVT_UNLIKELY(x) (x)
#endif

/* Records detail for err on ctx (which may be NULL) and returns err, so a
 * failure reads `return kvt_fail(ctx, KVT_ECORRUPT, "...", ...);`. */
int kvt_fail(kvt_ctx *ctx, int err, const char *fmt, ...) KVT_PRINTF(3, 4);
void kvt_clear_error(kvt_ctx *ctx);
void kvt_logf(kvt_ctx *ctx, int level, const char *fmt, ...) KVT_PRINTF(3, 4);

/* src[0..n) into dst (capacity cap, NUL-terminated) with %XX escapes decoded:
 * exactly two hex digits, never %00 (a NUL would cut a credential short).
 * Returns 0, or -1 for a bad escape or no room (core/text.c). */
int kvt_url_unescape(char *dst, size_t cap, const char *src, size_t n);

void *kvt_alloc(kvt_ctx *ctx, size_t size, size_t alignment);
void kvt_dealloc(kvt_ctx *ctx, void *ptr);

/* Whether this CPU and build can run the AVX2+F16C paths. */
int kvt_cpu_has_avx2(void);
/* AVX-512F with the OS saving ZMM state (the XXH3-128 of chunk keys). */
int kvt_cpu_has_avx512(void);

/* XXH3, no seed: the payload checksums and the key hash. */
uint64_t kvt_hash64(const void *data, size_t len);
void kvt_hash128(const void *data, size_t len, uint8_t out[16]);
/* XXH3-64 of a || b, without joining them. */
uint64_t kvt_hash64_2(const void *a, size_t na, const void *b, size_t nb);
/* XXH3-64 of the little-endian XXH3-64 digests of data's consecutive
 * `block`-byte pieces (the last may be shorter; at least one piece, so an
 * empty input hashes one empty piece): payload format 2's section checksum,
 * whose pieces can be hashed in parallel. */
uint64_t kvt_hash64_blocks(const void *data, size_t len, size_t block);

/* Streaming XXH3-128 with no allocation. */
typedef struct kvt_hash128_stream {
  _Alignas(64) unsigned char opaque[640];
} kvt_hash128_stream;
void kvt_hash128_begin(kvt_hash128_stream *s);
void kvt_hash128_update(kvt_hash128_stream *s, const void *data, size_t len);
void kvt_hash128_end(kvt_hash128_stream *s, uint8_t out[16]);

/* Little-endian loads and stores that never assume alignment. */
static inline uint16_t kvt_ld16(const void *p) {
  const uint8_t *b = (const uint8_t *)p;
  return (uint16_t)(b[0] | (b[1] << 8));
}
static inline uint32_t kvt_ld32(const void *p) {
  const uint8_t *b = (const uint8_t *)p;
  return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
         ((uint32_t)b[3] << 24);
}
static inline uint64_t kvt_ld64(const void *p) {
  return (uint64_t)kvt_ld32(p) | ((uint64_t)kvt_ld32((const uint8_t *)p + 4) << 32);
}
static inline void kvt_st16(void *p, uint16_t v) {
  uint8_t *b = (uint8_t *)p;
  b[0] = (uint8_t)v;
  b[1] = (uint8_t)(v >> 8);
}
static inline void kvt_st32(void *p, uint32_t v) {
  uint8_t *b = (uint8_t *)p;
  b[0] = (uint8_t)v;
  b[1] = (uint8_t)(v >> 8);
  b[2] = (uint8_t)(v >> 16);
  b[3] = (uint8_t)(v >> 24);
}
static inline void kvt_st64(void *p, uint64_t v) {
  kvt_st32(p, (uint32_t)v);
  kvt_st32((uint8_t *)p + 4, (uint32_t)(v >> 32));
}

/* The codecs' bytes are defined for IEEE round-to-nearest-even with
 * subnormals (serde/FORMAT.md). An engine may run with another rounding mode
 * or with flush-to-zero/denormals-are-zero set (torch.set_flush_denormal), so
 * encode and decode run in the default SSE environment and restore the
 * caller's afterwards. */
#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
typedef struct kvt_fpenv {
  unsigned csr;
} kvt_fpenv;
#define KVT_MXCSR_DEFAULT 0x1F80u /* all exceptions masked, nearest, no FTZ/DAZ */
static inline void kvt_fpenv_enter(kvt_fpenv *e) {
  e->csr = _mm_getcsr();
  if ((e->csr & ~0x3Fu) != KVT_MXCSR_DEFAULT) /* the low six bits are status flags */
    _mm_setcsr(KVT_MXCSR_DEFAULT);
}
static inline void kvt_fpenv_leave(const kvt_fpenv *e) {
  if ((e->csr & ~0x3Fu) != KVT_MXCSR_DEFAULT)
    _mm_setcsr(e->csr);
}
#else
typedef struct kvt_fpenv {
  int unused;
} kvt_fpenv;
static inline void kvt_fpenv_enter(kvt_fpenv *e) { (void)e; }
static inline void kvt_fpenv_leave(const kvt_fpenv *e) { (void)e; }
#endif

static inline uint64_t kvt_align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) & ~(a - 1);
}

#endif
