/* cache/cache_internal.h - the cache manager's insides, shared by
 * cache/cache.c (index, LRU lists, victim choice, moving payloads between
 * tiers) and cache/cache_ops.c (the public calls).
 *
 * Locking: one mutex (cache.mu) guards every field below except the tier
 * handles, which are thread-safe on their own. Tier I/O never happens with
 * mu held. An entry that a thread reads or moves outside mu is pinned
 * (busy > 0), and victims are only chosen among unpinned entries, so an
 * entry is never freed or moved under a thread that uses it. */
#ifndef KVT_CACHE_INTERNAL_H
#define KVT_CACHE_INTERNAL_H

#include <pthread.h>

#include "key_index.h"
#include "kvt_internal.h"
#include "kvtier/cache.h"

#define CACHE_SPARE_BUFS 4

typedef struct cnode {
  struct cnode *prev, *next;
} cnode;

enum { E_PUTTING = 1, E_LIVE = 2, E_DOOMED = 3 };

typedef struct centry {
  kvt_key key;
  struct centry *parent, *kids;           /* prefix tree: the chunk before, those after */
  struct centry *sib_prev, *sib_next;     /* among the parent's kids */
  cnode lru[KVT_CACHE_MAX_TIERS];         /* position in each tier holding a copy */
  uint64_t len;
  uint64_t stamp;    /* logical time of the last touch */
  uint64_t mark;     /* == cache.mark_gen: an ancestor of the payload being placed */
  uint64_t skip;     /* == cache.mark_gen: the chain of the payload whose placement
                        this (nested) placement serves: not a victim */
  uint32_t mask;     /* bit t: tier t holds a complete copy */
  uint32_t busy;     /* pins: gets reading it, the thread moving it */
  uint8_t state;     /* E_* */
  uint8_t moving;    /* one thread is demoting or promoting it */
  uint8_t orphan;    /* put with a prev the cache does not hold: lookups cannot
                        reach it, so it takes free room only and ranks coldest */
} centry;

typedef struct ctier {
  kvt_tier *tier;
  int owned;         /* closed by kvt_cache_close: opened from a spec, or a
                        config's tier handle once the open succeeded */
  int persistent;    /* KVT_TIER_PERSISTENT: survives a restart (nvme, redis, fabric) */
  int shared;        /* KVT_TIER_SHARED: other processes write it too (redis, fabric) */
  uint64_t capacity; /* from the tier's stats at open */
  uint64_t overhead, granule; /* what a payload costs there (kvt_tier_stats) */
  uint64_t used;     /* bytes held or reserved by a put in progress, as the
                        tier counts them (cache_cost) */
  uint64_t items;
  double link_Bps;   /* to the GPU, for kvt_cache_plan_restore */
  cnode lru;         /* sentinel: next is the hottest, prev the coldest */
  kvt_cache_stats n; /* hits ... errors */
} ctier;

struct kvt_cache {
  kvt_ctx *ctx;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* an entry was unpinned or removed */
  int ntiers;
  int nshared;       /* tiers with shared set */
  ctier t[KVT_CACHE_MAX_TIERS];
  kvt_index index;   /* key -> centry (entry.ref); entry pointers die at the next change */
  uint64_t clock, mark_gen;
  int has_fp;
  kvt_key fp;
  uint32_t chunk_tokens, flags;
  kvt_cache_stats total; /* gets, refused, duplicates, lookups, lookup_hit_tokens */
  /* Buffers demotions copied through, kept for the next ones (the data path
   * does not allocate once warm). */
  void *spare[CACHE_SPARE_BUFS];
  uint64_t spare_cap[CACHE_SPARE_BUFS];
  /* KVT_CACHE_BACKGROUND: the mover thread keeps headroom_pct of each upper
   * tier free; woken through mover_cv, stopped by mover_stop. */
  int mover_on, mover_stop;
  uint32_t headroom_pct;
  pthread_t mover;
  pthread_cond_t mover_cv;
  uint64_t mover_runs; /* times it moved something (tests, stats) */
};

#define TBIT(t) (1u << (t))
#define HAS(e, t) (((e)->mask >> (t)) & 1u)

/* What a payload of len bytes takes of tier t's capacity. */
static inline uint64_t cache_cost(const kvt_cache *c, int t, uint64_t len) {
  const ctier *T = &c->t[t];
  uint64_t g = T->granule ? T->granule : 1;
  return T->overhead + (len + g - 1) / g * g;
}

