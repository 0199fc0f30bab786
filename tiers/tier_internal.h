/* tiers/tier_internal.h - what the tier backends share with the generic
 * layer (tiers/tier.c): the compiled-in backends of the static registry. */
#ifndef KVT_TIER_INTERNAL_H
#define KVT_TIER_INTERNAL_H

#include "kvt_internal.h"
#include "kvtier/tier.h"

extern const kvt_tier_backend kvt_tier_backend_dram;  /* tiers/tier_dram.c */
#ifdef KVT_HAVE_CUDA
extern const kvt_tier_backend kvt_tier_backend_hbm;   /* tiers/tier_hbm.c */
#endif
extern const kvt_tier_backend kvt_tier_backend_nvme;  /* tiers/nvme/tier_nvme*.c */
#ifdef KVT_HAVE_HIREDIS
extern const kvt_tier_backend kvt_tier_backend_redis;         /* tiers/redis/tier_redis*.c */
extern const kvt_tier_backend kvt_tier_backend_redis_cluster; /* redis+cluster:// */
#endif
#ifdef KVT_HAVE_FABRIC
extern const kvt_tier_backend kvt_tier_backend_fabric; /* tiers/tier_fabric.c */
#endif
extern const kvt_tier_backend kvt_tier_backend_fault; /* tiers/tier_fault.c */
extern const kvt_tier_backend kvt_tier_backend_trace; /* tiers/tier_trace.c */

/* Whether name[0..len) is the scheme of a compiled-in backend: for spec
 * parsers that split lists of specs ("dram:4GiB;nvme:..."). */
int kvt_tier_scheme_known(const char *name, size_t len);

/* Whether the tier's backend has reserve, publish and abort (a decorator or
 * a backend without them answers kvt_tier_reserve with KVT_ENOTSUP). */
int kvt_tier_can_reserve(const kvt_tier *t);

/* Why text is no capacity (kvt_parse_size failed, or gave 0), to follow the
 * quoted text in a message: "is too large (...)" for a number past 2^64 - 1
 * bytes, else "is not a size above zero". */
const char *kvt_size_why(const char *text);

/* spec with its secrets replaced by "***", for messages and display: the
 * password of a URL's userinfo (USER:PASSWORD@ becomes USER:***@, and
 * PASSWORD@ without USER becomes ***@) and the values of password= and token= options (after '?'
 * or '&'). Also takes a list of specs and a backend's ARGS ("//..."). Writes
 * at most cap bytes, always terminated when cap > 0; returns the length of
 * the whole result (as snprintf). */
size_t kvt_spec_redact(char *dst, size_t cap, const char *spec);

/* The context a tier was opened with (for decorators opening inner tiers,
 * and for error detail). */
kvt_ctx *kvt_tier_ctx(kvt_tier *tier);

/* Runs op on inner through its blocking helpers (a PUT stores put_len bytes
 * of put_buf) and sets op's result and out_len: how the decorators forward,
 * synchronously, inside their submit. */
void kvt_tier_forward(kvt_tier *inner, kvt_tier_op *op, const void *put_buf, uint64_t put_len);

/* A decorator's stats member: the inner tier's capacity, used and items. */
int kvt_tier_inner_stats(kvt_tier *inner, kvt_tier_stats *out);

#endif
