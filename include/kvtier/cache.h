/* kvtier/cache.h - the cache: payloads under chunk keys across an ordered
 * list of tiers (hottest first), with placement, demotion, promotion,
 * prefix-aware LRU eviction and prefix lookup.
 *
 * Placement. A put goes to the first tier whose capacity can hold the
 * payload. When that tier is full, its coldest payloads move down one tier
 * (demotion), and the bottom tier drops its coldest (eviction). A get that
 * hits a lower tier copies the payload up to the top tier (promotion) unless
 * KVT_CACHE_NO_PROMOTE is set. With KVT_CACHE_WRITE_THROUGH a put also goes
 * to every persistent tier (nvme; later redis, fabric) below the one that took
 * it, so a restart finds it and a later demotion costs no write.
 *
 * Eviction order. Least recently used first, and prefix-aware: a chunk is
 * useless without the chunks before it, so within a tier a payload with a
 * child in the same or a hotter tier is passed over, and a payload is never
 * placed at the cost of evicting its own prefix (it goes a tier lower, or is
 * not stored). A payload put with a prev the cache does not hold cannot be
 * reached by a lookup until its prefix comes back, so it only takes free
 * room and ranks coldest. A chain touched head first (lookup, then gets in order) keeps
 * its head hottest: a child is ranked right behind its parent when the parent
 * was touched since the child last was. Parents come from the prev argument
 * of kvt_cache_put() and from kvt_cache_lookup(), which relinks payloads
 * found after a restart.
 *
 * Integrity. A put parses the payload's header (magic, version, header
 * checksum, every field) and refuses a payload whose key is not the key it is
 * put under, or whose model fingerprint is not the cache's (KVT_EFOREIGN). A
 * get parses the header again and checks key and fingerprint before it
 * reports success; a payload that fails is deleted, counted as refused and
 * reported (KVT_EFOREIGN or the parse error), and is a miss from then on. The
 * section checksums are checked on every get with KVT_CACHE_VERIFY; without
 * it they are checked by tiers whose bytes leave the process (the nvme tier
 * checks an XXH3 of the whole payload on every read) and by the consumer
 * (kvt_decode, the GPU load). kvt_payload_verify() checks them on demand.
 *
 * Thread-safety. Every call except kvt_cache_close() may be made from many
 * threads at once. Metadata sits behind one mutex held for hash lookups and
 * list updates only; payload bytes move outside it. Data-path calls return
 * codes alone (no detail in kvt_ctx_last_error(), which is not thread-safe)
 * and log the detail at KVT_LOG_WARN through the context's log callback;
 * kvt_cache_open() leaves detail in the context.
 *
 * Data movement is synchronous in the calling thread: a put that needs
 * demotions, or a get that promotes, does that I/O before it returns. With
 * KVT_CACHE_BACKGROUND a thread of the cache also demotes ahead of need, so
 * a put into a nearly full tier seldom waits for the tier below.
 * Demotions copy through up to four payload-sized buffers that the cache
 * keeps for the next ones (host memory beyond the tiers' capacities). */
#ifndef KVTIER_CACHE_H
#define KVTIER_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/core.h"
#include "kvtier/key.h"
#include "kvtier/model.h"
#include "kvtier/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_cache kvt_cache;

#define KVT_CACHE_MAX_TIERS 4

enum kvt_cache_flags {
  KVT_CACHE_WRITE_THROUGH = 1u << 0, /* puts also go to the persistent tiers below */
  KVT_CACHE_NO_PROMOTE = 1u << 1,    /* hits in lower tiers stay where they are */
  KVT_CACHE_VERIFY = 1u << 2,        /* gets check every section checksum */
  KVT_CACHE_BACKGROUND = 1u << 3     /* a thread of the cache demotes ahead of need */
};