/* Index (mu held). cache_index_add indexes e, whose key the index does not
 * hold: 0 or -ENOMEM (the index could not grow; nothing changed). */
centry *cache_find(kvt_cache *c, const kvt_key *key);
int cache_index_add(kvt_cache *c, centry *e);
/* Takes e out of the index and the prefix tree and frees it. e must hold no
 * copy and no pin. */
void cache_entry_free(kvt_cache *c, centry *e);
void cache_link_parent(centry *e, centry *parent);
/* Frees e if it is live, holds no copy and no pin. */
void cache_maybe_free(kvt_cache *c, centry *e);
/* Drops one pin (mu held). The last pin of a DOOMED entry removes its copies
 * and frees it (mu is released meanwhile); e must not be used afterwards. */
void cache_unpin(kvt_cache *c, centry *e);

/* LRU (mu held). */
void cache_touch(kvt_cache *c, centry *e);
/* Records that tier t holds e (bit, items, LRU place; not used). */
void cache_add_copy(kvt_cache *c, centry *e, int t, uint64_t old_stamp);
/* Forgets tier t's copy (bit, items, LRU; not used). */
void cache_forget_copy(kvt_cache *c, centry *e, int t);

/* The background mover (cache/cache.c): start at open, stop before the
 * tiers close; cache_mover_poke (mu held) wakes it when tier u passed its
 * mark. */
int cache_mover_start(kvt_cache *c);
void cache_mover_stop(kvt_cache *c);
void cache_mover_poke(kvt_cache *c, int u);

/* Sets each tier's link from config.links or its traits (cache/cache_plan.c). */
int cache_links_set(kvt_cache *c, const char *links);

/* Shared tiers (cache/cache_shared.c, KVT_TIER_SHARED): the keys of
 * keys[0..n) the index misses, asked of them and indexed where found (mu NOT
 * held; returns how many were indexed). */
size_t cache_discover(kvt_cache *c, const kvt_key *keys, size_t n);

/* Frees the spare buffers (close). */
void cache_spares_free(kvt_cache *c);

/* Moving (mu NOT held). Writes buf[0..len) (e's payload) into tier u,
 * demoting or evicting what must go first; e is pinned by the caller. guard
 * is the payload whose placement started this one (e itself at the top;
 * the put payload while its victims cascade down): it and its prefix are
 * never victims of this placement. Returns 0 or -ENOSPC or the tier's
 * error. */
int cache_place(kvt_cache *c, centry *e, int u, const void *buf, uint64_t len,
                const centry *guard);
/* As cache_place, but with res given reserves len bytes in tier u for e
 * (kvt_tier_reserve) instead of writing buf: the room is accounted in used,
 * the copy is added to e by the caller once published. */
int cache_place_or_reserve(kvt_cache *c, centry *e, int u, const void *buf, uint64_t len,
                           const centry *guard, kvt_tier_reservation *res);
/* Deletes tier t's copy of e (pinned by the caller, its space in t already
 * released from used) and counts it as kind: 0 nothing, 1 demotion, 2
 * eviction. When the tier fails to delete, the copy stays indexed and its
 * space is taken again, so the cache never loses sight of bytes a tier
 * holds. Returns 0 or the tier's error. */
int cache_drop_copy(kvt_cache *c, centry *e, int t, int kind);

/* Deletes every copy of e (mu held on entry and exit; e DOOMED and pinned
 * once by the caller, nothing else pinning or moving it). Copies a tier
 * failed to delete stay indexed. Returns 0 or the first tier error. */
int cache_remove_copies(kvt_cache *c, centry *e);

/* Gets (mu NOT held), shared by kvt_cache_get and kvt_cache_get_many.
 * begin: the live entry for key, pinned and touched, or NULL (a miss,
 * counted). read_copy: reads e's hottest copy into buf, *tier_out where it
 * came from; handles a move racing the read, and a tier that lost the
 * payload (a torn or corrupt file the nvme tier deleted): that copy is
 * forgotten and the next is tried. end: checks what was read (r: the read's
 * result), counts, promotes when promote_ok, unpins; returns the get's
 * result. */
centry *cache_get_begin(kvt_cache *c, const kvt_key *key);
int cache_read_copy(kvt_cache *c, centry *e, void *buf, uint64_t cap, uint64_t *len,
                    int *tier_out);
int cache_get_end(kvt_cache *c, centry *e, void *buf, uint64_t got, int t, int r, int promote_ok);

#endif
