/* kvtier/tier.h - storage tiers: one completion-based interface for every
 * place a payload can live (DRAM, HBM, NVMe, Redis, kvtier-server).
 *
 * A tier stores opaque payload bytes under 128-bit chunk keys. Operations are
 * submitted and complete later; each operation is a caller-owned kvt_tier_op
 * that must stay valid, with the memory it points to, until it completes.
 * Completions are taken in one of two ways:
 *   - kvt_tier_poll() returns completed operations (completion-queue style);
 *   - the blocking helpers (kvt_tier_put/get/del/query) submit one operation
 *     and wait for exactly that one; their operations never reach poll.
 *
 * Thread-safety: every function here may be called from many threads at once
 * on the same tier, except kvt_tier_close(), which must be the last call.
 * Tiers allocate through their context's allocator hooks from those threads,
 * so the hooks must be thread-safe (the defaults are). Only kvt_tier_open
 * leaves detail in kvt_ctx_last_error(); data-path calls return codes alone.
 *
 * Tiers are opened from a spec string "SCHEME:ARGS": dram:SIZE, nvme:DIR:SIZE,
 * hbm:DEV:SIZE (CUDA), redis:// and redis+cluster:// (libhiredis), fabric://
 * (libfabric), and the decorators fault:RULES@SPEC and trace@SPEC. The
 * grammar, options, defaults and behaviour of each are in docs/TIERS.md. */
#ifndef KVTIER_TIER_H
#define KVTIER_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/core.h"
#include "kvtier/key.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_tier kvt_tier;

enum kvt_tier_opcode {
  KVT_TIER_PUT = 1,  /* store len bytes of buf under key, replacing any old value
                        (len 0 stores an empty value) */
  KVT_TIER_GET = 2,  /* copy the value into buf (capacity len); out_len = its length */
  KVT_TIER_DEL = 3,  /* remove key; KVT_ENOTFOUND if absent */
  KVT_TIER_QUERY = 4 /* out_len = the value's length; KVT_ENOTFOUND if absent */
};

typedef struct kvt_tier_op {
  /* Inputs. */
  uint32_t opcode;    /* enum kvt_tier_opcode */
  uint32_t flags;     /* 0 */
  kvt_key key;
  void *buf;          /* PUT: the payload; GET: the destination */
  uint64_t len;       /* PUT: payload bytes; GET: capacity of buf */
  uint64_t user_data; /* the caller's, untouched */
  /* Outputs, valid once the operation completed. */
  int32_t result;     /* 0; KVT_ENOTFOUND; KVT_ENOBUFS (GET: buf smaller than
                         out_len); -ENOSPC (a PUT that does not fit: too
                         large for the free space, or fragmentation); a
                         failed PUT leaves any old value in place;
                         -EIO and other errors from the backend */
  uint32_t status;    /* library-owned */
  uint64_t out_len;   /* GET, QUERY: the stored value's length */
  void *internal[2];  /* library-owned */
  uint64_t reserved[2]; /* zero (kvt_tier_op_init; submit refuses others with
                           -EINVAL): later inputs, whose zero means what 0.3
                           does. Fixed size: ops may be kept in arrays */
} kvt_tier_op;

/* Fills *op for a single operation (result, internals and reserved fields
 * cleared). */
KVT_API void kvt_tier_op_init(kvt_tier_op *op, int opcode, const kvt_key *key, void *buf,
                              uint64_t len, uint64_t user_data);

typedef struct kvt_tier_stats {
  size_t struct_size;  /* sizeof(kvt_tier_stats): fields are only appended */
  uint64_t capacity;   /* bytes the tier may hold */
  uint64_t used;       /* bytes held now, the backend's allocation overhead included */
  uint64_t items;      /* values held now */
  uint64_t puts, gets, dels, queries; /* operations completed, by kind */
  uint64_t hits, misses;              /* GETs that found / did not find the key */
  uint64_t errors;                    /* operations that failed otherwise */
  uint64_t bytes_in, bytes_out;       /* payload bytes stored by PUT, returned by GET */
  uint64_t in_flight;                 /* submitted, not yet completed */
  /* What one value of len bytes costs in `used`: item_overhead +
   * len rounded up to a multiple of granule (0, 0 when the backend does not
   * say: len itself). The cache plans its evictions with this. */
  uint64_t item_overhead, granule;
  uint64_t pinned_bytes; /* host memory page-locked for the GPU (dram with CUDA) */
} kvt_tier_stats;

/* Opens a tier from a spec string (above). *out is written only on success.
 * Returns 0, -EINVAL or KVT_ESPEC for a bad spec (detail in ctx),
 * KVT_ENOTSUP for a scheme not built in, -ENOMEM, or the backend's error.
 * The context must outlive the tier. */
KVT_API int kvt_tier_open(kvt_ctx *ctx, const char *spec, kvt_tier **out);

/* Waits for every operation in flight to complete, discards completions not
 * yet polled, and frees the tier. Accepts NULL. */
KVT_API void kvt_tier_close(kvt_tier *tier);