typedef struct kvt_cache_config {
  size_t struct_size;           /* sizeof(kvt_cache_config) */
  /* Tier specs, hottest first, separated by ';' (1 to KVT_CACHE_MAX_TIERS),
   * e.g. "dram:8GiB;nvme:/var/cache/kvtier:1TiB". See kvtier/tier.h. A ';'
   * splits only where a scheme follows ("nvme:", "trace@"), so the ';'
   * between a fault decorator's rules stays inside its spec. NULL when
   * tier_handles gives every tier. */
  const char *tiers;
  /* The model fingerprint (kvt_fingerprint) of every payload this cache
   * holds; copied at open. NULL accepts payloads of any model (operator
   * tools); kvt_cache_lookup() then needs one and returns -EINVAL. */
  const kvt_key *fingerprint;
  uint32_t chunk_tokens;        /* tokens per chunk for kvt_cache_lookup(); 0: 256 */
  uint32_t flags;               /* enum kvt_cache_flags */
  /* With KVT_CACHE_BACKGROUND: once a tier above the bottom is fuller than
   * (100 - headroom_pct)% of its capacity, a thread of the cache demotes its
   * coldest payloads until it is back under that mark, so puts seldom wait
   * for a write to the tier below. 0: 10. */
  uint32_t headroom_pct;
  /* The link from each tier to the GPU, for kvt_cache_plan_restore(): ';'
   * separated, one per tier, each a link preset of kvtier/model.h
   * ("pcie5-x16", "nvme-gen5-x4") or GB/s ("55.6", measured). NULL, or an
   * empty entry: hbm3-h100 for hbm, pcie5-x16 for dram, nvme-gen4 for nvme,
   * 25 GB/s (rdma-200g) for the remote tiers (redis, fabric). */
  const char *links;
  /* Appended in 0.3: tiers the application opened itself (an application's
   * backend through kvt_tier_open_backend, or kvt_tier_open), placed after
   * those of `tiers` (which may then be NULL), hottest first; the cache
   * treats each by its traits (kvt_tier_traits) like a built-in tier: a
   * KVT_TIER_PERSISTENT one is listed at open, a KVT_TIER_SHARED one is
   * asked about keys the index misses. On success the cache owns them and
   * kvt_cache_close() closes them: the application neither closes nor uses
   * them afterwards (kvt_cache_tier() reads them). On failure they remain
   * the application's, untouched but for a listing. Each handle once, none
   * NULL, on a context that outlives the cache. */
  kvt_tier *const *tier_handles;
  uint32_t n_tier_handles;
} kvt_cache_config;

#define KVT_CACHE_CONFIG_INIT { sizeof(kvt_cache_config), NULL, NULL, 256, 0, 0, NULL, NULL, 0 }

/* Opens every tier and builds the index from what the persistent tiers hold
 * (a config of an older, shorter struct_size opens with the later fields at
 * their defaults)
 * (their payloads are found again, without parent links until a lookup
 * walks them). *out is written only on success. Returns 0, -EINVAL (detail in
 * ctx) for a bad config (no tiers at all, a NULL or repeated tier handle) or
 * more than KVT_CACHE_MAX_TIERS tiers, -ENOMEM, or the error of the tier
 * that failed to open. The context must outlive the cache. */
KVT_API int kvt_cache_open(kvt_ctx *ctx, const kvt_cache_config *cfg, kvt_cache **out);

/* Closes the tiers and frees the cache. No call may be in flight. Accepts
 * NULL. */
KVT_API void kvt_cache_close(kvt_cache *cache);

/* Stores payload[0..len) under key. prev is the key of the chunk before it
 * in its sequence (NULL for a first chunk or when unknown); it ranks the
 * payload behind its parent for eviction (also when the key is already
 * held without a known parent). The payload is copied before this returns.
 * A put of a key that another thread is putting, moving or deleting waits
 * for that to finish. Returns 0 when stored, or when the key is held (keys
 * name content, so it is not written again; it is touched); KVT_EFOREIGN when the
 * header's key or fingerprint differ; the header's parse error (KVT_EFORMAT,
 * KVT_ECHECKSUM, ...); -ENOSPC when no tier can take it (larger than every
 * tier, or room only at the cost of its own prefix); or a tier's error. */
KVT_API int kvt_cache_put(kvt_cache *cache, const kvt_key *key, const kvt_key *prev,
                          const void *payload, uint64_t len);

/* Copies the payload under key into buf (capacity cap) and writes its length
 * to *len (also on KVT_ENOBUFS; len may be NULL) and the index of the tier
 * that served it to *tier (may be NULL). Returns 0, KVT_ENOTFOUND,
 * KVT_ENOBUFS, KVT_EFOREIGN or a parse error for a payload that failed the
 * checks above (it is deleted once no other thread reads it), -EINVAL, or a
 * tier's error. */
KVT_API int kvt_cache_get(kvt_cache *cache, const kvt_key *key, void *buf, uint64_t cap,
                          uint64_t *len, int *tier);

/* One get of kvt_cache_get_many(). */
typedef struct kvt_cache_get_req {
  kvt_key key;       /* in */
  void *buf;         /* in: destination (4096-aligned lets the nvme tier read
                        into it without a bounce copy) */
  uint64_t cap;      /* in: capacity of buf */
  uint64_t len;      /* out: the payload's length (also on KVT_ENOBUFS) */
  int32_t result;    /* out: as kvt_cache_get() returns */
  int32_t tier;      /* out: the tier that served it, -1 if none */
  uint64_t reserved[2]; /* zero (memset the request): later inputs, whose
                           zero means what 0.3 does. Fixed size: requests
                           are passed as an array */
} kvt_cache_get_req;

