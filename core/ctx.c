/* core/ctx.c - the context: allocator hooks, logging, last-error detail,
 * version and feature queries. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "kvt_internal.h"

static void *default_alloc(void *opaque, size_t size, size_t alignment) {
  (void)opaque;
  if (alignment < sizeof(void *))
    alignment = sizeof(void *);
  void *p = NULL;
  if (posix_memalign(&p, alignment, size ? size : 1) != 0)
    return NULL;
  return p;
}

static void default_free(void *opaque, void *ptr) {
  (void)opaque;
  free(ptr);
}

/* AVX2 and F16C by CPUID, plus the OS saving YMM state (XGETBV): compilers
 * disagree on which names __builtin_cpu_supports knows (clang 14 lacks f16c).
 * CPUID traps to the hypervisor in a VM (microseconds), so the answer is
 * computed once and kept. */
static int detect_avx2(void) {
#if defined(KVT_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d))
    return 0;
  const unsigned osxsave = 1u << 27, avx = 1u << 28, f16c = 1u << 29;
  if ((c & (osxsave | avx | f16c)) != (osxsave | avx | f16c))
    return 0;
  unsigned xlo, xhi;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  if ((xlo & 6u) != 6u) /* XMM and YMM state enabled by the OS */
    return 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
    return 0;
  return (b & (1u << 5)) != 0; /* AVX2 */
#else
  return 0;
#endif
}

static int detect_avx512(void) {
#if defined(KVT_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE */
    return 0;
  unsigned xlo, xhi;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  if ((xlo & 0xE6u) != 0xE6u) /* XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM */
    return 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
    return 0;
  return (b & (1u << 16)) != 0; /* AVX512F */
#else
  return 0;
#endif
}

int kvt_cpu_has_avx512(void) {
  static int known; /* as kvt_cpu_has_avx2 */
  int v = __atomic_load_n(&known, __ATOMIC_RELAXED);
  if (KVT_UNLIKELY(!v)) {
    v = detect_avx512() ? 2 : 1;
    __atomic_store_n(&known, v, __ATOMIC_RELAXED);
  }
  return v == 2;
}

int kvt_cpu_has_avx2(void) {
  static int known; /* 0: not yet; 1: no; 2: yes. Racing threads store the same value. */
  int v = __atomic_load_n(&known, __ATOMIC_RELAXED);
  if (KVT_UNLIKELY(!v)) {
    v = detect_avx2() ? 2 : 1;
    __atomic_store_n(&known, v, __ATOMIC_RELAXED);
  }
  return v == 2;
}

int kvt_ctx_create(const kvt_ctx_config *cfg, kvt_ctx **out) {
  kvt_ctx_config def = KVT_CTX_CONFIG_INIT;
  if (!out)
    return -EINVAL;
  if (!cfg)
    cfg = &def;
  if (cfg->struct_size < sizeof(kvt_ctx_config))
    return -EINVAL;
  kvt_allocator a = cfg->allocator;
  if (!a.alloc != !a.free || a.reserved[0] || a.reserved[1])
    return -EINVAL;
  if (!a.alloc) {
    a.alloc = default_alloc;
    a.free = default_free;
  }
  int simd = cfg->simd;
  if (simd == KVT_SIMD_AUTO)
    simd = kvt_cpu_has_avx2() ? KVT_SIMD_AVX2 : KVT_SIMD_SCALAR;
  else if (simd == KVT_SIMD_AVX2 && !kvt_cpu_has_avx2())
    return KVT_ENOTSUP;
  else if (simd != KVT_SIMD_SCALAR && simd != KVT_SIMD_AVX2)
    return -EINVAL;

  kvt_ctx *ctx = a.alloc(a.opaque, sizeof(*ctx), 64);
  if (!ctx)
    return -ENOMEM;
  memset(ctx, 0, sizeof(*ctx));
  ctx->alloc = a;
  ctx->log = cfg->log;
  ctx->log_opaque = cfg->log_opaque;
  ctx->log_level = cfg->log_level;
  ctx->simd = simd;
  *out = ctx;
  return 0;
}

void kvt_ctx_destroy(kvt_ctx *ctx) {
  if (!ctx)
    return;
  if (ctx->serde_state && ctx->serde_state_free)
    ctx->serde_state_free(ctx, ctx->serde_state);
  kvt_allocator a = ctx->alloc;
  a.free(a.opaque, ctx);
}

const char *kvt_ctx_last_error(const kvt_ctx *ctx) { return ctx ? ctx->err : ""; }

int kvt_ctx_simd(const kvt_ctx *ctx) { return ctx ? ctx->simd : KVT_SIMD_SCALAR; }

int kvt_fail(kvt_ctx *ctx, int err, const char *fmt, ...) {
  if (!ctx)
    return err;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
  va_end(ap);
  if (ctx->log && ctx->log_level >= KVT_LOG_DEBUG) {
    char line[KVT_ERR_DETAIL_MAX + 64];
    snprintf(line, sizeof(line), "%s: %s", kvt_err_name(err), ctx->err);
    ctx->log(ctx->log_opaque, KVT_LOG_DEBUG, line);
  }
  return err;
}

void kvt_clear_error(kvt_ctx *ctx) {
  if (ctx)
    ctx->err[0] = '\0';
}

void kvt_logf(kvt_ctx *ctx, int level, const char *fmt, ...) {
  if (!ctx || !ctx->log || level > ctx->log_level)
    return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  ctx->log(ctx->log_opaque, level, line);
}

void *kvt_alloc(kvt_ctx *ctx, size_t size, size_t alignment) {
  return ctx->alloc.alloc(ctx->alloc.opaque, size, alignment);
}

void kvt_dealloc(kvt_ctx *ctx, void *ptr) {
  if (ptr)
    ctx->alloc.free(ctx->alloc.opaque, ptr);
}

#define KVT_STR2_(x) #x
#define KVT_STR_(x) KVT_STR2_(x)

unsigned kvt_version(void) { return KVT_VERSION_NUMBER; }

const char *kvt_version_string(void) {
  return KVT_STR_(KVT_VERSION_MAJOR) "." KVT_STR_(KVT_VERSION_MINOR) "." KVT_STR_(
      KVT_VERSION_PATCH);
}

int kvt_has_feature(const char *name) {
  if (!name)
    return 0;
#ifdef KVT_HAVE_ZSTD
  if (strcmp(name, "zstd") == 0)
    return 1;
#endif
#ifdef KVT_HAVE_CUDA
  if (strcmp(name, "cuda") == 0)
    return 1;
#endif
  if (strcmp(name, "avx2") == 0)
    return kvt_cpu_has_avx2();
  return 0;
}