/* The spec the tier was opened with (kvt_tier_open_backend: its scheme,
 * "dram"), for display: secrets in it (a redis password, a fabric token)
 * are shown as "***" (docs/TIERS.md). "" for NULL. */
KVT_API const char *kvt_tier_spec(const kvt_tier *tier);

/* Submits n operations. Returns how many were accepted (they will complete,
 * possibly before this returns), or a negative error if none was: -EINVAL
 * for a malformed operation (unknown opcode, flags or reserved fields not
 * zero, a NULL buf with a length; nothing is submitted then), -ESHUTDOWN while
 * closing, -EAGAIN when a backend's queue is full (submit the rest later).
 * Accepted operations report their own errors in op->result. */
KVT_API int kvt_tier_submit(kvt_tier *tier, kvt_tier_op *const *ops, size_t n);

/* Returns up to max completed operations (submitted with kvt_tier_submit),
 * waiting up to timeout_ms (0: do not wait, -1: until at least one). The
 * count is 0 when nothing completed in time, or at once when nothing is in
 * flight. Each completed operation is returned by exactly one call. */
KVT_API int kvt_tier_poll(kvt_tier *tier, kvt_tier_op **done, size_t max, int timeout_ms);

/* For code that shares a tier with other pollers (the cache on many
 * threads): operations submitted with kvt_tier_submit_owned() never reach
 * kvt_tier_poll(); their submitter waits for each with kvt_tier_wait(), which
 * returns the operation's result once it completed, or -ETIMEDOUT after
 * timeout_ms (0: do not wait, -1: no limit; the operation stays in flight and
 * must be waited for again before its memory is reused). Same returns as
 * kvt_tier_submit() otherwise. */
KVT_API int kvt_tier_submit_owned(kvt_tier *tier, kvt_tier_op *const *ops, size_t n);
KVT_API int kvt_tier_wait(kvt_tier *tier, kvt_tier_op *op, int timeout_ms);

/* Blocking helpers: submit one operation and wait for it. They return the
 * operation's result. get writes the value's length to *len (also on
 * KVT_ENOBUFS, so the caller can retry with a larger buffer); len may be
 * NULL. A replacing PUT needs room for the old and the new value at once. */
KVT_API int kvt_tier_put(kvt_tier *tier, const kvt_key *key, const void *buf, uint64_t len);
KVT_API int kvt_tier_get(kvt_tier *tier, const kvt_key *key, void *buf, uint64_t cap,
                         uint64_t *len);
KVT_API int kvt_tier_del(kvt_tier *tier, const kvt_key *key);
KVT_API int kvt_tier_query(kvt_tier *tier, const kvt_key *key, uint64_t *len);

/* Fills *out (set out->struct_size first, or 0 for the full struct). */
KVT_API int kvt_tier_stats_get(kvt_tier *tier, kvt_tier_stats *out);

/* Calls fn for each key held, with its length, until fn returns non-zero
 * (which is then returned). KVT_ENOTSUP when the backend cannot list. */
typedef int (*kvt_tier_list_fn)(void *opaque, const kvt_key *key, uint64_t len);
KVT_API int kvt_tier_list(kvt_tier *tier, kvt_tier_list_fn fn, void *opaque);

/* Zero-copy reads from tiers that hold payloads in memory (dram, hbm): the
 * payload's own bytes, held in place (not freed, moved or replaced) until
 * kvt_tier_return(). From a dram tier the bytes are host memory, page-locked
 * and mapped for the GPU when the tier pins its slabs; from an hbm tier they
 * are device memory. kvt_gpu_load() reads either directly, so a load from a
 * memory tier needs no staging copy. Every loan must be returned before the
 * tier is closed. Thread-safe. */
typedef struct kvt_tier_loan {
  const void *data; /* the payload (NULL for an empty value) */
  uint64_t len;
  void *internal;   /* library-owned */
  uint64_t reserved[2]; /* zeroed by kvt_tier_borrow: later outputs */
} kvt_tier_loan;

/* Returns 0, KVT_ENOTFOUND, KVT_ENOTSUP (the tier cannot lend: nvme, or a
 * decorator), -EAGAIN (too many loans out at once: return some, or copy with
 * kvt_tier_get) or -EINVAL. */
KVT_API int kvt_tier_borrow(kvt_tier *tier, const kvt_key *key, kvt_tier_loan *loan);
KVT_API void kvt_tier_return(kvt_tier *tier, kvt_tier_loan *loan);

/* Zero-copy writes into tiers that hold payloads in memory (dram, hbm): a
 * block of len bytes reserved for key, which the caller fills in place (an
 * RDMA read, a GPU store kernel, a read from a socket) and then publishes:
 * the value becomes visible at once, replacing any old one, exactly as a
 * PUT of those bytes would (and is counted as one). Until then nothing reads
 * the block and gets see the old value; kvt_tier_abort gives the block back
 * and leaves the old value in place. From a dram tier the block is host
 * memory (page-locked and mapped when the tier pins its slabs), from an hbm
 * tier device memory. Every reservation must be published or aborted before
 * the tier is closed. Thread-safe. */