/* Gets n payloads with up to max_in_flight reads outstanding per tier (0:
 * 32), so a long prefix comes back from NVMe at the device's queue depth
 * rather than one read at a time. Each request gets its own result, with
 * the checks and counters of kvt_cache_get(); promotions, when on, run after
 * all reads are done. A key may appear more than once. Returns 0 once every
 * request has a result, or -EINVAL (a NULL buf with a capacity, reserved
 * fields not zero) or -ENOMEM (nothing done). */
KVT_API int kvt_cache_get_many(kvt_cache *cache, kvt_cache_get_req *reqs, size_t n,
                               uint32_t max_in_flight);

/* A payload lent in place by the tier holding it (see kvt_tier_borrow):
 * for a payload in a dram or hbm tier, the load kernel reads it without a
 * staging copy. */
typedef struct kvt_cache_loan {
  const void *data;   /* the payload: host memory (dram; page-locked when the
                         tier pins its slabs) or device memory (hbm) */
  uint64_t len;
  int32_t tier;       /* the tier lending it */
  void *internal[3];  /* library-owned */
  uint64_t reserved[2]; /* zeroed by kvt_cache_borrow: later outputs */
} kvt_cache_loan;

/* Lends the payload under key from its hottest tier, after the header
 * checks of a get (key, fingerprint; every section checksum with
 * KVT_CACHE_VERIFY when the bytes are in host memory). The payload stays in
 * place, is neither moved nor freed, until kvt_cache_return(); every loan
 * must be returned before the cache is closed. No promotion. Returns 0,
 * KVT_ENOTFOUND, KVT_ENOTSUP (its hottest tier cannot lend: nvme; use
 * kvt_cache_get), -EAGAIN (too many loans out), KVT_EFOREIGN or a parse
 * error (the payload is deleted as by a get), or -EINVAL. */
KVT_API int kvt_cache_borrow(kvt_cache *cache, const kvt_key *key, kvt_cache_loan *loan);
KVT_API void kvt_cache_return(kvt_cache *cache, kvt_cache_loan *loan);

/* A block of the cache's hottest tier reserved for one payload, which the
 * caller writes in place (a GPU store kernel, a read from a socket) and then
 * publishes: put without the copy (kvt_tier_reserve). */
typedef struct kvt_cache_reservation {
  void *data;         /* where to write len bytes: host memory of a dram tier,
                         page-locked and mapped when the tier pins its slabs */
  uint64_t len;
  kvt_key key;
  int32_t tier;       /* the tier reserved in (0), -1 when none */
  void *internal[3];  /* library-owned */
  uint64_t reserved[2]; /* zeroed by kvt_cache_reserve: later outputs */
} kvt_cache_reservation;

/* Reserves len bytes for key's payload in the hottest tier, making room as
 * a put would (prev as for kvt_cache_put: the block's place in the prefix
 * chain). Until published, gets of key miss and other puts of it wait.
 * Returns 0, -EEXIST (key is held already: nothing reserved, as a put that
 * finds it held), -ENOSPC, KVT_ENOTSUP (the hottest tier cannot reserve:
 * nvme, remote or hbm tiers, decorators; use kvt_cache_put), -ENOMEM or
 * -EINVAL. Every reservation is published or aborted before the cache is
 * closed. */
KVT_API int kvt_cache_reserve(kvt_cache *cache, const kvt_key *key, const kvt_key *prev,
                              uint64_t len, kvt_cache_reservation *res);
/* Makes the payload written into res->data the value of res->key, after the
 * header checks of a put (a failed check aborts the reservation and returns
 * the parse error or KVT_EFOREIGN), and writes it through to the persistent
 * tiers below as a put does. Returns 0, a check's error, or -EINVAL (not a
 * reservation of this cache). *res is cleared either way. */
KVT_API int kvt_cache_publish(kvt_cache *cache, kvt_cache_reservation *res);
/* Gives the block back; nothing is stored. *res is cleared. */
KVT_API void kvt_cache_abort(kvt_cache *cache, kvt_cache_reservation *res);

/* How many leading tokens of tokens[0..n) are cached: walks the chained
 * chunk keys of the cache's fingerprint and counts full chunks held until the
 * first one that is not, and writes tokens (a multiple of chunk_tokens) to
 * *cached_tokens. Touches the hits, head first, and pins nothing: nothing is
 * reserved for a get that may never come. Returns 0 or -EINVAL (no
 * fingerprint configured).
 *
 * Shared tiers (redis://, redis+cluster://, fabric://) are written by other
 * processes too: a chunk the cache's index misses is asked of them (QUERY,
 * a batch of keys in flight at once) and indexed where found, here and in
 * kvt_cache_get and kvt_cache_get_many, so a decode node finds what a
 * prefill node put. kvt_cache_query and kvt_cache_where answer from the
 * index alone. A shared tier that does not answer counts as a miss. The
 * cache never evicts from a shared tier (other hosts' chunks live there): its
 * server's own policy (maxmemory, TTL, kvtier-server --evict) decides, and a
 * shared tier that says it is full fails the placement with -ENOSPC. */
