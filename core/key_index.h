/* core/key_index.h - the one key index of the library (the dram and nvme
 * tiers, the cache, the server): a hash table from a chunk key to a small
 * entry, open addressing with linear probing and backward-shift deletion,
 * power-of-two size, load at most 3/4.
 *
 * Not thread-safe: each user guards its index with its own lock. Growth
 * happens only in kvt_index_reserve, so a user reserves room before work it
 * cannot undo (a rename, a copied payload) and publishing never fails. */
#ifndef KVT_KEY_INDEX_H
#define KVT_KEY_INDEX_H

#include <stdint.h>

#include "kvt_internal.h"
#include "kvtier/key.h"

/* 32 bytes, so slots never straddle a cache line and a table of 1024 is
 * L1-sized: a cache lookup walks one find per chunk of a context. The
 * widths hold any payload (KVT_PAYLOAD_MAX is 2^32 bytes). */
#define KVT_INDEX_SLAB_NONE ((1u << 30) - 1) /* slab of an entry that has no block */

typedef struct kvt_index_entry {
  kvt_key key;
  uint64_t len : 40;  /* payload bytes */
  uint64_t pin : 16;  /* the tier's: dram pin record + 1 */
  uint64_t live : 1;  /* 0: an empty slot */
  union {
    struct {
      uint64_t off : 34;  /* the tier's: dram block offset; nvme bytes on disk */
      uint64_t slab : 30; /* the tier's: dram slab, or KVT_INDEX_SLAB_NONE */
    };
    void *ref; /* an index over the user's own entries (cache, server): the entry */
  };
} kvt_index_entry;

typedef struct kvt_index {
  kvt_ctx *ctx; /* allocates the table */
  kvt_index_entry *slots;
  uint64_t cap, items;
} kvt_index;

/* A (key, length) pair, as kvt_index_snapshot copies them out. */
typedef struct kvt_index_item {
  kvt_key key;
  uint64_t len;
} kvt_index_item;

void kvt_index_init(kvt_index *ix, kvt_ctx *ctx);
void kvt_index_free(kvt_index *ix);

/* The slot where a search for k starts. Keys are XXH3 output in production,
 * but tests and callers may use structured keys, so both halves are mixed.
 * Inline, with find: a cache lookup walks one find per chunk of a context. */
static inline uint64_t kvt_index_hash(const kvt_key *k) {
  uint64_t h = kvt_ld64(k->bytes) ^ (kvt_ld64(k->bytes + 8) * 0x9E3779B97F4A7C15ull);
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ull;
  return h ^ (h >> 32);
}

/* The live entry for k, or NULL. */
static inline kvt_index_entry *kvt_index_find(const kvt_index *ix, const kvt_key *k) {
  if (!ix->cap)
    return NULL;
  const uint64_t mask = ix->cap - 1, lo = kvt_ld64(k->bytes), hi = kvt_ld64(k->bytes + 8);
  for (uint64_t i = kvt_index_hash(k) & mask;; i = (i + 1) & mask) {
    kvt_index_entry *e = &ix->slots[i];
    if (!e->live)
      return NULL;
    if (kvt_ld64(e->key.bytes) == lo && kvt_ld64(e->key.bytes + 8) == hi)
      return e;
  }
}

/* Starts loading the slot where a find of k begins: for a walk that knows
 * its next keys (a prefix chain), so their loads overlap. */
static inline void kvt_index_prefetch(const kvt_index *ix, const kvt_key *k) {
  if (ix->cap)
    __builtin_prefetch(&ix->slots[kvt_index_hash(k) & (ix->cap - 1)]);
}

/* Room for `want` live entries without growing: 0 or -ENOMEM. */
int kvt_index_reserve(kvt_index *ix, uint64_t want);

/* The entry for k: the live one, or a fresh slot marked live with key set
 * and the other fields zero (*fresh = 1). Room must have been reserved. */
kvt_index_entry *kvt_index_upsert(kvt_index *ix, const kvt_key *k, int *fresh);

/* Removes a live entry (a pointer from find/upsert, valid until the next
 * change of the index). */
void kvt_index_remove(kvt_index *ix, kvt_index_entry *e);

/* Copies up to max live (key, len) pairs into out; returns how many. */
uint64_t kvt_index_snapshot(const kvt_index *ix, kvt_index_item *out, uint64_t max);

#endif
