/* kvtier/core.h - the context: allocator hooks, logging, last-error detail,
 * versions.
 *
 * A context is the handle every other call takes. It owns no global state;
 * two contexts in one process never interfere.
 *
 * Thread-safety: a context may be used by one thread at a time. Give each
 * thread its own context (they are cheap), or serialise calls on a shared
 * one. Functions that take no context are thread-safe. Tiers (kvtier/tier.h)
 * are the exception: a tier may be used from many threads at once, and calls
 * its context's allocator and log hooks from them, so a context that opens
 * tiers needs thread-safe hooks (the defaults are). */
#ifndef KVTIER_CORE_H
#define KVTIER_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/error.h"
#include "kvtier/export.h"
#include "kvtier/version.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_ctx kvt_ctx;

/* Allocator hooks. alloc returns memory aligned to at least `alignment`
 * (a power of two, at most 4096) or NULL; free accepts NULL. Both are
 * called from whichever thread is using the context. A fixed-size value
 * embedded in kvt_ctx_config: later hooks take the reserved tail. */
typedef struct kvt_allocator {
  void *(*alloc)(void *opaque, size_t size, size_t alignment);
  void (*free)(void *opaque, void *ptr);
  void *opaque;
  uint64_t reserved[2]; /* zero (kvt_ctx_create refuses others, -EINVAL) */
} kvt_allocator;

enum kvt_log_level {
  KVT_LOG_ERROR = 0,
  KVT_LOG_WARN = 1,
  KVT_LOG_INFO = 2,
  KVT_LOG_DEBUG = 3
};

/* Receives one complete line (no trailing newline). The library never prints
 * on its own: without a callback, nothing is logged. */
typedef void (*kvt_log_fn)(void *opaque, int level, const char *msg);

/* Which CPU code paths the codecs use. AUTO picks the fastest the CPU
 * supports at run time; all paths produce identical bytes. */
enum kvt_simd {
  KVT_SIMD_AUTO = 0,
  KVT_SIMD_SCALAR = 1,
  KVT_SIMD_AVX2 = 2 /* AVX2 + F16C; kvt_ctx_create fails with KVT_ENOTSUP
                       when the CPU or the build lacks it */
};

typedef struct kvt_ctx_config {
  size_t struct_size;      /* sizeof(kvt_ctx_config): fields are only appended */
  kvt_allocator allocator; /* all-NULL: the C library's aligned allocation */
  kvt_log_fn log;          /* NULL: no logging */
  void *log_opaque;
  int log_level;           /* messages at or below this level are delivered */
  int simd;                /* enum kvt_simd */
} kvt_ctx_config;

#define KVT_CTX_CONFIG_INIT \
  { sizeof(kvt_ctx_config), {NULL, NULL, NULL, {0, 0}}, NULL, NULL, KVT_LOG_WARN, KVT_SIMD_AUTO }

/* Creates a context. cfg may be NULL for defaults. *out is written only on
 * success. Returns 0, -EINVAL (bad config: struct_size too small, half an
 * allocator given, its reserved fields not zero), -ENOMEM, or KVT_ENOTSUP
 * (requested SIMD path missing). */
KVT_API int kvt_ctx_create(const kvt_ctx_config *cfg, kvt_ctx **out);

/* Frees the context and every buffer it cached. Accepts NULL. */
KVT_API void kvt_ctx_destroy(kvt_ctx *ctx);

/* Detail of the most recent failure on this context: what went wrong and
 * where (field and offset, layer/token/head). Empty string when the last
 * call that failed left no detail. The pointer stays valid until the next
 * call on the context. */
KVT_API const char *kvt_ctx_last_error(const kvt_ctx *ctx);

/* The SIMD path this context resolved to (KVT_SIMD_SCALAR or KVT_SIMD_AVX2). */
KVT_API int kvt_ctx_simd(const kvt_ctx *ctx);

/* Library version, as KVT_VERSION_NUMBER and as "MAJOR.MINOR.PATCH". These
 * report the library linked at run time, which may differ from the header. */
KVT_API unsigned kvt_version(void);
KVT_API const char *kvt_version_string(void);

/* Whether optional parts were built in: "zstd", "avx2", "cuda". */
KVT_API int kvt_has_feature(const char *name);

#ifdef __cplusplus
}
#endif
#endif