KVT_API int kvt_cache_lookup(kvt_cache *cache, const uint32_t *tokens, size_t n,
                             size_t *cached_tokens);

/* The same walk over keys the caller computed (kvt_chunk_keys): the number of
 * leading keys held, in *hits. */
KVT_API int kvt_cache_lookup_keys(kvt_cache *cache, const kvt_key *keys, size_t n,
                                  size_t *hits);

/* Whether loading a cached prefix beats recomputing it: the bandwidth
 * model's functions (kvtier/model.h) applied to where the prefix lies. */
typedef struct kvt_cache_plan {
  size_t struct_size;       /* sizeof(kvt_cache_plan) */
  size_t cached_tokens;     /* as kvt_cache_lookup() */
  uint64_t tier_bytes[KVT_CACHE_MAX_TIERS]; /* payload bytes of the prefix,
                                               by the hottest tier holding each chunk */
  double link_GBps[KVT_CACHE_MAX_TIERS];    /* the links used (config.links) */
  double restore_s;         /* sum of kvt_model_restore_seconds(tier_bytes, link) */
  double recompute_s;       /* kvt_model_prefill_seconds(model, cached_tokens, ...);
                               0 without a model */
  int restore_pays;         /* model given and restore_s < recompute_s */
} kvt_cache_plan;

/* Fills *out (set out->struct_size first; a shorter, older struct gets the
 * fields it has) for the leading chunks of tokens[0..n) that are cached,
 * like a lookup but without touching anything. model may be NULL (no recompute
 * estimate); tflops and mfu as kvt_model_prefill_seconds() (0: its defaults).
 * Returns 0 or -EINVAL (no fingerprint configured, bad arguments). */
KVT_API int kvt_cache_plan_restore(kvt_cache *cache, const uint32_t *tokens, size_t n,
                                   const kvt_model_arch *model, double tflops, double mfu,
                                   kvt_cache_plan *out);

/* Length of the payload under key and the hottest tier holding it (either
 * pointer may be NULL); no touch. Returns 0 or KVT_ENOTFOUND. */
KVT_API int kvt_cache_query(kvt_cache *cache, const kvt_key *key, uint64_t *len, int *tier);

/* Bit i set for each tier i holding a copy (0 if absent). */
KVT_API uint32_t kvt_cache_where(kvt_cache *cache, const kvt_key *key);

/* Removes key from every tier, once gets and moves of it in progress are
 * done (it is invisible to new ones at once). Returns 0, KVT_ENOTFOUND,
 * -EINVAL, or the error of a tier that failed to delete its copy: that copy
 * stays held (and counted), so it is not found again after a restart
 * without the caller knowing. */
KVT_API int kvt_cache_del(kvt_cache *cache, const kvt_key *key);

/* The number of tiers, and tier i itself (for its spec, its own stats and
 * listing; do not put into or delete from it behind the cache's back). */
KVT_API int kvt_cache_tier_count(const kvt_cache *cache);
KVT_API kvt_tier *kvt_cache_tier(kvt_cache *cache, int i);

typedef struct kvt_cache_stats {
  size_t struct_size;   /* sizeof(kvt_cache_stats): fields are only appended */
  /* Per tier (whole cache: capacity and used are sums, items counts
   * distinct keys). */
  uint64_t capacity, used, items; /* payload bytes the tier may hold / holds */
  uint64_t hits;        /* gets served by this tier */
  uint64_t misses;      /* gets that reached this tier without a hit there */
  uint64_t puts;        /* payloads written here: puts, demotions in, promotions in */
  uint64_t bytes_in, bytes_out; /* payload bytes written here / served from here */
  uint64_t demotions;   /* payloads moved from here to a lower tier */
  uint64_t promotions;  /* payloads copied here from a lower tier on a hit */
  uint64_t evictions;   /* payloads dropped from here with no copy kept below */
  uint64_t errors;      /* tier operations that failed (not misses) */
  /* Whole cache only (0 per tier). */
  uint64_t gets, refused, duplicates, lookups, lookup_hit_tokens;
  uint64_t pinned;      /* payloads being read or moved right now */
} kvt_cache_stats;

/* Fills *out for tier i, or for the whole cache with i = -1 (set
 * out->struct_size first, or 0 for the full struct). Returns 0 or -EINVAL. */
KVT_API int kvt_cache_stats_get(kvt_cache *cache, int i, kvt_cache_stats *out);

#ifdef __cplusplus
}
#endif
#endif