typedef struct kvt_tier_reservation {
  void *data;       /* where to write len bytes (NULL when len is 0) */
  uint64_t len;
  kvt_key key;
  uint64_t internal[2]; /* library-owned */
  uint64_t reserved[2]; /* zeroed by kvt_tier_reserve: later outputs */
} kvt_tier_reservation;

/* Returns 0, -ENOSPC (no room: as a PUT of len bytes would be refused),
 * KVT_ENOTSUP (the tier cannot: nvme, remote tiers, decorators) or -EINVAL. */
KVT_API int kvt_tier_reserve(kvt_tier *tier, const kvt_key *key, uint64_t len,
                             kvt_tier_reservation *res);
/* Returns 0 or -EINVAL (not a reservation of this tier). */
KVT_API int kvt_tier_publish(kvt_tier *tier, kvt_tier_reservation *res);
KVT_API void kvt_tier_abort(kvt_tier *tier, kvt_tier_reservation *res);

/* What a tier is: the cache and the server decide by these bits, never by
 * the spec's scheme, so a backend registered with kvt_tier_open_backend is
 * treated like a built-in one of the same traits. */
enum kvt_tier_trait {
  KVT_TIER_PERSISTENT = 1u << 0,  /* survives a restart: the cache lists it at open */
  KVT_TIER_SHARED = 1u << 1,      /* other processes write it too: the cache asks it
                                     about keys its index misses */
  KVT_TIER_DEVICE = 1u << 2,      /* payloads live in GPU memory: lent bytes are
                                     device pointers */
  KVT_TIER_HOST_MEMORY = 1u << 3, /* payloads live in this process's host memory:
                                     lent and reserved blocks are host pointers */
  KVT_TIER_REMOTE = 1u << 4       /* reached over a network */
};

/* The tier's KVT_TIER_* bits (0 for NULL). Thread-safe. */
KVT_API uint32_t kvt_tier_traits(const kvt_tier *tier);

/* Parses a size with a unit ("8GiB", "512MB", "4096"): B, KiB, MiB, GiB, TiB
 * (or K, M, G, T; powers of 1024) and KB, MB, GB, TB (powers of 1000), as
 * in tier specs. Returns 0 or -EINVAL. */
KVT_API int kvt_parse_size(const char *text, uint64_t *out);

/* ---- Backends ------------------------------------------------------------
 * A backend is a table of functions; optional members may be NULL. Fields
 * are only appended, behind abi_version and struct_size. */

#define KVT_TIER_ABI_VERSION 1

typedef struct kvt_tier_backend {
  uint32_t abi_version; /* KVT_TIER_ABI_VERSION */
  uint32_t struct_size; /* sizeof(kvt_tier_backend) */
  const char *scheme;   /* the spec prefix before ':' (or '@' for decorators) */
  /* Opens an instance from the spec's ARGS. tier is the handle to complete
   * operations on. */
  int (*open)(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state);
  /* Called once nothing is in flight. */
  void (*close)(void *state);
  /* Takes one operation: returns 0 once it is queued or already completed
   * (through kvt_tier_complete), or a negative error having completed
   * nothing. Called concurrently from many threads. */
  int (*submit)(void *state, kvt_tier_op *op);
  /* Optional: drives completions, waiting up to timeout_ms for one; for
   * backends whose operations complete on the caller's thread (io_uring).
   * NULL when operations complete by themselves. */
  int (*progress)(void *state, int timeout_ms);
  /* Optional: capacity, used and items. */
  int (*stats)(void *state, kvt_tier_stats *out);
  /* Optional: as kvt_tier_list. */
  int (*list)(void *state, kvt_tier_list_fn fn, void *opaque);
  /* Optional, appended in 0.2 (a table whose struct_size ends before them
   * has neither): as kvt_tier_borrow / kvt_tier_return. */
  int (*borrow)(void *state, const kvt_key *key, kvt_tier_loan *loan);
  void (*unborrow)(void *state, kvt_tier_loan *loan);
  /* Optional, appended in 0.3: as kvt_tier_reserve / publish / abort. */
  int (*reserve)(void *state, const kvt_key *key, uint64_t len, kvt_tier_reservation *res);
  int (*publish)(void *state, kvt_tier_reservation *res);
  void (*abort)(void *state, kvt_tier_reservation *res);
  /* Appended in 0.3: what every instance of this backend is (KVT_TIER_*
   * trait bits; 0 for a table that ends before it), or, when traits_of is
   * set, what this instance is (decorators answer for their inner tier). */
  uint32_t traits;
  uint32_t (*traits_of)(void *state);
} kvt_tier_backend;

/* Backends call this exactly once per accepted operation, with op->result
 * and op->out_len set. May be called from any thread, also from inside the
 * backend's submit. */
KVT_API void kvt_tier_complete(kvt_tier *tier, kvt_tier_op *op);

/* Opens a tier on a backend the application provides (not in the registry). */
KVT_API int kvt_tier_open_backend(kvt_ctx *ctx, const kvt_tier_backend *backend,
                                  const char *args, kvt_tier **out);

#ifdef __cplusplus
}
#endif
#endif
